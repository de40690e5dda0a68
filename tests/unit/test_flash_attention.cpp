// The fused attention kernel (attn/kernels.h) against the plain loops of the
// same maths (ref::strided_attention_*), forward and all three gradients, over
// sizes on both sides of every vector and tile width; dropout against the
// plain path fed the kernel's materialised noise; strided (fused QKV) inputs;
// bit-identical results for any thread count; no reads of future keys; errors.
//
// Tolerance: max |fused − reference| <= 2e-5 · max |reference| for the
// output and for each gradient (the reference accumulates in fp64), and
// |lse − lse_ref| <= 2e-5 · max(1, |lse_ref|).
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "attn/cpu.h"
#include "attn/functional.h"
#include "attn/kernels.h"
#include "attn/tensor.h"
#include "flash_cases.h"
#include "bits.h"

#ifdef _OPENMP
#include <omp.h>
#endif

namespace {

using attn::kernels::FlashAttentionParams;
namespace kn = attn::kernels;

constexpr float kRelTol = 2e-5f;

std::vector<float> randn(size_t n, uint32_t seed, float stddev = 1.0f) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> dist(0.0f, stddev);
  std::vector<float> x(n);
  for (auto& e : x) e = dist(gen);
  return x;
}

using Case = attn::test::FlashCase;
using Errors = attn::test::FlashErrors;
using attn::test::flash_rel_err;

std::string name(const Case& c) { return attn::test::flash_case_name(c); }

Errors compare_with_reference(const Case& c, uint32_t seed) {
  const int64_t d_out = c.H * c.hd;
  FlashAttentionParams p;
  p.B = c.B, p.T = c.T, p.H = c.H, p.hd = c.hd, p.causal = c.causal;
  p.dropout_p = c.dropout_p, p.dropout_seed = 0x1234 + seed;
  const int64_t in_stride = c.fused_qkv ? 3 * d_out : d_out;
  p.q_stride = p.k_stride = p.v_stride = in_stride;
  p.o_stride = c.fused_qkv ? d_out + 3 : d_out;  // a gap after each token in the strided case
  const size_t n_in = size_t(c.B * c.T * in_stride), n_out = size_t(c.B * c.T * p.o_stride);

  std::vector<float> qkv_q = randn(n_in, seed, c.input_scale);
  std::vector<float> kbuf = randn(n_in, seed + 1, c.input_scale);
  std::vector<float> vbuf = randn(n_in, seed + 2);
  const float* q = qkv_q.data();
  const float* k = c.fused_qkv ? qkv_q.data() + d_out : kbuf.data();
  const float* v = c.fused_qkv ? qkv_q.data() + 2 * d_out : vbuf.data();
  std::vector<float> dout = randn(n_out, seed + 3);

  std::vector<float> noise;
  if (c.dropout_p > 0.0f) {
    noise.resize(size_t(c.B * c.H * c.T * c.T));
    kn::flash_dropout_noise(noise.data(), p);
  }
  const float* noise_ptr = noise.empty() ? nullptr : noise.data();

  const float sentinel = 12345.0f;  // gaps between tokens must stay untouched
  std::vector<float> out(n_out, sentinel), out_ref(n_out, sentinel);
  std::vector<float> lse(size_t(c.B * c.H * c.T)), lse_ref(lse.size());
  kn::flash_attention_forward(out.data(), lse.data(), q, k, v, p);
  attn::ref::strided_attention_forward(out_ref.data(), lse_ref.data(), q, k, v, noise_ptr, p);

  std::vector<float> dq(n_in, sentinel), dk(n_in, sentinel), dv(n_in, sentinel);
  std::vector<float> dq_ref(n_in, sentinel), dk_ref(n_in, sentinel), dv_ref(n_in, sentinel);
  float* dq_p = dq.data();
  float* dk_p = c.fused_qkv ? dq.data() + d_out : dk.data();
  float* dv_p = c.fused_qkv ? dq.data() + 2 * d_out : dv.data();
  kn::flash_attention_backward(dq_p, dk_p, dv_p, dout.data(), q, k, v, out.data(), lse.data(), p);
  float* dq_r = dq_ref.data();
  float* dk_r = c.fused_qkv ? dq_ref.data() + d_out : dk_ref.data();
  float* dv_r = c.fused_qkv ? dq_ref.data() + 2 * d_out : dv_ref.data();
  attn::ref::strided_attention_backward(dq_r, dk_r, dv_r, dout.data(), q, k, v, noise_ptr, p);

  // Gather one gradient (B, T, H·hd) out of its strided buffer.
  auto gather = [&](const float* base, int64_t stride) {
    std::vector<float> g(size_t(c.B * c.T * d_out));
    for (int64_t t = 0; t < c.B * c.T; ++t)
      std::copy(base + t * stride, base + t * stride + d_out, g.begin() + t * d_out);
    return g;
  };
  Errors e{};
  e.out = flash_rel_err(out, out_ref);  // includes the gaps: sentinel == sentinel
  e.lse = 0.0;
  for (size_t n = 0; n < lse.size(); ++n)
    e.lse = std::max(
        e.lse, std::abs(double(lse[n]) - lse_ref[n]) / std::max(1.0, std::abs(double(lse_ref[n]))));
  e.dq = flash_rel_err(gather(dq_p, in_stride), gather(dq_r, in_stride));
  e.dk = flash_rel_err(gather(dk_p, in_stride), gather(dk_r, in_stride));
  e.dv = flash_rel_err(gather(dv_p, in_stride), gather(dv_r, in_stride));
  if (!c.fused_qkv) {  // dq, dk, dv own their buffers: everything was written
    EXPECT_EQ(std::count(dq.begin(), dq.end(), sentinel), 0) << name(c);
  }
  for (int64_t t = 0; t < c.B * c.T; ++t)
    for (int64_t g = d_out; g < p.o_stride; ++g) EXPECT_EQ(out[t * p.o_stride + g], sentinel);
  return e;
}

Errors expect_close(const Case& c, uint32_t seed) {
  const Errors e = compare_with_reference(c, seed);
  EXPECT_LE(e.out, kRelTol) << name(c);
  EXPECT_LE(e.lse, kRelTol) << name(c);
  EXPECT_LE(e.dq, kRelTol) << name(c);
  EXPECT_LE(e.dk, kRelTol) << name(c);
  EXPECT_LE(e.dv, kRelTol) << name(c);
  return e;
}

TEST(FlashAttention, ReportsTarget) {
  const std::string target = kn::flash_attention_target();
  EXPECT_FALSE(target.empty());
  std::printf("flash attention SIMD target: %s\n", target.c_str());
}

TEST(FlashAttention, FmaPeakIsMeasuredOnTheKernelsTarget) {
  // A rate, not a duration: only that it is a positive finite number, and
  // that a bad argument is refused with its value named.
  const double peak = attn::cpu::fma_peak_gflops(1);
  EXPECT_TRUE(std::isfinite(peak));
  EXPECT_GT(peak, 0.0);
  std::printf("fp32 FMA peak on %s: %.1f GFLOP/s\n", kn::flash_attention_target(), peak);
  try {
    attn::cpu::fma_peak_gflops(0);
    ADD_FAILURE() << "expected std::invalid_argument";
  } catch (const std::invalid_argument& e) {
    EXPECT_STREQ(e.what(), "fma_peak_gflops: repeats must be >= 1, got 0");
  }
}

TEST(FlashAttention, Bf16DotPeakIsMeasuredWhereTheCpuHasIt) {
  // Positive and finite where the CPU has AVX512-BF16, 0 where it has not
  // (the probe's instruction is then never executed); bad argument refused.
  const double peak = attn::cpu::bf16_dot_peak_gflops(1);
  EXPECT_TRUE(std::isfinite(peak));
  if (attn::cpu::has_avx512_bf16()) {
    EXPECT_GT(peak, 0.0);
    std::printf("bf16 dot-product peak (AVX512-BF16): %.1f GFLOP/s\n", peak);
  } else {
    EXPECT_EQ(peak, 0.0);
    std::printf("no AVX512-BF16 on this CPU: the bf16 probe did not run\n");
  }
  try {
    attn::cpu::bf16_dot_peak_gflops(0);
    ADD_FAILURE() << "expected std::invalid_argument";
  } catch (const std::invalid_argument& e) {
    EXPECT_STREQ(e.what(), "bf16_dot_peak_gflops: repeats must be >= 1, got 0");
  }
}

TEST(FlashAttention, EverySimdTargetMatchesReference) {
  // The same kernels compiled for each instruction set this CPU runs (register
  // blocking and tile sizes differ: 16 lanes and 6-row blocks on AVX-512, 8 and
  // 3 on AVX2, 4 and 3 on SSE4, 1 and 3 on the scalar fallback).
  const auto targets = kn::flash_attention_targets();
  ASSERT_FALSE(targets.empty());
  EXPECT_EQ(targets.front(), std::string(kn::flash_attention_target()));
  EXPECT_FALSE(kn::flash_attention_use_target("NO_SUCH_TARGET"));
  uint32_t seed = 700;
  for (const std::string& target : targets) {
    ASSERT_TRUE(kn::flash_attention_use_target(target.c_str()));
    EXPECT_EQ(std::string(kn::flash_attention_target()), target);
    for (int64_t T : {1, 17, 70})
      for (int64_t hd : {16, 24, 64})
        for (bool causal : {true, false}) expect_close({2, T, 2, hd, causal}, seed++);
    expect_close({1, 50, 2, 64, true, 0.2f}, seed++);
    std::printf("target %s: ok\n", target.c_str());
  }
  ASSERT_TRUE(kn::flash_attention_use_target(nullptr));
  EXPECT_EQ(std::string(kn::flash_attention_target()), targets.front());
}

TEST(FlashAttention, Exp2OnEverySimdTargetKeepsItsPromises) {
  // The softmax's 2^x on each target (AVX-512's VREDUCEPS and VSCALEFPS, the
  // magic-number rounding elsewhere): x on a 1/512 grid over [-126, 0] and the
  // edges, against std::exp2 in double; 2^0 exactly 1.
  std::vector<float> x;
  for (float t = -126.0f; t <= 0.0f; t += 1.0f / 512) x.push_back(t);
  for (float t :
       {-125.5f, -125.0f, -124.999f, -0.5f, 0.5f, -1e-30f, -0.0f, 0.0f,
        std::nextafter(-125.0f, 0.0f), std::nextafter(-125.0f, -200.0f), -1e30f,
        -std::numeric_limits<float>::max(), -std::numeric_limits<float>::infinity(),
        std::numeric_limits<float>::quiet_NaN(), -std::numeric_limits<float>::quiet_NaN()})
    x.push_back(t);
  std::vector<float> y(x.size() + 1, -1.0f);  // y.back(): the sentinel past n
  for (const std::string& target : kn::flash_attention_targets()) {
    ASSERT_TRUE(kn::flash_attention_use_target(target.c_str()));
    kn::kernel_exp2(x.data(), y.data(), x.size());
    EXPECT_EQ(y.back(), -1.0f) << target << ": wrote past n";
    double worst = 0;
    for (size_t i = 0; i < x.size(); ++i) {
      const float xi = x[i], yi = y[i];
      if (std::isnan(xi) || xi < -125.0f) {
        EXPECT_EQ(std::bit_cast<uint32_t>(yi), 0u) << target << ": 2^" << xi << " = " << yi;
        continue;
      }
      EXPECT_TRUE(std::isnormal(yi)) << target << ": 2^" << xi << " = " << yi;
      if (xi == 0.0f) {  // 2^0 = 1 exactly: a row's largest weight, a settled rescale
        EXPECT_EQ(yi, 1.0f) << target;
      }
      const double want = std::exp2(double(xi));
      worst = std::max(worst, std::abs(double(yi) - want) / want);
    }
    EXPECT_LT(worst, 1.7e-7) << target;
    std::printf("target %s: 2^x within %.2e\n", target.c_str(), worst);
  }
  ASSERT_TRUE(kn::flash_attention_use_target(nullptr));
}

TEST(FlashAttention, TileEdgesMatchReference) {
  uint32_t seed = 1;
  for (int64_t T : {1, 15, 16, 17, 31, 33, 63, 64, 65, 127, 129})
    for (int64_t hd : {16, 64, 80})
      for (bool causal : {true, false}) expect_close({1, T, 2, hd, causal}, seed++);
}

TEST(FlashAttention, HeadDimsMatchReference) {
  uint32_t seed = 100;
  for (int64_t hd : {16, 32, 64, 80, 96, 128, 256})
    for (bool causal : {true, false}) expect_close({2, 70, 3, hd, causal}, seed++);
}

TEST(FlashAttention, OddHeadDimsUsePaddedPath) {
  uint32_t seed = 200;
  for (int64_t hd : {1, 2, 3, 7, 24, 33, 100, 255})
    for (bool causal : {true, false}) expect_close({1, 37, 2, hd, causal}, seed++);
}

TEST(FlashAttention, LongSequenceMatchesReference) {
  expect_close({1, 1000, 2, 64, true}, 300);
  expect_close({1, 1000, 1, 128, false}, 301);
}

TEST(FlashAttention, PeakedSoftmaxMatchesReference) {
  // Scores of magnitude ~30: the online max changes often and rescaling matters.
  Case c{2, 200, 2, 64, true};
  c.input_scale = 5.0f;
  expect_close(c, 400);
  c.causal = false;
  expect_close(c, 401);
}

TEST(FlashAttention, FusedQkvStridesMatchReference) {
  for (bool causal : {true, false}) {
    Case c{2, 77, 3, 64, causal};
    c.fused_qkv = true;
    expect_close(c, 500 + causal);
    c.hd = 24;  // padded path with strides
    expect_close(c, 510 + causal);
  }
}

TEST(FlashAttention, DropoutMatchesReferenceWithSameNoise) {
  uint32_t seed = 600;
  for (float p : {0.1f, 0.5f})
    for (bool causal : {true, false})
      for (int64_t T : {17, 130}) {
        Case c{2, T, 2, 64, causal, p};
        expect_close(c, seed++);
      }
  Case c{1, 45, 2, 24, true, 0.3f};
  c.fused_qkv = true;
  expect_close(c, seed++);
}

TEST(FlashAttention, MatchesTheLibraryReference) {
  // The third opinion: attn::ref::attention_forward/backward (Tensor API,
  // heads as a leading dim (B, H, T, hd)), fed the kernel's dropout noise.
  const int64_t B = 2, H = 3, T = 37, hd = 16;
  for (float dropout : {0.0f, 0.3f})
    for (bool causal : {true, false}) {
      FlashAttentionParams p;
      p.B = B, p.T = T, p.H = H, p.hd = hd, p.causal = causal;
      p.dropout_p = dropout, p.dropout_seed = 99;
      const size_t n = size_t(B * T * H * hd);
      const auto q = randn(n, 31), k = randn(n, 32), v = randn(n, 33), dout = randn(n, 34);
      std::vector<float> out(n), lse(size_t(B * H * T)), dq(n), dk(n), dv(n);
      kn::flash_attention_forward(out.data(), lse.data(), q.data(), k.data(), v.data(), p);
      kn::flash_attention_backward(dq.data(), dk.data(), dv.data(), dout.data(), q.data(), k.data(),
                                   v.data(), out.data(), lse.data(), p);
      // (B, T, H, hd) <-> (B, H, T, hd)
      auto to_bhtd = [&](const std::vector<float>& x) {
        attn::Tensor t({B, H, T, hd});
        for (int64_t b = 0; b < B; ++b)
          for (int64_t h = 0; h < H; ++h)
            for (int64_t i = 0; i < T; ++i)
              for (int64_t d = 0; d < hd; ++d)
                t.at({b, h, i, d}) = x[size_t(((b * T + i) * H + h) * hd + d)];
        return t;
      };
      attn::ref::AttentionOptions options;
      options.causal = causal;
      attn::Tensor noise;
      if (dropout > 0.0f) {
        noise = attn::Tensor({B, H, T, T});
        kn::flash_dropout_noise(noise.data(), p);
      }
      attn::ref::AttentionSaved saved;
      const attn::Tensor ref_out = attn::ref::attention_forward(
          to_bhtd(q), to_bhtd(k), to_bhtd(v), options, dropout > 0.0f ? &noise : nullptr, &saved);
      const attn::ref::AttentionGrads g = attn::ref::attention_backward(
          to_bhtd(dout), to_bhtd(q), to_bhtd(k), to_bhtd(v), saved, options);
      auto rel = [](const attn::Tensor& a, const attn::Tensor& r) {
        return attn::max_abs_diff(a, r) /
               std::max(attn::max_abs_diff(r, attn::Tensor(r.shape())), 1e-30f);
      };
      EXPECT_LE(rel(to_bhtd(out), ref_out), kRelTol) << causal << " " << dropout;
      EXPECT_LE(rel(to_bhtd(dq), g.dq), kRelTol) << causal << " " << dropout;
      EXPECT_LE(rel(to_bhtd(dk), g.dk), kRelTol) << causal << " " << dropout;
      EXPECT_LE(rel(to_bhtd(dv), g.dv), kRelTol) << causal << " " << dropout;
    }
}

TEST(FlashAttention, DropoutNoiseIsCounterBased) {
  FlashAttentionParams p;
  p.B = 2, p.T = 300, p.H = 3, p.hd = 16, p.dropout_p = 0.25f, p.dropout_seed = 42;
  const size_t n = size_t(p.B * p.H * p.T * p.T);
  std::vector<float> a(n), b(n), c(n);
  kn::flash_dropout_noise(a.data(), p);
  kn::flash_dropout_noise(b.data(), p);
  EXPECT_EQ(a, b);  // same seed, same mask
  const float keep = 1.0f / 0.75f;
  size_t kept = 0;
  for (float z : a) {
    ASSERT_TRUE(z == 0.0f || z == keep) << z;
    kept += z != 0.0f;
  }
  // 540000 Bernoulli(0.75) draws: the kept fraction is 0.75 ± 0.003 (5 sigma).
  EXPECT_NEAR(double(kept) / double(n), 0.75, 0.003);
  p.dropout_seed = 43;
  kn::flash_dropout_noise(c.data(), p);
  EXPECT_NE(a, c);
  // Heads and batches draw different masks.
  const size_t head = size_t(p.T * p.T);
  EXPECT_FALSE(std::equal(a.begin(), a.begin() + head, a.begin() + head));
  p.dropout_p = 0.0f;
  kn::flash_dropout_noise(c.data(), p);
  EXPECT_TRUE(std::all_of(c.begin(), c.end(), [](float z) { return z == 1.0f; }));
}

TEST(FlashAttention, PhiloxKnownAnswers) {
  // Random123's known-answer vectors for philox4x32_10.
  uint32_t out[4];
  const uint32_t zero[4] = {0, 0, 0, 0};
  kn::philox4x32(out, zero, 0);
  EXPECT_EQ(out[0], 0x6627e8d5u);
  EXPECT_EQ(out[1], 0xe169c58du);
  EXPECT_EQ(out[2], 0xbc57ac4cu);
  EXPECT_EQ(out[3], 0x9b00dbd8u);
  const uint32_t ones[4] = {0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu};
  kn::philox4x32(out, ones, 0xffffffffffffffffull);
  EXPECT_EQ(out[0], 0x408f276du);
  EXPECT_EQ(out[1], 0x41c83b0eu);
  EXPECT_EQ(out[2], 0xa20bc7c6u);
  EXPECT_EQ(out[3], 0x6d5451fdu);
  const uint32_t pi[4] = {0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u};
  kn::philox4x32(out, pi, 0x299f31d0a4093822ull);  // key words (0xa4093822, 0x299f31d0)
  EXPECT_EQ(out[0], 0xd16cfe09u);
  EXPECT_EQ(out[1], 0x94fdccebu);
  EXPECT_EQ(out[2], 0x5001e420u);
  EXPECT_EQ(out[3], 0x24126ea1u);
}

#ifdef _OPENMP
TEST(FlashAttention, SameBitsForAnyThreadCount) {
  // B·H = 6 runs backward one head per thread for 1..3 threads; B·H = 2 runs
  // it whole-head on 1 thread and split into key-tile and query-tile tasks on
  // 2 and 3: the bits must not change either way.
  struct Shape {
    int64_t B, H, T, hd;
  };
  for (const Shape& shape : {Shape{2, 3, 333, 64}, Shape{1, 2, 333, 64}, Shape{1, 2, 100, 24}})
    for (float dropout : {0.0f, 0.2f})
      for (bool causal : {true, false}) {
        FlashAttentionParams p;
        p.B = shape.B, p.T = shape.T, p.H = shape.H, p.hd = shape.hd, p.causal = causal;
        p.dropout_p = dropout, p.dropout_seed = 7;
        const size_t n = size_t(p.B * p.T * p.H * p.hd);
        const auto q = randn(n, 1), k = randn(n, 2), v = randn(n, 3), dout = randn(n, 4);
        std::vector<std::vector<float>> results;
        const int saved = omp_get_max_threads();
        for (int threads : {1, 2, 3}) {
          omp_set_num_threads(threads);
          std::vector<float> out(n), lse(size_t(p.B * p.H * p.T)), dq(n), dk(n), dv(n);
          kn::flash_attention_forward(out.data(), lse.data(), q.data(), k.data(), v.data(), p);
          kn::flash_attention_backward(dq.data(), dk.data(), dv.data(), dout.data(), q.data(),
                                       k.data(), v.data(), out.data(), lse.data(), p);
          std::vector<float> all;
          for (const auto* part : {&out, &lse, &dq, &dk, &dv})
            all.insert(all.end(), part->begin(), part->end());
          results.push_back(std::move(all));
        }
        omp_set_num_threads(saved);
        for (size_t r = 1; r < results.size(); ++r)
          EXPECT_TRUE(attn::test::same_bits(results[0], results[r]))
              << "threads differ: B=" << p.B << " H=" << p.H << " hd=" << p.hd
              << " causal=" << causal << " p=" << dropout << " (1 vs " << r + 1 << " threads)";
      }
}
#endif

TEST(FlashAttention, CausalNeverReadsFutureKeys) {
  // Keys and values of tokens >= t0 are NaN. Rows before t0 (t0 a multiple of
  // every tile size, 64) must come out bit-identical to the clean run, in the
  // output and in dq; the kernel must not have touched the poisoned rows for them.
  FlashAttentionParams p;
  p.B = 1, p.T = 200, p.H = 2, p.hd = 64, p.causal = true;
  const int64_t t0 = 128, w = p.H * p.hd;
  const size_t n = size_t(p.T * w);
  const auto q = randn(n, 11), k = randn(n, 12), v = randn(n, 13), dout = randn(n, 14);
  auto k_bad = k, v_bad = v, dout_bad = dout;
  for (size_t x = size_t(t0 * w); x < n; ++x)
    k_bad[x] = v_bad[x] = dout_bad[x] = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> out(n), out_bad(n), lse(size_t(p.H * p.T)), lse_bad(lse.size());
  kn::flash_attention_forward(out.data(), lse.data(), q.data(), k.data(), v.data(), p);
  kn::flash_attention_forward(out_bad.data(), lse_bad.data(), q.data(), k_bad.data(), v_bad.data(),
                              p);
  const size_t clean = size_t(t0 * w);
  EXPECT_TRUE(attn::test::same_bytes(out.data(), out_bad.data(), clean * sizeof(float)));
  std::vector<float> dq(n), dk(n), dv(n), dq_bad(n), dk_bad(n), dv_bad(n);
  kn::flash_attention_backward(dq.data(), dk.data(), dv.data(), dout.data(), q.data(), k.data(),
                               v.data(), out.data(), lse.data(), p);
  kn::flash_attention_backward(dq_bad.data(), dk_bad.data(), dv_bad.data(), dout_bad.data(),
                               q.data(), k_bad.data(), v_bad.data(), out_bad.data(), lse_bad.data(),
                               p);
  EXPECT_TRUE(attn::test::same_bytes(dq.data(), dq_bad.data(), clean * sizeof(float)));
  for (size_t x = 0; x < clean; ++x)
    ASSERT_TRUE(std::isfinite(out_bad[x]) && std::isfinite(dq_bad[x]));
}

TEST(FlashAttention, CausalRowsIgnoreLaterTokens) {
  // Changing tokens >= t0 (any t0) leaves rows < t0 of the output unchanged up to rounding.
  FlashAttentionParams p;
  p.B = 1, p.T = 90, p.H = 1, p.hd = 32, p.causal = true;
  const int64_t t0 = 41;
  const size_t n = size_t(p.T * p.hd);
  const auto q = randn(n, 21), k = randn(n, 22), v = randn(n, 23);
  auto k2 = k, v2 = v;
  for (size_t x = size_t(t0 * p.hd); x < n; ++x) k2[x] += 3.0f, v2[x] -= 2.0f;
  std::vector<float> out(n), out2(n), lse(size_t(p.T)), lse2(lse.size());
  kn::flash_attention_forward(out.data(), lse.data(), q.data(), k.data(), v.data(), p);
  kn::flash_attention_forward(out2.data(), lse2.data(), q.data(), k2.data(), v2.data(), p);
  for (size_t x = 0; x < size_t(t0 * p.hd); ++x) ASSERT_FLOAT_EQ(out[x], out2[x]) << x;
  bool later_changed = false;
  for (size_t x = size_t(t0 * p.hd); x < n; ++x) later_changed |= out[x] != out2[x];
  EXPECT_TRUE(later_changed);
}

TEST(FlashAttention, LargestErrorsAreWithinTheDocumentedBound) {
  // Its own fixed set of cases (not the other tests' leftovers, so the order the
  // tests run in does not matter): one of each kind the tests above cover. The
  // largest error of each quantity must meet the bound in the header, and must not
  // be exactly zero: float32 against the fp64 reference always differs somewhere,
  // so a zero would mean the comparison saw one buffer twice.
  const std::vector<Case> cases = attn::test::flash_largest_error_cases();
  Errors worst{};
  uint32_t seed = 900;
  for (const Case& c : cases) {
    const Errors e = expect_close(c, seed++);
    worst = {std::max(worst.out, e.out), std::max(worst.lse, e.lse), std::max(worst.dq, e.dq),
             std::max(worst.dk, e.dk), std::max(worst.dv, e.dv)};
  }
  std::printf("largest relative errors vs reference: out %.2e lse %.2e dq %.2e dk %.2e dv %.2e\n",
              worst.out, worst.lse, worst.dq, worst.dk, worst.dv);
  for (const auto& [what, err] :
       {std::pair{"out", worst.out}, std::pair{"lse", worst.lse}, std::pair{"dq", worst.dq},
        std::pair{"dk", worst.dk}, std::pair{"dv", worst.dv}}) {
    EXPECT_LE(err, kRelTol) << what;
    EXPECT_GT(err, 0.0) << what << ": no difference at all from the fp64 reference";
  }
}

void expect_invalid(const FlashAttentionParams& p, const std::string& message) {
  std::vector<float> buf(1 << 16);
  try {
    kn::flash_attention_forward(buf.data(), buf.data(), buf.data(), buf.data(), buf.data(), p);
    FAIL() << "expected std::invalid_argument: " << message;
  } catch (const std::invalid_argument& e) {
    EXPECT_EQ(std::string(e.what()), message);
  }
}

TEST(FlashAttention, ErrorsNameTheValues) {
  FlashAttentionParams p;
  p.T = 4, p.H = 2, p.hd = 8;
  auto with = [&](auto change) {
    FlashAttentionParams c = p;
    change(c);
    return c;
  };
  expect_invalid(with([](auto& c) { c.T = 0; }), "flash_attention: T (0) must be >= 1");
  expect_invalid(with([](auto& c) { c.B = -1; }), "flash_attention: B (-1) must be >= 1");
  expect_invalid(with([](auto& c) { c.H = 0; }), "flash_attention: H (0) must be >= 1");
  expect_invalid(with([](auto& c) { c.hd = 257; }),
                 "flash_attention: head_dim (257) must be in [1, 256]");
  expect_invalid(with([](auto& c) { c.dropout_p = 1.0f; }),
                 "flash_attention: dropout_p (1.000000) must be in [0, 1)");
  expect_invalid(with([](auto& c) { c.dropout_p = -0.5f; }),
                 "flash_attention: dropout_p (-0.500000) must be in [0, 1)");
  expect_invalid(with([](auto& c) { c.k_stride = 15; }),
                 "flash_attention: k_stride (15) must be >= H * head_dim (2 * 8 = 16)");
  expect_invalid(with([](auto& c) { c.scale = std::numeric_limits<float>::infinity(); }),
                 "flash_attention: scale (inf) must be finite");
  std::vector<float> buf(1024);
  FlashAttentionParams bad = with([](auto& c) { c.o_stride = 3; });
  EXPECT_THROW(
      kn::flash_attention_backward(buf.data(), buf.data(), buf.data(), buf.data(), buf.data(),
                                   buf.data(), buf.data(), buf.data(), buf.data(), bad),
      std::invalid_argument);
  EXPECT_THROW(kn::flash_dropout_noise(buf.data(), bad), std::invalid_argument);
}

}  // namespace
