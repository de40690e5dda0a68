// The chapter's attention modules: SelfAttention v1/v2, CausalAttention and the
// two multi-head forms. SelfAttention calls ref::attention_forward /
// attention_backward itself; CausalAttention and MultiHeadAttention describe
// themselves once (detail::AttentionSpec) and hand forward and backward to
// their detail::AttentionCore, which takes the reference or the fused path
// (src/nn/attention_core.h; attn/nn.h says when).
#include <fmt/format.h>

#include <stdexcept>

#include "attn/nn.h"
#include "attn/ops.h"
#include "nn/attention_core.h"
#include "nn/checks.h"
#include "nn/sdpa_attention.h"

namespace attn::nn {
namespace {

using detail::check_btd;
using detail::check_dropout;
using detail::check_fused_request;
using detail::check_grad;
using detail::check_positive;
using detail::concat_heads_backward;
using detail::concat_heads_forward;

// ---- option checks, run before any parameter is drawn ----
// (dropout p included: the modules check it before their Linear layers draw,
// so a bad option throws with the generator untouched.)

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
  check_dropout(o.dropout);
  return o;
}

const MultiHeadAttentionOptions& checked(const char* module, const MultiHeadAttentionOptions& o) {
  check_positive(module, "d_in", o.d_in);
  check_positive(module, "d_out", o.d_out);
  check_positive(module, "context_length", o.context_length);
  check_positive(module, "num_heads", o.num_heads);
  return o;
}

const char* variant_name(AttentionVariant v) {
  switch (v) {
    case AttentionVariant::kGroupedQuery:
      return "GroupedQueryAttention";
    case AttentionVariant::kSlidingWindow:
      return "MultiHeadAttentionWithSWA";
    case AttentionVariant::kChapter:
      break;
  }
  return "MultiHeadAttention";
}

const MultiHeadAttentionOptions& checked_split(const MultiHeadAttentionOptions& o) {
  const char* module = variant_name(o.variant);
  checked(module, o);
  if (o.d_out % o.num_heads != 0) {
    throw std::invalid_argument(fmt::format("{}: d_out ({}) must be divisible by num_heads ({})",
                                            module, o.d_out, o.num_heads));
  }
  if (o.variant == AttentionVariant::kChapter) {
    if (o.num_kv_groups != 0 || o.sliding_window_size != 0) {
      throw std::invalid_argument(fmt::format(
          "MultiHeadAttention: num_kv_groups ({}) and sliding_window_size ({}) need variant "
          "kGroupedQuery or kSlidingWindow",
          o.num_kv_groups, o.sliding_window_size));
    }
    check_fused_request("MultiHeadAttention", o.backend, o.d_out / o.num_heads, o.dropout, -1);
    check_dropout(o.dropout);
    return o;
  }
  check_dropout(o.dropout);
  if (o.variant == AttentionVariant::kGroupedQuery) {
    if (o.num_kv_groups < 1 || o.num_heads % o.num_kv_groups != 0) {
      throw std::invalid_argument(
          fmt::format("GroupedQueryAttention: num_heads ({}) must be divisible by num_kv_groups "
                      "({}), which must be >= 1",
                      o.num_heads, o.num_kv_groups));
    }
  } else if (o.variant == AttentionVariant::kSlidingWindow && o.num_kv_groups != 0) {
    throw std::invalid_argument(fmt::format(
        "MultiHeadAttentionWithSWA: num_kv_groups ({}) needs variant kGroupedQuery",
        o.num_kv_groups));
  } else if (o.variant != AttentionVariant::kSlidingWindow) {
    throw std::invalid_argument(fmt::format("MultiHeadAttention: unknown variant {}",
                                            static_cast<int>(o.variant)));
  }
  if (o.sliding_window_size < 0) {
    throw std::invalid_argument(fmt::format(
        "{}: sliding_window_size must be >= 0 (0: none), got {}", module, o.sliding_window_size));
  }
  if (o.dropout >= 1.0f) {
    throw std::invalid_argument(fmt::format("{}: dropout must be < 1, got {}", module, o.dropout));
  }
  if (o.dtype != DType::kFloat32) {
    throw std::invalid_argument(fmt::format("{}: only float32 is supported, got dtype {}", module,
                                            dtype_name(o.dtype)));
  }
  return o;
}

bool gqa_layout(const MultiHeadAttentionOptions& o) {
  return o.variant == AttentionVariant::kGroupedQuery;
}
// The width of W_key and W_value: num_kv_groups · head_dim for GQA, else d_out.
int64_t kv_width(const MultiHeadAttentionOptions& o) {
  return gqa_layout(o) ? o.num_kv_groups * (o.d_out / o.num_heads) : o.d_out;
}
// GroupedQueryAttention draws its parameters in another order (W_key, W_value,
// W_query, out_proj) than the members are built: they are built from this
// scratch generator, then drawn again from the caller's in the book's order.
Generator& draw_from(const MultiHeadAttentionOptions& o, Generator& gen) {
  thread_local Generator scratch;
  return gqa_layout(o) ? scratch : gen;
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
      options_(options),
      mask_([n = options.context_length] { return ref::future_mask(n); }),
      // One head of width d_out, no output projection; mask[:T, :T] is the
      // j > i pattern that causal = true applies.
      core_(std::make_unique<detail::AttentionCore>(
          detail::AttentionSpec{.module = "CausalAttention",
                                .num_heads = 1,
                                .width = options.d_out,
                                .head_axis = false,  // weights (B, T, T)
                                .attention = {.causal = true, .softmax_dim = options.softmax_dim},
                                .W_query = &W_query,
                                .W_key = &W_key,
                                .W_value = &W_value,
                                .out_proj = nullptr,
                                .dropout = &dropout,
                                .backend = options.backend,
                                .exact_dropout = options.exact_dropout,
                                .dtype = options.dtype})) {
  register_module("W_query", &W_query);
  register_module("W_key", &W_key);
  register_module("W_value", &W_value);
  register_module("dropout", &dropout);
  register_buffer("mask", &mask_);
}

CausalAttention::~CausalAttention() = default;

AttentionBackend CausalAttention::last_backend() const { return core_->last_backend(); }

const Tensor& CausalAttention::attention_weights() const {
  return core_->attention_weights();  // (B, T, T)
}

Tensor CausalAttention::forward(const Tensor& x) {
  check_btd("CausalAttention", x, {"d_in", options_.d_in},
            {"context_length", options_.context_length});
  return core_->forward(x);  // (B, T, d_out)
}

Tensor CausalAttention::backward(const Tensor& dy) {
  require_forward(core_->has_forward(), "CausalAttention");
  return core_->backward(dy);  // (B, T, d_in)
}

// ---- MultiHeadAttentionWrapper ---------------------------------------------------------

namespace {
std::vector<std::unique_ptr<CausalAttention>> make_causal_heads(const MultiHeadAttentionOptions& o,
                                                                Generator& gen) {
  checked("MultiHeadAttentionWrapper", o);  // each head checks the rest before it draws
  std::vector<std::unique_ptr<CausalAttention>> heads;
  for (int64_t h = 0; h < o.num_heads; ++h) {  // one after another: query, key, value each
    heads.push_back(
        std::make_unique<CausalAttention>(CausalAttentionOptions{.d_in = o.d_in,
                                                                 .d_out = o.d_out,
                                                                 .context_length = o.context_length,
                                                                 .dropout = o.dropout,
                                                                 .qkv_bias = o.qkv_bias,
                                                                 .backend = o.backend,
                                                                 .exact_dropout = o.exact_dropout,
                                                                 .dtype = o.dtype},
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
  const Tensor y = concat_heads_forward(heads, x);  // (B, T, num_heads * d_out)
  has_forward_ = true;
  return y;
}

Tensor MultiHeadAttentionWrapper::backward(const Tensor& dy) {
  require_forward(has_forward_, "MultiHeadAttentionWrapper");
  const int64_t width = options_.num_heads * options_.d_out;
  if (dy.dim() != 3 || dy.size(2) != width) {
    throw std::invalid_argument(fmt::format(
        "MultiHeadAttentionWrapper: gradient shape {} does not end in num_heads * d_out = {}",
        shape_str(dy.shape()), width));
  }
  return concat_heads_backward(heads, dy, options_.d_out);  // (B, T, d_in)
}

// ---- MultiHeadAttention (weight splits) ------------------------------------------------

MultiHeadAttention::MultiHeadAttention(const MultiHeadAttentionOptions& options, Generator& gen)
    : W_query({checked_split(options).d_in, options.d_out, options.qkv_bias},
              draw_from(options, gen)),
      W_key({options.d_in, kv_width(options), options.qkv_bias}, draw_from(options, gen)),
      W_value({options.d_in, kv_width(options), options.qkv_bias}, draw_from(options, gen)),
      out_proj({options.d_out, options.d_out, !gqa_layout(options)}, draw_from(options, gen)),
      dropout({options.dropout}, gen),
      options_(options),
      mask_([n = options.context_length] { return ref::future_mask(n); }) {
  if (options.variant != AttentionVariant::kChapter) {
    if (options.rope != nullptr) {
      throw std::invalid_argument(fmt::format(
          "MultiHeadAttention: RoPE is not implemented for the {} variant (num_kv_groups {}, "
          "sliding_window_size {}); use it with the chapter's module",
          options.variant == AttentionVariant::kGroupedQuery ? "grouped-query" : "sliding-window",
          options.num_kv_groups, options.sliding_window_size));
    }
    if (gqa_layout(options)) {  // the book's order: W_key, W_value, W_query, out_proj (no bias)
      for (Linear* l : {&W_key, &W_value, &W_query, &out_proj})
        init_linear_(l->weight.value, l->options().bias ? &l->bias.value : nullptr, gen);
      register_module("W_key", &W_key);
      register_module("W_value", &W_value);
      register_module("W_query", &W_query);
    } else {
      register_module("W_query", &W_query);
      register_module("W_key", &W_key);
      register_module("W_value", &W_value);
    }
    register_module("out_proj", &out_proj);
    register_module("dropout", &dropout);
    sdpa_ = std::make_unique<detail::SdpaAttention>(*this);
    return;
  }
  // num_heads heads of width head_dim = d_out / num_heads, scale
  // 1/sqrt(head_dim), then out_proj.
  core_ = std::make_unique<detail::AttentionCore>(
      detail::AttentionSpec{.module = "MultiHeadAttention",
                            .num_heads = options.num_heads,
                            .width = options.d_out,
                            .head_axis = true,  // (B, H, T, hd), weights (B, H, T, T)
                            .attention = {.causal = true},
                            .W_query = &W_query,
                            .W_key = &W_key,
                            .W_value = &W_value,
                            .out_proj = &out_proj,
                            .dropout = &dropout,
                            .backend = options.backend,
                            .exact_dropout = options.exact_dropout,
                            .dtype = options.dtype,
                            .rope = options_.rope.get()});
  register_module("W_query", &W_query);
  register_module("W_key", &W_key);
  register_module("W_value", &W_value);
  register_module("out_proj", &out_proj);
  register_module("dropout", &dropout);
  register_buffer("mask", &mask_);
}

MultiHeadAttention::~MultiHeadAttention() = default;

int64_t MultiHeadAttention::num_kv_heads() const {
  return gqa_layout(options_) ? options_.num_kv_groups : options_.num_heads;
}

void MultiHeadAttention::set_sliding_window_size(int64_t w) {
  if (options_.variant == AttentionVariant::kChapter) {
    throw std::invalid_argument(fmt::format(
        "MultiHeadAttention: set_sliding_window_size({}) needs variant kGroupedQuery or "
        "kSlidingWindow (the chapter's module has no window)",
        w));
  }
  if (w < 0) {
    throw std::invalid_argument(
        fmt::format("{}: sliding_window_size must be >= 0 (0: none), got {}",
                    variant_name(options_.variant), w));
  }
  options_.sliding_window_size = w;
}

AttentionBackend MultiHeadAttention::last_backend() const {
  return sdpa_ ? sdpa_->last_backend() : core_->last_backend();
}

const Tensor& MultiHeadAttention::attention_weights() const {
  if (sdpa_) return sdpa_->attention_weights();  // (B, H, T, T), recomputed from q and k
  return core_->attention_weights();  // (B, H, T, T)
}

Tensor MultiHeadAttention::forward(const Tensor& x) {
  check_btd(variant_name(options_.variant), x, {"d_in", options_.d_in},
            {"context_length", options_.context_length});
  if (sdpa_) return sdpa_->forward(x);  // (B, T, d_out)
  return core_->forward(x);  // (B, T, d_out)
}

Tensor MultiHeadAttention::backward(const Tensor& dy) {
  if (sdpa_) {
    require_forward(sdpa_->has_forward(), variant_name(options_.variant));
    return sdpa_->backward(dy);  // (B, T, d_in)
  }
  require_forward(core_->has_forward(), "MultiHeadAttention");
  return core_->backward(dy);  // (B, T, d_in)
}

// ---- GroupedQueryAttention, MultiHeadAttentionWithSWA ------------------------------------

GroupedQueryAttention::GroupedQueryAttention(const GroupedQueryAttentionOptions& o, Generator& gen)
    : MultiHeadAttention({.d_in = o.d_in,
                          .d_out = o.d_out,
                          .context_length = o.context_length,
                          .dropout = o.dropout,
                          .num_heads = o.num_heads,
                          .qkv_bias = o.qkv_bias,
                          .backend = o.backend,
                          .exact_dropout = false,
                          .variant = AttentionVariant::kGroupedQuery,
                          .num_kv_groups = o.num_kv_groups},
                         gen) {}

MultiHeadAttentionWithSWA::MultiHeadAttentionWithSWA(const MultiHeadAttentionWithSWAOptions& o,
                                                     Generator& gen)
    : MultiHeadAttention({.d_in = o.d_in,
                          .d_out = o.d_out,
                          .context_length = o.context_length,
                          .dropout = o.dropout,
                          .num_heads = o.num_heads,
                          .qkv_bias = o.qkv_bias,
                          .backend = o.backend,
                          .exact_dropout = false,
                          .variant = AttentionVariant::kSlidingWindow,
                          .sliding_window_size = o.sliding_window_size},
                         gen) {}

}  // namespace attn::nn
