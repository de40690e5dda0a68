"""attn.sdpa_varlen: FlashAttention 2's flash_attn_varlen_func on attn's fused
CPU kernel: many sequences of different lengths packed along dim 0, no padding."""

from __future__ import annotations

import math
from typing import List, Optional, Sequence, Union

from ._torch import require

torch = require("attn.sdpa_varlen")

from . import _attn
from ._sdpa import _DTYPE_NAMES, _check_tensor, _Options, _ref, _rows_contiguous, get_num_threads


def _offsets(name: str, c) -> List[int]:
    if isinstance(c, torch.Tensor):
        _check_tensor(name, c)
        if c.dtype not in (torch.int32, torch.int64) or c.dim() != 1:
            raise RuntimeError(f"attn.sdpa_varlen: {name} must be a 1-D int32 or int64 tensor, "
                               f"got {c.dtype} of shape {tuple(c.shape)}")
        return [int(x) for x in c.tolist()]
    return [int(x) for x in c]


def _forward(q, k, v, cu_q, cu_k, max_q, max_k, alibi, opts):
    out = torch.empty((q.shape[0], q.shape[1], v.shape[2]), dtype=q.dtype)
    lse = torch.empty((q.shape[1], q.shape[0]), dtype=torch.float32)
    _attn.sdpa_varlen_forward(_ref(q), _ref(k), _ref(v), _ref(out), _ref(lse), cu_q, cu_k,
                              max_q, max_k, None if alibi is None else _ref(alibi),
                              **opts.kwargs(get_num_threads()))
    return out, lse


class _VarlenFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, alibi, cu_q, cu_k, max_q, max_k, opts):  # type: ignore[override]
        out, lse = _forward(q, k, v, cu_q, cu_k, max_q, max_k, alibi, opts)
        ctx.save_for_backward(q, k, v, out, lse, alibi)
        ctx.args = (cu_q, cu_k, max_q, max_k, opts)
        return out

    @staticmethod
    def backward(ctx, dout):  # type: ignore[override]
        q, k, v, out, lse, alibi = ctx.saved_tensors
        cu_q, cu_k, max_q, max_k, opts = ctx.args
        dout = _rows_contiguous(dout)
        dq = torch.empty(q.shape, dtype=q.dtype)
        dk = torch.empty(k.shape, dtype=k.dtype)
        dv = torch.empty(v.shape, dtype=v.dtype)
        _attn.sdpa_varlen_backward(_ref(dout), _ref(q), _ref(k), _ref(v), _ref(out), _ref(lse),
                                   _ref(dq), _ref(dk), _ref(dv), cu_q, cu_k, max_q, max_k,
                                   None if alibi is None else _ref(alibi),
                                   **opts.kwargs(get_num_threads()))
        return dq, dk, dv, None, None, None, None, None, None


def sdpa_varlen(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: Union[torch.Tensor, Sequence[int]],
    cu_seqlens_k: Union[torch.Tensor, Sequence[int]],
    max_seqlen_q: int,
    max_seqlen_k: int,
    dropout_p: float = 0.0,
    softmax_scale: Optional[float] = None,
    causal: bool = False,
    window_size: Sequence[int] = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: Optional[torch.Tensor] = None,
    *,
    causal_alignment: str = "bottom_right",
    dropout_seed: Optional[int] = None,
) -> torch.Tensor:
    """flash_attn_varlen_func (FlashAttention 2) on attn's fused CPU kernel.

    q (total_q, Hq, D), k (total_k, Hkv, D), v (total_k, Hkv, Dv) -> (total_q, Hq, Dv):
    the tokens of every sequence one after the other; sequence b is rows
    cu_seqlens_q[b]:cu_seqlens_q[b + 1] of q (and likewise of k, v with
    cu_seqlens_k). cu_seqlens: 1-D int32 or int64 tensors (or lists) of
    nseq + 1 offsets, 0 first; a sequence may be empty. max_seqlen_q/k: at
    least every length (checked). Hq a multiple of Hkv (grouped-query heads,
    read in place). Each sequence is attention on its own, with
    FlashAttention 2's options: causal with the bottom-right diagonal (the
    last query sees the last key; causal_alignment="top_left" for PyTorch's),
    window_size (left, right), softcap, alibi_slopes (Hq,) or (nseq, Hq)
    float32, dropout_p (attn's Philox noise, as
    attn.scaled_dot_product_attention's). float32 or bfloat16 CPU tensors,
    read in place when their last dim has stride 1 (else copied); autograd
    for q, k, v through attn's fused backward.
    """
    for name, t in (("q", q), ("k", k), ("v", v)):
        _check_tensor(name, t)
    if not (q.dtype == k.dtype == v.dtype) or q.dtype not in _DTYPE_NAMES:
        raise RuntimeError(f"attn.sdpa_varlen: q, k and v must all be torch.float32 or all "
                           f"torch.bfloat16, got {q.dtype}, {k.dtype}, {v.dtype}")
    if not (q.dim() == k.dim() == v.dim() == 3):
        raise RuntimeError(f"attn.sdpa_varlen: q, k and v must be 3-D (total, H, D), got "
                           f"{tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    if k.shape[2] != q.shape[2] or v.shape[:2] != k.shape[:2]:
        raise RuntimeError(f"attn.sdpa_varlen: shapes do not agree: q {tuple(q.shape)}, k "
                           f"{tuple(k.shape)}, v {tuple(v.shape)} (k and v must have the same "
                           f"tokens and heads, q and k the same head dim)")
    if k.shape[1] == 0 or q.shape[1] % k.shape[1] != 0:
        raise RuntimeError(f"attn.sdpa_varlen: q's heads ({q.shape[1]}) must be a multiple of "
                           f"k's and v's ({k.shape[1]})")
    if not (0.0 <= float(dropout_p) < 1.0):
        raise ValueError(f"attn.sdpa_varlen: dropout_p must be in [0, 1), got {dropout_p}")
    if causal_alignment not in ("top_left", "bottom_right"):
        raise ValueError(f"attn.sdpa_varlen: causal_alignment must be 'top_left' or "
                         f"'bottom_right', got {causal_alignment!r}")
    cu_q, cu_k = _offsets("cu_seqlens_q", cu_seqlens_q), _offsets("cu_seqlens_k", cu_seqlens_k)
    opts = _Options()
    opts.is_causal = bool(causal)
    opts.bottom_right = causal_alignment == "bottom_right"
    E = q.shape[2]
    opts.scale = (float(softmax_scale) if softmax_scale is not None
                  else 1.0 / math.sqrt(E) if E > 0 else 1.0)
    opts.softcap = float(softcap)
    opts.window_left, opts.window_right = (int(window_size[0]), int(window_size[1]))
    opts.dropout_p = float(dropout_p)
    opts.enable_gqa = True
    if dropout_seed is not None:
        opts.dropout_seed = int(dropout_seed)
    elif opts.dropout_p > 0.0:
        opts.dropout_seed = int(torch.randint(0, 2**62, (), dtype=torch.int64).item())
    else:
        opts.dropout_seed = 0
    alibi = None
    if alibi_slopes is not None:
        _check_tensor("alibi_slopes", alibi_slopes)
        if alibi_slopes.dtype != torch.float32:
            raise RuntimeError(f"attn.sdpa_varlen: alibi_slopes must be float32, got "
                               f"{alibi_slopes.dtype}")
        alibi = alibi_slopes.contiguous()
    if q.numel() == 0 or k.numel() == 0:
        # No query, or no key at all: nothing to attend to (0, as a row with no key).
        if len(cu_q) < 2 or cu_q[0] != 0 or cu_q[-1] != q.shape[0] or len(cu_k) != len(cu_q) \
                or cu_k[0] != 0 or cu_k[-1] != k.shape[0]:
            raise ValueError("attn.sdpa_varlen: cu_seqlens do not match the tensors' totals")
        return (q.sum() * 0 + k.sum() * 0 + v.sum() * 0).expand(
            q.shape[0], q.shape[1], v.shape[2]).contiguous()
    q, k, v = _rows_contiguous(q), _rows_contiguous(k), _rows_contiguous(v)
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
        return _VarlenFunction.apply(q, k, v, alibi, cu_q, cu_k, int(max_seqlen_q),
                                     int(max_seqlen_k), opts)
    out, _ = _forward(q, k, v, cu_q, cu_k, int(max_seqlen_q), int(max_seqlen_k), alibi, opts)
    return out
