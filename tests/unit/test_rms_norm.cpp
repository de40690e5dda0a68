// RMSNorm (attn/gpt.h, attn/functional_gpt.h's rms_norm_*): the normalisation
// of Llama 3 and Qwen3 (weight_offset 0) and Gemma 3 (weight_offset 1).
// Forward against the definition evaluated in double here; dx and dweight
// against central finite differences (tests/unit/gradcheck.h); the weight's
// start (the scale 1 either way); errors naming the values. PyTorch 1.13 on
// the same maths: tests/torch/test_gpt_torch.cpp (GptTorch.RmsNorm*).
#include <gtest/gtest.h>

#include <cmath>
#include <stdexcept>
#include <string>

#include "attn/functional_gpt.h"
#include "attn/gpt.h"
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

}  // namespace
