// attn/functional_gpt.h - the plain fp32 maths of the GPT model around the
// attention (the book's chapter 4), forward and backward: layer normalisation,
// the tanh form of GELU, and the cross-entropy loss; and the RMS normalisation
// of today's open models (Llama, Qwen, Gemma: the book's bonus chapters).
//
// The same conventions as attn/functional.h (namespace attn::ref): forward
// returns its output and fills a "saved" struct with what backward reads;
// backward takes the output gradient and returns the input gradient,
// accumulating (+=) parameter gradients into the tensors it is given.
//
// Shapes: x (..., C) with C = emb_dim; the leading dims are flattened to N
// rows. Logits (B, T, V) with V = vocab_size, targets (B, T) int64.
#pragma once

#include <cstdint>
#include <vector>

#include "attn/tensor.h"

namespace attn::ref {

// ---- layer normalisation ----------------------------------------------------------
// The book's LayerNorm:  mean = x.mean(-1),  var = x.var(-1, unbiased=False),
//   y = scale ⊙ (x − mean) / sqrt(var + eps) + shift.
// mean is PyTorch's float mean (the same bits); var is summed in double and
// rounded once, as PyTorch's Welford reduction does.
struct LayerNormSaved {
  Tensor mean;  // (N) the row means, float
  Tensor std;   // (N) sqrt(var + eps), float: the divisor forward used
};
// x (..., C), scale (C), shift (C) -> (..., C).
Tensor layer_norm_forward(const Tensor& x, const Tensor& scale, const Tensor& shift, float eps,
                          LayerNormSaved* saved);
// With x̂ = (x − mean) / std and g = dy ⊙ scale, per row:
//   dx = (g − mean(g) − x̂ ⊙ mean(g ⊙ x̂)) / std,
//   dscale += Σ_rows dy ⊙ x̂,   dshift += Σ_rows dy.
Tensor layer_norm_backward(const Tensor& dy, const Tensor& x, const Tensor& scale,
                           const LayerNormSaved& saved, Tensor& dscale, Tensor& dshift);

// ---- RMS normalisation (Llama 3, Qwen3, Gemma 3) -------------------------------------
// y = x · rsqrt(mean(x²) + eps) · (weight + weight_offset), per row, as
// transformers' LlamaRMSNorm / Qwen3RMSNorm (weight_offset 0: the weight
// starts at 1) and Gemma3RMSNorm (weight_offset 1: the stored weight starts at
// 0 and the row is scaled by 1 + weight). mean(x²) is summed in double and
// rounded once; rsqrt is 1 / sqrt in float.
struct RmsNormSaved {
  Tensor inv_rms;  // (N) rsqrt(mean(x²) + eps), float: the factor forward used
};
// x (..., C) float32, weight (C) -> (..., C). Throws std::invalid_argument
// naming the values for another dtype, an empty last dim, a weight of another
// shape, or an eps < 0 or not finite.
Tensor rms_norm_forward(const Tensor& x, const Tensor& weight, float eps, float weight_offset,
                        RmsNormSaved* saved);
// With r = inv_rms, x̂ = x · r and g = dy ⊙ (weight + weight_offset), per row:
//   dx = r · (g − x̂ ⊙ mean(g ⊙ x̂)),   dweight += Σ_rows dy ⊙ x̂.
Tensor rms_norm_backward(const Tensor& dy, const Tensor& x, const Tensor& weight,
                         float weight_offset, const RmsNormSaved& saved, Tensor& dweight);

// ---- GELU, the tanh approximation --------------------------------------------------
// gelu(x) = 0.5 x (1 + tanh(√(2/π) (x + 0.044715 x³))), in the book's float order.
Tensor gelu_forward(const Tensor& x);
// With u = √(2/π) (x + 0.044715 x³) and t = tanh(u):
//   dx = dy ⊙ (0.5 (1 + t) + 0.5 x (1 − t²) √(2/π) (1 + 3 · 0.044715 x²)).
Tensor gelu_backward(const Tensor& dy, const Tensor& x);

// ---- cross-entropy -------------------------------------------------------------------
// torch.nn.functional.cross_entropy(logits.flatten(0, -2), targets.flatten()):
// the mean over the counted rows of  logsumexp(logits[n]) − logits[n, targets[n]],
// rows whose target is ignore_index not counted (no counted row gives NaN, as
// PyTorch). Summed in double; the loss is returned as float.
constexpr int64_t kIgnoreIndex = -100;  // PyTorch's default ignore_index
struct CrossEntropySaved {
  Tensor probs;                  // (N, V) softmax of the logits
  std::vector<int64_t> targets;  // (N)
  int64_t counted = 0;           // rows whose target is not ignore_index
  int64_t ignore_index = kIgnoreIndex;
  Shape logits_shape;
};
// logits (..., V) float32, targets (...) int64 with values in [0, V) or ignore_index.
float cross_entropy_forward(const Tensor& logits, const Tensor& targets, CrossEntropySaved* saved,
                            int64_t ignore_index = kIgnoreIndex);
// dlogits (..., V) = dloss · (softmax − onehot(target)) / counted; ignored rows get 0.
Tensor cross_entropy_backward(float dloss, const CrossEntropySaved& saved);

}  // namespace attn::ref
