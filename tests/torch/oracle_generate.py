"""Oracle for `attn generate` (attn/generate.h): the book's chapter-4 GPTModel
(book_gpt.py) in evaluation mode, decoded with the book's generate_text_simple
(chapter 4, greedy) and generate (chapter 5: top-k, then temperature, then
torch.multinomial; temperature 0 is argmax), both in the book's form in
book_generate.py; both crop their input to the last context_size tokens, so the cases that
run past context_length test attn's sliding window.

Protocol per case (tests/torch/test_generate_torch.cpp repeats it):
    torch.manual_seed(seed); model = GPTModel(cfg); model.eval()
    greedy  = generate_text_simple(model, prompt, max_new_tokens, context_length)
    per run: torch.manual_seed(run_seed)
             sampled = generate(model, prompt, max_new_tokens, context_length,
                                temperature, top_k)
Batch-1 cases add a greedy and a sampled run with eos_id = the token the
greedy run generates at step max_new_tokens // 2 (the book's early stop).

Recorded: the configuration, the prompt ids, every parameter's float32 bits
(the C++ side loads them, so it runs on torch's own weights whatever kernel
torch's randn took), the greedy ids, each sampled run's ids, and the logits of
the last position of a full forward over the greedy sequence's last
context_length tokens.

The book's top-k (`logits < top_logits[:, -1]`) broadcasts the per-row minimum
along the vocabulary, so it is only right for batch 1; the top-k runs here use
batch 1.

Writes generate.json.
"""
import pathlib

import torch

import book_generate as bgen
import book_gpt as bg
from oracle_util import tensor_bits_json, tensor_json, write_json


def cfg(V, C, E, H, L, bias):
    return {"vocab_size": V, "context_length": C, "emb_dim": E, "n_heads": H, "n_layers": L,
            "drop_rate": 0.1, "qkv_bias": bias}


# (seed, cfg, B, prompt length, max_new_tokens, sampled runs (run_seed, temperature, top_k))
CASES = [
    (1, cfg(37, 10, 16, 2, 2, False), 1, 4, 15,
     [(11, 1.0, 5), (12, 0.7, None), (13, 1.5, 1), (14, 2.0, 37)]),
    (2, cfg(50, 16, 32, 4, 3, True), 2, 3, 20, [(21, 0.9, None), (22, 1.0, None)]),
    (3, cfg(64, 24, 48, 6, 2, False), 1, 30, 8, [(31, 1.0, 10), (32, 0.5, 3)]),
    (4, cfg(29, 8, 8, 1, 1, True), 1, 1, 12, [(41, 1.0, None), (42, 1.2, 4)]),
]


def run_case(case) -> dict:
    seed, c, B, T0, n, runs = case
    torch.manual_seed(seed)
    model = bg.GPTModel(c)
    model.eval()
    g = torch.Generator().manual_seed(1000 + seed)
    prompt = torch.randint(0, c["vocab_size"], (B, T0), generator=g)
    greedy = bgen.generate_text_simple(model, prompt, n, c["context_length"])
    with torch.no_grad():
        last_logits = model(greedy[:, -c["context_length"]:])[:, -1, :]
    sampled = []
    for run_seed, temperature, top_k in runs:
        torch.manual_seed(run_seed)
        out = bgen.generate(model, prompt, n, c["context_length"], temperature, top_k)
        sampled.append({"seed": run_seed, "temperature": temperature, "top_k": top_k or 0,
                        "ids": out.tolist()})
    # eos_id (batch 1): a token the greedy run generates, so that it stops early.
    if B == 1:
        eos = int(greedy[0, T0 + n // 2])
        for run_seed, temperature, top_k in [(0, 0.0, None)] + list(runs[:1]):
            torch.manual_seed(run_seed)
            out = bgen.generate(model, prompt, n, c["context_length"], temperature, top_k, eos)
            sampled.append({"seed": run_seed, "temperature": temperature, "top_k": top_k or 0,
                            "eos_id": eos, "ids": out.tolist()})
    # Greedy through generate() (temperature 0) is generate_text_simple's.
    assert torch.equal(bgen.generate(model, prompt, n, c["context_length"]), greedy)
    params = [[name, tensor_bits_json(p)] for name, p in model.named_parameters()]
    return {"seed": seed, "config": c, "prompt": prompt.tolist(), "max_new_tokens": n,
            "params": params, "greedy": greedy.tolist(), "last_logits": tensor_json(last_logits),
            "sampled": sampled}


def generate(out_dir) -> None:
    write_json(pathlib.Path(out_dir) / "generate.json",
               {"torch": torch.__version__, "cases": [run_case(c) for c in CASES]})
