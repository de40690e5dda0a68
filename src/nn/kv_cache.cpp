// The key/value cache of MultiHeadAttention for generating one token at a time
// (attn/kv_cache.h): a thin layer that projects the new tokens, appends their
// keys and values, and calls ref::cached_attention_forward (with the fast
// engine, a prefill of an empty cache runs the flash kernel instead, and new
// tokens after it the flash-decoding kernel, kernels::decode_attention_forward,
// with GEMV projections for one token).
#include "attn/kv_cache.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "attn/decode_attention.h"
#include "attn/decode_kernels.h"
#include "attn/functional.h"
#include "attn/kernels.h"
#include "attn/ops.h"
#include "nn/checks.h"
#include "nn/sdpa_attention.h"

namespace attn::nn {
namespace {

const Tensor* bias_or_null(const Linear& layer) {
  return layer.options().bias ? &layer.bias.value : nullptr;
}

// x (B, T, d_in) through one projection, heads to the front: (B, H, T, hd).
// The parameters are read directly (ref::linear_forward, not Linear::forward),
// so the Linear keeps the input its last forward() saved for backward().
Tensor project_heads(const Linear& layer, const Tensor& x, int64_t H, int64_t hd,
                     gemm::Engine engine) {
  const int64_t B = x.size(0), T = x.size(1);
  const Tensor y =
      ref::linear_forward(x, layer.weight.value, bias_or_null(layer), engine);  // (B, T, d_out)
  return transpose(y.reshape({B, T, H, hd}), 1, 2);                             // (B, H, T, hd)
}

// Copies rows [0, T_new) of src (B, H, T_new, hd) into rows [start, start + T_new)
// of dst (B, H, capacity, hd).
void write_rows(Tensor& dst, const Tensor& src, int64_t start) {
  dst.slice(2, start, start + src.size(2))
      .copy_(src);  // a strided view of the cache, written in place
}

void check_cache_matches(const MultiHeadAttention& mha, const KVCache& cache) {
  const MultiHeadAttentionOptions& o = mha.options();
  if (cache.num_heads != o.num_heads || cache.head_dim != mha.head_dim() ||
      cache.context_length != o.context_length) {
    throw std::invalid_argument(fmt::format(
        "forward_cached: cache made for num_heads {}, head_dim {}, context_length {} but the "
        "module has num_heads {}, head_dim {}, context_length {}",
        cache.num_heads, cache.head_dim, cache.context_length, o.num_heads, mha.head_dim(),
        o.context_length));
  }
  if (cache.keys.dtype() != DType::kFloat32 || cache.values.dtype() != DType::kFloat32) {
    throw std::invalid_argument(fmt::format(
        "forward_cached: the cache's buffers are {}; a MultiHeadAttention's cache is float32 "
        "(bf16 caches belong to a bf16 GPT's make_gpt_kv_cache)",
        dtype_name(cache.keys.dtype())));
  }
  const Shape expected{cache.batch, cache.num_heads, cache.context_length, cache.head_dim};
  if (cache.keys.shape() != expected || cache.values.shape() != expected) {
    throw std::invalid_argument(fmt::format(
        "forward_cached: cache buffers keys {}, values {} are not the {} of its sizes",
        shape_str(cache.keys.shape()), shape_str(cache.values.shape()), shape_str(expected)));
  }
  if (cache.length < 0 || cache.length > cache.context_length) {
    throw std::invalid_argument(
        fmt::format("forward_cached: cache length {} outside 0 .. context_length {}", cache.length,
                    cache.context_length));
  }
}

}  // namespace

void KVCache::reset() {
  length = 0;
  // float32 or bf16 buffers: zero bits are 0.0 in both.
  for (Tensor* t : {&keys, &values}) {
    if (t->numel() == 0) continue;
    if (t->dtype() == DType::kBFloat16) {
      std::fill_n(t->data_ptr<BFloat16>(), t->numel(), BFloat16{});
    } else {
      std::fill(t->values().begin(), t->values().end(), 0.0f);
    }
  }
}

KVCache make_kv_cache(const MultiHeadAttention& mha, int64_t batch) {
  detail::check_positive("make_kv_cache", "batch", batch);
  const MultiHeadAttentionOptions& o = mha.options();
  KVCache cache;
  cache.batch = batch;
  cache.num_heads = mha.num_kv_heads();  // GroupedQueryAttention: its num_kv_groups
  cache.head_dim = mha.head_dim();
  cache.context_length = o.context_length;
  const Shape shape{batch, cache.num_heads, o.context_length, mha.head_dim()};
  cache.keys = Tensor::zeros(shape);    // (B, H, context_length, hd)
  cache.values = Tensor::zeros(shape);  // (B, H, context_length, hd)
  return cache;
}

Tensor forward_cached(const MultiHeadAttention& mha, const Tensor& x_new, KVCache& cache,
                      gemm::Engine engine) {
  if (mha.variant() != AttentionVariant::kChapter)  // GQA, SWA: attn/sdpa.h
    return detail::forward_cached_sdpa(mha, x_new, cache, engine);
  const MultiHeadAttentionOptions& o = mha.options();
  check_cache_matches(mha, cache);
  if (mha.is_training() && mha.dropout.options().p > 0.0f) {
    throw std::invalid_argument(
        fmt::format("forward_cached: the module is in training mode with dropout {}; call eval() "
                    "first (generation applies no dropout)",
                    mha.dropout.options().p));
  }
  detail::check_btd("forward_cached", x_new, {"d_in", o.d_in});
  const int64_t B = x_new.size(0), T_new = x_new.size(1), H = o.num_heads, hd = mha.head_dim();
  if (B != cache.batch) {
    throw std::invalid_argument(fmt::format(
        "forward_cached: input batch {} does not match the cache's batch {}", B, cache.batch));
  }
  if (cache.length + T_new > cache.context_length) {
    throw std::invalid_argument(fmt::format(
        "forward_cached: {} new token{} at positions {}..{} would exceed context_length {} "
        "(the cache holds {})",
        T_new, T_new == 1 ? "" : "s", cache.length, cache.length + T_new - 1, cache.context_length,
        cache.length));
  }

  // RoPE (options().rope) of token-major q or k, t (B, T, H·hd) or (B, H·hd) for
  // T = 1, in place, its tokens at positions start .. start + T - 1.
  const RopeParams* rope = o.rope.get();
  const auto rotate = [&](Tensor& t, int64_t b, int64_t T, int64_t start) {
    if (rope == nullptr) return;
    Tensor heads = transpose(t.view({b, T, H, hd}), 1, 2);  // (B, H, T, hd), a view
    apply_rope_(heads, rope->cos, rope->sin, {.position_offset = start});
  };

  if (engine == gemm::Engine::kFast && cache.length == 0 && T_new > 1 &&
      hd <= kernels::kMaxHeadDim) {
    // A prefill of an empty cache is plain causal self-attention over the new
    // tokens: the flash kernel reads q, k, v token-major (B, T_new, d_out) in
    // place and writes the context in the layout out_proj reads.
    const auto project = [&](const Linear& layer) {
      return ref::linear_forward(x_new, layer.weight.value, bias_or_null(layer), engine)
          .contiguous();
    };
    Tensor q = project(mha.W_query), k = project(mha.W_key);
    const Tensor v = project(mha.W_value);
    rotate(q, B, T_new, 0);  // RoPE, positions 0 .. T_new - 1
    rotate(k, B, T_new, 0);
    write_rows(cache.keys, transpose(k.reshape({B, T_new, H, hd}), 1, 2), 0);
    write_rows(cache.values, transpose(v.reshape({B, T_new, H, hd}), 1, 2), 0);
    Tensor context({B, T_new, o.d_out});  // (B, T_new, H·hd)
    Tensor lse({B, H, T_new});            // the kernel's softmax statistics, not needed here
    kernels::flash_attention_forward(context.data(), lse.data(), q.data(), k.data(), v.data(),
                                     {.B = B, .T = T_new, .H = H, .hd = hd, .causal = true});
    cache.length = T_new;
    return ref::linear_forward(context, mha.out_proj.weight.value, bias_or_null(mha.out_proj),
                               engine);
  }

  if (engine == gemm::Engine::kFast) {
    // New tokens after a filled cache (one while generating): k and v go
    // straight into rows length .. length + T_new of the cache, and the queries
    // attend with the flash-decoding kernel (attn/decode_attention.h) in blocks
    // of up to kMaxDecodeQueries, each block the last tokens of the sequence so
    // far (bottom-right causal). One token: each projection is a GEMV that
    // reads its weights once (kernels::gemv_forward), the three in one
    // parallel region.
    const Tensor xc = x_new.contiguous();  // (B, T_new, d_in)
    const int64_t E = o.d_out, L = cache.length, cap = cache.context_length, M = B * T_new;
    Tensor q({B, T_new, E}), kv({2, M, E});  // q token-major; k, v before they go to the cache
    if (T_new == 1) {
      const Tensor wq = mha.W_query.weight.value.contiguous(),
                   wk = mha.W_key.weight.value.contiguous(),
                   wv = mha.W_value.weight.value.contiguous();
      const auto problem = [&](float* y, const Tensor& w, const Linear& layer) {
        const Tensor* bias = bias_or_null(layer);
        return kernels::GemvProblem{y,      E,        xc.data(),
                                    o.d_in, w.data(), bias != nullptr ? bias->data() : nullptr,
                                    B,      E,        o.d_in};
      };
      const kernels::GemvProblem qkv[3] = {problem(q.data(), wq, mha.W_query),
                                           problem(kv.data(), wk, mha.W_key),
                                           problem(kv.data() + M * E, wv, mha.W_value)};
      kernels::gemv_forward_batch(qkv, 3);
    } else {
      const auto project = [&](const Linear& layer, float* y) {
        const Tensor p = ref::linear_forward(xc, layer.weight.value, bias_or_null(layer), engine)
                             .contiguous();  // (B, T_new, E)
        std::copy_n(p.data(), M * E, y);
      };
      project(mha.W_query, q.data());
      project(mha.W_key, kv.data());
      project(mha.W_value, kv.data() + M * E);
    }
    Tensor k_new = kv.select(0, 0);  // (B·T_new, E), a view
    rotate(q, B, T_new, L);          // RoPE at positions L .. L + T_new - 1
    rotate(k_new, B, T_new, L);
    float* keys = cache.keys.data();
    float* values = cache.values.data();
    for (int64_t b = 0; b < B; ++b) {
      for (int64_t t = 0; t < T_new; ++t) {
        for (int64_t h = 0; h < H; ++h) {
          const int64_t row = ((b * H + h) * cap + L + t) * hd;
          std::copy_n(kv.data() + (b * T_new + t) * E + h * hd, hd, keys + row);
          std::copy_n(kv.data() + (M + b * T_new + t) * E + h * hd, hd, values + row);
        }
      }
    }
    Tensor context({B, T_new, E});
    for (int64_t t0 = 0; t0 < T_new; t0 += kMaxDecodeQueries) {
      const int64_t n = std::min(kMaxDecodeQueries, T_new - t0);
      kernels::decode_attention_forward(context.data() + t0 * E, q.data() + t0 * E, keys, values,
                                        {.B = B,
                                         .Hq = H,
                                         .Hkv = H,
                                         .Tq = n,
                                         .length = L + t0 + n,
                                         .capacity = cap,
                                         .D = hd,
                                         .scale = 1.0f / std::sqrt(float(hd)),
                                         .q_stride = E,
                                         .o_stride = E,
                                         .q_batch_stride = T_new * E,
                                         .o_batch_stride = T_new * E});
    }
    cache.length = L + T_new;
    if (T_new > 1) {
      return ref::linear_forward(context, mha.out_proj.weight.value, bias_or_null(mha.out_proj),
                                 engine);
    }
    Tensor y({B, 1, E});
    const Tensor* bias = bias_or_null(mha.out_proj);
    kernels::gemv_forward(y.data(), E, context.data(), E,
                          mha.out_proj.weight.value.contiguous().data(),
                          bias != nullptr ? bias->data() : nullptr, B, E, E);
    return y;
  }

  Tensor q = project_heads(mha.W_query, x_new, H, hd, engine);  // (B, H, T_new, hd)
  Tensor k = project_heads(mha.W_key, x_new, H, hd, engine);
  if (rope != nullptr) {  // RoPE at positions length .. length + T_new - 1
    q = apply_rope(q, rope->cos, rope->sin, {.position_offset = cache.length});
    k = apply_rope(k, rope->cos, rope->sin, {.position_offset = cache.length});
  }
  write_rows(cache.keys, k, cache.length);
  write_rows(cache.values, project_heads(mha.W_value, x_new, H, hd, engine), cache.length);
  const Tensor context = ref::cached_attention_forward(q, cache.keys, cache.values,
                                                       cache.length);  // (B, H, T_new, hd)
  cache.length += T_new;
  // (B, H, T_new, hd) -> (B, T_new, H, hd) -> (B, T_new, d_out), then the output projection.
  const Tensor merged = transpose(context, 1, 2).reshape({B, T_new, o.d_out});
  return ref::linear_forward(merged, mha.out_proj.weight.value, bias_or_null(mha.out_proj), engine);
}

}  // namespace attn::nn
