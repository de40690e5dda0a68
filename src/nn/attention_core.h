// src/nn/attention_core.h - the attention core of CausalAttention,
// MultiHeadAttention and Head, behind one interface.
//
// A module describes itself once (AttentionSpec: heads, width, the reference
// options, its Linear layers and dropout, its weights layout) and hands every
// forward and backward to an AttentionCore. The core picks a path per forward
// by the rule at the top of attn/nn.h and keeps the chosen path's saved state:
//
//   module ──> AttentionCore ── choose() ──> AttentionPath
//                                             ├─ ReferencePath  Linear layers + ref::attention_*
//                                             │                 (PyTorch's dropout masks)
//                                             └─ FusedPath      fused::attention_block_*
//                                                               (BLAS + flash kernel, Philox masks)
//
// A further path (bf16, a GPU) is one more AttentionPath, an AttentionBackend
// value, and its case in choose() and AttentionCore::path(). The wrapper modules
// (MultiHeadAttentionWrapper, MultiHead) run whole modules side by side:
// concat_heads_forward/_backward.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "attn/functional.h"
#include "attn/nn.h"
#include "attn/ops.h"
#include "attn/tensor.h"

namespace attn::nn::detail {

// What a module is, as far as its attention is concerned; pointers into the
// module, which is neither copyable nor movable.
struct AttentionSpec {
  const char* module = "";  // names the module in error messages
  int64_t num_heads = 1;    // H
  int64_t width = 0;        // H · hd: the width of q, k, v, the context and y
  // true: per-head tensors (B, H, T, hd) and weights (B, H, T, T) (MultiHeadAttention);
  // false: one head kept as (B, T, hd), weights (B, T, T) (CausalAttention, Head).
  bool head_axis = false;
  ref::AttentionOptions attention;  // causal, scale (< 0: 1/sqrt(hd)), softmax_dim
  Linear* W_query = nullptr;        // d_in -> width, each
  Linear* W_key = nullptr;
  Linear* W_value = nullptr;
  Linear* out_proj = nullptr;                          // width -> width, or nullptr: y = context
  Dropout* dropout = nullptr;                          // on the attention weights
  AttentionBackend backend = AttentionBackend::kAuto;  // the module's options
  bool exact_dropout = true;
  DType dtype = DType::kFloat32;     // kBFloat16: the fused path in mixed precision
  const RopeParams* rope = nullptr;  // RoPE of q and k (head_axis modules), or none
};

// One way to compute the core. forward() keeps what backward() needs;
// backward() accumulates the parameter gradients into the spec's layers.
class AttentionPath {
 public:
  virtual ~AttentionPath() = default;
  virtual AttentionBackend backend() const = 0;
  // x (B, T, d_in) -> y (B, T, width); dropout drawn from spec.dropout's generator.
  virtual Tensor forward(const Tensor& x) = 0;
  // dy (B, T, width) -> dx (B, T, d_in); the module's gradient-shape error otherwise.
  virtual Tensor backward(const Tensor& dy) = 0;
  // The softmax weights of the last forward, before dropout, in the spec's layout.
  virtual const Tensor& attention_weights() const = 0;
  // Forget the saved state (another path took the last forward).
  virtual void release() = 0;
};

std::unique_ptr<AttentionPath> make_reference_path(
    const AttentionSpec& spec);                                             // reference_path.cpp
std::unique_ptr<AttentionPath> make_fused_path(const AttentionSpec& spec);  // fused_path.cpp

// The dispatcher a module holds: one path per forward, the other paths released.
class AttentionCore {
 public:
  explicit AttentionCore(const AttentionSpec& spec);
  Tensor forward(const Tensor& x);    // x checked by the module
  Tensor backward(const Tensor& dy);  // after a forward (the module checks)
  bool has_forward() const { return last_ != nullptr; }
  // kReference or kFused; kAuto before any forward.
  AttentionBackend last_backend() const;
  // Empty before any forward; after a fused one recomputed on first use.
  const Tensor& attention_weights() const;

 private:
  AttentionPath& path(AttentionBackend backend);
  AttentionSpec spec_;
  bool kernel_can_;  // the flash kernel computes this configuration (head_dim, softmax axis)
  std::unique_ptr<AttentionPath> reference_, fused_;
  AttentionPath* last_ = nullptr;
};

// kAuto: fused whenever the results may differ from the reference only by
// rounding, or the caller allows other dropout masks; reference otherwise.
// kernel_can: the module's configuration is one the kernel computes.
AttentionBackend choose(AttentionBackend requested, const Dropout& dropout, bool exact_dropout,
                        bool kernel_can);

// backend = kFused asked for what the kernel cannot do: an error at
// construction naming the values (head_dim > kernels::kMaxHeadDim, dropout >= 1,
// a softmax over the queries: softmax_dim other than -1 or 2).
void check_fused_request(const char* module, AttentionBackend backend, int64_t head_dim,
                         float dropout, int64_t softmax_dim = -1);

// ---- heads side by side (MultiHeadAttentionWrapper, MultiHead) --------------------------

// y = [head_0(x), head_1(x), ...] on the last axis: (B, T, num_heads · width).
template <class HeadModule>
Tensor concat_heads_forward(std::vector<std::unique_ptr<HeadModule>>& heads, const Tensor& x) {
  std::vector<Tensor> outs;
  outs.reserve(heads.size());
  for (auto& head : heads) outs.push_back(head->forward(x));  // (B, T, width) each
  return cat(outs, -1);                                       // (B, T, num_heads · width)
}

// dy (B, T, num_heads · width): head h takes columns [h·width, (h+1)·width);
// dx = Σ_h dx_h (B, T, d_in).
template <class HeadModule>
Tensor concat_heads_backward(std::vector<std::unique_ptr<HeadModule>>& heads, const Tensor& dy,
                             int64_t width) {
  Tensor dx;
  for (size_t h = 0; h < heads.size(); ++h) {
    const int64_t begin = static_cast<int64_t>(h) * width;
    const Tensor dx_h = heads[h]->backward(slice(dy, -1, begin, begin + width));  // (B, T, d_in)
    if (h == 0) {
      dx = dx_h;
    } else {
      dx += dx_h;
    }
  }
  return dx;
}

}  // namespace attn::nn::detail
