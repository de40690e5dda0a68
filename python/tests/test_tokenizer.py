"""attn.Tokenizer against tiktoken's gpt2 ids, recorded in
tests/fixtures/tokenizer/cases.json (tests/fixtures/make_tokenizer_fixtures.py:
tiktoken 0.14.0), and tiktoken's special-token rules."""

import json
import os

import numpy as np
import pytest

import attn

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CASES = json.load(open(os.path.join(ROOT, "tests", "fixtures", "tokenizer", "cases.json"),
                       encoding="utf-8"))["cases"]
ENDOFTEXT = "<|endoftext|>"


def fnv1a_ids(ids):
    """FNV-1a (64-bit) over the ids as 8-byte little-endian integers (the fixture's hash)."""
    h = 0xCBF29CE484222325
    for i in ids:
        for b in int(i).to_bytes(8, "little", signed=True):
            h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


def case_text(case):
    if "text" in case:
        return case["text"]
    if "repeat" in case:
        return case["repeat"] * case["times"]
    with open(os.path.join(ROOT, "data", case["file"]), "rb") as f:
        return f.read(case["bytes"]).decode("utf-8")


@pytest.fixture(scope="module")
def tok():
    return attn.Tokenizer()


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_ids_equal_tiktoken(tok, case):
    text = case_text(case)
    if case["allow_special"]:
        ids = tok.encode(text, allowed_special="all")
        assert tok.encode(text, allowed_special={ENDOFTEXT}) == ids
    elif ENDOFTEXT in text:
        with pytest.raises(ValueError, match="disallowed special token"):
            tok.encode(text)
        ids = tok.encode(text, disallowed_special=())
        assert tok.encode_ordinary(text) == ids
    else:
        ids = tok.encode(text)
        assert tok.encode_ordinary(text) == ids
    if "ids" in case:
        assert ids == case["ids"]
    else:
        assert len(ids) == case["count"]
        assert format(fnv1a_ids(ids), "016x") == case["fnv1a"]
        assert ids[:len(case["head"])] == case["head"]
    if not case["allow_special"]:
        assert tok.decode(ids) == text  # byte-level BPE round-trips any valid text


def test_special_token_rules(tok):
    text = "Hello<|endoftext|>World"
    assert tok.encode(text, allowed_special="all") == [15496, 50256, 10603]
    assert tok.encode(text, disallowed_special=()) == [15496, 27, 91, 437, 1659, 5239, 91, 29,
                                                       10603]
    with pytest.raises(ValueError, match="disallowed special token '<\\|endoftext\\|>'"):
        tok.encode(text)
    with pytest.raises(ValueError):
        tok.encode_batch(["fine", text])
    assert tok.encode_batch(["Hello, I am", text], allowed_special="all") == [
        [15496, 11, 314, 716], [15496, 50256, 10603]]
    assert tok.encode_ordinary_batch(["a", "b"]) == [[64], [65]]
    assert tok.eot_token == 50256 and tok.n_vocab == 50257
    assert tok.special_tokens_set == {ENDOFTEXT}


def test_numpy_decode_and_errors(tok):
    arr = tok.encode_to_numpy("Hello, I am")
    assert arr.dtype == np.uint32 and arr.tolist() == [15496, 11, 314, 716]
    assert tok.decode(arr.tolist()) == "Hello, I am"
    assert tok.decode_batch([[15496], [11]]) == ["Hello", ","]
    # A character split across tokens: its bytes alone are not UTF-8.
    ids = tok.encode("😀")
    assert len(ids) == 2
    assert tok.decode_single_token_bytes(ids[0]) + tok.decode_single_token_bytes(ids[1]) == \
        "😀".encode("utf-8")
    assert tok.decode(ids[:1]) == "\ufffd"
    with pytest.raises(UnicodeDecodeError):
        tok.decode(ids[:1], errors="strict")
    with pytest.raises(IndexError, match="out of range"):
        tok.decode([50257])
    with pytest.raises(TypeError):
        tok.encode(b"bytes")
    # A lone surrogate is replaced (tiktoken's behaviour), not an error.
    assert tok.decode(tok.encode("a\ud800b")) == "a\ufffdb"
    assert attn.get_encoding("gpt2").encode("x") == [87]
    with pytest.raises(ValueError):
        attn.get_encoding("cl100k_base")


def test_parallel_encoding_gives_the_same_ids(tok, monkeypatch):
    text = case_text({"file": "tinyshakespeare.txt", "bytes": 200000})
    serial = tok.encode(text)
    monkeypatch.setattr(attn._tokenizer, "_PARALLEL_BYTES", 1000)
    attn.set_num_threads(2)
    try:
        assert tok.encode(text) == serial
    finally:
        attn.set_num_threads(None)


def test_from_files_reads_hugging_face_files(tok):
    # data/gpt2's encoder.json and vocab.bpe are vocab.json and merges.txt byte for byte.
    other = attn.Tokenizer.from_files(os.path.join(ROOT, "data", "gpt2", "encoder.json"),
                                      os.path.join(ROOT, "data", "gpt2", "vocab.bpe"))
    text = case_text({"file": "the-verdict.txt", "bytes": 5000})
    assert other.encode(text) == tok.encode(text)
    with pytest.raises(RuntimeError):
        attn.Tokenizer.from_files("/nonexistent/vocab.json", "/nonexistent/merges.txt")
