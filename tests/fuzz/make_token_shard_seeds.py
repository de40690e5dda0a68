#!/usr/bin/env python3
"""Writes tests/fuzz/token_shard_seeds/: token shard files for fuzz_token_shard
(the layout of include/attn/token_shards.h), good and bad. Python 3's standard
library only; run from anywhere: python3 tests/fuzz/make_token_shard_seeds.py
"""
import os
import struct

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "token_shard_seeds")


def fnv1a64(data):
    h = 0xCBF29CE484222325
    for b in data:
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


def shard(tokens, vocab, magic=b"ATTNTOK1", version=1, token_bytes=2, count=None,
          checksum=None, reserved=b"\0" * 24, tail=b""):
    body = struct.pack("<%dH" % len(tokens), *tokens)
    head = magic + struct.pack("<IIQQQ", version, token_bytes, vocab,
                               len(tokens) if count is None else count,
                               fnv1a64(body) if checksum is None else checksum)
    return head + reserved + body + tail


SEEDS = {
    "good": shard([15496, 995, 50256, 0, 1], 50257),
    "empty": shard([], 50257),
    "vocab_65536": shard([65535, 0], 65536),
    "token_past_vocab": shard([5, 70], 64),
    "bad_checksum": shard([1, 2, 3], 50257, checksum=1),
    "bad_magic": shard([1], 50257, magic=b"ATTNTOK2"),
    "version_2": shard([1], 50257, version=2),
    "token_bytes_4": shard([1], 50257, token_bytes=4),
    "vocab_0": shard([1], 0),
    "vocab_65537": shard([1], 65537),
    "count_past_file": shard([1, 2], 50257, count=3),
    "count_huge": shard([1, 2], 50257, count=0xFFFFFFFFFFFFFFFF),
    "odd_payload": shard([1, 2], 50257, tail=b"\x01"),
    "reserved_set": shard([1], 50257, reserved=b"\0" * 23 + b"\x01"),
    "truncated_header": shard([1], 50257)[:40],
}

if __name__ == "__main__":
    os.makedirs(HERE, exist_ok=True)
    for name, data in SEEDS.items():
        with open(os.path.join(HERE, name + ".tok"), "wb") as f:
            f.write(data)
    print(len(SEEDS), "seeds in", HERE)
