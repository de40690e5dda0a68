// The book's GroupedQueryAttention and MultiHeadAttentionWithSWA on attn's
// scaled-dot-product attention (src/nn/sdpa_attention.h).
#include "nn/sdpa_attention.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>

#include "attn/decode_kernels.h"
#include "attn/functional.h"
#include "attn/ops.h"
#include "nn/checks.h"

namespace attn::nn::detail {
namespace {

const Tensor* bias_or_null(const Linear& layer) {
  return layer.options().bias ? &layer.bias.value : nullptr;
}

// y (B, T, n·hd) viewed as (B, n, T, hd): token-major, no copy.
Tensor heads_view(const Tensor& y, int64_t n, int64_t hd) {
  const int64_t B = y.size(0), T = y.size(1);
  return y.view({B, T, n, hd}).transpose(1, 2);
}

// (B, n, T, hd) -> (B, T, n·hd), contiguous.
Tensor merge_heads(const Tensor& t) {
  const int64_t B = t.size(0), n = t.size(1), T = t.size(2), hd = t.size(3);
  return t.transpose(1, 2).contiguous().view({B, T, n * hd});
}

// Token rows up to which a cached step's products are GEMVs (as generate.cpp's).
constexpr int64_t kGemvRows = 4;

const char* name_of(const MultiHeadAttention& m) {
  return m.variant() == AttentionVariant::kGroupedQuery ? "GroupedQueryAttention"
                                                        : "MultiHeadAttentionWithSWA";
}

}  // namespace

SdpaOptions variant_sdpa_options(const MultiHeadAttention& m) {
  SdpaOptions o;
  o.is_causal = true;
  o.causal_alignment = CausalAlignment::kBottomRight;
  o.enable_gqa = m.num_kv_heads() != m.options().num_heads;
  o.window_left = m.sliding_window_size() > 0 ? m.sliding_window_size() - 1 : -1;
  o.backend = m.options().backend == AttentionBackend::kReference ? SdpaBackend::kReference
                                                                  : SdpaBackend::kFused;
  return o;  // scale: 1 / sqrt(head_dim), the book's keys.shape[-1]**0.5
}

Tensor SdpaAttention::forward(const Tensor& x) {
  const int64_t H = m_.options().num_heads, G = m_.num_kv_heads(), hd = m_.head_dim();
  opts_ = variant_sdpa_options(m_);
  if (m_.dropout.is_active()) {  // Philox masks keyed by one draw per forward
    opts_.dropout_p = m_.dropout.options().p;
    opts_.dropout_seed = m_.dropout.draw_seed();
  }
  q_ = heads_view(m_.W_query.forward(x), H, hd);  // (B, H, T, hd)
  k_ = heads_view(m_.W_key.forward(x), G, hd);    // (B, G, T, hd)
  v_ = heads_view(m_.W_value.forward(x), G, hd);  // (B, G, T, hd)
  fwd_ = scaled_dot_product_attention_forward(q_, k_, v_, opts_);  // out (B, H, T, hd)
  weights_ = Tensor();
  has_forward_ = true;
  last_ = opts_.backend == SdpaBackend::kReference ? AttentionBackend::kReference
                                                   : AttentionBackend::kFused;
  return m_.out_proj.forward(merge_heads(fwd_.out));  // (B, T, d_out)
}

const Tensor& SdpaAttention::attention_weights() {
  if (!has_forward_) {
    throw std::logic_error(fmt::format("{}: attention_weights() called before forward()",
                                       name_of(m_)));
  }
  if (!weights_.empty()) return weights_;
  const int64_t B = q_.size(0), H = q_.size(1), T = q_.size(2), hd = q_.size(3);
  const int64_t group = H / k_.size(1), w = m_.sliding_window_size();
  const Tensor q = q_.contiguous(), k = k_.contiguous();  // (B, H, T, hd), (B, G, T, hd)
  const float scale = 1.0f / std::sqrt(float(hd));
  Tensor weights({B, H, T, T});  // zeros outside the band
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t h = 0; h < H; ++h) {
      const float* kh = k.data() + (b * k.size(1) + h / group) * T * hd;
      for (int64_t i = 0; i < T; ++i) {
        const float* qi = q.data() + ((b * H + h) * T + i) * hd;
        float* row = weights.data() + ((b * H + h) * T + i) * T;
        const int64_t first = w > 0 ? std::max<int64_t>(0, i - w + 1) : 0;
        float top = -std::numeric_limits<float>::infinity();
        for (int64_t j = first; j <= i; ++j) {
          float s = 0.0f;
          for (int64_t d = 0; d < hd; ++d) s += qi[d] * kh[j * hd + d];
          row[j] = s * scale;
          top = std::max(top, row[j]);
        }
        double sum = 0.0;
        for (int64_t j = first; j <= i; ++j) sum += (row[j] = std::exp(row[j] - top));
        for (int64_t j = first; j <= i; ++j) row[j] = static_cast<float>(row[j] / sum);
      }
    }
  }
  weights_ = weights;
  return weights_;
}

Tensor SdpaAttention::backward(const Tensor& dy) {
  const int64_t B = q_.size(0), T = q_.size(2);
  check_grad(name_of(m_), dy, {B, T, m_.options().d_out});
  const int64_t H = m_.options().num_heads, hd = m_.head_dim();
  const Tensor dcontext = heads_view(m_.out_proj.backward(dy).contiguous(), H, hd);  // (B, H, T, hd)
  const SdpaGrads g =
      scaled_dot_product_attention_backward(dcontext, q_, k_, v_, fwd_.out, fwd_.lse, opts_);
  Tensor dx = m_.W_query.backward(merge_heads(g.dq));  // (B, T, d_in)
  dx += m_.W_key.backward(merge_heads(g.dk));
  dx += m_.W_value.backward(merge_heads(g.dv));
  return dx;
}

Tensor forward_cached_sdpa(const MultiHeadAttention& m, const Tensor& x_new, KVCache& cache,
                           gemm::Engine engine) {
  const MultiHeadAttentionOptions& o = m.options();
  const int64_t H = o.num_heads, G = m.num_kv_heads(), hd = m.head_dim();
  if (cache.num_heads != G || cache.head_dim != hd || cache.context_length != o.context_length) {
    throw std::invalid_argument(fmt::format(
        "forward_cached: cache made for {} key/value heads, head_dim {}, context_length {} but "
        "the {} has {}, {}, {}",
        cache.num_heads, cache.head_dim, cache.context_length, name_of(m), G, hd,
        o.context_length));
  }
  const Shape expected{cache.batch, G, cache.context_length, hd};
  if (cache.keys.dtype() != DType::kFloat32 || cache.values.dtype() != DType::kFloat32 ||
      cache.keys.shape() != expected || cache.values.shape() != expected) {
    throw std::invalid_argument(fmt::format(
        "forward_cached: cache buffers keys {} {}, values {} {} are not the float32 {} of its "
        "sizes",
        dtype_name(cache.keys.dtype()), shape_str(cache.keys.shape()),
        dtype_name(cache.values.dtype()), shape_str(cache.values.shape()), shape_str(expected)));
  }
  if (cache.length < 0 || cache.length > cache.context_length) {
    throw std::invalid_argument(
        fmt::format("forward_cached: cache length {} outside 0 .. context_length {}", cache.length,
                    cache.context_length));
  }
  if (m.is_training() && m.dropout.options().p > 0.0f) {
    throw std::invalid_argument(
        fmt::format("forward_cached: the module is in training mode with dropout {}; call eval() "
                    "first (generation applies no dropout)",
                    m.dropout.options().p));
  }
  check_btd("forward_cached", x_new, {"d_in", o.d_in});
  const int64_t B = x_new.size(0), T_new = x_new.size(1), L = cache.length;
  if (B != cache.batch) {
    throw std::invalid_argument(fmt::format(
        "forward_cached: input batch {} does not match the cache's batch {}", B, cache.batch));
  }
  if (L + T_new > cache.context_length) {
    throw std::invalid_argument(fmt::format(
        "forward_cached: {} new token{} at positions {}..{} would exceed context_length {} "
        "(the cache holds {})",
        T_new, T_new == 1 ? "" : "s", L, L + T_new - 1, cache.context_length, L));
  }
  // x (B, T_new, in) · Wᵀ + b: with the fast engine and a few rows (decoding)
  // a GEMV that reads each weight once (kernels::gemv_forward), else the GEMM.
  const auto linear = [&](const Tensor& x, const Linear& layer) {
    const int64_t M = x.size(0) * x.size(1);
    const Tensor* bias = bias_or_null(layer);
    if (engine != gemm::Engine::kFast || M > kGemvRows)
      return ref::linear_forward(x, layer.weight.value, bias, engine);
    const Tensor xc = x.contiguous(), w = layer.weight.value.contiguous();
    const int64_t N = w.size(0), K = w.size(1);
    Tensor y({x.size(0), x.size(1), N});
    kernels::gemv_forward(y.data(), N, xc.data(), K, w.data(),
                          bias != nullptr ? bias->data() : nullptr, M, N, K);
    return y;
  };
  const auto project = [&](const Linear& layer, int64_t n) {  // (B, T_new, n·hd) -> (B, n, T_new, hd)
    return heads_view(linear(x_new, layer), n, hd);
  };
  const Tensor q = project(m.W_query, H);  // (B, H, T_new, hd)
  cache.keys.slice(2, L, L + T_new).copy_(project(m.W_key, G));
  cache.values.slice(2, L, L + T_new).copy_(project(m.W_value, G));
  // The keys any new query may see: from the first one's window on (all with w = 0).
  const int64_t w = m.sliding_window_size();
  const int64_t first = w > 0 ? std::max<int64_t>(0, L - (w - 1)) : 0;
  SdpaOptions opts = variant_sdpa_options(m);  // bottom-right: query t is at position L + t
  const Tensor context = scaled_dot_product_attention(
      q, cache.keys.slice(2, first, L + T_new), cache.values.slice(2, first, L + T_new),
      opts);  // (B, H, T_new, hd)
  cache.length = L + T_new;
  return linear(merge_heads(context), m.out_proj);  // (B, T_new, d_out)
}

}  // namespace attn::nn::detail
