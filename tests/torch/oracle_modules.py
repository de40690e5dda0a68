"""Differential oracle: every module of the chapter under PyTorch 1.13, on many
random configurations, with the same seeded protocol attn's C++ side runs.

Protocol per configuration (identical in tests/torch/test_modules_torch.cpp):
    torch.manual_seed(seed)
    module = <Class>(options)          # draws the parameters
    module.eval() if the case says so
    x = torch.randn(x_shape)           # requires_grad (Embedding: fixed indices instead)
    y = module(x)                      # dropout draws here
    dy = torch.randn(y.shape)
    y.backward(dy)
    (in about 15% of cases, "passes": 2, the last four lines run twice without
    zero_grad: parameter grads accumulate, as attn's backward must += them)
Recorded: the configuration; y, x.grad and every parameter's grad (by PyTorch
name) in full; and, as exact fingerprints (CRC-32 of the float32 bytes), the
tensors the C++ side regenerates from the seed: the initial parameters, x and
dy. A fingerprint mismatch is a random-number (or draw-order) bug, reported as
such before the numerical comparisons.

Also recorded, per tensor, "err64": the largest difference between PyTorch's
float32 result and the same computation in float64 (same parameters, inputs and
dropout masks). It measures how well conditioned a case is; the C++ test uses
it only to widen the tolerance of cases where float32 itself cannot meet 1e-5
(see the test for the rule).

Configurations are drawn with random.Random(<fixed seed per kind>) from
B in {1,2,3,4,8}, T and widths in {1,3,15,16,17,33,64}, num_heads in
{1,2,3,4,8}, dropout p in {0, 0.1, 0.5} (training mode) and some evaluation-mode
cases. Most cases are small (see SMALL_CAP) so that the files stay a few MB; about
one in ten is larger.

torch's randn (numel >= 16) depends on the CPU kernel it dispatches to; attn
follows the AVX2 one. As in oracle_random.py, if torch picked another, this
script reruns itself with ATEN_CPU_CAPABILITY=avx2, and every file records the
capability it ran with ("cpu_capability"); the C++ test skips otherwise.

Writes modules_<kind>.json for each kind in KINDS, and
modules_multi_head_attention_gpt2.json: MultiHeadAttention at GPT-2 sizes
(768/12 and 1600/25), with its large weight gradients stored as samples.
"""
import base64
import pathlib
import random
import sys
import zlib

import torch
import torch.nn as nn

import book_modules as bm
from oracle_util import cpu_capability, run_under_avx2, write_json

CASES_PER_KIND = 60
B_CHOICES = [1, 2, 3, 4, 8]
T_CHOICES = [1, 3, 15, 16, 17, 33, 64]
D_CHOICES = [1, 3, 15, 16, 17, 33, 64]
HEAD_CHOICES = [1, 2, 3, 4, 8]
P_CHOICES = [0.0, 0.1, 0.5]
# Size of a case: the larger of its largest activation (B * T * width, attention
# weights included) and its parameter count. Most cases stay under SMALL_CAP; every
# BIG_EVERY-th case is a big one (T in {33, 64}, B in {1, 2}) under LARGE_CAP.
SMALL_CAP = 3072
LARGE_CAP = 32768
BIG_EVERY = 10


def packed(t: torch.Tensor) -> dict:
    """A reference tensor, exactly: {"shape": [...], "f32le": base64 of the
    float32 little-endian bytes, "crc32"}. About 5.3 characters per value instead of
    oracle_util.tensor_json's 10 to 20, which keeps the files a few MB."""
    t = t.detach().to(torch.float32).contiguous()
    raw = t.numpy().astype("<f4").tobytes()
    # crc32 lets the reader check its decoding.
    return {"shape": list(t.shape), "f32le": base64.b64encode(raw).decode("ascii"), "crc32": zlib.crc32(raw)}


def fingerprint(t: torch.Tensor) -> dict:
    """A tensor the C++ side regenerates from the seed (parameters, x, dy) is
    not stored, only identified exactly: CRC-32 of its float32 little-endian
    bytes, plus its sum and first values for the failure message."""
    t = t.detach().to(torch.float32).contiguous()
    raw = t.numpy().astype("<f4").tobytes()
    flat = t.reshape(-1)
    return {"shape": list(t.shape), "crc32": zlib.crc32(raw), "sum": float(flat.double().sum()),
            "head": [float(v) for v in flat[:4].tolist()]}


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    if a.numel() == 0:
        return 0.0
    return float((a.detach().double() - b.detach().double()).abs().max())


# ---- configuration drawing ---------------------------------------------------------


def draw_training(rng: random.Random, cfg: dict) -> None:
    cfg["dropout"] = rng.choice(P_CHOICES)
    cfg["eval"] = rng.random() < 0.15


def draw_context(rng: random.Random, T: int) -> int:
    """context_length >= T: equal to T about a third of the time."""
    if rng.random() < 0.35:
        return T
    return rng.choice([c for c in T_CHOICES if c >= T] + [T + rng.randint(1, 9)])


def draw_b_t(rng: random.Random, cfg: dict, big: bool) -> None:
    """A big case has long sequences (T in {33, 64}) and a small batch."""
    cfg["B"] = rng.choice([1, 2] if big else B_CHOICES)
    cfg["T"] = rng.choice([33, 64] if big else T_CHOICES)


def draw_linear(rng, big):
    cfg = {}
    draw_b_t(rng, cfg, big)
    cfg.update(in_features=rng.choice(D_CHOICES), out_features=rng.choice(D_CHOICES), bias=rng.random() < 0.7)
    cfg["x_shape"] = [cfg["B"], cfg["T"], cfg["in_features"]]
    if rng.random() < 0.2:
        cfg["x_shape"] = [cfg["T"], cfg["in_features"]]
    return cfg, max(cfg["in_features"], cfg["out_features"]) * cfg["B"] * cfg["T"]


def draw_dropout(rng, big):
    cfg = {}
    draw_b_t(rng, cfg, big)
    cfg["d"] = rng.choice(D_CHOICES)
    cfg["p"] = rng.choice(P_CHOICES + [0.5, 0.1, 1.0] if rng.random() < 0.1 else P_CHOICES + [0.5, 0.1])
    cfg["eval"] = rng.random() < 0.15
    cfg["x_shape"] = [cfg["B"], cfg["T"], cfg["d"]]
    return cfg, cfg["B"] * cfg["T"] * cfg["d"]


def draw_embedding(rng, big):
    cfg = {}
    draw_b_t(rng, cfg, big)
    cfg.update(num_embeddings=rng.choice(D_CHOICES), embedding_dim=rng.choice(D_CHOICES))
    cfg["indices"] = [rng.randrange(cfg["num_embeddings"]) for _ in range(cfg["B"] * cfg["T"])]
    return cfg, cfg["B"] * cfg["T"] * cfg["embedding_dim"]


def draw_self_attention(rng, big, v2):
    cfg = {}
    draw_b_t(rng, cfg, big)
    cfg.update(d_in=rng.choice(D_CHOICES), d_out=rng.choice(D_CHOICES))
    cfg["d_v"] = rng.choice(D_CHOICES) if rng.random() < 0.3 else 0  # 0: same as d_out
    cfg["qkv_bias"] = v2 and rng.random() < 0.5
    d_v = cfg["d_v"] or cfg["d_out"]
    cfg["x_shape"] = [cfg["B"], cfg["T"], cfg["d_in"]]
    if rng.random() < 0.25:  # a single sequence (T, d_in)
        cfg["x_shape"] = [cfg["T"], cfg["d_in"]]
    return cfg, cfg["B"] * cfg["T"] * max(cfg["d_in"], cfg["d_out"], d_v, cfg["T"])


def draw_causal(rng, big):
    cfg = {}
    draw_b_t(rng, cfg, big)
    cfg.update(d_in=rng.choice(D_CHOICES), d_out=rng.choice(D_CHOICES))
    cfg["context_length"] = draw_context(rng, cfg["T"])
    draw_training(rng, cfg)
    cfg["qkv_bias"] = rng.random() < 0.5
    cfg["softmax_dim"] = 1 if rng.random() < 0.12 else -1
    cfg["x_shape"] = [cfg["B"], cfg["T"], cfg["d_in"]]
    return cfg, cfg["B"] * cfg["T"] * max(cfg["d_in"], cfg["d_out"], cfg["T"])


def draw_wrapper(rng, big):
    cfg = {}
    draw_b_t(rng, cfg, big)
    cfg.update(d_in=rng.choice(D_CHOICES), d_out=rng.choice(D_CHOICES), num_heads=rng.choice(HEAD_CHOICES))
    cfg["context_length"] = draw_context(rng, cfg["T"])
    draw_training(rng, cfg)
    cfg["qkv_bias"] = rng.random() < 0.5
    cfg["x_shape"] = [cfg["B"], cfg["T"], cfg["d_in"]]
    width = max(cfg["d_in"], cfg["d_out"] * cfg["num_heads"], cfg["T"] * cfg["num_heads"])
    return cfg, cfg["B"] * cfg["T"] * width


def draw_mha(rng, big):
    cfg = {}
    draw_b_t(rng, cfg, big)
    cfg["num_heads"] = rng.choice(HEAD_CHOICES)
    divisible = [d for d in D_CHOICES if d % cfg["num_heads"] == 0]
    # head widths of 16 and more too: d_out = num_heads * hd with hd in {1, 3, 15, 16, 17, 33}
    multiples = [cfg["num_heads"] * hd for hd in (1, 3, 15, 16, 17, 33) if cfg["num_heads"] * hd <= 64]
    cfg["d_out"] = rng.choice(divisible + multiples)
    cfg["d_in"] = rng.choice(D_CHOICES)
    cfg["context_length"] = draw_context(rng, cfg["T"])
    draw_training(rng, cfg)
    cfg["qkv_bias"] = rng.random() < 0.5
    cfg["x_shape"] = [cfg["B"], cfg["T"], cfg["d_in"]]
    width = max(cfg["d_in"], cfg["d_out"], cfg["T"] * cfg["num_heads"])
    return cfg, cfg["B"] * cfg["T"] * width


def draw_head(rng, big):
    cfg = {}
    draw_b_t(rng, cfg, big)
    cfg.update(n_embd=rng.choice(D_CHOICES), head_size=rng.choice(D_CHOICES))
    cfg["block_size"] = draw_context(rng, cfg["T"])
    draw_training(rng, cfg)
    cfg["causal"] = rng.random() < 0.7
    cfg["x_shape"] = [cfg["B"], cfg["T"], cfg["n_embd"]]
    return cfg, cfg["B"] * cfg["T"] * max(cfg["n_embd"], cfg["head_size"], cfg["T"])


def draw_multi_head(rng, big):
    cfg = {}
    draw_b_t(rng, cfg, big)
    cfg.update(n_embd=rng.choice(D_CHOICES), num_heads=rng.choice(HEAD_CHOICES), head_size=rng.choice(D_CHOICES))
    cfg["block_size"] = draw_context(rng, cfg["T"])
    draw_training(rng, cfg)
    cfg["causal"] = rng.random() < 0.7
    cfg["x_shape"] = [cfg["B"], cfg["T"], cfg["n_embd"]]
    width = max(cfg["n_embd"], cfg["num_heads"] * cfg["head_size"], cfg["num_heads"] * cfg["T"])
    return cfg, cfg["B"] * cfg["T"] * width


# ---- module construction (draws the parameters, in PyTorch's order) -------------------------


def build(kind: str, c: dict) -> nn.Module:
    if kind == "linear":
        return nn.Linear(c["in_features"], c["out_features"], bias=c["bias"])
    if kind == "dropout":
        return nn.Dropout(c["p"])
    if kind == "embedding":
        return nn.Embedding(c["num_embeddings"], c["embedding_dim"])
    if kind == "self_attention_v1":
        return bm.SelfAttention_v1(c["d_in"], c["d_out"], d_v=c["d_v"] or None)
    if kind == "self_attention_v2":
        return bm.SelfAttention_v2(c["d_in"], c["d_out"], qkv_bias=c["qkv_bias"], d_v=c["d_v"] or None)
    if kind == "causal_attention":
        return bm.CausalAttention(c["d_in"], c["d_out"], c["context_length"], c["dropout"], c["qkv_bias"],
                                  softmax_dim=c["softmax_dim"])
    if kind == "multi_head_attention_wrapper":
        return bm.MultiHeadAttentionWrapper(c["d_in"], c["d_out"], c["context_length"], c["dropout"],
                                            c["num_heads"], c["qkv_bias"])
    if kind == "multi_head_attention":
        return bm.MultiHeadAttention(c["d_in"], c["d_out"], c["context_length"], c["dropout"], c["num_heads"],
                                     c["qkv_bias"])
    if kind == "head":
        return bm.Head(c["n_embd"], c["head_size"], c["block_size"], c["dropout"], c["causal"])
    if kind == "multi_head":
        return bm.MultiHead(c["n_embd"], c["num_heads"], c["head_size"], c["block_size"], c["dropout"], c["causal"])
    raise ValueError(kind)


KINDS = {
    # kind: (config drawer, seed of the configuration stream)
    "linear": (draw_linear, 1001),
    "dropout": (draw_dropout, 1002),
    "embedding": (draw_embedding, 1003),
    "self_attention_v1": (lambda rng, big: draw_self_attention(rng, big, False), 1004),
    "self_attention_v2": (lambda rng, big: draw_self_attention(rng, big, True), 1005),
    "causal_attention": (draw_causal, 1006),
    "multi_head_attention_wrapper": (draw_wrapper, 1007),
    "multi_head_attention": (draw_mha, 1008),
    "head": (draw_head, 1009),
    "multi_head": (draw_multi_head, 1010),
}


def run_protocol(kind: str, cfg: dict, dtype: torch.dtype):
    """The seeded protocol; returns (initial params, x, y, dy, grads) in dtype.
    With "passes": 2 the forward/backward step runs twice without zero_grad, so
    parameter grads are the sum of both (PyTorch accumulates); x, y, dy and
    x.grad are those of the last pass."""
    torch.manual_seed(cfg["seed"])
    module = build(kind, cfg)
    params0 = {name: p.detach().clone() for name, p in module.named_parameters()}
    module = module.to(dtype)
    if cfg.get("eval", False):
        module.eval()
    for _ in range(cfg.get("passes", 1)):
        if kind == "embedding":
            x = None
            idx = torch.tensor(cfg["indices"], dtype=torch.long).view(cfg["B"], cfg["T"])
            y = module(idx)
        else:
            x = torch.randn(*cfg["x_shape"]).to(dtype).requires_grad_(True)
            y = module(x)
        dy = torch.randn(y.shape).to(dtype)
        y.backward(dy)
    grads = {name: p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p)
             for name, p in module.named_parameters()}
    if x is not None:
        grads["x"] = x.grad.detach().clone()
    return params0, x, y.detach(), dy, grads


def generate_kind(kind: str) -> dict:
    drawer, stream_seed = KINDS[kind]
    rng = random.Random(stream_seed)
    cases = []
    while len(cases) < CASES_PER_KIND:
        big = len(cases) % BIG_EVERY == BIG_EVERY - 1
        cfg, size = drawer(rng, big)
        cap = LARGE_CAP if big else SMALL_CAP
        size = max(size, sum(p.numel() for p in build(kind, cfg).parameters()))
        if size > cap:
            continue
        # A few of the chapter's seeds, then arbitrary 64-bit ones (only the low 32 bits seed MT19937).
        cfg["seed"] = [123, 789, 1337][len(cases)] if len(cases) < 3 else rng.randrange(2**63)
        cfg["passes"] = 2 if rng.random() < 0.15 else 1  # 2: grads accumulate over two steps
        cases.append(run_case(kind, cfg, f"{kind}#{len(cases)}"))
    return {"kind": kind, "torch": torch.__version__, "cpu_capability": cpu_capability(), "cases": cases}


def run_case(kind: str, cfg: dict, name: str, stored=None) -> dict:
    """Runs the protocol in float32 and float64 and returns the case record.
    stored(t) writes a reference tensor (packed, or sampled for GPT-2 sizes)."""
    stored = stored or packed
    params0, x, y, dy, grads = run_protocol(kind, cfg, torch.float32)
    _, _, y64, _, grads64 = run_protocol(kind, cfg, torch.float64)
    case = {
        "name": name,
        "config": cfg,
        "params": {n: fingerprint(p) for n, p in params0.items()},
        "y": stored(y),
        "dy": fingerprint(dy),
        "grads": {n: stored(g) for n, g in grads.items()},
        "err64": {"y": max_diff(y, y64), **{n: max_diff(g, grads64[n]) for n, g in grads.items()}},
    }
    if x is not None:
        case["x"] = fingerprint(x)
    return case


# GPT-2 sizes (SPEC section 4): small, 768 wide with 12 heads, and the largest,
# 1600 wide with 25 heads (head_dim 64), on short sequences.
GPT2_CASES = [
    dict(B=2, T=16, d_in=768, d_out=768, num_heads=12, context_length=1024, dropout=0.1, eval=False,
         qkv_bias=False, seed=123, passes=1),
    dict(B=1, T=8, d_in=1600, d_out=1600, num_heads=25, context_length=1024, dropout=0.0, eval=False,
         qkv_bias=True, seed=789, passes=1),
    dict(B=1, T=64, d_in=768, d_out=768, num_heads=12, context_length=64, dropout=0.1, eval=True,
         qkv_bias=True, seed=1337, passes=1),
]
SAMPLE_ABOVE = 65536  # tensors larger than this are stored as every SAMPLE_STRIDE-th value
SAMPLE_STRIDE = 1009  # a prime, so the samples walk across rows and columns


def packed_or_sampled(t: torch.Tensor) -> dict:
    """packed(t), or for a large tensor {"shape", "stride", "absmax", "f32le", "crc32"} of
    t.flatten()[::stride]: enough to check every weight matrix of a GPT-2 layer
    without writing tens of MB."""
    if t.numel() <= SAMPLE_ABOVE:
        return packed(t)
    record = packed(t.detach().reshape(-1)[::SAMPLE_STRIDE])
    record["shape"] = list(t.shape)
    record["stride"] = SAMPLE_STRIDE
    record["absmax"] = float(t.detach().abs().max())  # of the whole tensor, for the tolerance
    return record


def generate_gpt2() -> dict:
    cases = []
    for cfg in GPT2_CASES:
        cfg = dict(cfg, x_shape=[cfg["B"], cfg["T"], cfg["d_in"]])
        cases.append(run_case("multi_head_attention", cfg, f"gpt2#{len(cases)}", packed_or_sampled))
    return {"kind": "multi_head_attention_gpt2", "torch": torch.__version__,
            "cpu_capability": cpu_capability(), "cases": cases}


def compute(out_dir: pathlib.Path) -> None:
    out_dir = pathlib.Path(out_dir)
    for kind in KINDS:
        write_json(out_dir / f"modules_{kind}.json", generate_kind(kind))
    write_json(out_dir / "modules_multi_head_attention_gpt2.json", generate_gpt2())


def generate(out_dir) -> None:
    run_under_avx2(__file__, out_dir, compute)


if __name__ == "__main__":
    torch.set_num_threads(1)
    compute(pathlib.Path(sys.argv[1]))
