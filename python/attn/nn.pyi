# Type stubs of attn.nn (python/attn/nn.py): the book's modules on attn's kernel.
from typing import Any, Dict, Optional

import torch
import torch.nn as nn

class CausalAttention(nn.Module):
    d_out: int
    W_query: nn.Linear
    W_key: nn.Linear
    W_value: nn.Linear
    dropout: nn.Dropout
    mask: torch.Tensor
    def __init__(self, d_in: int, d_out: int, context_length: int, dropout: float,
                 qkv_bias: bool = ...) -> None: ...
    def forward(self, x: torch.Tensor) -> torch.Tensor: ...

class _MultiHead(nn.Module):
    d_out: int
    num_heads: int
    head_dim: int
    W_query: nn.Linear
    W_key: nn.Linear
    W_value: nn.Linear
    out_proj: nn.Linear
    dropout: nn.Dropout
    cache_k: Optional[torch.Tensor]
    cache_v: Optional[torch.Tensor]
    ptr_current_pos: int
    def reset_cache(self) -> None: ...

class MultiHeadAttention(_MultiHead):
    mask: torch.Tensor
    def __init__(self, d_in: int, d_out: int, context_length: int, dropout: float,
                 num_heads: int, qkv_bias: bool = ...) -> None: ...
    def forward(self, x: torch.Tensor, use_cache: bool = ...) -> torch.Tensor: ...

class GroupedQueryAttention(_MultiHead):
    num_kv_groups: int
    group_size: int
    def __init__(self, d_in: int, d_out: int, dropout: float, num_heads: int,
                 num_kv_groups: int, dtype: Optional[torch.dtype] = ...,
                 qkv_bias: bool = ...) -> None: ...
    def forward(self, x: torch.Tensor, use_cache: bool = ...) -> torch.Tensor: ...

class MultiHeadAttentionWithSWA(_MultiHead):
    sliding_window_size: Optional[int]
    def __init__(self, d_in: int, d_out: int, dropout: float, num_heads: int,
                 qkv_bias: bool = ..., sliding_window_size: Optional[int] = ...) -> None: ...
    def forward(self, x: torch.Tensor, use_cache: bool = ...) -> torch.Tensor: ...

class MultiHeadLatentAttention(nn.Module):
    d_out: int
    num_heads: int
    head_dim: int
    latent_dim: int
    W_query: nn.Linear
    W_DKV: nn.Linear
    W_UK: nn.Linear
    W_UV: nn.Linear
    out_proj: nn.Linear
    dropout: nn.Dropout
    cache_c_kv: Optional[torch.Tensor]
    ptr_current_pos: int
    def __init__(self, d_in: int, d_out: int, dropout: float, num_heads: int,
                 qkv_bias: bool = ..., latent_dim: Optional[int] = ...) -> None: ...
    def forward(self, x: torch.Tensor, use_cache: bool = ...) -> torch.Tensor: ...
    def reset_cache(self) -> None: ...

class LayerNorm(nn.Module):
    eps: float
    scale: nn.Parameter
    shift: nn.Parameter
    def __init__(self, emb_dim: int) -> None: ...
    def forward(self, x: torch.Tensor) -> torch.Tensor: ...

class GELU(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor: ...

class FeedForward(nn.Module):
    layers: nn.Sequential
    def __init__(self, cfg: Dict[str, Any]) -> None: ...
    def forward(self, x: torch.Tensor) -> torch.Tensor: ...

class TransformerBlock(nn.Module):
    att: nn.Module
    ff: FeedForward
    norm1: LayerNorm
    norm2: LayerNorm
    drop_shortcut: nn.Dropout
    def __init__(self, cfg: Dict[str, Any]) -> None: ...
    def forward(self, x: torch.Tensor, use_cache: bool = ...) -> torch.Tensor: ...

class GPTModel(nn.Module):
    tok_emb: nn.Embedding
    pos_emb: nn.Embedding
    drop_emb: nn.Dropout
    trf_blocks: nn.ModuleList
    current_pos: int
    final_norm: LayerNorm
    out_head: nn.Linear
    def __init__(self, cfg: Dict[str, Any]) -> None: ...
    def forward(self, in_idx: torch.Tensor, use_cache: bool = ...) -> torch.Tensor: ...
    def reset_kv_cache(self) -> None: ...
