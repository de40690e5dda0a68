"""attn.scaled_dot_product_attention: PyTorch 2.x's SDPA on attn's fused CPU kernel.

The tensors never cross as copies: the extension (attn._attn, no PyTorch
inside) receives each tensor's data pointer, sizes and strides, reads q, k, v
in place and writes into tensors allocated here with torch.empty. Copies are
made only where the kernel cannot read the caller's layout (see the docstring
of scaled_dot_product_attention).
"""

from __future__ import annotations

import math
from typing import Optional, Sequence, Tuple

from . import _attn, _threads
from ._threads import get_num_threads, set_num_threads  # noqa: F401 (attn's names)
from ._torch import require

torch = require("attn.scaled_dot_product_attention")

_DTYPE_NAMES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.bool: "bool"}

# attn._ops (the torch.library custom ops) on PyTorch >= 2.4, set by attn/__init__.py.
_OPS = None


def _compiling() -> bool:
    """True while torch.compile (dynamo) traces the caller."""
    compiler = getattr(torch, "compiler", None)
    is_compiling = getattr(compiler, "is_compiling", None)
    if is_compiling is None:
        dynamo = getattr(torch, "_dynamo", None)
        is_compiling = getattr(dynamo, "is_compiling", None)
    return bool(is_compiling()) if is_compiling is not None else False


def _ref(t: torch.Tensor):
    return (t.data_ptr(), _DTYPE_NAMES[t.dtype], tuple(t.shape), tuple(t.stride()))


def _rows_contiguous(t: torch.Tensor) -> torch.Tensor:
    # The kernel reads rows of the last dim with stride 1: anything else is copied.
    return t if t.shape[-1] == 1 or t.stride(-1) == 1 else t.contiguous()


class _Options:
    __slots__ = ("is_causal", "bottom_right", "scale", "softcap", "window_left",
                 "window_right", "dropout_p", "dropout_seed", "enable_gqa")

    def kwargs(self, threads: int) -> dict:
        d = {name: getattr(self, name) for name in self.__slots__}
        d["threads"] = threads
        return d


def _forward(q, k, v, mask, alibi, opts: _Options):
    B, Hq, Tq = q.shape[0], q.shape[1], q.shape[2]
    out = torch.empty((B, Hq, Tq, v.shape[3]), dtype=q.dtype)
    lse = torch.empty((B, Hq, Tq), dtype=torch.float32)
    _attn.sdpa_forward(_ref(q), _ref(k), _ref(v), _ref(out), _ref(lse),
                       None if mask is None else _ref(mask),
                       None if alibi is None else _ref(alibi),
                       **opts.kwargs(get_num_threads()))
    return out, lse


def _mask_grad(dout, q, k, v, out, lse, mask, alibi, opts: _Options) -> torch.Tensor:
    """The gradient of an additive float mask (4-D, dims of 1 broadcast): dS, the
    softmax backward's output before the scale (the mask is added after it),
    summed over the mask's broadcast dims. The kernel's backward does not write
    dS, so it is recomputed here with torch ops in float32 from the forward's
    lse (O(B·H·L·S) memory, as the mask's own full size):
        P = exp(s - lse)   (s the scores as the kernel forms them; 0 where lse = -inf)
        dP = (dO Vᵀ) ⊙ Z   (Z the dropout noise)
        dS = P ⊙ (dP - rowsum(dO ⊙ O))"""
    f32 = torch.float32
    qf, kf, vf, dof, of = (t.to(f32) for t in (q, k, v, dout, out))
    B, Hq, L, S = q.shape[0], q.shape[1], q.shape[2], k.shape[2]
    if k.shape[1] != Hq:  # grouped-query heads
        kf = kf.repeat_interleave(Hq // k.shape[1], dim=1)
        vf = vf.repeat_interleave(Hq // v.shape[1], dim=1)
    s = (qf @ kf.transpose(-2, -1)) * opts.scale
    if opts.softcap > 0:
        s = opts.softcap * torch.tanh(s / opts.softcap)
    i = torch.arange(L, dtype=f32).unsqueeze(1)
    j = torch.arange(S, dtype=f32).unsqueeze(0)
    delta = S - L if opts.bottom_right else 0
    if alibi is not None:
        slopes = alibi.reshape(-1, Hq) if alibi.dim() == 2 else alibi.reshape(1, Hq)
        s = s - slopes.reshape(slopes.shape[0], Hq, 1, 1) * (i + delta - j).abs()
    s = s + mask
    allowed = torch.ones(L, S, dtype=torch.bool)
    if opts.is_causal:
        allowed &= j <= i + delta
    if opts.window_left >= 0:
        allowed &= j >= i + delta - opts.window_left
    if opts.window_right >= 0:
        allowed &= j <= i + delta + opts.window_right
    lse4 = lse.unsqueeze(-1)
    no_key = torch.isneginf(lse4)
    p = torch.exp(s - lse4.masked_fill(no_key, 0.0))
    p = p.masked_fill(~allowed, 0.0).masked_fill(no_key, 0.0)
    dp = dof @ vf.transpose(-2, -1)
    if opts.dropout_p > 0:
        dp = dp * dropout_noise((B, Hq, L, S), opts.dropout_p, opts.dropout_seed)
    ds = p * (dp - (dof * of).sum(dim=-1, keepdim=True))
    return ds.sum_to_size(mask.shape)


class _SdpaFunction(torch.autograd.Function):
    """out = SDPA(q, k, v); backward runs attn's fused backward on the saved out and lse."""

    @staticmethod
    def forward(ctx, q, k, v, mask, alibi, opts):  # type: ignore[override]
        out, lse = _forward(q, k, v, mask, alibi, opts)
        ctx.save_for_backward(q, k, v, out, lse, mask, alibi)
        ctx.opts = opts
        return out

    @staticmethod
    def backward(ctx, dout):  # type: ignore[override]
        q, k, v, out, lse, mask, alibi = ctx.saved_tensors
        dout = _rows_contiguous(dout)
        dq = torch.empty(q.shape, dtype=q.dtype)
        dk = torch.empty(k.shape, dtype=k.dtype)
        dv = torch.empty(v.shape, dtype=v.dtype)
        _attn.sdpa_backward(_ref(dout), _ref(q), _ref(k), _ref(v), _ref(out), _ref(lse),
                            _ref(dq), _ref(dk), _ref(dv),
                            None if mask is None else _ref(mask),
                            None if alibi is None else _ref(alibi),
                            **ctx.opts.kwargs(get_num_threads()))
        dmask = None
        if ctx.needs_input_grad[3]:
            dmask = _mask_grad(dout, q, k, v, out, lse, mask, alibi, ctx.opts)
        return dq, dk, dv, dmask, None, None


def _check_tensor(name: str, t) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"scaled_dot_product_attention(): {name} must be a Tensor, "
                        f"got {type(t).__name__}")
    if t.device.type != "cpu":
        raise RuntimeError(f"attn.scaled_dot_product_attention: {name} is on device "
                           f"{t.device}; attn runs on CPU tensors only")
    if t.layout != torch.strided:
        raise RuntimeError(f"attn.scaled_dot_product_attention: {name} has layout "
                           f"{t.layout}; only dense (strided) tensors are supported")


class _Broadcast:
    """query, key, value broadcast as PyTorch's SDPA broadcasts them, as the kernel's
    (B, H, T, E) views: the batch dims (all but the last 3; fewer dims count as 1s
    on the left) broadcast to N and are folded into B; the heads are equal, or
    key/value's a divisor of query's with enable_gqa, or one side has 1 head (1
    key/value head: the kernel shares it as a group, no copy; 1 query head: the
    query is expanded to key/value's heads). Broadcast dims are stride-0 views;
    folding N into one dim is a view where the strides allow (always for one
    batch dim), else torch.reshape's copy. Gradients of the broadcast inputs
    are summed by autograd through these views."""

    def __init__(self, query, key, value, enable_gqa):
        if self._plain(query, key, value):
            return
        self.ndim = nd = max(query.dim(), key.dim(), value.dim())

        def padded(t):  # (1, ..., 1, *t.shape) with nd >= 3 dims: a view
            return t[(None,) * (max(nd, 3) - t.dim())]

        q, k, v = padded(query), padded(key), padded(value)
        Hq, Hk, Hv = q.shape[-3], k.shape[-3], v.shape[-3]
        if Hk != Hv:
            if Hk != 1 and Hv != 1:
                raise RuntimeError(
                    f"attn.scaled_dot_product_attention: key and value must have the same "
                    f"number of heads (dim -3), got key {tuple(key.shape)} and value "
                    f"{tuple(value.shape)}")
        Hkv = max(Hk, Hv)
        self.kernel_gqa = False
        H = Hq
        if Hq != Hkv:
            if enable_gqa and Hkv != 0 and Hq % Hkv == 0:
                self.kernel_gqa = True
            elif enable_gqa and Hkv != 1 and Hq != 1:
                raise RuntimeError(
                    f"attn.scaled_dot_product_attention: enable_gqa: query's heads ({Hq}) must "
                    f"be a multiple of key's and value's ({Hkv})")
            elif Hkv == 1:
                self.kernel_gqa = True  # one key/value head for every query head
            elif Hq == 1:
                H = Hkv  # the query broadcast over key/value's heads
            else:
                raise RuntimeError(
                    f"attn.scaled_dot_product_attention: query has {Hq} heads and key/value "
                    f"{Hkv} (dim -3): pass enable_gqa=True for grouped-query attention")
        try:
            N = tuple(torch.broadcast_shapes(q.shape[:-3], k.shape[:-3], v.shape[:-3]))
        except RuntimeError:
            raise RuntimeError(
                f"attn.scaled_dot_product_attention: the batch dims of query "
                f"{tuple(query.shape)}, key {tuple(key.shape)} and value {tuple(value.shape)} "
                f"(all but the last 3) are not broadcastable") from None
        self.lead, self.H = N, H
        Hk_out = Hkv if self.kernel_gqa or Hq == Hkv else H

        def folded(t, heads):  # (N..., heads, T, E) -> (B, heads, T, E)
            t = t.expand(N + (heads,) + tuple(t.shape[-2:]))
            if len(N) == 1:
                return t
            if len(N) == 0:
                return t.unsqueeze(0)
            return t.reshape((-1,) + tuple(t.shape[-3:]))

        self.q = _rows_contiguous(folded(q, H))
        self.k = _rows_contiguous(folded(k, Hk_out))
        self.v = _rows_contiguous(folded(v, Hk_out))

    def _plain(self, query, key, value) -> bool:
        """The common call, (B, H, T, E) inputs of one batch size and head count,
        rows contiguous: the general path's result (its expand and fold are
        identity views there) without its ~15 us of view building."""
        if not (query.dim() == key.dim() == value.dim() == 4):
            return False
        qs, ks, vs = query.shape, key.shape, value.shape
        if not (qs[0] == ks[0] == vs[0] and qs[1] == ks[1] == vs[1]):
            return False
        for t in (query, key, value):
            if t.stride(3) != 1 and t.shape[3] != 1:
                return False
        self.ndim, self.lead, self.H, self.kernel_gqa = 4, (qs[0],), qs[1], False
        self.q, self.k, self.v = query, key, value
        return True


def _kernel_mask(attn_mask: torch.Tensor, q: torch.Tensor, lead, Hq, L, S, B) -> torch.Tensor:
    """attn_mask (broadcastable to (*lead, Hq, L, S)) as the kernel reads it: 4
    dims (B, Hq, L, S), broadcast dims of size 1; a bool mask as it is (the
    kernel reads its bytes in place), a float one as float32."""
    full = tuple(lead) + (Hq, L, S)
    m = attn_mask
    if m.dim() > len(full):
        raise RuntimeError(f"attn.scaled_dot_product_attention: attn_mask of shape "
                           f"{tuple(m.shape)} has more dims than the attention weights {full}")
    for d in range(1, m.dim() + 1):
        if m.shape[-d] != 1 and m.shape[-d] != full[-d]:
            raise RuntimeError(
                f"attn.scaled_dot_product_attention: attn_mask of shape {tuple(m.shape)} is not "
                f"broadcastable to the attention weights of shape {full}")
    if m.dtype in (torch.float32, torch.bfloat16):
        if m.dtype != torch.float32 and m.dtype != q.dtype:
            raise RuntimeError(
                f"attn.scaled_dot_product_attention: Expected attn_mask dtype to be bool or "
                f"float or to match query dtype, but got attn_mask.dtype: {m.dtype} and "
                f"query.dtype: {q.dtype} instead.")
        # (Not while torch.compile traces: a data-dependent branch would break the graph.)
        if not _compiling() and (bool(torch.isnan(m).any()) or bool(torch.isposinf(m).any())):
            raise ValueError("attn.scaled_dot_product_attention: a float attn_mask must hold "
                             "finite values or -inf (NaN or +inf would make a row NaN)")
        m = m.to(torch.float32)  # no copy when already float32
    elif m.dtype != torch.bool:  # a bool mask goes as it is
        raise RuntimeError(
            f"attn.scaled_dot_product_attention: Expected attn_mask dtype to be bool or float "
            f"or to match query dtype, but got attn_mask.dtype: {m.dtype} and "
            f"query.dtype: {q.dtype} instead.")
    # Pad to the weights' dims, then fold the batch dims into one.
    m = m.reshape((1,) * (len(full) - m.dim()) + tuple(m.shape))
    if len(full) == 4:
        return m
    nlead = len(lead)
    if all(s == 1 for s in m.shape[:nlead]):
        return m.reshape((1,) + tuple(m.shape[nlead:]))
    return m.expand(full[:nlead] + tuple(m.shape[nlead:])).reshape((B,) + tuple(m.shape[nlead:]))


def _math_sdpa(q, k, v, mask, opts: _Options):
    # PyTorch's own maths, for the inputs the kernel has no work for (a zero-sized dim).
    if opts.enable_gqa and k.shape[-3] != q.shape[-3]:
        k = k.repeat_interleave(q.shape[-3] // k.shape[-3], dim=-3)
        v = v.repeat_interleave(q.shape[-3] // v.shape[-3], dim=-3)
    s = (q @ k.transpose(-2, -1)) * opts.scale
    if mask is not None and mask.dtype == torch.bool:
        s = s.masked_fill(~mask, -math.inf)
    elif mask is not None:
        s = s + mask.to(s.dtype)
    if opts.is_causal:
        L, S = s.shape[-2], s.shape[-1]
        s = s.masked_fill(torch.ones(L, S, dtype=torch.bool).tril().logical_not(), -math.inf)
    return torch.softmax(s, dim=-1) @ v


class _Call:
    """One call's tensors as the kernel takes them: q, k, v (B, H, T, D) views,
    the mask (4-D: bool, or additive float32) and the ALiBi slopes, the options, and how
    to give the output the query's shape back (`empty`: the inputs of a call
    with a zero-sized dim, which PyTorch's own maths answers)."""

    __slots__ = ("q", "k", "v", "mask", "alibi", "opts", "lead", "ndim", "empty")

    def __init__(self, q, k, v, mask, alibi, opts, lead, ndim, empty):
        self.q, self.k, self.v, self.mask, self.alibi = q, k, v, mask, alibi
        self.opts, self.lead, self.ndim, self.empty = opts, lead, ndim, empty

    def shaped(self, out: torch.Tensor) -> torch.Tensor:
        """The kernel's (B, H, L, Ev) output as (N..., H, L, Ev), N the broadcast batch
        dims ((L, Ev) when every input was 2-D)."""
        if self.ndim == 2:
            return out[0, 0]
        if self.ndim == 4:  # already (N, H, L, Ev): no view to make (a reshape costs ~5 us)
            return out
        return out.reshape(self.lead + tuple(out.shape[1:]))


def _prepare(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa,
             window_size, alibi_slopes, softcap, causal_alignment, dropout_seed) -> _Call:
    """Checks a call as PyTorch's SDPA does and sets up its kernel arguments."""
    for name, t in (("query", query), ("key", key), ("value", value)):
        _check_tensor(name, t)
    if not (query.dtype == key.dtype == value.dtype):
        raise RuntimeError(
            f"attn.scaled_dot_product_attention: Expected query, key, and value to have the "
            f"same dtype, but got query.dtype: {query.dtype} key.dtype: {key.dtype} and "
            f"value.dtype: {value.dtype} instead.")
    if query.dtype not in _DTYPE_NAMES:
        raise RuntimeError(f"attn.scaled_dot_product_attention: query, key and value have "
                           f"dtype {query.dtype}; attn supports torch.float32 and torch.bfloat16")
    if not (query.dim() >= 2 and key.dim() >= 2 and value.dim() >= 2):
        raise RuntimeError(
            f"attn.scaled_dot_product_attention: query, key and value must have at least 2 "
            f"dims, got query {tuple(query.shape)}, key {tuple(key.shape)}, value "
            f"{tuple(value.shape)}")
    L, E = query.shape[-2], query.shape[-1]
    S, Ev = key.shape[-2], value.shape[-1]
    if key.shape[-1] != E:
        raise RuntimeError(f"attn.scaled_dot_product_attention: query and key must have the "
                           f"same head dim (last dim), got query {tuple(query.shape)} and key "
                           f"{tuple(key.shape)}")
    if value.shape[-2] != S:
        raise RuntimeError(f"attn.scaled_dot_product_attention: key and value must have the "
                           f"same sequence length (dim -2), got key {tuple(key.shape)} and "
                           f"value {tuple(value.shape)}")
    bq = _Broadcast(query, key, value, enable_gqa)
    lead, Hq = bq.lead, bq.H
    if attn_mask is not None:
        _check_tensor("attn_mask", attn_mask)
        if is_causal:
            raise RuntimeError("attn.scaled_dot_product_attention: Explicit attn_mask should "
                               "not be set when is_causal=True")
    if not (0.0 <= float(dropout_p) < 1.0):
        raise ValueError(f"attn.scaled_dot_product_attention: dropout_p must be in [0, 1), "
                         f"got {dropout_p}")
    if causal_alignment not in ("top_left", "bottom_right"):
        raise ValueError(f"attn.scaled_dot_product_attention: causal_alignment must be "
                         f"'top_left' or 'bottom_right', got {causal_alignment!r}")
    window_left, window_right = (-1, -1) if window_size is None else tuple(window_size)

    opts = _Options()
    opts.is_causal = bool(is_causal)
    opts.bottom_right = causal_alignment == "bottom_right"
    opts.scale = float(scale) if scale is not None else 1.0 / math.sqrt(E) if E > 0 else 1.0
    opts.softcap = float(softcap)
    opts.window_left, opts.window_right = int(window_left), int(window_right)
    opts.dropout_p = float(dropout_p)
    opts.dropout_seed = 0
    opts.enable_gqa = bool(enable_gqa)

    if query.numel() == 0 or key.numel() == 0 or value.numel() == 0:
        if (opts.softcap or window_size is not None or alibi_slopes is not None
                or opts.dropout_p > 0 or opts.bottom_right):
            raise ValueError("attn.scaled_dot_product_attention: an empty input works only "
                             "without dropout, window_size, alibi_slopes, softcap and "
                             "causal_alignment")
        return _Call(None, None, None, attn_mask, None, opts, lead, query.dim(),
                     (query, key, value))

    q, k, v = bq.q, bq.k, bq.v
    opts.enable_gqa = bq.kernel_gqa
    B = q.shape[0]
    mask = None if attn_mask is None else _kernel_mask(attn_mask, query, lead, Hq, L, S, B)
    alibi = None
    if alibi_slopes is not None:
        _check_tensor("alibi_slopes", alibi_slopes)
        if alibi_slopes.dtype != torch.float32:
            raise RuntimeError(f"attn.scaled_dot_product_attention: alibi_slopes must be "
                               f"float32, got {alibi_slopes.dtype}")
        Hq4 = q.shape[1]
        a = alibi_slopes.reshape(-1, alibi_slopes.shape[-1]) if alibi_slopes.dim() >= 1 else None
        if a is None or a.shape[-1] != Hq4 or (alibi_slopes.dim() > 1 and a.shape[0] not in (1, B)):
            raise RuntimeError(
                f"attn.scaled_dot_product_attention: alibi_slopes must be (Hq,) = ({Hq4},) or "
                f"(N, ..., Hq) with query's batch dims, got {tuple(alibi_slopes.shape)} for "
                f"query {tuple(query.shape)}")
        alibi = (a[0] if a.shape[0] == 1 else a).contiguous()
    if dropout_seed is not None:
        if not 0 <= int(dropout_seed) < 2**64:
            raise ValueError(f"attn.scaled_dot_product_attention: dropout_seed must be in "
                             f"[0, 2**64), got {dropout_seed}")
        opts.dropout_seed = int(dropout_seed)
    elif opts.dropout_p > 0.0:
        # From torch's default generator: torch.manual_seed makes the noise repeatable.
        opts.dropout_seed = int(torch.randint(0, 2**62, (), dtype=torch.int64).item())

    return _Call(q, k, v, mask, alibi, opts, lead, bq.ndim, None)


def scaled_dot_product_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: Optional[torch.Tensor] = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: Optional[float] = None,
    enable_gqa: bool = False,
    *,
    window_size: Optional[Sequence[int]] = None,
    alibi_slopes: Optional[torch.Tensor] = None,
    softcap: float = 0.0,
    causal_alignment: str = "top_left",
    dropout_seed: Optional[int] = None,
) -> torch.Tensor:
    """torch.nn.functional.scaled_dot_product_attention (PyTorch 2.x) on attn's
    fused CPU kernel, forward and backward.

    query (N..., Hq, L, E), key (N..., Hkv, S, E), value (N..., Hkv, S, Ev)
    -> (N..., H, L, Ev); any number of dims >= 2. The batch dims (all but the
    last 3) broadcast as PyTorch's (fewer dims count as 1s on the left, dims
    of size 1 stretch, read through stride-0 views, no copies); the heads are
    equal, or Hkv divides Hq with enable_gqa, or either side has 1 head
    (broadcast: H is the larger). CPU tensors,
    all float32 or all bfloat16 (bf16: the kernel widens each tile to fp32 and
    rounds the results once, as PyTorch's CPU SDPA on bf16).

    attn_mask: bool (True = may attend) or float (added to the scores: float32,
        or query's dtype), broadcastable to (N, ..., Hq, L, S). A bool mask is
        read in place (a byte per value); a bf16 one is converted to float32
        (a copy of the mask only).
    dropout_p: in [0, 1). The noise comes from attn's counter-based Philox
        stream (not PyTorch's), keyed by a seed drawn from torch's default
        generator, so torch.manual_seed makes it repeatable; backward applies
        the same noise.
    is_causal: query i sees keys j <= i (top-left diagonal, as PyTorch's).
        PyTorch refuses attn_mask with is_causal; so does this function.
    scale: default 1 / sqrt(E).
    enable_gqa: Hq a multiple of Hkv; key/value heads are shared without copies.

    FlashAttention-2's extras (keywords only):
    window_size: (left, right), -1 for unbounded: query i sees keys
        i - left <= j <= i + right (sliding-window attention).
    alibi_slopes: float32 (Hq) or (N, Hq): adds -slope * |i - j| to the scores.
    softcap: > 0 caps the scores as softcap * tanh(s / softcap) (Gemma 2).
    causal_alignment: "top_left" (PyTorch's) or "bottom_right" (FlashAttention 2's,
        a KV-cache decoder's: the last query sees the last key); it also places
        the window and the ALiBi distance when L != S.
    dropout_seed: the Philox key of the dropout noise (default: drawn from
        torch's generator); attn.dropout_noise gives the factors it applies.

    A row that may attend to no key gives 0 (and zero gradients), not NaN.

    Copies: none of query, key, value when their last dim has stride 1 (any
    other strides are read in place: transposed (B, L, H, E) views, slices of a
    fused qkv buffer, broadcast batch dims); an input whose last stride is not 1
    is copied first, and so is one whose batch dims (two or more) cannot be
    folded into one as a view (e.g. broadcast along one of them only). The
    output is a new contiguous (N..., H, L, Ev) tensor.

    Autograd: gradients for query, key and value through attn's fused
    backward (the forward's output and log-sum-exp are kept for it); for a
    float attn_mask that requires grad, as PyTorch's SDPA gives it: dS (the
    softmax backward's output) summed over the mask's broadcast dims,
    recomputed with torch ops from the saved log-sum-exp (O(N·H·L·S) memory,
    like the mask at full size); none for alibi_slopes.
    Threads: attn.get_num_threads() (torch.get_num_threads() unless
    attn.set_num_threads was called).
    torch.compile (PyTorch >= 2.4): traced as the custom ops attn::sdpa_forward
    and attn::sdpa_backward, so the graph does not break (dropout without a
    dropout_seed still does: the seed is read from torch's generator).
    """
    c = _prepare(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa,
                 window_size, alibi_slopes, softcap, causal_alignment, dropout_seed)
    if c.empty is not None:
        return _math_sdpa(*c.empty, c.mask, c.opts)
    q, k, v, mask, alibi, opts = c.q, c.k, c.v, c.mask, c.alibi, c.opts
    if _OPS is not None and _compiling():
        # torch.compile: attn's forward and backward as custom ops (one graph node each).
        out = _OPS.apply(q, k, v, mask, alibi, opts)
    elif torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad
                                      or (mask is not None and mask.requires_grad)):
        out = _SdpaFunction.apply(q, k, v, mask, alibi, opts)
    else:
        out, _ = _forward(q, k, v, mask, alibi, opts)
    return c.shaped(out)



def _path(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: Optional[torch.Tensor] = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: Optional[float] = None,
    enable_gqa: bool = False,
    *,
    window_size: Optional[Sequence[int]] = None,
    alibi_slopes: Optional[torch.Tensor] = None,
    softcap: float = 0.0,
    causal_alignment: str = "top_left",
    dropout_seed: Optional[int] = None,
) -> str:
    """The path attn.scaled_dot_product_attention takes, forward and backward, for
    these arguments (checked as that call checks them): "fp32 kernel", or for
    bfloat16 attn::kernels::sdpa_bf16_path's "AMX" (the core's AMX kernel: no
    window, ALiBi or softcap, E = Ev, scale >= 0, on a CPU with AMX; masks,
    grouped heads and L != S included), "AVX512-BF16" (the core's VDPBF16PS
    kernel where that is the core's path, AMD Zen 4/5: the same, masks,
    grouped-query heads and L != S included) or "bf16 tiles widened to fp32";
    "PyTorch's maths" for an input with a zero-sized dim. The C++ entry points
    take the same paths."""
    c = _prepare(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa,
                 window_size, alibi_slopes, softcap, causal_alignment,
                 0 if dropout_seed is None else dropout_seed)
    if c.empty is not None:
        return "PyTorch's maths"
    return _attn.sdpa_path(_ref(c.q), _ref(c.k), _ref(c.v),
                           None if c.mask is None else _ref(c.mask),
                           None if c.alibi is None else _ref(c.alibi),
                           **{n: getattr(c.opts, n) for n in _Options.__slots__})


def dropout_noise(shape: Sequence[int], dropout_p: float, seed: int) -> torch.Tensor:
    """The dropout factors Z (B, H, L, S), 0 or 1/(1-p), that attn's kernel applies
    for `seed` (for tests: out = (softmax(scores) * Z) @ V)."""
    z = torch.empty(tuple(shape), dtype=torch.float32)
    _attn.dropout_noise(_ref(z), float(dropout_p), int(seed))
    return z
