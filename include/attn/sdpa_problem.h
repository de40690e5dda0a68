// attn/sdpa_problem.h - scaled-dot-product attention as a raw problem:
// pointers, sizes and strides, the one description every attention call takes
// from the entry points (attn/sdpa.h: the Tensor functions, the routed raw
// calls; attn/sdpa_strided.h: a framework's tensors) down to the plain
// reference (src/reference/sdpa_reference.cpp) and the fused kernel
// (src/kernels/sdpa_kernel.cpp). What it computes, and every option, is
// attn/sdpa.h's; the entry points check a problem where they build it, and
// nothing below them checks or renames it again.
#pragma once

#include <cstdint>
#include <optional>

#include "attn/bfloat16.h"

namespace attn {

// Where the causal diagonal lies (attn/sdpa.h: δ = 0 or Tk - Tq).
enum class CausalAlignment : uint8_t {
  kTopLeft,      // PyTorch's is_causal
  kBottomRight,  // FlashAttention 2's causal
};

// ---- the raw layer: pointers, sizes and strides --------------------------------------
// What the entry points hand to the reference and the kernel, after their
// checks (which are not repeated here). T is the element type of q, k,
// v, out, dout, dq, dk, dv: float, or BFloat16 (the kernel only; lse, the
// mask and the ALiBi slopes stay float). Strides are in elements.
struct SdpaStrides {
  int64_t b = 0, h = 0, t = 0, d = 1;  // for a mask: b, h, query i, key j
};

template <class T>
struct SdpaProblemT {
  int64_t B = 1, Hq = 1, Hkv = 1, Tq = 1, Tk = 1, D = 1, Dv = 1;
  const T* q = nullptr;  // (B, Hq, Tq, D)
  const T* k = nullptr;  // (B, Hkv, Tk, D)
  const T* v = nullptr;  // (B, Hkv, Tk, Dv)
  SdpaStrides q_strides, k_strides, v_strides;
  const float* mask = nullptr;  // additive, read at b·s.b + h·s.h + i·s.t + j·s.d (0 broadcasts)
  // Or a boolean mask, PyTorch's bool attn_mask read where it lies (a byte per
  // value, nonzero: may attend), at the same strides; at most one of the two.
  const uint8_t* bool_mask = nullptr;
  SdpaStrides mask_strides;
  const float* alibi_slopes = nullptr;  // slope of (b, h) at b·alibi_b_stride + h
  int64_t alibi_b_stride = 0;
  bool is_causal = false;
  CausalAlignment causal_alignment = CausalAlignment::kTopLeft;
  float scale = 1.0f;  // resolved (no default here)
  float softcap = 0.0f;
  int64_t window_left = -1, window_right = -1;
  float dropout_p = 0.0f;
  uint64_t dropout_seed = 0;
  // A variable-length packed batch (sdpa_varlen_*) when set: B sequences,
  // sequence b at query rows [cu_seqlens_q[b], cu_seqlens_q[b + 1]) and key/value
  // rows [cu_seqlens_k[b], cu_seqlens_k[b + 1]) of the t axes; Tq, Tk are the
  // totals; the b strides are not read (the mask is unused: nullptr).
  const int64_t* cu_seqlens_q = nullptr;  // (B + 1)
  const int64_t* cu_seqlens_k = nullptr;  // (B + 1)
};

// The output side: out (B, Hq, Tq, Dv) with its strides, lse (B, Hq, Tq) with its
// (b, h, t) strides: none means contiguous, or (Hq, Tq) for a varlen problem.
template <class T>
struct SdpaOutputT {
  T* out = nullptr;
  SdpaStrides out_strides;
  float* lse = nullptr;
  std::optional<SdpaStrides> lse_strides = std::nullopt;
};

// The backward's tensors: dout and out (B, Hq, Tq, Dv) with their strides, lse
// (B, Hq, Tq) contiguous; dq, dk, dv are written (not accumulated) with theirs.
template <class T>
struct SdpaBackwardIOT {
  const T* dout = nullptr;
  SdpaStrides dout_strides;
  const T* out = nullptr;
  SdpaStrides out_strides;
  const float* lse = nullptr;
  std::optional<SdpaStrides> lse_strides = std::nullopt;  // as SdpaOutputT's
  T* dq = nullptr;
  T* dk = nullptr;
  T* dv = nullptr;
  SdpaStrides dq_strides, dk_strides, dv_strides;
};

using SdpaProblem = SdpaProblemT<float>;
using SdpaOutput = SdpaOutputT<float>;
using SdpaBackwardIO = SdpaBackwardIOT<float>;
using SdpaProblemBf16 = SdpaProblemT<BFloat16>;
using SdpaOutputBf16 = SdpaOutputT<BFloat16>;
using SdpaBackwardIOBf16 = SdpaBackwardIOT<BFloat16>;

// lse's (b, h, t) strides: as given, else contiguous (B, Hq, Tq), or (Hq, Tq) with
// b stride 0 for a varlen problem.
template <class T>
SdpaStrides sdpa_lse_strides(const std::optional<SdpaStrides>& given, const SdpaProblemT<T>& p) {
  if (given) return *given;
  if (p.cu_seqlens_q) return {0, p.Tq, 1, 1};  // (Hq, total_q)
  return {p.Hq * p.Tq, p.Tq, 1, 1};            // (B, Hq, Tq)
}

// Sequence b of a varlen problem as a batched problem of its own: Tq, Tk its
// lengths, every pointer moved to its first row, every b stride 0 and no
// cu_seqlens. B stays the number of sequences and the view is run as batch b:
// the b strides being 0, b picks only its Philox counter and its row of
// (nseq, Hq) ALiBi slopes. T = float or BFloat16.
namespace detail {
// Row t of a (b, h, t) strided buffer's t axis as the first row of a view whose b stride is 0.
template <class U>
U* sdpa_rows_from(U* base, SdpaStrides& s, int64_t t) {
  s.b = 0;
  return base ? base + t * s.t : nullptr;
}
}  // namespace detail

template <class T>
SdpaProblemT<T> sdpa_sequence(const SdpaProblemT<T>& p, int64_t b) {
  const int64_t q0 = p.cu_seqlens_q[b], k0 = p.cu_seqlens_k[b];
  SdpaProblemT<T> s = p;
  s.Tq = p.cu_seqlens_q[b + 1] - q0;
  s.Tk = p.cu_seqlens_k[b + 1] - k0;
  s.q = detail::sdpa_rows_from(p.q, s.q_strides, q0);
  s.k = detail::sdpa_rows_from(p.k, s.k_strides, k0);
  s.v = detail::sdpa_rows_from(p.v, s.v_strides, k0);
  s.mask = nullptr;
  s.bool_mask = nullptr;
  s.cu_seqlens_q = s.cu_seqlens_k = nullptr;
  return s;
}

template <class T>
SdpaOutputT<T> sdpa_sequence(const SdpaOutputT<T>& o, const SdpaProblemT<T>& p, int64_t b) {
  const int64_t q0 = p.cu_seqlens_q[b];
  SdpaOutputT<T> s = o;
  s.out = detail::sdpa_rows_from(o.out, s.out_strides, q0);
  SdpaStrides ls = sdpa_lse_strides(o.lse_strides, p);
  s.lse = detail::sdpa_rows_from(o.lse, ls, q0);
  s.lse_strides = ls;
  return s;
}

template <class T>
SdpaBackwardIOT<T> sdpa_sequence(const SdpaBackwardIOT<T>& io, const SdpaProblemT<T>& p,
                                 int64_t b) {
  const int64_t q0 = p.cu_seqlens_q[b], k0 = p.cu_seqlens_k[b];
  SdpaBackwardIOT<T> s = io;
  s.dout = detail::sdpa_rows_from(io.dout, s.dout_strides, q0);
  s.out = detail::sdpa_rows_from(io.out, s.out_strides, q0);
  SdpaStrides ls = sdpa_lse_strides(io.lse_strides, p);
  s.lse = detail::sdpa_rows_from(io.lse, ls, q0);
  s.lse_strides = ls;
  s.dq = detail::sdpa_rows_from(io.dq, s.dq_strides, q0);
  s.dk = detail::sdpa_rows_from(io.dk, s.dk_strides, k0);
  s.dv = detail::sdpa_rows_from(io.dv, s.dv_strides, k0);
  return s;
}

namespace ref {
// The specification: one query row at a time, scores in fp32, any strides.
// fp32 only (bf16 callers widen first: the Tensor functions of attn/sdpa.h do).
void sdpa_forward(const SdpaOutput& o, const SdpaProblem& p);
void sdpa_backward(const SdpaBackwardIO& io, const SdpaProblem& p);
}  // namespace ref

namespace kernels {
// The fused kernel (Highway dispatch, OpenMP). Needs stride d = 1 on q, k, v,
// out, dout, dq, dk, dv; throws std::invalid_argument otherwise.
void sdpa_forward(const SdpaOutput& o, const SdpaProblem& p);
void sdpa_backward(const SdpaBackwardIO& io, const SdpaProblem& p);
// bfloat16: the same tiles, each bf16 tile of q, k, v, dout (and out) widened
// exactly to fp32 as it is loaded (no widened copy of a whole tensor); scores,
// softmax, lse and every accumulator fp32; out, dq, dk, dv rounded to bf16
// once, at the end.
void sdpa_forward(const SdpaOutputBf16& o, const SdpaProblemBf16& p);
void sdpa_backward(const SdpaBackwardIOBf16& io, const SdpaProblemBf16& p);
// The SIMD target it runs ("AVX3", "AVX2", ...); flash_attention_use_target
// (attn/kernels.h) chooses for it too.
const char* sdpa_target();
// The dropout noise the kernels apply, materialised: noise[b·s.b + h·s.h +
// i·s.t + j·s.d] = Z of (b, h, i, j), 0 or 1/(1-dropout_p) (Philox counters as
// attn/kernels.h describes; all ones when dropout_p = 0), for B x H x Tq x Tk.
void sdpa_dropout_noise(float* noise, const SdpaStrides& s, int64_t B, int64_t H, int64_t Tq,
                        int64_t Tk, float dropout_p, uint64_t dropout_seed);
}  // namespace kernels

}  // namespace attn
