// Variable-length packed batches (attn/sdpa.h's sdpa_varlen_forward/backward)
// on bfloat16 q, k, v, dout: the two features together. The same random packed
// batches as tests/unit/test_sdpa_varlen.cpp (lengths 0, 1, odd, across the
// tile widths, Tq_b != Tk_b, GQA, Dv != D, both alignments, windows, ALiBi per
// head and per sequence, softcap, dropout, packed, fused-qkv and strided
// inputs), checked as tests/unit/test_sdpa_bf16.cpp checks the batched bf16 call:
// 1. the bf16 varlen kernel gives exactly the bits of the fp32 varlen kernel on
//    the widened inputs, rounded once (lse the same fp32 bits; the fp32
//    backward is given the bf16 out, widened, as the bf16 backward reads it);
//    on every SIMD target too;
// 2. the bf16 reference is the fp32 reference on the widened inputs, rounded
//    (bits), and the kernel is within bf16's rounding of that specification:
//    out, dv within 2^-8 |x| + 2e-5 max(1, max |x|); lse within 2e-5; dq the
//    same plus its D term scale · |ΔD_i| · max |k[., d]| over the sequence's
//    keys (the kernel reads D_i = Σ dO·O from the bf16 out: test_sdpa_bf16.cpp
//    explains); dk the same with its own D term: dk[j, d] moves by
//    scale · Σ_i P[i, j] ΔD_i q[i, d], at most scale · Σ_i |ΔD_i| · |q[i, d]| over
//    the sequence's queries of the key/value head's group (P <= 1; a sequence
//    of one key and many queries has dS = 0 exactly in the spec, and this whole
//    term in the kernel);
// 3. each sequence bit-identical to the batched bf16 call on it alone (kernel
//    and reference); 1 and 2 threads bit-identical; dtype errors.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <iostream>
#include <limits>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "attn/kernels.h"
#include "attn/sdpa.h"
#include "attn/tensor.h"
#include "bf16_path_guard.h"
#include "gradcheck.h"
#include "bits.h"

#ifdef _OPENMP
#include <omp.h>

using attn::test::same_bits;
#endif

namespace {

using attn::CausalAlignment;
using attn::DType;
using attn::SdpaBackend;
using attn::SdpaOptions;
using attn::Shape;
using attn::Tensor;

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr DType kBf16 = DType::kBFloat16, kF32 = DType::kFloat32;
constexpr double kRelTol = 2e-5;         // the fp32 kernel against the reference
constexpr double kRound = 1.0 / 256.0;   // 2^-8: bf16's unit roundoff

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
  std::string s = fmt::format("bf16 q lens [{}] k lens [{}] Hq{} Hkv{} D{} Dv{}",
                              lens_str(c.lens_q), lens_str(c.lens_k), c.Hq, c.Hkv, c.D, c.Dv);
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

// N(0, 1) values rounded to bf16.
Tensor randn_bf16(const Shape& shape, uint64_t seed) {
  return attn::test::random_tensor(shape, seed).to(kBf16);
}

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
  Tensor q, k, v, dout, cu_q, cu_k;  // q, k, v, dout bf16
  int64_t max_q = 0, max_k = 0;
  SdpaOptions opt;
};

// (total, H, W) bf16 in the case's layout.
Tensor packed(Layout layout, int64_t total, int64_t H, int64_t W, uint64_t seed) {
  if (layout == Layout::kStridedD)  // last dim not contiguous: the entry point copies
    return randn_bf16({total, W, H}, seed).transpose(1, 2);
  return randn_bf16({total, H, W}, seed);
}

Inputs make_inputs(const Case& c, uint64_t seed) {
  Inputs in;
  const int64_t tq = total(c.lens_q), tk = total(c.lens_k);
  if (c.layout == Layout::kFusedQkv) {
    // One bf16 (total, Hq·D + Hkv·D + Hkv·Dv) buffer, read in place (Tq_b = Tk_b).
    const int64_t width = c.Hq * c.D + c.Hkv * c.D + c.Hkv * c.Dv;
    const Tensor qkv = randn_bf16({tq, width}, seed);
    in.q = qkv.slice(1, 0, c.Hq * c.D).view({tq, c.Hq, c.D});
    in.k = qkv.slice(1, c.Hq * c.D, (c.Hq + c.Hkv) * c.D).view({tk, c.Hkv, c.D});
    in.v = qkv.slice(1, (c.Hq + c.Hkv) * c.D, width).view({tk, c.Hkv, c.Dv});
  } else {
    in.q = packed(c.layout, tq, c.Hq, c.D, seed);
    in.k = packed(c.layout, tk, c.Hkv, c.D, seed + 1);
    in.v = packed(c.layout, tk, c.Hkv, c.Dv, seed + 2);
  }
  in.dout = randn_bf16({tq, c.Hq, c.Dv}, seed + 3);
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

// Forward, then backward from the forward's out and lse (unless `out` is given).
Result run(const Inputs& in, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& dout,
           SdpaBackend backend, const Tensor* out = nullptr) {
  SdpaOptions o = in.opt;
  o.backend = backend;
  Result r;
  r.f = attn::sdpa_varlen_forward(q, k, v, in.cu_q, in.cu_k, in.max_q, in.max_k, o);
  r.g = attn::sdpa_varlen_backward(dout, q, k, v, out ? *out : r.f.out, r.f.lse, in.cu_q, in.cu_k,
                                   in.max_q, in.max_k, o);
  return r;
}

Result run(const Inputs& in, SdpaBackend backend) {
  return run(in, in.q, in.k, in.v, in.dout, backend);
}


// The largest |got − want| / (round · |want| + tol · max(1, max |want|) + extra[n]): <= 1
// passes.
double bound_ratio(const Tensor& got, const Tensor& want, double round, double tol,
                   const std::vector<double>& extra = {}) {
  EXPECT_EQ(got.shape(), want.shape());
  const std::vector<float> x = got.to_vector(), y = want.to_vector();
  double scale = 1.0;
  for (float w : y) scale = std::max(scale, double(std::fabs(w)));
  double worst = 0.0;
  for (size_t n = 0; n < x.size(); ++n) {
    if (std::isnan(x[n]) || std::isnan(y[n])) return kInf;
    const double err = std::fabs(double(x[n]) - double(y[n]));
    const double more = extra.empty() ? 0.0 : extra[n];
    worst = std::max(worst, err / (round * std::fabs(double(y[n])) + tol * scale + more));
  }
  return worst;
}

struct Worst {
  double out = 0, lse = 0, dq = 0, dv = 0, dk = 0;
} g_worst;

// 1. against the fp32 varlen kernel on the widened values (bits);
// 2. the bf16 reference = the fp32 reference rounded (bits), and the kernel within bf16's
//    rounding of the fp32 reference (the specification).
void compare(const Case& c, uint64_t seed, bool against_spec = true) {
  const Inputs in = make_inputs(c, seed);
  const Tensor q = in.q.to(kF32), k = in.k.to(kF32), v = in.v.to(kF32), dout = in.dout.to(kF32);
  const Result bf = run(in, SdpaBackend::kFused);
  const int64_t tq = total(c.lens_q), tk = total(c.lens_k);
  ASSERT_EQ(bf.f.out.dtype(), kBf16);
  ASSERT_EQ(bf.f.lse.dtype(), kF32);
  ASSERT_EQ(bf.g.dq.dtype(), kBf16);
  ASSERT_EQ(bf.g.dk.dtype(), kBf16);
  ASSERT_EQ(bf.g.dv.dtype(), kBf16);
  EXPECT_EQ(bf.f.out.shape(), (Shape{tq, c.Hq, c.Dv}));
  EXPECT_EQ(bf.f.lse.shape(), (Shape{c.Hq, tq}));
  EXPECT_EQ(bf.g.dk.shape(), (Shape{tk, c.Hkv, c.D}));

  // 1. The fp32 varlen kernel on the widened values, rounded once.
  const Tensor out_wide = bf.f.out.to(kF32);
  const Result wide = run(in, q, k, v, dout, SdpaBackend::kFused, &out_wide);
  EXPECT_TRUE(same_bits(bf.f.out, wide.f.out.to(kBf16))) << "out";
  EXPECT_TRUE(same_bits(bf.f.lse, wide.f.lse)) << "lse";
  EXPECT_TRUE(same_bits(bf.g.dq, wide.g.dq.to(kBf16))) << "dq";
  EXPECT_TRUE(same_bits(bf.g.dk, wide.g.dk.to(kBf16))) << "dk";
  EXPECT_TRUE(same_bits(bf.g.dv, wide.g.dv.to(kBf16))) << "dv";
  if (!against_spec) return;

  // 2. The specification on the widened values, and its bf16 rounding.
  const Result spec = run(in, q, k, v, dout, SdpaBackend::kReference);
  const Result spec_bf16 = run(in, SdpaBackend::kReference);
  ASSERT_EQ(spec_bf16.f.out.dtype(), kBf16);
  ASSERT_EQ(spec_bf16.g.dq.dtype(), kBf16);
  EXPECT_TRUE(same_bits(spec_bf16.f.out, spec.f.out.to(kBf16)));
  EXPECT_TRUE(same_bits(spec_bf16.f.lse, spec.f.lse));
  EXPECT_TRUE(same_bits(spec_bf16.g.dq, spec.g.dq.to(kBf16)));
  EXPECT_TRUE(same_bits(spec_bf16.g.dk, spec.g.dk.to(kBf16)));
  EXPECT_TRUE(same_bits(spec_bf16.g.dv, spec.g.dv.to(kBf16)));
  const double out_ratio = bound_ratio(bf.f.out, spec.f.out, kRound, kRelTol);
  EXPECT_LE(out_ratio, 1.0) << "out";
  const double lse_ratio = bound_ratio(bf.f.lse, spec.f.lse, 0.0, kRelTol);
  EXPECT_LE(lse_ratio, 1.0) << "lse";
  const std::vector<float> lse = bf.f.lse.to_vector(), lse_spec = spec.f.lse.to_vector();
  for (size_t n = 0; n < lse.size(); ++n)
    if (lse_spec[n] == -kInf) {
      ASSERT_EQ(lse[n], -kInf) << "lse[" << n << "]";
    }
  // dq's extra term per element (i, h, d), i in sequence b:
  // scale · |ΔD_(i, h)| · max over sequence b's keys j of |k[j, h / group, d]|.
  const std::vector<float> o_bf = bf.f.out.to_vector(), o_ref = spec.f.out.to_vector();
  const std::vector<float> dov = dout.contiguous().to_vector(), kv = k.contiguous().to_vector();
  const std::vector<float> qv = q.contiguous().to_vector();
  const double scale = 1.0 / std::sqrt(double(c.D));
  const int64_t group = c.Hq / c.Hkv;
  double out_scale = 1.0;  // the reference's out is within kRelTol · out_scale of the exact one
  for (float x : o_ref) out_scale = std::max(out_scale, double(std::fabs(x)));
  std::vector<double> dq_extra(size_t(tq * c.Hq * c.D), 0.0);
  std::vector<double> dk_extra(size_t(tk * c.Hkv * c.D), 0.0);
  int64_t q0 = 0, k0 = 0;
  for (int64_t b = 0; b < c.nseq(); ++b) {
    const int64_t nq = c.lens_q[size_t(b)], nk = c.lens_k[size_t(b)];
    std::vector<double> k_max(size_t(c.Hkv * c.D), 0.0);  // (Hkv, D) over the sequence's keys
    std::vector<double> dk_sum(size_t(c.Hkv * c.D), 0.0);  // (Hkv, D) dk's D term
    for (int64_t j = k0; j < k0 + nk; ++j)
      for (int64_t n = 0; n < c.Hkv * c.D; ++n)
        k_max[size_t(n)] =
            std::max(k_max[size_t(n)], double(std::fabs(kv[size_t(j * c.Hkv * c.D + n)])));
    for (int64_t i = q0; i < q0 + nq; ++i)
      for (int64_t h = 0; h < c.Hq; ++h) {
        double dD = 0.0;
        for (int64_t d = 0; d < c.Dv; ++d) {
          const size_t at = size_t((i * c.Hq + h) * c.Dv + d);
          dD += std::fabs(double(dov[at])) *
                (std::fabs(double(o_bf[at]) - double(o_ref[at])) + kRelTol * out_scale);
        }
        dD *= 1.0 + kRound;  // dq' = x + Δ is rounded: 2^-8 |Δ| more
        for (int64_t d = 0; d < c.D; ++d) {
          dq_extra[size_t((i * c.Hq + h) * c.D + d)] =
              scale * dD * k_max[size_t((h / group) * c.D + d)];
          dk_sum[size_t((h / group) * c.D + d)] +=
              scale * dD * std::fabs(double(qv[size_t((i * c.Hq + h) * c.D + d)]));
        }
      }
    for (int64_t j = k0; j < k0 + nk; ++j)
      std::copy(dk_sum.begin(), dk_sum.end(), dk_extra.begin() + j * c.Hkv * c.D);
    q0 += nq, k0 += nk;
  }
  const double dq_ratio = bound_ratio(bf.g.dq, spec.g.dq, kRound, kRelTol, dq_extra);
  EXPECT_LE(dq_ratio, 1.0) << "dq";
  const double dv_ratio = bound_ratio(bf.g.dv, spec.g.dv, kRound, kRelTol);
  EXPECT_LE(dv_ratio, 1.0) << "dv";
  const double dk_ratio = bound_ratio(bf.g.dk, spec.g.dk, kRound, kRelTol, dk_extra);
  EXPECT_LE(dk_ratio, 1.0) << "dk";
  g_worst.out = std::max(g_worst.out, out_ratio);
  g_worst.lse = std::max(g_worst.lse, lse_ratio);
  g_worst.dq = std::max(g_worst.dq, dq_ratio);
  g_worst.dv = std::max(g_worst.dv, dv_ratio);
  g_worst.dk = std::max(g_worst.dk, dk_ratio);
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

// These tests pin the widened path's contract (its bits are the fp32 kernel's on
// the widened values), so they force the core's bf16 path to "widened to fp32",
// which keeps scaled_dot_product_attention off its AMX route (attn/sdpa.h);
// test_sdpa_amx.cpp tests that route.
class SdpaVarlenBf16 : public ::testing::Test {
  attn::test::Bf16PathGuard widened_{"widened to fp32"};
};

TEST_F(SdpaVarlenBf16, FusedMatchesReferenceInBfloat16) {
  std::mt19937 gen(2024);
  std::vector<Case> cases;
  for (int n = 0; n < 50; ++n) cases.push_back(random_case(gen));
  {
    Case c;  // hand-picked: lengths on both sides of the tiles, Tq_b != Tk_b, ALiBi per sequence
    c.lens_q = {1, 0, 17, 64, 65, 7, 130};
    c.lens_k = {1, 5, 63, 64, 200, 130, 7};
    c.Hq = 4, c.Hkv = 2, c.D = 32, c.Dv = 48, c.causal = true;
    c.align = CausalAlignment::kBottomRight, c.alibi = Alibi::kPerSequence, c.softcap = 5.0f;
    cases.push_back(c);
    c.lens_q = c.lens_k = {300, 257, 1};  // a window much shorter than the sequences
    c.Hq = 2, c.Hkv = 1, c.D = 17, c.Dv = 17, c.left = 20, c.alibi = Alibi::kNone;
    c.softcap = 0.0f, c.align = CausalAlignment::kTopLeft;
    cases.push_back(c);
  }
  for (int n = 0; n < int(cases.size()); ++n) {
    SCOPED_TRACE(describe(cases[size_t(n)]));
    compare(cases[size_t(n)], uint64_t(7000 + n));
    if (HasFatalFailure()) return;
  }
  std::cout << "[sdpa varlen bf16] largest error / bound over " << cases.size()
            << " packed batches: out " << g_worst.out << ", lse " << g_worst.lse << ", dq "
            << g_worst.dq << ", dk " << g_worst.dk << ", dv " << g_worst.dv << "\n";
}

TEST_F(SdpaVarlenBf16, EverySimdTargetMatchesTheFp32Kernel) {
  std::mt19937 gen(11);
  std::vector<Case> cases;
  for (int n = 0; n < 6; ++n) cases.push_back(random_case(gen));
  for (const std::string& target : attn::kernels::flash_attention_targets()) {
    ASSERT_TRUE(attn::kernels::flash_attention_use_target(target.c_str()));
    for (int n = 0; n < int(cases.size()); ++n) {
      SCOPED_TRACE(target + ": " + describe(cases[size_t(n)]));
      compare(cases[size_t(n)], uint64_t(800 + n), /*against_spec=*/false);
    }
  }
  ASSERT_TRUE(attn::kernels::flash_attention_use_target(nullptr));
}

// Each sequence through the batched bf16 entry point alone ((1, H, T, D) views
// of its rows): the same bits, forward and backward, kernel and reference.
TEST_F(SdpaVarlenBf16, EachSequenceEqualsTheBatchedBf16CallOnItAlone) {
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
      const Inputs in = make_inputs(k, 43);
      const Result all = run(in, backend);
      int64_t q0 = 0, k0 = 0;
      for (int64_t b = 0; b < k.nseq(); ++b) {
        const int64_t tq = k.lens_q[size_t(b)], tk = k.lens_k[size_t(b)];
        SCOPED_TRACE("sequence " + std::to_string(b));
        const Tensor out_b = all.f.out.slice(0, q0, q0 + tq), dq_b = all.g.dq.slice(0, q0, q0 + tq);
        const Tensor dk_b = all.g.dk.slice(0, k0, k0 + tk), dv_b = all.g.dv.slice(0, k0, k0 + tk);
        if (tq > 0 && tk == 0) {  // no key: output 0, lse -inf, no gradient
          for (float x : out_b.to_vector()) EXPECT_EQ(x, 0.0f);
          for (float x : dq_b.to_vector()) EXPECT_EQ(x, 0.0f);
          for (int64_t h = 0; h < k.Hq; ++h)
            for (int64_t i = q0; i < q0 + tq; ++i) EXPECT_EQ(all.f.lse.at({h, i}), -kInf);
        } else if (tq == 0 && tk > 0) {  // no query: dk, dv 0
          for (float x : dk_b.to_vector()) EXPECT_EQ(x, 0.0f);
          for (float x : dv_b.to_vector()) EXPECT_EQ(x, 0.0f);
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
          ASSERT_EQ(f.out.dtype(), kBf16);
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

// 1 and 2 threads: the same bits (2 sequences x 1 key/value head take the
// split backward on 2 threads and the whole-unit one on 1; 5 x 2 the latter on both).
TEST_F(SdpaVarlenBf16, BitIdenticalForAnyThreadCountInBfloat16) {
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
    const Inputs in = make_inputs(k, 101);
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

// Every sequence empty, or no key at all: bf16 zeros, lse -inf.
TEST_F(SdpaVarlenBf16, EmptyTotalsGiveBf16Zeros) {
  Case c;
  c.lens_q = {0, 3}, c.lens_k = {0, 0};
  c.Hq = 2, c.Hkv = 2, c.D = 8, c.Dv = 8;
  const Inputs in = make_inputs(c, 5);
  for (SdpaBackend backend : {SdpaBackend::kFused, SdpaBackend::kReference}) {
    const Result r = run(in, backend);
    EXPECT_EQ(r.f.out.dtype(), kBf16);
    EXPECT_EQ(r.g.dq.dtype(), kBf16);
    EXPECT_EQ(r.g.dk.dtype(), kBf16);
    EXPECT_EQ(r.f.out.shape(), (Shape{3, 2, 8}));
    for (float x : r.f.out.to_vector()) EXPECT_EQ(x, 0.0f);
    for (float x : r.f.lse.to_vector()) EXPECT_EQ(x, -kInf);
    for (float x : r.g.dq.to_vector()) EXPECT_EQ(x, 0.0f);
  }
}

void expect_error(const std::function<void()>& f, const std::string& fragment) {
  try {
    f();
    ADD_FAILURE() << "no exception; expected one containing: " << fragment;
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
  }
}

TEST_F(SdpaVarlenBf16, BadDtypesThrowNamingThem) {
  Case c;
  c.lens_q = {5, 2}, c.lens_k = {6, 3};
  c.Hq = 2, c.Hkv = 2, c.D = 8, c.Dv = 8;
  const Inputs in = make_inputs(c, 9);
  for (SdpaBackend backend : {SdpaBackend::kFused, SdpaBackend::kReference}) {
    SdpaOptions o = in.opt;
    o.backend = backend;
    auto forward = [&](const Tensor& q, const Tensor& k, const Tensor& v) {
      return [=] { attn::sdpa_varlen_forward(q, k, v, in.cu_q, in.cu_k, in.max_q, in.max_k, o); };
    };
    expect_error(forward(in.q, in.k.to(kF32), in.v),
                 "sdpa_varlen: q, k and v must have the same dtype, got q bfloat16, k float32, v "
                 "bfloat16");
    expect_error(forward(Tensor::zeros({7, 2, 8}, DType::kInt64), in.k, in.v),
                 "q has dtype int64; q, k and v must be float32 or bfloat16");
    SdpaOptions a = o;
    a.alibi_slopes = Tensor({2}).to(kBf16);
    expect_error(
        [&] {
          attn::sdpa_varlen_forward(in.q, in.k, in.v, in.cu_q, in.cu_k, in.max_q, in.max_k, a);
        },
        "alibi_slopes has dtype bfloat16; only float32 is supported");
    const attn::SdpaForward f =
        attn::sdpa_varlen_forward(in.q, in.k, in.v, in.cu_q, in.cu_k, in.max_q, in.max_k, o);
    ASSERT_EQ(f.out.dtype(), kBf16);
    auto backward = [&](const Tensor& dout, const Tensor& out, const Tensor& lse) {
      return [=] {
        attn::sdpa_varlen_backward(dout, in.q, in.k, in.v, out, lse, in.cu_q, in.cu_k, in.max_q,
                                   in.max_k, o);
      };
    };
    expect_error(backward(in.dout.to(kF32), f.out, f.lse),
                 "dout has dtype float32 but q, k and v have bfloat16");
    expect_error(backward(in.dout, f.out.to(kF32), f.lse),
                 "out has dtype float32 but q, k and v have bfloat16");
    expect_error(backward(in.dout, f.out, f.lse.to(kBf16)),
                 "lse has dtype bfloat16; only float32 is supported");
  }
}

}  // namespace
