"""Sums over the last dim as torch 1.13 computes them on CPU, bit for bit.

torch adds floats in a fixed order (SumKernel.cpp cascade_sum: 4 interleaved
accumulators, a 4-level cascade, 8-float vector lanes for rows of 8 or more);
attn::sum over the last dim reproduces that order. Cases: rows of every length
around the vector and cascade boundaries, and the walkthrough's weights whose sum
prints as tensor(1.0000) or tensor(1.) depending on the last bit.
"""
import pathlib

import torch

from oracle_util import tensor_bits_json, write_json

LENGTHS = list(range(1, 70)) + [127, 128, 129, 255, 256, 257, 511, 512, 513, 1000, 1024,
                                 4095, 4096, 4097, 20000]


def generate(out_dir):
    gen = torch.Generator().manual_seed(2024)
    cases = []
    for n in LENGTHS:
        for rows in (1, 3):
            x = torch.randn(rows, n, generator=gen) * 3 + 0.5
            cases.append({"x": tensor_bits_json(x), "sum": tensor_bits_json(x.sum(-1)),
                          "normalized": tensor_bits_json(x / x.sum(-1, keepdim=True))})
    # softmax rows sum to 1 up to the last bit; the order decides which side.
    x = torch.rand(200, 6, generator=gen) * 4
    w = torch.softmax(x, dim=-1)
    cases.append({"x": tensor_bits_json(w), "sum": tensor_bits_json(w.sum(-1)),
                  "normalized": tensor_bits_json(w / w.sum(-1, keepdim=True))})
    write_json(pathlib.Path(out_dir) / "sum_order.json", {"cases": cases})
