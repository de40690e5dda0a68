// MultiHeadLatentAttention and its latent cache (attn/mla.h): the book's
// ch04/05_mla module on attn's Linear layers and fused SDPA kernel.
#include "attn/mla.h"

#include <fmt/format.h>

#include <algorithm>
#include <stdexcept>

#include "attn/functional.h"
#include "attn/ops.h"
#include "attn/sdpa.h"
#include "nn/checks.h"

namespace attn::nn {
namespace {

constexpr const char* kModule = "MultiHeadLatentAttention";

// Checks the options and resolves latent_dim = 0 to the book's default.
MultiHeadLatentAttentionOptions resolved(MultiHeadLatentAttentionOptions o) {
  detail::check_positive(kModule, "d_in", o.d_in);
  detail::check_positive(kModule, "d_out", o.d_out);
  detail::check_positive(kModule, "num_heads", o.num_heads);
  if (o.d_out % o.num_heads != 0) {
    throw std::invalid_argument(fmt::format("{}: d_out ({}) must be divisible by num_heads ({})",
                                            kModule, o.d_out, o.num_heads));
  }
  if (o.latent_dim < 0) {
    throw std::invalid_argument(
        fmt::format("{}: latent_dim must be positive (or 0 for max(16, d_out / 8)), got {}",
                    kModule, o.latent_dim));
  }
  if (!(o.dropout >= 0.0f && o.dropout < 1.0f)) {
    throw std::invalid_argument(
        fmt::format("{}: dropout must be in [0, 1), got {}", kModule, o.dropout));
  }
  if (o.latent_dim == 0) o.latent_dim = std::max<int64_t>(16, o.d_out / 8);
  return o;
}

// (B, T, H·hd) as the kernel's (B, H, T, hd): a view, no copy.
Tensor heads_view(const Tensor& t, int64_t H) {
  const int64_t B = t.size(0), T = t.size(1);
  return transpose(t.view({B, T, H, t.size(2) / H}), 1, 2);
}

// (B, H, T, hd) -> (B, T, H·hd).
Tensor merge_heads(const Tensor& t) {
  const int64_t B = t.size(0), H = t.size(1), T = t.size(2), hd = t.size(3);
  return transpose(t, 1, 2).reshape({B, T, H * hd});
}

const Tensor* bias_or_null(const Linear& l) { return l.options().bias ? &l.bias.value : nullptr; }

}  // namespace

MultiHeadLatentAttention::MultiHeadLatentAttention(const MultiHeadLatentAttentionOptions& options,
                                                   Generator& gen)
    : W_query({resolved(options).d_in, options.d_out, options.qkv_bias}, gen),
      W_DKV({options.d_in, resolved(options).latent_dim, options.qkv_bias}, gen),
      W_UK({resolved(options).latent_dim, options.d_out, options.qkv_bias}, gen),
      W_UV({resolved(options).latent_dim, options.d_out, options.qkv_bias}, gen),
      out_proj({options.d_out, options.d_out, true}, gen),
      dropout({options.dropout}, gen),
      options_(resolved(options)) {
  register_module("W_query", &W_query);
  register_module("W_DKV", &W_DKV);
  register_module("W_UK", &W_UK);
  register_module("W_UV", &W_UV);
  register_module("out_proj", &out_proj);
  register_module("dropout", &dropout);
}

Tensor MultiHeadLatentAttention::forward(const Tensor& x) {
  detail::check_btd(kModule, x, {"d_in", options_.d_in});
  const int64_t H = options_.num_heads;
  B_ = x.size(0);
  T_ = x.size(1);
  q_ = W_query.forward(x);            // (B, T, d_out)
  const Tensor c = W_DKV.forward(x);  // (B, T, latent_dim)
  k_ = W_UK.forward(c);               // (B, T, d_out)
  v_ = W_UV.forward(c);               // (B, T, d_out)
  dropout_p_ = dropout.is_active() ? options_.dropout : 0.0f;
  dropout_seed_ = dropout_p_ > 0.0f ? dropout.draw_seed() : 0;
  const SdpaOptions o = sdpa_options();
  SdpaForward f = scaled_dot_product_attention_forward(heads_view(q_, H), heads_view(k_, H),
                                                       heads_view(v_, H), o);
  out_ = std::move(f.out);  // (B, H, T, hd)
  lse_ = std::move(f.lse);  // (B, H, T)
  has_forward_ = true;
  return out_proj.forward(merge_heads(out_));  // (B, T, d_out)
}

// Causal (top-left: Tq = Tk here), this forward's dropout.
SdpaOptions MultiHeadLatentAttention::sdpa_options() const {
  SdpaOptions o;
  o.is_causal = true;
  o.dropout_p = dropout_p_;
  o.dropout_seed = dropout_seed_;
  return o;
}

Tensor MultiHeadLatentAttention::backward(const Tensor& dy) {
  require_forward(has_forward_, kModule);
  detail::check_grad(kModule, dy, {B_, T_, options_.d_out});
  const int64_t H = options_.num_heads;
  const Tensor dcontext = out_proj.backward(dy);  // (B, T, d_out)
  const SdpaOptions o = sdpa_options();
  SdpaGrads g =
      scaled_dot_product_attention_backward(heads_view(dcontext, H), heads_view(q_, H),
                                            heads_view(k_, H), heads_view(v_, H), out_, lse_, o);
  Tensor dx = W_query.backward(merge_heads(g.dq));  // (B, T, d_in)
  Tensor dc = W_UK.backward(merge_heads(g.dk));     // (B, T, latent_dim)
  dc += W_UV.backward(merge_heads(g.dv));
  dx += W_DKV.backward(dc);
  return dx;
}

// ---- the latent cache ---------------------------------------------------------------

void LatentKVCache::reset() {
  length = 0;
  if (!c_kv.empty()) c_kv.fill_(0.0f);
}

LatentKVCache make_latent_kv_cache(const MultiHeadLatentAttention& mla, int64_t batch,
                                   int64_t context_length) {
  if (batch < 1 || context_length < 1) {
    throw std::invalid_argument(
        fmt::format("make_latent_kv_cache: batch and context_length must be >= 1, got {} and {}",
                    batch, context_length));
  }
  return LatentKVCache{.batch = batch,
                       .latent_dim = mla.latent_dim(),
                       .context_length = context_length,
                       .c_kv = Tensor::zeros({batch, context_length, mla.latent_dim()}),
                       .length = 0};
}

Tensor forward_cached(const MultiHeadLatentAttention& mla, const Tensor& x_new,
                      LatentKVCache& cache) {
  const auto& o = mla.options();
  detail::check_btd("forward_cached", x_new, {"d_in", o.d_in});
  if (x_new.size(0) != cache.batch || cache.latent_dim != mla.latent_dim() ||
      cache.c_kv.shape() != Shape{cache.batch, cache.context_length, cache.latent_dim} ||
      cache.c_kv.dtype() != DType::kFloat32) {
    throw std::invalid_argument(fmt::format(
        "forward_cached: input batch {} and module latent_dim {} do not match the cache's batch "
        "{}, latent_dim {} (c_kv {} {})",
        x_new.size(0), mla.latent_dim(), cache.batch, cache.latent_dim,
        dtype_name(cache.c_kv.dtype()), shape_str(cache.c_kv.shape())));
  }
  const int64_t T_new = x_new.size(1), start = cache.length;
  if (start < 0 || T_new > cache.context_length - start) {
    throw std::invalid_argument(
        fmt::format("forward_cached: {} new tokens do not fit the cache ({} of {} positions used)",
                    T_new, start, cache.context_length));
  }
  if (mla.is_training() && o.dropout > 0.0f) {
    throw std::invalid_argument(fmt::format(
        "forward_cached: the module is in training mode with dropout {}; call eval() first",
        o.dropout));
  }
  const int64_t H = o.num_heads, total = start + T_new;
  const Tensor q = ref::linear_forward(x_new, mla.W_query.weight.value,
                                       bias_or_null(mla.W_query));  // (B, T_new, d_out)
  const Tensor c_new = ref::linear_forward(x_new, mla.W_DKV.weight.value,
                                           bias_or_null(mla.W_DKV));  // (B, T_new, latent)
  cache.c_kv.slice(1, start, total).copy_(c_new);
  const Tensor latent = cache.c_kv.slice(1, 0, total);  // (B, total, latent)
  const Tensor k = ref::linear_forward(latent, mla.W_UK.weight.value, bias_or_null(mla.W_UK));
  const Tensor v = ref::linear_forward(latent, mla.W_UV.weight.value, bias_or_null(mla.W_UV));
  // Query i at position start + i sees keys 0 .. start + i: causal, aligned bottom-right.
  SdpaOptions so;
  so.is_causal = true;
  so.causal_alignment = CausalAlignment::kBottomRight;
  const Tensor out = scaled_dot_product_attention(heads_view(q, H), heads_view(k, H),
                                                  heads_view(v, H), so);  // (B, H, T_new, hd)
  cache.length = total;
  return ref::linear_forward(merge_heads(out), mla.out_proj.weight.value,
                             bias_or_null(mla.out_proj));  // (B, T_new, d_out)
}

}  // namespace attn::nn
