// The reference maths (attn/functional.h): routes that must agree, the three
// normalisations of simplified attention, and softmax_backward by finite
// differences.
#include <gtest/gtest.h>

#include <cmath>

#include "attn/functional.h"
#include "attn/ops.h"
#include "attn/random.h"
#include "gradcheck.h"

namespace attn::test {
namespace {

Tensor example_inputs() {  // "Your journey starts with one step"
  return Tensor::of({6, 3}, {0.43f, 0.15f, 0.89f, 0.55f, 0.87f, 0.66f, 0.57f, 0.85f, 0.64f, 0.22f,
                             0.58f, 0.33f, 0.77f, 0.25f, 0.10f, 0.05f, 0.80f, 0.55f});
}

TEST(Reference, ScoresLoopsEqualMatmul) {
  const Tensor inputs = example_inputs();
  const Tensor loops = ref::attention_scores_loops(inputs);
  const Tensor product = matmul(inputs, t(inputs));
  EXPECT_LE(max_abs_diff(loops, product), 1e-6f);
  EXPECT_NEAR(loops.at({1, 0}), 0.43f * 0.55f + 0.15f * 0.87f + 0.89f * 0.66f, 1e-6f);
  for (int64_t T : {1, 15, 16, 17}) {
    const Tensor x = random_tensor({T, 5}, 3);
    EXPECT_LE(max_abs_diff(ref::attention_scores_loops(x), matmul(x, t(x))), 1e-5f) << "T=" << T;
  }
}

TEST(Reference, SimplifiedNormalisationsSumToOne) {
  const Tensor inputs = example_inputs();
  for (auto norm : {ref::Normalization::kSum, ref::Normalization::kSoftmaxNaive,
                    ref::Normalization::kSoftmax}) {
    const auto all = ref::simplified_attention(inputs, norm);
    ASSERT_EQ(all.weights.shape(), (Shape{6, 6}));
    ASSERT_EQ(all.context.shape(), (Shape{6, 3}));
    const Tensor row_sums = sum(all.weights, -1);
    for (int64_t i = 0; i < 6; ++i) EXPECT_NEAR(row_sums[i], 1.0f, 1e-6f);
    // The one-query form is row 1 ("journey") of the all-rows form.
    const auto one = ref::simplified_attention_query(inputs, select(inputs, 1), norm);
    ASSERT_EQ(one.context.shape(), (Shape{3}));
    EXPECT_LE(max_abs_diff(one.scores, select(all.scores, 1)), 1e-6f);
    EXPECT_LE(max_abs_diff(one.weights, select(all.weights, 1)), 1e-6f);
    EXPECT_LE(max_abs_diff(one.context, select(all.context, 1)), 1e-6f);
  }
  // Context z_i = Σ_j a_ij x_j by loops.
  const auto r = ref::simplified_attention(inputs, ref::Normalization::kSoftmax);
  for (int64_t i = 0; i < 6; ++i) {
    for (int64_t c = 0; c < 3; ++c) {
      float z = 0.0f;
      for (int64_t j = 0; j < 6; ++j) z += r.weights.at({i, j}) * inputs.at({j, c});
      EXPECT_NEAR(r.context.at({i, c}), z, 1e-6f);
    }
  }
}

TEST(Reference, NaiveSoftmaxOverflowsStableDoesNot) {
  const Tensor inputs = Tensor::of({3, 1}, {30.0f, 31.6f, 10.0f});  // scores up to ~1000
  const auto naive = ref::simplified_attention(inputs, ref::Normalization::kSoftmaxNaive);
  const auto stable = ref::simplified_attention(inputs, ref::Normalization::kSoftmax);
  EXPECT_TRUE(has_non_finite(naive.weights));
  EXPECT_FALSE(has_non_finite(stable.weights));
  EXPECT_FALSE(has_non_finite(stable.context));
  EXPECT_NEAR(sum(stable.weights, -1)[0], 1.0f, 1e-6f);
}

TEST(Reference, TwoCausalRoutesAgree) {
  const Tensor inputs = example_inputs();
  for (const Shape& shape : {Shape{6, 6}, Shape{2, 5, 5}, Shape{2, 3, 4, 4}, Shape{1, 1}}) {
    const Tensor scores = random_tensor(shape, 5);
    const float scale = 1.0f / std::sqrt(2.0f);
    const Tensor renorm = ref::causal_weights_renormalized(scores, scale);
    const Tensor masked = ref::causal_weights_masked(scores, scale);
    EXPECT_LE(max_abs_diff(renorm, masked), 1e-6f) << shape_str(shape);
    // The future gets exactly zero weight.
    const int64_t T = shape.back();
    for (int64_t i = 0; i < masked.numel(); ++i) {
      const int64_t row = (i / T) % T, col = i % T;
      if (col > row) {
        EXPECT_EQ(masked[i], 0.0f);
      }
    }
  }
  // And the attention function's causal mode gives the same weights.
  const Tensor q = random_tensor({2, 5, 3}, 6), k = random_tensor({2, 5, 3}, 7);
  ref::AttentionSaved saved;
  ref::attention_forward(q, k, random_tensor({2, 5, 2}, 8), {.causal = true}, nullptr, &saved);
  const Tensor scores = matmul(q, transpose(k, -2, -1));
  EXPECT_LE(max_abs_diff(saved.weights, ref::causal_weights_masked(scores, 1.0f / std::sqrt(3.0f))),
            1e-6f);
}

// softmax_dim = 1 reproduces the early printing's bug: on (B, T, T) weights
// the columns (queries) sum to 1 instead of the rows (keys).
TEST(Reference, SoftmaxOverQueriesNormalisesColumns) {
  const Tensor q = random_tensor({2, 5, 3}, 41), k = random_tensor({2, 5, 3}, 42),
               v = random_tensor({2, 5, 2}, 43);
  for (bool causal : {false, true}) {
    ref::AttentionSaved saved;
    const Tensor out =
        ref::attention_forward(q, k, v, {.causal = causal, .softmax_dim = 1}, nullptr, &saved);
    EXPECT_FALSE(has_non_finite(out));
    const Tensor column_sums = sum(saved.weights, 1);  // (B, T_k)
    for (float s : column_sums.values()) EXPECT_NEAR(s, 1.0f, 1e-6f);
    const Tensor scores = matmul(q, transpose(k, -2, -1)) / std::sqrt(3.0f);
    const Tensor expected =
        softmax(causal ? masked_fill(scores, ref::future_mask(5), -INFINITY) : scores, 1);
    EXPECT_LE(max_abs_diff(saved.weights, expected), 1e-6f);
  }
  // A causal softmax over the batch would be NaN: refused.
  EXPECT_THROW(
      ref::attention_forward(q, k, v, {.causal = true, .softmax_dim = 0}, nullptr, nullptr),
      std::invalid_argument);
  // Causal softmax over queries needs every key column to keep a query.
  EXPECT_THROW(ref::attention_forward(random_tensor({1, 3, 2}, 1), random_tensor({1, 4, 2}, 2),
                                      random_tensor({1, 4, 2}, 3),
                                      {.causal = true, .softmax_dim = 1}, nullptr, nullptr),
               std::invalid_argument);
}

TEST(Reference, Masks) {
  const Tensor tril = ref::tril_ones(4);
  const Tensor future = ref::future_mask(4);
  for (int64_t i = 0; i < 4; ++i) {
    for (int64_t j = 0; j < 4; ++j) {
      EXPECT_EQ(tril.at({i, j}), j <= i ? 1.0f : 0.0f);
      EXPECT_EQ(future.at({i, j}), j > i ? 1.0f : 0.0f);
    }
  }
}

TEST(Reference, ThreeXbowRoutesAgree) {
  for (const Shape& shape : {Shape{4, 8, 2}, Shape{1, 1, 3}, Shape{2, 17, 5}, Shape{8, 2}}) {
    const Tensor x = random_tensor(shape, 1337);
    const Tensor loops = ref::xbow_loops(x);
    EXPECT_LE(max_abs_diff(loops, ref::xbow_matmul(x)), 1e-6f) << shape_str(shape);
    EXPECT_LE(max_abs_diff(loops, ref::xbow_softmax(x)), 1e-6f) << shape_str(shape);
  }
  // Row t is the mean of rows 0..t.
  const Tensor x = Tensor::of({1, 3, 1}, {1.0f, 2.0f, 6.0f});
  const Tensor xbow = ref::xbow_loops(x);
  EXPECT_FLOAT_EQ(xbow[0], 1.0f);
  EXPECT_FLOAT_EQ(xbow[1], 1.5f);
  EXPECT_FLOAT_EQ(xbow[2], 3.0f);
}

TEST(Reference, SoftmaxBackwardMatchesFiniteDifferences) {
  for (int64_t dim : {-1, 0}) {
    Tensor x = random_tensor({4, 6}, 21);
    const Tensor R = random_tensor({4, 6}, 22);
    const Tensor dx = ref::softmax_backward(R, softmax(x, dim), dim);
    check_tensor_grad("softmax_backward dim " + std::to_string(dim), x, dx,
                      [&] { return dot_loss(softmax(x, dim), R); },
                      {.eps = 1e-3f, .abs_tol = 1e-3, .rel_tol = 1e-2});
  }
}

TEST(Reference, DropoutForwardBackward) {
  const Tensor x = random_tensor({3, 4}, 31);
  Generator gen(123);
  const Tensor noise = dropout_noise({3, 4}, 0.5f, gen);
  const Tensor y = ref::dropout_forward(x, noise);
  const Tensor dy = random_tensor({3, 4}, 32);
  const Tensor dx = ref::dropout_backward(dy, noise);
  for (int64_t i = 0; i < 12; ++i) {
    EXPECT_EQ(y[i], x[i] * noise[i]);
    EXPECT_EQ(dx[i], dy[i] * noise[i]);
  }
  EXPECT_THROW(ref::dropout_forward(x, Tensor({4, 3})), std::invalid_argument);
}

TEST(Reference, AttentionRejectsBadShapes) {
  const Tensor q = random_tensor({2, 4, 3}, 1);
  EXPECT_THROW(ref::attention_forward(q, random_tensor({2, 4, 2}, 2), q, {}, nullptr, nullptr),
               std::invalid_argument);
  EXPECT_THROW(ref::attention_forward(q, q, random_tensor({2, 5, 3}, 3), {}, nullptr, nullptr),
               std::invalid_argument);
  EXPECT_THROW(ref::attention_forward(q, q, q, {.softmax_dim = 3}, nullptr, nullptr),
               std::invalid_argument);
  const Tensor bad_noise({2, 4, 5});
  EXPECT_THROW(ref::attention_forward(q, q, q, {}, &bad_noise, nullptr), std::invalid_argument);
}

}  // namespace
}  // namespace attn::test
