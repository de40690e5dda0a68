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

// ref::sdpa_forward on a dense decode problem's own buffers, read in place
// (is_causal with bottom-right alignment, the window, softcap, ALiBi, GQA, Dv):
// the independent check of the decode reference. p validated.
void sdpa_on_decode_buffers(float* out, const float* q, const float* k, const float* v,
                            const DecodeProblem& p) {
  SdpaProblem s;
  s.B = p.B, s.Hq = p.Hq, s.Hkv = p.Hkv, s.Tq = p.Tq, s.Tk = p.length, s.D = p.D, s.Dv = p.Dv;
  s.q = q, s.k = k, s.v = v;
  s.q_strides = {.b = p.q_batch_stride, .h = p.D, .t = p.q_stride, .d = 1};
  s.k_strides = {.b = p.k_strides.batch, .h = p.k_strides.head, .t = p.k_strides.row, .d = 1};
  s.v_strides = {.b = p.v_strides.batch, .h = p.v_strides.head, .t = p.v_strides.row, .d = 1};
  s.is_causal = true;
  s.causal_alignment = CausalAlignment::kBottomRight;
  s.scale = p.scale;
  s.window_left = p.window_left;
  s.softcap = p.softcap;
  s.alibi_slopes = p.alibi_slopes;
  std::vector<float> lse(size_t(p.B * p.Hq * p.Tq));
  SdpaOutput o;
  o.out = out;
  o.out_strides = {.b = p.o_batch_stride, .h = p.Dv, .t = p.o_stride, .d = 1};
  o.lse = lse.data();
  ref::sdpa_forward(o, s);
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
    sdpa_on_decode_buffers(sdpa.data(), in.q.data(), in.k.data(), in.v.data(), p);
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
  p = ok, p.softcap = -1.0f;
  expect_invalid(p, "softcap = -1");
  p = ok, p.Dv = -3;
  expect_invalid(p, "Dv = -3");
  const std::vector<int64_t> cu = {0, 2, 2};  // the second sequence without queries
  p = ok, p.B = 2, p.cu_seqlens_q = cu.data();
  expect_invalid(p, "cu_seqlens_q[1] = 2 then 2");
  const std::vector<int64_t> lens = {10, 1}, cu2 = {0, 1, 3};
  p = ok, p.B = 2, p.cu_seqlens_q = cu2.data(), p.cache_seqlens = lens.data();
  expect_invalid(p, "sequence 1 has 2 queries and 1 keys");
  const std::vector<int32_t> table = {0, 5};
  p = ok, p.block_table = table.data(), p.block_table_stride = 2, p.page_block_size = 8,
  p.num_pages = 4;
  expect_invalid(p, "sequence 0 page 1 is 5");
  p.num_pages = 0;
  expect_invalid(p, "num_pages >= 1");
  p = ok, p.k_strides.row = 4;  // rows of 8 elements 4 apart
  expect_invalid(p, "key strides that keep rows and heads apart, got row 4");
  p = ok, p.B = 2, p.v_strides.batch = 8;
  expect_invalid(p, "value strides that keep rows and heads apart");
  const std::vector<float> slopes = {0.5f, 0.25f, std::numeric_limits<float>::quiet_NaN(), 1.0f};
  p = ok, p.alibi_slopes = slopes.data();
  expect_invalid(p, "slope 2 is nan");
  p = ok, p.Tq = 11;
  expect_invalid(
      p, "sequence 0 has 11 queries and 10 keys; got B = 1, Hq = 4, Hkv = 2, Tq = 11, length = 10");
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

// ---- score modifiers, Dv, long runs of queries, sequences of their own
// lengths and paged caches ---------------------------------------------------------------------

// A case owns what its problem points at (lengths, block table, slopes) and
// its buffers: q and out with the problem's strides, the cache as a pool
// whose rows no query may see hold NaN.
struct GeneralCase {
  std::string name;
  DecodeProblem p;
  std::vector<int64_t> cu = {}, lens = {};
  std::vector<int32_t> table = {};
  std::vector<float> slopes = {}, q = {}, k = {}, v = {};
  int64_t q_elems = 0, o_elems = 0;

  DecodeProblem problem() const {
    DecodeProblem r = p;
    if (!cu.empty()) r.cu_seqlens_q = cu.data();
    if (!lens.empty()) r.cache_seqlens = lens.data();
    if (!table.empty()) r.block_table = table.data();
    if (!slopes.empty()) r.alibi_slopes = slopes.data();
    return validated(r);
  }
};

// Fills the case's buffers for its problem (sizes from the validated strides).
void fill(GeneralCase& c, Generator& gen) {
  const DecodeProblem p = c.problem();
  int64_t rows = 0;  // query rows of q and out
  for (int64_t b = 0; b < p.B; ++b)
    rows = std::max(rows, decode_o_offset(p, b, decode_queries(p, b) - 1) / p.o_stride + 1);
  c.q_elems = rows * p.q_stride + p.q_batch_stride * (p.cu_seqlens_q ? 0 : p.B);
  c.o_elems = rows * p.o_stride + p.o_batch_stride * (p.cu_seqlens_q ? 0 : p.B);
  c.q = uniform(c.q_elems, gen, 3.0f);
  // The cache's extent: the furthest element any row of any sequence reaches.
  const auto extent = [&](const DecodeCacheStrides& st, int64_t width) {
    if (p.block_table != nullptr) return p.num_pages * st.block;
    return (p.B - 1) * st.batch + (p.Hkv - 1) * st.head + (p.capacity - 1) * st.row + width;
  };
  c.k.assign(size_t(extent(p.k_strides, p.D)), std::numeric_limits<float>::quiet_NaN());
  c.v.assign(size_t(extent(p.v_strides, p.Dv)), std::numeric_limits<float>::quiet_NaN());
  for (int64_t b = 0; b < p.B; ++b) {
    const int64_t Tq = decode_queries(p, b), L = decode_keys(p, b);
    const int64_t lo = p.window_left < 0 ? 0 : std::max<int64_t>(0, L - Tq - p.window_left);
    for (int64_t g = 0; g < p.Hkv; ++g) {
      for (int64_t j = lo; j < L; ++j) {
        float* kr = c.k.data() + decode_cache_offset(p, p.k_strides, b, g, j);
        float* vr = c.v.data() + decode_cache_offset(p, p.v_strides, b, g, j);
        for (int64_t i = 0; i < p.D; ++i) kr[i] = float(gen.uniform_double() * 2.0 - 1.0);
        for (int64_t i = 0; i < p.Dv; ++i) vr[i] = float(gen.uniform_double() * 2.0 - 1.0);
      }
    }
  }
}

std::vector<GeneralCase> general_cases(Generator& gen) {
  std::vector<GeneralCase> cs;
  const auto add = [&](GeneralCase c) {
    fill(c, gen);
    cs.push_back(std::move(c));
  };
  const DecodeProblem base{
      .B = 2, .Hq = 8, .Hkv = 2, .Tq = 3, .length = 600, .capacity = 640, .D = 64, .scale = 0.125f};
  {
    GeneralCase c{.name = "softcap 5", .p = base};
    c.p.softcap = 5.0f;
    add(c);
  }
  {
    GeneralCase c{.name = "ALiBi, window 100", .p = base};
    c.p.Hq = 4, c.p.Hkv = 4, c.p.Tq = 2, c.p.length = 300, c.p.window_left = 100;
    for (int h = 0; h < 4; ++h) c.slopes.push_back(std::ldexp(1.0f, -(h + 1)));
    add(c);
  }
  {
    GeneralCase c{.name = "Dv 72 != D 40", .p = base};
    c.p.Hq = 6, c.p.Hkv = 3, c.p.Tq = 5, c.p.length = 520, c.p.D = 40, c.p.Dv = 72;
    add(c);
  }
  {
    GeneralCase c{.name = "37 queries, window 200, softcap 30, MQA", .p = base};
    c.p.B = 1, c.p.Hq = 4, c.p.Hkv = 1, c.p.Tq = 37, c.p.length = 700, c.p.capacity = 700,
    c.p.window_left = 200, c.p.softcap = 30.0f;
    add(c);
  }
  {
    GeneralCase c{.name = "sequences of their own lengths", .p = base};
    c.p.B = 4, c.p.capacity = 600, c.p.D = 80;
    c.cu = {0, 1, 6, 26, 27};
    c.lens = {1, 300, 530, 257};
    add(c);
  }
  {
    GeneralCase c{.name = "paged, 16-row pages, shuffled", .p = base};
    c.p.B = 3, c.p.page_block_size = 16, c.p.num_pages = 64, c.p.block_table_stride = 40;
    c.cu = {0, 1, 8, 9};
    c.lens = {40, 100, 513};
    std::vector<int32_t> pages(64);
    for (int32_t i = 0; i < 64; ++i) pages[size_t(i)] = (i * 37 + 11) % 64;  // a permutation
    size_t next = 0;
    c.table.assign(size_t(3 * 40), -1);  // unused entries hold an invalid id: never read
    for (int64_t b = 0; b < 3; ++b) {
      for (int64_t i = 0; i < (c.lens[size_t(b)] + 15) / 16; ++i)
        c.table[size_t(b * 40 + i)] = pages[next++];
    }
    add(c);
  }
  {
    GeneralCase c{.name = "paged head-major pages, GQA, window, softcap, ALiBi, Dv", .p = base};
    c.p.B = 2, c.p.Hq = 6, c.p.Hkv = 2, c.p.D = 24, c.p.Dv = 16, c.p.page_block_size = 7,
    c.p.num_pages = 90, c.p.block_table_stride = 45, c.p.window_left = 150, c.p.softcap = 10.0f;
    c.p.k_strides = {.row = 24, .head = 7 * 24, .block = 2 * 7 * 24};  // (pages, Hkv, 7, D)
    c.p.v_strides = {.row = 16, .head = 7 * 16, .block = 2 * 7 * 16};
    c.cu = {0, 20, 21};
    c.lens = {311, 17};
    for (int h = 0; h < 6; ++h) c.slopes.push_back(0.05f * float(h + 1));
    for (int32_t i = 0; i < 45; ++i) c.table.push_back(89 - i);
    for (int32_t i = 0; i < 45; ++i) c.table.push_back(i);
    add(c);
  }
  return cs;
}

// The rows a general case writes: (offset of out row, count of elements).
std::vector<std::pair<int64_t, int64_t>> written_rows(const DecodeProblem& p) {
  std::vector<std::pair<int64_t, int64_t>> rows;
  for (int64_t b = 0; b < p.B; ++b) {
    for (int64_t t = 0; t < decode_queries(p, b); ++t)
      rows.emplace_back(decode_o_offset(p, b, t), p.Hq * p.Dv);
  }
  return rows;
}

TEST(DecodeAttention, GeneralCasesMatchTheReferenceOnEveryTarget) {
  Generator gen(30);
  const std::vector<GeneralCase> cs = general_cases(gen);
  float worst = 0.0f, worst_bf16_cache = 0.0f;
  int64_t differ = 0, total = 0;
  for (const std::string& target : kn::flash_attention_targets()) {
    ASSERT_TRUE(kn::flash_attention_use_target(target.c_str()));
    for (const GeneralCase& c : cs) {
      SCOPED_TRACE(target + " " + c.name);
      const DecodeProblem p = c.problem();
      // fp32
      std::vector<float> ref(size_t(c.o_elems), 7.0f), out = ref;
      ref::decode_attention_forward(ref.data(), c.q.data(), c.k.data(), c.v.data(), p);
      kn::decode_attention_forward(out.data(), c.q.data(), c.k.data(), c.v.data(), p);
      int64_t written = 0;
      for (const auto& [at, n] : written_rows(p)) {
        for (int64_t i = at; i < at + n; ++i) {
          ASSERT_TRUE(std::isfinite(ref[size_t(i)])) << i;
          ASSERT_NEAR(out[size_t(i)], ref[size_t(i)], 2e-6f) << i;
          worst = std::max(worst, std::abs(out[size_t(i)] - ref[size_t(i)]));
          ++written;
        }
      }
      // Nothing else of out was written.
      EXPECT_EQ(int64_t(std::count(out.begin(), out.end(), 7.0f)) + written,
                int64_t(std::count(ref.begin(), ref.end(), 7.0f)) + written);
      // fp32 queries over a bf16 cache.
      const std::vector<BFloat16> kb = rounded(c.k), vb = rounded(c.v), qb = rounded(c.q);
      std::fill(ref.begin(), ref.end(), 7.0f), std::fill(out.begin(), out.end(), 7.0f);
      ref::decode_attention_forward(ref.data(), c.q.data(), kb.data(), vb.data(), p);
      kn::decode_attention_forward(out.data(), c.q.data(), kb.data(), vb.data(), p);
      for (const auto& [at, n] : written_rows(p)) {
        for (int64_t i = at; i < at + n; ++i) {
          ASSERT_NEAR(out[size_t(i)], ref[size_t(i)], 2e-6f) << i;
          worst_bf16_cache = std::max(worst_bf16_cache, std::abs(out[size_t(i)] - ref[size_t(i)]));
        }
      }
      // bf16 throughout.
      std::vector<BFloat16> rb(size_t(c.o_elems), to_bfloat16(7.0f)), ob = rb;
      ref::decode_attention_forward_bf16(rb.data(), qb.data(), kb.data(), vb.data(), p);
      kn::decode_attention_forward_bf16(ob.data(), qb.data(), kb.data(), vb.data(), p);
      for (const auto& [at, n] : written_rows(p)) {
        for (int64_t i = at; i < at + n; ++i) {
          const float o = to_float(ob[size_t(i)]), r = to_float(rb[size_t(i)]);
          ASSERT_NEAR(o, r, std::abs(r) * 0x1p-7f + 1e-6f) << i;
          differ += o != r;
          ++total;
        }
      }
    }
  }
  ASSERT_TRUE(kn::flash_attention_use_target(nullptr));
  std::printf(
      "[  DECODE  ] %zu general cases x %zu targets: max |kernel - reference| fp32 %.3g, "
      "fp32 over a bf16 cache %.3g; bf16: %lld of %lld differ by one ulp\n",
      cs.size(), kn::flash_attention_targets().size(), double(worst), double(worst_bf16_cache),
      static_cast<long long>(differ), static_cast<long long>(total));
}

// The reference's new maths against ref::sdpa_forward on the dense cases
// (softcap, ALiBi, Dv, a long run of queries): the same buffers read in place.
TEST(DecodeAttention, GeneralReferenceMatchesSdpa) {
  Generator gen(31);
  float worst = 0.0f;
  for (const GeneralCase& c : general_cases(gen)) {
    const DecodeProblem p = c.problem();
    if (p.cu_seqlens_q != nullptr || p.block_table != nullptr) continue;
    SCOPED_TRACE(c.name);
    std::vector<float> k = c.k, v = c.v;  // sdpa may read masked rows (times 0): no NaN
    for (float& x : k) x = std::isnan(x) ? 0.0f : x;
    for (float& x : v) x = std::isnan(x) ? 0.0f : x;
    std::vector<float> ref(size_t(c.o_elems), 0.0f), sdpa = ref;
    ref::decode_attention_forward(ref.data(), c.q.data(), k.data(), v.data(), p);
    sdpa_on_decode_buffers(sdpa.data(), c.q.data(), k.data(), v.data(), p);
    for (const auto& [at, n] : written_rows(p)) {
      for (int64_t i = at; i < at + n; ++i) {
        ASSERT_NEAR(ref[size_t(i)], sdpa[size_t(i)], 2e-6f) << i;
        worst = std::max(worst, std::abs(ref[size_t(i)] - sdpa[size_t(i)]));
      }
    }
  }
  std::printf("[  DECODE  ] general dense cases: max |reference - ref::sdpa_forward| = %.3g\n",
              double(worst));
}

// Sequences of their own lengths and paged caches: each sequence's output
// equals the reference on that sequence alone, copied into a dense cache
// (the addressing checked against plain copies), and the kernel's bits for a
// sequence do not depend on the other sequences or on the thread count.
TEST(DecodeAttention, SequencesAndPagesEqualEachSequenceAlone) {
  Generator gen(32);
  for (const GeneralCase& c : general_cases(gen)) {
    const DecodeProblem p = c.problem();
    if (p.cu_seqlens_q == nullptr) continue;
    SCOPED_TRACE(c.name);
    std::vector<float> batched(size_t(c.o_elems)), ref_batched(batched.size());
    kn::decode_attention_forward(batched.data(), c.q.data(), c.k.data(), c.v.data(), p);
    ref::decode_attention_forward(ref_batched.data(), c.q.data(), c.k.data(), c.v.data(), p);
    omp_set_num_threads(1);
    std::vector<float> one_thread(batched.size());
    kn::decode_attention_forward(one_thread.data(), c.q.data(), c.k.data(), c.v.data(), p);
    omp_set_num_threads(omp_get_num_procs());
    for (const auto& [at, n] : written_rows(p)) {
      for (int64_t i = at; i < at + n; ++i)
        ASSERT_EQ(batched[size_t(i)], one_thread[size_t(i)]) << i;
    }
    for (int64_t b = 0; b < p.B; ++b) {
      const int64_t Tq = decode_queries(p, b), L = decode_keys(p, b);
      // Sequence b alone in a dense (1, Hkv, L, D) cache, q and out packed.
      DecodeProblem a{.B = 1,
                      .Hq = p.Hq,
                      .Hkv = p.Hkv,
                      .Tq = Tq,
                      .length = L,
                      .capacity = L,
                      .D = p.D,
                      .Dv = p.Dv,
                      .scale = p.scale,
                      .window_left = p.window_left,
                      .softcap = p.softcap,
                      .alibi_slopes = p.alibi_slopes};
      std::vector<float> q(size_t(Tq * p.Hq * p.D)), k(size_t(p.Hkv * L * p.D), 0.0f),
          v(size_t(p.Hkv * L * p.Dv), 0.0f);
      for (int64_t t = 0; t < Tq; ++t)
        std::copy_n(c.q.data() + decode_q_offset(p, b, t), p.Hq * p.D, q.data() + t * p.Hq * p.D);
      for (int64_t g = 0; g < p.Hkv; ++g) {
        for (int64_t j = 0; j < L; ++j) {
          std::copy_n(c.k.data() + decode_cache_offset(p, p.k_strides, b, g, j), p.D,
                      k.data() + (g * L + j) * p.D);
          std::copy_n(c.v.data() + decode_cache_offset(p, p.v_strides, b, g, j), p.Dv,
                      v.data() + (g * L + j) * p.Dv);
        }
      }
      for (float& x : k) x = std::isnan(x) ? 0.0f : x;  // rows before the window: never read
      for (float& x : v) x = std::isnan(x) ? 0.0f : x;
      std::vector<float> alone(size_t(Tq * p.Hq * p.Dv)), ref_alone(alone.size());
      kn::decode_attention_forward(alone.data(), q.data(), k.data(), v.data(), a);
      ref::decode_attention_forward(ref_alone.data(), q.data(), k.data(), v.data(), a);
      for (int64_t t = 0; t < Tq; ++t) {
        for (int64_t i = 0; i < p.Hq * p.Dv; ++i) {
          const size_t at = size_t(decode_o_offset(p, b, t) + i),
                       here = size_t(t * p.Hq * p.Dv + i);
          ASSERT_EQ(ref_batched[at], ref_alone[here]) << "sequence " << b << " row " << t;
          ASSERT_EQ(batched[at], alone[here]) << "sequence " << b << " row " << t;
        }
      }
    }
  }
}

}  // namespace
}  // namespace attn::test
