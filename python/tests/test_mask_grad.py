"""The gradient of a float attn_mask that requires grad, as PyTorch's SDPA
gives it: dS (the softmax backward's output before the scale) summed over the
dims the mask was broadcast along, against the definition in float64 with
autograd; with every option the kernel combines with a mask (GQA, window,
ALiBi, softcap, dropout, L != S with either alignment), broadcast batch dims,
bf16, -inf entries and rows with no key (gradient 0, never NaN)."""

import math

import pytest
import torch

import attn

from test_sdpa import F64, check_close, oracle

# (name, (B, Hq, Hkv, L, S, E), mask shape, keyword arguments)
CASES = [
    ("bhls", (2, 3, 3, 9, 13, 8), (2, 3, 9, 13), {}),
    ("ls", (2, 3, 3, 9, 13, 8), (9, 13), {}),
    ("b1ls", (2, 3, 3, 9, 13, 8), (2, 1, 9, 13), {}),
    ("1h1s", (2, 3, 3, 9, 13, 8), (1, 3, 1, 13), {}),
    ("s", (2, 3, 3, 9, 13, 8), (13,), {}),
    ("gqa", (2, 4, 2, 10, 10, 8), (2, 4, 10, 10), dict(enable_gqa=True)),
    ("window", (1, 2, 2, 20, 20, 8), (20, 20), dict(window=(5, 1))),
    ("alibi_softcap", (2, 2, 2, 12, 12, 8), (2, 2, 12, 12), dict(alibi="heads", softcap=2.0)),
    ("bottom_right_window", (1, 2, 2, 6, 15, 8), (6, 15), dict(window=(3, 0),
                                                               bottom_right=True)),
    ("dropout", (2, 2, 2, 11, 11, 8), (2, 2, 11, 11), dict(dropout=0.25)),
    ("scale", (1, 2, 2, 9, 9, 8), (9, 9), dict(scale=0.7)),
]


def run_case(case, dtype, record_error, empty_row=False):
    name, (B, Hq, Hkv, L, S, E), mshape, kw = case
    gen = torch.Generator().manual_seed(len(name) * 7)
    q = torch.randn(B, Hq, L, E, generator=gen).to(dtype).requires_grad_()
    k = torch.randn(B, Hkv, S, E, generator=gen).to(dtype).requires_grad_()
    v = torch.randn(B, Hkv, S, E, generator=gen).to(dtype).requires_grad_()
    m = torch.randn(*mshape, generator=gen)
    m[torch.rand(*mshape, generator=gen) < 0.15] = -math.inf
    if empty_row:
        m[..., 1, :] = -math.inf  # query 1 may attend to no key
    mask = m.to(dtype).requires_grad_()
    attn_kw, oracle_kw = {}, {}
    for key in ("scale", "enable_gqa", "softcap"):
        if key in kw:
            attn_kw[key] = oracle_kw[key] = kw[key]
    if "window" in kw:
        attn_kw["window_size"] = oracle_kw["window"] = kw["window"]
    if kw.get("bottom_right"):
        attn_kw["causal_alignment"] = "bottom_right"
        oracle_kw["bottom_right"] = True
    if kw.get("alibi"):
        attn_kw["alibi_slopes"] = oracle_kw["alibi"] = torch.rand(Hq, generator=gen) * 0.5
    if "dropout" in kw:
        attn_kw.update(dropout_p=kw["dropout"], dropout_seed=77)
        oracle_kw["noise"] = attn.dropout_noise((B, Hq, L, S), kw["dropout"], 77).to(F64)
    out = attn.scaled_dot_product_attention(q, k, v, attn_mask=mask, **attn_kw)
    dout = torch.randn(out.shape, generator=gen).to(dtype)
    got = torch.autograd.grad(out, (q, k, v, mask), dout)
    q64, k64, v64, m64 = (t.detach().to(F64).requires_grad_() for t in (q, k, v, mask))
    want = oracle(q64, k64, v64, mask=m64, **oracle_kw)
    wanted = torch.autograd.grad(want, (q64, k64, v64, m64), dout.to(F64))
    bf16 = dtype == torch.bfloat16
    if bf16 and attn._path(q, k, v, attn_mask=mask, **attn_kw) in ("AMX", "AVX512-BF16"):
        bf16 = "amx"  # the core's AMX kernel (test_sdpa_amx.py), its bounds
    check_close("out (mask grad case)", out, want, bf16, record_error)
    for n, g, w in zip(("dq", "dk", "dv", "dmask"), got, wanted):
        assert g.dtype == dtype
        check_close(f"{n} (mask grad case)", g, w, bf16, record_error, loose=n != "dv")
    return got[3]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_mask_gradient_matches_the_maths(case, dtype, record_error):
    dmask = run_case(case, dtype, record_error)
    assert dmask.shape == case[2]


def test_a_row_with_no_key_gives_zero_mask_gradient(record_error):
    dmask = run_case(CASES[0], torch.float32, record_error, empty_row=True)
    assert torch.isfinite(dmask).all() and (dmask[..., 1, :] == 0).all()


def test_mask_gradient_with_broadcast_batch_dims(record_error):
    gen = torch.Generator().manual_seed(5)
    q = torch.randn(3, 2, 2, 7, 8, generator=gen, requires_grad=True)
    k = torch.randn(1, 2, 2, 9, 8, generator=gen, requires_grad=True)
    v = torch.randn(3, 1, 2, 9, 8, generator=gen, requires_grad=True)
    mask = torch.randn(3, 1, 1, 7, 9, generator=gen, requires_grad=True)
    out = attn.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    dout = torch.randn(out.shape, generator=gen)
    got = torch.autograd.grad(out, (q, k, v, mask), dout)
    q64, k64, v64, m64 = (t.detach().to(F64).requires_grad_() for t in (q, k, v, mask))
    want = oracle(q64, k64, v64, mask=m64)
    for n, g, w in zip(("dq", "dk", "dv", "dmask"),
                       got, torch.autograd.grad(want, (q64, k64, v64, m64), dout.to(F64))):
        check_close(f"{n} (mask grad, broadcast)", g, w, False, record_error)


def test_mask_gradient_alone_and_a_bool_mask_has_none():
    gen = torch.Generator().manual_seed(6)
    q, k, v = (torch.randn(1, 2, 5, 8, generator=gen) for _ in range(3))
    mask = torch.zeros(5, 5, requires_grad=True)
    out = attn.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    assert out.requires_grad
    (dmask,) = torch.autograd.grad(out.sum(), (mask,))
    # sum(out) does not depend on the mask: rowsum of dS is 0 per row
    assert torch.allclose(dmask.sum(-1), torch.zeros(5), atol=1e-5)
    bool_out = attn.scaled_dot_product_attention(q, k, v, attn_mask=torch.ones(5, 5).bool())
    assert not bool_out.requires_grad
