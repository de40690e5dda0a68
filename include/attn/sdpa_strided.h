// attn/sdpa_strided.h - scaled-dot-product attention on memory the caller
// owns: the front door for a framework's tensors. The Python binding hands
// torch tensors over as (data pointer, dtype name, sizes, strides in
// elements); another framework's binding would do the same. Everything is
// checked here, every message starting with the caller's name `who`, before a
// raw problem (attn/sdpa.h) reaches the routed kernels (sdpa_forward_routed,
// ...), which read and write the caller's memory in place.
//
// Shapes as attn/sdpa.h's:
//   batched   q (B, Hq, Tq, D)  k (B, Hkv, Tk, D)  v (B, Hkv, Tk, Dv)  out (B, Hq, Tq, Dv)
//             lse (B, Hq, Tq) float32; attn_mask 4-D, each dim 1 or full: float32
//             additive, or "bool" (a byte per value, nonzero: may attend, read in
//             place, as PyTorch's bool attn_mask); alibi_slopes (Hq) or (B, Hq) float32, last
//             stride 1
//   varlen    q (total_q, Hq, D)  k (total_k, Hkv, D)  v (total_k, Hkv, Dv)
//             out (total_q, Hq, Dv)  lse (Hq, total_q) float32; alibi (Hq) or (nseq, Hq)
// q, k, v, out, dout, dq, dk, dv: one dtype, "float32" or "bfloat16". The
// options are SdpaOptions' (its attn_mask and alibi_slopes tensors unused:
// those come as strided tensors here), checked as the Tensor entry points
// check them. Throws std::invalid_argument "WHO: ..." naming the values.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "attn/sdpa.h"

namespace attn {

// A tensor in the caller's memory. Checked when made: as many strides as
// sizes, every size >= 1, every stride >= 0, a non-null pointer.
class StridedTensor {
 public:
  StridedTensor(const char* who, const char* name, uintptr_t data, std::string dtype,
                std::vector<int64_t> sizes, std::vector<int64_t> strides);

  const char* name() const { return name_; }
  const std::string& dtype() const { return dtype_; }
  const std::vector<int64_t>& sizes() const { return sizes_; }
  const std::vector<int64_t>& strides() const { return strides_; }
  template <class T>
  T* data() const {
    return reinterpret_cast<T*>(data_);
  }
  // Throws "WHO: NAME has sizes (...), expected (...)" or "... has dtype X, expected Y".
  void expect(const std::vector<int64_t>& sizes, const std::string& dtype) const;

 private:
  const char* who_;
  const char* name_;
  uintptr_t data_;
  std::string dtype_;
  std::vector<int64_t> sizes_, strides_;
};

// Writes out and lse.
void sdpa_forward_strided(const char* who, const StridedTensor& q, const StridedTensor& k,
                          const StridedTensor& v, const StridedTensor& out,
                          const StridedTensor& lse, const StridedTensor* attn_mask,
                          const StridedTensor* alibi_slopes, const SdpaOptions& options);
// Writes dq, dk, dv; out and lse are the forward's (same options).
void sdpa_backward_strided(const char* who, const StridedTensor& dout, const StridedTensor& q,
                           const StridedTensor& k, const StridedTensor& v,
                           const StridedTensor& out, const StridedTensor& lse,
                           const StridedTensor& dq, const StridedTensor& dk,
                           const StridedTensor& dv, const StridedTensor* attn_mask,
                           const StridedTensor* alibi_slopes, const SdpaOptions& options);
// The path those take for this call: "fp32 kernel", or kernels::sdpa_bf16_path's
// "AMX", "AVX512-BF16" or "bf16 tiles widened to fp32" (checks as the call would).
std::string sdpa_path_strided(const char* who, const StridedTensor& q, const StridedTensor& k,
                              const StridedTensor& v, const StridedTensor* attn_mask,
                              const StridedTensor* alibi_slopes, const SdpaOptions& options);

// Variable-length packed batches (sdpa_varlen_forward / _backward's raw form):
// cu_seqlens as offsets (0 first, never decreasing, the token count last,
// every length <= its max_seqlen).
void sdpa_varlen_forward_strided(const char* who, const StridedTensor& q, const StridedTensor& k,
                                 const StridedTensor& v, const StridedTensor& out,
                                 const StridedTensor& lse, const std::vector<int64_t>& cu_seqlens_q,
                                 const std::vector<int64_t>& cu_seqlens_k, int64_t max_seqlen_q,
                                 int64_t max_seqlen_k, const StridedTensor* alibi_slopes,
                                 const SdpaOptions& options);
void sdpa_varlen_backward_strided(
    const char* who, const StridedTensor& dout, const StridedTensor& q, const StridedTensor& k,
    const StridedTensor& v, const StridedTensor& out, const StridedTensor& lse,
    const StridedTensor& dq, const StridedTensor& dk, const StridedTensor& dv,
    const std::vector<int64_t>& cu_seqlens_q, const std::vector<int64_t>& cu_seqlens_k,
    int64_t max_seqlen_q, int64_t max_seqlen_k, const StridedTensor* alibi_slopes,
    const SdpaOptions& options);

// noise (B, H, Tq, Tk) float32: the dropout factors Z (0 or 1/(1-p)) the fused
// kernels apply at (b, h, i, j) for dropout_p and dropout_seed (all 1 for p = 0).
void sdpa_dropout_noise_strided(const char* who, const StridedTensor& noise, float dropout_p,
                                uint64_t dropout_seed);

}  // namespace attn
