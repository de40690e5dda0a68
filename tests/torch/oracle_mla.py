"""Multi-head latent attention (attn/mla.h) against PyTorch 1.13.

The book's MultiHeadLatentAttention (ch04/05_mla) in our own words, in float64:

  q = x Wq^T (+ bq)          c = x Wdkv^T (+ bdkv)     (the latent, latent_dim wide)
  k = c Wuk^T (+ buk)        v = c Wuv^T (+ buv)
  heads: (B, T, H*hd) -> (B, H, T, hd)
  scores = q k^T / sqrt(hd), -inf where key j is after query i's position,
  weights = softmax(scores), context = weights v, heads merged,
  y = context Wo^T + bo

with dropout 0. Gradients: autograd of sum(y * dy) in x and in every weight.
Cached decode: the latent of each new token appended to a cache, keys and
values up-projected from the whole cache, query i of a step at position
(cached length + i); a prefill of P tokens, then one token per step.

Weights and inputs are float32 randn (scaled by 1/sqrt(fan-in) so the scores
stay moderate), recorded bit for bit; the results are float64 rounded to
float32. Writes mla.json.
"""
import pathlib
import random

import torch

from oracle_util import tensor_bits_json, write_json

CASES = 10


def attention(q, k, v, offset):
    """q (B, H, Tq, hd) at positions offset .., k, v (B, H, Tk, hd) at 0 .."""
    hd = q.shape[-1]
    s = q @ k.transpose(-1, -2) / hd ** 0.5
    qpos = torch.arange(offset, offset + q.shape[2])[:, None]
    kpos = torch.arange(k.shape[2])[None, :]
    s = s.masked_fill(kpos > qpos, float("-inf"))
    return torch.softmax(s, dim=-1) @ v


def mla(w, x, H, cache=None):
    """y for x (B, T, d_in); with a cache (a list holding the latent so far),
    x's tokens continue the cached sequence."""
    def lin(name, t):
        out = t @ w[name + ".weight"].T
        if name + ".bias" in w:
            out = out + w[name + ".bias"]
        return out
    B, T, _ = x.shape
    q = lin("W_query", x)
    c = lin("W_DKV", x)
    offset = 0
    if cache is not None:
        if cache:
            offset = cache[0].shape[1]
            c = torch.cat([cache[0], c], dim=1)
        cache[:] = [c]
    k, v = lin("W_UK", c), lin("W_UV", c)
    d_out = q.shape[-1]
    heads = lambda t: t.view(B, t.shape[1], H, d_out // H).transpose(1, 2)
    ctx = attention(heads(q), heads(k), heads(v), offset).transpose(1, 2).reshape(B, T, d_out)
    return lin("out_proj", ctx)


def draw_case(rng):
    H = rng.choice([1, 2, 4])
    hd = rng.choice([1, 3, 8, 16])
    c = {"B": rng.choice([1, 2]), "T": rng.choice([1, 4, 9, 17]), "d_in": rng.choice([5, 8, 24]),
         "num_heads": H, "d_out": H * hd, "latent_dim": rng.choice([1, 4, 7, 16]),
         "qkv_bias": rng.random() < 0.5}
    c["prefill"] = rng.randint(1, c["T"])
    return c


def weights(c):
    shapes = {"W_query": (c["d_out"], c["d_in"]), "W_DKV": (c["latent_dim"], c["d_in"]),
              "W_UK": (c["d_out"], c["latent_dim"]), "W_UV": (c["d_out"], c["latent_dim"]),
              "out_proj": (c["d_out"], c["d_out"])}
    w = {}
    for name, shape in shapes.items():
        w[name + ".weight"] = torch.randn(*shape) / shape[1] ** 0.5
        if c["qkv_bias"] or name == "out_proj":
            w[name + ".bias"] = torch.randn(shape[0]) * 0.1
    return w


def generate(out_dir):
    rng = random.Random(5)
    torch.manual_seed(5)
    cases = []
    for _ in range(CASES):
        c = draw_case(rng)
        w32 = weights(c)
        x32 = torch.randn(c["B"], c["T"], c["d_in"])
        dy32 = torch.randn(c["B"], c["T"], c["d_out"])
        w = {k: v.double().requires_grad_(True) for k, v in w32.items()}
        x = x32.double().requires_grad_(True)
        y = mla(w, x, c["num_heads"])
        (y * dy32.double()).sum().backward()
        with torch.no_grad():
            cache = []
            steps = [mla(w, x[:, :c["prefill"]], c["num_heads"], cache)]
            for t in range(c["prefill"], c["T"]):
                steps.append(mla(w, x[:, t:t + 1], c["num_heads"], cache))
        c["weights"] = {k: tensor_bits_json(v) for k, v in w32.items()}
        c["x"], c["dy"] = tensor_bits_json(x32), tensor_bits_json(dy32)
        c["y"], c["dx"] = tensor_bits_json(y), tensor_bits_json(x.grad)
        c["grads"] = {k: tensor_bits_json(v.grad) for k, v in w.items()}
        c["cached_y"] = tensor_bits_json(torch.cat(steps, dim=1))
        cases.append(c)
    write_json(pathlib.Path(out_dir) / "mla.json", {"cases": cases})
