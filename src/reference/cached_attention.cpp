// Cached causal attention, the maths of incremental decoding (attn/functional.h,
// used by attn/kv_cache.h):
// T_new queries at absolute positions offset + i attend over key/value rows
// 0 .. offset + i of preallocated (B, H, capacity, hd) buffers.
//   s_j = (q_i · k_j) / sqrt(hd)              j = 0 .. offset + i
//   a_j = exp(s_j - max s) / Σ exp(s - max s)
//   out_i = Σ_j a_j v_j
// One query costs O((offset + i) · hd): linear in the number of cached tokens.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <vector>

#include "attn/functional.h"

namespace attn::ref {
namespace {

void check_cached(const Tensor& q, const Tensor& keys, const Tensor& values, int64_t offset) {
  const auto fail = [&](const std::string& why) {
    throw std::invalid_argument(fmt::format(
        "cached_attention_forward: {}: q {}, keys {}, values {}, offset {}", why,
        shape_str(q.shape()), shape_str(keys.shape()), shape_str(values.shape()), offset));
  };
  if (q.dim() != 4 || keys.dim() != 4 || values.dim() != 4) fail("expected 4-D (B, H, T, hd)");
  if (keys.shape() != values.shape()) fail("keys and values differ in shape");
  if (q.size(0) != keys.size(0) || q.size(1) != keys.size(1) || q.size(3) != keys.size(3))
    fail("q and keys differ in B, H or hd");
  if (q.numel() == 0) fail("no queries");
  if (offset < 0) fail("negative offset");
  if (offset + q.size(2) > keys.size(2))
    fail(fmt::format("positions up to {} do not fit the capacity {}", offset + q.size(2) - 1,
                     keys.size(2)));
}

}  // namespace

Tensor cached_attention_forward(const Tensor& q_in, const Tensor& keys_in, const Tensor& values_in,
                                int64_t offset) {
  check_cached(q_in, keys_in, values_in, offset);
  // Read row-major below.
  const Tensor q = q_in.contiguous(), keys = keys_in.contiguous(), values = values_in.contiguous();
  const int64_t B = q.size(0), H = q.size(1), T_new = q.size(2), hd = q.size(3);
  const int64_t capacity = keys.size(2);
  // The divisor of the chapter's `attn_scores / keys.shape[-1]**0.5`, rounded to float.
  const float sqrt_hd = static_cast<float>(std::sqrt(static_cast<double>(hd)));
  Tensor out({B, H, T_new, hd});                                   // (B, H, T_new, hd)
  std::vector<float> scores(static_cast<size_t>(offset + T_new));  // one query's row
  std::vector<double> context(static_cast<size_t>(hd));
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t h = 0; h < H; ++h) {
      const float* K = keys.data() + (b * H + h) * capacity * hd;    // (capacity, hd)
      const float* V = values.data() + (b * H + h) * capacity * hd;  // (capacity, hd)
      for (int64_t i = 0; i < T_new; ++i) {
        const float* q_i = q.data() + ((b * H + h) * T_new + i) * hd;  // (hd)
        const int64_t visible = offset + i + 1;                        // keys 0 .. offset + i
        float max_score = -std::numeric_limits<float>::infinity();
        for (int64_t j = 0; j < visible; ++j) {
          double dot = 0.0;
          for (int64_t c = 0; c < hd; ++c) dot += static_cast<double>(q_i[c]) * K[j * hd + c];
          scores[j] = static_cast<float>(dot) / sqrt_hd;
          max_score = std::max(max_score, scores[j]);
        }
        double denominator = 0.0;
        std::fill(context.begin(), context.end(), 0.0);
        for (int64_t j = 0; j < visible; ++j) {
          const double e = std::exp(static_cast<double>(scores[j]) - max_score);
          denominator += e;
          for (int64_t c = 0; c < hd; ++c) context[c] += e * V[j * hd + c];
        }
        float* out_i = out.data() + ((b * H + h) * T_new + i) * hd;  // (hd)
        for (int64_t c = 0; c < hd; ++c) out_i[c] = static_cast<float>(context[c] / denominator);
      }
    }
  }
  return out;
}

}  // namespace attn::ref
