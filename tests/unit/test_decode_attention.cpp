// Flash-decoding (attn/decode_attention.h): the kernel against the plain
// reference ref::decode_attention_forward on every SIMD target this CPU runs,
// fp32 and bf16 caches, on configurations across Tq = 1 .. 16, cache lengths
// around the chunk size (1, chunk - 1, chunk, chunk + 1, several chunks),
// GQA ratios 1, 2, 4, 8 and Hkv = 1, sliding windows and padded strides; the
// reference against the batched SDPA reference (ref::sdpa_forward, is_causal
// with bottom-right alignment and window_left) on the same buffers read in
// place; cache rows no query may see (beyond length, before the window) are
// never read (they hold NaN); the bits do not depend on the thread count;
// every bad input throws naming its values.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "attn/decode_attention.h"
#include "attn/kernels.h"
#include "attn/random.h"
#include "attn/sdpa.h"
#include "attn/tensor.h"

namespace attn::test {
namespace {

namespace kn = attn::kernels;

std::vector<float> uniform(int64_t n, Generator& gen, float amplitude = 1.0f) {
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = amplitude * static_cast<float>(gen.uniform_double() * 2.0 - 1.0);
  return v;
}

std::vector<BFloat16> rounded(const std::vector<float>& v) {
  std::vector<BFloat16> out;
  for (float x : v) out.push_back(to_bfloat16(x));
  return out;
}

// Random q, keys, values for p (q and out with p's strides, the cache with
// p.capacity rows per head). With poison, the rows no query may see hold NaN,
// so reading one shows in the output.
struct Buffers {
  std::vector<float> q, k, v;
  Buffers(const DecodeProblem& p, Generator& gen, bool poison = true) {
    const DecodeProblem r = validated(p);
    q = uniform(r.B * r.q_batch_stride, gen, 3.0f);  // peaked softmax weights too
    const int64_t n = r.B * r.Hkv * r.capacity * r.D;
    k = uniform(n, gen), v = uniform(n, gen);
    if (!poison) return;
    const int64_t first = r.length - r.Tq;
    const int64_t lo = r.window_left < 0 ? 0 : std::max<int64_t>(0, first - r.window_left);
    for (int64_t bg = 0; bg < r.B * r.Hkv; ++bg) {
      for (int64_t j = 0; j < r.capacity; ++j) {
        if (j >= lo && j < r.length) continue;
        for (int64_t i = 0; i < r.D; ++i) {
          k[size_t((bg * r.capacity + j) * r.D + i)] = std::numeric_limits<float>::quiet_NaN();
          v[size_t((bg * r.capacity + j) * r.D + i)] = std::numeric_limits<float>::quiet_NaN();
        }
      }
    }
  }
};

int64_t out_size(const DecodeProblem& p) {
  const DecodeProblem r = validated(p);
  return r.B * r.o_batch_stride;
}

// The configurations: (Hq, Hkv) ratios 1, 2, 4, 8 and Hkv = 1; lengths around
// kDecodeChunk; Tq 1 .. 16; windows none, 0, small, about a chunk.
std::vector<DecodeProblem> configs() {
  const int64_t C = kDecodeChunk;
  std::vector<DecodeProblem> ps;
  const std::vector<std::pair<int64_t, int64_t>> heads = {{3, 3}, {4, 2}, {8, 2}, {8, 1}, {1, 1}};
  const std::vector<int64_t> lengths = {1, 2, C - 1, C, C + 1, 3 * C + 17};
  const std::vector<int64_t> tqs = {1, 2, 5, 16};
  const std::vector<int64_t> windows = {-1, 0, 3, C + 5};
  const std::vector<int64_t> dims = {1, 7, 16, 64, 72};
  size_t n = 0;
  for (const auto& [Hq, Hkv] : heads) {
    for (int64_t length : lengths) {
      for (int64_t Tq : tqs) {
        if (Tq > length) continue;
        const int64_t w = windows[n % windows.size()];
        const int64_t D = dims[n % dims.size()];
        const int64_t B = 1 + int64_t(n % 2);
        DecodeProblem p{.B = B,
                        .Hq = Hq,
                        .Hkv = Hkv,
                        .Tq = Tq,
                        .length = length,
                        .capacity = length + int64_t(n % 3) * 5,
                        .D = D,
                        .scale = 1.0f / std::sqrt(float(D)),
                        .window_left = w};
        if (n % 4 == 1) p.q_stride = 3 * Hq * D, p.o_stride = Hq * D + 5;  // a fused qkv buffer
        if (n % 4 == 3) {  // a block of a longer run of new tokens
          p.q_batch_stride = (Tq + 2) * Hq * D + 1;
          p.o_batch_stride = (Tq + 1) * Hq * D + 3;
        }
        ps.push_back(p);
        ++n;
      }
    }
  }
  // Ratio 8 at GPT-2 sizes with a long cache.
  ps.push_back({.B = 1,
                .Hq = 16,
                .Hkv = 2,
                .Tq = 4,
                .length = 1500,
                .capacity = 2048,
                .D = 64,
                .scale = 0.125f,
                .window_left = 700});
  ps.push_back({.B = 1,
                .Hq = 12,
                .Hkv = 12,
                .Tq = 1,
                .length = 4000,
                .capacity = 4096,
                .D = 64,
                .scale = 0.125f});
  return ps;
}

std::string describe(const DecodeProblem& p) {
  return "B " + std::to_string(p.B) + " Hq " + std::to_string(p.Hq) + " Hkv " +
         std::to_string(p.Hkv) + " Tq " + std::to_string(p.Tq) + " length " +
         std::to_string(p.length) + " capacity " + std::to_string(p.capacity) + " D " +
         std::to_string(p.D) + " window_left " + std::to_string(p.window_left) + " q_stride " +
         std::to_string(p.q_stride) + " o_stride " + std::to_string(p.o_stride) +
         " q_batch_stride " + std::to_string(p.q_batch_stride) + " o_batch_stride " +
         std::to_string(p.o_batch_stride);
}

// Compares the written part of two outputs; padding columns must stay as they were.
template <class Near>
void expect_rows(const DecodeProblem& p_in, const Near& near) {
  const DecodeProblem p = validated(p_in);
  for (int64_t b = 0; b < p.B; ++b) {
    for (int64_t i = 0; i < p.o_batch_stride; ++i) {
      const int64_t t = i / p.o_stride, c = i % p.o_stride;
      near(b * p.o_batch_stride + i, t < p.Tq && c < p.Hq * p.D);
    }
  }
}

TEST(DecodeAttention, KernelMatchesReferenceOnEveryTargetFp32) {
  Generator gen(20);
  const std::vector<DecodeProblem> ps = configs();
  float worst = 0.0f;
  for (const std::string& target : kn::flash_attention_targets()) {
    ASSERT_TRUE(kn::flash_attention_use_target(target.c_str()));
    for (const DecodeProblem& p : ps) {
      SCOPED_TRACE(target + " " + describe(p));
      const Buffers in(p, gen);
      std::vector<float> ref(size_t(out_size(p)), 7.0f), out(ref.size(), 7.0f);
      ref::decode_attention_forward(ref.data(), in.q.data(), in.k.data(), in.v.data(), p);
      kn::decode_attention_forward(out.data(), in.q.data(), in.k.data(), in.v.data(), p);
      expect_rows(p, [&](int64_t i, bool written) {
        const size_t at = size_t(i);
        if (!written) {
          ASSERT_EQ(out[at], 7.0f) << "padding at " << i;
          return;
        }
        ASSERT_TRUE(std::isfinite(ref[at])) << i;
        // Convex combinations of values in [-1, 1], summed in another order.
        ASSERT_NEAR(out[at], ref[at], 1.5e-6f) << i;
        worst = std::max(worst, std::abs(out[at] - ref[at]));
      });
    }
  }
  ASSERT_TRUE(kn::flash_attention_use_target(nullptr));
  std::printf("[  DECODE  ] %zu configs x %zu targets, fp32: max |kernel - reference| = %.3g\n",
              ps.size(), kn::flash_attention_targets().size(), double(worst));
}

TEST(DecodeAttention, KernelMatchesReferenceOnEveryTargetBf16) {
  Generator gen(21);
  const std::vector<DecodeProblem> ps = configs();
  int64_t differ = 0, total = 0;  // outputs that round to a neighbouring bf16
  for (const std::string& target : kn::flash_attention_targets()) {
    ASSERT_TRUE(kn::flash_attention_use_target(target.c_str()));
    for (const DecodeProblem& p : ps) {
      SCOPED_TRACE(target + " " + describe(p));
      const Buffers in(p, gen);
      const std::vector<BFloat16> q = rounded(in.q), k = rounded(in.k), v = rounded(in.v);
      std::vector<BFloat16> ref(size_t(out_size(p)), to_bfloat16(7.0f)), out = ref;
      ref::decode_attention_forward_bf16(ref.data(), q.data(), k.data(), v.data(), p);
      kn::decode_attention_forward_bf16(out.data(), q.data(), k.data(), v.data(), p);
      expect_rows(p, [&](int64_t i, bool written) {
        const float o = to_float(out[size_t(i)]), r = to_float(ref[size_t(i)]);
        if (!written) {
          ASSERT_EQ(o, 7.0f) << "padding at " << i;
          return;
        }
        ASSERT_TRUE(std::isfinite(r)) << i;
        // Two fp32 values a few ulps apart round to the same bf16 or to
        // neighbours: one bf16 ulp (2^-7 relative) at most.
        ASSERT_NEAR(o, r, std::abs(r) * 0x1p-7f + 1e-6f) << i;
        differ += o != r;
        ++total;
      });
    }
  }
  ASSERT_TRUE(kn::flash_attention_use_target(nullptr));
  std::printf("[  DECODE  ] bf16: %lld of %lld outputs differ from the reference (by one ulp)\n",
              static_cast<long long>(differ), static_cast<long long>(total));
}

// The reference is attn::sdpa's maths: is_causal with bottom-right alignment
// and window_left, grouped-query heads, on the cache's first `length` rows,
// q and out read and written in place through strides.
TEST(DecodeAttention, ReferenceMatchesSdpaBottomRight) {
  Generator gen(22);
  float worst = 0.0f;
  for (const DecodeProblem& p_in : configs()) {
    const DecodeProblem p = validated(p_in);
    SCOPED_TRACE(describe(p));
    const Buffers in(p, gen, /*poison=*/false);  // sdpa may read masked rows (times 0)
    std::vector<float> ref(size_t(out_size(p)), 0.0f), sdpa(ref.size(), 0.0f);
    ref::decode_attention_forward(ref.data(), in.q.data(), in.k.data(), in.v.data(), p);
    SdpaProblem s;
    s.B = p.B, s.Hq = p.Hq, s.Hkv = p.Hkv, s.Tq = p.Tq, s.Tk = p.length, s.D = p.D, s.Dv = p.D;
    s.q = in.q.data(), s.k = in.k.data(), s.v = in.v.data();
    s.q_strides = {.b = p.q_batch_stride, .h = p.D, .t = p.q_stride, .d = 1};
    s.k_strides = {.b = p.Hkv * p.capacity * p.D, .h = p.capacity * p.D, .t = p.D, .d = 1};
    s.v_strides = s.k_strides;
    s.is_causal = true;
    s.causal_alignment = CausalAlignment::kBottomRight;
    s.scale = p.scale;
    s.window_left = p.window_left;
    std::vector<float> lse(size_t(p.B * p.Hq * p.Tq));
    SdpaOutput o;
    o.out = sdpa.data();
    o.out_strides = {.b = p.o_batch_stride, .h = p.D, .t = p.o_stride, .d = 1};
    o.lse = lse.data();
    ref::sdpa_forward(o, s);
    expect_rows(p, [&](int64_t i, bool written) {
      if (written) {
        ASSERT_NEAR(ref[size_t(i)], sdpa[size_t(i)], 1.5e-6f) << i;
        worst = std::max(worst, std::abs(ref[size_t(i)] - sdpa[size_t(i)]));
      }
    });
  }
  std::printf("[  DECODE  ] %zu configs: max |reference - ref::sdpa_forward| = %.3g\n",
              configs().size(), double(worst));
}

TEST(DecodeAttention, BitsDoNotDependOnThreads) {
  Generator gen(23);
  const DecodeProblem p{.B = 2,
                        .Hq = 8,
                        .Hkv = 2,
                        .Tq = 3,
                        .length = 5 * kDecodeChunk + 9,
                        .capacity = 6 * kDecodeChunk,
                        .D = 64,
                        .scale = 0.125f,
                        .window_left = 3 * kDecodeChunk + 2};
  const Buffers in(p, gen);
  const std::vector<BFloat16> q = rounded(in.q), k = rounded(in.k), v = rounded(in.v);
  std::vector<std::vector<float>> outs;
  std::vector<std::vector<uint16_t>> outs_bf16;
  for (int threads : {1, 2, 3}) {
    omp_set_num_threads(threads);
    std::vector<float> out(size_t(out_size(p)));
    std::vector<BFloat16> ob(out.size());
    kn::decode_attention_forward(out.data(), in.q.data(), in.k.data(), in.v.data(), p);
    kn::decode_attention_forward_bf16(ob.data(), q.data(), k.data(), v.data(), p);
    outs.push_back(out);
    std::vector<uint16_t> bits;
    for (BFloat16 x : ob) bits.push_back(x.bits);
    outs_bf16.push_back(bits);
  }
  omp_set_num_threads(omp_get_num_procs());
  EXPECT_EQ(outs[0], outs[1]);
  EXPECT_EQ(outs[0], outs[2]);
  EXPECT_EQ(outs_bf16[0], outs_bf16[1]);
  EXPECT_EQ(outs_bf16[0], outs_bf16[2]);
}

TEST(DecodeAttention, KvBytesCountTheVisibleRows) {
  const DecodeProblem p{.B = 2,
                        .Hq = 8,
                        .Hkv = 2,
                        .Tq = 4,
                        .length = 1000,
                        .capacity = 1024,
                        .D = 64,
                        .scale = 0.125f};
  EXPECT_EQ(kn::decode_attention_kv_bytes(p, 4), int64_t{2} * 2 * 1000 * 64 * 2 * 4);
  DecodeProblem w = p;
  w.window_left = 100;  // the first query (position 996) sees 896 .. 996; the last up to 999
  EXPECT_EQ(kn::decode_attention_kv_bytes(w, 2), int64_t{2} * 2 * 104 * 64 * 2 * 2);
}

void expect_invalid(const DecodeProblem& p, const std::string& fragment) {
  std::vector<float> buf(1 << 16);
  try {
    kn::decode_attention_forward(buf.data(), buf.data(), buf.data(), buf.data(), p);
    FAIL() << "no exception for " << describe(p);
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
  }
  EXPECT_THROW(ref::decode_attention_forward(buf.data(), buf.data(), buf.data(), buf.data(), p),
               std::invalid_argument);
}

TEST(DecodeAttention, BadInputThrowsNamingTheValues) {
  const DecodeProblem ok{
      .B = 1, .Hq = 4, .Hkv = 2, .Tq = 2, .length = 10, .capacity = 16, .D = 8, .scale = 0.5f};
  DecodeProblem p = ok;
  p.B = 0;
  expect_invalid(p, "B = 0");
  p = ok, p.D = 0;
  expect_invalid(p, "D = 0");
  p = ok, p.Hkv = 3;
  expect_invalid(p, "Hq a multiple of Hkv; got B = 1, Hq = 4, Hkv = 3");
  p = ok, p.Tq = 0;
  expect_invalid(p, "Tq = 0");
  p = ok, p.Tq = kMaxDecodeQueries + 1, p.length = 40, p.capacity = 40;
  expect_invalid(p, "need 1 <= Tq <= 16");
  p = ok, p.Tq = 11;
  expect_invalid(p, "Tq <= length <= capacity; got B = 1, Hq = 4, Hkv = 2, Tq = 11, length = 10");
  p = ok, p.length = 17;
  expect_invalid(p, "length = 17, capacity = 16");
  p = ok, p.window_left = -2;
  expect_invalid(p, "window_left = -2");
  p = ok, p.q_stride = 31;
  expect_invalid(p, "q_stride = 31");
  p = ok, p.o_stride = 5;
  expect_invalid(p, "o_stride = 5");
  p = ok, p.q_batch_stride = 63;
  expect_invalid(p, "q_batch_stride = 63");
  p = ok, p.o_batch_stride = 1;
  expect_invalid(p, "o_batch_stride = 1");
  p = ok, p.scale = std::numeric_limits<float>::infinity();
  expect_invalid(p, "scale = inf");
}

}  // namespace
}  // namespace attn::test
