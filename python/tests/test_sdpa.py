"""attn.scaled_dot_product_attention against PyTorch's own maths.

PyTorch 1.13 (Debian's, which ctest runs these with) has no
F.scaled_dot_product_attention, so the oracle is the definition written out
with torch ops in float64 with autograd: softmax(scale * Q Kᵀ (+ softcap,
ALiBi, mask, causal/window band)) V, its gradients by torch.autograd.grad.
Every option, both dtypes and four memory layouts; the output and the
gradients of query, key and value; and the errors for bad input.
python/tests/check_torch2.py compares with PyTorch 2.x's SDPA itself.
"""

import math

import pytest
import torch

import attn

F64 = torch.float64


# ---- the oracle -------------------------------------------------------------------------


def oracle(q, k, v, mask=None, is_causal=False, scale=None, enable_gqa=False, window=(-1, -1),
           alibi=None, softcap=0.0, noise=None, bottom_right=False):
    """The definition in float64 (inputs widened exactly), differentiable in q, k, v."""
    Hq, Hkv = q.shape[-3], k.shape[-3]
    if enable_gqa and Hq != Hkv:
        k = k.repeat_interleave(Hq // Hkv, dim=-3)
        v = v.repeat_interleave(Hq // Hkv, dim=-3)
    L, S = q.shape[-2], k.shape[-2]
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    s = (q @ k.transpose(-2, -1)) * scale
    if softcap > 0:
        s = softcap * torch.tanh(s / softcap)
    i = torch.arange(L, dtype=F64).unsqueeze(1)
    j = torch.arange(S, dtype=F64).unsqueeze(0)
    delta = S - L if bottom_right else 0
    if alibi is not None:
        s = s - alibi.to(F64).unsqueeze(-1).unsqueeze(-1) * (i + delta - j).abs()
    if mask is not None:
        if mask.dtype == torch.bool:
            s = s.masked_fill(~mask, -math.inf)
        else:
            s = s + mask.to(F64)
    allowed = torch.ones(L, S, dtype=torch.bool)
    if is_causal:
        allowed &= j <= i + delta
    if window[0] >= 0:
        allowed &= j >= i + delta - window[0]
    if window[1] >= 0:
        allowed &= j <= i + delta + window[1]
    s = s.masked_fill(~allowed, -math.inf)
    # A row with no key: weights 0 (PyTorch >= 2.5's rule; softmax would give NaN).
    empty = torch.isneginf(s).all(dim=-1, keepdim=True)
    p = torch.softmax(s.masked_fill(empty, 0.0), dim=-1).masked_fill(empty, 0.0)
    if noise is not None:
        p = p * noise
    return p @ v


def check_close(name, got, want, bf16, record_error, loose=False):
    """fp32: |got - want| <= 2e-5 · max(1, max|want|). bf16: within bf16's rounding of the
    value (2^-8 · |want|) plus the fp32 sums' part (1e-4, or 1e-2 for dq and dk, whose
    bf16 out enters D = rowsum(dO ⊙ O)) times max(1, max|want|). bf16 = "amx" (a call
    attn._path names "AMX": the core's kernel rounds P and dS to bf16 where they enter
    a product, as PyTorch's bf16 SDPA does): 8e-3 · max|want| for an output, 4e-2 ·
    max|want| for a gradient (a name starting with "d"), tests/unit/test_sdpa_amx.cpp's."""
    if bf16 == "amx":
        want64 = want.to(F64)
        big = want64.abs().max().item() if want.numel() else 0.0
        rel = (4e-2 if name.startswith("d") else 8e-3) * (big if big > 0 else 1.0)
        err = (got.to(F64) - want64).abs().max().item() if want.numel() else 0.0
        assert got.shape == want.shape, f"{name}: shape {tuple(got.shape)} != {tuple(want.shape)}"
        assert torch.isfinite(got.to(F64)).all(), f"{name}: non-finite values"
        record_error(f"bf16 AMX {name}", err, err / rel)
        assert err <= rel, f"{name}: error {err:.3e} exceeds the AMX bound {rel:.3e}"
        return
    want = want.to(F64)
    got = got.to(F64)
    assert got.shape == want.shape, f"{name}: shape {tuple(got.shape)} != {tuple(want.shape)}"
    assert torch.isfinite(got).all(), f"{name}: non-finite values"
    err = (got - want).abs()
    big = max(1.0, want.abs().max().item() if want.numel() else 1.0)
    if bf16:
        bound = 2.0**-8 * want.abs() + (1e-2 if loose else 1e-4) * big
    else:
        bound = torch.full_like(want, 2e-5 * big)
    ratio = (err / bound).max().item() if err.numel() else 0.0
    record_error(f"{'bf16' if bf16 else 'fp32'} {name}", err.max().item() if err.numel() else 0.0,
                 ratio)
    worst = int(torch.argmax(err / bound)) if err.numel() else 0
    assert ratio <= 1.0, (f"{name}: error {err.flatten()[worst].item():.3e} at flat index "
                          f"{worst} exceeds the bound {bound.flatten()[worst].item():.3e}")


# ---- inputs ---------------------------------------------------------------------------------


def make_qkv(B, Hq, Hkv, L, S, E, Ev, dtype, layout, gen):
    """q (B, Hq, L, E), k (B, Hkv, S, E), v (B, Hkv, S, Ev) in one of four layouts:
    contiguous; token-major views (B, T, H, E).transpose(1, 2); slices of one fused
    (B, T, 3, H, E) buffer (needs L = S, Hq = Hkv, E = Ev); every last dim with
    stride 2 (the one layout attn copies)."""
    def rnd(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float32).to(dtype)

    if layout == "contiguous":
        return rnd(B, Hq, L, E), rnd(B, Hkv, S, E), rnd(B, Hkv, S, Ev)
    if layout == "token_major":
        return (rnd(B, L, Hq, E).transpose(1, 2), rnd(B, S, Hkv, E).transpose(1, 2),
                rnd(B, S, Hkv, Ev).transpose(1, 2))
    if layout == "fused_qkv":
        assert L == S and Hq == Hkv and E == Ev
        qkv = rnd(B, L, 3, Hq, E)
        return tuple(qkv[:, :, n].transpose(1, 2) for n in range(3))
    if layout == "last_stride_2":
        return (rnd(B, Hq, L, 2 * E)[..., ::2], rnd(B, Hkv, S, 2 * E)[..., ::2],
                rnd(B, Hkv, S, 2 * Ev)[..., ::2])
    raise AssertionError(layout)


def bool_mask(shape, gen, keep_first=True):
    m = torch.rand(*shape, generator=gen) < 0.7
    if keep_first:
        m[..., 0] = True  # every row keeps a key
    return m


# (name, sizes (B, Hq, Hkv, L, S, E, Ev), keyword arguments for both functions)
CASES = [
    ("plain", (2, 3, 3, 17, 17, 16, 16), {}),
    ("causal", (2, 2, 2, 33, 33, 32, 32), dict(is_causal=True)),
    ("causal_L<S", (1, 2, 2, 5, 19, 8, 8), dict(is_causal=True)),
    ("causal_L>S", (1, 2, 2, 21, 9, 8, 8), dict(is_causal=True)),
    ("bottom_right", (1, 2, 2, 7, 30, 16, 16), dict(is_causal=True, bottom_right=True)),
    ("bottom_right_L>S_empty_rows", (1, 2, 2, 12, 5, 8, 8), dict(is_causal=True,
                                                                 bottom_right=True)),
    ("scale", (2, 2, 2, 20, 20, 16, 16), dict(scale=0.3)),
    ("Dv!=D_odd", (1, 3, 3, 19, 23, 13, 24), {}),
    ("gqa", (2, 6, 2, 24, 24, 16, 16), dict(enable_gqa=True, is_causal=True)),
    ("gqa_mqa", (1, 4, 1, 15, 31, 16, 8), dict(enable_gqa=True)),
    ("window", (1, 2, 2, 40, 40, 16, 16), dict(window=(4, 2))),
    ("window_causal", (2, 2, 2, 70, 70, 16, 16), dict(window=(8, 0), is_causal=True)),
    ("softcap", (1, 2, 2, 25, 25, 16, 16), dict(softcap=2.0, scale=1.0)),
    ("alibi_heads", (2, 4, 4, 30, 30, 16, 16), dict(alibi="heads", is_causal=True)),
    ("alibi_batch", (2, 4, 2, 18, 26, 16, 16), dict(alibi="batch", enable_gqa=True)),
    ("bool_mask_b1ls", (2, 3, 3, 17, 29, 16, 16), dict(mask=("bool", "b1ls"))),
    ("bool_mask_ls", (2, 3, 3, 33, 33, 16, 16), dict(mask=("bool", "ls"))),
    ("bool_mask_empty_rows", (1, 2, 2, 9, 12, 8, 8), dict(mask=("bool_empty", "bhls"))),
    ("float_mask_bhls", (2, 2, 2, 17, 21, 16, 16), dict(mask=("float", "bhls"))),
    ("float_mask_ls", (1, 4, 4, 64, 64, 32, 32), dict(mask=("float", "ls"))),
    ("everything", (2, 4, 2, 37, 37, 16, 16), dict(enable_gqa=True, is_causal=True,
                                                    window=(10, 0), softcap=3.0,
                                                    alibi="heads", scale=0.5)),
    ("dropout", (2, 2, 2, 23, 23, 16, 16), dict(dropout=0.3)),
    ("dropout_causal_gqa", (1, 4, 2, 40, 40, 16, 16), dict(dropout=0.2, is_causal=True,
                                                           enable_gqa=True)),
]

LAYOUTS = ["contiguous", "token_major", "fused_qkv", "last_stride_2"]


def build(case, dtype, layout, seed):
    name, (B, Hq, Hkv, L, S, E, Ev), kw = case
    gen = torch.Generator().manual_seed(seed)
    q, k, v = make_qkv(B, Hq, Hkv, L, S, E, Ev, dtype, layout, gen)
    attn_kw, oracle_kw = {}, {}
    for key in ("is_causal", "scale", "enable_gqa", "softcap"):
        if key in kw:
            attn_kw[key] = oracle_kw[key] = kw[key]
    if kw.get("bottom_right"):
        attn_kw["causal_alignment"] = "bottom_right"
        oracle_kw["bottom_right"] = True
    if "window" in kw:
        attn_kw["window_size"] = oracle_kw["window"] = kw["window"]
    if "alibi" in kw:
        shape = (Hq,) if kw["alibi"] == "heads" else (B, Hq)
        slopes = torch.rand(*shape, generator=gen) * 0.5
        attn_kw["alibi_slopes"] = oracle_kw["alibi"] = slopes
    if "mask" in kw:
        kind, form = kw["mask"]
        shape = {"b1ls": (B, 1, L, S), "ls": (L, S), "bhls": (B, Hq, L, S)}[form]
        if kind == "bool":
            m = bool_mask(shape, gen)
        elif kind == "bool_empty":
            m = bool_mask(shape, gen)
            m[..., 2, :] = False  # query 2 may attend to nothing
        else:
            m = torch.randn(*shape, generator=gen) * 2
            m[torch.rand(*shape, generator=gen) < 0.2] = -math.inf
            m[..., 0] = 0.0
            m = m.to(dtype)
        attn_kw["attn_mask"] = oracle_kw["mask"] = m
    if "dropout" in kw:
        p = kw["dropout"]
        dseed = 1234 + seed
        attn_kw["dropout_p"] = p
        attn_kw["dropout_seed"] = dseed
        oracle_kw["noise"] = attn.dropout_noise((B, Hq, L, S), p, dseed).to(F64)
    return (q, k, v), attn_kw, oracle_kw


def fused_ok(case):
    _, (B, Hq, Hkv, L, S, E, Ev), _ = case
    return L == S and Hq == Hkv and E == Ev


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_output_and_gradients_match_the_maths(case, layout, dtype, record_error):
    if layout == "fused_qkv" and not fused_ok(case):
        pytest.skip("a fused qkv buffer needs L = S, Hq = Hkv and E = Ev")
    (q, k, v), attn_kw, oracle_kw = build(case, dtype, layout, seed=len(case[0]))
    bf16 = dtype == torch.bfloat16
    if bf16 and attn._path(q, k, v, **attn_kw) in ("AMX", "AVX512-BF16"):
        bf16 = "amx"  # the core's AMX kernel (test_sdpa_amx.py), its bounds
    q.requires_grad_(True), k.requires_grad_(True), v.requires_grad_(True)
    out = attn.scaled_dot_product_attention(q, k, v, **attn_kw)
    assert out.dtype == dtype
    q64, k64, v64 = (t.detach().to(F64).requires_grad_(True) for t in (q, k, v))
    want = oracle(q64, k64, v64, **oracle_kw)
    check_close("out", out, want, bf16, record_error)

    gen = torch.Generator().manual_seed(7)
    dout = torch.randn(out.shape, generator=gen).to(dtype)
    dq, dk, dv = torch.autograd.grad(out, (q, k, v), dout)
    wq, wk, wv = torch.autograd.grad(want, (q64, k64, v64), dout.to(F64))
    check_close("dq", dq, wq, bf16, record_error, loose=True)
    check_close("dk", dk, wk, bf16, record_error, loose=True)
    check_close("dv", dv, wv, bf16, record_error)
    assert dq.dtype == dk.dtype == dv.dtype == dtype


def test_a_wrong_oracle_option_is_caught(record_error):
    # The comparison can fail: attn's causal answer is not the full-attention maths.
    (q, k, v), _, _ = build(CASES[1], torch.float32, "contiguous", seed=1)
    out = attn.scaled_dot_product_attention(q, k, v, is_causal=True)
    with pytest.raises(AssertionError):
        check_close("out", out, oracle(q.to(F64), k.to(F64), v.to(F64)), False,
                    lambda *a: None)


@pytest.mark.parametrize("shape_q,shape_kv", [
    ((7, 16), (11, 16)),               # (L, E): unbatched, one head
    ((3, 7, 16), (3, 11, 16)),         # (H, L, E)
    ((2, 3, 2, 7, 16), (2, 3, 2, 11, 16)),  # (N, M, H, L, E): two batch dims
])
def test_other_ranks_match_the_maths(shape_q, shape_kv, record_error):
    gen = torch.Generator().manual_seed(3)
    q = torch.randn(*shape_q, generator=gen, requires_grad=True)
    k = torch.randn(*shape_kv, generator=gen, requires_grad=True)
    v = torch.randn(*shape_kv, generator=gen, requires_grad=True)
    mask = torch.rand(shape_q[-2], shape_kv[-2], generator=gen) < 0.8
    mask[:, 0] = True
    out = attn.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    assert out.shape == shape_q[:-1] + (shape_kv[-1],)
    q64, k64, v64 = (t.detach().to(F64).requires_grad_(True) for t in (q, k, v))
    # The oracle takes dim -3 as heads; give 2-D inputs one.
    if len(shape_q) == 2:
        want = oracle(q64.unsqueeze(0), k64.unsqueeze(0), v64.unsqueeze(0), mask=mask)[0]
    else:
        want = oracle(q64, k64, v64, mask=mask)
    check_close("out", out, want, False, record_error)
    dout = torch.randn(out.shape, generator=gen)
    for got, wanted in zip(torch.autograd.grad(out, (q, k, v), dout),
                           torch.autograd.grad(want, (q64, k64, v64), dout.to(F64))):
        check_close("grad (other ranks)", got, wanted, False, record_error)


def test_batch_dims_mask_broadcast(record_error):
    gen = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(2, 3, 2, 9, 8, generator=gen) for _ in range(3))
    mask = torch.randn(3, 1, 9, 9, generator=gen)  # broadcasts over N and H
    got = attn.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    want = oracle(q.to(F64), k.to(F64), v.to(F64), mask=mask)
    check_close("out", got, want, False, record_error)


def test_no_grad_gives_the_same_bits():
    gen = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(2, 3, 20, 16, generator=gen, requires_grad=True) for _ in range(3))
    with_grad = attn.scaled_dot_product_attention(q, k, v, is_causal=True)
    with torch.no_grad():
        without = attn.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert not without.requires_grad
    assert torch.equal(with_grad.detach(), without)


# ---- dropout ------------------------------------------------------------------------


def test_dropout_follows_torch_manual_seed():
    gen = torch.Generator().manual_seed(6)
    q, k, v = (torch.randn(2, 2, 30, 16, generator=gen) for _ in range(3))
    torch.manual_seed(11)
    a = attn.scaled_dot_product_attention(q, k, v, dropout_p=0.5)
    torch.manual_seed(11)
    b = attn.scaled_dot_product_attention(q, k, v, dropout_p=0.5)
    torch.manual_seed(12)
    c = attn.scaled_dot_product_attention(q, k, v, dropout_p=0.5)
    assert torch.equal(a, b)
    assert not torch.equal(a, c)
    assert not torch.equal(a, attn.scaled_dot_product_attention(q, k, v))


@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
def test_dropout_noise_statistics(p):
    z = attn.dropout_noise((2, 3, 64, 64), p, 99)
    kept = z != 0
    # 24576 draws: the kept fraction is within 5 standard deviations of 1 - p.
    n = z.numel()
    sd = math.sqrt(p * (1 - p) / n)
    assert abs(kept.double().mean().item() - (1 - p)) < 5 * sd
    # Kept weights are scaled by 1 / (float)(1 - p), p as a float32 (torch's rounding).
    p32 = torch.tensor(p, dtype=torch.float32).item()
    scale = torch.tensor(1.0, dtype=torch.float32) / torch.tensor(1.0 - p32, dtype=torch.float32)
    assert torch.all(z[kept] == scale)
    assert torch.equal(attn.dropout_noise((2, 3, 64, 64), 0.0, 99), torch.ones(2, 3, 64, 64))


# ---- threads ------------------------------------------------------------------------


def test_threads_follow_torch_and_results_do_not_depend_on_them():
    gen = torch.Generator().manual_seed(8)
    q, k, v = (torch.randn(2, 4, 130, 32, generator=gen, requires_grad=True) for _ in range(3))
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        assert attn.get_num_threads() == 2
        attn.set_num_threads(1)
        assert attn.get_num_threads() == 1
        one = attn.scaled_dot_product_attention(q, k, v, is_causal=True)
        g_one = torch.autograd.grad(one.sum(), (q, k, v))
        attn.set_num_threads(3)
        three = attn.scaled_dot_product_attention(q, k, v, is_causal=True)
        g_three = torch.autograd.grad(three.sum(), (q, k, v))
        assert torch.equal(one, three)
        for a, b in zip(g_one, g_three):
            assert torch.equal(a, b)
        attn.set_num_threads(None)
        assert attn.get_num_threads() == 2
        # attn's call leaves PyTorch's own thread count alone.
        assert torch.get_num_threads() == 2
        with pytest.raises(ValueError):
            attn.set_num_threads(0)
    finally:
        attn.set_num_threads(None)
        torch.set_num_threads(before)


# ---- errors -------------------------------------------------------------------------------


def _t(*shape, dtype=torch.float32):
    return torch.randn(*shape).to(dtype)


ERRORS = [
    ("dtypes differ", lambda: attn.scaled_dot_product_attention(
        _t(1, 2, 4, 8), _t(1, 2, 4, 8, dtype=torch.bfloat16), _t(1, 2, 4, 8)),
     RuntimeError, "same dtype"),
    ("float64", lambda: attn.scaled_dot_product_attention(
        _t(1, 2, 4, 8, dtype=F64), _t(1, 2, 4, 8, dtype=F64), _t(1, 2, 4, 8, dtype=F64)),
     RuntimeError, "float32 and torch.bfloat16"),
    ("meta device", lambda: attn.scaled_dot_product_attention(
        torch.empty(1, 2, 4, 8, device="meta"), _t(1, 2, 4, 8), _t(1, 2, 4, 8)),
     RuntimeError, "device meta"),
    ("not a tensor", lambda: attn.scaled_dot_product_attention([1.0], _t(2, 8), _t(2, 8)),
     TypeError, "must be a Tensor"),
    ("1-D key", lambda: attn.scaled_dot_product_attention(
        _t(1, 2, 4, 8), _t(8), _t(2, 4, 8)), RuntimeError, "at least 2 dims"),
    ("head dims differ", lambda: attn.scaled_dot_product_attention(
        _t(1, 2, 4, 8), _t(1, 2, 4, 7), _t(1, 2, 4, 8)), RuntimeError, "same head dim"),
    ("lengths differ", lambda: attn.scaled_dot_product_attention(
        _t(1, 2, 4, 8), _t(1, 2, 5, 8), _t(1, 2, 6, 8)), RuntimeError, "sequence length"),
    ("batch not broadcastable", lambda: attn.scaled_dot_product_attention(
        _t(2, 2, 4, 8), _t(3, 2, 4, 8), _t(3, 2, 4, 8)), RuntimeError, "not broadcastable"),
    ("heads without gqa", lambda: attn.scaled_dot_product_attention(
        _t(1, 4, 4, 8), _t(1, 2, 4, 8), _t(1, 2, 4, 8)), RuntimeError, "enable_gqa=True"),
    ("gqa not a multiple", lambda: attn.scaled_dot_product_attention(
        _t(1, 3, 4, 8), _t(1, 2, 4, 8), _t(1, 2, 4, 8), enable_gqa=True),
     RuntimeError, "multiple"),
    ("mask and causal", lambda: attn.scaled_dot_product_attention(
        _t(1, 2, 4, 8), _t(1, 2, 4, 8), _t(1, 2, 4, 8), attn_mask=_t(4, 4), is_causal=True),
     RuntimeError, "is_causal"),
    ("mask shape", lambda: attn.scaled_dot_product_attention(
        _t(1, 2, 4, 8), _t(1, 2, 4, 8), _t(1, 2, 4, 8), attn_mask=_t(3, 4)),
     RuntimeError, "broadcastable"),
    ("mask dtype", lambda: attn.scaled_dot_product_attention(
        _t(1, 2, 4, 8), _t(1, 2, 4, 8), _t(1, 2, 4, 8), attn_mask=torch.zeros(4, 4, dtype=F64)),
     RuntimeError, "attn_mask dtype"),
    ("mask NaN", lambda: attn.scaled_dot_product_attention(
        _t(1, 2, 4, 8), _t(1, 2, 4, 8), _t(1, 2, 4, 8),
        attn_mask=torch.full((4, 4), math.nan)), ValueError, "finite"),
    ("dropout 1", lambda: attn.scaled_dot_product_attention(
        _t(1, 2, 4, 8), _t(1, 2, 4, 8), _t(1, 2, 4, 8), dropout_p=1.0), ValueError, "dropout_p"),
    # Checked in C++ (std::invalid_argument -> ValueError), messages from attn's sdpa.
    ("window -2", lambda: attn.scaled_dot_product_attention(
        _t(1, 2, 4, 8), _t(1, 2, 4, 8), _t(1, 2, 4, 8), window_size=(-2, 0)),
     ValueError, "window_left"),
    ("softcap < 0", lambda: attn.scaled_dot_product_attention(
        _t(1, 2, 4, 8), _t(1, 2, 4, 8), _t(1, 2, 4, 8), softcap=-1.0), ValueError, "softcap"),
    ("scale inf", lambda: attn.scaled_dot_product_attention(
        _t(1, 2, 4, 8), _t(1, 2, 4, 8), _t(1, 2, 4, 8), scale=math.inf),
     ValueError, "scale must be finite"),
    ("alibi shape", lambda: attn.scaled_dot_product_attention(
        _t(1, 2, 4, 8), _t(1, 2, 4, 8), _t(1, 2, 4, 8), alibi_slopes=torch.ones(3)),
     RuntimeError, "alibi_slopes"),
    ("alibi dtype", lambda: attn.scaled_dot_product_attention(
        _t(1, 2, 4, 8), _t(1, 2, 4, 8), _t(1, 2, 4, 8), alibi_slopes=torch.ones(2, dtype=F64)),
     RuntimeError, "float32"),
    ("alignment", lambda: attn.scaled_dot_product_attention(
        _t(1, 2, 4, 8), _t(1, 2, 4, 8), _t(1, 2, 4, 8), causal_alignment="middle"),
     ValueError, "causal_alignment"),
]


@pytest.mark.parametrize("call,exc,match", [e[1:] for e in ERRORS], ids=[e[0] for e in ERRORS])
def test_bad_input_raises(call, exc, match):
    with pytest.raises(exc, match=match):
        call()


def test_the_extension_refuses_inconsistent_refs():
    # The last line of defence: the binding checks what it is handed (ValueError).
    q = torch.zeros(1, 2, 4, 8)
    out, lse = torch.empty(1, 2, 4, 8), torch.empty(1, 2, 5)
    ref = attn._sdpa._ref
    with pytest.raises(ValueError, match="lse has sizes"):
        attn._attn.sdpa_forward(ref(q), ref(q), ref(q), ref(out), ref(lse), None, None,
                                False, False, None, 0.0, -1, -1, 0.0, 0, False, 1)


def test_empty_inputs_give_empty_or_zero_outputs():
    q = torch.zeros(1, 2, 0, 8)
    k = torch.zeros(1, 2, 5, 8)
    assert attn.scaled_dot_product_attention(q, k, k).shape == (1, 2, 0, 8)
    q = torch.randn(1, 2, 3, 8)
    k = torch.zeros(1, 2, 0, 8)
    out = attn.scaled_dot_product_attention(q, k, k)
    assert out.shape == (1, 2, 3, 8) and torch.equal(out, torch.zeros(1, 2, 3, 8))


# ---- patch_sdpa (PyTorch 2.x's own function is checked by check_torch2.py) ----------


def test_patch_sdpa_refuses_pytorch_without_sdpa():
    if hasattr(torch.nn.functional, "scaled_dot_product_attention"):
        pytest.skip("this PyTorch has scaled_dot_product_attention (check_torch2.py covers it)")
    with pytest.raises(RuntimeError, match="needs PyTorch >= 2.0"):
        attn.patch_sdpa()
    with pytest.raises(RuntimeError, match="needs PyTorch >= 2.0"):
        with attn.sdpa_patched():
            pass


def test_patched_function_routes_what_attn_covers(record_error):
    # The function patch_sdpa installs, around a stand-in for PyTorch's (the maths).
    seen = []

    def original(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, **kw):
        seen.append((q.dtype, q.device.type, kw))
        return oracle(q, k, v, mask=attn_mask, is_causal=is_causal, **kw)

    patched = attn._patch._make_patched(original)
    gen = torch.Generator().manual_seed(9)
    q, k, v = (torch.randn(2, 2, 12, 8, generator=gen) for _ in range(3))
    before = attn.sdpa_stats()
    out = patched(q, k, v, is_causal=True)
    check_close("out", out, oracle(q.to(F64), k.to(F64), v.to(F64), is_causal=True), False,
                record_error)
    assert attn.sdpa_stats()["attn"] == before["attn"] + 1 and not seen
    # batch broadcasting: attn's too
    out = patched(q, k[:1], v[:1])
    check_close("out", out, oracle(q.to(F64), k[:1].to(F64), v[:1].to(F64)), False,
                record_error)
    assert attn.sdpa_stats()["attn"] == before["attn"] + 2 and not seen
    # float64, batch dims that do not broadcast, mask with is_causal: PyTorch's function.
    patched(q.double(), k.double(), v.double())
    with pytest.raises(RuntimeError):  # the stand-in's matmul refuses it, as PyTorch would
        patched(q, torch.cat([k, k[:1]]), torch.cat([v, v[:1]]))
    patched(q, k, v, attn_mask=torch.ones(12, 12, dtype=torch.bool), is_causal=True)
    assert [s[0] for s in seen] == [F64, torch.float32, torch.float32]
    assert attn.sdpa_stats()["torch"] == before["torch"] + 3
    # scale and enable_gqa reach the fallback only when given (PyTorch 2.0 has neither).
    patched(q.double(), k.double(), v.double(), scale=0.5)
    assert seen[-1][2] == {"scale": 0.5}
