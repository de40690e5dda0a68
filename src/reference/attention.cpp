// 2./3. Scaled dot-product attention with an optional causal mask and dropout
// on the weights, forward and backward, over any leading dims (B or B, H):
//   S = scale · q kᵀ                      (..., T_q, T_k)
//   S_ij = -inf for j > i when causal     (top-left corner, as triu(ones, 1)[:T_q, :T_k])
//   A = softmax(S, softmax_dim)           saved for backward
//   out = (A ⊙ noise) v                   (..., T_q, d_v)
#include <fmt/format.h>

#include <cmath>
#include <limits>
#include <stdexcept>

#include "attn/functional.h"
#include "attn/ops.h"

namespace attn::ref {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// The (T_q, T_k) future mask: 1 where key j comes after query i (j > i).
Tensor future_mask_rect(int64_t T_q, int64_t T_k) {
  Tensor mask({T_q, T_k});  // (T_q, T_k)
  for (int64_t i = 0; i < T_q; ++i) {
    for (int64_t j = i + 1; j < T_k; ++j) mask.data()[i * T_k + j] = 1.0f;
  }
  return mask;
}

// scores[..., i, j] = -inf for j > i in every (T_q, T_k) matrix, in place
// (what masked_fill(scores, future_mask_rect(T_q, T_k), -inf) gives).
void mask_future(Tensor& scores) {
  const int64_t T_q = scores.size(-2), T_k = scores.size(-1);
  const int64_t matrices = scores.numel() / (T_q * T_k);
  for (int64_t m = 0; m < matrices; ++m) {
    float* s = scores.data() + m * T_q * T_k;
    for (int64_t i = 0; i < T_q; ++i) {
      for (int64_t j = i + 1; j < T_k; ++j) s[i * T_k + j] = kNegInf;
    }
  }
}

Shape leading(const Tensor& a) { return Shape(a.shape().begin(), a.shape().end() - 2); }

// The softmax dim as a non-negative index into the (..., T_q, T_k) weights.
int64_t weights_dim(const AttentionOptions& options, int64_t rank) {
  const int64_t dim = options.softmax_dim < 0 ? options.softmax_dim + rank : options.softmax_dim;
  if (dim < 0 || dim >= rank) {
    throw std::invalid_argument(
        fmt::format("attention: softmax_dim {} out of range for weights of rank {}",
                    options.softmax_dim, rank));
  }
  return dim;
}

void check_qkv(const Tensor& q, const Tensor& k, const Tensor& v) {
  const auto fail = [&](const char* why) {
    throw std::invalid_argument(fmt::format("attention: {}: q {}, k {}, v {}", why,
                                            shape_str(q.shape()), shape_str(k.shape()),
                                            shape_str(v.shape())));
  };
  if (q.dim() < 2 || k.dim() != q.dim() || v.dim() != q.dim())
    fail("q, k, v must have the same rank >= 2");
  if (leading(q) != leading(k) || leading(q) != leading(v)) fail("leading dims differ");
  if (q.size(-1) != k.size(-1)) fail("q and k widths differ");
  if (k.size(-2) != v.size(-2)) fail("k and v token counts differ");
  if (q.numel() == 0 || k.numel() == 0 || v.numel() == 0) fail("empty input");
}

// scale · scores. The default divides by sqrt(d_k) in float, as the chapter's
// `attn_scores / keys.shape[-1]**0.5` does, so results match PyTorch's bits.
Tensor apply_scale(const Tensor& scores, const AttentionOptions& options, int64_t d_k) {
  if (options.scale < 0.0f) return scores / static_cast<float>(std::sqrt(static_cast<double>(d_k)));
  return scores * options.scale;
}

}  // namespace

Tensor attention_forward(const Tensor& q, const Tensor& k, const Tensor& v,
                         const AttentionOptions& options, const Tensor* dropout_noise,
                         AttentionSaved* saved) {
  check_qkv(q, k, v);
  const int64_t T_q = q.size(-2), T_k = k.size(-2), d_k = q.size(-1);
  const int64_t dim = weights_dim(options, q.dim());
  if (options.causal && dim < q.dim() - 2) {
    // A softmax across matrices meets masked entries that are -inf everywhere: NaN.
    throw std::invalid_argument(fmt::format(
        "attention: causal softmax over dim {} must be over keys or queries", options.softmax_dim));
  }
  if (options.causal && dim == q.dim() - 2 && T_q < T_k) {
    // Softmax over queries leaves keys j >= T_q with no unmasked entry: all -inf, NaN.
    throw std::invalid_argument(
        fmt::format("attention: causal softmax over dim {} needs T_q >= T_k, got T_q {} and T_k {}",
                    options.softmax_dim, T_q, T_k));
  }
  Tensor scores = apply_scale(matmul(q, transpose(k, -2, -1)), options, d_k);  // (..., T_q, T_k)
  if (options.causal) mask_future(scores);
  Tensor weights = softmax(scores, dim);  // (..., T_q, T_k)
  Tensor out;
  if (dropout_noise != nullptr) {
    if (dropout_noise->shape() != weights.shape()) {
      throw std::invalid_argument(
          fmt::format("attention: dropout noise shape {} does not match weights {}",
                      shape_str(dropout_noise->shape()), shape_str(weights.shape())));
    }
    out = matmul(weights * *dropout_noise, v);  // (..., T_q, d_v)
  } else {
    out = matmul(weights, v);  // (..., T_q, d_v)
  }
  if (saved != nullptr) {
    saved->weights = std::move(weights);
    saved->noise = dropout_noise != nullptr ? *dropout_noise : Tensor();
  }
  return out;
}

AttentionGrads attention_backward(const Tensor& dout, const Tensor& q, const Tensor& k,
                                  const Tensor& v, const AttentionSaved& saved,
                                  const AttentionOptions& options) {
  check_qkv(q, k, v);
  const int64_t T_q = q.size(-2), T_k = k.size(-2), d_k = q.size(-1);
  Shape out_shape = q.shape();
  out_shape.back() = v.size(-1);
  if (dout.shape() != out_shape) {
    throw std::invalid_argument(
        fmt::format("attention_backward: dout shape {} does not match output {}",
                    shape_str(dout.shape()), shape_str(out_shape)));
  }
  Shape w_shape = leading(q);
  w_shape.push_back(T_q);
  w_shape.push_back(T_k);
  if (saved.weights.shape() != w_shape) {
    throw std::invalid_argument(fmt::format("attention_backward: saved weights {} do not match {}",
                                            shape_str(saved.weights.shape()), shape_str(w_shape)));
  }
  const bool dropped = !saved.noise.empty();
  if (dropped && saved.noise.shape() != w_shape) {
    throw std::invalid_argument(fmt::format("attention_backward: saved noise {} does not match {}",
                                            shape_str(saved.noise.shape()), shape_str(w_shape)));
  }
  const int64_t dim = weights_dim(options, q.dim());

  // out = D v with D = A ⊙ noise:  dD = dout vᵀ,  dv = Dᵀ dout.
  const Tensor D = dropped ? saved.weights * saved.noise : saved.weights;  // (..., T_q, T_k)
  AttentionGrads g;
  g.dv = matmul(transpose(D, -2, -1), dout);       // (..., T_k, d_v)
  Tensor dA = matmul(dout, transpose(v, -2, -1));  // (..., T_q, T_k)
  if (dropped) dA = dA * saved.noise;
  // Masked scores have A = 0, so softmax_backward gives them no gradient.
  Tensor dS = softmax_backward(dA, saved.weights, dim);  // (..., T_q, T_k)
  dS = apply_scale(dS, options, d_k);                    // S = scale · q kᵀ
  g.dq = matmul(dS, k);                                  // (..., T_q, d_k)
  g.dk = matmul(transpose(dS, -2, -1), q);               // (..., T_k, d_k)
  return g;
}

Tensor causal_weights_renormalized(const Tensor& scores, float scale) {
  if (scores.dim() < 2) {
    throw std::invalid_argument(
        fmt::format("causal_weights_renormalized: scores must be (..., T, T), got {}",
                    shape_str(scores.shape())));
  }
  const Tensor weights = softmax(scores * scale, -1);  // every key, future included
  const Tensor masked = tril(weights);                 // zero j > i
  return masked / sum(masked, -1, /*keepdim=*/true);   // rows sum to 1 again
}

Tensor causal_weights_masked(const Tensor& scores, float scale) {
  if (scores.dim() < 2) {
    throw std::invalid_argument(fmt::format(
        "causal_weights_masked: scores must be (..., T, T), got {}", shape_str(scores.shape())));
  }
  const Tensor mask = future_mask_rect(scores.size(-2), scores.size(-1));  // (T_q, T_k)
  return softmax(masked_fill(scores * scale, mask, kNegInf), -1);          // exp(-inf) = 0
}

Tensor tril_ones(int64_t n) {
  if (n < 0) throw std::invalid_argument(fmt::format("tril_ones: n must be >= 0, got {}", n));
  return tril(Tensor::ones({n, n}));
}

Tensor future_mask(int64_t n) {
  if (n < 0) throw std::invalid_argument(fmt::format("future_mask: n must be >= 0, got {}", n));
  return future_mask_rect(n, n);
}

}  // namespace attn::ref
