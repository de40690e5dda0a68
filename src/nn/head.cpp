// The character-level GPT's attention head and its multi-head form (section 5).
// A Head describes itself once (detail::AttentionSpec: one head, scale
// head_size^-0.5, causal or not, no biases, no output projection) and hands
// forward and backward to its detail::AttentionCore, which takes the reference
// or the fused path (src/nn/attention_core.h; attn/nn.h says when).
#include <fmt/format.h>

#include <cmath>
#include <stdexcept>

#include "attn/nn.h"
#include "attn/ops.h"
#include "nn/attention_core.h"
#include "nn/checks.h"

namespace attn::nn {
namespace {

using detail::check_btd;
using detail::check_dropout;
using detail::check_fused_request;
using detail::check_positive;
using detail::concat_heads_backward;
using detail::concat_heads_forward;

const HeadOptions& checked(const HeadOptions& o) {
  check_positive("Head", "n_embd", o.n_embd);
  check_positive("Head", "head_size", o.head_size);
  if (o.causal) check_positive("Head", "block_size", o.block_size);
  check_fused_request("Head", o.backend, o.head_size, o.dropout);
  check_dropout(o.dropout);
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
  checked(o);  // each head checks dropout before it draws
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
      options_(options),
      tril_([n = options.block_size] { return ref::tril_ones(n); }),
      core_(std::make_unique<detail::AttentionCore>(
          detail::AttentionSpec{.module = "Head",
                                .num_heads = 1,
                                .width = options.head_size,
                                .head_axis = false,  // weights (B, T, T)
                                .attention = head_attention(options),
                                .W_query = &query,
                                .W_key = &key,
                                .W_value = &value,
                                .out_proj = nullptr,
                                .dropout = &dropout,
                                .backend = options.backend,
                                .exact_dropout = options.exact_dropout})) {
  register_module("key", &key);
  register_module("query", &query);
  register_module("value", &value);
  register_module("dropout", &dropout);
  if (options_.block_size > 0) register_buffer("tril", &tril_);
}

Head::~Head() = default;

AttentionBackend Head::last_backend() const { return core_->last_backend(); }

const Tensor& Head::tril() const {
  if (options_.block_size < 1)
    throw std::logic_error("Head: an encoder head with block_size 0 has no tril buffer");
  return tril_.get();  // (block_size, block_size)
}

const Tensor& Head::attention_weights() const {
  return core_->attention_weights();  // (B, T, T)
}

Tensor Head::forward(const Tensor& x) {
  // Only a decoder head is limited by its tril buffer of block_size tokens.
  check_btd("Head", x, {"n_embd", options_.n_embd},
            {"block_size", options_.causal ? options_.block_size : 0});
  return core_->forward(x);  // (B, T, head_size)
}

Tensor Head::backward(const Tensor& dy) {
  require_forward(core_->has_forward(), "Head");
  return core_->backward(dy);  // (B, T, n_embd)
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
  const Tensor heads_out = concat_heads_forward(heads, x);  // (B, T, num_heads * head_size)
  has_forward_ = true;
  // (B, T, num_heads * head_size) -> proj -> (B, T, n_embd) -> dropout
  return dropout.forward(proj.forward(heads_out));
}

Tensor MultiHead::backward(const Tensor& dy) {
  require_forward(has_forward_, "MultiHead");
  const Tensor dcat = proj.backward(dropout.backward(dy));        // (B, T, num_heads * head_size)
  return concat_heads_backward(heads, dcat, options_.head_size);  // (B, T, n_embd)
}

}  // namespace attn::nn
