// The reference-or-fused choice and the fused block's plumbing shared by the
// attention modules (src/nn/backend.h).
#include "nn/backend.h"

#include <fmt/format.h>

#include <stdexcept>

#include "attn/ops.h"
#include "nn/checks.h"

namespace attn::nn::detail {

void check_fused_request(const char* module, AttentionBackend backend, int64_t head_dim,
                         float dropout, int64_t softmax_dim) {
  if (backend != AttentionBackend::kFused) return;
  if (head_dim > kFusedMaxHeadDim) {
    throw std::invalid_argument(
        fmt::format("{}: backend = kFused needs head_dim <= {}, got {}; use kAuto or kReference",
                    module, kFusedMaxHeadDim, head_dim));
  }
  if (dropout >= 1.0f) {
    throw std::invalid_argument(
        fmt::format("{}: backend = kFused needs dropout < 1, got {}; use kAuto or kReference",
                    module, dropout));
  }
  if (softmax_dim != -1 && softmax_dim != 2) {
    throw std::invalid_argument(fmt::format(
        "{}: backend = kFused computes the softmax over the keys only, got softmax_dim = {}",
        module, softmax_dim));
  }
}

AttentionBackend choose(AttentionBackend requested, const Dropout& dropout, bool exact_dropout,
                        bool kernel_can) {
  if (requested != AttentionBackend::kAuto) return requested;
  if (!kernel_can) return AttentionBackend::kReference;
  if (dropout.is_active() && (exact_dropout || dropout.options().p >= 1.0f))
    return AttentionBackend::kReference;
  return AttentionBackend::kFused;
}

fused::AttentionBlockOptions fused_options(int64_t num_heads, Dropout& dropout,
                                           const ref::AttentionOptions& attention) {
  fused::AttentionBlockOptions o{
      .num_heads = num_heads, .causal = attention.causal, .scale = attention.scale};
  if (dropout.is_active()) {
    o.dropout_p = dropout.options().p;
    o.dropout_seed = dropout.draw_seed();
  }
  return o;
}

fused::ProjectionWeights projection_weights(const Linear& W_query, const Linear& W_key,
                                            const Linear& W_value, const Linear* out_proj) {
  const auto bias = [](const Linear& l) { return l.options().bias ? &l.bias.value : nullptr; };
  fused::ProjectionWeights w{.W_query = &W_query.weight.value,
                             .W_key = &W_key.weight.value,
                             .W_value = &W_value.weight.value,
                             .b_query = bias(W_query),
                             .b_key = bias(W_key),
                             .b_value = bias(W_value)};
  if (out_proj != nullptr) {
    w.W_out = &out_proj->weight.value;
    w.b_out = bias(*out_proj);
  }
  return w;
}

fused::ProjectionGrads projection_grads(Linear& W_query, Linear& W_key, Linear& W_value,
                                        Linear* out_proj) {
  const auto bias_grad = [](Linear& l) { return l.options().bias ? &l.bias.grad : nullptr; };
  fused::ProjectionGrads g{.W_query = &W_query.weight.grad,
                           .W_key = &W_key.weight.grad,
                           .W_value = &W_value.weight.grad,
                           .b_query = bias_grad(W_query),
                           .b_key = bias_grad(W_key),
                           .b_value = bias_grad(W_value)};
  if (out_proj != nullptr) {
    g.W_out = &out_proj->weight.grad;
    g.b_out = bias_grad(*out_proj);
  }
  return g;
}

Tensor fused_backward(const char* module, const Tensor& dy, int64_t width,
                      const fused::ProjectionWeights& w, fused::AttentionBlockSaved& saved,
                      const fused::ProjectionGrads& grads) {
  const Tensor& x = saved.x;  // (B, T, d_in)
  check_grad(module, dy, {x.size(0), x.size(1), width});
  return fused::attention_block_backward(dy, w, saved, grads);
}

Tensor recomputed_weights(const fused::AttentionBlockSaved& s) {
  const int64_t B = s.params.B, T = s.params.T, H = s.params.H, hd = s.params.hd;
  const Tensor qkv = s.qkv.reshape({B, T, 3 * H, hd});        // (B, T, 3·H, hd)
  const Tensor q = transpose(slice(qkv, 2, 0, H), 1, 2);      // (B, H, T, hd)
  const Tensor k = transpose(slice(qkv, 2, H, 2 * H), 1, 2);  // (B, H, T, hd)
  ref::AttentionSaved saved;
  ref::attention_forward(q, k, k, {.causal = s.params.causal, .scale = s.params.scale}, nullptr,
                         &saved);
  return saved.weights;  // (B, H, T, T)
}

Tensor recomputed_head_weights(const fused::AttentionBlockSaved& s) {
  const int64_t B = s.params.B, T = s.params.T;
  return recomputed_weights(s).reshape({B, T, T});  // (B, 1, T, T) -> (B, T, T)
}

}  // namespace attn::nn::detail
