// The character-level GPT's attention head and its multi-head form (section 5).
// A Head calls ref::attention_forward / attention_backward for the maths, or,
// on the fused path (attn/nn.h says when), fused::attention_block_forward /
// attention_block_backward with one head and no output projection.
#include <fmt/format.h>

#include <cmath>
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

const HeadOptions& checked(const HeadOptions& o) {
  check_positive("Head", "n_embd", o.n_embd);
  check_positive("Head", "head_size", o.head_size);
  if (o.causal) check_positive("Head", "block_size", o.block_size);
  check_fused_request("Head", o.backend, o.head_size, o.dropout);
  return o;
}

const MultiHeadOptions& checked(const MultiHeadOptions& o) {
  check_positive("MultiHead", "n_embd", o.n_embd);
  check_positive("MultiHead", "num_heads", o.num_heads);
  check_positive("MultiHead", "head_size", o.head_size);
  if (o.causal) check_positive("MultiHead", "block_size", o.block_size);
  check_fused_request("MultiHead", o.backend, o.head_size, o.dropout);
  return o;
}

// weights = q kᵀ · head_size^-0.5, the future masked for a decoder head.
ref::AttentionOptions head_attention(const HeadOptions& o) {
  return {.causal = o.causal,
          .scale = static_cast<float>(std::pow(static_cast<double>(o.head_size), -0.5))};
}

std::vector<std::unique_ptr<Head>> make_heads(const MultiHeadOptions& o, Generator& gen) {
  checked(o);
  std::vector<std::unique_ptr<Head>> heads;
  for (int64_t h = 0; h < o.num_heads; ++h) {
    heads.push_back(std::make_unique<Head>(HeadOptions{.n_embd = o.n_embd,
                                                       .head_size = o.head_size,
                                                       .block_size = o.block_size,
                                                       .dropout = o.dropout,
                                                       .causal = o.causal,
                                                       .backend = o.backend,
                                                       .exact_dropout = o.exact_dropout},
                                           gen));
  }
  return heads;
}

}  // namespace

// ---- Head --------------------------------------------------------------------------------

Head::Head(const HeadOptions& options, Generator& gen)
    : key({checked(options).n_embd, options.head_size, false}, gen),
      query({options.n_embd, options.head_size, false}, gen),
      value({options.n_embd, options.head_size, false}, gen),
      dropout({options.dropout}, gen),
      options_(options) {
  register_module("key", &key);
  register_module("query", &query);
  register_module("value", &value);
  register_module("dropout", &dropout);
}

AttentionBackend Head::choose_backend() const {
  return choose(options_.backend, dropout, options_.exact_dropout,
                options_.head_size <= kFusedMaxHeadDim);
}

const Tensor& Head::attention_weights() const {
  if (last_backend_ == AttentionBackend::kFused && saved_.weights.empty())
    saved_.weights = detail::recomputed_head_weights(fused_saved_);
  return saved_.weights;  // (B, T, T)
}

Tensor Head::forward(const Tensor& x) {
  // Only a decoder head is limited by its tril buffer of block_size tokens.
  check_btd("Head", x, {"n_embd", options_.n_embd},
            {"block_size", options_.causal ? options_.block_size : 0});
  last_backend_ = choose_backend();
  has_forward_ = true;
  if (last_backend_ == AttentionBackend::kFused) {
    q_ = k_ = v_ = Tensor();
    saved_ = {};
    // One head of width head_size, no biases, no output projection: y = context.
    return fused::attention_block_forward(x, projection_weights(query, key, value, nullptr),
                                          fused_options(1, dropout, head_attention(options_)),
                                          &fused_saved_);
  }
  fused_saved_ = {};
  const int64_t B = x.size(0), T = x.size(1);
  k_ = key.forward(x);                                   // (B, T, head_size)
  q_ = query.forward(x);                                 // (B, T, head_size)
  v_ = value.forward(x);                                 // (B, T, head_size)
  const Tensor noise = dropout.sample_noise({B, T, T});  // (B, T, T), empty when off
  return ref::attention_forward(q_, k_, v_, head_attention(options_), noise_or_null(noise),
                                &saved_);  // (B, T, head_size)
}

Tensor Head::backward(const Tensor& dy) {
  require_forward(has_forward_, "Head");
  if (last_backend_ == AttentionBackend::kFused) {
    return fused_backward("Head", dy, options_.head_size,
                          projection_weights(query, key, value, nullptr), fused_saved_,
                          projection_grads(query, key, value, nullptr));
  }
  check_grad("Head", dy, q_.shape());
  const ref::AttentionGrads g =
      ref::attention_backward(dy, q_, k_, v_, saved_, head_attention(options_));
  Tensor dx = key.backward(g.dk);
  dx += query.backward(g.dq);
  dx += value.backward(g.dv);
  return dx;
}

// ---- MultiHead -----------------------------------------------------------------------------

MultiHead::MultiHead(const MultiHeadOptions& options, Generator& gen)
    : heads(make_heads(options, gen)),
      proj({options.num_heads * options.head_size, options.n_embd, true}, gen),
      dropout({options.dropout}, gen),
      options_(options) {
  for (size_t h = 0; h < heads.size(); ++h)
    register_module(fmt::format("heads.{}", h), heads[h].get());
  register_module("proj", &proj);
  register_module("dropout", &dropout);
}

Tensor MultiHead::forward(const Tensor& x) {
  check_btd("MultiHead", x, {"n_embd", options_.n_embd},
            {"block_size", options_.causal ? options_.block_size : 0});
  std::vector<Tensor> outs;
  outs.reserve(heads.size());
  for (auto& head : heads) outs.push_back(head->forward(x));  // (B, T, head_size) each
  has_forward_ = true;
  // (B, T, num_heads * head_size) -> proj -> (B, T, n_embd) -> dropout
  return dropout.forward(proj.forward(cat(outs, -1)));
}

Tensor MultiHead::backward(const Tensor& dy) {
  require_forward(has_forward_, "MultiHead");
  const Tensor dcat = proj.backward(dropout.backward(dy));  // (B, T, num_heads * head_size)
  const int64_t hs = options_.head_size;
  Tensor dx;
  for (size_t h = 0; h < heads.size(); ++h) {
    const int64_t begin = static_cast<int64_t>(h) * hs;
    const Tensor dx_h = heads[h]->backward(slice(dcat, -1, begin, begin + hs));  // (B, T, n_embd)
    if (h == 0) {
      dx = dx_h;
    } else {
      dx += dx_h;
    }
  }
  return dx;
}

}  // namespace attn::nn
