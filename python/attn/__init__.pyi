from typing import ContextManager, Dict, Optional, Sequence

import torch

__version__: str

def scaled_dot_product_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: Optional[torch.Tensor] = ...,
    dropout_p: float = ...,
    is_causal: bool = ...,
    scale: Optional[float] = ...,
    enable_gqa: bool = ...,
    *,
    window_size: Optional[Sequence[int]] = ...,
    alibi_slopes: Optional[torch.Tensor] = ...,
    softcap: float = ...,
    causal_alignment: str = ...,
    dropout_seed: Optional[int] = ...,
) -> torch.Tensor: ...
def set_num_threads(n: Optional[int]) -> None: ...
def get_num_threads() -> int: ...
def dropout_noise(shape: Sequence[int], dropout_p: float, seed: int) -> torch.Tensor: ...
def kernel_target() -> str: ...
def patch_sdpa() -> None: ...
def unpatch_sdpa() -> None: ...
def sdpa_patched() -> ContextManager[None]: ...
def sdpa_stats() -> Dict[str, int]: ...
