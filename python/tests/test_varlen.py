"""attn.sdpa_varlen (flash_attn_varlen_func's semantics) against PyTorch's maths,
sequence by sequence: each packed sequence is attention on its own."""

import pytest
import torch

import attn
from test_sdpa import F64, check_close, oracle

# (name, (Hq, Hkv, D, Dv), query lengths, key lengths, keyword arguments)
CASES = [
    ("plain", (2, 2, 16, 16), [5, 17, 1], [5, 17, 1], {}),
    ("causal_bottom_right", (2, 2, 16, 16), [7, 20, 3], [12, 20, 30], dict(causal=True)),
    ("causal_top_left", (2, 2, 16, 16), [7, 20], [12, 20], dict(causal=True,
                                                                causal_alignment="top_left")),
    ("empty_sequences", (2, 1, 8, 8), [0, 9, 4, 0], [3, 9, 0, 0], dict(causal=True)),
    ("gqa_Dv", (6, 2, 13, 24), [33, 8], [40, 8], {}),
    ("window", (2, 2, 16, 16), [64, 70], [64, 70], dict(causal=True, window_size=(6, 0))),
    ("softcap_scale", (2, 2, 16, 16), [19, 25], [19, 30], dict(softcap=2.0, softmax_scale=1.0)),
    ("alibi_heads", (4, 4, 16, 16), [15, 31], [15, 31], dict(causal=True, alibi="heads")),
    ("alibi_seqs", (4, 2, 16, 16), [15, 31, 2], [20, 31, 9], dict(alibi="seqs")),
    ("dropout", (2, 2, 16, 16), [15, 24], [15, 30], dict(dropout_p=0.25, causal=True)),
]


def bf16_bounds():
    """The bounds a bf16 varlen call is held to (check_close's bf16 argument): the native
    ones, "amx", where the sdpa kernel runs bf16 on VDPBF16PS (P and dS rounded to bf16 where
    they enter a product; a window call, which only that kernel takes, names its path),
    else bf16's rounding of the widened kernel's values."""
    x = torch.zeros(1, 1, 4, 8, dtype=torch.bfloat16)
    return "amx" if attn._path(x, x, x, is_causal=True, window_size=(1, 0)) == "AVX512-BF16" \
        else True


def pack(lengths):
    c = [0]
    for n in lengths:
        c.append(c[-1] + n)
    return c


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_varlen_matches_the_maths_per_sequence(case, dtype, record_error):
    name, (Hq, Hkv, D, Dv), lq, lk, kw = case
    kw = dict(kw)
    gen = torch.Generator().manual_seed(len(name))
    cu_q, cu_k = pack(lq), pack(lk)
    # Token-major views of wider buffers: read in place through their strides.
    q = torch.randn(cu_q[-1], Hq + 1, D, generator=gen).to(dtype)[:, 1:]
    k = torch.randn(cu_k[-1], Hkv, D, generator=gen).to(dtype)
    v = torch.randn(cu_k[-1], Hkv, Dv, generator=gen).to(dtype)
    q.requires_grad_(True), k.requires_grad_(True), v.requires_grad_(True)
    alibi = kw.pop("alibi", None)
    slopes = None
    if alibi is not None:
        slopes = torch.rand(*((Hq,) if alibi == "heads" else (len(lq), Hq)), generator=gen)
        kw["alibi_slopes"] = slopes
    noise = None
    if kw.get("dropout_p"):
        kw["dropout_seed"] = 77
        noise = attn.dropout_noise((len(lq), Hq, max(lq), max(lk)), kw["dropout_p"], 77).to(F64)
    out = attn.sdpa_varlen(q, k, v, torch.tensor(cu_q, dtype=torch.int32), cu_k, max(lq),
                           max(lk), **kw)
    assert out.shape == (cu_q[-1], Hq, Dv) and out.dtype == dtype
    dout = torch.randn(out.shape, generator=gen).to(dtype)
    dq, dk, dv = torch.autograd.grad(out, (q, k, v), dout)

    q64, k64, v64 = (t.detach().to(F64).requires_grad_(True) for t in (q, k, v))
    outs = []
    for b in range(len(lq)):
        qs = q64[cu_q[b]:cu_q[b + 1]].transpose(0, 1)  # (Hq, Lb, D)
        ks = k64[cu_k[b]:cu_k[b + 1]].transpose(0, 1)
        vs = v64[cu_k[b]:cu_k[b + 1]].transpose(0, 1)
        o = oracle(qs, ks, vs, is_causal=kw.get("causal", False), enable_gqa=True,
                   scale=kw.get("softmax_scale"), window=kw.get("window_size", (-1, -1)),
                   softcap=kw.get("softcap", 0.0),
                   alibi=None if slopes is None else (slopes if slopes.dim() == 1 else slopes[b]),
                   noise=None if noise is None else noise[b, :, :lq[b], :lk[b]],
                   bottom_right=kw.get("causal_alignment", "bottom_right") == "bottom_right")
        outs.append(o.transpose(0, 1))
    want = torch.cat(outs)
    bf16 = bf16_bounds() if dtype == torch.bfloat16 else False
    check_close("varlen out", out, want, bf16, record_error)
    wq, wk, wv = torch.autograd.grad(want, (q64, k64, v64), dout.to(F64))
    check_close("varlen dq", dq, wq, bf16, record_error, loose=True)
    check_close("varlen dk", dk, wk, bf16, record_error, loose=True)
    check_close("varlen dv", dv, wv, bf16, record_error)


def test_varlen_equals_the_batched_call_bit_for_bit():
    gen = torch.Generator().manual_seed(21)
    lengths = [9, 33, 17]
    cu = pack(lengths)
    q, k, v = (torch.randn(cu[-1], 4, 16, generator=gen) for _ in range(3))
    out = attn.sdpa_varlen(q, k, v, cu, cu, 33, 33, causal=True)
    for b, n in enumerate(lengths):
        s = slice(cu[b], cu[b + 1])
        alone = attn.scaled_dot_product_attention(
            q[s].transpose(0, 1), k[s].transpose(0, 1), v[s].transpose(0, 1), is_causal=True)
        assert torch.equal(out[s], alone.transpose(0, 1))


@pytest.mark.parametrize("cu_q,cu_k,max_q,max_k,match", [
    ([0, 4, 8], [0, 4, 9], 4, 5, "ends at 9"),
    ([1, 4, 8], [0, 4, 8], 4, 4, r"cu_seqlens_q\[0\] must be 0"),
    ([0, 5, 4, 8], [0, 4, 4, 8], 5, 4, "must not decrease"),
    ([0, 4, 8], [0, 4, 8], 3, 4, "max_seqlen"),
    ([0, 4, 8], [0, 8], 4, 8, "sequences"),
])
def test_varlen_bad_offsets_raise(cu_q, cu_k, max_q, max_k, match):
    q = torch.randn(8, 2, 8)
    with pytest.raises(ValueError, match=match):
        attn.sdpa_varlen(q, q, q, cu_q, cu_k, max_q, max_k)


def test_varlen_bad_shapes_raise():
    q = torch.randn(8, 3, 8)
    k = torch.randn(8, 2, 8)
    with pytest.raises(RuntimeError, match="multiple"):
        attn.sdpa_varlen(q, k, k, [0, 8], [0, 8], 8, 8)
    with pytest.raises(RuntimeError, match="3-D"):
        attn.sdpa_varlen(q[None], k[None], k[None], [0, 8], [0, 8], 8, 8)
    with pytest.raises(RuntimeError, match="int32 or int64"):
        attn.sdpa_varlen(k, k, k, torch.tensor([0.0, 8.0]), [0, 8], 8, 8)
