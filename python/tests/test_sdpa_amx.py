"""bf16 from Python takes attn::scaled_dot_product_attention's routes: the AMX
kernel where that is the bf16 path and it takes the call (no window, ALiBi or
softcap, E = Ev; masks of any kind, grouped-query heads, L != S), else the sdpa
kernel: on VDPBF16PS where the path is AVX512-BF16 (every option), else on
widened tiles.
attn._path names the route; forcing the core's path to the widened one
(attn._attn.use_bf16_path) changes the bits, so the route is seen to run.
Outputs and gradients against the definition in float64 within the core's
bf16 bounds (it rounds P and dS to bf16 where they enter a product, as
PyTorch's bf16 SDPA does): max|got - want| <= 8e-3 · max|want| for the output,
4e-2 · max|want| for the gradients (tests/unit/test_sdpa_amx.cpp's). The
tests run on each of the two paths the CPU has; skipped where it has neither."""

import pytest
import torch

import attn
from attn import _attn

from test_sdpa import check_close, oracle

BF16 = torch.bfloat16
F64 = torch.float64
WIDENED = "bf16 tiles widened to fp32"

# The core's paths that take sdpa's calls, each skipped where the CPU lacks it.
each_core_path = pytest.mark.parametrize("core", [
    pytest.param(name, marks=pytest.mark.skipif(name not in _attn.bf16_paths(),
                                                reason=f"this CPU (or the OS) has no {name}"))
    for name in ("AMX", "AVX512-BF16")])


@pytest.fixture
def forced_path():
    """forced_path(name): the core's bf16 path forced for the test; the automatic choice after."""
    def force(name):
        assert _attn.use_bf16_path(name), name
    yield force
    _attn.use_bf16_path(None)


def layout_qkv(layout, B, H, T, E, gen):
    def rnd(*shape):
        return torch.randn(*shape, generator=gen).to(BF16)
    if layout == "contiguous":
        return rnd(B, H, T, E), rnd(B, H, T, E), rnd(B, H, T, E)
    if layout == "token_major":
        return tuple(rnd(B, T, H, E).transpose(1, 2) for _ in range(3))
    if layout == "fused_qkv":  # nanoGPT's c_attn(x).split(C, dim=2)
        qkv = rnd(B, T, 3 * H * E)
        return tuple(t.view(B, T, H, E).transpose(1, 2) for t in qkv.split(H * E, dim=2))
    if layout == "last_stride_2":
        return tuple(rnd(B, H, T, 2 * E)[..., ::2] for _ in range(3))
    raise AssertionError(layout)


def rel_err(got, want):
    """max|got - want| / max|want|, or max|got - want| where want is all 0 (T = 1: one key,
    dq = dk = 0 exactly, while D = rowsum(dO ⊙ out) reads the bf16 out; as the C++ tests)."""
    want = want.to(F64)
    err = (got.to(F64) - want).abs().max().item()
    big = want.abs().max().item()
    return err / big if big > 0 else err


def run(q, k, v, dout, **kw):
    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    out = attn.scaled_dot_product_attention(q, k, v, **kw)
    dq, dk, dv = torch.autograd.grad(out, (q, k, v), dout)
    return out, dq, dk, dv


def check_against_oracle(q, k, v, dout, record_error, **kw):
    out, dq, dk, dv = run(q, k, v, dout, **kw)
    q64, k64, v64 = (t.detach().to(F64).requires_grad_() for t in (q, k, v))
    want = oracle(q64, k64, v64, mask=kw.get("attn_mask"), is_causal=kw.get("is_causal", False),
                  scale=kw.get("scale"), enable_gqa=kw.get("enable_gqa", False))
    wq, wk, wv = torch.autograd.grad(want, (q64, k64, v64), dout.to(F64))
    for name, got, w, bound in (("out", out, want, 8e-3), ("dq", dq, wq, 4e-2),
                                ("dk", dk, wk, 4e-2), ("dv", dv, wv, 4e-2)):
        assert got.dtype == BF16 and got.shape == w.shape, name
        e = rel_err(got, w)
        record_error(f"bf16 AMX {name} (rel)", e, e / bound)
        assert e <= bound, f"{name}: relative error {e:.3e} > {bound}"
    return out, dq, dk, dv


@each_core_path
@pytest.mark.parametrize("layout", ["contiguous", "token_major", "fused_qkv", "last_stride_2"])
@pytest.mark.parametrize("is_causal", [True, False], ids=["causal", "full"])
@pytest.mark.parametrize("T,E", [(1, 64), (17, 64), (64, 32), (100, 80)])
def test_plain_bf16_calls_take_the_core_and_match_the_definition(core, layout, is_causal, T, E,
                                                                 record_error, forced_path):
    forced_path(core)
    gen = torch.Generator().manual_seed(1000 + T + E)
    q, k, v = layout_qkv(layout, 2, 3, T, E, gen)
    dout = torch.randn(2, 3, T, E, generator=gen).to(BF16)
    assert attn._path(q, k, v, is_causal=is_causal) == core
    check_against_oracle(q, k, v, dout, record_error, is_causal=is_causal)


@each_core_path
@pytest.mark.parametrize("kind", ["float", "bool", "padding", "padding_causal"])
@pytest.mark.parametrize("T", [40, 130])
def test_masked_bf16_calls_take_the_core_and_match_the_definition(core, kind, T, record_error,
                                                                  forced_path):
    forced_path(core)
    gen = torch.Generator().manual_seed(3000 + T)
    B, H, E = 2, 3, 64
    q, k, v = layout_qkv("token_major", B, H, T, E, gen)
    dout = torch.randn(B, H, T, E, generator=gen).to(BF16)
    kw = {}
    if kind == "float":  # a finite bias per head, and a third of the keys at -inf
        bias = torch.randn(1, H, T, T, generator=gen)
        closed = (torch.rand(T, T, generator=gen) < 0.33) & ~torch.eye(T, dtype=torch.bool)
        kw["attn_mask"] = bias.masked_fill(closed, float("-inf"))
    elif kind == "bool":
        kw["attn_mask"] = (torch.rand(T, T, generator=gen) > 0.33) | torch.eye(T, dtype=torch.bool)
    else:  # right padding as transformers builds it: the float32 minimum on batch b's last keys
        pad = torch.zeros(B, 1, 1, T)
        pad[0, ..., T - 9:] = torch.finfo(torch.float32).min
        pad[1, ..., T - 29:] = torch.finfo(torch.float32).min
        if kind == "padding_causal":  # with the causal pattern (PyTorch's API: no is_causal)
            upper = torch.ones(T, T, dtype=torch.bool).triu(1)
            pad = pad.expand(B, 1, T, T).masked_fill(upper, torch.finfo(torch.float32).min)
        kw["attn_mask"] = pad
    assert attn._path(q, k, v, **kw) == core
    check_against_oracle(q, k, v, dout, record_error, **kw)


@each_core_path
@pytest.mark.parametrize("Hkv", [1, 2])
@pytest.mark.parametrize("is_causal", [True, False], ids=["causal", "full"])
def test_grouped_query_heads_take_the_core_and_match_the_definition(core, Hkv, is_causal,
                                                                    record_error, forced_path):
    forced_path(core)
    gen = torch.Generator().manual_seed(4000 + Hkv)
    B, H, T, E = 2, 4, 70, 64
    q = torch.randn(B, H, T, E, generator=gen).to(BF16)
    k = torch.randn(B, T, Hkv, E, generator=gen).to(BF16).transpose(1, 2)
    v = torch.randn(B, T, Hkv, E, generator=gen).to(BF16).transpose(1, 2)
    dout = torch.randn(B, H, T, E, generator=gen).to(BF16)
    assert attn._path(q, k, v, is_causal=is_causal, enable_gqa=True) == core
    out, dq, dk, dv = check_against_oracle(q, k, v, dout, record_error, is_causal=is_causal,
                                           enable_gqa=True)
    assert dk.shape == k.shape and dv.shape == v.shape


@each_core_path
@pytest.mark.parametrize("L,S", [(20, 90), (90, 20)])
@pytest.mark.parametrize("is_causal", [True, False], ids=["causal", "full"])
def test_queries_and_keys_of_different_lengths_take_the_core(core, L, S, is_causal, record_error,
                                                             forced_path):
    """L != S (PyTorch's causal pattern is top-left: key j <= query i)."""
    forced_path(core)
    gen = torch.Generator().manual_seed(5000 + L)
    B, H, E = 2, 3, 64
    q = torch.randn(B, H, L, E, generator=gen).to(BF16)
    k = torch.randn(B, H, S, E, generator=gen).to(BF16)
    v = torch.randn(B, H, S, E, generator=gen).to(BF16)
    dout = torch.randn(B, H, L, E, generator=gen).to(BF16)
    assert attn._path(q, k, v, is_causal=is_causal) == core
    out, dq, dk, dv = check_against_oracle(q, k, v, dout, record_error, is_causal=is_causal)
    assert out.shape == (B, H, L, E) and dk.shape == k.shape


@each_core_path
def test_scale_and_dropout_stay_on_the_core(core, record_error, forced_path):
    forced_path(core)
    gen = torch.Generator().manual_seed(7)
    q, k, v = layout_qkv("token_major", 2, 2, 40, 64, gen)
    dout = torch.randn(2, 2, 40, 64, generator=gen).to(BF16)
    assert attn._path(q, k, v, scale=0.05) == core
    check_against_oracle(q, k, v, dout, record_error, scale=0.05)
    # Dropout: the core draws sdpa's Philox noise, so the definition with attn's noise agrees.
    assert attn._path(q, k, v, dropout_p=0.2, is_causal=True) == core
    out, *_ = run(q, k, v, dout, dropout_p=0.2, is_causal=True, dropout_seed=99)
    noise = attn.dropout_noise((2, 2, 40, 40), 0.2, 99).to(F64)
    want = oracle(q.to(F64), k.to(F64), v.to(F64), is_causal=True, noise=noise)
    assert rel_err(out, want) <= 8e-3


@each_core_path
def test_the_route_runs_forcing_the_widened_path_changes_the_bits(core, forced_path):
    gen = torch.Generator().manual_seed(3)
    q, k, v = layout_qkv("fused_qkv", 1, 2, 130, 64, gen)
    dout = torch.randn(1, 2, 130, 64, generator=gen).to(BF16)
    automatic = attn._path(q, k, v, is_causal=True)
    auto = run(q, k, v, dout, is_causal=True)
    forced_path(core)
    on_core = run(q, k, v, dout, is_causal=True)
    forced_path("widened to fp32")
    assert attn._path(q, k, v, is_causal=True) == WIDENED
    wide = run(q, k, v, dout, is_causal=True)
    for a, b, c in zip(auto, on_core, wide):
        if automatic == core:
            assert torch.equal(a, b)   # the automatic choice, forward and backward
        assert not torch.equal(b, c)   # and the core is not the widened kernel's bits


@each_core_path
@pytest.mark.parametrize("what", ["window", "alibi", "softcap", "E != Ev", "fp32"])
def test_calls_beyond_the_amx_kernel_take_the_sdpa_kernel(core, what, forced_path,
                                                           record_error):
    """Window, ALiBi, softcap and E != Ev: the sdpa kernel, on VDPBF16PS where the path is
    AVX512-BF16 (within the native bf16 bounds of the maths), else on the widened tiles
    (their bits)."""
    forced_path(core)
    gen = torch.Generator().manual_seed(11)
    B, H, L, S, E, Ev, Hkv = 1, 2, 24, 24, 32, 32, 2
    kw = {}
    if what == "window":
        kw.update(is_causal=True, window_size=(8, 0))
    elif what == "alibi":
        kw["alibi_slopes"] = torch.tensor([0.5, 0.25])
    elif what == "softcap":
        kw["softcap"] = 5.0
    elif what == "E != Ev":
        Ev = 16
    dtype = torch.float32 if what == "fp32" else BF16
    q = torch.randn(B, H, L, E, generator=gen).to(dtype)
    k = torch.randn(B, Hkv, S, E, generator=gen).to(dtype)
    v = torch.randn(B, Hkv, S, Ev, generator=gen).to(dtype)
    dout = torch.randn(B, H, L, Ev, generator=gen).to(dtype)
    path = attn._path(q, k, v, **kw)
    if what == "fp32":
        assert path == "fp32 kernel"
    elif core == "AVX512-BF16":
        assert path == "AVX512-BF16"
    else:
        assert path in ("AVX512-BF16", WIDENED)
    routed = run(q, k, v, dout, **kw)
    if path == "AVX512-BF16":
        q64, k64, v64 = (t.to(F64).requires_grad_(True) for t in (q, k, v))
        want = oracle(q64, k64, v64, is_causal=kw.get("is_causal", False),
                      window=kw.get("window_size", (-1, -1)), softcap=kw.get("softcap", 0.0),
                      alibi=kw.get("alibi_slopes"))
        grads = torch.autograd.grad(want, (q64, k64, v64), dout.to(F64))
        for name, got, expected in zip(("out", "dq", "dk", "dv"), routed, (want, *grads)):
            check_close(name, got, expected, "amx", record_error)
    forced_path("widened to fp32")
    wide = run(q, k, v, dout, **kw)
    for a, b in zip(routed, wide):
        assert torch.equal(a, b) == (path != "AVX512-BF16")


def test_path_names_every_route_and_checks_its_arguments():
    q = torch.randn(1, 2, 8, 16)
    assert attn._path(q, q, q) == "fp32 kernel"
    assert attn._path(q.to(BF16), q.to(BF16), q.to(BF16)) in ("AMX", "AVX512-BF16", WIDENED)
    assert attn._path(q[..., :0], q[..., :0], q[..., :0]) == "PyTorch's maths"
    with pytest.raises(RuntimeError, match="same dtype"):
        attn._path(q, q.to(BF16), q)
