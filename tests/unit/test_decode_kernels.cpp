// The decode kernels (attn/decode_kernels.h) against plain double-precision
// loops: gemv_forward and gemv_forward_bf16 (every bf16 path, every SIMD
// target this CPU runs, forced in turn) on shapes whose K is and is not a
// multiple of the vector width and whose N is and is not a multiple of the
// row blocks; decode_attention and decode_attention_bf16 against the softmax
// written out; a batch of products gives the bits of separate calls; the bits do not depend on the
// thread count; the bandwidth probe measures something positive; every error message.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

#include "attn/cpu.h"
#include "attn/decode_kernels.h"
#include "attn/kernels.h"
#include "attn/random.h"
#include "attn/tensor.h"
#include "expect.h"

namespace attn::test {
namespace {

namespace kn = attn::kernels;

struct GemvShape {
  int64_t M, N, K;
};

const std::vector<GemvShape> kShapes = {{1, 1, 1},    {1, 5, 3},     {1, 37, 17},   {2, 64, 64},
                                        {3, 70, 100}, {1, 768, 768}, {2, 131, 768}, {1, 33, 3072}};

std::vector<float> uniform(int64_t n, Generator& gen) {
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = static_cast<float>(gen.uniform_double() * 2.0 - 1.0);
  return v;
}

std::vector<BFloat16> rounded(const std::vector<float>& v) {
  std::vector<BFloat16> out;
  for (float x : v) out.push_back(to_bfloat16(x));
  return out;
}

// y (M, N) = x Wᵀ + bias in double, and Σ |x||w| per element (the scale of
// the rounding error of a float sum in any order).
void reference_gemv(const std::vector<double>& x, const std::vector<double>& W,
                    const std::vector<float>& bias, int64_t M, int64_t N, int64_t K,
                    std::vector<double>& y, std::vector<double>& scale) {
  y.assign(static_cast<size_t>(M * N), 0.0);
  scale.assign(static_cast<size_t>(M * N), 0.0);
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t n = 0; n < N; ++n) {
      double s = bias.empty() ? 0.0 : bias[size_t(n)], a = 0.0;
      for (int64_t k = 0; k < K; ++k) {
        s += x[size_t(m * K + k)] * W[size_t(n * K + k)];
        a += std::abs(x[size_t(m * K + k)] * W[size_t(n * K + k)]);
      }
      y[size_t(m * N + n)] = s;
      scale[size_t(m * N + n)] = a + 1.0;
    }
  }
}

// |y - ref| <= (K + 16)·2⁻²⁴·(Σ|x w| + 1) for every element: the bound of a
// float sum of K exact products (and the bias) in any order; a product left
// out or counted twice is far larger.
void expect_close(const std::vector<float>& y, int64_t ldy, const std::vector<double>& ref,
                  const std::vector<double>& scale, int64_t M, int64_t N, int64_t K) {
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t n = 0; n < N; ++n) {
      const size_t i = size_t(m * N + n);
      ASSERT_LE(std::abs(double(y[size_t(m * ldy + n)]) - ref[i]),
                double(K + 16) * 0x1p-24 * scale[i])
          << "m " << m << " n " << n << " y " << y[size_t(m * ldy + n)] << " ref " << ref[i];
    }
  }
}

TEST(DecodeKernels, GemvMatchesDoubleOnEveryTarget) {
  Generator gen(3);
  for (const std::string& target : kn::flash_attention_targets()) {
    ASSERT_TRUE(kn::flash_attention_use_target(target.c_str()));
    for (const GemvShape& s : kShapes) {
      for (bool with_bias : {false, true}) {
        SCOPED_TRACE(::testing::Message() << target << " M " << s.M << " N " << s.N << " K " << s.K
                                          << " bias " << with_bias);
        const int64_t ldx = s.K + 3, ldy = s.N + 2;  // padded rows: the strides are honoured
        std::vector<float> x = uniform(s.M * ldx, gen), W = uniform(s.N * s.K, gen);
        const std::vector<float> bias = with_bias ? uniform(s.N, gen) : std::vector<float>{};
        std::vector<double> xd, Wd(W.begin(), W.end()), ref, scale;
        for (int64_t m = 0; m < s.M; ++m)
          for (int64_t k = 0; k < s.K; ++k) xd.push_back(x[size_t(m * ldx + k)]);
        reference_gemv(xd, Wd, bias, s.M, s.N, s.K, ref, scale);
        std::vector<float> y(size_t(s.M * ldy), 7.0f);
        kn::gemv_forward(y.data(), ldy, x.data(), ldx, W.data(), with_bias ? bias.data() : nullptr,
                         s.M, s.N, s.K);
        expect_close(y, ldy, ref, scale, s.M, s.N, s.K);
        for (int64_t m = 0; m < s.M; ++m)
          for (int64_t n = s.N; n < ldy; ++n) EXPECT_EQ(y[size_t(m * ldy + n)], 7.0f);
      }
    }
  }
  ASSERT_TRUE(kn::flash_attention_use_target(nullptr));
}

// Products batched into one parallel region give the bits of separate calls.
TEST(DecodeKernels, GemvBatchEqualsSeparateCalls) {
  Generator gen(4);
  const std::vector<GemvShape> shapes = {{1, 768, 768}, {2, 37, 17}, {1, 100, 64}};
  std::vector<std::vector<float>> xs, ws, bs, ys, alone;
  std::vector<kn::GemvProblem> problems;
  for (const GemvShape& s : shapes) {
    xs.push_back(uniform(s.M * s.K, gen));
    ws.push_back(uniform(s.N * s.K, gen));
    bs.push_back(uniform(s.N, gen));
    ys.emplace_back(static_cast<size_t>(s.M * s.N));
    alone.emplace_back(static_cast<size_t>(s.M * s.N));
  }
  for (size_t i = 0; i < shapes.size(); ++i) {
    const GemvShape& s = shapes[i];
    problems.push_back({ys[i].data(), s.N, xs[i].data(), s.K, ws[i].data(),
                        i == 1 ? nullptr : bs[i].data(), s.M, s.N, s.K});
    kn::gemv_forward(alone[i].data(), s.N, xs[i].data(), s.K, ws[i].data(),
                     i == 1 ? nullptr : bs[i].data(), s.M, s.N, s.K);
  }
  kn::gemv_forward_batch(problems.data(), static_cast<int64_t>(problems.size()));
  for (size_t i = 0; i < shapes.size(); ++i) EXPECT_EQ(ys[i], alone[i]) << "problem " << i;
}

TEST(DecodeKernels, GemvBf16MatchesDoubleOnEveryPathAndTarget) {
  Generator gen(5);
  EXPECT_FALSE(kn::gemv_bf16_use_path("NO_SUCH_PATH"));
  const std::vector<std::string> paths = kn::gemv_bf16_paths();
  ASSERT_FALSE(paths.empty());
  EXPECT_EQ(paths.back(), "widened");
  EXPECT_EQ(paths.front(), attn::cpu::has_avx512_bf16() ? "AVX512-BF16" : "widened");
  for (const std::string& target : kn::flash_attention_targets()) {
    ASSERT_TRUE(kn::flash_attention_use_target(target.c_str()));
    for (const std::string& path : paths) {
      ASSERT_TRUE(kn::gemv_bf16_use_path(path.c_str()));
      EXPECT_EQ(kn::gemv_bf16_path(), path);
      for (const GemvShape& s : kShapes) {
        SCOPED_TRACE(::testing::Message()
                     << target << " " << path << " M " << s.M << " N " << s.N << " K " << s.K);
        const int64_t ldx = s.K + 1, ldy = s.N;
        const std::vector<BFloat16> x = rounded(uniform(s.M * ldx, gen));
        const std::vector<BFloat16> W = rounded(uniform(s.N * s.K, gen));
        const std::vector<float> bias = uniform(s.N, gen);
        std::vector<double> xd, Wd, ref, scale;
        for (int64_t m = 0; m < s.M; ++m)
          for (int64_t k = 0; k < s.K; ++k) xd.push_back(to_float(x[size_t(m * ldx + k)]));
        for (BFloat16 w : W) Wd.push_back(to_float(w));
        reference_gemv(xd, Wd, bias, s.M, s.N, s.K, ref, scale);
        std::vector<float> y(static_cast<size_t>(s.M * ldy));
        kn::gemv_forward_bf16(y.data(), ldy, x.data(), ldx, W.data(), bias.data(), s.M, s.N, s.K);
        expect_close(y, ldy, ref, scale, s.M, s.N, s.K);
      }
    }
  }
  ASSERT_TRUE(kn::gemv_bf16_use_path(nullptr));
  ASSERT_TRUE(kn::flash_attention_use_target(nullptr));
}

TEST(DecodeKernels, GemvBitsDoNotDependOnThreads) {
  Generator gen(9);
  const int64_t M = 2, N = 1000, K = 768;
  const std::vector<float> x = uniform(M * K, gen), W = uniform(N * K, gen);
  const std::vector<BFloat16> xb = rounded(x), Wb = rounded(W);
  std::vector<std::vector<float>> outs;
  for (int threads : {1, 2, 3}) {
    omp_set_num_threads(threads);
    std::vector<float> y(static_cast<size_t>(M * N)), yb(size_t(M * N));
    kn::gemv_forward(y.data(), N, x.data(), K, W.data(), nullptr, M, N, K);
    kn::gemv_forward_bf16(yb.data(), N, xb.data(), K, Wb.data(), nullptr, M, N, K);
    y.insert(y.end(), yb.begin(), yb.end());
    outs.push_back(y);
  }
  omp_set_num_threads(omp_get_num_procs());
  EXPECT_EQ(outs[0], outs[1]);
  EXPECT_EQ(outs[0], outs[2]);
}

// out (B, H·hd) of softmax(scale q Kᵀ) V over `length` rows of a (B, H, cap, hd) cache, in double.
std::vector<double> reference_attention(const std::vector<double>& q, const std::vector<double>& k,
                                        const std::vector<double>& v, int64_t B, int64_t H,
                                        int64_t length, int64_t cap, int64_t hd, double scale) {
  std::vector<double> out(size_t(B * H * hd), 0.0);
  for (int64_t bh = 0; bh < B * H; ++bh) {
    std::vector<double> s(static_cast<size_t>(length));
    double m = -INFINITY, sum = 0.0;
    for (int64_t j = 0; j < length; ++j) {
      double d = 0.0;
      for (int64_t i = 0; i < hd; ++i)
        d += q[size_t(bh * hd + i)] * k[size_t((bh * cap + j) * hd + i)];
      s[size_t(j)] = scale * d;
      m = std::max(m, s[size_t(j)]);
    }
    for (double& e : s) sum += (e = std::exp(e - m));
    for (int64_t j = 0; j < length; ++j)
      for (int64_t i = 0; i < hd; ++i)
        out[size_t(bh * hd + i)] += s[size_t(j)] / sum * v[size_t((bh * cap + j) * hd + i)];
  }
  return out;
}

TEST(DecodeKernels, AttentionMatchesSoftmaxOnEveryTarget) {
  Generator gen(13);
  struct Shape4 {
    int64_t B, H, length, cap, hd;
  };
  const std::vector<Shape4> shapes = {{1, 1, 1, 1, 1},
                                      {1, 2, 5, 8, 3},
                                      {2, 3, 17, 20, 16},
                                      {1, 12, 70, 80, 64},
                                      {2, 4, 33, 33, 40}};
  for (const std::string& target : kn::flash_attention_targets()) {
    ASSERT_TRUE(kn::flash_attention_use_target(target.c_str()));
    for (const Shape4& s : shapes) {
      SCOPED_TRACE(::testing::Message() << target << " B " << s.B << " H " << s.H << " length "
                                        << s.length << " hd " << s.hd);
      const int64_t nq = s.B * s.H * s.hd, nkv = s.B * s.H * s.cap * s.hd;
      std::vector<float> q = uniform(nq, gen), k = uniform(nkv, gen), v = uniform(nkv, gen);
      for (float& e : q) e *= 3.0f;  // peaked softmax weights too
      const double scale = 1.0 / std::sqrt(double(s.hd));
      // fp32
      {
        const std::vector<double> ref =
            reference_attention({q.begin(), q.end()}, {k.begin(), k.end()}, {v.begin(), v.end()},
                                s.B, s.H, s.length, s.cap, s.hd, scale);
        std::vector<float> out(static_cast<size_t>(nq));
        kn::decode_attention(out.data(), q.data(), k.data(), v.data(), s.B, s.H, s.length, s.cap,
                             s.hd, float(scale));
        for (size_t i = 0; i < out.size(); ++i) ASSERT_NEAR(out[i], ref[i], 2e-6) << i;
      }
      // bf16: the same maths on the bf16 values, out rounded to bf16 (half an ulp, 2^-9 relative)
      {
        const std::vector<BFloat16> qb = rounded(q), kb = rounded(k), vb = rounded(v);
        std::vector<double> qd, kd, vd;
        for (BFloat16 e : qb) qd.push_back(to_float(e));
        for (BFloat16 e : kb) kd.push_back(to_float(e));
        for (BFloat16 e : vb) vd.push_back(to_float(e));
        const std::vector<double> ref =
            reference_attention(qd, kd, vd, s.B, s.H, s.length, s.cap, s.hd, scale);
        std::vector<BFloat16> out(static_cast<size_t>(nq));
        kn::decode_attention_bf16(out.data(), qb.data(), kb.data(), vb.data(), s.B, s.H, s.length,
                                  s.cap, s.hd, float(scale));
        for (size_t i = 0; i < out.size(); ++i)
          ASSERT_NEAR(to_float(out[i]), ref[i], std::abs(ref[i]) * 0x1p-8 + 2e-6) << i;
      }
    }
  }
  ASSERT_TRUE(kn::flash_attention_use_target(nullptr));
}

TEST(DecodeKernels, BandwidthProbe) {
  const double one = kn::read_bandwidth_gbs(int64_t{16} << 20, 1, 3);
  EXPECT_GT(one, 0.1);  // any machine reads more than 100 MB/s
  EXPECT_TRUE(std::isfinite(one));
}

TEST(DecodeKernels, Errors) {
  float y = 0, x = 0, w = 0;
  expect_message<std::invalid_argument>(
      [&] { kn::gemv_forward(&y, 1, &x, 1, &w, nullptr, 1, 2, 1); },
      "gemv_forward: need M, N, K >= 0, ldx >= K, ldy >= N; got M = 1, N = 2, K = 1, ldx = 1, "
      "ldy = 1");
  BFloat16 xb, wb;
  expect_message<std::invalid_argument>(
      [&] { kn::gemv_forward_bf16(&y, 1, &xb, 0, &wb, nullptr, 1, 1, 1); },
      "gemv_forward_bf16: need M, N, K >= 0, ldx >= K, ldy >= N; got M = 1, N = 1, K = 1, ldx = "
      "0, ldy = 1");
  expect_message<std::invalid_argument>(
      [&] { kn::decode_attention(&y, &x, &x, &x, 1, 1, 2, 1, 1, 1.0f); },
      "decode_attention: need B, H, hd >= 1 and 1 <= length <= capacity; got B = "
      "1, H = 1, hd = 1, length = 2, capacity = 1");
  expect_message<std::invalid_argument>(
      [&] { kn::decode_attention_bf16(&xb, &xb, &xb, &xb, 1, 1, 0, 1, 1, 1.0f); },
      "decode_attention_bf16: need B, H, hd >= 1 and 1 <= length <= capacity; "
      "got B = 1, H = 1, hd = 1, length = 0, capacity = 1");
  expect_message<std::invalid_argument>(
      [&] { kn::read_bandwidth_gbs(1024, 1, 1); },
      "read_bandwidth_gbs: need repeats >= 1, threads >= 0, bytes >= 1 MiB; got "
      "repeats = 1, threads = 1, bytes = 1024");
}

}  // namespace
}  // namespace attn::test
