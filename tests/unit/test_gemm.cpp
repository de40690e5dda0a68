// The BLAS seam of attn/gemm.h: sgemm in all four transpose combinations against
// a plain triple loop (with leading dimensions wider than the rows, alpha and
// beta), empty products, the rows-parallel variant giving sgemm's bits, sgemv,
// sdot, the thread setting, and the messages of argument errors.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "attn/gemm.h"
#include "attn/tensor.h"
#include "bits.h"

namespace {

using attn::gemm::Engine;
using attn::gemm::Trans;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kPad = -12345.0f;  // marks elements between rows that nothing may write

// Expects `call` to throw std::invalid_argument with exactly `message`.
template <class F>
void expect_error(F call, const std::string& message) {
  try {
    call();
    ADD_FAILURE() << "expected an exception with message: " << message;
  } catch (const std::invalid_argument& e) {
    EXPECT_EQ(std::string(e.what()), message);
  }
}

// A row-major (rows, cols; ld) matrix: random values in the first cols of each
// row, kPad in the ld - cols after them.
struct Matrix {
  int64_t rows, cols, ld;
  std::vector<float> v;
  Matrix(int64_t r, int64_t c, int64_t ld_, std::mt19937& gen) : rows(r), cols(c), ld(ld_) {
    v.assign(static_cast<size_t>(std::max<int64_t>(1, r * ld)), kPad);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    for (int64_t i = 0; i < r; ++i)
      for (int64_t j = 0; j < c; ++j) at(i, j) = u(gen);
  }
  float& at(int64_t i, int64_t j) { return v[static_cast<size_t>(i * ld + j)]; }
  float at(int64_t i, int64_t j) const { return v[static_cast<size_t>(i * ld + j)]; }
  float* data() { return v.data(); }
  const float* data() const { return v.data(); }
};

// op(X)[i, j] of X stored (rows, cols; ld).
float op_at(const Matrix& X, Trans t, int64_t i, int64_t j) {
  return t == Trans::kNo ? X.at(i, j) : X.at(j, i);
}

// alpha · op(A) op(B) + beta · C by the definition, in double.
Matrix naive_gemm(Trans ta, Trans tb, int64_t M, int64_t N, int64_t K, float alpha, const Matrix& A,
                  const Matrix& B, float beta, Matrix C) {
  for (int64_t i = 0; i < M; ++i) {
    for (int64_t j = 0; j < N; ++j) {
      double s = 0.0;
      for (int64_t k = 0; k < K; ++k) s += double(op_at(A, ta, i, k)) * op_at(B, tb, k, j);
      const double c = beta == 0.0f ? 0.0 : double(beta) * C.at(i, j);
      C.at(i, j) = static_cast<float>(double(alpha) * s + c);
    }
  }
  return C;
}

// The operands of one product, op(A) (M, K), op(B) (K, N), C (M, N), each with
// `pad` spare columns per row.
struct Problem {
  Trans ta, tb;
  int64_t M, N, K;
  Matrix A, B, C;
  Problem(Trans ta_, Trans tb_, int64_t M_, int64_t N_, int64_t K_, int64_t pad, std::mt19937& gen)
      : ta(ta_),
        tb(tb_),
        M(M_),
        N(N_),
        K(K_),
        A(ta == Trans::kNo ? M : K, ta == Trans::kNo ? K : M, (ta == Trans::kNo ? K : M) + pad,
          gen),
        B(tb == Trans::kNo ? K : N, tb == Trans::kNo ? N : K, (tb == Trans::kNo ? N : K) + pad,
          gen),
        C(M, N, N + pad, gen) {}
  void run(float alpha, float beta, bool rows_parallel = false, Engine engine = Engine::kBlas) {
    const auto f = rows_parallel ? attn::gemm::sgemm_rows_parallel : attn::gemm::sgemm;
    f(ta, tb, M, N, K, alpha, A.data(), A.ld, B.data(), B.ld, beta, C.data(), C.ld, engine);
  }
};

const Trans kBoth[] = {Trans::kNo, Trans::kYes};
const Engine kEngines[] = {Engine::kBlas, Engine::kFast};

std::string engine_name(Engine e) { return e == Engine::kBlas ? "blas" : "fast"; }

std::string combo(Trans ta, Trans tb) {
  return std::string(ta == Trans::kNo ? "N" : "T") + (tb == Trans::kNo ? "N" : "T");
}

// C against the naive product: the values within a relative float tolerance,
// the padding untouched.
void expect_close(const Matrix& got, const Matrix& want, int64_t K, const std::string& what) {
  ASSERT_EQ(got.v.size(), want.v.size());
  for (int64_t i = 0; i < got.rows; ++i) {
    for (int64_t j = 0; j < got.ld; ++j) {
      const float g = got.at(i, j), w = want.at(i, j);
      if (j >= got.cols) {
        ASSERT_EQ(g, kPad) << what << ": padding written at (" << i << ", " << j << ")";
        continue;
      }
      // K terms of magnitude <= 1 each: rounding of order K · 2^-24 · |terms|.
      const float tol = 1e-6f * float(K + 4) * 4.0f;
      ASSERT_NEAR(g, w, tol) << what << " at (" << i << ", " << j << ")";
    }
  }
}

TEST(Gemm, AllTransposeCombinationsMatchTheDefinition) {
  std::mt19937 gen(1);
  // Small (the BLAS's edge kernels) and larger than its register blocks.
  const int64_t sizes[][3] = {{1, 1, 1}, {7, 5, 9}, {3, 17, 2}, {130, 70, 97}};
  const float scalars[][2] = {{1.0f, 0.0f}, {1.5f, -0.5f}, {-2.0f, 1.0f}, {0.0f, 0.25f}};
  for (Engine engine : kEngines) {
    for (Trans ta : kBoth) {
      for (Trans tb : kBoth) {
        for (const auto& s : sizes) {
          for (const auto& ab : scalars) {
            for (bool rows_parallel : {false, true}) {
              Problem p(ta, tb, s[0], s[1], s[2], /*pad=*/3, gen);
              const Matrix want = naive_gemm(ta, tb, p.M, p.N, p.K, ab[0], p.A, p.B, ab[1], p.C);
              p.run(ab[0], ab[1], rows_parallel, engine);
              expect_close(p.C, want, p.K,
                           engine_name(engine) + (rows_parallel ? " rows-parallel " : " ") +
                               combo(ta, tb) + " " + std::to_string(p.M) + "x" +
                               std::to_string(p.N) + "x" + std::to_string(p.K) + " alpha " +
                               std::to_string(ab[0]) + " beta " + std::to_string(ab[1]));
            }
          }
        }
      }
    }
  }
}

TEST(Gemm, BetaZeroOverwritesNaN) {
  std::mt19937 gen(2);
  Problem p(Trans::kNo, Trans::kYes, 4, 6, 5, 2, gen);
  for (Engine engine : kEngines) {
    for (int64_t i = 0; i < p.M; ++i)
      for (int64_t j = 0; j < p.N; ++j) p.C.at(i, j) = kNaN;
    const Matrix want = naive_gemm(p.ta, p.tb, p.M, p.N, p.K, 1.0f, p.A, p.B, 0.0f, p.C);
    p.run(1.0f, 0.0f, false, engine);
    expect_close(p.C, want, p.K, "beta 0 over NaN, " + engine_name(engine));
  }
}

TEST(Gemm, EmptyProducts) {
  std::mt19937 gen(3);
  for (bool rows_parallel : {false, true}) {
    for (Engine engine : kEngines) {
      // M == 0 or N == 0: nothing to write; C's padding and values stay.
      for (const auto& mn : {std::array<int64_t, 2>{0, 4}, std::array<int64_t, 2>{3, 0}}) {
        Problem p(Trans::kNo, Trans::kNo, mn[0], mn[1], 5, 2, gen);
        const std::vector<float> before = p.C.v;
        p.run(1.0f, 0.0f, rows_parallel, engine);
        EXPECT_EQ(p.C.v, before);
      }
      // K == 0: C = beta·C; beta 0 overwrites (NaN included), beta 1 leaves C as it is.
      for (float beta : {0.0f, 1.0f, -3.0f}) {
        for (Trans ta : kBoth) {
          Problem p(ta, Trans::kYes, 3, 4, 0, 2, gen);
          p.C.at(1, 2) = kNaN;
          const Matrix want = naive_gemm(p.ta, p.tb, p.M, p.N, p.K, 1.0f, p.A, p.B, beta, p.C);
          p.run(1.0f, beta, rows_parallel, engine);
          for (int64_t i = 0; i < p.M; ++i) {
            for (int64_t j = 0; j < p.C.ld; ++j) {
              if (std::isnan(want.at(i, j))) {
                EXPECT_TRUE(std::isnan(p.C.at(i, j)));
              } else {
                EXPECT_EQ(p.C.at(i, j), want.at(i, j))
                    << "beta " << beta << " at " << i << ", " << j;
              }
            }
          }
        }
      }
      // K == 0 with a leading dimension of 0 for the column-less A: valid.
      std::vector<float> c(6, 7.0f);
      attn::gemm::sgemm(Trans::kNo, Trans::kNo, 2, 3, 0, 1.0f, nullptr, 0, nullptr, 3, 0.5f,
                        c.data(), 3, engine);
      EXPECT_EQ(c, std::vector<float>(6, 3.5f));
    }
  }
}

// The rows-parallel variant splits C by rows over the OpenMP threads, thread t
// of n computing rows [M·t/n, M·(t+1)/n) with one single-threaded sgemm. Its
// bits must be exactly those sgemm calls on the row blocks, made one after the
// other, for any split and transpose (which checks the offsets into A and C),
// and exactly one sgemm's when there is nothing to split. (They are not always
// one sgemm's over all M rows: OpenBLAS's Haswell sgemm sums the rows of an M
// remainder in another order, so its last bits depend on M.)
TEST(Gemm, RowsParallelIsSgemmOnRowBlocks) {
  std::mt19937 gen(4);
  const int saved_omp = omp_get_max_threads();
  const int saved_blas = attn::gemm::blas_threads();
  for (int threads : {1, 2, 3, 4}) {
    omp_set_num_threads(threads);
    for (Trans ta : kBoth) {
      for (Trans tb : kBoth) {
        for (int64_t M : {1, 63, 64, 127, 128, 129, 200, 517}) {
          Problem p(ta, tb, M, 96, 80, 5, gen);
          Problem q = p;
          q.run(0.75f, 0.5f, /*rows_parallel=*/true);
          EXPECT_EQ(attn::gemm::blas_threads(), saved_blas) << "BLAS threads not restored";
          // The split sgemm_rows_parallel promises: >= 64 rows per thread.
          const int64_t n = std::clamp<int64_t>(M / 64, 1, threads);
          attn::gemm::set_blas_threads(n == 1 ? saved_blas : 1);
          for (int64_t t = 0; t < n; ++t) {
            const int64_t r0 = M * t / n, r1 = M * (t + 1) / n;
            const float* A_rows = p.A.data() + (ta == Trans::kNo ? r0 * p.A.ld : r0);
            attn::gemm::sgemm(ta, tb, r1 - r0, p.N, p.K, 0.75f, A_rows, p.A.ld, p.B.data(), p.B.ld,
                              0.5f, p.C.data() + r0 * p.C.ld, p.C.ld);
          }
          attn::gemm::set_blas_threads(saved_blas);
          ASSERT_TRUE(attn::test::same_bytes(p.C.data(), q.C.data(), p.C.v.size() * sizeof(float)))
              << combo(ta, tb) << " M " << M << ", " << threads << " threads";
        }
      }
    }
  }
  omp_set_num_threads(saved_omp);
}

TEST(Gemm, RowsParallelMatchesTheDefinition) {
  std::mt19937 gen(7);
  for (Trans ta : kBoth) {
    for (Trans tb : kBoth) {
      Problem p(ta, tb, 301, 70, 90, 2, gen);
      const Matrix want = naive_gemm(ta, tb, p.M, p.N, p.K, -1.25f, p.A, p.B, 2.0f, p.C);
      p.run(-1.25f, 2.0f, /*rows_parallel=*/true);
      expect_close(p.C, want, p.K, "rows parallel " + combo(ta, tb));
    }
  }
}

TEST(Gemm, RowsParallelInsideAParallelRegionRunsOnTheCallingThread) {
  std::mt19937 gen(5);
  Problem p(Trans::kYes, Trans::kNo, 300, 40, 50, 1, gen);
  Problem q = p;
  p.run(1.0f, 1.0f);
#pragma omp parallel num_threads(2)
  {
#pragma omp single
    q.run(1.0f, 1.0f, /*rows_parallel=*/true);
  }
  EXPECT_EQ(p.C.v, q.C.v);
}

TEST(Gemm, SgemvMatchesTheDefinition) {
  std::mt19937 gen(6);
  for (Trans ta : kBoth) {
    const Matrix A(9, 5, 7, gen);  // (M, N; lda) = (9, 5; 7)
    const int64_t x_len = ta == Trans::kNo ? 5 : 9, y_len = ta == Trans::kNo ? 9 : 5;
    const Matrix x(1, x_len, x_len, gen);
    Matrix y(1, y_len, y_len, gen);
    std::vector<float> want(static_cast<size_t>(y_len));
    for (int64_t r = 0; r < y_len; ++r) {
      double s = 0.0;
      for (int64_t k = 0; k < x_len; ++k)
        s += double(ta == Trans::kNo ? A.at(r, k) : A.at(k, r)) * x.at(0, k);
      want[static_cast<size_t>(r)] = static_cast<float>(2.0 * s + 0.5 * y.at(0, r));
    }
    attn::gemm::sgemv(ta, 9, 5, 2.0f, A.data(), A.ld, x.data(), 0.5f, y.data());
    for (int64_t r = 0; r < y_len; ++r)
      EXPECT_NEAR(y.at(0, r), want[static_cast<size_t>(r)], 1e-5f);
  }
  // An empty sum scales y; an empty y is left alone.
  std::vector<float> y = {1.0f, 2.0f, 3.0f};
  attn::gemm::sgemv(Trans::kYes, 0, 3, 1.0f, nullptr, 3, nullptr, 2.0f, y.data());
  EXPECT_EQ(y, (std::vector<float>{2.0f, 4.0f, 6.0f}));
  attn::gemm::sgemv(Trans::kNo, 0, 3, 1.0f, nullptr, 3, nullptr, 2.0f, y.data());
  EXPECT_EQ(y, (std::vector<float>{2.0f, 4.0f, 6.0f}));
}

TEST(Gemm, Sdot) {
  const std::vector<float> x = {1.0f, 2.0f, 3.0f, 4.0f}, y = {0.5f, -1.0f, 2.0f, 0.25f};
  EXPECT_EQ(attn::gemm::sdot(4, x.data(), y.data()), 0.5f - 2.0f + 6.0f + 1.0f);
  EXPECT_EQ(attn::gemm::sdot(0, nullptr, nullptr), 0.0f);
}

TEST(Gemm, BlasThreadsAndName) {
  const int saved = attn::gemm::blas_threads();
  EXPECT_GE(saved, 1);
  attn::gemm::set_blas_threads(1);
  EXPECT_EQ(attn::gemm::blas_threads(), 1);
  attn::gemm::set_blas_threads(saved);
  EXPECT_EQ(attn::gemm::blas_threads(), saved);
  EXPECT_FALSE(std::string(attn::gemm::blas_name()).empty());
  EXPECT_FALSE(std::string(attn::gemm::fast_gemm_name()).empty());
}

TEST(Gemm, ArgumentErrors) {
  using attn::gemm::sgemm;
  float buf[64] = {};
  const float* a = buf;
  float* c = buf;
  expect_error([&] { sgemm(Trans::kNo, Trans::kNo, -1, 2, 2, 1, a, 2, a, 2, 0, c, 2); },
               "gemm::sgemm: M = -1 is negative");
  expect_error([&] { sgemm(Trans::kNo, Trans::kNo, 2, -3, 2, 1, a, 2, a, 2, 0, c, 2); },
               "gemm::sgemm: N = -3 is negative");
  expect_error([&] { sgemm(Trans::kNo, Trans::kNo, 2, 2, -1, 1, a, 2, a, 2, 0, c, 2); },
               "gemm::sgemm: K = -1 is negative");
  expect_error([&] { sgemm(Trans::kNo, Trans::kNo, 2, 3, 4, 1, a, 3, a, 3, 0, c, 3); },
               "gemm::sgemm: lda = 3 < K = 4 (A is (M, K) = (2, 4))");
  expect_error([&] { sgemm(Trans::kYes, Trans::kNo, 2, 3, 4, 1, a, 1, a, 3, 0, c, 3); },
               "gemm::sgemm: lda = 1 < M = 2 (A is (K, M) = (4, 2), transposed)");
  expect_error([&] { sgemm(Trans::kNo, Trans::kNo, 2, 3, 4, 1, a, 4, a, 2, 0, c, 3); },
               "gemm::sgemm: ldb = 2 < N = 3 (B is (K, N) = (4, 3))");
  expect_error([&] { sgemm(Trans::kNo, Trans::kYes, 2, 3, 4, 1, a, 4, a, 3, 0, c, 3); },
               "gemm::sgemm: ldb = 3 < K = 4 (B is (N, K) = (3, 4), transposed)");
  expect_error([&] { sgemm(Trans::kNo, Trans::kNo, 2, 3, 4, 1, a, 4, a, 3, 0, c, 2); },
               "gemm::sgemm: ldc = 2 < N = 3 (C is (M, N) = (2, 3))");
  // Debian's OpenBLAS takes 32-bit integers; nothing runs before the check.
  const int64_t big = int64_t{1} << 31;
  expect_error([&] { sgemm(Trans::kNo, Trans::kNo, big, 1, 1, 1, a, 1, a, 1, 0, c, 1); },
               "gemm::sgemm: M = 2147483648 does not fit the BLAS's 32-bit integer");
  expect_error([&] { sgemm(Trans::kNo, Trans::kNo, 1, 1, 1, 1, a, big, a, 1, 0, c, 1); },
               "gemm::sgemm: lda = 2147483648 does not fit the BLAS's 32-bit integer");
  expect_error(
      [&] {
        attn::gemm::sgemm_rows_parallel(Trans::kNo, Trans::kNo, 2, 3, 4, 1, a, 4, a, 3, 0, c, 2);
      },
      "gemm::sgemm_rows_parallel: ldc = 2 < N = 3 (C is (M, N) = (2, 3))");
  expect_error([&] { attn::gemm::sgemv(Trans::kNo, 4, 3, 1, a, 2, a, 0, c); },
               "gemm::sgemv: lda = 2 < N = 3 (A is (M, N) = (4, 3))");
  expect_error([&] { attn::gemm::sgemv(Trans::kYes, -4, 3, 1, a, 3, a, 0, c); },
               "gemm::sgemv: M = -4 is negative");
  expect_error([&] { attn::gemm::sdot(-1, a, a); }, "gemm::sdot: n = -1 is negative");
  expect_error([&] { attn::gemm::set_blas_threads(0); },
               "gemm::set_blas_threads: n = 0 is less than 1");
  EXPECT_EQ(buf[0], 0.0f);  // nothing ran
}

}  // namespace

// ---- bf16 -------------------------------------------------------------------------------

namespace bf16_test {

// X's values rounded to bf16 (what gemm_bf16 reads), padding kept as bf16 kPad.
std::vector<attn::BFloat16> to_bf16(const Matrix& X) {
  std::vector<attn::BFloat16> out(X.v.size());
  for (size_t i = 0; i < X.v.size(); ++i) out[i] = attn::to_bfloat16(X.v[i]);
  return out;
}

// The matrix whose values are the bf16 ones, as floats (the exact operands).
Matrix rounded(Matrix X) {
  for (float& x : X.v) x = attn::to_float(attn::to_bfloat16(x));
  return X;
}

}  // namespace bf16_test

// gemm_bf16 against the definition on the bf16 operands (exact products,
// float32 sums: the same K-term rounding bound as sgemm), every transpose,
// sizes below and above the kernels' blocks, alpha and beta, padding untouched.
TEST(GemmBf16, AllTransposeCombinationsMatchTheDefinition) {
  std::mt19937 gen(11);
  const int64_t sizes[][3] = {{1, 1, 1}, {7, 5, 9}, {3, 17, 2}, {130, 70, 97}, {64, 64, 64}};
  const float scalars[][2] = {{1.0f, 0.0f}, {1.5f, -0.5f}, {-2.0f, 1.0f}};
  std::printf("[ GEMM BF16 ] %s\n", attn::gemm::gemm_bf16_name());
  for (const bool widened : {false, true}) {  // the product gemm_bf16 runs, and its fallback
    const auto f = widened ? attn::gemm::gemm_bf16_widened : attn::gemm::gemm_bf16;
    for (Trans ta : kBoth) {
      for (Trans tb : kBoth) {
        for (const auto& s : sizes) {
          for (const auto& ab : scalars) {
            Problem p(ta, tb, s[0], s[1], s[2], /*pad=*/3, gen);
            const Matrix A = bf16_test::rounded(p.A), B = bf16_test::rounded(p.B);
            const Matrix want = naive_gemm(ta, tb, p.M, p.N, p.K, ab[0], A, B, ab[1], p.C);
            const auto a16 = bf16_test::to_bf16(p.A), b16 = bf16_test::to_bf16(p.B);
            f(ta, tb, p.M, p.N, p.K, ab[0], a16.data(), p.A.ld, b16.data(), p.B.ld, ab[1],
              p.C.data(), p.C.ld);
            expect_close(p.C, want, p.K,
                         std::string(widened ? "bf16 widened " : "bf16 ") + combo(ta, tb) + " " +
                             std::to_string(p.M) + "x" + std::to_string(p.N) + "x" +
                             std::to_string(p.K) + " alpha " + std::to_string(ab[0]) + " beta " +
                             std::to_string(ab[1]));
          }
        }
      }
    }
  }
}

// The routes: each this build and CPU has, forced, gives the definition's
// values (the test above runs the automatic one) and names itself; an unknown
// name is refused and leaves the route as it was; "auto" restores the rule.
TEST(GemmBf16, EveryRouteMatchesTheDefinitionAndNamesItself) {
  namespace g = attn::gemm;
  const std::vector<std::string> routes = g::gemm_bf16_routes();
  ASSERT_FALSE(routes.empty());
  EXPECT_EQ(routes.back(), "widened");  // every build has it
  const std::string automatic = g::gemm_bf16_route();
  EXPECT_NE(std::find(routes.begin(), routes.end(), automatic), routes.end());
  std::printf("[ GEMM BF16 ] automatic route %s: %s\n", automatic.c_str(),
              g::gemm_bf16_reason().c_str());
  std::mt19937 gen(13);
  for (const std::string& route : routes) {
    ASSERT_TRUE(g::gemm_bf16_use(route.c_str()));
    EXPECT_EQ(g::gemm_bf16_route(), route);
    EXPECT_EQ(g::gemm_bf16_reason(), "forced by gemm::gemm_bf16_use");
    EXPECT_EQ(std::string(g::gemm_bf16_name()).rfind("bf16 widened to fp32", 0) == 0,
              route == "widened")
        << g::gemm_bf16_name();
    for (Trans ta : kBoth) {
      Problem p(ta, Trans::kYes, 300, 70, 257, /*pad=*/2, gen);  // past the widening's row split
      const Matrix want = naive_gemm(ta, Trans::kYes, p.M, p.N, p.K, 1.0f,
                                     bf16_test::rounded(p.A), bf16_test::rounded(p.B), 0.5f, p.C);
      const auto a16 = bf16_test::to_bf16(p.A), b16 = bf16_test::to_bf16(p.B);
      g::gemm_bf16(ta, Trans::kYes, p.M, p.N, p.K, 1.0f, a16.data(), p.A.ld, b16.data(), p.B.ld,
                   0.5f, p.C.data(), p.C.ld);
      expect_close(p.C, want, p.K, "bf16 route " + route + " " + combo(ta, Trans::kYes));
    }
  }
  EXPECT_FALSE(g::gemm_bf16_use("amx"));
  EXPECT_EQ(g::gemm_bf16_route(), routes.back());  // still the last one forced
  ASSERT_TRUE(g::gemm_bf16_use("auto"));
  EXPECT_EQ(g::gemm_bf16_route(), automatic);
}

// widen_bf16 is exact for every bf16 bit pattern (NaNs and subnormals
// included), in short and long runs split over the threads, writes
// nothing past n, and refuses n < 0.
TEST(GemmBf16, WidenIsExactForEveryBitPattern) {
  for (const int64_t n :
       {int64_t{0}, int64_t{1}, int64_t{8191}, int64_t{8193}, int64_t{65536}, int64_t{200003}}) {
    std::vector<attn::BFloat16> src(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) src[size_t(i)].bits = uint16_t((i * 40503) & 0xFFFF);
    std::vector<float> dst(static_cast<size_t>(n) + 1, 7.0f);
    attn::gemm::widen_bf16(dst.data(), src.data(), n);
    for (int64_t i = 0; i < n; ++i) {
      uint32_t bits = 0;
      std::memcpy(&bits, &dst[size_t(i)], sizeof bits);
      ASSERT_EQ(bits, uint32_t(src[size_t(i)].bits) << 16) << "n " << n << " at " << i;
    }
    EXPECT_EQ(dst[size_t(n)], 7.0f) << "n " << n;
  }
  std::vector<attn::BFloat16> all(65536);
  for (size_t i = 0; i < all.size(); ++i) all[i].bits = uint16_t(i);
  std::vector<float> wide(all.size());
  attn::gemm::widen_bf16(wide.data(), all.data(), int64_t(all.size()));
  for (size_t i = 0; i < all.size(); ++i) {
    const float want = attn::to_float(all[i]);
    ASSERT_EQ(std::memcmp(&wide[i], &want, sizeof want), 0) << i;
  }
  EXPECT_THROW(attn::gemm::widen_bf16(wide.data(), all.data(), -1), std::invalid_argument);
}

TEST(GemmBf16, BetaZeroOverwritesNaNAndEmptyProductsScale) {
  std::mt19937 gen(12);
  Problem p(Trans::kNo, Trans::kYes, 4, 6, 5, 2, gen);
  for (int64_t i = 0; i < p.M; ++i)
    for (int64_t j = 0; j < p.N; ++j) p.C.at(i, j) = kNaN;
  const Matrix want = naive_gemm(p.ta, p.tb, p.M, p.N, p.K, 1.0f, bf16_test::rounded(p.A),
                                 bf16_test::rounded(p.B), 0.0f, p.C);
  const auto a16 = bf16_test::to_bf16(p.A), b16 = bf16_test::to_bf16(p.B);
  attn::gemm::gemm_bf16(p.ta, p.tb, p.M, p.N, p.K, 1.0f, a16.data(), p.A.ld, b16.data(), p.B.ld,
                        0.0f, p.C.data(), p.C.ld);
  expect_close(p.C, want, p.K, "bf16 beta 0 over NaN");
  std::vector<float> c(6, 7.0f);  // K == 0: C = beta·C
  attn::gemm::gemm_bf16(Trans::kNo, Trans::kNo, 2, 3, 0, 1.0f, nullptr, 0, nullptr, 3, 0.5f,
                        c.data(), 3);
  EXPECT_EQ(c, std::vector<float>(6, 3.5f));
}

TEST(GemmBf16, ArgumentErrorsNameTheValues) {
  std::vector<attn::BFloat16> a(64);
  float c[64] = {};
  expect_error(
      [&] {
        attn::gemm::gemm_bf16(Trans::kNo, Trans::kNo, 2, 3, 4, 1, a.data(), 3, a.data(), 3, 0, c,
                              3);
      },
      "gemm::gemm_bf16: lda = 3 < K = 4 (A is (M, K) = (2, 4))");
  expect_error(
      [&] {
        attn::gemm::gemm_bf16(Trans::kNo, Trans::kNo, -1, 3, 4, 1, a.data(), 4, a.data(), 3, 0, c,
                              3);
      },
      "gemm::gemm_bf16: M = -1 is negative");
}

// ---- Engine::kFast: oneDNN, or forced -----------------------------------------------------
namespace {

// Forces kFast onto `name` for the life of the object, then back to automatic.
struct ForcedFastEngine {
  explicit ForcedFastEngine(const std::string& name) {
    EXPECT_TRUE(attn::gemm::fast_gemm_use(name.c_str())) << name;
  }
  ~ForcedFastEngine() { attn::gemm::fast_gemm_use(nullptr); }
  ForcedFastEngine(const ForcedFastEngine&) = delete;
  ForcedFastEngine& operator=(const ForcedFastEngine&) = delete;
};

}  // namespace

TEST(GemmFastEngine, EveryEngineMatchesTheDefinitionAndTheBlas) {
  const auto engines = attn::gemm::fast_gemm_engines();
  ASSERT_FALSE(engines.empty());
  EXPECT_EQ(engines.back(), "blas");  // always built in
  std::mt19937 gen(11);
  for (const std::string& name : engines) {
    const ForcedFastEngine forced(name);
    EXPECT_EQ(attn::gemm::fast_gemm_engine(), name);
    EXPECT_EQ(attn::gemm::fast_gemm_reason(), "forced by gemm::fast_gemm_use");
    if (name == "blas") {
      EXPECT_STREQ(attn::gemm::fast_gemm_name(), attn::gemm::blas_name());
    } else {
      EXPECT_NE(std::string(attn::gemm::fast_gemm_name()).find("oneDNN"), std::string::npos)
          << attn::gemm::fast_gemm_name();
    }
    for (Trans ta : kBoth) {
      for (Trans tb : kBoth) {
        for (int64_t M : {1, 63, 200, 517}) {
          for (bool rows_parallel : {false, true}) {
            const std::string what = name + " " + combo(ta, tb) + " M " + std::to_string(M) +
                                     (rows_parallel ? " rows parallel" : "");
            Problem fast(ta, tb, M, 70, 130, 3, gen);
            Problem blas = fast;
            const Matrix want =
                naive_gemm(ta, tb, fast.M, fast.N, fast.K, 0.5f, fast.A, fast.B, -1.0f, fast.C);
            fast.run(0.5f, -1.0f, rows_parallel, Engine::kFast);
            blas.run(0.5f, -1.0f, rows_parallel, Engine::kBlas);
            expect_close(fast.C, want, fast.K, what);
            expect_close(fast.C, blas.C, fast.K, what + " vs kBlas");
          }
        }
      }
    }
  }
}

TEST(GemmFastEngine, UnknownNamesAreRefusedAndChangeNothing) {
  const ForcedFastEngine forced("blas");
  EXPECT_FALSE(attn::gemm::fast_gemm_use("mkl"));
  EXPECT_FALSE(attn::gemm::fast_gemm_use(""));
  EXPECT_FALSE(attn::gemm::fast_gemm_use("BLAS"));
  EXPECT_EQ(std::string(attn::gemm::fast_gemm_engine()), "blas");
}

// Automatic (no ATTN_GEMM_ENGINE): oneDNN where it is built in, never a
// timing, so that two runs of one command give the same bits; the rates are
// measured for attn bench only, and asking for them changes nothing.
TEST(GemmFastEngine, AutomaticChoiceIsFixedAndTheRatesAreMeasured) {
  const char* env = std::getenv("ATTN_GEMM_ENGINE");
  if (env != nullptr && *env != '\0') GTEST_SKIP() << "ATTN_GEMM_ENGINE is set";
  ASSERT_TRUE(attn::gemm::fast_gemm_use(nullptr));
  const std::string engine = attn::gemm::fast_gemm_engine();
  const std::string reason = attn::gemm::fast_gemm_reason();
  std::printf("fast engine: %s (%s)\n", attn::gemm::fast_gemm_name(), reason.c_str());
  if (attn::gemm::fast_gemm_engines().size() == 1) {
    EXPECT_EQ(engine, "blas");
    EXPECT_EQ(reason, "built without oneDNN");
    return;
  }
  EXPECT_EQ(engine, "onednn");
  EXPECT_EQ(reason.rfind("oneDNN unless ATTN_GEMM_ENGINE=blas", 0), 0u) << reason;
  const auto rates = attn::gemm::fast_gemm_rates();
  EXPECT_GT(rates.onednn_gflops, 0.0);
  EXPECT_GT(rates.blas_gflops, 0.0);
  EXPECT_EQ(attn::gemm::fast_gemm_engine(), engine);  // the measurement chose nothing
  EXPECT_EQ(attn::gemm::fast_gemm_reason(), reason);
}
