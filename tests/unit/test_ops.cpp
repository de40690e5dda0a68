// The tensor operations of attn/ops.h: behaviour on hand-computed small cases
// and the messages of argument errors.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>

#include "attn/ops.h"

using attn::Shape;
using attn::Tensor;

namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

// Expects `call` to throw E with exactly `message`.
template <class E, class F>
void expect_error(F call, const std::string& message) {
  try {
    call();
    ADD_FAILURE() << "expected an exception with message: " << message;
  } catch (const E& e) {
    EXPECT_EQ(std::string(e.what()), message);
  }
}

void expect_values(const Tensor& t, const Shape& shape, const std::vector<float>& values,
                   float tol = 0.0f) {
  ASSERT_EQ(t.shape(), shape) << attn::shape_str(t.shape());
  ASSERT_EQ(t.numel(), static_cast<int64_t>(values.size()));
  const std::vector<float> got = t.to_vector();  // row-major, whatever the layout
  for (size_t i = 0; i < values.size(); ++i) {
    if (got[i] == values[i]) continue;  // also equal infinities
    EXPECT_NEAR(got[i], values[i], tol) << "at " << i;
  }
}

// The 6x3 example input of the SPEC.
Tensor inputs() {
  return Tensor::of({6, 3}, {0.43f, 0.15f, 0.89f, 0.55f, 0.87f, 0.66f, 0.57f, 0.85f, 0.64f, 0.22f,
                             0.58f, 0.33f, 0.77f, 0.25f, 0.10f, 0.05f, 0.80f, 0.55f});
}

}  // namespace

TEST(Ops, ElementwiseSameShape) {
  Tensor a = Tensor::of({2, 2}, {1, 2, 3, 4});
  Tensor b = Tensor::of({2, 2}, {10, 20, 30, 40});
  expect_values(a + b, {2, 2}, {11, 22, 33, 44});
  expect_values(b - a, {2, 2}, {9, 18, 27, 36});
  expect_values(a * b, {2, 2}, {10, 40, 90, 160});
  expect_values(b / a, {2, 2}, {10, 10, 10, 10});
  expect_values(-a, {2, 2}, {-1, -2, -3, -4});
  expect_values(a + 1.0f, {2, 2}, {2, 3, 4, 5});
  expect_values(a - 1.0f, {2, 2}, {0, 1, 2, 3});
  expect_values(2.0f * a, {2, 2}, {2, 4, 6, 8});
  expect_values(a * 2.0f, {2, 2}, {2, 4, 6, 8});
  expect_values(a / 2.0f, {2, 2}, {0.5f, 1, 1.5f, 2});
  expect_values(attn::sqrt(Tensor::of({3}, {4, 9, 16})), {3}, {2, 3, 4});
  expect_values(attn::exp(Tensor::of({2}, {0, 1})), {2}, {1, std::exp(1.0f)});
}

TEST(Ops, BroadcastingFollowsNumPyRules) {
  // (2, 3) + (3,): the row is added to every row.
  Tensor a = Tensor::of({2, 3}, {1, 2, 3, 4, 5, 6});
  expect_values(a + Tensor::of({3}, {10, 20, 30}), {2, 3}, {11, 22, 33, 14, 25, 36});
  // (2, 3) * (2, 1): one factor per row.
  expect_values(a * Tensor::of({2, 1}, {2, 3}), {2, 3}, {2, 4, 6, 12, 15, 18});
  // (3, 1) - (1, 2) -> (3, 2): an outer difference.
  expect_values(Tensor::of({3, 1}, {1, 2, 3}) - Tensor::of({1, 2}, {10, 20}), {3, 2},
                {-9, -19, -8, -18, -7, -17});
  // A 0-d tensor broadcasts to anything.
  expect_values(a / Tensor(Shape{}, std::vector<float>{2.0f}), {2, 3}, {0.5f, 1, 1.5f, 2, 2.5f, 3});
  // (2, 1, 3) + (4, 1) -> (2, 4, 3).
  Tensor c = Tensor::arange(6).reshape({2, 1, 3}) + Tensor::arange(4).reshape({4, 1}) * 10.0f;
  ASSERT_EQ(c.shape(), (Shape{2, 4, 3}));
  EXPECT_EQ(c.at({1, 2, 0}), 3.0f + 20.0f);
  EXPECT_EQ(c.at({0, 3, 2}), 2.0f + 30.0f);
  Tensor acc = Tensor::zeros({2, 3});
  acc += Tensor::of({3}, {1, 2, 3});
  acc += Tensor::of({3}, {1, 2, 3});
  expect_values(acc, {2, 3}, {2, 4, 6, 2, 4, 6});
}

TEST(Ops, BroadcastingErrorsNameTheShapes) {
  expect_error<std::invalid_argument>(
      [] {
        attn::add(Tensor({2, 3}), Tensor({4}));
      },
      "add: shapes (2, 3) and (4,) cannot be broadcast (size 3 vs 4 at dim 1)");
  expect_error<std::invalid_argument>(
      [] {
        attn::mul(Tensor({2, 3, 4}), Tensor({5, 1}));
      },
      "mul: shapes (2, 3, 4) and (5, 1) cannot be broadcast (size 3 vs 5 at dim 1)");
  expect_error<std::invalid_argument>(
      [] {
        Tensor a({3});
        a += Tensor({2, 3});
      },
      "add_: (2, 3) does not broadcast to the shape (3,) of the tensor added to");
}

TEST(Ops, Reductions) {
  Tensor a = Tensor::of({2, 3}, {1, 5, 3, 4, 2, 6});
  expect_values(attn::sum(a, 0), {3}, {5, 7, 9});
  expect_values(attn::sum(a, -1), {2}, {9, 12});
  expect_values(attn::sum(a, 1, true), {2, 1}, {9, 12});
  expect_values(attn::mean(a, 1), {2}, {3, 4});
  expect_values(attn::mean(a, 0, true), {1, 3}, {2.5f, 3.5f, 4.5f});
  expect_values(attn::max(a, 1), {2}, {5, 6});
  expect_values(attn::max(a, 0), {3}, {4, 5, 6});
  EXPECT_EQ(attn::sum_all(a), 21.0f);
  // max propagates NaN, as torch.max does.
  Tensor n = attn::max(Tensor::of({3}, {1, NAN, 3}), 0);
  EXPECT_EQ(n.dim(), 0);
  EXPECT_TRUE(std::isnan(n.item()));
  // A 3-D reduction over the middle dim.
  Tensor b = Tensor::arange(24).reshape({2, 3, 4});
  Tensor s = attn::sum(b, 1);
  ASSERT_EQ(s.shape(), (Shape{2, 4}));
  EXPECT_EQ(s.at({1, 2}), 14.0f + 18.0f + 22.0f);
  expect_error<std::out_of_range>([&] { attn::sum(a, 2); },
                                  "sum: dim 2 out of range for shape (2, 3) (expected -2 to 1)");
  expect_error<std::out_of_range>([&] { attn::mean(a, -3); },
                                  "mean: dim -3 out of range for shape (2, 3) (expected -2 to 1)");
  expect_error<std::invalid_argument>(
      [] {
        attn::max(Tensor({2, 0}), 1);
      },
      "max: cannot reduce dim 1 of size 0 in shape (2, 0)");
}

TEST(Ops, MatmulShapes) {
  Tensor a = Tensor::of({2, 3}, {1, 2, 3, 4, 5, 6});
  Tensor b = Tensor::of({3, 2}, {7, 8, 9, 10, 11, 12});
  // [[1*7+2*9+3*11, 1*8+2*10+3*12], [4*7+5*9+6*11, 4*8+5*10+6*12]]
  expect_values(attn::matmul(a, b), {2, 2}, {58, 64, 139, 154});
  // 1-D x 1-D is a dot product of shape ().
  Tensor d = attn::matmul(Tensor::of({3}, {1, 2, 3}), Tensor::of({3}, {4, 5, 6}));
  EXPECT_EQ(d.dim(), 0);
  EXPECT_EQ(d.item(), 32.0f);
  EXPECT_EQ(attn::dot(Tensor::of({3}, {1, 2, 3}), Tensor::of({3}, {4, 5, 6})), 32.0f);
  // Matrix @ vector and vector @ matrix drop the vector's dim.
  expect_values(attn::matmul(a, Tensor::of({3}, {1, 0, -1})), {2}, {-2, -2});
  expect_values(attn::matmul(Tensor::of({2}, {1, -1}), a), {3}, {-3, -3, -3});
  // (B, T, d_in) @ (d_in, d_out): the weight is shared by every batch.
  Tensor x = attn::stack({a, a * 2.0f});  // (2, 2, 3)
  expect_values(attn::matmul(x, b), {2, 2, 2}, {58, 64, 139, 154, 116, 128, 278, 308});
  // (B, H, T, hd) @ (B, H, hd, T) with B = 1, H = 2, and (2, 2, 3) @ (3,) batches of vectors.
  Tensor q = attn::stack({a, a}).reshape({1, 2, 2, 3});
  Tensor k = attn::stack({b, b * -1.0f}).reshape({1, 2, 3, 2});
  expect_values(attn::matmul(q, k), {1, 2, 2, 2}, {58, 64, 139, 154, -58, -64, -139, -154});
  expect_values(attn::matmul(x, Tensor::of({3}, {1, 1, 1})), {2, 2}, {6, 15, 12, 30});
  // Broadcast batch dims: (2, 1, 2, 3) @ (3, 3, 2) -> (2, 3, 2, 2).
  Tensor bb = attn::stack({b, b * 2.0f, b * 3.0f});  // (3, 3, 2)
  Tensor r = attn::matmul(x.reshape({2, 1, 2, 3}), bb);
  ASSERT_EQ(r.shape(), (Shape{2, 3, 2, 2}));
  EXPECT_EQ(r.at({1, 2, 1, 1}), 2.0f * 3.0f * 154.0f);
  EXPECT_EQ(r.at({0, 1, 0, 0}), 2.0f * 58.0f);
  // An inner dim of 0 gives zeros.
  expect_values(attn::matmul(Tensor({2, 0}), Tensor({0, 3})), {2, 3}, {0, 0, 0, 0, 0, 0});
}

TEST(Ops, MatmulErrorsNameTheShapes) {
  expect_error<std::invalid_argument>(
      [] {
        attn::matmul(Tensor({6, 3}), Tensor({2, 3}));
      },
      "matmul: inner dims differ: (6, 3) @ (2, 3)");
  expect_error<std::invalid_argument>([] { attn::matmul(Tensor({3}), Tensor({4})); },
                                      "matmul: inner dims differ: (3,) @ (4,)");
  expect_error<std::invalid_argument>(
      [] {
        attn::matmul(Tensor({2, 6, 3}), Tensor({3, 3, 2}));
      },
      "matmul: batch dims (2,) and (3,) cannot be broadcast: (2, 6, 3) @ (3, 3, 2)");
  expect_error<std::invalid_argument>([] { attn::matmul(Tensor(Shape{}), Tensor({3})); },
                                      "matmul: both arguments need at least 1 dim, got () @ (3,)");
  expect_error<std::invalid_argument>(
      [] {
        attn::dot(Tensor({3}), Tensor({2, 3}));
      },
      "dot: expects two 1-D tensors of equal length, got (3,) and (2, 3)");
}

TEST(Ops, TransposeAndT) {
  Tensor a = Tensor::arange(6).reshape({2, 3});
  expect_values(attn::t(a), {3, 2}, {0, 3, 1, 4, 2, 5});
  expect_values(attn::transpose(a, -1, -2), {3, 2}, {0, 3, 1, 4, 2, 5});
  expect_values(attn::t(Tensor::of({2}, {1, 2})), {2}, {1, 2});
  // (B, T, H, hd) -> (B, H, T, hd): element (b, t, h, d) moves to (b, h, t, d).
  Tensor x = Tensor::arange(2 * 3 * 4 * 5).reshape({2, 3, 4, 5});
  Tensor y = attn::transpose(x, 1, 2);
  ASSERT_EQ(y.shape(), (Shape{2, 4, 3, 5}));
  for (int64_t b = 0; b < 2; ++b)
    for (int64_t t = 0; t < 3; ++t)
      for (int64_t h = 0; h < 4; ++h)
        for (int64_t d = 0; d < 5; ++d) EXPECT_EQ(y.at({b, h, t, d}), x.at({b, t, h, d}));
  // Transposing twice gives the input back.
  EXPECT_EQ(attn::transpose(attn::transpose(x, 0, 3), 0, 3).to_vector(), x.to_vector());
  expect_error<std::invalid_argument>(
      [] {
        attn::t(Tensor({2, 2, 2}));
      },
      "t: expects a tensor with <= 2 dims, got (2, 2, 2)");
  expect_error<std::out_of_range>(
      [&] { attn::transpose(a, 0, 2); },
      "transpose: dim 2 out of range for shape (2, 3) (expected -2 to 1)");
}

TEST(Ops, SelectSliceCatStack) {
  Tensor x = inputs();
  expect_values(attn::select(x, 1), {3}, {0.55f, 0.87f, 0.66f});
  expect_values(attn::select(x, -1), {3}, {0.05f, 0.80f, 0.55f});
  expect_values(attn::select(x, 1, 2), {6}, {0.89f, 0.66f, 0.64f, 0.33f, 0.10f, 0.55f});
  expect_values(attn::slice(x, 0, 4, 100), {2, 3}, {0.77f, 0.25f, 0.10f, 0.05f, 0.80f, 0.55f});
  expect_values(attn::slice(x, 1, -1, 3), {6, 1}, {0.89f, 0.66f, 0.64f, 0.33f, 0.10f, 0.55f});
  EXPECT_EQ(attn::slice(x, 0, 3, 1).shape(), (Shape{0, 3}));
  expect_error<std::out_of_range>(
      [&] { attn::select(x, 6); },
      "select: index 6 out of range for dim 0 of size 6 (shape (6, 3))");
  expect_error<std::out_of_range>([&] { attn::select(x, 2, 0); },
                                  "select: dim 2 out of range for shape (6, 3) (expected -2 to 1)");

  Tensor a = Tensor::of({2, 2}, {1, 2, 3, 4});
  Tensor b = Tensor::of({2, 1}, {5, 6});
  expect_values(attn::cat({a, b}, 1), {2, 3}, {1, 2, 5, 3, 4, 6});
  expect_values(attn::cat({a, attn::t(b)}, 0), {3, 2}, {1, 2, 3, 4, 5, 6});
  expect_values(attn::cat({Tensor(), a}, -1), {2, 2}, {1, 2, 3, 4});  // (0,) is skipped
  expect_error<std::invalid_argument>(
      [&] {
        attn::cat({a, b}, 0);
      },
      "cat: sizes must match except in dim 0: (2, 2) (tensor 0) and (2, 1) (tensor 1)");
  expect_error<std::invalid_argument>([] { attn::cat({}, 0); },
                                      "cat: expects a non-empty list of tensors");

  expect_values(attn::stack({a, a * 10.0f}), {2, 2, 2}, {1, 2, 3, 4, 10, 20, 30, 40});
  expect_values(attn::stack({a, a * 10.0f}, -1), {2, 2, 2}, {1, 10, 2, 20, 3, 30, 4, 40});
  expect_values(attn::stack({a, a * 10.0f}, 1), {2, 2, 2}, {1, 2, 10, 20, 3, 4, 30, 40});
  expect_error<std::invalid_argument>(
      [&] {
        attn::stack({a, b});
      },
      "stack: expects tensors of equal shape, got (2, 2) (tensor 0) and (2, 1) (tensor 1)");
  expect_error<std::out_of_range>(
      [&] {
        attn::stack({a, a}, 3);
      },
      "stack: dim 3 out of range for shape (2, 2, 1) (expected -3 to 2)");

  EXPECT_EQ(attn::unsqueeze(a, 0).shape(), (Shape{1, 2, 2}));
  EXPECT_EQ(attn::unsqueeze(a, -1).shape(), (Shape{2, 2, 1}));
  EXPECT_EQ(attn::unsqueeze(a, 1).shape(), (Shape{2, 1, 2}));
  EXPECT_EQ(attn::squeeze(attn::unsqueeze(a, 1), 1).shape(), (Shape{2, 2}));
  EXPECT_EQ(attn::squeeze(a, 0).shape(), (Shape{2, 2}));  // size 2: unchanged
  expect_error<std::out_of_range>(
      [&] { attn::unsqueeze(a, 3); },
      "unsqueeze: dim 3 out of range for shape (2, 2) (expected -3 to 2)");
}

TEST(Ops, TrilTriuMaskedFill) {
  Tensor ones = Tensor::ones({3, 3});
  expect_values(attn::tril(ones), {3, 3}, {1, 0, 0, 1, 1, 0, 1, 1, 1});
  expect_values(attn::triu(ones, 1), {3, 3}, {0, 1, 1, 0, 0, 1, 0, 0, 0});
  expect_values(attn::tril(ones, -1), {3, 3}, {0, 0, 0, 1, 0, 0, 1, 1, 0});
  expect_values(attn::triu(Tensor::ones({2, 3})), {2, 3}, {1, 1, 1, 0, 1, 1});
  Tensor batched = attn::tril(Tensor::ones({2, 2, 2}));
  expect_values(batched, {2, 2, 2}, {1, 0, 1, 1, 1, 0, 1, 1});
  expect_error<std::invalid_argument>([] { attn::tril(Tensor({3})); },
                                      "tril: expects a tensor with at least 2 dims, got (3,)");

  // The causal mask of the chapter: -inf above the diagonal, broadcast over the batch.
  Tensor scores = Tensor::arange(8).reshape({2, 2, 2});
  Tensor mask = attn::triu(Tensor::ones({2, 2}), 1);
  Tensor filled = attn::masked_fill(scores, mask, -kInf);
  expect_values(filled, {2, 2, 2}, {0, -kInf, 2, 3, 4, -kInf, 6, 7});
  expect_error<std::invalid_argument>(
      [&] {
        attn::masked_fill(scores, Tensor({3, 3}), 0.0f);
      },
      "masked_fill: mask of shape (3, 3) does not broadcast to the shape (2, 2, 2)");
  expect_error<std::invalid_argument>(
      [&] {
        attn::masked_fill(Tensor({2, 2}), Tensor({2, 2, 2}), 0.0f);
      },
      "masked_fill: mask of shape (2, 2, 2) does not broadcast to the shape (2, 2)");
}

TEST(Ops, SoftmaxAndNormalisations) {
  // softmax([1, 2, 3]) = e^(x - 3) / (e^-2 + e^-1 + 1).
  const double z = std::exp(-2.0) + std::exp(-1.0) + 1.0;
  Tensor s = attn::softmax(Tensor::of({3}, {1, 2, 3}), 0);
  expect_values(s, {3},
                {static_cast<float>(std::exp(-2.0) / z), static_cast<float>(std::exp(-1.0) / z),
                 static_cast<float>(1.0 / z)},
                1e-7f);
  // Over dim 0 of a (2, 2): columns sum to 1.
  Tensor c = attn::softmax(Tensor::of({2, 2}, {0, 5, 0, 5}), 0);
  expect_values(c, {2, 2}, {0.5f, 0.5f, 0.5f, 0.5f});
  // The stable softmax survives inputs that overflow the naive one.
  Tensor big = Tensor::of({2}, {1000, 1000});
  expect_values(attn::softmax(big, -1), {2}, {0.5f, 0.5f});
  Tensor naive = attn::softmax_naive(big, -1);
  EXPECT_TRUE(std::isnan(naive[0]) && std::isnan(naive[1]));
  expect_values(attn::softmax_naive(Tensor::of({3}, {1, 2, 3}), 0), {3}, s.to_vector(), 1e-7f);
  // A causal row: -inf entries get weight 0.
  expect_values(attn::softmax(Tensor::of({3}, {2, -kInf, 2}), 0), {3}, {0.5f, 0.0f, 0.5f});
  // A row of all -inf is NaN, as in PyTorch.
  Tensor all_masked = attn::softmax(Tensor::of({2, 2}, {-kInf, -kInf, 1, 1}), 1);
  EXPECT_TRUE(std::isnan(all_masked[0]) && std::isnan(all_masked[1]));
  EXPECT_EQ(all_masked[2], 0.5f);
  expect_values(attn::normalize_sum(Tensor::of({2, 2}, {1, 3, 2, 2}), 1), {2, 2},
                {0.25f, 0.75f, 0.5f, 0.5f});
  expect_error<std::out_of_range>(
      [] {
        attn::softmax(Tensor({2, 3}), 2);
      },
      "softmax: dim 2 out of range for shape (2, 3) (expected -2 to 1)");
}
