// 1. Simplified self-attention: no trainable weights, scores are plain dot
// products of the inputs, W = X Xᵀ, A = normalise(W) row-wise, Z = A X.
#include <fmt/format.h>

#include <stdexcept>

#include "attn/functional.h"
#include "attn/ops.h"

namespace attn::ref {
namespace {

// The three normalisations of the lesson, along the last dim.
Tensor normalise(const Tensor& scores, Normalization norm) {
  switch (norm) {
    case Normalization::kSum:
      return normalize_sum(scores, -1);
    case Normalization::kSoftmaxNaive:
      return softmax_naive(scores, -1);
    case Normalization::kSoftmax:
      return softmax(scores, -1);
  }
  throw std::invalid_argument("simplified_attention: unknown normalization");
}

void check_inputs(const char* fn, const Tensor& inputs) {
  if (inputs.dim() != 2 || inputs.size(0) < 1 || inputs.size(1) < 1) {
    throw std::invalid_argument(fmt::format(
        "{}: inputs must be (T, d) with T, d >= 1, got shape {}", fn, shape_str(inputs.shape())));
  }
}

}  // namespace

SimplifiedAttention simplified_attention(const Tensor& inputs, Normalization norm) {
  check_inputs("simplified_attention", inputs);
  SimplifiedAttention r;
  r.scores = matmul(inputs, t(inputs));   // (T, T)  w_ij = x_i · x_j
  r.weights = normalise(r.scores, norm);  // (T, T)  rows sum to 1
  r.context = matmul(r.weights, inputs);  // (T, d)  z_i = Σ_j a_ij x_j
  return r;
}

SimplifiedAttention simplified_attention_query(const Tensor& inputs, const Tensor& x_query,
                                               Normalization norm) {
  check_inputs("simplified_attention_query", inputs);
  if (x_query.shape() != Shape{inputs.size(1)}) {
    throw std::invalid_argument(
        fmt::format("simplified_attention_query: query shape {} is not ({},)",
                    shape_str(x_query.shape()), inputs.size(1)));
  }
  SimplifiedAttention r;
  r.scores = matmul(inputs, x_query);     // (T)  w_i = x_i · x_q
  r.weights = normalise(r.scores, norm);  // (T)
  r.context = matmul(r.weights, inputs);  // (d)  z_q = Σ_i a_i x_i
  return r;
}

Tensor attention_scores_loops(const Tensor& inputs) {
  check_inputs("attention_scores_loops", inputs);
  const int64_t T = inputs.size(0), d = inputs.size(1);
  const Tensor dense = inputs.contiguous();
  const float* x = dense.data();  // (T, d) row-major
  Tensor scores({T, T});  // (T, T)
  for (int64_t i = 0; i < T; ++i) {
    for (int64_t j = 0; j < T; ++j) {
      float w = 0.0f;  // x_i · x_j
      for (int64_t c = 0; c < d; ++c) w += x[i * d + c] * x[j * d + c];
      scores.data()[i * T + j] = w;
    }
  }
  return scores;
}

}  // namespace attn::ref
