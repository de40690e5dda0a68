// The gradients of softmax and dropout, the two non-linear steps of attention.
#include <fmt/format.h>

#include <stdexcept>

#include "attn/functional.h"
#include "attn/ops.h"

namespace attn::ref {

// y = softmax(x) along dim: dy_i/dx_j = y_i (δ_ij − y_j), so
// dx = y ⊙ (dy − Σ_dim dy ⊙ y).
Tensor softmax_backward(const Tensor& dy, const Tensor& y, int64_t dim) {
  if (dy.shape() != y.shape()) {
    throw std::invalid_argument(
        fmt::format("softmax_backward: dy shape {} does not match y shape {}",
                    shape_str(dy.shape()), shape_str(y.shape())));
  }
  if (dim < -y.dim() || dim >= y.dim()) {
    throw std::invalid_argument(fmt::format("softmax_backward: dim {} out of range for shape {}",
                                            dim, shape_str(y.shape())));
  }
  if (y.numel() == 0) return Tensor(y.shape());
  const Tensor dot_dy_y = sum(dy * y, dim, /*keepdim=*/true);  // Σ_dim dy ⊙ y, size 1 on dim
  return y * (dy - dot_dy_y);
}

Tensor dropout_forward(const Tensor& x, const Tensor& noise) {
  if (x.shape() != noise.shape()) {
    throw std::invalid_argument(
        fmt::format("dropout_forward: noise shape {} does not match input shape {}",
                    shape_str(noise.shape()), shape_str(x.shape())));
  }
  return x * noise;
}

// y = x ⊙ noise, so dx = dy ⊙ noise (dropped elements get no gradient).
Tensor dropout_backward(const Tensor& dy, const Tensor& noise) {
  if (dy.shape() != noise.shape()) {
    throw std::invalid_argument(
        fmt::format("dropout_backward: noise shape {} does not match dy shape {}",
                    shape_str(noise.shape()), shape_str(dy.shape())));
  }
  return dy * noise;
}

}  // namespace attn::ref
