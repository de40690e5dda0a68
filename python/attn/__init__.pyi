from typing import AbstractSet, Collection, ContextManager, Dict, List, Literal, Optional, Sequence, Union

import numpy

import torch

from . import nn as nn

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
def _path(
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
) -> str: ...
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

class Tokenizer:
    name: str
    def __init__(self) -> None: ...
    @classmethod
    def from_files(cls, vocab_json: str, merges_txt: str) -> "Tokenizer": ...
    @property
    def n_vocab(self) -> int: ...
    @property
    def eot_token(self) -> int: ...
    @property
    def special_tokens_set(self) -> AbstractSet[str]: ...
    def encode(self, text: str, *,
               allowed_special: Union[Literal["all"], AbstractSet[str]] = ...,
               disallowed_special: Union[Literal["all"], Collection[str]] = ...) -> List[int]: ...
    def encode_ordinary(self, text: str) -> List[int]: ...
    def encode_batch(self, text: Sequence[str], *, num_threads: int = ...,
                     allowed_special: Union[Literal["all"], AbstractSet[str]] = ...,
                     disallowed_special: Union[Literal["all"], Collection[str]] = ...
                     ) -> List[List[int]]: ...
    def encode_ordinary_batch(self, text: Sequence[str], *, num_threads: int = ...
                              ) -> List[List[int]]: ...
    def encode_to_numpy(self, text: str, *,
                        allowed_special: Union[Literal["all"], AbstractSet[str]] = ...,
                        disallowed_special: Union[Literal["all"], Collection[str]] = ...
                        ) -> numpy.ndarray: ...
    def decode_bytes(self, tokens: Sequence[int]) -> bytes: ...
    def decode(self, tokens: Sequence[int], errors: str = ...) -> str: ...
    def decode_single_token_bytes(self, token: int) -> bytes: ...
    def decode_batch(self, batch: Sequence[Sequence[int]], *, errors: str = ...,
                     num_threads: int = ...) -> List[str]: ...

def get_encoding(name: str = ...) -> Tokenizer: ...
