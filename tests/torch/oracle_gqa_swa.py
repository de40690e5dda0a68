"""Oracle for the book's bonus attention variants under PyTorch 1.13:
grouped-query attention (ch04/04_gqa) and sliding-window attention
(ch04/06_swa), as modules and inside the chapter-4 GPT.

The maths is written here in our own words (not the book's code; the book's
own modules are recorded once by tests/torch/record_gqa_swa.py into
tests/fixtures/gqa_swa/, which proves this oracle and attn equal the book):

  scores = (q @ kᵀ) / sqrt(head_dim), q (B, H, T, hd), k and v (B, G, T, hd)
           with each key/value head repeated H / G times (repeat_interleave,
           so query head h reads group h // (H / G))
  query i may see key j when j <= i and i - j < w (w: the window; None: no bound)
  context = softmax(scores) @ v, heads merged, then out_proj

  GroupedQueryAttention      W_key, W_value (d_in -> G·hd), W_query (d_in -> d_out),
                             out_proj (d_out -> d_out, no bias), created in that order
  MultiHeadAttentionWithSWA  W_query, W_key, W_value (d_in -> d_out), out_proj (with bias)

Protocol per module case (tests/torch/test_gqa_swa_torch.cpp repeats it):
    torch.manual_seed(seed); m = <Class>(...); m.eval()
    x = torch.randn(B, T, d_in, requires_grad=True); y = m(x)
    dy = torch.randn(B, T, d_out); y.backward(dy)
Recorded: the configuration, x and dy exactly (float32 bits), every parameter's
CRC-32 (PyTorch's order and names), y, x.grad and every parameter's grad, and
err64 per tensor (the float32 result against the same case in float64).

GPT cases: a tiny GPTModel with n_kv_groups / sliding_window_size /
sliding_window_stride (the book's config keys and K:1 layer schedule), drop_rate
0: the parameter CRC-32s, the losses of 5 plain SGD steps (p -= lr · grad) on
fixed batches, and the greedy tokens the trained model then generates without a
cache (model(idx[:, -context_length:])[:, -1].argmax()).

Writes gqa_swa.json.
"""
import pathlib
import random
import zlib

import torch
import torch.nn as nn
import torch.nn.functional as F

import book_gpt as bg
from oracle_util import cpu_capability, tensor_bits_json, tensor_json, write_json


def attend(q, k, v, window):
    """softmax(q kᵀ / sqrt(hd) + causal/window mask) v, k and v shared by H / G query heads."""
    H, G = q.shape[1], k.shape[1]
    k = k.repeat_interleave(H // G, dim=1)
    v = v.repeat_interleave(H // G, dim=1)
    T = q.shape[2]
    i = torch.arange(T).unsqueeze(1)
    j = torch.arange(T).unsqueeze(0)
    hidden = j > i
    if window is not None:
        hidden = hidden | (i - j >= window)
    scores = (q @ k.transpose(2, 3)) / (q.shape[-1] ** 0.5)
    return torch.softmax(scores.masked_fill(hidden, float("-inf")), dim=-1) @ v


class Attention(nn.Module):
    """Both variants: gqa=True is GroupedQueryAttention (optionally windowed, as
    Gemma combines them), gqa=False MultiHeadAttentionWithSWA."""

    def __init__(self, d_in, d_out, num_heads, num_kv_groups, qkv_bias, window, gqa):
        super().__init__()
        self.H, self.G, self.hd, self.window = num_heads, num_kv_groups, d_out // num_heads, window
        kv = num_kv_groups * self.hd
        if gqa:
            self.W_key = nn.Linear(d_in, kv, bias=qkv_bias)
            self.W_value = nn.Linear(d_in, kv, bias=qkv_bias)
            self.W_query = nn.Linear(d_in, d_out, bias=qkv_bias)
            self.out_proj = nn.Linear(d_out, d_out, bias=False)
        else:
            self.W_query = nn.Linear(d_in, d_out, bias=qkv_bias)
            self.W_key = nn.Linear(d_in, d_out, bias=qkv_bias)
            self.W_value = nn.Linear(d_in, d_out, bias=qkv_bias)
            self.out_proj = nn.Linear(d_out, d_out)

    def forward(self, x):
        B, T, _ = x.shape
        split = lambda t, n: t.view(B, T, n, self.hd).transpose(1, 2)
        ctx = attend(split(self.W_query(x), self.H), split(self.W_key(x), self.G),
                     split(self.W_value(x), self.G), self.window)
        return self.out_proj(ctx.transpose(1, 2).reshape(B, T, self.H * self.hd))


def crc32(t) -> int:
    return zlib.crc32(t.detach().to(torch.float32).contiguous().numpy().astype("<f4").tobytes())


def module_case(kind, seed, B, T, d_in, num_heads, head_dim, num_kv_groups, qkv_bias, window):
    d_out = num_heads * head_dim
    gqa = kind != "swa"
    G = num_kv_groups if gqa else num_heads

    def run(dtype, x, dy):
        torch.manual_seed(seed)
        m = Attention(d_in, d_out, num_heads, G, qkv_bias, window, gqa).to(dtype)
        m.eval()
        x = x.to(dtype).detach().requires_grad_(True)
        y = m(x)
        y.backward(dy.to(dtype))
        return m, y, x.grad

    torch.manual_seed(seed)
    Attention(d_in, d_out, num_heads, G, qkv_bias, window, gqa)  # the draws of the parameters
    x = torch.randn(B, T, d_in)
    dy = torch.randn(B, T, d_out)
    m, y, dx = run(torch.float32, x, dy)
    m64, y64, dx64 = run(torch.float64, x, dy)
    err = lambda a, b: float((a.double() - b).abs().max())
    grads = {n: tensor_json(p.grad) for n, p in m.named_parameters()}
    err64 = {"y": err(y, y64), "dx": err(dx, dx64)}
    for (n, p), (_, p64) in zip(m.named_parameters(), m64.named_parameters()):
        err64[n] = err(p.grad, p64.grad)
    config = {"kind": kind, "seed": seed, "B": B, "T": T, "d_in": d_in, "d_out": d_out,
              "num_heads": num_heads, "num_kv_groups": G if gqa else 0, "qkv_bias": qkv_bias,
              "window": window or 0, "context_length": T + seed % 3}
    return {"config": config, "x": tensor_bits_json(x), "dy": tensor_bits_json(dy),
            "param_crc32": [[n, crc32(p)] for n, p in m.named_parameters()],
            "y": tensor_json(y), "dx": tensor_json(dx), "grads": grads, "err64": err64}


def module_cases():
    rng = random.Random(2020)
    cases = []
    for kind in ["gqa", "swa", "gqa_swa"]:
        for n in range(14):  # about 6 MB of JSON in all
            seed = 1000 * len(kind) + n
            H = rng.choice([1, 2, 3, 4, 6, 8])
            G = rng.choice([g for g in range(1, H + 1) if H % g == 0])
            if n == 0:
                G = 1  # multi-query attention
            T = rng.choice([1, 3, 7, 16, 17, 33])
            window = None
            if kind != "gqa":
                window = rng.choice([None, 1, 2, 3, 5, T, T + 4])
                if n < 2:
                    window = [1, 2][n]
            B, d_in, hd = rng.choice([1, 2, 3]), rng.choice([3, 8, 16, 17]), rng.choice([1, 3, 8, 16, 17, 33])
            while H * hd > 100:  # keeps out_proj's gradient (and the file) small
                hd = (hd + 1) // 2
            cases.append(module_case(kind, seed, B, T, d_in, H, hd, G, rng.random() < 0.5, window))
    return cases


# ---- the GPT ---------------------------------------------------------------------------

def layer_window(cfg, i):
    """The book's K:1 schedule (gpt_with_kv_swa.py): K window layers, then one full."""
    w = cfg["sliding_window_size"]
    if not w:
        return None
    K = cfg["sliding_window_stride"]
    use = (K < 0) if K <= 0 else (i % (K + 1) < K)
    return w if use else None


class Block(nn.Module):
    def __init__(self, cfg, i):
        super().__init__()
        gqa = cfg["n_kv_groups"] > 0
        self.att = Attention(cfg["emb_dim"], cfg["emb_dim"], cfg["n_heads"],
                             cfg["n_kv_groups"] if gqa else cfg["n_heads"], cfg["qkv_bias"],
                             layer_window(cfg, i), gqa)
        self.ff = bg.FeedForward(cfg)
        self.norm1 = bg.LayerNorm(cfg["emb_dim"])
        self.norm2 = bg.LayerNorm(cfg["emb_dim"])

    def forward(self, x):
        x = x + self.att(self.norm1(x))
        return x + self.ff(self.norm2(x))


class GPT(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.tok_emb = nn.Embedding(cfg["vocab_size"], cfg["emb_dim"])
        self.pos_emb = nn.Embedding(cfg["context_length"], cfg["emb_dim"])
        self.trf_blocks = nn.Sequential(*[Block(cfg, i) for i in range(cfg["n_layers"])])
        self.final_norm = bg.LayerNorm(cfg["emb_dim"])
        self.out_head = nn.Linear(cfg["emb_dim"], cfg["vocab_size"], bias=False)

    def forward(self, idx):
        x = self.tok_emb(idx) + self.pos_emb(torch.arange(idx.shape[1]))
        return self.out_head(self.final_norm(self.trf_blocks(x)))


GPT_BASE = {"vocab_size": 13, "context_length": 10, "emb_dim": 24, "n_heads": 6, "n_layers": 3,
            "drop_rate": 0.0, "qkv_bias": False, "n_kv_groups": 0, "sliding_window_size": 0,
            "sliding_window_stride": -1}
GPT_CASES = [
    {"n_kv_groups": 2},
    {"n_kv_groups": 1, "qkv_bias": True},
    {"sliding_window_size": 3, "sliding_window_stride": 1},
    {"sliding_window_size": 2, "sliding_window_stride": -1},
    {"n_kv_groups": 3, "sliding_window_size": 4, "sliding_window_stride": 2},
]
STEPS, BATCH, TOKENS, LR, NEW_TOKENS = 5, 3, 8, 0.5, 12


def gpt_case(n, overrides):
    cfg = dict(GPT_BASE, **overrides)
    rng = random.Random(500 + n)
    text = [rng.randrange(cfg["vocab_size"]) for _ in range(40)]
    batches = []
    for _ in range(STEPS):
        starts = [rng.randrange(len(text) - TOKENS) for _ in range(BATCH)]
        batches.append(([text[s + i] for s in starts for i in range(TOKENS)],
                        [text[s + i + 1] for s in starts for i in range(TOKENS)]))
    seed = 77 + n
    torch.manual_seed(seed)
    model = GPT(cfg)
    crcs = [[name, crc32(p)] for name, p in model.named_parameters()]
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    losses = []
    for x, y in batches:
        logits = model(torch.tensor(x).view(BATCH, TOKENS))
        loss = F.cross_entropy(logits.flatten(0, 1), torch.tensor(y))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss))
    prompt = text[:3]
    idx = torch.tensor([prompt])
    with torch.no_grad():
        for _ in range(NEW_TOKENS):
            logits = model(idx[:, -cfg["context_length"]:])[:, -1]
            idx = torch.cat([idx, logits.argmax(dim=-1, keepdim=True)], dim=1)
    return {"config": cfg, "seed": seed, "lr": LR, "batch": BATCH, "tokens": TOKENS,
            "batches": batches, "param_crc32": crcs, "losses": losses, "prompt": prompt,
            "generated": idx[0].tolist()}


def generate(out_dir) -> None:
    payload = {"torch": torch.__version__, "cpu_capability": cpu_capability(),
               "modules": module_cases(),
               "gpt": [gpt_case(n, o) for n, o in enumerate(GPT_CASES)]}
    write_json(pathlib.Path(out_dir) / "gqa_swa.json", payload)
