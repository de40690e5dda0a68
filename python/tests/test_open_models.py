"""attn.Tokenizer.from_file and attn.DecoderLM against the fixtures of
tests/fixtures/make_hf_tokenizer_fixtures.py and make_open_model_fixtures.py
(Hugging Face tokenizers' ids, transformers' logits and greedy ids)."""

import json
import os

import pytest
import torch

import attn

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOKENIZERS = os.path.join(ROOT, "tests", "fixtures", "hf_tokenizers")
MODELS = os.path.join(ROOT, "tests", "fixtures", "open_models")


def load_safetensors(path):
    """The F32 and I64 tensors of a safetensors file (no safetensors package needed)."""
    with open(path, "rb") as f:
        data = f.read()
    n = int.from_bytes(data[:8], "little")
    header = json.loads(data[8:8 + n])
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        b, end = e["data_offsets"]
        dtype = {"F32": torch.float32, "I64": torch.int64}[e["dtype"]]
        raw = bytearray(data[8 + n + b:8 + n + end])
        out[name] = torch.frombuffer(raw, dtype=dtype).reshape(e["shape"])
    return out


@pytest.mark.parametrize("name", ["llama3", "qwen", "gemma"])
def test_tokenizer_ids_equal_tokenizers(name):
    tok = attn.Tokenizer.from_file(os.path.join(TOKENIZERS, name))
    want = json.load(open(os.path.join(TOKENIZERS, name, "expected.json"), encoding="utf-8"))
    assert tok.vocab_size == want["vocab_size"]
    for case in want["cases"]:
        assert tok.encode(case["text"]) == case["ids"]
        assert tok.encode(case["text"], add_special_tokens=False) == case["ids_no_special"]
        assert tok.decode(case["ids"]) == case["decoded"]
        assert tok.decode(case["ids"], skip_special_tokens=True) == case["decoded_skip_special"]


@pytest.mark.parametrize("name", ["llama3", "qwen3", "gemma3", "gemma2"])
def test_logits_and_greedy_equal_transformers(name):
    want = load_safetensors(os.path.join(MODELS, name, "expected.safetensors"))
    model = attn.DecoderLM.from_pretrained(os.path.join(MODELS, name))
    logits = model.logits(want["ids"])
    err = (logits - want["logits"]).abs().max() / want["logits"].abs().max()
    assert err <= 1e-5
    prompt = want["prompt"][0].tolist()
    assert model.generate(prompt, max_new_tokens=6) == want["greedy"][0].tolist()
    bf16 = attn.DecoderLM.from_pretrained(os.path.join(MODELS, name), dtype="bfloat16")
    assert (bf16.logits(want["ids"]) - want["logits"]).abs().max() / want["logits"].abs().max() <= 2e-2


def test_text_generation_equals_the_cli_fixture():
    d = os.path.join(MODELS, "qwen3")
    want = load_safetensors(os.path.join(d, "expected.safetensors"))
    tok = attn.Tokenizer.from_file(d)
    ids = tok.encode("First Citizen:\nBefore we proceed any further, hear me speak.")
    assert ids == want["text_prompt_ids"][0].tolist()
    model = attn.DecoderLM.from_pretrained(d)
    assert model.generate(ids, max_new_tokens=8) == want["text_greedy"][0].tolist()


def test_refusals_name_the_problem():
    with pytest.raises(ValueError, match="dtype must be"):
        attn.DecoderLM.from_pretrained(os.path.join(MODELS, "qwen3"), dtype="float16")
    with pytest.raises(ValueError, match="config.json"):
        attn.DecoderLM.from_pretrained(TOKENIZERS)
