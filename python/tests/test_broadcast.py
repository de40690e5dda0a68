"""Batch-dim broadcasting as PyTorch's SDPA does it: query (N..., Hq, L, E),
key/value (N..., Hkv, S, E) with broadcastable batch dims (fewer dims count
as 1s on the left), heads broadcast from 1, attn_mask broadcast with them.
Output and the gradients of query, key and value (summed over the dims each
was broadcast along) against the definition in float64 with autograd (its
matmuls broadcast the same way); broadcast inputs reach the kernel as
stride-0 views, not copies."""

import pytest
import torch

import attn
from attn._sdpa import _Broadcast

from test_sdpa import F64, check_close, oracle

# (name, query shape, key shape, value shape, keyword arguments)
SHAPES = [
    ("key/value batch 1", (2, 3, 9, 8), (1, 3, 11, 8), (1, 3, 11, 8), {}),
    ("query batch 1", (1, 3, 9, 8), (2, 3, 11, 8), (2, 3, 11, 8), {}),
    ("key 3-D, query 4-D", (2, 3, 9, 8), (3, 11, 8), (3, 11, 8), {}),
    ("query 3-D, key 4-D", (3, 9, 8), (2, 3, 11, 8), (2, 3, 11, 8), {}),
    ("key/value 2-D", (2, 3, 9, 8), (11, 8), (11, 8), {}),
    ("one key/value head", (2, 4, 9, 8), (2, 1, 11, 8), (2, 1, 11, 6), {}),
    ("one query head", (2, 1, 9, 8), (2, 3, 11, 8), (2, 3, 11, 8), {}),
    ("key 1 head, value 3", (2, 3, 9, 8), (2, 1, 11, 8), (2, 3, 11, 8), {}),
    ("5-D both ways", (2, 4, 3, 9, 8), (2, 1, 3, 11, 8), (1, 4, 3, 11, 8), {}),
    ("5-D gqa", (3, 2, 4, 9, 8), (1, 2, 2, 11, 8), (3, 1, 2, 11, 8), dict(enable_gqa=True)),
    ("causal", (2, 2, 12, 8), (1, 2, 12, 8), (1, 2, 12, 8), dict(is_causal=True)),
]


def _inputs(shapes, dtype, gen):
    return [torch.randn(*s, generator=gen).to(dtype).requires_grad_() for s in shapes]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("case", SHAPES, ids=[c[0] for c in SHAPES])
def test_broadcast_batch_dims_match_the_maths(case, dtype, record_error):
    name, sq, sk, sv, kw = case
    gen = torch.Generator().manual_seed(len(name))
    q, k, v = _inputs((sq, sk, sv), dtype, gen)
    out = attn.scaled_dot_product_attention(q, k, v, **kw)
    q64, k64, v64 = (t.detach().to(F64).requires_grad_() for t in (q, k, v))
    def lift(t):  # the oracle reads dim -3 as heads
        return t.unsqueeze(0) if t.dim() == 2 else t
    want = oracle(lift(q64), lift(k64), lift(v64), **kw)
    if max(q.dim(), k.dim(), v.dim()) == 2:
        want = want[0]
    bf16 = dtype == torch.bfloat16
    if bf16 and attn._path(q, k, v, **kw) in ("AMX", "AVX512-BF16"):
        bf16 = "amx"  # test_sdpa_amx.py's bounds
    assert out.shape == want.shape and out.dtype == dtype
    check_close("out (broadcast)", out, want, bf16, record_error)
    dout = torch.randn(out.shape, generator=gen).to(dtype)
    got = torch.autograd.grad(out, (q, k, v), dout)
    wanted = torch.autograd.grad(want, (q64, k64, v64), dout.to(F64))
    for n, g, w, t in zip("qkv", got, wanted, (q, k, v)):
        assert g.shape == t.shape, n
        # loose for every gradient in bf16: autograd sums the kernel's bf16 gradients
        # over the broadcast dims in bf16, each term already rounded
        check_close(f"d{n} (broadcast)", g, w, bf16, record_error, loose=True)


def test_broadcast_inputs_are_stride_0_views_not_copies():
    q = torch.randn(4, 3, 9, 8)
    k = torch.randn(1, 3, 11, 8)
    b = _Broadcast(q, k, k, False)
    assert b.k.shape == (4, 3, 11, 8) and b.k.stride(0) == 0
    assert b.k.data_ptr() == k.data_ptr() and b.q.data_ptr() == q.data_ptr()
    # fewer dims: the same storage, batch stride 0
    b = _Broadcast(q, k[0], k[0], False)
    assert b.k.stride(0) == 0 and b.k.data_ptr() == k.data_ptr()
    # one key/value head: shared as a group by the kernel, not expanded
    b = _Broadcast(q, k[:, :1], k[:, :1], False)
    assert b.kernel_gqa and b.k.shape[1] == 1
    # one query head: expanded over the heads with stride 0
    b = _Broadcast(q[:, :1], k, k, False)
    assert b.q.shape == (4, 3, 9, 8) and b.q.stride(1) == 0 and b.H == 3
    # two batch dims that fold into one: still a view
    q5, k5 = torch.randn(2, 4, 3, 9, 8), torch.randn(1, 1, 3, 11, 8)
    b = _Broadcast(q5, k5, k5, False)
    assert b.k.shape == (8, 3, 11, 8) and b.k.stride(0) == 0 and b.k.data_ptr() == k5.data_ptr()


@pytest.mark.parametrize("mask_shape", [(9, 11), (2, 1, 1, 11), (1, 3, 9, 11), (4, 1, 3, 9, 11),
                                        (1, 1, 3, 1, 11)])
@pytest.mark.parametrize("kind", ["bool", "float"])
def test_mask_broadcasts_with_the_batch_dims(mask_shape, kind, record_error):
    gen = torch.Generator().manual_seed(17)
    q = torch.randn(4, 2, 3, 9, 8, generator=gen)
    k = torch.randn(1, 2, 3, 11, 8, generator=gen)
    v = torch.randn(4, 1, 3, 11, 8, generator=gen)
    if kind == "bool":
        mask = torch.rand(*mask_shape, generator=gen) < 0.7
        mask[..., 0] = True
    else:
        mask = torch.randn(*mask_shape, generator=gen)
    got = attn.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    want = oracle(q.to(F64), k.to(F64), v.to(F64), mask=mask)
    check_close("out (mask broadcast)", got, want, False, record_error)


@pytest.mark.parametrize("sq,sk", [((2, 3, 9, 8), (3, 3, 11, 8)),   # batch 2 vs 3
                                   ((2, 4, 9, 8), (2, 3, 11, 8)),   # heads 4 vs 3
                                   ((2, 3, 9, 8), (2, 2, 11, 8))])  # 3 vs 2 (not gqa)
def test_what_does_not_broadcast_is_refused(sq, sk):
    with pytest.raises(RuntimeError, match="broadcastable|enable_gqa"):
        attn.scaled_dot_product_attention(torch.randn(*sq), torch.randn(*sk), torch.randn(*sk))
    with pytest.raises(RuntimeError, match="key and value must have the same number of heads"):
        attn.scaled_dot_product_attention(torch.randn(2, 3, 9, 8), torch.randn(2, 2, 11, 8),
                                          torch.randn(2, 3, 11, 8))


def test_bool_masks_reach_the_kernel_in_place():
    """A bool attn_mask crosses as its own bytes (a view of its storage, the
    broadcast dims stride 0), never widened to a float plane; a transposed
    one keeps its strides."""
    from attn._sdpa import _prepare
    q, k = torch.randn(2, 3, 9, 8), torch.randn(2, 3, 11, 8)
    for mask in (torch.rand(9, 11) < 0.5, torch.rand(2, 1, 1, 11) < 0.5,
                 (torch.rand(11, 9) < 0.5).t()):
        call = _prepare(q, k, k, mask, 0.0, False, None, False, None, None, 0.0, "top_left",
                        None)
        assert call.mask.dtype == torch.bool and call.mask.dim() == 4
        assert call.mask.data_ptr() == mask.data_ptr()
        assert call.mask.stride()[-2:] == mask.stride()[-2:]
        got = attn.scaled_dot_product_attention(q, k, k, attn_mask=mask)
        want = attn.scaled_dot_product_attention(
            q, k, k, attn_mask=torch.zeros(mask.shape).masked_fill(~mask, float("-inf")))
        assert torch.equal(got, want)
