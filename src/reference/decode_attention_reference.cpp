// Decode attention, the specification (attn/decode_attention.h): Tq new
// queries, the last Tq positions of the sequence, over the first `length`
// rows of a (B, Hkv, capacity, D) key/value cache; query head h reads kv head
// h / (Hq / Hkv). For query t at position p = length - Tq + t:
//   visible keys  j in [max(0, p - window_left), p]   (window_left = -1: [0, p])
//   s_j = scale · q · k_j
//   out = Σ_j exp(s_j - max s) · v_j / Σ_j exp(s_j - max s)
// One row at a time, keys in order, all in fp32 (bf16 inputs widened exactly,
// out rounded to bf16 once). The kernel (src/kernels/decode_attention.cpp)
// computes the same by chunks of keys combined by log-sum-exp.
#include "attn/decode_attention.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <vector>

#include "attn/tensor.h"

namespace attn {

DecodeProblem validated(const DecodeProblem& p) {
  const auto fail = [&](const char* why) {
    throw std::invalid_argument(fmt::format(
        "decode_attention: {}; got B = {}, Hq = {}, Hkv = {}, Tq = {}, length = {}, capacity = "
        "{}, D = {}, window_left = {}, q_stride = {}, o_stride = {}, q_batch_stride = {}, "
        "o_batch_stride = {}, scale = {}",
        why, p.B, p.Hq, p.Hkv, p.Tq, p.length, p.capacity, p.D, p.window_left, p.q_stride,
        p.o_stride, p.q_batch_stride, p.o_batch_stride, p.scale));
  };
  if (p.B < 1 || p.Hq < 1 || p.Hkv < 1 || p.D < 1) fail("need B, Hq, Hkv, D >= 1");
  if (p.Hq % p.Hkv != 0) fail("need Hq a multiple of Hkv");
  if (p.Tq < 1 || p.Tq > kMaxDecodeQueries)
    fail(fmt::format("need 1 <= Tq <= {}", kMaxDecodeQueries).c_str());
  if (p.length < p.Tq || p.length > p.capacity) fail("need Tq <= length <= capacity");
  if (p.window_left < -1) fail("need window_left = -1 (unbounded) or >= 0");
  if (!std::isfinite(p.scale)) fail("need a finite scale");
  DecodeProblem r = p;
  if (r.q_stride == 0) r.q_stride = p.Hq * p.D;
  if (r.o_stride == 0) r.o_stride = p.Hq * p.D;
  if (r.q_stride < p.Hq * p.D || r.o_stride < p.Hq * p.D)
    fail("need q_stride and o_stride 0 (packed) or >= Hq·D");
  if (r.q_batch_stride == 0) r.q_batch_stride = p.Tq * r.q_stride;
  if (r.o_batch_stride == 0) r.o_batch_stride = p.Tq * r.o_stride;
  if (r.q_batch_stride < p.Tq * r.q_stride || r.o_batch_stride < p.Tq * r.o_stride)
    fail("need q_batch_stride and o_batch_stride 0 (packed) or >= Tq times the row stride");
  return r;
}

namespace ref {
namespace {

float widen(float x) { return x; }
float widen(BFloat16 x) { return to_float(x); }
void store(float* o, float x) { *o = x; }
void store(BFloat16* o, float x) { *o = to_bfloat16(x); }

template <class T>
void forward(T* out, const T* q, const T* keys, const T* values, const DecodeProblem& p_in) {
  const DecodeProblem p = validated(p_in);
  const int64_t G = p.Hq / p.Hkv, D = p.D;
  std::vector<float> s, o(static_cast<size_t>(D));
  for (int64_t b = 0; b < p.B; ++b) {
    for (int64_t t = 0; t < p.Tq; ++t) {
      const int64_t pos = p.length - p.Tq + t;  // this query's position
      const int64_t j0 = p.window_left < 0 ? 0 : std::max<int64_t>(0, pos - p.window_left);
      for (int64_t h = 0; h < p.Hq; ++h) {
        const T* qh = q + b * p.q_batch_stride + t * p.q_stride + h * D;
        const int64_t kv = (b * p.Hkv + h / G) * p.capacity * D;  // this head's cache
        s.assign(size_t(pos + 1 - j0), 0.0f);
        float m = -std::numeric_limits<float>::infinity();
        for (int64_t j = j0; j <= pos; ++j) {
          float dot = 0.0f;
          for (int64_t i = 0; i < D; ++i) dot += widen(qh[i]) * widen(keys[kv + j * D + i]);
          s[size_t(j - j0)] = p.scale * dot;
          m = std::max(m, s[size_t(j - j0)]);
        }
        float l = 0.0f;
        std::fill(o.begin(), o.end(), 0.0f);
        for (int64_t j = j0; j <= pos; ++j) {
          const float e = std::exp(s[size_t(j - j0)] - m);
          l += e;
          for (int64_t i = 0; i < D; ++i) o[size_t(i)] += e * widen(values[kv + j * D + i]);
        }
        T* oh = out + b * p.o_batch_stride + t * p.o_stride + h * D;
        for (int64_t i = 0; i < D; ++i) store(oh + i, o[size_t(i)] / l);
      }
    }
  }
}

}  // namespace

void decode_attention_forward(float* out, const float* q, const float* keys, const float* values,
                              const DecodeProblem& p) {
  forward(out, q, keys, values, p);
}

void decode_attention_forward_bf16(BFloat16* out, const BFloat16* q, const BFloat16* keys,
                                   const BFloat16* values, const DecodeProblem& p) {
  forward(out, q, keys, values, p);
}

}  // namespace ref
}  // namespace attn
