"""attn.patch_sdpa: torch.nn.functional.scaled_dot_product_attention routed to
attn for the calls attn covers, to PyTorch's own function for the rest.

Covered: CPU query, key, value, all float32 or all bfloat16, at least 2 dims,
dense; an attn_mask that is bool, float32 or query's dtype, not requiring
grad, not together with is_causal; Hq = Hkv or enable_gqa; equal batch dims;
no zero-sized dim; under torch.compile only with PyTorch >= 2.4 (attn's
custom ops, attn._ops; with an older PyTorch compiled graphs keep PyTorch's op). Everything else (CUDA, float16/float64, nested tensors, batch
broadcasting, keywords attn does not know) goes to the original function,
unchanged, errors included.
"""

from __future__ import annotations

import contextlib
from typing import Callable, Dict, Iterator, Optional

from ._torch import require

torch = require("attn.patch_sdpa")

from . import _sdpa
from ._sdpa import scaled_dot_product_attention as _attn_sdpa

_stats: Dict[str, int] = {"attn": 0, "torch": 0}
_original: Optional[Callable] = None

_DTYPES = (torch.float32, torch.bfloat16)


def _covers(query, key, value, attn_mask, is_causal, enable_gqa, extra) -> bool:
    if extra:
        return False
    if _sdpa._compiling() and _sdpa._OPS is None:  # no custom ops: keep PyTorch's in the graph
        return False
    ts = (query, key, value)
    if not all(isinstance(t, torch.Tensor) for t in ts):
        return False
    for t in ts:
        if t.device.type != "cpu" or t.layout != torch.strided or getattr(t, "is_nested", False):
            return False
        if t.dtype != query.dtype or t.numel() == 0:
            return False
    if query.dtype not in _DTYPES or min(t.dim() for t in ts) < 2:
        return False
    if key.shape[-1] != query.shape[-1] or value.shape[-2] != key.shape[-2]:
        return False
    try:  # batch dims and heads broadcast as PyTorch's (views only)
        _sdpa._Broadcast(query, key, value, enable_gqa)
    except RuntimeError:
        return False
    if attn_mask is not None:
        if is_causal or not isinstance(attn_mask, torch.Tensor):
            return False
        if attn_mask.device.type != "cpu" or attn_mask.layout != torch.strided:
            return False
        if attn_mask.dtype not in (torch.bool, torch.float32, query.dtype):
            return False
        if attn_mask.dim() > max(t.dim() for t in ts):
            return False
    return True


def _make_patched(original: Callable) -> Callable:
    def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0,
                                     is_causal=False, scale=None, enable_gqa=False, **extra):
        if _covers(query, key, value, attn_mask, is_causal, enable_gqa, extra):
            _stats["attn"] += 1
            return _attn_sdpa(query, key, value, attn_mask, dropout_p, is_causal, scale,
                              enable_gqa)
        _stats["torch"] += 1
        kwargs = dict(extra)
        if scale is not None:  # PyTorch 2.0 has no scale argument
            kwargs["scale"] = scale
        if enable_gqa:  # nor does PyTorch < 2.5 have enable_gqa
            kwargs["enable_gqa"] = enable_gqa
        return original(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p,
                        is_causal=is_causal, **kwargs)

    scaled_dot_product_attention.__doc__ = (
        "attn.patch_sdpa's torch.nn.functional.scaled_dot_product_attention: attn's "
        "kernel where it covers the call, PyTorch's original otherwise.")
    scaled_dot_product_attention._attn_original = original  # type: ignore[attr-defined]
    return scaled_dot_product_attention


def _require_sdpa() -> Callable:
    fn = getattr(torch.nn.functional, "scaled_dot_product_attention", None)
    if fn is None:
        raise RuntimeError(
            f"attn.patch_sdpa needs PyTorch >= 2.0, which has "
            f"torch.nn.functional.scaled_dot_product_attention; this is PyTorch "
            f"{torch.__version__}. Call attn.scaled_dot_product_attention directly instead.")
    return fn


def patch_sdpa() -> None:
    """Routes torch.nn.functional.scaled_dot_product_attention to attn for the
    calls attn covers (see attn._patch) and to PyTorch's function for the rest.
    Code that looks the function up at call time (nanoGPT, transformers' "sdpa"
    attention) then runs attn's kernels unmodified. Idempotent; undo with
    attn.unpatch_sdpa(). RuntimeError on PyTorch < 2.0."""
    global _original
    current = _require_sdpa()
    if _original is not None:
        return
    _original = current
    torch.nn.functional.scaled_dot_product_attention = _make_patched(current)


def unpatch_sdpa() -> None:
    """Puts PyTorch's own scaled_dot_product_attention back (no-op when not patched)."""
    global _original
    if _original is None:
        return
    torch.nn.functional.scaled_dot_product_attention = _original
    _original = None


@contextlib.contextmanager
def sdpa_patched() -> Iterator[None]:
    """with attn.sdpa_patched(): ... runs the block with patch_sdpa() in force and
    restores the previous state after it (also when it raises)."""
    was_patched = _original is not None
    patch_sdpa()
    try:
        yield
    finally:
        if not was_patched:
            unpatch_sdpa()


def sdpa_stats() -> Dict[str, int]:
    """How many patched calls went to attn and to PyTorch so far (a copy)."""
    return dict(_stats)
