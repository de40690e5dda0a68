from typing import ContextManager, Dict, Optional, Sequence, Union

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
def sdpa_varlen(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: Union[torch.Tensor, Sequence[int]],
    cu_seqlens_k: Union[torch.Tensor, Sequence[int]],
    max_seqlen_q: int,
    max_seqlen_k: int,
    dropout_p: float = ...,
    softmax_scale: Optional[float] = ...,
    causal: bool = ...,
    window_size: Sequence[int] = ...,
    softcap: float = ...,
    alibi_slopes: Optional[torch.Tensor] = ...,
    *,
    causal_alignment: str = ...,
    dropout_seed: Optional[int] = ...,
) -> torch.Tensor: ...
