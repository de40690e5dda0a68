// The reference path of the attention core (src/nn/attention_core.h): the
// module's Linear layers around ref::attention_forward / attention_backward,
// the plain maths, with PyTorch's dropout masks (Dropout::sample_noise, the
// MT19937 stream) and PyTorch's numbers. Keeps q, k, v and the softmax
// weights (and the dropout noise) for backward. With RoPE, q and k are
// rotated after the projections (and saved rotated), dq and dk rotated back.
#include <memory>
#include <utility>

#include "nn/attention_core.h"
#include "nn/checks.h"

namespace attn::nn::detail {
namespace {

class ReferencePath final : public AttentionPath {
 public:
  explicit ReferencePath(const AttentionSpec& spec) : s_(spec) {}

  AttentionBackend backend() const override { return AttentionBackend::kReference; }

  Tensor forward(const Tensor& x) override {
    B_ = x.size(0);
    T_ = x.size(1);
    q_ = split_heads(s_.W_query->forward(x));  // (B, H, T, hd) or (B, T, hd)
    k_ = split_heads(s_.W_key->forward(x));
    v_ = split_heads(s_.W_value->forward(x));
    if (s_.rope != nullptr) {  // q, k (B, H, T, hd) rotated in place, positions 0 .. T-1
      apply_rope_(q_, s_.rope->cos, s_.rope->sin);
      apply_rope_(k_, s_.rope->cos, s_.rope->sin);
    }
    const Shape weights = s_.head_axis ? Shape{B_, s_.num_heads, T_, T_} : Shape{B_, T_, T_};
    const Tensor noise = s_.dropout->sample_noise(weights);  // empty when dropout is off
    Tensor context = merge_heads(ref::attention_forward(
        q_, k_, v_, s_.attention, noise.empty() ? nullptr : &noise, &saved_));  // (B, T, width)
    if (s_.out_proj == nullptr) return context;
    return s_.out_proj->forward(context);  // (B, T, width)
  }

  Tensor backward(const Tensor& dy) override {
    check_grad(s_.module, dy, {B_, T_, s_.width});
    // One head and no projection: dy is the context's gradient as it stands.
    if (s_.out_proj == nullptr && !s_.head_axis) return backward_from_context(dy);
    Tensor dcontext = s_.out_proj != nullptr ? s_.out_proj->backward(dy) : dy;  // (B, T, width)
    return backward_from_context(split_heads(std::move(dcontext)));
  }

  const Tensor& attention_weights() const override { return saved_.weights; }

  void release() override {
    q_ = k_ = v_ = Tensor();
    saved_ = {};
  }

 private:
  // dcontext in the layout of q, k, v -> dx (B, T, d_in), through the three projections.
  Tensor backward_from_context(const Tensor& dcontext) {
    ref::AttentionGrads g = ref::attention_backward(dcontext, q_, k_, v_, saved_, s_.attention);
    if (s_.rope != nullptr) {  // back through the rotation
      apply_rope_backward_(g.dq, s_.rope->cos, s_.rope->sin);
      apply_rope_backward_(g.dk, s_.rope->cos, s_.rope->sin);
    }
    Tensor dx = s_.W_query->backward(merge_heads(std::move(g.dq)));  // (B, T, d_in)
    dx += s_.W_key->backward(merge_heads(std::move(g.dk)));
    dx += s_.W_value->backward(merge_heads(std::move(g.dv)));
    return dx;
  }
  // (B, T, width) viewed as (B, T, H, hd), heads to the front: (B, H, T, hd),
  // made contiguous once here (q, k and v are each read several times by the
  // products of forward and backward, which would otherwise each copy the
  // strided view); a one-head module keeps (B, T, hd). Taken by value: no
  // copy when it stays.
  Tensor split_heads(Tensor t) const {
    if (!s_.head_axis) return t;
    return transpose(t.reshape({B_, T_, s_.num_heads, s_.width / s_.num_heads}), 1, 2).contiguous();
  }
  // (B, H, T, hd) -> (B, T, H, hd) -> (B, T, width).
  Tensor merge_heads(Tensor t) const {
    if (!s_.head_axis) return t;
    return transpose(t, 1, 2).reshape({B_, T_, s_.width});
  }

  AttentionSpec s_;
  int64_t B_ = 0, T_ = 0;
  Tensor q_, k_, v_;  // (B, H, T, hd) or (B, T, hd)
  ref::AttentionSaved saved_;
};

}  // namespace

std::unique_ptr<AttentionPath> make_reference_path(const AttentionSpec& spec) {
  return std::make_unique<ReferencePath>(spec);
}

}  // namespace attn::nn::detail
