"""Records the book's own RoPE and multi-head latent attention under PyTorch
1.13 on CPU, once, into a committed fixture that tests/torch/test_rope_mla_book_torch.cpp
compares attn with (and that proves tests/torch/oracle_rope.py and
oracle_mla.py compute what the book computes).

The book's code is not copied here: it is read from a fetched copy of
rasbt/LLMs-from-scratch, given as the first argument, and run as it stands:

  compute_rope_params, apply_rope   ch05/07_gpt_to_llama/standalone-llama32.ipynb
                                    (the code cells that define them, executed)
  MultiHeadLatentAttention          ch04/05_mla/gpt_with_kv_mla.py (imported; the
                                    module imports tiktoken at the top, which the
                                    class does not use: a stub stands in when it is
                                    not installed)

What is recorded (float32 values as their bit patterns):

  rope     for (head_dim, theta_base, context_length, freq_config) of the
           Llama 2 kind (10000, no scaling) and Llama 3.2's (500000, factor 32,
           low 1, high 4, original 8192, on a short original_context_length too
           so every band is crossed): the first half of cos and sin (the
           script checks that the second half repeats it); apply_rope of a random
           (B, H, T, hd) x on the tables' rows 0..T-1 and on rows
           offset..offset+T-1 (the book's apply_rope slices rows :T, so the
           offset case passes it cos[offset:], sin[offset:]), and the gradient
           of sum(y * dy) in x.
  mla      MultiHeadLatentAttention(d_in, d_out, dropout=0, num_heads,
           qkv_bias, latent_dim) made under torch.manual_seed(seed): its
           state_dict, x (B, T, d_in), y = forward(x), the gradients of
           sum(y * dy) in x and in every parameter, and the cached decode:
           reset_cache(), forward(x[:, :P], use_cache=True), then one token at
           a time; each step's output and the cache's latent at the end.
  mla_gpt  the book's GPTModel of gpt_with_kv_mla.py (cfg latent_dim 6) from
           manual_seed(123): its state_dict keys, the logits of 8 tokens in
           eval mode, and generate_text_simple_cached's 9 greedy tokens after
           a 3-token prompt with use_cache True and False.

  /usr/bin/python3 tests/torch/record_rope_mla.py /work/book tests/fixtures/rope_mla/book.json
"""
import argparse
import importlib.util
import json
import pathlib
import platform
import sys
import types

import torch


def bits(t):
    t = t.detach().to(torch.float32).contiguous()
    return {"shape": list(t.shape), "bits": [b & 0xFFFFFFFF for b in t.reshape(-1).view(torch.int32).tolist()]}


def load_rope(book):
    nb_path = book / "ch05" / "07_gpt_to_llama" / "standalone-llama32.ipynb"
    nb = json.loads(nb_path.read_text(encoding="utf-8"))
    ns = {}
    exec("import torch\nimport torch.nn as nn\n", ns)
    found = 0
    for cell in nb["cells"]:
        src = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
        if cell["cell_type"] == "code" and ("def compute_rope_params" in src or "def apply_rope" in src):
            exec(src, ns)
            found += 1
    if "compute_rope_params" not in ns or "apply_rope" not in ns:
        raise SystemExit(f"{nb_path}: no compute_rope_params / apply_rope cell")
    return ns["compute_rope_params"], ns["apply_rope"]


def load_mla(book):
    path = book / "ch04" / "05_mla" / "gpt_with_kv_mla.py"
    if importlib.util.find_spec("tiktoken") is None:
        sys.modules["tiktoken"] = types.ModuleType("tiktoken")
    spec = importlib.util.spec_from_file_location("book_gpt_with_kv_mla", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.MultiHeadLatentAttention


ROPE_CASES = [
    {"head_dim": 16, "theta_base": 10000.0, "context_length": 24, "freq_config": None},
    {"head_dim": 64, "theta_base": 500000.0, "context_length": 48,
     "freq_config": {"factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_context_length": 8192}},
    {"head_dim": 32, "theta_base": 500000.0, "context_length": 32,
     "freq_config": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_context_length": 64}},
]

MLA_CASES = [
    {"seed": 123, "d_in": 12, "d_out": 16, "num_heads": 4, "qkv_bias": False, "latent_dim": 6,
     "B": 2, "T": 7, "prefill": 3},
    {"seed": 7, "d_in": 16, "d_out": 16, "num_heads": 2, "qkv_bias": True, "latent_dim": None,
     "B": 1, "T": 5, "prefill": 1},
]


def record_rope(compute_rope_params, apply_rope):
    out = []
    for i, c in enumerate(ROPE_CASES):
        torch.manual_seed(1000 + i)
        cos, sin = compute_rope_params(c["head_dim"], theta_base=c["theta_base"],
                                       context_length=c["context_length"],
                                       freq_config=c["freq_config"])
        x = torch.randn(1, 2, 5, c["head_dim"], requires_grad=True)
        dy = torch.randn(1, 2, 5, c["head_dim"])
        offset = c["context_length"] - 5 - 2
        y0 = apply_rope(x, cos, sin)
        y1 = apply_rope(x, cos[offset:], sin[offset:])
        (y0 * dy).sum().backward()
        dx0 = x.grad.clone()
        x.grad = None
        (y1 * dy).sum().backward()
        half = c["head_dim"] // 2
        assert torch.equal(cos[:, :half], cos[:, half:]) and torch.equal(sin[:, :half], sin[:, half:])
        out.append(dict(c, offset=offset, cos_half=bits(cos[:, :half]), sin_half=bits(sin[:, :half]),
                        x=bits(x), dy=bits(dy),
                        y=bits(y0), dx=bits(dx0), y_offset=bits(y1), dx_offset=bits(x.grad)))
    return out


def record_mla(MultiHeadLatentAttention):
    out = []
    for c in MLA_CASES:
        torch.manual_seed(c["seed"])
        m = MultiHeadLatentAttention(c["d_in"], c["d_out"], 0.0, c["num_heads"],
                                     qkv_bias=c["qkv_bias"], latent_dim=c["latent_dim"])
        x = torch.randn(c["B"], c["T"], c["d_in"], requires_grad=True)
        dy = torch.randn(c["B"], c["T"], c["d_out"])
        y = m(x)
        (y * dy).sum().backward()
        rec = dict(c, latent_dim_used=m.latent_dim,
                   state_dict={k: bits(v) for k, v in m.state_dict().items()},
                   state_dict_keys=list(m.state_dict().keys()),
                   x=bits(x), dy=bits(dy), y=bits(y), dx=bits(x.grad),
                   grads={k: bits(p.grad) for k, p in m.named_parameters()})
        with torch.no_grad():
            m.reset_cache()
            steps = [bits(m(x[:, :c["prefill"]], use_cache=True))]
            for t in range(c["prefill"], c["T"]):
                steps.append(bits(m(x[:, t:t + 1], use_cache=True)))
            rec["cached_steps"] = steps
            rec["cache_c_kv"] = bits(m.cache_c_kv)
        out.append(rec)
    return out


MLA_GPT = {"vocab_size": 40, "context_length": 12, "emb_dim": 16, "n_heads": 4, "n_layers": 2,
           "drop_rate": 0.0, "qkv_bias": False, "latent_dim": 6}


def record_mla_gpt(book):
    """The book's GPTModel of gpt_with_kv_mla.py from manual_seed(123): its
    state_dict keys, the logits of 8 tokens, and generate_text_simple_cached's
    9 greedy tokens after 3 (12 = context_length), with and without its cache."""
    path = book / "ch04" / "05_mla" / "gpt_with_kv_mla.py"
    spec = importlib.util.spec_from_file_location("book_gpt_with_kv_mla_gpt", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    torch.manual_seed(123)
    model = module.GPTModel(MLA_GPT)
    model.eval()
    ids = torch.tensor([[3, 17, 5, 21, 35, 33, 26, 8]])
    with torch.no_grad():
        logits = model(ids)
    prompt = torch.tensor([[3, 17, 5]])
    tokens = {}
    for use_cache in (True, False):
        out = module.generate_text_simple_cached(model, prompt, 9, use_cache=use_cache)
        tokens["cache" if use_cache else "no_cache"] = out[0].tolist()
    return {"config": MLA_GPT, "seed": 123, "state_dict_keys": list(model.state_dict().keys()),
            "ids": ids[0].tolist(), "logits": bits(logits), "prompt": prompt[0].tolist(),
            "tokens": tokens}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("book", help="path of the fetched rasbt/LLMs-from-scratch copy")
    parser.add_argument("out", help="the fixture to write (JSON)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    book = pathlib.Path(args.book)
    compute_rope_params, apply_rope = load_rope(book)
    mla = load_mla(book)
    payload = {"torch": torch.__version__, "machine": platform.machine(),
               "source": "rasbt/LLMs-from-scratch: ch05/07_gpt_to_llama/standalone-llama32.ipynb, "
                         "ch04/05_mla/gpt_with_kv_mla.py",
               "rope": record_rope(compute_rope_params, apply_rope),
               "mla": record_mla(mla),
               "mla_gpt": record_mla_gpt(book)}
    pathlib.Path(args.out).write_text(json.dumps(payload, separators=(",", ":")) + "\n")


if __name__ == "__main__":
    main()
