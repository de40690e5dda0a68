// sdpa_common.h - what the batched (sdpa.cpp) and the packed variable-length
// (sdpa_varlen.cpp) Tensor entry points of attn/sdpa.h check and set up alike.
// Every message starts with the entry point's name, `who`.
#pragma once

#include <fmt/format.h>

#include <cmath>
#include <stdexcept>
#include <string>
#include <utility>

#include "attn/sdpa.h"

namespace attn::detail::sdpa {

[[noreturn]] inline void fail(const char* who, const std::string& what) {
  throw std::invalid_argument(fmt::format("{}: {}", who, what));
}

inline void check_float32(const char* who, const char* name, const Tensor& t) {
  if (t.dtype() != DType::kFloat32)
    fail(who,
         fmt::format("{} has dtype {}; only float32 is supported", name, dtype_name(t.dtype())));
}

// q, k, v: float32, or all three bfloat16 (then dout and out too).
inline void check_dtypes(const char* who, const Tensor& q, const Tensor& k, const Tensor& v) {
  for (const auto& [name, t] :
       {std::pair<const char*, const Tensor*>{"q", &q}, {"k", &k}, {"v", &v}})
    if (t->dtype() != DType::kFloat32 && t->dtype() != DType::kBFloat16)
      fail(who, fmt::format("{} has dtype {}; q, k and v must be float32 or bfloat16", name,
                            dtype_name(t->dtype())));
  if (k.dtype() != q.dtype() || v.dtype() != q.dtype())
    fail(who, fmt::format("q, k and v must have the same dtype, got q {}, k {}, v {}",
                          dtype_name(q.dtype()), dtype_name(k.dtype()), dtype_name(v.dtype())));
}

// dout and out have q's dtype.
inline void check_same_dtype(const char* who, const char* name, const Tensor& t, const Tensor& q) {
  if (t.dtype() != q.dtype())
    fail(who, fmt::format("{} has dtype {} but q, k and v have {}", name, dtype_name(t.dtype()),
                          dtype_name(q.dtype())));
}

// Hq query heads on Hkv key/value heads: equal, or enable_gqa and a multiple.
inline void check_heads(const char* who, const SdpaOptions& o, int64_t Hq, int64_t Hkv) {
  if (Hq == Hkv) return;
  if (!o.enable_gqa)
    fail(who, fmt::format(
                  "q has {} heads and k, v have {}: set enable_gqa for grouped-query attention",
                  Hq, Hkv));
  if (Hq % Hkv != 0)
    fail(who, fmt::format("enable_gqa: q's heads ({}) must be a multiple of k's and v's ({})", Hq,
                          Hkv));
}

// dropout_p, scale, the window and softcap.
inline void check_scalar_options(const char* who, const SdpaOptions& o) {
  if (!(o.dropout_p >= 0.0f && o.dropout_p < 1.0f))
    fail(who, fmt::format("dropout_p must be in [0, 1), got {}", o.dropout_p));
  if (o.scale && !std::isfinite(*o.scale))
    fail(who, fmt::format("scale must be finite, got {}", *o.scale));
  if (o.window_left < -1 || o.window_right < -1)
    fail(who, fmt::format("window_left ({}) and window_right ({}) must be -1 (unbounded) or >= 0",
                          o.window_left, o.window_right));
  if (!(o.softcap >= 0.0f) || !std::isfinite(o.softcap))
    fail(who, fmt::format("softcap must be 0 (off) or a finite value > 0, got {}", o.softcap));
}

// The options' part of the raw problem (head dim D for the default scale).
template <class T>
void set_options(SdpaProblemT<T>& p, const SdpaOptions& o, int64_t D) {
  p.is_causal = o.is_causal;
  p.causal_alignment = o.causal_alignment;
  p.scale = o.scale ? *o.scale : 1.0f / std::sqrt(float(D));
  p.softcap = o.softcap;
  p.window_left = o.window_left, p.window_right = o.window_right;
  p.dropout_p = o.dropout_p;
  p.dropout_seed = o.dropout_seed;
}

// The kernels read rows of D (or Dv) elements: last stride 1 (any stride when the dim is 1).
inline bool has_rows(const Tensor& t) { return t.size(-1) == 1 || t.stride(-1) == 1; }
inline Tensor rows_contiguous(const Tensor& t) { return has_rows(t) ? t : t.contiguous(); }

// bf16 inputs on the reference: it runs on their exact fp32 widening.
inline bool is_bf16_reference(const Tensor& q, const SdpaOptions& options) {
  return q.dtype() == DType::kBFloat16 && options.backend == SdpaBackend::kReference;
}

}  // namespace attn::detail::sdpa
