// The chapter's attention modules: SelfAttention v1/v2, CausalAttention and the
// two multi-head forms. Each owns its parameters and options and calls
// ref::attention_forward / attention_backward for the maths, or, for
// CausalAttention and MultiHeadAttention on the fused path (attn/nn.h says
// when), fused::attention_block_forward / attention_block_backward.
#include <fmt/format.h>

#include <stdexcept>

#include "attn/nn.h"
#include "attn/ops.h"
#include "nn/backend.h"
#include "nn/checks.h"

namespace attn::nn {
namespace {

using detail::check_btd;
using detail::check_fused_request;
using detail::check_grad;
using detail::check_positive;
using detail::choose;
using detail::fused_backward;
using detail::fused_options;
using detail::kFusedMaxHeadDim;
using detail::noise_or_null;
using detail::projection_grads;
using detail::projection_weights;

// ---- option checks, run before any parameter is drawn ----

const SelfAttentionOptions& checked(const char* module, const SelfAttentionOptions& o) {
  check_positive(module, "d_in", o.d_in);
  check_positive(module, "d_out", o.d_out);
  if (o.d_v < 0)
    throw std::invalid_argument(fmt::format("{}: d_v must be >= 0, got {}", module, o.d_v));
  return o;
}
int64_t value_width(const SelfAttentionOptions& o) { return o.d_v > 0 ? o.d_v : o.d_out; }

const CausalAttentionOptions& checked(const CausalAttentionOptions& o) {
  check_positive("CausalAttention", "d_in", o.d_in);
  check_positive("CausalAttention", "d_out", o.d_out);
  check_positive("CausalAttention", "context_length", o.context_length);
  // Weights are (B, T, T): -1/2 is the keys axis, 1/-2 the queries axis (the bug).
  if (o.softmax_dim != -1 && o.softmax_dim != 2 && o.softmax_dim != 1 && o.softmax_dim != -2) {
    throw std::invalid_argument(
        fmt::format("CausalAttention: softmax_dim must be -1 or 2 (keys) or 1 (queries), got {}",
                    o.softmax_dim));
  }
  check_fused_request("CausalAttention", o.backend, o.d_out, o.dropout, o.softmax_dim);
  return o;
}

const MultiHeadAttentionOptions& checked(const char* module, const MultiHeadAttentionOptions& o) {
  check_positive(module, "d_in", o.d_in);
  check_positive(module, "d_out", o.d_out);
  check_positive(module, "context_length", o.context_length);
  check_positive(module, "num_heads", o.num_heads);
  return o;
}

const MultiHeadAttentionOptions& checked_split(const MultiHeadAttentionOptions& o) {
  checked("MultiHeadAttention", o);
  if (o.d_out % o.num_heads != 0) {
    throw std::invalid_argument(
        fmt::format("MultiHeadAttention: d_out ({}) must be divisible by num_heads ({})", o.d_out,
                    o.num_heads));
  }
  check_fused_request("MultiHeadAttention", o.backend, o.d_out / o.num_heads, o.dropout, -1);
  return o;
}

// SelfAttention takes one sequence (T, d_in) or a batch (B, T, d_in).
void check_sequence(const char* module, const Tensor& x, int64_t d_in) {
  if (x.dim() == 3) return check_btd(module, x, {"d_in", d_in});
  if (x.dim() != 2) {
    throw std::invalid_argument(
        fmt::format("{}: expected input of shape (T, d_in) or (B, T, d_in), got {}", module,
                    shape_str(x.shape())));
  }
  if (x.size(1) != d_in) {
    throw std::invalid_argument(
        fmt::format("{}: input last dim {} does not match d_in {}", module, x.size(1), d_in));
  }
  if (x.size(0) < 1)
    throw std::invalid_argument(fmt::format("{}: input has {} tokens", module, x.size(0)));
}

// The output shape of an attention over q (..., T, d_k) with values (..., T, d_v).
Shape output_shape(const Tensor& q, const Tensor& v) {
  Shape s = q.shape();
  s.back() = v.size(-1);
  return s;
}

}  // namespace

const char* to_string(AttentionBackend backend) {
  switch (backend) {
    case AttentionBackend::kAuto:
      return "auto";
    case AttentionBackend::kReference:
      return "reference";
    case AttentionBackend::kFused:
      return "fused";
  }
  return "unknown";
}

// ---- SelfAttention_v1 ------------------------------------------------------------------

SelfAttentionV1::SelfAttentionV1(const SelfAttentionOptions& options, Generator& gen)
    : options_(checked("SelfAttentionV1", options)) {
  if (options_.qkv_bias) {
    throw std::invalid_argument(
        "SelfAttentionV1: qkv_bias is not supported (version 1 has no bias)");
  }
  // nn.Parameter(torch.rand(d_in, d_out)), drawn in the order query, key, value.
  W_query.value = rand({options_.d_in, options_.d_out}, gen);         // (d_in, d_out)
  W_key.value = rand({options_.d_in, options_.d_out}, gen);           // (d_in, d_out)
  W_value.value = rand({options_.d_in, value_width(options_)}, gen);  // (d_in, d_v)
  register_parameter("W_query", &W_query);
  register_parameter("W_key", &W_key);
  register_parameter("W_value", &W_value);
}

Tensor SelfAttentionV1::forward(const Tensor& x) {
  check_sequence("SelfAttentionV1", x, options_.d_in);
  x_ = x;
  q_ = matmul(x, W_query.value);  // (..., T, d_out)
  k_ = matmul(x, W_key.value);    // (..., T, d_out)
  v_ = matmul(x, W_value.value);  // (..., T, d_v)
  has_forward_ = true;
  return ref::attention_forward(q_, k_, v_, {}, nullptr, &saved_);  // (..., T, d_v)
}

Tensor SelfAttentionV1::backward(const Tensor& dy) {
  require_forward(has_forward_, "SelfAttentionV1");
  check_grad("SelfAttentionV1", dy, output_shape(q_, v_));
  const ref::AttentionGrads g = ref::attention_backward(dy, q_, k_, v_, saved_, {});
  Tensor dx = ref::matmul_param_backward(g.dq, x_, W_query.value, W_query.grad);
  dx += ref::matmul_param_backward(g.dk, x_, W_key.value, W_key.grad);
  dx += ref::matmul_param_backward(g.dv, x_, W_value.value, W_value.grad);
  return dx;
}

// ---- SelfAttention_v2 ------------------------------------------------------------------

SelfAttentionV2::SelfAttentionV2(const SelfAttentionOptions& options, Generator& gen)
    : W_query({checked("SelfAttentionV2", options).d_in, options.d_out, options.qkv_bias}, gen),
      W_key({options.d_in, options.d_out, options.qkv_bias}, gen),
      W_value({options.d_in, value_width(options), options.qkv_bias}, gen),
      options_(options) {
  register_module("W_query", &W_query);
  register_module("W_key", &W_key);
  register_module("W_value", &W_value);
}

Tensor SelfAttentionV2::forward(const Tensor& x) {
  check_sequence("SelfAttentionV2", x, options_.d_in);
  q_ = W_query.forward(x);  // (..., T, d_out)
  k_ = W_key.forward(x);    // (..., T, d_out)
  v_ = W_value.forward(x);  // (..., T, d_v)
  has_forward_ = true;
  return ref::attention_forward(q_, k_, v_, {}, nullptr, &saved_);  // (..., T, d_v)
}

Tensor SelfAttentionV2::backward(const Tensor& dy) {
  require_forward(has_forward_, "SelfAttentionV2");
  check_grad("SelfAttentionV2", dy, output_shape(q_, v_));
  const ref::AttentionGrads g = ref::attention_backward(dy, q_, k_, v_, saved_, {});
  Tensor dx = W_query.backward(g.dq);
  dx += W_key.backward(g.dk);
  dx += W_value.backward(g.dv);
  return dx;
}

// ---- CausalAttention -------------------------------------------------------------------

CausalAttention::CausalAttention(const CausalAttentionOptions& options, Generator& gen)
    : W_query({checked(options).d_in, options.d_out, options.qkv_bias}, gen),
      W_key({options.d_in, options.d_out, options.qkv_bias}, gen),
      W_value({options.d_in, options.d_out, options.qkv_bias}, gen),
      dropout({options.dropout}, gen),
      mask(ref::future_mask(options.context_length)),  // (context_length, context_length)
      options_(options) {
  register_module("W_query", &W_query);
  register_module("W_key", &W_key);
  register_module("W_value", &W_value);
  register_module("dropout", &dropout);
}

AttentionBackend CausalAttention::choose_backend() const {
  const bool kernel_can = options_.d_out <= kFusedMaxHeadDim &&
                          (options_.softmax_dim == -1 || options_.softmax_dim == 2);
  return choose(options_.backend, dropout, options_.exact_dropout, kernel_can);
}

const Tensor& CausalAttention::attention_weights() const {
  if (last_backend_ == AttentionBackend::kFused && saved_.weights.empty())
    saved_.weights = detail::recomputed_head_weights(fused_saved_);
  return saved_.weights;  // (B, T, T)
}

Tensor CausalAttention::forward(const Tensor& x) {
  check_btd("CausalAttention", x, {"d_in", options_.d_in},
            {"context_length", options_.context_length});
  last_backend_ = choose_backend();
  has_forward_ = true;
  if (last_backend_ == AttentionBackend::kFused) {
    q_ = k_ = v_ = Tensor();
    saved_ = {};
    // One head of width d_out, no output projection.
    return fused::attention_block_forward(x, projection_weights(W_query, W_key, W_value, nullptr),
                                          fused_options(1, dropout, {.causal = true}),
                                          &fused_saved_);
  }
  fused_saved_ = {};
  const int64_t B = x.size(0), T = x.size(1);
  q_ = W_query.forward(x);  // (B, T, d_out)
  k_ = W_key.forward(x);    // (B, T, d_out)
  v_ = W_value.forward(x);  // (B, T, d_out)
  // mask[:T, :T] is the j > i pattern that causal = true applies.
  const ref::AttentionOptions attention{.causal = true, .softmax_dim = options_.softmax_dim};
  const Tensor noise = dropout.sample_noise({B, T, T});  // (B, T, T), empty when off
  return ref::attention_forward(q_, k_, v_, attention, noise_or_null(noise),
                                &saved_);  // (B, T, d_out)
}

Tensor CausalAttention::backward(const Tensor& dy) {
  require_forward(has_forward_, "CausalAttention");
  if (last_backend_ == AttentionBackend::kFused) {
    return fused_backward("CausalAttention", dy, options_.d_out,
                          projection_weights(W_query, W_key, W_value, nullptr), fused_saved_,
                          projection_grads(W_query, W_key, W_value, nullptr));
  }
  check_grad("CausalAttention", dy, output_shape(q_, v_));
  const ref::AttentionOptions attention{.causal = true, .softmax_dim = options_.softmax_dim};
  const ref::AttentionGrads g = ref::attention_backward(dy, q_, k_, v_, saved_, attention);
  Tensor dx = W_query.backward(g.dq);
  dx += W_key.backward(g.dk);
  dx += W_value.backward(g.dv);
  return dx;
}

// ---- MultiHeadAttentionWrapper ---------------------------------------------------------

namespace {
std::vector<std::unique_ptr<CausalAttention>> make_causal_heads(const MultiHeadAttentionOptions& o,
                                                                Generator& gen) {
  checked("MultiHeadAttentionWrapper", o);
  std::vector<std::unique_ptr<CausalAttention>> heads;
  for (int64_t h = 0; h < o.num_heads; ++h) {  // one after another: query, key, value each
    heads.push_back(
        std::make_unique<CausalAttention>(CausalAttentionOptions{.d_in = o.d_in,
                                                                 .d_out = o.d_out,
                                                                 .context_length = o.context_length,
                                                                 .dropout = o.dropout,
                                                                 .qkv_bias = o.qkv_bias,
                                                                 .backend = o.backend,
                                                                 .exact_dropout = o.exact_dropout},
                                          gen));
  }
  return heads;
}
}  // namespace

MultiHeadAttentionWrapper::MultiHeadAttentionWrapper(const MultiHeadAttentionOptions& options,
                                                     Generator& gen)
    : heads(make_causal_heads(options, gen)), options_(options) {
  for (size_t h = 0; h < heads.size(); ++h)
    register_module(fmt::format("heads.{}", h), heads[h].get());
}

Tensor MultiHeadAttentionWrapper::forward(const Tensor& x) {
  check_btd("MultiHeadAttentionWrapper", x, {"d_in", options_.d_in},
            {"context_length", options_.context_length});
  std::vector<Tensor> outs;
  outs.reserve(heads.size());
  for (auto& head : heads) outs.push_back(head->forward(x));  // (B, T, d_out) each
  has_forward_ = true;
  return cat(outs, -1);  // (B, T, num_heads * d_out)
}

Tensor MultiHeadAttentionWrapper::backward(const Tensor& dy) {
  require_forward(has_forward_, "MultiHeadAttentionWrapper");
  const int64_t width = options_.num_heads * options_.d_out;
  if (dy.dim() != 3 || dy.size(2) != width) {
    throw std::invalid_argument(fmt::format(
        "MultiHeadAttentionWrapper: gradient shape {} does not end in num_heads * d_out = {}",
        shape_str(dy.shape()), width));
  }
  Tensor dx;
  for (size_t h = 0; h < heads.size(); ++h) {
    const int64_t begin = static_cast<int64_t>(h) * options_.d_out;
    const Tensor dx_h =
        heads[h]->backward(slice(dy, -1, begin, begin + options_.d_out));  // (B, T, d_in)
    if (h == 0) {
      dx = dx_h;
    } else {
      dx += dx_h;
    }
  }
  return dx;
}

// ---- MultiHeadAttention (weight splits) ------------------------------------------------

MultiHeadAttention::MultiHeadAttention(const MultiHeadAttentionOptions& options, Generator& gen)
    : W_query({checked_split(options).d_in, options.d_out, options.qkv_bias}, gen),
      W_key({options.d_in, options.d_out, options.qkv_bias}, gen),
      W_value({options.d_in, options.d_out, options.qkv_bias}, gen),
      out_proj({options.d_out, options.d_out, true}, gen),
      dropout({options.dropout}, gen),
      mask(ref::future_mask(options.context_length)),  // (context_length, context_length)
      options_(options) {
  register_module("W_query", &W_query);
  register_module("W_key", &W_key);
  register_module("W_value", &W_value);
  register_module("out_proj", &out_proj);
  register_module("dropout", &dropout);
}

AttentionBackend MultiHeadAttention::choose_backend() const {
  return choose(options_.backend, dropout, options_.exact_dropout, head_dim() <= kFusedMaxHeadDim);
}

fused::ProjectionWeights MultiHeadAttention::projection_weights() const {
  return detail::projection_weights(W_query, W_key, W_value, &out_proj);
}

const Tensor& MultiHeadAttention::attention_weights() const {
  if (last_backend_ == AttentionBackend::kFused && saved_.weights.empty())
    saved_.weights = detail::recomputed_weights(fused_saved_);
  return saved_.weights;  // (B, H, T, T)
}

Tensor MultiHeadAttention::forward(const Tensor& x) {
  check_btd("MultiHeadAttention", x, {"d_in", options_.d_in},
            {"context_length", options_.context_length});
  last_backend_ = choose_backend();
  has_forward_ = true;
  if (last_backend_ == AttentionBackend::kFused) {
    q_ = k_ = v_ = Tensor();
    saved_ = {};
    // qkv (B, T, 3·d_out) in one buffer, heads read in place, out_proj on BLAS.
    return fused::attention_block_forward(
        x, projection_weights(), fused_options(options_.num_heads, dropout, {.causal = true}),
        &fused_saved_);
  }
  fused_saved_ = {};
  const int64_t B = x.size(0), T = x.size(1), H = options_.num_heads, hd = head_dim();
  // (B, T, d_out) viewed as (B, T, H, hd), heads to the front: (B, H, T, hd).
  q_ = transpose(W_query.forward(x).reshape({B, T, H, hd}), 1, 2);
  k_ = transpose(W_key.forward(x).reshape({B, T, H, hd}), 1, 2);
  v_ = transpose(W_value.forward(x).reshape({B, T, H, hd}), 1, 2);
  const ref::AttentionOptions attention{.causal = true};    // scale 1/sqrt(hd)
  const Tensor noise = dropout.sample_noise({B, H, T, T});  // (B, H, T, T), empty when off
  const Tensor context =
      ref::attention_forward(q_, k_, v_, attention, noise_or_null(noise), &saved_);
  // (B, H, T, hd) -> (B, T, H, hd) -> (B, T, d_out), then the output projection.
  return out_proj.forward(transpose(context, 1, 2).reshape({B, T, options_.d_out}));
}

Tensor MultiHeadAttention::backward(const Tensor& dy) {
  require_forward(has_forward_, "MultiHeadAttention");
  if (last_backend_ == AttentionBackend::kFused) {
    return fused_backward("MultiHeadAttention", dy, options_.d_out, projection_weights(),
                          fused_saved_, projection_grads(W_query, W_key, W_value, &out_proj));
  }
  const int64_t B = q_.size(0), H = q_.size(1), T = q_.size(2), hd = q_.size(3);
  check_grad("MultiHeadAttention", dy, {B, T, options_.d_out});
  const Tensor dcontext =
      transpose(out_proj.backward(dy).reshape({B, T, H, hd}), 1, 2);  // (B, H, T, hd)
  const ref::AttentionOptions attention{.causal = true};
  const ref::AttentionGrads g = ref::attention_backward(dcontext, q_, k_, v_, saved_, attention);
  // (B, H, T, hd) -> (B, T, d_out), back through each projection.
  const auto merge = [&](const Tensor& d) {
    return transpose(d, 1, 2).reshape({B, T, options_.d_out});
  };
  Tensor dx = W_query.backward(merge(g.dq));
  dx += W_key.backward(merge(g.dk));
  dx += W_value.backward(merge(g.dv));
  return dx;
}

}  // namespace attn::nn
