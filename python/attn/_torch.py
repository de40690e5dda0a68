"""The one way attn's modules that need PyTorch import it: import attn works
without PyTorch (the tokenizers, the thread count), and what needs it says so."""

from __future__ import annotations


def require(what: str):
    """torch, or ImportError naming `what` as needing it."""
    try:
        import torch
    except ImportError as e:
        raise ImportError(
            f"{what} needs PyTorch, which this Python cannot import ({e}); install torch "
            "(pip install torch, or Debian's python3-torch). attn.Tokenizer, attn.HfTokenizer, "
            "attn.ChatTemplate and attn.set_num_threads work without it.") from e
    return torch


def available() -> bool:
    """Whether torch can be imported here."""
    try:
        import torch  # noqa: F401
    except ImportError:
        return False
    return True
