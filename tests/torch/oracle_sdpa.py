"""Scaled-dot-product attention (attn/sdpa.h) against PyTorch 1.13's explicit maths.

PyTorch 1.13 has no scaled_dot_product_attention, so the oracle is the
definition written out in torch, in float64, with autograd for the gradients:

    k, v = k.repeat_interleave(Hq // Hkv, dim=1), likewise v     (GQA)
    s = scale * q @ k^T
    s = softcap * tanh(s / softcap)                              (softcap > 0)
    s = s - slope[h] * |i + delta - j|                           (ALiBi)
    s = s.masked_fill(~mask, -inf)  or  s = s + mask             (bool / additive mask)
    s = s.masked_fill(outside the causal/window band, -inf)
    P = softmax(s) on rows with a finite score, 0 on rows without
    out = P @ v, lse = logsumexp(s), and q.grad, k.grad, v.grad from out.backward(dout)

delta = 0 for the top-left causal alignment (PyTorch's is_causal), Tk - Tq for
the bottom-right one (FlashAttention 2's); a query i sees key j when
j <= i + delta (causal), j >= i + delta - window_left and j <= i + delta +
window_right (each -1 = unbounded).

Inputs are torch.randn float32 (the mask: torch.rand < 0.8, additive values
randn or -inf), recorded bit for bit with the float64 results rounded to
float32, so the C++ side (tests/torch/test_sdpa_torch.cpp) needs no
random-number agreement. Dropout is not covered here (the kernel's Philox
noise is checked against the reference in tests/unit/test_sdpa.cpp).

bfloat16 (sdpa_bf16.json): the same maths in float64 on inputs rounded to
bf16 (torch.randn(...).to(torch.bfloat16)), as PyTorch's SDPA on bf16 tensors
defines it: bf16 values, higher-precision sums, outputs rounded to bf16 once.
Each case records the exact output and gradients (autograd), the output
rounded to bf16 (out_bf16), and the gradients a fused bf16 backward computes
from that bf16 output: it takes D = rowsum(dout * out) from the out it is
given (PyTorch's flash backward and FlashAttention's do too), so, written out
in float64 with P = softmax(s) and t = tanh(s_raw / softcap):

    dP = dout @ v^T,  dS = P * (dP - rowsum(dout * out_bf16)),  dS *= 1 - t^2 (softcap)
    dq = scale * dS @ k,  dk = scale * dS^T @ q,  dv = P^T @ dout  (k, v, dk, dv summed
    over each group of query heads)

(with out_bf16 replaced by the exact out this equals autograd's gradients;
generate() checks that on every case).

Variable-length packed batches (attn's sdpa_varlen_forward/backward,
flash_attn_varlen_func's semantics): q (total_q, Hq, D), k (total_k, Hkv, D),
v (total_k, Hkv, Dv) hold the sequences one after the other, sequence b at rows
cu_seqlens[b] .. cu_seqlens[b+1]; each sequence is the definition above on its
own rows (a batch of one, Tq and Tk its own lengths, positions counted from its
start, ALiBi slopes per head or per sequence), a sequence with queries and no
key gives 0 and lse -inf; the outputs are packed the same way, lse as
(Hq, total_q). Autograd runs through the slicing and the concatenation, so the
gradients land on the packed rows.

bfloat16 varlen (sdpa_varlen_bf16.json): the varlen cases on bf16-rounded
inputs, recorded as the bf16 file records its cases (out_bf16 and the
gradients with D from it, sequence by sequence).

Rows whose softmax sits on one key (sdpa_exact.json, issue 44): a softmax
over one key has gradient exactly 0 with respect to that key's score, so with
Tk = 1 dq and dk are exactly 0, and where all of a row's probability but
e^-40 lies on one key they are below 1e-15. The cases: Tk = 1 (GQA, Tq up to
200, both causal alignments); causal with window_left = 0 (every row sees
its own key only); a boolean mask leaving one key per row; an additive mask
0 on one key per row and -40 - 10·U(0, 1) on the others (near one-hot).
float32 inputs, and the same cases on bf16-rounded inputs (gradients with D
from the bf16 out, as sdpa_bf16.json's).

Writes sdpa.json, sdpa_bf16.json, sdpa_varlen.json, sdpa_varlen_bf16.json and
sdpa_exact.json.
"""
import pathlib
import random

import torch

from oracle_util import tensor_bits_json, write_json

CASES = 72
BF16_CASES = 48
T_CHOICES = [1, 3, 8, 16, 17, 33]
D_CHOICES = [1, 5, 8, 16, 17, 32]


def draw_case(rng: random.Random) -> dict:
    c = {}
    c["B"] = rng.choice([1, 2])
    c["Hkv"] = rng.choice([1, 2])
    c["Hq"] = c["Hkv"] * rng.choice([1, 2, 4] if c["Hkv"] == 2 else [1, 2, 4, 8])
    c["Tq"] = rng.choice(T_CHOICES)
    c["Tk"] = c["Tq"] if rng.random() < 0.4 else rng.choice(T_CHOICES)
    c["D"] = rng.choice(D_CHOICES)
    c["Dv"] = c["D"] if rng.random() < 0.6 else rng.choice(D_CHOICES)
    c["is_causal"] = rng.random() < 0.5
    c["bottom_right"] = rng.random() < 0.5
    c["window_left"], c["window_right"] = -1, -1
    if rng.random() < 0.35:
        c["window_left"] = rng.choice([-1, 0, 2, 6])
        c["window_right"] = rng.choice([-1, 0, 3])
    c["alibi"] = rng.random() < 0.3
    c["softcap"] = rng.choice([0.0, 0.0, 0.0, 1.5, 4.0])
    c["scale"] = rng.choice([None, None, None, 0.3])
    kind = rng.choice(["none", "none", "bool", "additive"])
    c["mask"] = kind
    B, Hq, Tq, Tk = c["B"], c["Hq"], c["Tq"], c["Tk"]
    shapes = [[Tq, Tk], [B, 1, 1, Tk], [1, Hq, Tq, Tk], [B, Hq, Tq, Tk], [Tk], [B, 1, Tq, 1], [Hq, 1, Tk]]
    c["mask_shape"] = rng.choice(shapes) if kind != "none" else []
    return c


def explicit_sdpa(q, k, v, c, mask, slopes):
    """The definition above in float64 (inputs already float64, requiring grad)."""
    Hq, Hkv, Tq, Tk, D = c["Hq"], c["Hkv"], c["Tq"], c["Tk"], c["D"]
    group = Hq // Hkv
    k_rep = k.repeat_interleave(group, dim=1)
    v_rep = v.repeat_interleave(group, dim=1)
    scale = c["scale"] if c["scale"] is not None else 1.0 / D ** 0.5
    s = scale * (q @ k_rep.transpose(-2, -1))  # (B, Hq, Tq, Tk)
    t = None
    if c["softcap"] > 0:
        t = torch.tanh(s / c["softcap"])
        s = c["softcap"] * t
    i = torch.arange(Tq, dtype=torch.float64).view(-1, 1)
    j = torch.arange(Tk, dtype=torch.float64).view(1, -1)
    delta = Tk - Tq if c["bottom_right"] else 0
    if slopes is not None:
        s = s - slopes.view(1, Hq, 1, 1) * (i + delta - j).abs()
    if c["mask"] == "bool":
        s = s.masked_fill(mask == 0, float("-inf"))
    elif c["mask"] == "additive":
        s = s + mask
    allowed = torch.ones(Tq, Tk, dtype=torch.bool)
    right = c["window_right"]
    if c["is_causal"]:
        right = 0 if right < 0 else min(right, 0)
    if right >= 0:
        allowed &= j <= i + delta + right
    if c["window_left"] >= 0:
        allowed &= j >= i + delta - c["window_left"]
    s = s.masked_fill(~allowed, float("-inf"))
    empty = (s == float("-inf")).all(dim=-1, keepdim=True)  # rows with no key
    p = torch.softmax(s.masked_fill(empty, 0.0), dim=-1).masked_fill(empty, 0.0)
    out = p @ v_rep
    lse = torch.logsumexp(s, dim=-1)
    return out, lse, p, t


def flash_backward(q, k, v, c, p, t, dout, out_used):
    """The gradients with D = rowsum(dout * out_used), in float64 (no autograd)."""
    B, Hq, Hkv, Tk, D, Dv = c["B"], c["Hq"], c["Hkv"], c["Tk"], c["D"], c["Dv"]
    group = Hq // Hkv
    k_rep = k.repeat_interleave(group, dim=1)
    v_rep = v.repeat_interleave(group, dim=1)
    scale = c["scale"] if c["scale"] is not None else 1.0 / D ** 0.5
    dp = dout @ v_rep.transpose(-2, -1)
    ds = p * (dp - (dout * out_used).sum(dim=-1, keepdim=True))
    if t is not None:
        ds = ds * (1 - t * t)
    dq = scale * ds @ k_rep
    dk = (scale * ds.transpose(-2, -1) @ q).view(B, Hkv, group, Tk, D).sum(dim=2)
    dv = (p.transpose(-2, -1) @ dout).view(B, Hkv, group, Tk, Dv).sum(dim=2)
    return dq, dk, dv


def make_case(seed: int, c: dict, bf16: bool = False) -> dict:
    torch.manual_seed(seed)
    B, Hq, Hkv, Tq, Tk, D, Dv = c["B"], c["Hq"], c["Hkv"], c["Tq"], c["Tk"], c["D"], c["Dv"]
    q = torch.randn(B, Hq, Tq, D)
    k = torch.randn(B, Hkv, Tk, D)
    v = torch.randn(B, Hkv, Tk, Dv)
    dout = torch.randn(B, Hq, Tq, Dv)
    if bf16:  # the values a bf16 tensor holds (float32 holds them exactly)
        q, k, v, dout = (x.to(torch.bfloat16).float() for x in (q, k, v, dout))
    mask = None
    if c["mask"] == "bool":
        mask = (torch.rand(c["mask_shape"]) < 0.8).to(torch.float32)
    elif c["mask"] == "additive":
        keep = torch.rand(c["mask_shape"]) < 0.8
        mask = torch.randn(c["mask_shape"]).masked_fill(~keep, float("-inf"))
    slopes = None
    if c["alibi"]:
        slopes = torch.tensor([2.0 ** (-8.0 * (h + 1) / Hq) for h in range(Hq)], dtype=torch.float32)
    q64, k64, v64 = (x.double().requires_grad_() for x in (q, k, v))
    out, lse, p, t = explicit_sdpa(q64, k64, v64, c, None if mask is None else mask.double(),
                                   None if slopes is None else slopes.double())
    out.backward(dout.double(), retain_graph=bf16)
    record = dict(c)
    record["seed"] = seed
    record["inputs"] = {
  "q" : tensor_bits_json(q),
        "k" : tensor_bits_json(k),
              "v" : tensor_bits_json(v),
                    "dout" : tensor_bits_json(dout)}
    if mask is not None:
        record["inputs"]["mask"] = tensor_bits_json(mask)
    if slopes is not None:
        record["inputs"]["alibi_slopes"] = tensor_bits_json(slopes)
    record["expected"] = {
  "out" : tensor_bits_json(out.float()),
          "lse" : tensor_bits_json(lse.float()),
                  "dq" : tensor_bits_json(q64.grad.float()),
                         "dk" : tensor_bits_json(k64.grad.float()),
                                "dv" : tensor_bits_json(v64.grad.float())}
    if bf16:
        with torch.no_grad():
            args = (q64.detach(), k64.detach(), v64.detach(), c, p.detach(),
                    None if t is None else t.detach(), dout.double())
            exact = flash_backward(*args, out.detach())
            for got, want in zip(exact, (q64.grad, k64.grad, v64.grad)):
                assert torch.allclose(got, want, rtol=1e-9, atol=1e-9), "flash_backward != autograd"
            out_bf16 = out.detach().float().to(torch.bfloat16).double()
            dq, dk, dv = flash_backward(*args, out_bf16)
        record["expected"]["out_bf16"] = tensor_bits_json(out_bf16.float())
        record["expected"]["dq_from_out_bf16"] = tensor_bits_json(dq.float())
        record["expected"]["dk_from_out_bf16"] = tensor_bits_json(dk.float())
        record["expected"]["dv_from_out_bf16"] = tensor_bits_json(dv.float())
    return record


VARLEN_CASES = 32
VARLEN_LENGTHS = [0, 1, 3, 8, 16, 17, 33]


def draw_varlen_case(rng: random.Random) -> dict:
    c = draw_case(rng)
    c["mask"], c["mask_shape"] = "none", []  # no dense mask for packed batches
    nseq = rng.choice([1, 2, 3, 4])
    c["lens_q"] = [rng.choice(VARLEN_LENGTHS) for _ in range(nseq)]
    same = rng.random() < 0.4
    c["lens_k"] = list(c["lens_q"]) if same else [rng.choice(VARLEN_LENGTHS) for _ in range(nseq)]
    c["alibi_per_sequence"] = c["alibi"] and rng.random() < 0.5
    for key in ("B", "Tq", "Tk"):  # per sequence now
        del c[key]
    return c


def varlen_sdpa(q, k, v, c, slopes):
    """Each sequence through explicit_sdpa as a batch of one; outputs packed again."""
    outs, lses = [], []
    q0 = k0 = 0
    for b, (tq, tk) in enumerate(zip(c["lens_q"], c["lens_k"])):
        seq = dict(c, Tq=tq, Tk=tk, mask="none")
        if tq > 0 and tk == 0:  # queries with no key: output 0, lse -inf
            outs.append(torch.zeros(tq, c["Hq"], c["Dv"], dtype=q.dtype))
            lses.append(torch.full((c["Hq"], tq), float("-inf"), dtype=q.dtype))
        elif tq > 0:
            # (T, H, W) rows of the sequence -> (1, H, T, W)
            one = lambda x, r0, r1: x[r0:r1].transpose(0, 1).unsqueeze(0)
            seq_slopes = None
            if slopes is not None:
                seq_slopes = slopes[b] if c["alibi_per_sequence"] else slopes
            out, lse, _, _ = explicit_sdpa(one(q, q0, q0 + tq), one(k, k0, k0 + tk),
                                           one(v, k0, k0 + tk), seq, None, seq_slopes)
            outs.append(out.squeeze(0).transpose(0, 1))  # (Tq, Hq, Dv)
            lses.append(lse.squeeze(0))                  # (Hq, Tq)
        q0, k0 = q0 + tq, k0 + tk
    out = torch.cat(outs, 0) if outs else torch.zeros(0, c["Hq"], c["Dv"], dtype=q.dtype)
    lse = torch.cat(lses, 1) if lses else torch.zeros(c["Hq"], 0, dtype=q.dtype)
    return out, lse


def make_varlen_case(seed: int, c: dict) -> dict:
    torch.manual_seed(seed)
    Hq, Hkv, D, Dv = c["Hq"], c["Hkv"], c["D"], c["Dv"]
    total_q, total_k = sum(c["lens_q"]), sum(c["lens_k"])
    q = torch.randn(total_q, Hq, D)
    k = torch.randn(total_k, Hkv, D)
    v = torch.randn(total_k, Hkv, Dv)
    dout = torch.randn(total_q, Hq, Dv)
    slopes = None
    if c["alibi"]:
        per_head = torch.tensor([2.0 ** (-8.0 * (h + 1) / Hq) for h in range(Hq)])
        if c["alibi_per_sequence"]:
            slopes = torch.stack([per_head * (1.0 + 0.5 * b) for b in range(len(c["lens_q"]))])
        else:
            slopes = per_head
    q64, k64, v64 = (t.double().requires_grad_() for t in (q, k, v))
    out, lse = varlen_sdpa(q64, k64, v64, c, None if slopes is None else slopes.double())
    if out.requires_grad:
        out.backward(dout.double())
    grad = lambda t: t.grad if t.grad is not None else torch.zeros_like(t)
    record = dict(c)
    record["seed"] = seed
    record["inputs"] = {"q": tensor_bits_json(q), "k": tensor_bits_json(k),
                        "v": tensor_bits_json(v), "dout": tensor_bits_json(dout)}
    if slopes is not None:
        record["inputs"]["alibi_slopes"] = tensor_bits_json(slopes)
    record["expected"] = {"out": tensor_bits_json(out.float()), "lse": tensor_bits_json(lse.float()),
                          "dq": tensor_bits_json(grad(q64).float()),
                          "dk": tensor_bits_json(grad(k64).float()),
                          "dv": tensor_bits_json(grad(v64).float())}
    return record


VARLEN_BF16_CASES = 24


def varlen_flash_backward(q, k, v, c, slopes, dout, out_used):
    """flash_backward sequence by sequence (D from out_used), packed; float64, no autograd."""
    dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    q0 = k0 = 0
    for b, (tq, tk) in enumerate(zip(c["lens_q"], c["lens_k"])):
        if tq > 0 and tk > 0:
            seq = dict(c, B=1, Tq=tq, Tk=tk, mask="none")
            one = lambda x, r0, r1: x[r0:r1].transpose(0, 1).unsqueeze(0)  # (1, H, T, W)
            back = lambda x: x.squeeze(0).transpose(0, 1)                 # (T, H, W)
            seq_slopes = None
            if slopes is not None:
                seq_slopes = slopes[b] if c["alibi_per_sequence"] else slopes
            qs, ks, vs = one(q, q0, q0 + tq), one(k, k0, k0 + tk), one(v, k0, k0 + tk)
            _, _, p, t = explicit_sdpa(qs, ks, vs, seq, None, seq_slopes)
            g = flash_backward(qs, ks, vs, seq, p, t, one(dout, q0, q0 + tq),
                               one(out_used, q0, q0 + tq))
            dq[q0:q0 + tq], dk[k0:k0 + tk], dv[k0:k0 + tk] = (back(x) for x in g)
        q0, k0 = q0 + tq, k0 + tk
    return dq, dk, dv


def make_varlen_bf16_case(seed: int, c: dict) -> dict:
    """A varlen case on bf16-rounded inputs: the exact results (autograd), the out
    rounded to bf16, and the gradients with D from that bf16 out (as the bf16 file)."""
    torch.manual_seed(seed)
    Hq, Hkv, D, Dv = c["Hq"], c["Hkv"], c["D"], c["Dv"]
    total_q, total_k = sum(c["lens_q"]), sum(c["lens_k"])
    q, k, v, dout = (torch.randn(*shape).to(torch.bfloat16).float()
                     for shape in ((total_q, Hq, D), (total_k, Hkv, D), (total_k, Hkv, Dv),
                                   (total_q, Hq, Dv)))
    slopes = None
    if c["alibi"]:
        per_head = torch.tensor([2.0 ** (-8.0 * (h + 1) / Hq) for h in range(Hq)])
        if c["alibi_per_sequence"]:
            slopes = torch.stack([per_head * (1.0 + 0.5 * b) for b in range(len(c["lens_q"]))])
        else:
            slopes = per_head
    slopes64 = None if slopes is None else slopes.double()
    q64, k64, v64 = (t.double().requires_grad_() for t in (q, k, v))
    out, lse = varlen_sdpa(q64, k64, v64, c, slopes64)
    if out.requires_grad:
        out.backward(dout.double())
    grad = lambda t: t.grad if t.grad is not None else torch.zeros_like(t)
    with torch.no_grad():
        args = (q64.detach(), k64.detach(), v64.detach(), c, slopes64, dout.double())
        exact = varlen_flash_backward(*args, out.detach())
        for got, want in zip(exact, (grad(q64), grad(k64), grad(v64))):
            assert torch.allclose(got, want, rtol=1e-9, atol=1e-9), "varlen flash_backward != autograd"
        out_bf16 = out.detach().float().to(torch.bfloat16).double()
        dq, dk, dv = varlen_flash_backward(*args, out_bf16)
    record = dict(c)
    record["seed"] = seed
    record["inputs"] = {"q": tensor_bits_json(q), "k": tensor_bits_json(k),
                        "v": tensor_bits_json(v), "dout": tensor_bits_json(dout)}
    if slopes is not None:
        record["inputs"]["alibi_slopes"] = tensor_bits_json(slopes)
    record["expected"] = {"out": tensor_bits_json(out.float()), "lse": tensor_bits_json(lse.float()),
                          "dq": tensor_bits_json(grad(q64).float()),
                          "dk": tensor_bits_json(grad(k64).float()),
                          "dv": tensor_bits_json(grad(v64).float()),
                          "out_bf16": tensor_bits_json(out_bf16.float()),
                          "dq_from_out_bf16": tensor_bits_json(dq.float()),
                          "dk_from_out_bf16": tensor_bits_json(dk.float()),
                          "dv_from_out_bf16": tensor_bits_json(dv.float())}
    return record


EXACT_KINDS = ["one key", "window 0", "bool one key", "near one-hot"]


def draw_exact_case(rng: random.Random, kind: str) -> dict:
    c = draw_case(rng)
    c["kind"] = kind
    c["Tq"] = rng.choice([1, 7, 64, 65, 200])
    c["Tk"] = 1 if kind == "one key" else rng.choice([2, 17, 64, 65, 130])
    c["alibi"], c["softcap"] = False, 0.0
    c["window_left"], c["window_right"] = -1, -1
    c["is_causal"] = kind == "window 0" or (kind == "one key" and rng.random() < 0.5)
    if kind == "window 0":
        c["Tk"] = c["Tq"]
        c["window_left"] = 0
    c["mask"], c["mask_shape"] = "none", []
    if kind in ("bool one key", "near one-hot"):
        c["mask"] = "bool" if kind == "bool one key" else "additive"
        B, Hq = c["B"], c["Hq"]
        c["mask_shape"] = rng.choice([[c["Tq"], c["Tk"]], [B, Hq, c["Tq"], c["Tk"]]])
    return c


def one_key_mask(c: dict) -> torch.Tensor:
    """Per row: one key kept (bool: 1, additive: 0), the others hidden (0 / -40 - 10·U)."""
    shape = c["mask_shape"]
    chosen = torch.randint(0, c["Tk"], shape[:-1] + [1])
    one = torch.zeros(shape).scatter_(-1, chosen, 1.0)
    if c["mask"] == "bool":
        return one
    return (1.0 - one) * (-40.0 - 10.0 * torch.rand(shape))


def make_exact_case(seed: int, c: dict, bf16: bool) -> dict:
    """make_case's record for a case whose rows have one key (or nearly all the weight on one)."""
    torch.manual_seed(seed)
    B, Hq, Hkv, Tq, Tk, D, Dv = c["B"], c["Hq"], c["Hkv"], c["Tq"], c["Tk"], c["D"], c["Dv"]
    q, k, v, dout = (torch.randn(*shape) for shape in
                     ((B, Hq, Tq, D), (B, Hkv, Tk, D), (B, Hkv, Tk, Dv), (B, Hq, Tq, Dv)))
    if bf16:
        q, k, v, dout = (x.to(torch.bfloat16).float() for x in (q, k, v, dout))
    mask = one_key_mask(c) if c["mask"] != "none" else None
    q64, k64, v64 = (x.double().requires_grad_() for x in (q, k, v))
    out, lse, p, t = explicit_sdpa(q64, k64, v64, c, None if mask is None else mask.double(), None)
    out.backward(dout.double())
    grad = lambda x: x.grad if x.grad is not None else torch.zeros_like(x)
    if c["kind"] in ("one key", "window 0", "bool one key"):  # the maths' exact zeros
        assert grad(q64).abs().max() == 0 and grad(k64).abs().max() == 0
    record = dict(c)
    record["seed"] = seed
    record["inputs"] = {"q": tensor_bits_json(q), "k": tensor_bits_json(k),
                        "v": tensor_bits_json(v), "dout": tensor_bits_json(dout)}
    if mask is not None:
        record["inputs"]["mask"] = tensor_bits_json(mask)
    record["expected"] = {"out": tensor_bits_json(out.float()), "lse": tensor_bits_json(lse.float()),
                          "dq": tensor_bits_json(grad(q64).float()),
                          "dk": tensor_bits_json(grad(k64).float()),
                          "dv": tensor_bits_json(grad(v64).float())}
    if bf16:  # the gradients with D from the bf16 out (as sdpa_bf16.json's)
        with torch.no_grad():
            out_bf16 = out.detach().float().to(torch.bfloat16).double()
            dq, dk, dv = flash_backward(q64.detach(), k64.detach(), v64.detach(), c, p.detach(),
                                        None, dout.double(), out_bf16)
        record["expected"]["out_bf16"] = tensor_bits_json(out_bf16.float())
        record["expected"]["dq_from_out_bf16"] = tensor_bits_json(dq.float())
        record["expected"]["dk_from_out_bf16"] = tensor_bits_json(dk.float())
        record["expected"]["dv_from_out_bf16"] = tensor_bits_json(dv.float())
    return record


def generate(out_dir: pathlib.Path) -> None:
    rng = random.Random(2020)
    cases = [make_case(1000 + n, draw_case(rng)) for n in range(CASES)]
    write_json(pathlib.Path(out_dir) / "sdpa.json",
               {"torch": torch.__version__, "dtype": "float64 maths on float32 inputs", "cases": cases})
    rng = random.Random(2016)
    cases = [make_case(5000 + n, draw_case(rng), bf16=True) for n in range(BF16_CASES)]
    write_json(pathlib.Path(out_dir) / "sdpa_bf16.json",
               {"torch": torch.__version__, "dtype": "float64 maths on bfloat16 inputs",
                "cases": cases})
    rng = random.Random(2021)
    varlen = [make_varlen_case(7000 + n, draw_varlen_case(rng)) for n in range(VARLEN_CASES)]
    write_json(pathlib.Path(out_dir) / "sdpa_varlen.json",
               {"torch": torch.__version__, "dtype": "float64 maths on float32 inputs", "cases": varlen})
    rng = random.Random(2022)
    varlen = [make_varlen_bf16_case(9000 + n, draw_varlen_case(rng))
              for n in range(VARLEN_BF16_CASES)]
    write_json(pathlib.Path(out_dir) / "sdpa_varlen_bf16.json",
               {"torch": torch.__version__, "dtype": "float64 maths on bfloat16 inputs",
                "cases": varlen})
    rng = random.Random(2044)
    exact = [make_exact_case(11000 + n, draw_exact_case(rng, EXACT_KINDS[n % 4]), bf16=n % 8 >= 4)
             for n in range(32)]
    write_json(pathlib.Path(out_dir) / "sdpa_exact.json",
               {"torch": torch.__version__,
                "dtype": "float64 maths on float32 and bfloat16-rounded inputs", "cases": exact})
