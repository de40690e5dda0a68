// The gradients of softmax and dropout, the two non-linear steps of attention.
#include <fmt/format.h>

#include <stdexcept>

#include "attn/functional.h"
#include "attn/ops.h"

namespace attn::ref {

// y = softmax(x) along dim: dy_i/dx_j = y_i (δ_ij − y_j), so
// dx = y ⊙ (dy − Σ_dim dy ⊙ y).
Tensor softmax_backward(const Tensor& dy_in, const Tensor& y_in, int64_t dim) {
  const Tensor dy = dy_in.contiguous(), y = y_in.contiguous();  // read row-major below
  if (dy.shape() != y.shape()) {
    throw std::invalid_argument(
        fmt::format("softmax_backward: dy shape {} does not match y shape {}",
                    shape_str(dy.shape()), shape_str(y.shape())));
  }
  if (dim < -y.dim() || dim >= y.dim()) {
    throw std::invalid_argument(fmt::format("softmax_backward: dim {} out of range for shape {}",
                                            dim, shape_str(y.shape())));
  }
  // View y as (outer, n, inner) with n = y.size(dim): one softmax per (outer, inner).
  const int64_t d = dim < 0 ? dim + y.dim() : dim;
  const int64_t n = y.shape()[d];
  int64_t outer = 1, inner = 1;
  for (int64_t i = 0; i < d; ++i) outer *= y.shape()[i];
  for (int64_t i = d + 1; i < y.dim(); ++i) inner *= y.shape()[i];
  Tensor dx(y.shape());
  for (int64_t o = 0; o < outer; ++o) {
    const int64_t base = o * n * inner;
    for (int64_t i = 0; i < inner; ++i) {
      const float* yv = y.data() + base + i;
      const float* dyv = dy.data() + base + i;
      float* dxv = dx.data() + base + i;
      float dot_dy_y = 0.0f;  // Σ_j dy_j y_j
      for (int64_t j = 0; j < n; ++j) dot_dy_y += dyv[j * inner] * yv[j * inner];
      for (int64_t j = 0; j < n; ++j) dxv[j * inner] = yv[j * inner] * (dyv[j * inner] - dot_dy_y);
    }
  }
  return dx;
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
