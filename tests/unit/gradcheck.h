// tests/unit/gradcheck.h - central finite differences for the backward passes.
//
// The loss is L = Σ y ⊙ R for a fixed random R, so dL/dy = R. For a value v of
// an input or a parameter, the numerical derivative is
//   (L(v + eps) - L(v - eps)) / ((v + eps) - (v - eps))
// with the denominator taken after rounding to float, and the check is
//   |numerical - analytic| <= abs_tol + rel_tol · |numerical|.
// Forward passes run in float32; the loss is summed in double.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <iostream>
#include <string>
#include <vector>

#include "attn/nn.h"
#include "attn/random.h"
#include "attn/tensor.h"

namespace attn::test {

struct GradTolerance {
  float eps = 3e-3f;
  double abs_tol = 1e-3;
  double rel_tol = 1e-2;
  int64_t max_coords = 400;  // per tensor; more elements are sampled with a fixed stride
};

inline double dot_loss(const Tensor& y, const Tensor& R) {
  EXPECT_EQ(y.shape(), R.shape());
  double loss = 0.0;
  for (int64_t i = 0; i < y.numel(); ++i) loss += static_cast<double>(y.data()[i]) * R.data()[i];
  return loss;
}

// Compares `analytic` with central differences of `loss` in the entries of
// `value` (which `loss` reads). Returns the largest absolute error and logs it.
inline double check_tensor_grad(const std::string& what, Tensor& value, const Tensor& analytic,
                                const std::function<double()>& loss, const GradTolerance& tol) {
  EXPECT_EQ(value.shape(), analytic.shape()) << what;
  if (value.shape() != analytic.shape()) return INFINITY;
  const int64_t n = value.numel();
  const int64_t stride = std::max<int64_t>(1, n / tol.max_coords);
  double worst = 0.0;
  int64_t checked = 0;
  for (int64_t i = 0; i < n; i += stride) {
    const float v = value.data()[i];
    const float up = v + tol.eps, down = v - tol.eps;
    value.data()[i] = up;
    const double loss_up = loss();
    value.data()[i] = down;
    const double loss_down = loss();
    value.data()[i] = v;
    const double numerical =
        (loss_up - loss_down) / (static_cast<double>(up) - static_cast<double>(down));
    const double err = std::fabs(numerical - analytic.data()[i]);
    worst = std::max(worst, err);
    ++checked;
    EXPECT_LE(err, tol.abs_tol + tol.rel_tol * std::fabs(numerical))
        << what << "[" << i << "]: numerical " << numerical << " analytic " << analytic.data()[i];
  }
  std::cout << "[gradcheck] " << what << ": max abs err " << worst << " over " << checked << " of "
            << n << " entries\n";
  return worst;
}

// A random tensor with entries ~ N(0, 1) from a private generator.
inline Tensor random_tensor(const Shape& shape, uint64_t seed) {
  Generator gen(seed);
  return randn(shape, gen);
}

// Checks dL/dx and every parameter gradient of a module with forward(x) and
// backward(dy). `before_forward` runs before every forward (e.g. to reseed the
// generator so dropout draws the same noise each time).
template <class M>
void gradcheck_module(
    const std::string& name, M& m, Tensor x, const GradTolerance& tol = {},
    const std::function<void()>& before_forward = [] {}) {
  before_forward();
  const Tensor y0 = m.forward(x);
  const Tensor R = random_tensor(y0.shape(), 4242);
  m.zero_grad();
  before_forward();
  m.forward(x);
  const Tensor dx = m.backward(R);
  std::vector<std::pair<std::string, Tensor>> grads;
  for (auto& [pname, p] : m.named_parameters()) grads.emplace_back(pname, p->grad);

  const auto loss = [&] {
    before_forward();
    return dot_loss(m.forward(x), R);
  };
  check_tensor_grad(name + " dx", x, dx, loss, tol);
  auto params = m.named_parameters();
  ASSERT_EQ(params.size(), grads.size());
  for (size_t i = 0; i < params.size(); ++i) {
    check_tensor_grad(name + " " + params[i].first, params[i].second->value, grads[i].second, loss,
                      tol);
  }
}

}  // namespace attn::test
