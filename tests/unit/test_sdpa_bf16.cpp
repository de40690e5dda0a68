// scaled_dot_product_attention (attn/sdpa.h) on bfloat16 q, k, v, dout: the
// fused kernel against the fp32 kernel and the reference, on many random
// configurations of every option (Tq != Tk with both causal alignments, GQA,
// boolean and additive masks of each broadcast shape, windows, ALiBi, softcap,
// dropout, D != Dv, odd sizes, strided and fused-qkv inputs), on every SIMD
// target this CPU runs; 1 and 2 threads bit-identical; fully masked rows;
// dtype errors.
//
// What is checked, and why those bounds:
// 1. Exactly the contract: the bf16 kernel gives the bits of the fp32 kernel
//    run on the widened inputs (bf16 -> fp32 is exact), rounded once to bf16
//    (out, dq, dk, dv; lse the same fp32 bits). The backward's fp32 run is
//    given the bf16 out, widened, as the bf16 backward reads it.
// 2. Against the specification (ref::sdpa_* on the widened inputs, x in
//    fp32): out and dv within |round(x') - x| <= 2^-8 |x'| + |x' - x|, where
//    x' is the fp32 kernel's value, |x' - x| <= ε = 2e-5 · max(1, max |x|) (the
//    fp32 kernel's bound, tests/unit/test_sdpa.cpp) and 2^-8 is bf16's unit
//    roundoff (8 significant bits, round to nearest); lse within ε.
//    dq and dk have one more term: the kernel's D_i = Σ_d dO[i, d] O[i, d]
//    reads the bf16 out it is given (as PyTorch's and FlashAttention's bf16
//    backward do), the reference recomputes D from P. That moves dS[i, j] =
//    P[i, j] (dP[i, j] - D_i) by P[i, j] ΔD_i, with |ΔD_i| <= Σ_d |dO[i, d]|
//    |O_bf16[i, d] - O[i, d]| (computed here from the two outs), hence
//    dq[i, d] by at most scale · |ΔD_i| · max |k[·, d]| (Σ_j P[i, j] = 1; the
//    softcap's factor is <= 1), added to dq's bound per element (times 1 + 2^-8:
//    the rounding of dq applies to that part too). For dk the
//    sum runs over queries (Σ_i P[i, j] is not bounded by 1), so dk gets a
//    per-tensor 2^-6 · max(1, max |x|) instead (largest seen: printed).
//    The bf16 reference (the spec's outputs rounded) and the kernel's bf16
//    out agree bit for bit except where x lies within the fp32 error of a
//    bf16 rounding boundary: at least 99% of the elements are identical.
#include <fmt/format.h>
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
using attn::MaskType;
using attn::SdpaBackend;
using attn::SdpaOptions;
using attn::Shape;
using attn::Tensor;

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr DType kBf16 = DType::kBFloat16, kF32 = DType::kFloat32;
constexpr double kRelTol = 2e-5;         // the fp32 kernel against the reference
constexpr double kRound = 1.0 / 256.0;   // 2^-8: bf16's unit roundoff
constexpr double kGradTol = 1.0 / 64.0;  // 2^-6: the gradients' D term (above)

enum class Layout { kHeadMajor, kTokenMajor, kFusedQkv, kStridedD };
enum class MaskKind { kNone, kBool, kAdditive };

struct Case {
  int64_t B = 1, Hq = 1, Hkv = 1, Tq = 1, Tk = 1, D = 16, Dv = 16;
  bool causal = false;
  CausalAlignment align = CausalAlignment::kTopLeft;
  int64_t left = -1, right = -1;
  bool alibi = false;
  float softcap = 0.0f;
  MaskKind mask = MaskKind::kNone;
  Shape mask_shape;
  Layout layout = Layout::kHeadMajor;
  float dropout_p = 0.0f;
};

std::string describe(const Case& c) {
  std::string s =
      fmt::format("B{} Hq{} Hkv{} Tq{} Tk{} D{} Dv{}", c.B, c.Hq, c.Hkv, c.Tq, c.Tk, c.D, c.Dv);
  if (c.causal)
    s += c.align == CausalAlignment::kTopLeft ? " causal(top-left)" : " causal(bottom-right)";
  if (c.left >= 0 || c.right >= 0) s += fmt::format(" window({}, {})", c.left, c.right);
  if (c.alibi) s += " alibi";
  if (c.softcap > 0.0f) s += fmt::format(" softcap {}", c.softcap);
  if (c.mask != MaskKind::kNone)
    s += fmt::format(" {} mask {}", c.mask == MaskKind::kBool ? "bool" : "additive",
                     attn::shape_str(c.mask_shape));
  s += c.layout == Layout::kHeadMajor    ? " head-major"
       : c.layout == Layout::kTokenMajor ? " token-major"
       : c.layout == Layout::kFusedQkv   ? " fused-qkv"
                                         : " strided-D";
  if (c.dropout_p > 0.0f) s += fmt::format(" dropout {}", c.dropout_p);
  return s;
}

// N(0, 1) values rounded to bf16.
Tensor randn_bf16(const Shape& shape, uint64_t seed) {
  return attn::test::random_tensor(shape, seed).to(kBf16);
}

Tensor in_layout(Layout layout, int64_t B, int64_t H, int64_t T, int64_t W, uint64_t seed) {
  switch (layout) {
    case Layout::kHeadMajor:
      return randn_bf16({B, H, T, W}, seed);
    case Layout::kTokenMajor:
      return randn_bf16({B, T, H, W}, seed).transpose(1, 2);
    case Layout::kStridedD:
      return randn_bf16({B, H, W, T}, seed).transpose(2, 3);
    case Layout::kFusedQkv:
      break;
  }
  return {};
}

struct Inputs {
  Tensor q, k, v, dout;  // bf16
  SdpaOptions opt;
};

Inputs make_inputs(const Case& c, uint64_t seed) {
  Inputs in;
  if (c.layout == Layout::kFusedQkv) {
    const int64_t width = c.Hq * c.D + c.Hkv * c.D + c.Hkv * c.Dv;
    const Tensor qkv = randn_bf16({c.B, c.Tq, width}, seed);
    in.q = qkv.slice(2, 0, c.Hq * c.D).view({c.B, c.Tq, c.Hq, c.D}).transpose(1, 2);
    in.k = qkv.slice(2, c.Hq * c.D, (c.Hq + c.Hkv) * c.D)
               .view({c.B, c.Tk, c.Hkv, c.D})
               .transpose(1, 2);
    in.v = qkv.slice(2, (c.Hq + c.Hkv) * c.D, width).view({c.B, c.Tk, c.Hkv, c.Dv}).transpose(1, 2);
  } else {
    in.q = in_layout(c.layout, c.B, c.Hq, c.Tq, c.D, seed);
    in.k = in_layout(c.layout, c.B, c.Hkv, c.Tk, c.D, seed + 1);
    in.v = in_layout(c.layout, c.B, c.Hkv, c.Tk, c.Dv, seed + 2);
  }
  in.dout = randn_bf16({c.B, c.Hq, c.Tq, c.Dv}, seed + 3);
  SdpaOptions& o = in.opt;
  o.is_causal = c.causal;
  o.causal_alignment = c.align;
  o.window_left = c.left, o.window_right = c.right;
  o.enable_gqa = c.Hq != c.Hkv;
  o.softcap = c.softcap;
  o.dropout_p = c.dropout_p;
  o.dropout_seed = 0xB16 + seed;
  if (c.alibi) {
    Tensor slopes({c.Hq});
    for (int64_t h = 0; h < c.Hq; ++h)
      slopes[h] = std::pow(2.0f, -8.0f * float(h + 1) / float(c.Hq));
    o.alibi_slopes = slopes;
  }
  if (c.mask != MaskKind::kNone) {
    std::mt19937 gen{uint32_t(seed)};
    std::uniform_real_distribution<float> u(0.0f, 1.0f);
    Tensor m(c.mask_shape);
    for (int64_t n = 0; n < m.numel(); ++n) {
      const bool keep = u(gen) < 0.8f;
      m[n] =
          c.mask == MaskKind::kBool ? (keep ? 1.0f : 0.0f) : (keep ? 2.0f * u(gen) - 1.0f : -kInf);
    }
    o.attn_mask = m;
    o.attn_mask_type = c.mask == MaskKind::kBool ? MaskType::kBoolean : MaskType::kAdditive;
  }
  return in;
}

Case random_case(std::mt19937& gen, bool small) {
  auto pick = [&](const std::vector<int64_t>& v) {
    return v[std::uniform_int_distribution<size_t>(0, v.size() - 1)(gen)];
  };
  auto chance = [&](double p) { return std::uniform_real_distribution<double>(0, 1)(gen) < p; };
  Case c;
  c.B = pick({1, 2, 3});
  c.Hkv = pick({1, 2, 3});
  c.Hq = c.Hkv * pick({1, 1, 2, 4, 8});
  if (c.Hq > 8) c.Hq = c.Hkv;
  const std::vector<int64_t> T = small ? std::vector<int64_t>{1, 3, 15, 16, 17, 31, 33, 64, 65}
                                       : std::vector<int64_t>{1, 17, 63, 64, 65, 127, 129, 200};
  c.Tq = pick(T);
  c.Tk = chance(0.5) ? c.Tq : pick(T);
  c.D = pick({1, 3, 15, 16, 17, 32, 33, 64, 80, 128});
  c.Dv = chance(0.6) ? c.D : pick({1, 7, 16, 31, 64, 96});
  c.causal = chance(0.5);
  c.align = chance(0.5) ? CausalAlignment::kTopLeft : CausalAlignment::kBottomRight;
  if (chance(0.35)) {
    c.left = pick({-1, 0, 1, 5, 16, 40});
    c.right = pick({-1, 0, 3, 17});
  }
  c.alibi = chance(0.25);
  c.softcap = chance(0.25) ? 2.0f : 0.0f;
  const int64_t m = pick({0, 0, 1, 2});
  if (m != 0) {
    c.mask = m == 1 ? MaskKind::kBool : MaskKind::kAdditive;
    const std::vector<Shape> shapes = {
        {c.Tq, c.Tk}, {c.B, 1, 1, c.Tk}, {1, c.Hq, c.Tq, c.Tk}, {c.B, c.Hq, c.Tq, c.Tk},
        {c.Tk},       {c.B, 1, c.Tq, 1}, {c.Hq, 1, c.Tk}};
    c.mask_shape = shapes[std::uniform_int_distribution<size_t>(0, shapes.size() - 1)(gen)];
  }
  const int64_t layout = pick({0, 0, 1, 2, 3});
  c.layout = layout == 1                   ? Layout::kTokenMajor
             : layout == 2 && c.Tq == c.Tk ? Layout::kFusedQkv
             : layout == 3                 ? Layout::kStridedD
                                           : Layout::kHeadMajor;
  c.dropout_p = chance(0.15) ? 0.25f : 0.0f;
  return c;
}

struct Result {
  attn::SdpaForward f;
  attn::SdpaGrads g;
};

// Forward, then backward from the forward's out and lse (unless `out` is given).
Result run(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& dout, SdpaOptions o,
           SdpaBackend backend, const Tensor* out = nullptr) {
  o.backend = backend;
  Result r;
  r.f = attn::scaled_dot_product_attention_forward(q, k, v, o);
  r.g =
      attn::scaled_dot_product_attention_backward(dout, q, k, v, out ? *out : r.f.out, r.f.lse, o);
  return r;
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

// The fraction of elements with the same bits.
double identical_fraction(const Tensor& a, const Tensor& b) {
  const std::vector<float> x = a.to_vector(), y = b.to_vector();
  size_t same = 0;
  for (size_t n = 0; n < x.size(); ++n) same += std::memcmp(&x[n], &y[n], sizeof(float)) == 0;
  return x.empty() ? 1.0 : double(same) / double(x.size());
}

struct Worst {
  double out = 0, lse = 0, dq = 0, dv = 0, dk = 0, identical = 1;
} g_worst;

void compare(const Case& c, uint64_t seed) {
  const Inputs in = make_inputs(c, seed);
  const Tensor q = in.q.to(kF32), k = in.k.to(kF32), v = in.v.to(kF32), dout = in.dout.to(kF32);
  const Result bf = run(in.q, in.k, in.v, in.dout, in.opt, SdpaBackend::kFused);
  ASSERT_EQ(bf.f.out.dtype(), kBf16);
  ASSERT_EQ(bf.f.lse.dtype(), kF32);
  ASSERT_EQ(bf.g.dq.dtype(), kBf16);
  ASSERT_EQ(bf.g.dk.dtype(), kBf16);
  ASSERT_EQ(bf.g.dv.dtype(), kBf16);

  // 1. The fp32 kernel on the widened values, rounded once.
  const Tensor out_wide = bf.f.out.to(kF32);
  const Result wide = run(q, k, v, dout, in.opt, SdpaBackend::kFused, &out_wide);
  EXPECT_TRUE(same_bits(bf.f.out, wide.f.out.to(kBf16))) << "out";
  EXPECT_TRUE(same_bits(bf.f.lse, wide.f.lse)) << "lse";
  EXPECT_TRUE(same_bits(bf.g.dq, wide.g.dq.to(kBf16))) << "dq";
  EXPECT_TRUE(same_bits(bf.g.dk, wide.g.dk.to(kBf16))) << "dk";
  EXPECT_TRUE(same_bits(bf.g.dv, wide.g.dv.to(kBf16))) << "dv";

  // 2. The specification on the widened values, and its bf16 rounding.
  const Result spec = run(q, k, v, dout, in.opt, SdpaBackend::kReference);
  const Result spec_bf16 = run(in.q, in.k, in.v, in.dout, in.opt, SdpaBackend::kReference);
  ASSERT_EQ(spec_bf16.f.out.dtype(), kBf16);
  ASSERT_EQ(spec_bf16.g.dq.dtype(), kBf16);
  EXPECT_TRUE(same_bits(spec_bf16.f.out, spec.f.out.to(kBf16)));
  EXPECT_TRUE(same_bits(spec_bf16.g.dk, spec.g.dk.to(kBf16)));
  const double out_ratio = bound_ratio(bf.f.out, spec.f.out, kRound, kRelTol);
  EXPECT_LE(out_ratio, 1.0) << "out";
  const double lse_ratio = bound_ratio(bf.f.lse, spec.f.lse, 0.0, kRelTol);
  EXPECT_LE(lse_ratio, 1.0) << "lse";
  const std::vector<float> lse = bf.f.lse.to_vector(), lse_spec = spec.f.lse.to_vector();
  for (size_t n = 0; n < lse.size(); ++n)
    if (lse_spec[n] == -kInf) {
      ASSERT_EQ(lse[n], -kInf) << "lse[" << n << "]";
    }
  // dq's extra term per element (b, h, i, d): scale · |ΔD_i| · max_j |k[b, h / group, j, d]|.
  const std::vector<float> o_bf = bf.f.out.to_vector(), o_ref = spec.f.out.to_vector();
  const std::vector<float> dov = dout.contiguous().to_vector(), kv = k.contiguous().to_vector();
  const double scale = 1.0 / std::sqrt(double(c.D));
  std::vector<double> k_max(size_t(c.B * c.Hkv * c.D), 0.0);  // (B, Hkv, D)
  for (int64_t n = 0; n < c.B * c.Hkv * c.Tk * c.D; ++n) {
    const size_t at = size_t(n / (c.Tk * c.D) * c.D + n % c.D);
    k_max[at] = std::max(k_max[at], double(std::fabs(kv[size_t(n)])));
  }
  double out_scale = 1.0;  // the reference's out is within kRelTol · out_scale of the exact one
  for (float x : o_ref) out_scale = std::max(out_scale, double(std::fabs(x)));
  std::vector<double> dq_extra(size_t(c.B * c.Hq * c.Tq * c.D));
  for (int64_t row = 0; row < c.B * c.Hq * c.Tq; ++row) {
    double dD = 0.0;
    for (int64_t d = 0; d < c.Dv; ++d) {
      const size_t at = size_t(row * c.Dv + d);
      dD += std::fabs(double(dov[at])) *
            (std::fabs(double(o_bf[at]) - double(o_ref[at])) + kRelTol * out_scale);
    }
    dD *= 1.0 + kRound;  // dq' = x + Δ is rounded: 2^-8 |Δ| more
    const int64_t b = row / (c.Hq * c.Tq), hk = row / c.Tq % c.Hq / (c.Hq / c.Hkv);
    for (int64_t d = 0; d < c.D; ++d)
      dq_extra[size_t(row * c.D + d)] = scale * dD * k_max[size_t((b * c.Hkv + hk) * c.D + d)];
  }
  const double dq_ratio = bound_ratio(bf.g.dq, spec.g.dq, kRound, kRelTol, dq_extra);
  EXPECT_LE(dq_ratio, 1.0) << "dq";
  const double dv_ratio = bound_ratio(bf.g.dv, spec.g.dv, kRound, kRelTol);
  EXPECT_LE(dv_ratio, 1.0) << "dv";
  const double dk_ratio = bound_ratio(bf.g.dk, spec.g.dk, kRound, kRelTol + kGradTol);
  EXPECT_LE(dk_ratio, 1.0) << "dk";
  // dk's error beyond the rounding, in units of max(1, max |x|)
  const double dk_seen = bound_ratio(bf.g.dk, spec.g.dk, kRound, 1.0);
  const double identical = identical_fraction(bf.f.out, spec_bf16.f.out);
  EXPECT_GE(identical, 0.99) << "out bits identical to the bf16 reference";
  g_worst.out = std::max(g_worst.out, out_ratio);
  g_worst.lse = std::max(g_worst.lse, lse_ratio);
  g_worst.dq = std::max(g_worst.dq, dq_ratio);
  g_worst.dv = std::max(g_worst.dv, dv_ratio);
  g_worst.dk = std::max(g_worst.dk, dk_seen);
  g_worst.identical = std::min(g_worst.identical, identical);
}

// These tests pin the widened path's contract (its bits are the fp32 kernel's on
// the widened values), so they force the core's bf16 path to "widened to fp32",
// which keeps scaled_dot_product_attention off its AMX route (attn/sdpa.h);
// test_sdpa_amx.cpp tests that route.
class SdpaBf16 : public ::testing::Test {
  attn::test::Bf16PathGuard widened_{"widened to fp32"};
};

TEST_F(SdpaBf16, FusedMatchesFp32KernelAndReferenceOnRandomConfigurations) {
  std::mt19937 gen(2016);
  for (int n = 0; n < 120; ++n) {
    const Case c = random_case(gen, n % 4 != 3);
    SCOPED_TRACE(describe(c));
    compare(c, uint64_t(3000 + n));
    if (HasFatalFailure()) return;
  }
  std::cout << fmt::format(
      "[sdpa bf16] largest error / bound: out {:.3f}, lse {:.3f}, dq {:.3f}, dv {:.3f}; dk "
      "beyond 2^-8 |x|: {:.2e} max(1, max |x|); out bits identical to the bf16 reference >= "
      "{:.4f}\n",
      g_worst.out, g_worst.lse, g_worst.dq, g_worst.dv, g_worst.dk, g_worst.identical);
}

TEST_F(SdpaBf16, FusedMatchesOnEdgeCases) {
  std::vector<Case> cases;
  for (int64_t T : {1, 15, 16, 17, 63, 64, 65, 129}) {
    Case c;
    c.B = 2, c.Hq = 2, c.Hkv = 2, c.Tq = T, c.Tk = T, c.D = 64, c.Dv = 64, c.causal = true;
    cases.push_back(c);
  }
  for (auto align : {CausalAlignment::kTopLeft, CausalAlignment::kBottomRight})
    for (auto [Tq, Tk] : {std::pair<int64_t, int64_t>{1, 100}, {7, 130}, {130, 7}, {64, 200}}) {
      Case c;
      c.Hq = 4, c.Hkv = 2, c.Tq = Tq, c.Tk = Tk, c.D = 32, c.Dv = 48, c.causal = true,
      c.align = align;
      cases.push_back(c);
      c.causal = false, c.left = 9, c.right = 2;
      cases.push_back(c);
    }
  for (int64_t ratio : {1, 2, 4, 8}) {
    Case c;
    c.Hkv = ratio == 8 ? 1 : 2, c.Hq = c.Hkv * ratio, c.Tq = 70, c.Tk = 70, c.D = 16, c.Dv = 16;
    c.causal = true;
    cases.push_back(c);
  }
  {
    Case c;
    c.Hq = 2, c.Hkv = 2, c.Tq = 300, c.Tk = 300, c.D = 32, c.Dv = 32, c.causal = true, c.left = 20;
    c.alibi = true, c.softcap = 5.0f;
    cases.push_back(c);
  }
  for (int64_t D : {1, 3, 7, 17, 100, 256}) {
    Case c;
    c.Hq = 2, c.Hkv = 1, c.Tq = 33, c.Tk = 47, c.D = D, c.Dv = D == 256 ? 8 : D + 1;
    c.layout = D % 2 ? Layout::kTokenMajor : Layout::kHeadMajor;
    cases.push_back(c);
  }
  for (int n = 0; n < int(cases.size()); ++n) {
    SCOPED_TRACE(describe(cases[size_t(n)]));
    compare(cases[size_t(n)], uint64_t(177 + n));
  }
}

// Every SIMD target this CPU runs (flash_attention_use_target chooses for sdpa too).
TEST_F(SdpaBf16, EverySimdTargetMatches) {
  std::mt19937 gen(16);
  std::vector<Case> cases;
  for (int n = 0; n < 10; ++n) cases.push_back(random_case(gen, true));
  for (const std::string& target : attn::kernels::flash_attention_targets()) {
    ASSERT_TRUE(attn::kernels::flash_attention_use_target(target.c_str()));
    EXPECT_EQ(std::string(attn::kernels::sdpa_target()), target);
    for (int n = 0; n < int(cases.size()); ++n) {
      SCOPED_TRACE(target + ": " + describe(cases[size_t(n)]));
      compare(cases[size_t(n)], uint64_t(600 + n));
    }
  }
  ASSERT_TRUE(attn::kernels::flash_attention_use_target(nullptr));
}

// 2 (b, key/value head) units take the split backward on 2 threads and the
// whole-unit one on 1; 8 take the latter on both.
TEST_F(SdpaBf16, BitIdenticalForAnyThreadCount) {
#ifdef _OPENMP
  const int saved = omp_get_max_threads();
  std::vector<Case> cases;
  Case c;
  c.B = 1, c.Hq = 4, c.Hkv = 1, c.Tq = 150, c.Tk = 170, c.D = 32, c.Dv = 40, c.causal = true;
  c.align = CausalAlignment::kBottomRight, c.alibi = true, c.dropout_p = 0.1f;
  cases.push_back(c);
  c.B = 2, c.Hq = 8, c.Hkv = 4, c.D = 17, c.Dv = 17, c.causal = false, c.left = 30, c.right = 5;
  c.mask = MaskKind::kAdditive, c.mask_shape = {c.Tq, c.Tk}, c.softcap = 3.0f, c.dropout_p = 0.0f;
  cases.push_back(c);
  for (const Case& k : cases) {
    SCOPED_TRACE(describe(k));
    const Inputs in = make_inputs(k, 99);
    omp_set_num_threads(1);
    const Result one = run(in.q, in.k, in.v, in.dout, in.opt, SdpaBackend::kFused);
    omp_set_num_threads(2);
    const Result two = run(in.q, in.k, in.v, in.dout, in.opt, SdpaBackend::kFused);
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

TEST_F(SdpaBf16, FullyMaskedRowsGiveZeroOutputAndGradient) {
  for (SdpaBackend backend : {SdpaBackend::kFused, SdpaBackend::kReference}) {
    Case c;
    c.Hq = 2, c.Hkv = 2, c.Tq = 5, c.Tk = 6, c.D = 8, c.Dv = 8;
    Inputs in = make_inputs(c, 3);
    Tensor mask({5, 6}, 1.0f);
    for (int64_t j = 0; j < 6; ++j) mask.at({2, j}) = 0.0f;  // row 2: nothing
    in.opt.attn_mask = mask;
    in.opt.attn_mask_type = MaskType::kBoolean;
    const Result r = run(in.q, in.k, in.v, in.dout, in.opt, backend);
    for (int64_t h = 0; h < 2; ++h) {
      EXPECT_EQ(r.f.lse.to_vector()[size_t(h * 5 + 2)], -kInf);
      for (int64_t d = 0; d < 8; ++d) {
        EXPECT_EQ(r.f.out.to(kF32).at({0, h, 2, d}), 0.0f);
        EXPECT_EQ(r.g.dq.to(kF32).at({0, h, 2, d}), 0.0f);
      }
    }
    for (const Tensor* t : {&r.f.out, &r.g.dq, &r.g.dk, &r.g.dv})
      for (float x : t->to_vector()) ASSERT_FALSE(std::isnan(x));
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

TEST_F(SdpaBf16, BadDtypesThrowNamingThem) {
  const Tensor q = randn_bf16({1, 2, 5, 8}, 1), k = randn_bf16({1, 2, 6, 8}, 2);
  const Tensor v = randn_bf16({1, 2, 6, 8}, 3);
  for (SdpaBackend backend : {SdpaBackend::kFused, SdpaBackend::kReference}) {
    SdpaOptions o;
    o.backend = backend;
    auto sdpa = [&](const Tensor& a, const Tensor& b, const Tensor& c, const SdpaOptions& opt) {
      return [=] { attn::scaled_dot_product_attention(a, b, c, opt); };
    };
    expect_error(sdpa(q, k.to(kF32), v, o),
                 "q, k and v must have the same dtype, got q bfloat16, k float32, v bfloat16");
    expect_error(sdpa(q.to(kF32), k.to(kF32), v, o), "got q float32, k float32, v bfloat16");
    expect_error(sdpa(Tensor::zeros({1, 2, 5, 8}, DType::kInt64), k, v, o),
                 "q has dtype int64; q, k and v must be float32 or bfloat16");
    SdpaOptions m = o;
    m.attn_mask = Tensor({5, 6}).to(kBf16);
    expect_error(sdpa(q, k, v, m), "an additive attn_mask must be float32, got bfloat16");
    m.attn_mask_type = MaskType::kBoolean;
    expect_error(sdpa(q, k, v, m), "a boolean attn_mask must be float32 or int64");
    SdpaOptions a = o;
    a.alibi_slopes = Tensor({2}).to(kBf16);
    expect_error(sdpa(q, k, v, a), "alibi_slopes has dtype bfloat16; only float32 is supported");
    const attn::SdpaForward f = attn::scaled_dot_product_attention_forward(q, k, v, o);
    ASSERT_EQ(f.out.dtype(), kBf16);
    auto backward = [&](const Tensor& dout, const Tensor& out, const Tensor& lse) {
      return [=] { attn::scaled_dot_product_attention_backward(dout, q, k, v, out, lse, o); };
    };
    expect_error(backward(f.out.to(kF32), f.out, f.lse),
                 "dout has dtype float32 but q, k and v have bfloat16");
    expect_error(backward(f.out, f.out.to(kF32), f.lse),
                 "out has dtype float32 but q, k and v have bfloat16");
    expect_error(backward(f.out, f.out, f.lse.to(kBf16)),
                 "lse has dtype bfloat16; only float32 is supported");
  }
}

}  // namespace
