// The fused path of the attention core (src/nn/attention_core.h):
// fused::attention_block_forward / _backward (attn/fused.h), BLAS projections
// into one qkv buffer around the flash kernel, with the module's Linear
// weights read in place. Keeps x, qkv, the context and the log-sum-exp,
// never a (T, T) tensor; its buffers are reused by the next step of the same
// shape. Dropout: one random64() from the module's generator per forward,
// the Philox seed of the kernel's masks (not PyTorch's).
#include <memory>
#include <utility>

#include "attn/fused.h"
#include "nn/attention_core.h"
#include "nn/checks.h"

namespace attn::nn::detail {
namespace {

// The block's weights (slot = &Parameter::value) or gradient slots (slot =
// &Parameter::grad) from the spec's Linear layers; a bias only where the
// layer has one, the output projection only where the module has one.
template <class Slots>
Slots projection_slots(const AttentionSpec& s, Tensor Parameter::*slot) {
  const auto bias = [&](Linear& l) { return l.options().bias ? &(l.bias.*slot) : nullptr; };
  Slots p{.W_query = &(s.W_query->weight.*slot),
          .W_key = &(s.W_key->weight.*slot),
          .W_value = &(s.W_value->weight.*slot),
          .b_query = bias(*s.W_query),
          .b_key = bias(*s.W_key),
          .b_value = bias(*s.W_value)};
  if (s.out_proj != nullptr) {
    p.W_out = &(s.out_proj->weight.*slot);
    p.b_out = bias(*s.out_proj);
  }
  return p;
}
fused::ProjectionWeights projection_weights(const AttentionSpec& s) {
  return projection_slots<fused::ProjectionWeights>(s, &Parameter::value);
}
fused::ProjectionGrads projection_grads(const AttentionSpec& s) {
  return projection_slots<fused::ProjectionGrads>(s, &Parameter::grad);
}

class FusedPath final : public AttentionPath {
 public:
  explicit FusedPath(const AttentionSpec& spec) : s_(spec) {}

  AttentionBackend backend() const override { return AttentionBackend::kFused; }

  Tensor forward(const Tensor& x) override {
    weights_ = Tensor();
    fused::AttentionBlockOptions o{.num_heads = s_.num_heads,
                                   .causal = s_.attention.causal,
                                   .scale = s_.attention.scale,
                                   .dtype = s_.dtype,
                                   .rope_cos = s_.rope != nullptr ? &s_.rope->cos : nullptr,
                                   .rope_sin = s_.rope != nullptr ? &s_.rope->sin : nullptr};
    if (s_.dropout->is_active()) {
      o.dropout_p = s_.dropout->options().p;
      o.dropout_seed = s_.dropout->draw_seed();  // one random64() per forward
    }
    return fused::attention_block_forward(x, projection_weights(s_), o, &saved_);  // (B, T, width)
  }

  Tensor backward(const Tensor& dy) override {
    check_grad(s_.module, dy, {saved_.params.B, saved_.params.T, s_.width});
    return fused::attention_block_backward(dy, projection_weights(s_), saved_,
                                           projection_grads(s_));  // (B, T, d_in)
  }

  // Recomputed with the reference maths (the saved causal flag and scale)
  // from the q and k saved in qkv (B, T, 3·width), on first use.
  const Tensor& attention_weights() const override {
    if (!weights_.empty()) return weights_;
    const int64_t B = saved_.params.B, T = saved_.params.T, H = saved_.params.H;
    const int64_t hd = saved_.params.hd;
    const Tensor qkv =
        saved_.qkv.to(DType::kFloat32).reshape({B, T, 3 * H, hd});  // (B, T, 3·H, hd)
    const Tensor q = transpose(slice(qkv, 2, 0, H), 1, 2);          // (B, H, T, hd)
    const Tensor k = transpose(slice(qkv, 2, H, 2 * H), 1, 2);      // (B, H, T, hd)
    ref::AttentionSaved saved;
    ref::attention_forward(q, k, k, {.causal = saved_.params.causal, .scale = saved_.params.scale},
                           nullptr, &saved);
    weights_ = s_.head_axis ? std::move(saved.weights)           // (B, H, T, T)
                            : saved.weights.reshape({B, T, T});  // (B, 1, T, T) -> (B, T, T)
    return weights_;
  }

  void release() override {
    saved_ = {};
    weights_ = Tensor();
  }

 private:
  AttentionSpec s_;
  fused::AttentionBlockSaved saved_;
  mutable Tensor weights_;  // attention_weights(), filled on first use
};

}  // namespace

std::unique_ptr<AttentionPath> make_fused_path(const AttentionSpec& spec) {
  return std::make_unique<FusedPath>(spec);
}

}  // namespace attn::nn::detail
