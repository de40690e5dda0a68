"""attn.set_num_threads / get_num_threads: the thread count of attn's kernels
and of its tokenizer's parallel encodes (no PyTorch needed)."""

from __future__ import annotations

from typing import Optional

from . import _attn, _torch

# attn.set_num_threads(n); None: follow torch.get_num_threads() at every call
# (OpenMP's default where PyTorch is not installed).
_user_threads: Optional[int] = None


def set_num_threads(n: Optional[int]) -> None:
    """Runs attn's kernels on n OpenMP threads; None goes back to following
    torch.get_num_threads() (the default, so that attn and PyTorch's intra-op
    pool share the cores instead of oversubscribing them; without PyTorch,
    OpenMP's default)."""
    global _user_threads
    if n is not None:
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"attn.set_num_threads: n must be an int >= 1 or None, got {n!r}")
    _user_threads = n


def get_num_threads() -> int:
    """The thread count attn's next call will use."""
    if _user_threads is not None:
        return _user_threads
    if _torch.available():
        import torch
        return torch.get_num_threads()
    return _attn.max_threads()
