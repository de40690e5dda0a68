"""attn from Python: attn's fused CPU attention kernels behind PyTorch's API.

    import attn
    out = attn.scaled_dot_product_attention(q, k, v, is_causal=True)

is torch.nn.functional.scaled_dot_product_attention (PyTorch 2.x semantics)
on attn's fused kernel, forward and backward, for float32 and bfloat16 CPU
tensors, with FlashAttention 2's window_size, alibi_slopes and softcap as
keywords. It works with PyTorch 1.13 (which has no SDPA of its own) and 2.x:
the extension attn._attn holds no PyTorch code, tensors reach it as data
pointers, sizes and strides. Also: attn.sdpa_varlen (FlashAttention 2's
varlen function), attn.patch_sdpa / attn.sdpa_patched (route PyTorch's own
SDPA to attn, PyTorch >= 2.0), attn.nn (the book's attention modules and
GPTModel), attn.Tokenizer (GPT-2's BPE with tiktoken's API; from_file: a
tokenizer.json), attn.DecoderLM (Llama 3, Qwen, Gemma from their files), and
set_num_threads / get_num_threads. Without PyTorch, import attn gives the
tokenizers, ChatTemplate, DecoderLM's loading and the thread count; the
kernels' entry points then raise ImportError saying they need PyTorch.
docs/python.md has the rest.
"""

from . import _attn, _torch
from ._threads import get_num_threads, set_num_threads
from ._tokenizer import Tokenizer, get_encoding
from ._models import ChatTemplate, DecoderLM, HfTokenizer

# What needs PyTorch is imported with it; without it, import attn still gives
# the tokenizers, ChatTemplate, DecoderLM's files and the thread count, and
# each name below raises ImportError saying it needs PyTorch when it is used.
_NEEDS_TORCH = ("scaled_dot_product_attention", "sdpa_varlen", "dropout_noise", "patch_sdpa",
                "unpatch_sdpa", "sdpa_patched", "sdpa_stats", "nn", "_path", "_sdpa")
if _torch.available():
    import torch

    from ._sdpa import _path, dropout_noise, scaled_dot_product_attention
    from ._varlen import sdpa_varlen
    from ._patch import patch_sdpa, sdpa_patched, sdpa_stats, unpatch_sdpa
    from . import _sdpa, nn

    # torch.compile support (PyTorch >= 2.4: torch.library.custom_op): attn's
    # forward and backward registered as the custom ops attn::sdpa_forward/backward.
    if hasattr(torch.library, "custom_op") and hasattr(torch.library, "register_fake"):
        from . import _ops

        _sdpa._OPS = _ops
else:

    def __getattr__(name: str):
        if name in _NEEDS_TORCH:
            _torch.require(f"attn.{name}")
        raise AttributeError(f"module 'attn' has no attribute {name!r}")

# The one version string is the file VERSION: CMake compiles it in
# (attn::version()), pyproject.toml reads it for the wheel.
__version__ = _attn.version()


def kernel_target() -> str:
    """The SIMD target attn's sdpa kernel runs on this CPU ("AVX3", "AVX2", ...)."""
    return _attn.kernel_target()


__all__ = [
    "scaled_dot_product_attention",
    "sdpa_varlen",
    "Tokenizer",
    "ChatTemplate",
    "HfTokenizer",
    "DecoderLM",
    "nn",
    "get_encoding",
    "set_num_threads",
    "get_num_threads",
    "dropout_noise",
    "kernel_target",
    "patch_sdpa",
    "unpatch_sdpa",
    "sdpa_patched",
    "sdpa_stats",
    "__version__",
]
