// kernels::Bf16Operand (attn/bf16_operand.h): operands of bf16 products made
// once in their route's form give gemm::gemm_bf16's bits on every route this
// CPU has, and round_to_bf16_values is round_to_bf16 widened.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "attn/bf16_operand.h"
#include "attn/gemm.h"
#include "attn/layer_kernels.h"
#include "attn/tensor.h"
#include "gemm_route_guard.h"
#include "bits.h"

namespace attn::test {
namespace {

using gemm::Trans;

Tensor random_matrix(int64_t rows, int64_t cols, uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> v(static_cast<size_t>(rows * cols));
  for (float& x : v) x = normal(gen);
  return Tensor({rows, cols}, v);
}

std::vector<BFloat16> bf16_of(const Tensor& t) {
  std::vector<BFloat16> out(static_cast<size_t>(t.numel()));
  kernels::round_to_bf16(out.data(), t.data(), t.numel());
  return out;
}

const void* storage_of(const kernels::Bf16Operand& op) {
  return op.widened() ? static_cast<const void*>(op.tensor().data())
                      : static_cast<const void*>(op.tensor().data_ptr<BFloat16>());
}


// Every special value, ties either way, and normal noise: bit for bit
// to_float(to_bfloat16(x)), in place too, at lengths with and without a tail
// and on the threads.
TEST(Bf16Operand, RoundToValuesIsRoundToBf16Widened) {
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> special = {0.0f,
                                -0.0f,
                                inf,
                                -inf,
                                std::numeric_limits<float>::quiet_NaN(),
                                -std::numeric_limits<float>::quiet_NaN(),
                                std::numeric_limits<float>::max(),
                                -std::numeric_limits<float>::max(),
                                std::numeric_limits<float>::denorm_min(),
                                std::numeric_limits<float>::min(),
                                1.0f,
                                1.0f + 1.0f / 256.0f,  // a tie: rounds to even (1)
                                1.0f + 3.0f / 256.0f,  // a tie: rounds up to even
                                3.3895314e38f};        // rounds up to infinity
  uint32_t signalling = 0x7F800001u;                   // a NaN with a low payload bit only
  float snan = 0.0f;
  std::memcpy(&snan, &signalling, sizeof snan);
  special.push_back(snan);
  std::mt19937 gen(3);
  std::normal_distribution<float> normal(0.0f, 10.0f);
  for (const int64_t n : {int64_t{1}, int64_t{15}, int64_t{16}, int64_t{8191}, int64_t{300001}}) {
    std::vector<float> x(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i)
      x[size_t(i)] = i < int64_t(special.size()) ? special[size_t(i)] : normal(gen);
    std::vector<float> want(x.size()), got(x.size() + 1, 7.0f);
    for (size_t i = 0; i < x.size(); ++i) want[i] = to_float(to_bfloat16(x[i]));
    kernels::round_to_bf16_values(got.data(), x.data(), n);
    EXPECT_EQ(got[size_t(n)], 7.0f) << "wrote past n = " << n;
    got.pop_back();
    EXPECT_TRUE(same_bits(got, want)) << "n " << n;
    kernels::round_to_bf16_values(x.data(), x.data(), n);  // in place
    EXPECT_TRUE(same_bits(x, want)) << "in place, n " << n;
  }
}

// Products of rounded and of-bf16 operands, whole and as a column block of
// a wider matrix, in every transposition: gemm_bf16's bits on each route,
// the operands in the route's form.
TEST(Bf16Operand, ProductsGiveGemmBf16BitsOnEveryRoute) {
  const int64_t M = 37, N = 29, K = 45;
  for (const std::string& route : gemm::gemm_bf16_routes()) {
    const GemmBf16RouteGuard guard(route);
    ASSERT_TRUE(guard.forced());
    for (const Trans ta : {Trans::kNo, Trans::kYes}) {
      for (const Trans tb : {Trans::kNo, Trans::kYes}) {
        const std::string what =
            route + (ta == Trans::kYes ? " A^T" : " A") + (tb == Trans::kYes ? " B^T" : " B");
        // A is the middle column block of a matrix three blocks wide.
        const int64_t a_rows = ta == Trans::kNo ? M : K, a_cols = ta == Trans::kNo ? K : M;
        const int64_t b_rows = tb == Trans::kNo ? K : N, b_cols = tb == Trans::kNo ? N : K;
        const Tensor A3 = random_matrix(a_rows, 3 * a_cols, 11);
        const Tensor B = random_matrix(b_rows, b_cols, 12);
        const Tensor C0 = random_matrix(M, N, 13);
        const auto a16 = bf16_of(A3), b16 = bf16_of(B);
        std::vector<float> want(C0.data(), C0.data() + M * N);
        gemm::gemm_bf16(ta, tb, M, N, K, 0.75f, a16.data() + a_cols, 3 * a_cols, b16.data(), b_cols,
                        0.5f, want.data(), N);

        const kernels::Bf16Operand a_rounded = kernels::Bf16Operand::rounded(A3);
        const kernels::Bf16Operand b_of = kernels::Bf16Operand::of(B.to(DType::kBFloat16));
        EXPECT_EQ(a_rounded.widened(), route == "widened") << what;
        EXPECT_EQ(b_of.widened(), route == "widened") << what;
        std::vector<float> got(C0.data(), C0.data() + M * N);
        kernels::gemm_bf16(ta, tb, M, N, K, 0.75f, kernels::Bf16At(a_rounded, a_cols), 3 * a_cols,
                           b_of, b_cols, 0.5f, got.data(), N);
        EXPECT_TRUE(same_bits(got, want)) << what;
      }
    }
  }
}

// An operand made on the widened route beside one made on the matmul route
// (the route forced between them): the bf16 one is widened for the call, so
// the product is gemm_bf16_widened's.
TEST(Bf16Operand, MixedFormsGiveTheWidenedProduct) {
  const auto routes = gemm::gemm_bf16_routes();
  if (routes.size() < 2) GTEST_SKIP() << "one gemm_bf16 route here: no mixed forms";
  const int64_t M = 20, N = 24, K = 33;
  const Tensor A = random_matrix(M, K, 21), B = random_matrix(N, K, 22);
  kernels::Bf16Operand a, b;
  {
    const GemmBf16RouteGuard guard("widened");
    ASSERT_TRUE(guard.forced());
    a = kernels::Bf16Operand::rounded(A);
  }
  {
    const GemmBf16RouteGuard guard("matmul");
    ASSERT_TRUE(guard.forced());
    b = kernels::Bf16Operand::rounded(B);
  }
  ASSERT_TRUE(a.widened());
  ASSERT_FALSE(b.widened());
  const auto a16 = bf16_of(A), b16 = bf16_of(B);
  std::vector<float> want(static_cast<size_t>(M * N)), got(want.size());
  gemm::gemm_bf16_widened(Trans::kNo, Trans::kYes, M, N, K, 1.0f, a16.data(), K, b16.data(), K,
                          0.0f, want.data(), N);
  kernels::gemm_bf16(Trans::kNo, Trans::kYes, M, N, K, 1.0f, a, K, b, K, 0.0f, got.data(), N);
  EXPECT_TRUE(same_bits(got, want));
  kernels::gemm_bf16(Trans::kNo, Trans::kYes, N, M, K, 1.0f, b, K, a, K, 0.0f, got.data(), M);
  std::vector<float> want_ba(want.size());
  gemm::gemm_bf16_widened(Trans::kNo, Trans::kYes, N, M, K, 1.0f, b16.data(), K, a16.data(), K,
                          0.0f, want_ba.data(), M);
  EXPECT_TRUE(same_bits(got, want_ba));
}

// The buffer of the last step's operand is written again when nothing else
// holds it, not when something does; and its values are the new ones.
TEST(Bf16Operand, ReusesTheLastBufferOnlyWhenFree) {
  for (const std::string& route : gemm::gemm_bf16_routes()) {
    const GemmBf16RouteGuard guard(route);
    ASSERT_TRUE(guard.forced());
    const Tensor x1 = random_matrix(8, 16, 31), x2 = random_matrix(8, 16, 32);
    kernels::Bf16Operand op = kernels::Bf16Operand::rounded(x1);
    const void* storage = storage_of(op);
    op = kernels::Bf16Operand::rounded(x2, std::move(op));
    EXPECT_EQ(storage_of(op), storage) << route;
    const std::vector<float> want = x2.to(DType::kBFloat16).to_vector();
    EXPECT_EQ(op.tensor().to_vector(), want) << route;
    const Tensor held = op.tensor();  // someone else holds the storage now
    const kernels::Bf16Operand fresh = kernels::Bf16Operand::rounded(x1, op);
    EXPECT_NE(storage_of(fresh), storage) << route;
    EXPECT_EQ(held.to_vector(), want) << route << ": a held buffer was overwritten";
    const kernels::Bf16Operand other_shape =
        kernels::Bf16Operand::rounded(random_matrix(4, 16, 33), std::move(op));
    EXPECT_EQ(other_shape.shape(), (Shape{4, 16})) << route;
  }
}

TEST(Bf16Operand, RejectsBadOperands) {
  const Tensor x = random_matrix(4, 6, 41);
  EXPECT_THROW(kernels::Bf16Operand::of(x), std::invalid_argument);  // float32: not bf16
  EXPECT_THROW(kernels::Bf16Operand::rounded(Tensor::from_int64({2}, {1, 2})),
               std::invalid_argument);
  const kernels::Bf16Operand a = kernels::Bf16Operand::rounded(x);
  std::vector<float> c(64);
  // A (4, 6) read as 5 rows, as 4 rows at leading dimension 7, and from an
  // offset that runs past its end: each names the operand and its size.
  for (const auto& [m, lda, offset] :
       std::vector<std::tuple<int64_t, int64_t, int64_t>>{{5, 6, 0}, {4, 7, 0}, {4, 6, 1}}) {
    try {
      kernels::gemm_bf16(Trans::kNo, Trans::kNo, m, 2, 6, 1.0f, kernels::Bf16At(a, offset), lda, a,
                         6, 0.0f, c.data(), 2);
      ADD_FAILURE() << "no error for rows " << m << ", lda " << lda << ", offset " << offset;
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("operand A of 24 elements"), std::string::npos)
          << e.what();
    }
  }
  EXPECT_THROW(kernels::gemm_bf16(Trans::kNo, Trans::kNo, 4, 2, 6, 1.0f, a, 6,
                                  kernels::Bf16Operand(), 2, 0.0f, c.data(), 2),
               std::invalid_argument);
}

}  // namespace
}  // namespace attn::test
