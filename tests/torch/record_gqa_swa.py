"""Records the book's own grouped-query and sliding-window attention
(rasbt/LLMs-from-scratch: ch04/04_gqa/gpt_with_kv_gqa.py and
ch04/06_swa/gpt_with_kv_swa.py) under PyTorch 1.13, once, into a small
committed fixture that tests/unit/test_gqa_swa_book.cpp compares attn with.
The book's code is read from a fetched copy given on the command line; it is
neither committed nor imported by any test.

Recorded, on fixed seeds (the book's classes draw their parameters):
  modules   GroupedQueryAttention(d_in, d_out, dropout=0.0, num_heads,
            num_kv_groups, qkv_bias) and MultiHeadAttentionWithSWA(d_in, d_out,
            dropout=0.0, num_heads, qkv_bias, sliding_window_size), in eval mode:
            state_dict keys, parameter CRC-32s, x and dy (float32 bits), y,
            x.grad and every parameter's grad; and the book's own KV cache
            (forward(..., use_cache=True): a prefill, then one token at a time;
            the SWA module trims its cache to the window) -> y_cached.
  gpt       the book's GPTModel of each script with n_kv_groups, or
            sliding_window_size and sliding_window_stride (its K:1 layer
            schedule): parameter CRC-32s, the logits of a fixed batch, and
            generate_text_simple_cached's greedy tokens with and without its cache.

  ATEN_CPU_CAPABILITY=avx2 /usr/bin/python3 tests/torch/record_gqa_swa.py \
      /work/book tests/fixtures/gqa_swa/book_1.13.json
"""
import importlib.util
import json
import pathlib
import sys
import types
import zlib

import torch


def load(path: pathlib.Path, name: str):
    sys.modules.setdefault("tiktoken", types.ModuleType("tiktoken"))  # used by main() only
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def crc32(t) -> int:
    return zlib.crc32(t.detach().to(torch.float32).contiguous().numpy().astype("<f4").tobytes())


def bits(t) -> dict:
    t = t.detach().to(torch.float32).contiguous()
    return {"shape": list(t.shape), "bits": [b & 0xFFFFFFFF for b in t.reshape(-1).view(torch.int32).tolist()]}


def values(t) -> dict:
    t = t.detach().to(torch.float32).contiguous()
    return {"shape": list(t.shape), "values": [float(v) for v in t.reshape(-1).tolist()]}


def module_case(make, kind, seed, B, T, d_in, num_heads, head_dim, extra, qkv_bias, prefill):
    d_out = num_heads * head_dim
    torch.manual_seed(seed)
    m = make(d_out)
    m.eval()
    x = torch.randn(B, T, d_in)
    dy = torch.randn(B, T, d_out)
    xg = x.clone().requires_grad_(True)
    y = m(xg)
    y.backward(dy)
    with torch.no_grad():
        m.reset_cache()
        parts = [m(x[:, :prefill], use_cache=True)]
        parts += [m(x[:, t:t + 1], use_cache=True) for t in range(prefill, T)]
        y_cached = torch.cat(parts, dim=1)
        m.reset_cache()
    return {"kind": kind, "seed": seed, "B": B, "T": T, "d_in": d_in, "d_out": d_out,
            "num_heads": num_heads, extra[0]: extra[1], "qkv_bias": qkv_bias,
            "prefill": prefill, "state_dict": list(m.state_dict().keys()),
            "param_crc32": [[n, crc32(p)] for n, p in m.named_parameters()],
            "x": bits(x), "dy": bits(dy), "y": values(y), "dx": values(xg.grad),
            "grads": {n: values(p.grad) for n, p in m.named_parameters()},
            "y_cached": values(y_cached)}


def gpt_case(book, cfg, seed, ids, prompt, new_tokens):
    torch.manual_seed(seed)
    model = book.GPTModel(cfg)
    model.eval()
    with torch.no_grad():
        logits = model(torch.tensor(ids))
    out = {"config": cfg, "seed": seed, "ids": ids,
           "param_crc32": [[n, crc32(p)] for n, p in model.named_parameters()],
           "logits": values(logits), "prompt": prompt}
    for use_cache in (True, False):
        idx = book.generate_text_simple_cached(model, torch.tensor([prompt]), new_tokens,
                                               use_cache=use_cache)
        out["generated_cache" if use_cache else "generated_no_cache"] = idx[0].tolist()
    return out


def main() -> int:
    book_dir = pathlib.Path(sys.argv[1])
    out = pathlib.Path(sys.argv[2])
    torch.set_num_threads(1)
    gqa = load(book_dir / "ch04/04_gqa/gpt_with_kv_gqa.py", "book_gpt_with_kv_gqa")
    swa = load(book_dir / "ch04/06_swa/gpt_with_kv_swa.py", "book_gpt_with_kv_swa")
    modules = []
    # (seed, B, T, d_in, num_heads, head_dim, num_kv_groups, qkv_bias, prefill)
    for seed, B, T, d_in, H, hd, G, bias, prefill in [
            (11, 2, 9, 8, 4, 4, 2, False, 4), (12, 1, 7, 5, 6, 3, 3, True, 1),
            (13, 2, 6, 6, 4, 5, 1, False, 3), (14, 3, 5, 4, 2, 8, 2, True, 5)]:
        modules.append(module_case(
            lambda d_out: gqa.GroupedQueryAttention(d_in, d_out, 0.0, H, G, qkv_bias=bias),
            "gqa", seed, B, T, d_in, H, hd, ("num_kv_groups", G), bias, prefill))
    # (seed, B, T, d_in, num_heads, head_dim, sliding_window_size, qkv_bias, prefill)
    for seed, B, T, d_in, H, hd, w, bias, prefill in [
            (21, 2, 9, 8, 4, 4, 3, False, 4), (22, 1, 8, 5, 3, 3, 1, True, 1),
            (23, 2, 7, 6, 2, 5, 2, False, 5), (24, 1, 6, 4, 2, 4, None, True, 2),
            (25, 2, 10, 6, 3, 4, 4, True, 7)]:
        modules.append(module_case(
            lambda d_out: swa.MultiHeadAttentionWithSWA(d_in, d_out, 0.0, H, qkv_bias=bias,
                                                        sliding_window_size=w),
            "swa", seed, B, T, d_in, H, hd, ("sliding_window_size", w or 0), bias, prefill))
    base = {"vocab_size": 17, "context_length": 12, "emb_dim": 12, "n_heads": 4, "n_layers": 3,
            "drop_rate": 0.0, "qkv_bias": False}
    ids = [[1, 5, 9, 2, 16, 3, 3, 0], [7, 7, 1, 12, 4, 10, 11, 6]]
    gpts = [gpt_case(gqa, dict(base, n_kv_groups=2), 31, ids, [3, 1, 4], 6),
            gpt_case(gqa, dict(base, n_kv_groups=1, qkv_bias=True), 32, ids, [2, 7], 7),
            gpt_case(swa, dict(base, sliding_window_size=3, sliding_window_stride=2), 33, ids,
                     [5, 9, 2, 6], 6),
            gpt_case(swa, dict(base, sliding_window_size=2, sliding_window_stride=-1), 34, ids,
                     [1], 8)]
    payload = {"torch": torch.__version__, "source": "rasbt/LLMs-from-scratch ch04/04_gqa, ch04/06_swa",
               "modules": modules, "gpt": gpts}
    out.write_text(json.dumps(payload, separators=(",", ":")) + "\n")
    print(f"wrote {out} ({out.stat().st_size} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
