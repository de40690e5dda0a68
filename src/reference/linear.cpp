// Linear maps and their gradients: y = x Wᵀ + b (nn.Linear) and y = x W (a plain
// parameter, SelfAttention_v1). Leading dims of x are flattened to N rows.
#include <fmt/format.h>

#include <algorithm>
#include <stdexcept>

#include "attn/functional.h"
#include "attn/gemm.h"
#include "attn/layer_kernels.h"
#include "attn/ops.h"

namespace attn::ref {
namespace {

// (..., features) -> (N, features), the rows every linear map works on.
Tensor as_rows(const Tensor& x) { return x.reshape({-1, x.size(-1)}); }

// The input shape with its last dim replaced by `features`.
Shape with_last_dim(Shape shape, int64_t features) {
  shape.back() = features;
  return shape;
}

void check_matrix(const char* fn, const char* what, const Tensor& w) {
  if (w.dim() != 2) {
    throw std::invalid_argument(
        fmt::format("{}: {} must be 2-D, got shape {}", fn, what, shape_str(w.shape())));
  }
}

// dst += src, shapes equal (parameter-gradient accumulation).
void accumulate(Tensor& dst, const Tensor& src, const char* fn, const char* what) {
  if (dst.shape() != src.shape()) {
    throw std::invalid_argument(fmt::format("{}: {} has shape {}, expected {}", fn, what,
                                            shape_str(dst.shape()), shape_str(src.shape())));
  }
  float* d = dst.data();
  const float* s = src.data();
  for (int64_t i = 0; i < dst.numel(); ++i) d[i] += s[i];
}

void check_vector_shape(const Tensor& dbias, int64_t out) {
  if (dbias.shape() != Shape{out}) {
    throw std::invalid_argument(fmt::format("linear_backward: dbias has shape {}, expected ({},)",
                                            shape_str(dbias.shape()), out));
  }
}

}  // namespace

Tensor linear_forward(const Tensor& x_in, const Tensor& weight_in, const Tensor* bias,
                      gemm::Engine engine) {
  const Tensor x = x_in.contiguous(), weight = weight_in.contiguous();  // sgemm reads them dense
  check_matrix("linear_forward", "weight", weight);
  const int64_t out = weight.size(0), in = weight.size(1);
  if (x.dim() < 1 || x.size(-1) != in) {
    throw std::invalid_argument(fmt::format(
        "linear_forward: input shape {} does not end in in_features {}", shape_str(x.shape()), in));
  }
  if (bias != nullptr && bias->shape() != Shape{out}) {
    throw std::invalid_argument(
        fmt::format("linear_forward: bias shape {} is not ({},)", shape_str(bias->shape()), out));
  }
  const Shape y_shape = with_last_dim(x.shape(), out);
  if (x.numel() == 0 || out == 0) return Tensor(y_shape);
  // y (N, out) = x (N, in) Wᵀ with W handed to sgemm as transposed, as torch's
  // mm(x, weight.t()) does: a contiguous copy of Wᵀ makes OpenBLAS sum in another
  // order, which changes last bits (and a printed 5th digit of out[0] in the walkthrough).
  const int64_t N = x.numel() / in;
  Tensor y = Tensor::empty({N, out});  // every element written below
  if (engine == gemm::Engine::kFast && bias != nullptr) {
    // y = b (each row), then y += x Wᵀ in the GEMM (beta = 1): one pass fewer.
    const Tensor b = bias->contiguous();
    kernels::fill_rows(y.data(), out, b.data(), N, out);
    gemm::sgemm(gemm::Trans::kNo, gemm::Trans::kYes, N, out, in, 1.0f, x.data(), in, weight.data(),
                in, 1.0f, y.data(), out, engine);
    return y.reshape(y_shape);
  }
  gemm::sgemm(gemm::Trans::kNo, gemm::Trans::kYes, N, out, in, 1.0f, x.data(), in, weight.data(),
              in, 0.0f, y.data(), out, engine);
  if (bias != nullptr) y += *bias;  // broadcast over rows
  return y.reshape(y_shape);
}

Tensor linear_backward(const Tensor& dy, const Tensor& x, const Tensor& weight, Tensor& dweight,
                       Tensor* dbias, gemm::Engine engine) {
  check_matrix("linear_backward", "weight", weight);
  const int64_t out = weight.size(0);
  if (dy.shape() != with_last_dim(x.shape(), out)) {
    throw std::invalid_argument(
        fmt::format("linear_backward: dy shape {} does not match output shape {}",
                    shape_str(dy.shape()), shape_str(with_last_dim(x.shape(), out))));
  }
  if (x.numel() == 0 || out == 0) return Tensor(x.shape());
  const Tensor dy2 = as_rows(dy).contiguous();  // (N, out)
  const Tensor x2 = as_rows(x).contiguous();    // (N, in)
  const Tensor w = weight.contiguous();         // (out, in)
  const int64_t N = x2.size(0), in = x2.size(1);
  if (dweight.shape() != w.shape() || !dweight.is_contiguous()) {
    throw std::invalid_argument(
        fmt::format("linear_backward: dweight has shape {}, expected {} (contiguous)",
                    shape_str(dweight.shape()), shape_str(w.shape())));
  }
  // (out, in) += dyᵀ x: one sgemm reading dy transposed in place (as torch's
  // mm(dy.t(), x)), accumulating into dweight (beta = 1).
  gemm::sgemm(gemm::Trans::kYes, gemm::Trans::kNo, out, in, N, 1.0f, dy2.data(), out, x2.data(), in,
              1.0f, dweight.data(), in, engine);
  if (dbias != nullptr && engine == gemm::Engine::kFast) {
    check_vector_shape(*dbias, out);
    // (out) += Σ_rows dy, row by row per column
    kernels::column_sums_accumulate(dbias->data(), dy2.data(), out, N, out);
  } else if (dbias != nullptr) {
    accumulate(*dbias, sum(dy2, 0), "linear_backward",
               "dbias");  // (out) += Σ_rows dy, torch's order
  }
  // dx (N, in) = dy (N, out) @ W (out, in)
  Tensor dx = Tensor::empty(x.shape());  // sgemm with beta = 0 writes every element
  gemm::sgemm(gemm::Trans::kNo, gemm::Trans::kNo, N, in, out, 1.0f, dy2.data(), out, w.data(), in,
              0.0f, dx.data(), in, engine);
  return dx;
}

Tensor matmul_param_backward(const Tensor& dy, const Tensor& x, const Tensor& weight,
                             Tensor& dweight) {
  check_matrix("matmul_param_backward", "weight", weight);
  const int64_t out = weight.size(1);
  if (x.dim() < 1 || x.size(-1) != weight.size(0) || dy.shape() != with_last_dim(x.shape(), out)) {
    throw std::invalid_argument(
        fmt::format("matmul_param_backward: shapes x {}, weight {}, dy {} do not fit",
                    shape_str(x.shape()), shape_str(weight.shape()), shape_str(dy.shape())));
  }
  if (x.numel() == 0 || out == 0) return Tensor(x.shape());
  const Tensor dy2 = as_rows(dy);  // (N, out)
  const Tensor x2 = as_rows(x);    // (N, in)
  accumulate(dweight, matmul(t(x2), dy2), "matmul_param_backward",
             "dweight");                             // (in, out) += xᵀ dy
  return matmul(dy2, t(weight)).reshape(x.shape());  // (N, out) @ (out, in) -> (N, in)
}

}  // namespace attn::ref
