"""Oracle for generating one token at a time (attn/kv_cache.h): the book's
MultiHeadAttention (book_modules.py) on whole sequences, in evaluation mode.

Protocol per case (the C++ side, tests/torch/test_kv_cache_torch.cpp, repeats it):
    torch.manual_seed(seed)
    model = MultiHeadAttention(d_in, d_out, context_length, dropout, num_heads, qkv_bias)
    x = x_scale * torch.randn(B, T, d_in)
    model.eval()
    y = model(x)                      # (B, T, d_out), the whole sequence at once
The C++ test builds the same module from the same seed, feeds x through its
key/value cache one token at a time (and prefill + one at a time) and compares
every position with y.

Recorded per case: the configuration; x exactly (float32 bits), so the C++ side
runs on torch's own input even where torch's randn took a non-AVX2 kernel; the
CRC-32 of every parameter's float32 bytes (in PyTorch's order), which the C++
side must reproduce from the seed; y; and err64, the largest difference between
y and the same model run in float64, which measures how well conditioned the
case is (large x_scale makes the softmax nearly one-hot); the C++ test shows it
when a comparison fails.

Writes kv_cache.json.
"""
import pathlib
import zlib

import torch

import book_modules as bm
from oracle_util import cpu_capability, tensor_bits_json, tensor_json, write_json

# (seed, B, T, d_in, num_heads, head_dim, context_length, qkv_bias, dropout, x_scale)
CASES = [
    (1, 1, 1, 3, 1, 1, 1, False, 0.0, 1.0),
    (2, 2, 6, 3, 2, 1, 6, False, 0.1, 1.0),
    (3, 1, 6, 3, 1, 2, 6, True, 0.5, 1.0),
    (4, 3, 15, 16, 3, 5, 17, True, 0.1, 1.0),
    (5, 2, 16, 17, 4, 16, 16, False, 0.0, 1.0),
    (6, 1, 17, 15, 2, 17, 33, True, 0.1, 1.0),
    (7, 2, 33, 8, 8, 3, 33, False, 0.5, 1.0),
    (8, 1, 64, 64, 8, 8, 64, False, 0.1, 1.0),
    (9, 2, 64, 32, 1, 64, 70, True, 0.0, 1.0),
    (10, 1, 40, 24, 4, 33, 40, False, 0.1, 1.0),
    (11, 3, 20, 7, 6, 15, 25, True, 0.1, 1.0),
    (12, 1, 31, 16, 2, 64, 31, True, 0.0, 1.0),
    # large inputs: large outputs and nearly one-hot attention weights
    (13, 2, 24, 16, 4, 4, 24, True, 0.1, 30.0),
    (14, 1, 48, 33, 3, 16, 48, False, 0.0, 100.0),
]


def crc32(t: torch.Tensor) -> int:
    return zlib.crc32(t.detach().to(torch.float32).contiguous().numpy().astype("<f4").tobytes())


def run_case(case) -> dict:
    seed, B, T, d_in, num_heads, head_dim, context_length, qkv_bias, dropout, x_scale = case
    d_out = num_heads * head_dim
    torch.manual_seed(seed)
    model = bm.MultiHeadAttention(d_in, d_out, context_length, dropout, num_heads, qkv_bias)
    x = x_scale * torch.randn(B, T, d_in)
    model.eval()
    with torch.no_grad():
        y = model(x)
        params = [(name, crc32(p)) for name, p in model.named_parameters()]
        y64 = model.double()(x.double())
    config = {"seed": seed, "B": B, "T": T, "d_in": d_in, "d_out": d_out, "num_heads": num_heads,
              "context_length": context_length, "qkv_bias": qkv_bias, "dropout": dropout,
              "x_scale": x_scale}
    return {"config": config, "x": tensor_bits_json(x), "param_crc32": params, "y": tensor_json(y),
            "err64": float((y.double() - y64).abs().max())}


def generate(out_dir) -> None:
    cases = [run_case(c) for c in CASES]
    write_json(pathlib.Path(out_dir) / "kv_cache.json",
               {"torch": torch.__version__, "cpu_capability": cpu_capability(), "cases": cases})
