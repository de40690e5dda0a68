"""Rotary position embedding (attn/rope.h) against PyTorch 1.13.

The book's Llama chapter (ch05/07_gpt_to_llama) in our own words:

  tables   theta_i = 1 / base^(2i / hd) for i < hd/2, in float32; with Llama 3's
           freq_config, theta_i / factor where the wavelength 2 pi / theta_i is
           longer than original_context_length / low_freq_factor, unchanged
           where it is shorter than original_context_length / high_freq_factor,
           and in between the blend (1 - s) theta_i / factor + s theta_i with
           s = (original_context_length / wavelength - low) / (high - low).
           Row p of the tables: cos(p theta_i), sin(p theta_i) for the first
           half of the head, repeated for the second.
  rotation each head vector x = (x1, x2) (halves) at position p becomes
           (x1 cos - x2 sin, x2 cos + x1 sin), with token t at position
           offset + t (a KV cache's length as offset).

The tables are computed here in float64 from the float32 theta, and compared
by the C++ test within a bound that grows with the angle; the rotation runs in
float32 on the recorded tables (y) and its gradient dx comes from autograd of
sum(y * dy). bfloat16 cases: x rounded to bf16, y computed in float32 and
rounded to bf16 once.

Writes rope.json.
"""
import math
import pathlib
import random

import torch

from oracle_util import tensor_bits_json, write_json

CASES = 24


def inverse_frequencies(hd, base, freq):
    """The float32 theta_i of the maths above (float64 steps, rounded once)."""
    out = []
    for i in range(hd // 2):
        theta = 1.0 / base ** (2 * i / hd)
        if freq is not None:
            wavelength = 2 * math.pi / theta
            low = freq["original_context_length"] / freq["low_freq_factor"]
            high = freq["original_context_length"] / freq["high_freq_factor"]
            if wavelength > low:
                theta = theta / freq["factor"]
            elif wavelength >= high:
                s = (freq["original_context_length"] / wavelength - freq["low_freq_factor"]) / (
                    freq["high_freq_factor"] - freq["low_freq_factor"])
                theta = (1 - s) * theta / freq["factor"] + s * theta
        out.append(theta)
    return torch.tensor(out, dtype=torch.float64)


def tables(hd, base, context_length, freq):
    theta = inverse_frequencies(hd, base, freq)                        # (hd/2)
    p = torch.arange(context_length, dtype=torch.float64)
    angle = p[:, None] * theta[None, :]                                 # (L, hd/2)
    cos = torch.cat([angle.cos(), angle.cos()], dim=1).to(torch.float32)
    sin = torch.cat([angle.sin(), angle.sin()], dim=1).to(torch.float32)
    return cos, sin


def rotate(x, cos, sin, offset):
    """x (B, H, T, hd) float32; the rows offset .. offset + T of the tables."""
    T, hd = x.shape[2], x.shape[3]
    c = cos[offset:offset + T]
    s = sin[offset:offset + T]
    h = hd // 2
    x1, x2 = x[..., :h], x[..., h:]
    y1 = x1 * c[:, :h] - x2 * s[:, :h]
    y2 = x2 * c[:, h:] + x1 * s[:, h:]
    return torch.cat([y1, y2], dim=-1)


def draw_case(rng):
    hd = rng.choice([2, 4, 8, 16, 32, 64, 128])
    T = rng.choice([1, 3, 7, 16])
    L = T + rng.choice([0, 1, 5, 40, 500])
    c = {"B": rng.choice([1, 2]), "H": rng.choice([1, 3]), "T": T, "hd": hd,
         "context_length": L, "offset": rng.randint(0, L - T),
         "theta_base": rng.choice([10000.0, 500000.0, 100.0]),
         "freq_config": None, "bf16": rng.random() < 0.25}
    if rng.random() < 0.4:
        c["freq_config"] = {"factor": rng.choice([8.0, 32.0]), "low_freq_factor": 1.0,
                            "high_freq_factor": 4.0,
                            "original_context_length": rng.choice([16, 64, 8192])}
    return c


def generate(out_dir):
    rng = random.Random(2020)
    torch.manual_seed(2020)
    cases = []
    for _ in range(CASES):
        c = draw_case(rng)
        cos, sin = tables(c["hd"], c["theta_base"], c["context_length"], c["freq_config"])
        x = torch.randn(c["B"], c["H"], c["T"], c["hd"])
        if c["bf16"]:
            x = x.to(torch.bfloat16).to(torch.float32)
        x.requires_grad_(True)
        dy = torch.randn(c["B"], c["H"], c["T"], c["hd"])
        y = rotate(x, cos, sin, c["offset"])
        (y * dy).sum().backward()
        if c["bf16"]:
            y = y.detach().to(torch.bfloat16).to(torch.float32)
        c["inputs"] = {"x": tensor_bits_json(x), "dy": tensor_bits_json(dy),
                       "cos": tensor_bits_json(cos), "sin": tensor_bits_json(sin)}
        c["outputs"] = {"y": tensor_bits_json(y), "dx": tensor_bits_json(x.grad)}
        cases.append(c)
    write_json(pathlib.Path(out_dir) / "rope.json", {"cases": cases})
