// Variable-length packed batches (attn/sdpa.h's sdpa_varlen_forward/backward):
// the fused kernel against the plain reference on random packed batches
// (lengths 0, 1, odd, across the tile widths, Tq_b != Tk_b, every option that
// applies per sequence, contiguous, fused-qkv and strided inputs, dropout), on
// every SIMD target; each sequence bit-identical to the batched
// scaled_dot_product_attention on that sequence alone; equal-length sequences
// (dropout and per-sequence ALiBi included) bit-identical to the batched call
// with B sequences; 1 and 2 threads bit-identical; the reference's gradients
// against finite differences; empty sequences; errors.
//
// Tolerance (kernel vs reference): as tests/unit/test_sdpa.cpp, max |fused − ref|
// <= 2e-5 · max(1, max |ref|) per tensor; lse -inf exactly where the reference has it.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "attn/kernels.h"
#include "attn/ops.h"
#include "attn/sdpa.h"
#include "attn/tensor.h"
#include "gradcheck.h"
#include "bits.h"

#ifdef _OPENMP
#include <omp.h>

using attn::test::same_bits;
#endif

namespace {

using attn::CausalAlignment;
using attn::SdpaBackend;
using attn::SdpaOptions;
using attn::Shape;
using attn::Tensor;

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kRelTol = 2e-5f;

enum class Layout { kPacked, kFusedQkv, kStridedD };
enum class Alibi { kNone, kPerHead, kPerSequence };

struct Case {
  std::vector<int64_t> lens_q, lens_k;  // one entry per sequence
  int64_t Hq = 1, Hkv = 1, D = 16, Dv = 16;
  bool causal = false;
  CausalAlignment align = CausalAlignment::kTopLeft;
  int64_t left = -1, right = -1;
  Alibi alibi = Alibi::kNone;
  float softcap = 0.0f;
  Layout layout = Layout::kPacked;
  float dropout_p = 0.0f;
  int64_t nseq() const { return int64_t(lens_q.size()); }
};

std::string lens_str(const std::vector<int64_t>& v) { return fmt::format("{}", fmt::join(v, ",")); }

std::string describe(const Case& c) {
  std::string s = fmt::format("q lens [{}] k lens [{}] Hq{} Hkv{} D{} Dv{}", lens_str(c.lens_q),
                              lens_str(c.lens_k), c.Hq, c.Hkv, c.D, c.Dv);
  if (c.causal)
    s += c.align == CausalAlignment::kTopLeft ? " causal(top-left)" : " causal(bottom-right)";
  if (c.left >= 0 || c.right >= 0) s += fmt::format(" window({}, {})", c.left, c.right);
  if (c.alibi != Alibi::kNone) s += c.alibi == Alibi::kPerHead ? " alibi(Hq)" : " alibi(nseq, Hq)";
  if (c.softcap > 0.0f) s += fmt::format(" softcap {}", c.softcap);
  s += c.layout == Layout::kPacked     ? " packed"
       : c.layout == Layout::kFusedQkv ? " fused-qkv"
                                       : " strided-D";
  if (c.dropout_p > 0.0f) s += fmt::format(" dropout {}", c.dropout_p);
  return s;
}

Tensor randn(const Shape& shape, uint64_t seed) { return attn::test::random_tensor(shape, seed); }

Tensor offsets(const std::vector<int64_t>& lens) {
  std::vector<int64_t> c{0};
  for (int64_t n : lens) c.push_back(c.back() + n);
  return Tensor::from_int64({int64_t(c.size())}, c);
}

int64_t total(const std::vector<int64_t>& lens) {
  int64_t t = 0;
  for (int64_t n : lens) t += n;
  return t;
}

int64_t longest(const std::vector<int64_t>& lens) {
  return lens.empty() ? 0 : *std::max_element(lens.begin(), lens.end());
}

struct Inputs {
  Tensor q, k, v, dout, cu_q, cu_k;
  int64_t max_q = 0, max_k = 0;
  SdpaOptions opt;
};

// (total, H, W) in the case's layout, N(0, 1).
Tensor packed(Layout layout, int64_t total, int64_t H, int64_t W, uint64_t seed) {
  if (layout == Layout::kStridedD)  // last dim not contiguous: the entry point copies
    return randn({total, W, H}, seed).transpose(1, 2);
  return randn({total, H, W}, seed);
}

Inputs make_inputs(const Case& c, uint64_t seed) {
  Inputs in;
  const int64_t tq = total(c.lens_q), tk = total(c.lens_k);
  if (c.layout == Layout::kFusedQkv) {
    // One (total, Hq·D + Hkv·D + Hkv·Dv) buffer, as a fused projection writes it (Tq_b = Tk_b).
    const int64_t width = c.Hq * c.D + c.Hkv * c.D + c.Hkv * c.Dv;
    const Tensor qkv = randn({tq, width}, seed);
    in.q = qkv.slice(1, 0, c.Hq * c.D).view({tq, c.Hq, c.D});
    in.k = qkv.slice(1, c.Hq * c.D, (c.Hq + c.Hkv) * c.D).view({tk, c.Hkv, c.D});
    in.v = qkv.slice(1, (c.Hq + c.Hkv) * c.D, width).view({tk, c.Hkv, c.Dv});
  } else {
    in.q = packed(c.layout, tq, c.Hq, c.D, seed);
    in.k = packed(c.layout, tk, c.Hkv, c.D, seed + 1);
    in.v = packed(c.layout, tk, c.Hkv, c.Dv, seed + 2);
  }
  in.dout = randn({tq, c.Hq, c.Dv}, seed + 3);
  in.cu_q = offsets(c.lens_q), in.cu_k = offsets(c.lens_k);
  in.max_q = longest(c.lens_q), in.max_k = longest(c.lens_k);
  SdpaOptions& o = in.opt;
  o.is_causal = c.causal;
  o.causal_alignment = c.align;
  o.window_left = c.left, o.window_right = c.right;
  o.enable_gqa = c.Hq != c.Hkv;
  o.softcap = c.softcap;
  o.dropout_p = c.dropout_p;
  o.dropout_seed = 0xBEEF + seed;
  if (c.alibi != Alibi::kNone) {
    const int64_t rows = c.alibi == Alibi::kPerHead ? 1 : c.nseq();
    Tensor slopes({rows, c.Hq});
    for (int64_t b = 0; b < rows; ++b)
      for (int64_t h = 0; h < c.Hq; ++h)
        slopes.at({b, h}) = std::pow(2.0f, -8.0f * float(h + 1) / float(c.Hq)) * float(b + 1);
    o.alibi_slopes = c.alibi == Alibi::kPerHead ? slopes.reshape({c.Hq}) : slopes;
  }
  return in;
}

struct Result {
  attn::SdpaForward f;
  attn::SdpaGrads g;
};

Result run(const Inputs& in, SdpaBackend backend) {
  SdpaOptions o = in.opt;
  o.backend = backend;
  Result r;
  r.f = attn::sdpa_varlen_forward(in.q, in.k, in.v, in.cu_q, in.cu_k, in.max_q, in.max_k, o);
  r.g = attn::sdpa_varlen_backward(in.dout, in.q, in.k, in.v, r.f.out, r.f.lse, in.cu_q, in.cu_k,
                                   in.max_q, in.max_k, o);
  return r;
}

// max |a − b| / max(1, max |b|); NaN anywhere gives +inf.
double rel_err(const Tensor& a, const Tensor& b) {
  EXPECT_EQ(a.shape(), b.shape());
  const std::vector<float> x = a.to_vector(), y = b.to_vector();
  double worst = 0.0, scale = 1.0;
  for (size_t n = 0; n < x.size(); ++n) {
    if (std::isnan(x[n]) || std::isnan(y[n])) return kInf;
    worst = std::max(worst, double(std::fabs(x[n] - y[n])));
    scale = std::max(scale, double(std::fabs(y[n])));
  }
  return worst / scale;
}

void expect_lse_close(const Tensor& lse, const Tensor& ref, const std::string& what) {
  ASSERT_EQ(lse.shape(), ref.shape()) << what;
  const std::vector<float> x = lse.to_vector(), y = ref.to_vector();
  for (size_t n = 0; n < x.size(); ++n) {
    if (y[n] == -kInf) {
      ASSERT_EQ(x[n], -kInf) << what << " lse[" << n << "]";
    } else {
      ASSERT_NEAR(x[n], y[n], kRelTol * std::max(1.0f, std::fabs(y[n])))
          << what << " lse[" << n << "]";
    }
  }
}

// max |t|; NaN gives +inf.
float max_abs(const Tensor& t) {
  float m = 0.0f;
  for (float x : t.to_vector()) m = std::isnan(x) ? kInf : std::max(m, std::fabs(x));
  return m;
}


void compare(const Case& c, uint64_t seed) {
  const Inputs in = make_inputs(c, seed);
  const Result fused = run(in, SdpaBackend::kFused);
  const Result ref = run(in, SdpaBackend::kReference);
  const std::string what = describe(c);
  EXPECT_EQ(fused.f.out.shape(), (Shape{total(c.lens_q), c.Hq, c.Dv}));
  EXPECT_EQ(fused.f.lse.shape(), (Shape{c.Hq, total(c.lens_q)}));
  EXPECT_LE(rel_err(fused.f.out, ref.f.out), kRelTol) << what << " out";
  expect_lse_close(fused.f.lse, ref.f.lse, what);
  EXPECT_LE(rel_err(fused.g.dq, ref.g.dq), kRelTol) << what << " dq";
  EXPECT_LE(rel_err(fused.g.dk, ref.g.dk), kRelTol) << what << " dk";
  EXPECT_LE(rel_err(fused.g.dv, ref.g.dv), kRelTol) << what << " dv";
}

Case random_case(std::mt19937& gen) {
  auto pick = [&](const std::vector<int64_t>& v) {
    return v[std::uniform_int_distribution<size_t>(0, v.size() - 1)(gen)];
  };
  auto chance = [&](double p) { return std::uniform_real_distribution<double>(0, 1)(gen) < p; };
  Case c;
  const int64_t nseq = pick({1, 2, 3, 5});
  const std::vector<int64_t> T = {0, 1, 3, 15, 16, 17, 33, 63, 64, 65, 129, 200};
  const bool same_lengths = chance(0.4);
  for (int64_t b = 0; b < nseq; ++b) {
    c.lens_q.push_back(pick(T));
    c.lens_k.push_back(same_lengths ? c.lens_q.back() : pick(T));
  }
  c.Hkv = pick({1, 2, 3});
  c.Hq = c.Hkv * pick({1, 1, 2, 4});
  c.D = pick({1, 3, 16, 17, 32, 64, 80});
  c.Dv = chance(0.6) ? c.D : pick({1, 7, 16, 31, 64});
  c.causal = chance(0.5);
  c.align = chance(0.5) ? CausalAlignment::kTopLeft : CausalAlignment::kBottomRight;
  if (chance(0.35)) {
    c.left = pick({-1, 0, 1, 5, 16, 40});
    c.right = pick({-1, 0, 3, 17});
  }
  const int64_t alibi = pick({0, 0, 0, 1, 2});
  c.alibi = alibi == 1 ? Alibi::kPerHead : alibi == 2 ? Alibi::kPerSequence : Alibi::kNone;
  c.softcap = chance(0.25) ? 2.0f : 0.0f;
  const int64_t layout = pick({0, 0, 1, 2});
  c.layout = layout == 1 && same_lengths ? Layout::kFusedQkv
             : layout == 2               ? Layout::kStridedD
                                         : Layout::kPacked;
  c.dropout_p = chance(0.15) ? 0.25f : 0.0f;
  return c;
}

TEST(SdpaVarlen, FusedMatchesReferenceOnRandomPackedBatches) {
  std::mt19937 gen(2020);
  for (int n = 0; n < 80; ++n) {
    const Case c = random_case(gen);
    SCOPED_TRACE(describe(c));
    compare(c, uint64_t(3000 + n));
    if (HasFatalFailure()) return;
  }
}

// Hand-picked: lengths on both sides of the tiles (16, 64) with Tq_b != Tk_b, both alignments.
TEST(SdpaVarlen, FusedMatchesReferenceOnEdgeLengths) {
  std::vector<Case> cases;
  for (auto align : {CausalAlignment::kTopLeft, CausalAlignment::kBottomRight}) {
    Case c;
    c.lens_q = {1, 0, 17, 64, 65, 7, 130};
    c.lens_k = {1, 5, 63, 64, 200, 130, 7};
    c.Hq = 4, c.Hkv = 2, c.D = 32, c.Dv = 48, c.causal = true, c.align = align;
    cases.push_back(c);
    c.causal = false, c.left = 9, c.right = 2;
    cases.push_back(c);
    c.left = 3, c.right = -1, c.causal = true, c.alibi = Alibi::kPerSequence, c.softcap = 5.0f;
    cases.push_back(c);
  }
  {
    Case c;  // a sliding window much shorter than the sequences
    c.lens_q = c.lens_k = {300, 257, 1};
    c.Hq = 2, c.Hkv = 1, c.D = 17, c.Dv = 17, c.causal = true, c.left = 20;
    cases.push_back(c);
  }
  for (int n = 0; n < int(cases.size()); ++n) {
    SCOPED_TRACE(describe(cases[size_t(n)]));
    compare(cases[size_t(n)], uint64_t(77 + n));
  }
}

TEST(SdpaVarlen, EverySimdTargetMatchesReference) {
  std::mt19937 gen(9);
  std::vector<Case> cases;
  for (int n = 0; n < 8; ++n) cases.push_back(random_case(gen));
  for (const std::string& target : attn::kernels::flash_attention_targets()) {
    ASSERT_TRUE(attn::kernels::flash_attention_use_target(target.c_str()));
    for (int n = 0; n < int(cases.size()); ++n) {
      SCOPED_TRACE(target + ": " + describe(cases[size_t(n)]));
      compare(cases[size_t(n)], uint64_t(600 + n));
    }
  }
  ASSERT_TRUE(attn::kernels::flash_attention_use_target(nullptr));
}

// Each sequence through the batched entry point alone ((1, H, T, D) views of
// its rows): the same bits, forward and backward, for the kernel and the
// reference. (Without dropout: the batched call's Philox counter is b = 0.)
TEST(SdpaVarlen, EachSequenceEqualsTheBatchedCallOnItAlone) {
  std::vector<Case> cases;
  Case c;
  c.lens_q = {70, 1, 0, 129, 33};
  c.lens_k = {90, 1, 4, 129, 0};
  c.Hq = 6, c.Hkv = 2, c.D = 17, c.Dv = 24, c.causal = true,
  c.align = CausalAlignment::kBottomRight;
  c.alibi = Alibi::kPerSequence, c.softcap = 3.0f;
  cases.push_back(c);
  c.Hq = 2, c.D = 64, c.Dv = 64, c.align = CausalAlignment::kTopLeft, c.alibi = Alibi::kNone;
  c.softcap = 0.0f, c.left = 10, c.right = 4, c.layout = Layout::kStridedD;
  cases.push_back(c);
  for (const Case& k : cases)
    for (SdpaBackend backend : {SdpaBackend::kFused, SdpaBackend::kReference}) {
      SCOPED_TRACE(describe(k) + (backend == SdpaBackend::kFused ? " fused" : " reference"));
      const Inputs in = make_inputs(k, 41);
      const Result all = run(in, backend);
      int64_t q0 = 0, k0 = 0;
      for (int64_t b = 0; b < k.nseq(); ++b) {
        const int64_t tq = k.lens_q[size_t(b)], tk = k.lens_k[size_t(b)];
        SCOPED_TRACE("sequence " + std::to_string(b));
        const Tensor out_b = all.f.out.slice(0, q0, q0 + tq), dq_b = all.g.dq.slice(0, q0, q0 + tq);
        const Tensor dk_b = all.g.dk.slice(0, k0, k0 + tk), dv_b = all.g.dv.slice(0, k0, k0 + tk);
        if (tq > 0 && tk == 0) {  // no key: output 0, lse -inf, no gradient
          EXPECT_EQ(max_abs(out_b), 0.0f);
          EXPECT_EQ(max_abs(dq_b), 0.0f);
          for (int64_t h = 0; h < k.Hq; ++h)
            for (int64_t i = q0; i < q0 + tq; ++i) EXPECT_EQ(all.f.lse.at({h, i}), -kInf);
        } else if (tq == 0 && tk > 0) {  // no query: dk, dv 0
          EXPECT_EQ(max_abs(dk_b), 0.0f);
          EXPECT_EQ(max_abs(dv_b), 0.0f);
        } else if (tq > 0 && tk > 0) {
          auto alone = [](const Tensor& t, int64_t r0, int64_t r1) {
            return t.slice(0, r0, r1).unsqueeze(0).transpose(1, 2);  // (1, H, T, W)
          };
          SdpaOptions o = in.opt;
          o.backend = backend;
          if (k.alibi == Alibi::kPerSequence)
            o.alibi_slopes = in.opt.alibi_slopes.select(0, b).contiguous();
          const Tensor qb = alone(in.q, q0, q0 + tq), kb = alone(in.k, k0, k0 + tk);
          const Tensor vb = alone(in.v, k0, k0 + tk), dob = alone(in.dout, q0, q0 + tq);
          const attn::SdpaForward f = attn::scaled_dot_product_attention_forward(qb, kb, vb, o);
          const attn::SdpaGrads g =
              attn::scaled_dot_product_attention_backward(dob, qb, kb, vb, f.out, f.lse, o);
          EXPECT_TRUE(same_bits(f.out.transpose(1, 2).squeeze(0).contiguous(), out_b.contiguous()));
          EXPECT_TRUE(same_bits(f.lse.squeeze(0), all.f.lse.slice(1, q0, q0 + tq).contiguous()));
          EXPECT_TRUE(same_bits(g.dq.transpose(1, 2).squeeze(0).contiguous(), dq_b.contiguous()));
          EXPECT_TRUE(same_bits(g.dk.transpose(1, 2).squeeze(0).contiguous(), dk_b.contiguous()));
          EXPECT_TRUE(same_bits(g.dv.transpose(1, 2).squeeze(0).contiguous(), dv_b.contiguous()));
        }
        q0 += tq, k0 += tk;
      }
    }
}

// B sequences of one length are the batched problem (B, T, H, D) viewed token-major:
// the same bits with dropout (sequence b's Philox counter is batch b's) and
// (B, Hq) ALiBi slopes too.
TEST(SdpaVarlen, EqualLengthsEqualTheBatchedCallWithDropout) {
  const int64_t B = 3, Tq = 45, Tk = 70, Hq = 4, Hkv = 2, D = 32, Dv = 16;
  Case c;
  c.lens_q = std::vector<int64_t>(B, Tq);
  c.lens_k = std::vector<int64_t>(B, Tk);
  c.Hq = Hq, c.Hkv = Hkv, c.D = D, c.Dv = Dv, c.causal = true;
  c.align = CausalAlignment::kBottomRight, c.alibi = Alibi::kPerSequence, c.dropout_p = 0.2f;
  const Inputs in = make_inputs(c, 5);
  for (SdpaBackend backend : {SdpaBackend::kFused, SdpaBackend::kReference}) {
    const Result all = run(in, backend);
    SdpaOptions o = in.opt;
    o.backend = backend;
    auto batched = [&](const Tensor& t, int64_t T) {  // (B·T, H, W) -> (B, H, T, W) view
      return t.view({B, T, t.size(1), t.size(2)}).transpose(1, 2);
    };
    const Tensor q = batched(in.q, Tq), k = batched(in.k, Tk), v = batched(in.v, Tk);
    const Tensor dout = batched(in.dout, Tq);
    const attn::SdpaForward f = attn::scaled_dot_product_attention_forward(q, k, v, o);
    const attn::SdpaGrads g =
        attn::scaled_dot_product_attention_backward(dout, q, k, v, f.out, f.lse, o);
    auto packed_back = [&](const Tensor& t) {  // (B, H, T, W) -> (B·T, H, W)
      return t.transpose(1, 2).contiguous().reshape({-1, t.size(1), t.size(3)});
    };
    EXPECT_TRUE(same_bits(packed_back(f.out), all.f.out));
    EXPECT_TRUE(same_bits(f.lse.transpose(0, 1).contiguous().reshape({Hq, B * Tq}), all.f.lse));
    EXPECT_TRUE(same_bits(packed_back(g.dq), all.g.dq));
    EXPECT_TRUE(same_bits(packed_back(g.dk), all.g.dk));
    EXPECT_TRUE(same_bits(packed_back(g.dv), all.g.dv));
  }
}

// 1 and 2 threads: the same bits (2 sequences x 1 key/value head take the
// split backward on 2 threads and the whole-unit one on 1; 5 x 2 the latter on both).
TEST(SdpaVarlen, BitIdenticalForAnyThreadCount) {
#ifdef _OPENMP
  const int saved = omp_get_max_threads();
  std::vector<Case> cases;
  Case c;
  c.lens_q = {150, 40}, c.lens_k = {170, 300};
  c.Hq = 4, c.Hkv = 1, c.D = 32, c.Dv = 40, c.causal = true;
  c.align = CausalAlignment::kBottomRight, c.alibi = Alibi::kPerHead, c.dropout_p = 0.1f;
  cases.push_back(c);
  c.lens_q = {1, 100, 0, 77, 64}, c.lens_k = {90, 100, 3, 77, 1};
  c.Hq = 4, c.Hkv = 2, c.D = 17, c.Dv = 17, c.causal = false, c.left = 30, c.right = 5;
  c.softcap = 3.0f, c.dropout_p = 0.0f;
  cases.push_back(c);
  for (const Case& k : cases) {
    SCOPED_TRACE(describe(k));
    const Inputs in = make_inputs(k, 99);
    omp_set_num_threads(1);
    const Result one = run(in, SdpaBackend::kFused);
    omp_set_num_threads(2);
    const Result two = run(in, SdpaBackend::kFused);
    omp_set_num_threads(saved);
    EXPECT_TRUE(same_bits(one.f.out, two.f.out));
    EXPECT_TRUE(same_bits(one.f.lse, two.f.lse));
    EXPECT_TRUE(same_bits(one.g.dq, two.g.dq));
    EXPECT_TRUE(same_bits(one.g.dk, two.g.dk));
    EXPECT_TRUE(same_bits(one.g.dv, two.g.dv));
  }
#else
  GTEST_SKIP() << "built without OpenMP";
#endif
}

TEST(SdpaVarlen, ReferenceGradientsMatchFiniteDifferences) {
  Case c;
  c.lens_q = {3, 0, 4}, c.lens_k = {5, 2, 3};
  c.Hq = 4, c.Hkv = 2, c.D = 3, c.Dv = 2, c.causal = true, c.align = CausalAlignment::kBottomRight;
  c.alibi = Alibi::kPerSequence, c.softcap = 1.5f, c.dropout_p = 0.3f, c.left = 2;
  Inputs in = make_inputs(c, 31);
  in.opt.backend = SdpaBackend::kReference;
  const Result r = run(in, SdpaBackend::kReference);
  const auto loss = [&] {
    return attn::test::dot_loss(
        attn::sdpa_varlen_forward(in.q, in.k, in.v, in.cu_q, in.cu_k, in.max_q, in.max_k, in.opt)
            .out,
        in.dout);
  };
  attn::test::GradTolerance tol;
  attn::test::check_tensor_grad("dq", in.q, r.g.dq, loss, tol);
  attn::test::check_tensor_grad("dk", in.k, r.g.dk, loss, tol);
  attn::test::check_tensor_grad("dv", in.v, r.g.dv, loss, tol);
}

// Every sequence empty, or no key at all: zeros, lse -inf, no NaN, for both backends.
TEST(SdpaVarlen, EmptySequencesAndEmptyTotals) {
  for (SdpaBackend backend : {SdpaBackend::kFused, SdpaBackend::kReference}) {
    SdpaOptions o;
    o.backend = backend;
    const Tensor q = randn({4, 2, 8}, 1), k0 = Tensor::zeros({0, 2, 8}),
                 v0 = Tensor::zeros({0, 2, 8});
    const Tensor cu_q = offsets({4, 0}), cu_k = offsets({0, 0});
    const attn::SdpaForward f = attn::sdpa_varlen_forward(q, k0, v0, cu_q, cu_k, 4, 0, o);
    EXPECT_EQ(f.out.shape(), (Shape{4, 2, 8}));
    EXPECT_EQ(max_abs(f.out), 0.0f);
    for (int64_t n = 0; n < 8; ++n) EXPECT_EQ(f.lse.to_vector()[size_t(n)], -kInf);
    const attn::SdpaGrads g = attn::sdpa_varlen_backward(randn({4, 2, 8}, 2), q, k0, v0, f.out,
                                                         f.lse, cu_q, cu_k, 4, 0, o);
    EXPECT_EQ(max_abs(g.dq), 0.0f);
    EXPECT_EQ(g.dk.shape(), (Shape{0, 2, 8}));
    // No query at all.
    const Tensor q0 = Tensor::zeros({0, 2, 8}), k = randn({5, 2, 8}, 3), v = randn({5, 2, 8}, 4);
    const attn::SdpaForward f0 =
        attn::sdpa_varlen_forward(q0, k, v, offsets({0, 0}), offsets({2, 3}), 0, 3, o);
    EXPECT_EQ(f0.out.shape(), (Shape{0, 2, 8}));
    EXPECT_EQ(f0.lse.shape(), (Shape{2, 0}));
    const attn::SdpaGrads g0 = attn::sdpa_varlen_backward(
        q0, q0, k, v, f0.out, f0.lse, offsets({0, 0}), offsets({2, 3}), 0, 3, o);
    EXPECT_EQ(max_abs(g0.dk), 0.0f);
    EXPECT_EQ(max_abs(g0.dv), 0.0f);
  }
}

// ---- errors -----------------------------------------------------------------------

void expect_error(const std::function<void()>& f, const std::string& fragment) {
  try {
    f();
    ADD_FAILURE() << "no exception; expected one containing: " << fragment;
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
  }
}

TEST(SdpaVarlen, BadInputsThrowNamingTheValues) {
  const Tensor q = randn({10, 4, 8}, 1), k = randn({12, 2, 8}, 2), v = randn({12, 2, 8}, 3);
  const Tensor cu_q = offsets({3, 7}), cu_k = offsets({5, 7});
  SdpaOptions gqa;
  gqa.enable_gqa = true;
  auto fwd = [&](const Tensor& a, const Tensor& b, const Tensor& c, const Tensor& cq,
                 const Tensor& ck, int64_t mq, int64_t mk, SdpaOptions o) {
    return [=] { attn::sdpa_varlen_forward(a, b, c, cq, ck, mq, mk, o); };
  };
  attn::sdpa_varlen_forward(q, k, v, cu_q, cu_k, 7, 7, gqa);  // the good call passes
  expect_error(fwd(q, k, v, cu_q, cu_k, 7, 7, {}),
               "q has 4 heads and k, v have 2: set enable_gqa for grouped-query attention");
  expect_error(fwd(randn({2, 10, 4, 8}, 1), k, v, cu_q, cu_k, 7, 7, gqa),
               "q must be 3-D (total_q, Hq, D) (packed, token-major), got shape (2, 10, 4, 8)");
  expect_error(fwd(q, k, randn({11, 2, 8}, 4), cu_q, cu_k, 7, 7, gqa),
               "k has 12 keys but v has 11 values (k (12, 2, 8), v (11, 2, 8))");
  expect_error(fwd(q, randn({12, 2, 6}, 4), v, cu_q, cu_k, 7, 7, gqa),
               "q and k must have the same head dim: q (10, 4, 8) has D = 8, k (12, 2, 6) has 6");
  expect_error(fwd(q, k, v, offsets({3, 7}).to(attn::DType::kFloat32), cu_k, 7, 7, gqa),
               "cu_seqlens_q must be int64, got float32");
  expect_error(fwd(q, k, v, Tensor::from_int64({1}, {0}), cu_k, 7, 7, gqa),
               "cu_seqlens_q must be 1-D (nseq + 1) with nseq >= 1, got shape (1,)");
  expect_error(fwd(q, k, v, Tensor::from_int64({3}, {1, 3, 10}), cu_k, 7, 7, gqa),
               "cu_seqlens_q[0] must be 0, got 1");
  expect_error(fwd(q, k, v, Tensor::from_int64({4}, {0, 6, 4, 10}), offsets({5, 0, 7}), 7, 7, gqa),
               "cu_seqlens_q must not decrease: cu_seqlens_q[2] = 4 after cu_seqlens_q[1] = 6");
  expect_error(fwd(q, k, v, Tensor::from_int64({3}, {0, 3, 9}), cu_k, 7, 7, gqa),
               "cu_seqlens_q[2] = 9 must equal total_q (q.size(0)) = 10");
  expect_error(fwd(q, k, v, cu_q, Tensor::from_int64({3}, {0, 5, 13}), 7, 8, gqa),
               "cu_seqlens_k[2] = 13 must equal total_k (k.size(0)) = 12");
  expect_error(fwd(q, k, v, cu_q, cu_k, 6, 7, gqa),
               "sequence 1 has length 7 (cu_seqlens_q[2] - cu_seqlens_q[1]) but max_seqlen_q is 6");
  expect_error(fwd(q, k, v, cu_q, cu_k, 7, 6, gqa),
               "sequence 1 has length 7 (cu_seqlens_k[2] - cu_seqlens_k[1]) but max_seqlen_k is 6");
  expect_error(fwd(q, k, v, cu_q, cu_k, -1, 7, gqa),
               "max_seqlen_q (-1) and max_seqlen_k (7) must be in [0, 2^31]");
  expect_error(fwd(q, k, v, cu_q, offsets({5, 0, 7}), 7, 7, gqa),
               "cu_seqlens_q holds 2 sequences but cu_seqlens_k holds 3");
  SdpaOptions o = gqa;
  o.attn_mask = Tensor({7, 7});
  expect_error(fwd(q, k, v, cu_q, cu_k, 7, 7, o),
               "attn_mask (shape (7, 7)) is not supported for packed variable-length batches");
  o = gqa;
  o.alibi_slopes = Tensor({3, 4});
  expect_error(fwd(q, k, v, cu_q, cu_k, 7, 7, o),
               "alibi_slopes must be (Hq) = (4) or (nseq, Hq) = (2, 4), got (3, 4)");
  o = gqa;
  o.dropout_p = -0.5f;
  expect_error(fwd(q, k, v, cu_q, cu_k, 7, 7, o), "dropout_p must be in [0, 1), got -0.5");
  o = gqa;
  o.window_right = -3;
  expect_error(fwd(q, k, v, cu_q, cu_k, 7, 7, o),
               "window_left (-1) and window_right (-3) must be -1 (unbounded) or >= 0");
  o = gqa;
  o.softcap = kInf;
  expect_error(fwd(q, k, v, cu_q, cu_k, 7, 7, o),
               "softcap must be 0 (off) or a finite value > 0, got inf");
  const attn::SdpaForward f = attn::sdpa_varlen_forward(q, k, v, cu_q, cu_k, 7, 7, gqa);
  expect_error(
      [&] {
        attn::sdpa_varlen_backward(randn({10, 4, 7}, 9), q, k, v, f.out, f.lse, cu_q, cu_k, 7, 7,
                                   gqa);
      },
      "dout has shape (10, 4, 7) but the output is (total_q, Hq, Dv) = (10, 4, 8)");
  expect_error(
      [&] {
        attn::sdpa_varlen_backward(f.out, q, k, v, f.out, f.lse.transpose(0, 1), cu_q, cu_k, 7, 7,
                                   gqa);
      },
      "lse has shape (10, 4) but must be (Hq, total_q) = (4, 10)");
}

}  // namespace
