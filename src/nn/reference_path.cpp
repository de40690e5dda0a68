// The reference path of the attention core (src/nn/attention_core.h): the
// module's Linear layers around ref::attention_forward / attention_backward,
// the plain maths, with PyTorch's dropout masks (Dropout::sample_noise, the
// MT19937 stream) and PyTorch's numbers. Keeps q, k, v and the softmax
// weights (and the dropout noise) for backward.
#include <memory>

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
    const Shape weights = s_.head_axis ? Shape{B_, s_.num_heads, T_, T_} : Shape{B_, T_, T_};
    const Tensor noise = s_.dropout->sample_noise(weights);  // empty when dropout is off
    const Tensor context =
        ref::attention_forward(q_, k_, v_, s_.attention, noise.empty() ? nullptr : &noise, &saved_);
    if (s_.out_proj == nullptr) return merge_heads(context);  // (B, T, width)
    return s_.out_proj->forward(merge_heads(context));        // (B, T, width)
  }

  Tensor backward(const Tensor& dy) override {
    check_grad(s_.module, dy, {B_, T_, s_.width});
    const Tensor dcontext = s_.out_proj == nullptr ? dy : s_.out_proj->backward(dy);
    const ref::AttentionGrads g =
        ref::attention_backward(split_heads(dcontext), q_, k_, v_, saved_, s_.attention);
    Tensor dx = s_.W_query->backward(merge_heads(g.dq));  // (B, T, d_in)
    dx += s_.W_key->backward(merge_heads(g.dk));
    dx += s_.W_value->backward(merge_heads(g.dv));
    return dx;
  }

  const Tensor& attention_weights() const override { return saved_.weights; }

  void release() override {
    q_ = k_ = v_ = Tensor();
    saved_ = {};
  }

 private:
  // (B, T, width) viewed as (B, T, H, hd), heads to the front: (B, H, T, hd);
  // a one-head module keeps (B, T, hd).
  Tensor split_heads(const Tensor& t) const {
    if (!s_.head_axis) return t;
    return transpose(t.reshape({B_, T_, s_.num_heads, s_.width / s_.num_heads}), 1, 2);
  }
  // (B, H, T, hd) -> (B, T, H, hd) -> (B, T, width).
  Tensor merge_heads(const Tensor& t) const {
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
