"""attn's SDPA as torch.library custom ops (PyTorch >= 2.4), for torch.compile.

torch.compile cannot trace into attn's kernel (it reads raw data pointers),
and an autograd.Function that does so breaks the graph. Registered as custom
ops with fake (shape-only) implementations and an autograd formula, the
forward and backward become single opaque nodes of the compiled graph:

    attn::sdpa_forward(q, k, v, mask?, alibi?, <options>) -> (out, lse)
    attn::sdpa_backward(dout, q, k, v, out, lse, mask?, alibi?, <options>) -> (dq, dk, dv)

attn.scaled_dot_product_attention uses them while torch.compile traces (and
the autograd.Function of _sdpa.py otherwise). No `from __future__ import
annotations` here: torch.library reads the signature's annotations as types.
"""

from typing import Optional, Tuple

from ._torch import require

torch = require("attn._ops")

from . import _attn
from ._sdpa import _Options, _forward, _mask_grad, _ref, _rows_contiguous, get_num_threads

_OPTION_NAMES = ("is_causal", "bottom_right", "scale", "softcap", "window_left", "window_right",
                 "dropout_p", "dropout_seed", "enable_gqa")


def _options(values) -> _Options:
    opts = _Options()
    for name, value in zip(_OPTION_NAMES, values):
        setattr(opts, name, value)
    return opts


@torch.library.custom_op("attn::sdpa_forward", mutates_args=())
def sdpa_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: Optional[torch.Tensor],
                 alibi: Optional[torch.Tensor], is_causal: bool, bottom_right: bool, scale: float,
                 softcap: float, window_left: int, window_right: int, dropout_p: float,
                 dropout_seed: int, enable_gqa: bool) -> Tuple[torch.Tensor, torch.Tensor]:
    opts = _options((is_causal, bottom_right, scale, softcap, window_left, window_right,
                     dropout_p, dropout_seed, enable_gqa))
    return _forward(_rows_contiguous(q), _rows_contiguous(k), _rows_contiguous(v), mask, alibi,
                    opts)


@sdpa_forward.register_fake
def _(q, k, v, mask, alibi, *options):
    B, Hq, L = q.shape[0], q.shape[1], q.shape[2]
    return (q.new_empty((B, Hq, L, v.shape[3])),
            q.new_empty((B, Hq, L), dtype=torch.float32))


@torch.library.custom_op("attn::sdpa_backward", mutates_args=())
def sdpa_backward(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                  out: torch.Tensor, lse: torch.Tensor, mask: Optional[torch.Tensor],
                  alibi: Optional[torch.Tensor], is_causal: bool, bottom_right: bool,
                  scale: float, softcap: float, window_left: int, window_right: int,
                  dropout_p: float, dropout_seed: int,
                  enable_gqa: bool) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    opts = _options((is_causal, bottom_right, scale, softcap, window_left, window_right,
                     dropout_p, dropout_seed, enable_gqa))
    q, k, v = _rows_contiguous(q), _rows_contiguous(k), _rows_contiguous(v)
    dout, out = _rows_contiguous(dout), _rows_contiguous(out)
    lse = lse.contiguous()
    dq = torch.empty(q.shape, dtype=q.dtype)
    dk = torch.empty(k.shape, dtype=k.dtype)
    dv = torch.empty(v.shape, dtype=v.dtype)
    _attn.sdpa_backward(_ref(dout), _ref(q), _ref(k), _ref(v), _ref(out), _ref(lse), _ref(dq),
                        _ref(dk), _ref(dv), None if mask is None else _ref(mask),
                        None if alibi is None else _ref(alibi), **opts.kwargs(get_num_threads()))
    return dq, dk, dv


@sdpa_backward.register_fake
def _(dout, q, k, v, out, lse, mask, alibi, *options):
    return (q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape))


def _setup_context(ctx, inputs, output):
    q, k, v, mask, alibi = inputs[:5]
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse, mask, alibi)
    ctx.options = inputs[5:]


def _backward(ctx, dout, dlse):
    q, k, v, out, lse, mask, alibi = ctx.saved_tensors
    dq, dk, dv = sdpa_backward(dout, q, k, v, out, lse, mask, alibi, *ctx.options)
    dmask = None
    if ctx.needs_input_grad[3]:  # a float attn_mask that requires grad (torch ops: traceable)
        dmask = _mask_grad(dout, q, k, v, out, lse, mask, alibi, _options(ctx.options))
    return (dq, dk, dv, dmask) + (None,) * (1 + len(_OPTION_NAMES))


sdpa_forward.register_autograd(_backward, setup_context=_setup_context)


def apply(q, k, v, mask, alibi, opts: _Options) -> torch.Tensor:
    """The output of attn::sdpa_forward with the options of `opts`."""
    return sdpa_forward(q, k, v, mask, alibi, *(getattr(opts, n) for n in _OPTION_NAMES))[0]
