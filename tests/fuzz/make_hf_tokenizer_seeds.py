#!/usr/bin/env python3
"""Writes the seeds of fuzz_hf_tokenizer (tests/fuzz/hf_tokenizer_seeds): each
family's tokenizer.json of tests/fixtures/hf_tokenizers cut to its first 330
vocabulary entries (the bytes and the first merged tokens), the merges among them and 8 added tokens, so that one
seed is a few kB (libFuzzer mutates small inputs fast) yet runs the family's
whole pipeline. Python's standard library only; run from the repository root:

    python3 tests/fuzz/make_hf_tokenizer_seeds.py
"""
import json
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[2]
OUT = ROOT / "tests" / "fuzz" / "hf_tokenizer_seeds"
KEEP = 330

for family in ("gemma", "llama3", "qwen"):
    j = json.loads((ROOT / "tests" / "fixtures" / "hf_tokenizers" / family / "tokenizer.json").read_text())
    model = j["model"]
    vocab = {t: i for t, i in model["vocab"].items() if i < KEEP}
    merges = []
    for m in model["merges"]:
        a, b = m if isinstance(m, list) else m.split(" ", 1)
        if a in vocab and b in vocab and a + b in vocab:
            merges.append(m)
    model["vocab"] = vocab
    model["merges"] = merges
    j["added_tokens"] = j["added_tokens"][:8]
    new_id = {}
    for k, t in enumerate(j["added_tokens"]):
        new_id[t["id"]] = KEEP + k
        t["id"] = KEEP + k

    def renumber(node):  # a template's special tokens keep pointing at added tokens
        if isinstance(node, dict):
            if "ids" in node and isinstance(node["ids"], list):
                node["ids"] = [new_id.get(i, KEEP) for i in node["ids"]]
            for v in node.values():
                renumber(v)
        elif isinstance(node, list):
            for v in node:
                renumber(v)

    renumber(j.get("post_processor"))
    text = json.dumps(j, ensure_ascii=False, separators=(",", ":"))
    (OUT / f"{family}.json").write_text(text + "\n")
    print(family, len(vocab), "tokens,", len(merges), "merges,", len(text), "bytes")
