// The layers of today's open models beside the attention (issue 42), in
// attn/gpt.h: RMSNorm (attn/functional_gpt.h's rms_norm_*: Llama 3 and Qwen3,
// weight_offset 0; Gemma 3, weight_offset 1) and GatedFeedForward (SwiGLU,
// GeGLU). Forward against the definition evaluated in double here; every
// gradient against central finite differences (tests/unit/gradcheck.h); the
// weight's start (the scale 1 either way); errors naming the values. PyTorch
// 1.13 on the same maths: tests/torch/test_gpt_torch.cpp (GptTorch.RmsNorm*,
// GptTorch.GatedFeedForward*).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numbers>
#include <stdexcept>
#include <string>
#include <vector>

#include "attn/functional_gpt.h"
#include "attn/gpt.h"
#include "attn/random.h"
#include "attn/tensor.h"
#include "gradcheck.h"

namespace {

using attn::Shape;
using attn::Tensor;
using attn::test::random_tensor;

// y = x · (mean(x²) + eps)^(-1/2) · (w + offset), in double.
double expected(const Tensor& x, const Tensor& w, float eps, float offset, int64_t n, int64_t c) {
  const int64_t C = x.size(-1);
  double sum_sq = 0.0;
  for (int64_t k = 0; k < C; ++k) sum_sq += double(x.data()[n * C + k]) * x.data()[n * C + k];
  return double(x.data()[n * C + c]) / std::sqrt(sum_sq / double(C) + double(eps)) *
         (double(w.data()[c]) + offset);
}

TEST(RmsNorm, ForwardIsTheDefinition) {
  for (const float offset : {0.0f, 1.0f}) {
    for (const Shape& shape : {Shape{2, 5, 32}, Shape{7, 1}, Shape{3, 1024}}) {
      SCOPED_TRACE("offset " + std::to_string(offset) + " shape " + attn::shape_str(shape));
      const int64_t C = shape.back();
      attn::nn::RMSNorm norm(C, 1e-5f, offset);
      norm.weight.value = random_tensor({C}, 3);
      Tensor x = random_tensor(shape, 4);
      x.data()[0] = 300.0f;  // a row of another scale
      const Tensor y = norm.forward(x);
      ASSERT_EQ(y.shape(), x.shape());
      for (int64_t n = 0; n < x.numel() / C; ++n)
        for (int64_t c = 0; c < C; ++c) {
          const double want = expected(x, norm.weight.value, 1e-5f, offset, n, c);
          EXPECT_NEAR(y.data()[n * C + c], want, 2e-6 * std::max(1.0, std::fabs(want)))
              << n << ", " << c;
        }
    }
  }
}

TEST(RmsNorm, AZeroRowGivesZeroAndTheScaleStartsAtOne) {
  for (const float offset : {0.0f, 1.0f}) {
    attn::nn::RMSNorm norm(4, 1e-6f, offset);
    EXPECT_EQ(norm.weight.value.to_vector(), std::vector<float>(4, offset == 0.0f ? 1.0f : 0.0f));
    const Tensor x({2, 4}, {0, 0, 0, 0, 1, -2, 3, -4});
    const std::vector<float> y = norm.forward(x).to_vector();
    for (int c = 0; c < 4; ++c) EXPECT_EQ(y[size_t(c)], 0.0f);
    const double rms = std::sqrt((1.0 + 4.0 + 9.0 + 16.0) / 4.0 + 1e-6);
    for (int c = 0; c < 4; ++c) EXPECT_NEAR(y[size_t(4 + c)], x.data()[4 + c] / rms, 1e-6);
  }
}

TEST(RmsNorm, GradientsMatchFiniteDifferences) {
  for (const float offset : {0.0f, 1.0f}) {
    attn::nn::RMSNorm norm(9, 1e-5f, offset);
    norm.weight.value = random_tensor({9}, 5);
    attn::test::gradcheck_module(std::string("RMSNorm offset ") + std::to_string(int(offset)), norm,
                                 random_tensor({3, 4, 9}, 6));
  }
}

TEST(RmsNorm, BadInputIsRefusedNamingIt) {
  EXPECT_THROW(attn::nn::RMSNorm(0), std::invalid_argument);
  EXPECT_THROW(attn::nn::RMSNorm(4, -1e-6f), std::invalid_argument);
  EXPECT_THROW(attn::nn::RMSNorm(4, 1e-6f, 0.5f), std::invalid_argument);
  attn::nn::RMSNorm norm(4);
  try {
    norm.forward(Tensor({2, 3}));
    FAIL() << "a row of 3 was taken by an RMSNorm of 4";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("does not end in dim 4"), std::string::npos) << e.what();
  }
  EXPECT_THROW(norm.forward(Tensor({2, 4}).to(attn::DType::kBFloat16)), std::invalid_argument);
  EXPECT_THROW(norm.backward(Tensor({2, 4})), std::exception);  // no forward yet
  norm.forward(Tensor({2, 4}));
  EXPECT_THROW(norm.backward(Tensor({2, 5})), std::invalid_argument);
  attn::ref::RmsNormSaved saved;
  EXPECT_THROW(attn::ref::rms_norm_forward(Tensor({2, 4}), Tensor({3}), 1e-6f, 0.0f, &saved),
               std::invalid_argument);
  EXPECT_THROW(attn::ref::rms_norm_forward(Tensor({2, 4}), Tensor({4}), NAN, 0.0f, &saved),
               std::invalid_argument);
}

// y = fc3(act(fc1 x) ⊙ fc2 x), in double from the module's weights.
TEST(GatedFeedForward, ForwardIsTheDefinition) {
  for (const auto act : {attn::nn::GateActivation::kSiLU, attn::nn::GateActivation::kGeluTanh}) {
    SCOPED_TRACE(act == attn::nn::GateActivation::kSiLU ? "SwiGLU" : "GeGLU");
    const int64_t E = 6, H = 10, N = 4;
    attn::Generator gen(7);
    attn::nn::GatedFeedForward ff(E, H, act, gen);
    const Tensor x = random_tensor({2, 2, E}, 8);
    const Tensor y = ff.forward(x);
    ASSERT_EQ(y.shape(), x.shape());
    const float* w1 = ff.fc1.weight.value.data();
    const float* w2 = ff.fc2.weight.value.data();
    const float* w3 = ff.fc3.weight.value.data();
    for (int64_t n = 0; n < N; ++n) {
      std::vector<double> z(size_t(H), 0.0);
      for (int64_t h = 0; h < H; ++h) {
        double h1 = 0.0, h2 = 0.0;
        for (int64_t e = 0; e < E; ++e) {
          h1 += double(w1[h * E + e]) * x.data()[n * E + e];
          h2 += double(w2[h * E + e]) * x.data()[n * E + e];
        }
        const double a = act == attn::nn::GateActivation::kSiLU
                             ? h1 / (1.0 + std::exp(-h1))
                             : 0.5 * h1 *
                                   (1.0 + std::tanh(std::sqrt(2.0 / std::numbers::pi) *
                                                    (h1 + 0.044715 * h1 * h1 * h1)));
        z[size_t(h)] = a * h2;
      }
      for (int64_t e = 0; e < E; ++e) {
        double want = 0.0;
        for (int64_t h = 0; h < H; ++h) want += double(w3[e * H + h]) * z[size_t(h)];
        EXPECT_NEAR(y.data()[n * E + e], want, 1e-6 * std::max(1.0, std::fabs(want)));
      }
    }
  }
}

TEST(GatedFeedForward, GradientsMatchFiniteDifferences) {
  for (const auto act : {attn::nn::GateActivation::kSiLU, attn::nn::GateActivation::kGeluTanh}) {
    attn::Generator gen(9);
    attn::nn::GatedFeedForward ff(5, 7, act, gen);
    attn::test::gradcheck_module(act == attn::nn::GateActivation::kSiLU ? "SwiGLU" : "GeGLU", ff,
                                 random_tensor({2, 3, 5}, 10));
  }
}

TEST(GatedFeedForward, BadInputIsRefused) {
  attn::nn::GatedFeedForward ff(4, 8, attn::nn::GateActivation::kSiLU);
  EXPECT_THROW(ff.forward(Tensor({2, 5})), std::invalid_argument);
  EXPECT_THROW(ff.backward(Tensor({2, 4})), std::exception);  // no forward yet
  EXPECT_THROW(attn::nn::GatedFeedForward(0, 8, attn::nn::GateActivation::kSiLU),
               std::invalid_argument);
}

}  // namespace
