// Rotary position embedding (attn/rope.h): the tables' properties, the
// rotation's (norm kept, relative positions only in q·k, the inverse), the
// kernel against the reference bit for bit at any thread count, strided and
// in-place views (a token-major qkv buffer), position offsets (T tokens at
// once = one at a time with offsets), bfloat16, finite-difference gradients,
// and errors naming the values.
#include <gtest/gtest.h>

#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

#include "attn/ops.h"
#include "attn/random.h"
#include "attn/rope.h"
#include "attn/tensor.h"
#include "gradcheck.h"
#include "bits.h"

#ifdef _OPENMP
#include <omp.h>

using attn::test::same_bits;
#endif

namespace attn {
namespace {

Tensor randn_seeded(const Shape& shape, uint64_t seed) {
  Generator gen(seed);
  return randn(shape, gen);
}


TEST(Rope, TablesHoldCosAndSinOfPositionTimesFrequencyTwice) {
  const RopeParams p = compute_rope_params(8, 10000.0f, 20);
  ASSERT_EQ(p.cos.shape(), (Shape{20, 8}));
  ASSERT_EQ(p.sin.shape(), (Shape{20, 8}));
  for (int64_t pos = 0; pos < 20; ++pos) {
    for (int64_t i = 0; i < 4; ++i) {
      const double theta = std::pow(10000.0, -2.0 * double(i) / 8.0);
      EXPECT_NEAR(p.cos.at({pos, i}), std::cos(double(pos) * theta), 2e-6);
      EXPECT_NEAR(p.sin.at({pos, i}), std::sin(double(pos) * theta), 2e-6);
      EXPECT_EQ(p.cos.at({pos, i}), p.cos.at({pos, i + 4}));
      EXPECT_EQ(p.sin.at({pos, i}), p.sin.at({pos, i + 4}));
    }
  }
}

TEST(Rope, Llama3FrequencyScalingKeepsHighSlowsLowAndBlendsBetween) {
  const RopeFreqConfig f{.factor = 32.0f,
                         .low_freq_factor = 1.0f,
                         .high_freq_factor = 4.0f,
                         .original_context_length = 8192};
  const Tensor plain = rope_inverse_frequencies(64, 500000.0f);
  const Tensor scaled = rope_inverse_frequencies(64, 500000.0f, f);
  int kept = 0, slowed = 0, blended = 0;
  for (int64_t i = 0; i < 32; ++i) {
    const double wavelen = 2 * M_PI / plain[i];
    if (wavelen < 8192.0 / 4.0) {
      EXPECT_EQ(scaled[i], plain[i]);
      ++kept;
    } else if (wavelen > 8192.0) {
      EXPECT_FLOAT_EQ(scaled[i], plain[i] / 32.0f);
      ++slowed;
    } else {
      EXPECT_LT(scaled[i], plain[i]);
      EXPECT_GT(scaled[i], plain[i] / 32.0f);
      ++blended;
    }
  }
  EXPECT_GT(kept, 0);
  EXPECT_GT(slowed, 0);
  EXPECT_GT(blended, 0);
}

TEST(Rope, RotationKeepsNormsAndScoresDependOnRelativePositionOnly) {
  const RopeParams p = compute_rope_params(16, 10000.0f, 64);
  const Tensor q = randn_seeded({1, 1, 1, 16}, 1), k = randn_seeded({1, 1, 1, 16}, 2);
  auto score = [&](int64_t pq, int64_t pk) {
    const Tensor rq = apply_rope(q, p.cos, p.sin, {.position_offset = pq});
    const Tensor rk = apply_rope(k, p.cos, p.sin, {.position_offset = pk});
    double s = 0.0, nq = 0.0, n0 = 0.0;
    for (int64_t i = 0; i < 16; ++i) {
      s += double(rq[i]) * rk[i];
      nq += double(rq[i]) * rq[i];
      n0 += double(q[i]) * q[i];
    }
    EXPECT_NEAR(nq, n0, 1e-5 * n0);
    return s;
  };
  EXPECT_NEAR(score(5, 2), score(40, 37), 1e-4);
  EXPECT_NEAR(score(9, 9), score(0, 0), 1e-4);
  EXPECT_GT(std::fabs(score(5, 2) - score(5, 3)), 1e-3);
}

TEST(Rope, BackwardUndoesForwardForTheBookTables) {
  const RopeParams p = compute_rope_params(32, 10000.0f, 50);
  const Tensor x = randn_seeded({2, 3, 7, 32}, 3);
  const Tensor back = apply_rope_backward(apply_rope(x, p.cos, p.sin, {.position_offset = 40}),
                                          p.cos, p.sin, {.position_offset = 40});
  EXPECT_LT(max_abs_diff(back, x), 1e-5f);
}

TEST(Rope, KernelEqualsReferenceBitForBitForAnyThreadCount) {
  const RopeParams p = compute_rope_params(128, 500000.0f, 600);
  const Tensor x = randn_seeded({2, 4, 300, 128}, 4);  // above the parallel threshold
  const RopeOptions ref{.position_offset = 250, .backend = RopeBackend::kReference};
  const RopeOptions ker{.position_offset = 250, .backend = RopeBackend::kKernel};
  const Tensor want = apply_rope(x, p.cos, p.sin, ref);
  const Tensor want_dx = apply_rope_backward(x, p.cos, p.sin, ref);
#ifdef _OPENMP
  const int saved = omp_get_max_threads();
  for (int threads : {1, 2, 3}) {
    omp_set_num_threads(threads);
#endif
    EXPECT_TRUE(same_bits(apply_rope(x, p.cos, p.sin, ker), want));
    EXPECT_TRUE(same_bits(apply_rope_backward(x, p.cos, p.sin, ker), want_dx));
#ifdef _OPENMP
  }
  omp_set_num_threads(saved);
#endif
}

TEST(Rope, RotatesTokenMajorViewsOfAQkvBufferInPlace) {
  const int64_t B = 2, T = 5, H = 3, hd = 8;
  const RopeParams p = compute_rope_params(hd, 10000.0f, 16);
  const Tensor qkv0 = randn_seeded({B, T, 3 * H * hd}, 5);
  Tensor qkv = qkv0.clone();
  // q: heads 0..H-1 of the (B, T, 3H, hd) view, seen as (B, H, T, hd).
  Tensor q = transpose(qkv.view({B, T, 3 * H, hd}).slice(2, 0, H), 1, 2);
  apply_rope_(q, p.cos, p.sin, {.position_offset = 3});
  const Tensor q0 = transpose(qkv0.view({B, T, 3 * H, hd}).slice(2, 0, H), 1, 2);
  const Tensor want = apply_rope(q0, p.cos, p.sin, {.position_offset = 3});
  EXPECT_TRUE(same_bits(q.contiguous(), want));
  // k and v untouched.
  EXPECT_TRUE(same_bits(qkv.view({B, T, 3 * H, hd}).slice(2, H, 3 * H).contiguous(),
                        qkv0.view({B, T, 3 * H, hd}).slice(2, H, 3 * H).contiguous()));
  // A view with last stride != 1 is refused in place, copied by apply_rope.
  Tensor bad = transpose(randn_seeded({1, 1, 8, 8}, 6), 2, 3);
  EXPECT_THROW(apply_rope_(bad, p.cos, p.sin), std::invalid_argument);
  EXPECT_TRUE(same_bits(apply_rope(bad, p.cos, p.sin), apply_rope(bad.contiguous(), p.cos, p.sin)));
}

TEST(Rope, OffsetsRotateTokensAsInOnePassOverTheSequence) {
  const RopeParams p = compute_rope_params(16, 10000.0f, 32);
  const Tensor x = randn_seeded({2, 2, 9, 16}, 7);
  const Tensor whole = apply_rope(x, p.cos, p.sin);
  for (int64_t t = 0; t < 9; ++t) {
    const Tensor one = apply_rope(x.slice(2, t, t + 1), p.cos, p.sin, {.position_offset = t});
    EXPECT_TRUE(same_bits(one, whole.slice(2, t, t + 1).contiguous())) << "token " << t;
  }
  const Tensor tail = apply_rope(x.slice(2, 4, 9), p.cos, p.sin, {.position_offset = 4});
  EXPECT_TRUE(same_bits(tail, whole.slice(2, 4, 9).contiguous()));
}

TEST(Rope, Bfloat16IsTheFloat32ResultRoundedOnce) {
  const RopeParams p = compute_rope_params(64, 10000.0f, 40);
  const Tensor xb = randn_seeded({1, 2, 6, 64}, 8).to(DType::kBFloat16);
  for (RopeBackend backend : {RopeBackend::kReference, RopeBackend::kKernel}) {
    const RopeOptions o{.position_offset = 30, .backend = backend};
    const Tensor yb = apply_rope(xb, p.cos, p.sin, o);
    ASSERT_EQ(yb.dtype(), DType::kBFloat16);
    const Tensor want = apply_rope(xb.to(DType::kFloat32), p.cos, p.sin, o).to(DType::kBFloat16);
    EXPECT_TRUE(same_bits(yb.to(DType::kFloat32), want.to(DType::kFloat32)));
    const Tensor db = apply_rope_backward(xb, p.cos, p.sin, o);
    const Tensor want_d =
        apply_rope_backward(xb.to(DType::kFloat32), p.cos, p.sin, o).to(DType::kBFloat16);
    EXPECT_TRUE(same_bits(db.to(DType::kFloat32), want_d.to(DType::kFloat32)));
  }
}

TEST(Rope, GradientMatchesFiniteDifferences) {
  // Any tables (not only rotations): the backward is the transposed map.
  const Tensor cos = randn_seeded({12, 6}, 9), sin = randn_seeded({12, 6}, 10);
  Tensor x = randn_seeded({2, 2, 4, 6}, 11);
  const RopeOptions o{.position_offset = 5};
  const Tensor R = test::random_tensor({2, 2, 4, 6}, 12);
  const Tensor dx = apply_rope_backward(R, cos, sin, o);
  test::check_tensor_grad("rope dx", x, dx,
                          [&] { return test::dot_loss(apply_rope(x, cos, sin, o), R); }, {});
}

TEST(Rope, ErrorsNameTheValues) {
  const RopeParams p = compute_rope_params(8, 10000.0f, 10);
  auto message = [](auto&& f) {
    try {
      f();
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string("no exception");
  };
  EXPECT_NE(message([] { compute_rope_params(7); }).find("head_dim must be even and >= 2, got 7"),
            std::string::npos);
  EXPECT_NE(message([] {
              compute_rope_params(8, 1.0f);
            }).find("theta_base must be finite and > 1, got 1"),
            std::string::npos);
  EXPECT_NE(message([] {
              compute_rope_params(8, 10000.0f, 0);
            }).find("context_length must be >= 1, got 0"),
            std::string::npos);
  EXPECT_NE(message([] {
              compute_rope_params(
                  8, 10000.0f, 4,
                  RopeFreqConfig{.low_freq_factor = 4.0f, .high_freq_factor = 1.0f});
            }).find("high_freq_factor 1"),
            std::string::npos);
  const Tensor x = randn_seeded({1, 1, 4, 8}, 13);
  EXPECT_NE(message([&] {
              apply_rope(x, p.cos, p.sin, {.position_offset = 7});
            }).find("positions 7 .. 10 (position_offset 7 + 4 tokens) do not fit the 10 rows"),
            std::string::npos);
  EXPECT_NE(message([&] {
              apply_rope(x, p.cos, p.sin, {.position_offset = -1});
            }).find("position_offset -1"),
            std::string::npos);
  EXPECT_NE(message([&] {
              apply_rope(x.view({4, 8}), p.cos, p.sin);
            }).find("x must be (B, H, T, head_dim), got (4, 8)"),
            std::string::npos);
  EXPECT_NE(message([&] {
              apply_rope(randn_seeded({1, 1, 4, 6}, 1), p.cos, p.sin);
            }).find("cos and sin must be float32 (context_length, 6)"),
            std::string::npos);
  EXPECT_NE(message([&] { apply_rope(x, p.cos, p.sin.slice(0, 0, 5)); }).find("differ in shape"),
            std::string::npos);
  EXPECT_NE(message([&] {
              apply_rope(Tensor::zeros({1, 1, 2, 8}, DType::kInt64), p.cos, p.sin);
            }).find("x must be float32 or bfloat16, got int64"),
            std::string::npos);
}

}  // namespace
}  // namespace attn
