# The extension module (python/src/binding.cpp). A "ref" is
# (data pointer, dtype name, sizes, strides in elements).
from typing import Optional, Sequence, Tuple

Ref = Tuple[int, str, Sequence[int], Sequence[int]]

def sdpa_forward(q: Ref, k: Ref, v: Ref, out: Ref, lse: Ref, mask: Optional[Ref],
                 alibi: Optional[Ref], is_causal: bool, bottom_right: bool,
                 scale: Optional[float], softcap: float, window_left: int, window_right: int,
                 dropout_p: float, dropout_seed: int, enable_gqa: bool, threads: int) -> None: ...
def sdpa_backward(dout: Ref, q: Ref, k: Ref, v: Ref, out: Ref, lse: Ref, dq: Ref, dk: Ref,
                  dv: Ref, mask: Optional[Ref], alibi: Optional[Ref], is_causal: bool,
                  bottom_right: bool, scale: Optional[float], softcap: float,
                  window_left: int, window_right: int, dropout_p: float, dropout_seed: int,
                  enable_gqa: bool, threads: int) -> None: ...
def sdpa_varlen_forward(q: Ref, k: Ref, v: Ref, out: Ref, lse: Ref, cu_seqlens_q: Sequence[int],
                        cu_seqlens_k: Sequence[int], max_seqlen_q: int, max_seqlen_k: int,
                        alibi: Optional[Ref], is_causal: bool, bottom_right: bool,
                        scale: Optional[float], softcap: float, window_left: int,
                        window_right: int, dropout_p: float, dropout_seed: int,
                        enable_gqa: bool, threads: int) -> None: ...
def sdpa_varlen_backward(dout: Ref, q: Ref, k: Ref, v: Ref, out: Ref, lse: Ref, dq: Ref, dk: Ref,
                         dv: Ref, cu_seqlens_q: Sequence[int], cu_seqlens_k: Sequence[int],
                         max_seqlen_q: int, max_seqlen_k: int, alibi: Optional[Ref],
                         is_causal: bool, bottom_right: bool, scale: Optional[float],
                         softcap: float, window_left: int, window_right: int, dropout_p: float,
                         dropout_seed: int, enable_gqa: bool, threads: int) -> None: ...
def dropout_noise(noise: Ref, dropout_p: float, dropout_seed: int) -> None: ...
def kernel_target() -> str: ...
def max_threads() -> int: ...
