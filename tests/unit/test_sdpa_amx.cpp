// scaled_dot_product_attention on bfloat16 tensors on the native bf16 paths
// (attn/sdpa.h): "AMX" (the AMX kernel, for the calls it takes) and
// "AVX512-BF16" (the sdpa kernel's schedule on VDPBF16PS products, every
// call): forward, lse and every gradient against the specification (the fp32
// reference on the widened inputs), causal and full, with dropout, T on and
// off the tiles of 16 and 64, D 64, 80 and 128, every input layout; which
// calls the AMX kernel takes and which run on the sdpa kernel (window, ALiBi,
// softcap, D != Dv: the same bounds on the AVX512-BF16 path); forcing the path
// to "widened to fp32" turns the native products off. The tests run once for
// each of the two paths the CPU has (AMX: Intel Sapphire Rapids and later;
// AVX512-BF16: AMD Zen 4/5, Intel Cooper Lake and later), masks, grouped-query
// heads and Tq != Tk among them. Skipped, with the reason, where the CPU has neither.
//
// Bounds: the core's bf16 ones (tests/unit/test_flash_attention_bf16.cpp):
// max |got − want| <= 8e-3 · max |want| for out, 4e-2 · max |want| for dq, dk
// and dv, lse within 1e-5 · max(1, |lse|). The AMX path rounds P (and dS) to
// bf16 where they enter a product, so it is not held to the widened path's
// per-element bounds (test_sdpa_bf16.cpp); the largest errors are printed.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <iostream>
#include <limits>
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

using attn::DType;
using attn::SdpaBackend;
using attn::SdpaOptions;
using attn::Shape;
using attn::Tensor;
namespace kn = attn::kernels;

constexpr DType kBf16 = DType::kBFloat16, kF32 = DType::kFloat32;
constexpr double kOutTol = 8e-3, kGradTol = 4e-2, kLseTol = 1e-5;
constexpr const char* kWidened = "bf16 tiles widened to fp32";

// The core's paths with a strided form (kernels/flash_bf16_strided.h) that this CPU runs.
std::vector<std::string> core_paths() {
  std::vector<std::string> out;
  for (const std::string& path : kn::flash_attention_bf16_paths())
    if (path == "AMX" || path == "AVX512-BF16") out.push_back(path);
  return out;
}

// body(path) once for each of core_paths(), with that bf16 path forced (and traced).
template <class Body>
void with_each_core_path(Body&& body) {
  for (const std::string& path : core_paths()) {
    SCOPED_TRACE(path);
    const attn::test::Bf16PathGuard forced(path.c_str());
    ASSERT_TRUE(forced.forced());
    body(path);
  }
}

#define ATTN_REQUIRE_CORE_PATH()                                                              \
  if (core_paths().empty())                                                                   \
  GTEST_SKIP() << "this CPU (or the OS) has neither AMX-BF16 nor AVX512-BF16: no core route " \
                  "to test"

enum class Layout { kHeadMajor, kTokenMajor, kFusedQkv, kStridedD };

Tensor randn_bf16(const Shape& shape, uint64_t seed) {
  return attn::test::random_tensor(shape, seed).to(kBf16);
}

struct Inputs {
  Tensor q, k, v, dout;  // bf16, (B, H, T, D) views in the case's layout
};

// q, dout (B, H, T, D) and k, v (B, Hkv, Tk, D) (Hkv, Tk 0: H, T) in `layout`
// (grouped heads and Tk != T: head-major or token-major).
Inputs make_inputs(int64_t B, int64_t H, int64_t T, int64_t D, Layout layout, uint64_t seed,
                   int64_t Hkv = 0, int64_t Tk = 0) {
  Inputs in;
  auto one = [&](int64_t heads, int64_t tokens, uint64_t s) {
    switch (layout) {
      case Layout::kHeadMajor:
        return randn_bf16({B, heads, tokens, D}, s);
      case Layout::kTokenMajor:
        return randn_bf16({B, tokens, heads, D}, s).transpose(1, 2);
      case Layout::kStridedD:
        return randn_bf16({B, heads, D, tokens}, s).transpose(2, 3);
      case Layout::kFusedQkv:
        break;
    }
    return Tensor();
  };
  if (Hkv == 0) Hkv = H;
  if (Tk == 0) Tk = T;
  if (layout == Layout::kFusedQkv) {
    EXPECT_TRUE(Hkv == H && Tk == T) << "a fused qkv buffer holds H heads of T tokens each";
    const Tensor qkv = randn_bf16({B, T, 3 * H * D}, seed);
    in.q = qkv.slice(2, 0, H * D).view({B, T, H, D}).transpose(1, 2);
    in.k = qkv.slice(2, H * D, 2 * H * D).view({B, T, H, D}).transpose(1, 2);
    in.v = qkv.slice(2, 2 * H * D, 3 * H * D).view({B, T, H, D}).transpose(1, 2);
  } else {
    in.q = one(H, T, seed), in.k = one(Hkv, Tk, seed + 1), in.v = one(Hkv, Tk, seed + 2);
  }
  in.dout = randn_bf16({B, H, T, D}, seed + 3);
  return in;
}

struct Result {
  attn::SdpaForward f;
  attn::SdpaGrads g;
};

Result run(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& dout, SdpaOptions o,
           SdpaBackend backend) {
  o.backend = backend;
  Result r;
  r.f = attn::scaled_dot_product_attention_forward(q, k, v, o);
  r.g = attn::scaled_dot_product_attention_backward(dout, q, k, v, r.f.out, r.f.lse, o);
  return r;
}

// max |got − want| / max |want|, or max |got − want| where want is all 0 (T = 1: one
// key, dq = dk = 0 exactly, while the kernel's D = rowsum(dO ⊙ out) reads the
// bf16 out and leaves scale · ΔD · k; the core's tests measure it the same way).
double rel_err(const Tensor& got, const Tensor& want) {
  EXPECT_EQ(got.shape(), want.shape());
  const std::vector<float> x = got.to_vector(), y = want.to_vector();
  double err = 0.0, scale = 0.0;
  for (size_t n = 0; n < x.size(); ++n) {
    if (!std::isfinite(x[n])) return INFINITY;
    err = std::max(err, std::fabs(double(x[n]) - double(y[n])));
    scale = std::max(scale, std::fabs(double(y[n])));
  }
  return scale > 0.0 ? err / scale : err;
}

double lse_err(const Tensor& got, const Tensor& want) {
  const std::vector<float> x = got.to_vector(), y = want.to_vector();
  double worst = 0.0;
  for (size_t n = 0; n < x.size(); ++n)
    worst = std::max(worst, std::fabs(double(x[n]) - double(y[n])) /
                                std::max(1.0, std::fabs(double(y[n]))));
  return worst;
}


struct Worst {
  double out = 0, lse = 0, dq = 0, dk = 0, dv = 0;
};

// One routed call against the specification; returns the routed result.
Result check_routed(const Inputs& in, const SdpaOptions& o, Worst& worst, const std::string& what) {
  SCOPED_TRACE(what);
  EXPECT_STREQ(kn::sdpa_bf16_path(in.q, in.k, in.v, o), kn::flash_attention_bf16_path());
  const Result core = run(in.q, in.k, in.v, in.dout, o, SdpaBackend::kFused);
  EXPECT_EQ(core.f.out.dtype(), kBf16);
  EXPECT_EQ(core.f.lse.dtype(), kF32);
  EXPECT_EQ(core.g.dq.dtype(), kBf16);
  EXPECT_TRUE(core.f.out.is_contiguous() && core.g.dq.is_contiguous() &&
              core.g.dk.is_contiguous() && core.g.dv.is_contiguous());
  const Result spec = run(in.q.to(kF32), in.k.to(kF32), in.v.to(kF32), in.dout.to(kF32), o,
                          SdpaBackend::kReference);
  const double e_out = rel_err(core.f.out, spec.f.out), e_lse = lse_err(core.f.lse, spec.f.lse);
  const double e_dq = rel_err(core.g.dq, spec.g.dq), e_dk = rel_err(core.g.dk, spec.g.dk),
               e_dv = rel_err(core.g.dv, spec.g.dv);
  EXPECT_LE(e_out, kOutTol) << "out";
  EXPECT_LE(e_lse, kLseTol) << "lse";
  EXPECT_LE(e_dq, kGradTol) << "dq";
  EXPECT_LE(e_dk, kGradTol) << "dk";
  EXPECT_LE(e_dv, kGradTol) << "dv";
  worst.out = std::max(worst.out, e_out), worst.lse = std::max(worst.lse, e_lse);
  worst.dq = std::max(worst.dq, e_dq), worst.dk = std::max(worst.dk, e_dk);
  worst.dv = std::max(worst.dv, e_dv);
  return core;
}

void print(const Worst& w, const char* name) {
  std::cout << name << ": largest relative errors out " << w.out << ", lse " << w.lse << ", dq "
            << w.dq << ", dk " << w.dk << ", dv " << w.dv << "\n";
}

// One routed call of a sweep: the inputs' shape, layout and seed, the options.
struct RoutedCase {
  int64_t B, H, T, D;
  Layout layout;
  uint64_t seed;
  SdpaOptions o;
  std::string what;
};

SdpaOptions causal_options(bool causal) {
  SdpaOptions o;
  o.is_causal = causal;
  return o;
}

std::string dims_name(int64_t D, int64_t T, bool causal) {
  return "D " + std::to_string(D) + " T " + std::to_string(T) + (causal ? " causal" : " full");
}

// Every case with the core's path forced to each of core_paths(), against the
// specification; prints the largest errors of each path's sweep under `title`.
void expect_routed_cases(const std::vector<RoutedCase>& cases, const char* title) {
  with_each_core_path([&](const std::string& path) {
    Worst worst;
    for (const RoutedCase& c : cases)
      check_routed(make_inputs(c.B, c.H, c.T, c.D, c.layout, c.seed), c.o, worst, c.what);
    print(worst, (path + ", " + title).c_str());
  });
}

TEST(SdpaCore, RoutedCallsMatchTheReferenceCausalAndFull) {
  ATTN_REQUIRE_CORE_PATH();
  std::vector<RoutedCase> cases;
  uint64_t seed = 100;
  for (const int64_t D : {64, 80, 128})
    for (const int64_t T : {1, 15, 16, 17, 63, 64, 65, 100, 129, 200})
      for (const bool causal : {true, false})
        cases.push_back({T % 2 + 1, T < 64 ? 3 : 2, T, D, Layout::kHeadMajor, seed += 4,
                         causal_options(causal), dims_name(D, T, causal)});
  expect_routed_cases(cases, "causal and full");
}

TEST(SdpaCore, RoutedCallsReadEveryLayoutAndTheScale) {
  ATTN_REQUIRE_CORE_PATH();
  std::vector<RoutedCase> cases;
  uint64_t seed = 900;
  for (const Layout layout :
       {Layout::kHeadMajor, Layout::kTokenMajor, Layout::kFusedQkv, Layout::kStridedD})
    for (const float scale : {-1.0f, 0.05f, 0.0f}) {
      SdpaOptions o = causal_options(true);
      if (scale >= 0.0f) o.scale = scale;
      cases.push_back({2, 3, 77, 80, layout, seed += 4, o,
                       "layout " + std::to_string(int(layout)) + " scale " + std::to_string(scale)});
    }
  expect_routed_cases(cases, "layouts and scales");
}

// The core's dropout noise is sdpa's (Philox counters (j/4, i, h, b)): the
// reference, drawing its own noise, agrees with the routed kernel only if so.
TEST(SdpaCore, RoutedDropoutDrawsTheReferencesNoise) {
  ATTN_REQUIRE_CORE_PATH();
  std::vector<RoutedCase> cases;
  uint64_t seed = 500;
  for (const int64_t D : {64, 80, 128})
    for (const int64_t T : {17, 64, 130})
      for (const bool causal : {true, false}) {
        SdpaOptions o = causal_options(causal);
        o.dropout_p = 0.2f;
        o.dropout_seed = seed += 4;
        cases.push_back(
            {2, 2, T, D, Layout::kTokenMajor, seed, o, "dropout " + dims_name(D, T, causal)});
      }
  expect_routed_cases(cases, "dropout");
}

// ---- attention masks on the core's kernels -----------------------------------------------
// The kernels add an additive mask themselves (a boolean one as 0 / -inf), skip
// the 64 x 64 tiles it hides wholly and drop the add where a tile is all 0:
// against the specification, masks of every broadcast shape (one plane, per
// batch, per head), with is_causal and without, with dropout, every input
// layout; tiles hidden wholly, in part, and rows whose keys are all closed.
constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr float kLowest = std::numeric_limits<float>::lowest();

// A (Bm, Hm, T, T) mask with value(b, h, i, j).
template <class F>
Tensor mask_of(int64_t Bm, int64_t Hm, int64_t T, F value) {
  Tensor m = Tensor::zeros({Bm, Hm, T, T});
  for (int64_t b = 0; b < Bm; ++b)
    for (int64_t h = 0; h < Hm; ++h)
      for (int64_t i = 0; i < T; ++i)
        for (int64_t j = 0; j < T; ++j) m.at({b, h, i, j}) = value(b, h, i, j);
  return m;
}

// A fixed pseudo-random value in [0, 1) for (b, h, i, j).
float hash01(int64_t b, int64_t h, int64_t i, int64_t j) {
  uint64_t x = uint64_t(((b * 131 + h) * 8191 + i) * 65537 + j) * 0x9E3779B97F4A7C15ull;
  x ^= x >> 29;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 32;
  return float(x >> 40) / float(1 << 24);
}

TEST(SdpaCore, MasksMatchTheReference) {
  ATTN_REQUIRE_CORE_PATH();
  std::vector<RoutedCase> cases;
  uint64_t seed = 2100;
  for (const int64_t T : {40, 64, 130, 200}) {
    // Key padding, transformers' style: batch b's last 9 + 40·b keys hold the
    // float32 minimum, with is_causal (a (B, 1, 1, T) mask).
    Tensor pad = Tensor::zeros({2, 1, 1, T});
    for (int64_t b = 0; b < 2; ++b)
      for (int64_t j = std::max<int64_t>(1, T - 9 - 40 * b); j < T; ++j)
        pad.at({b, 0, 0, j}) = kLowest;
    SdpaOptions padded = causal_options(true);
    padded.attn_mask = pad;
    cases.push_back(
        {2, 3, T, 64, Layout::kHeadMajor, seed += 4, padded, "padded T " + std::to_string(T)});
    // The same padding on the full (B, 1, T, T) causal pattern, without is_causal.
    SdpaOptions padded_causal;
    padded_causal.attn_mask = mask_of(2, 1, T, [&](int64_t b, int64_t, int64_t i, int64_t j) {
      return j > i || j >= std::max<int64_t>(1, T - 9 - 40 * b) ? kLowest : 0.0f;
    });
    cases.push_back({2, 2, T, 80, Layout::kTokenMajor, seed += 4, padded_causal,
                     "padded causal pattern T " + std::to_string(T)});
    // A boolean (T, T) mask, a third closed (the diagonal open), full attention.
    SdpaOptions boolean;
    boolean.attn_mask = mask_of(1, 1, T, [](int64_t b, int64_t h, int64_t i, int64_t j) {
                          return i == j || hash01(b, h, i, j) > 0.33f ? 1.0f : 0.0f;
                        }).view({T, T});
    boolean.attn_mask_type = attn::MaskType::kBoolean;
    cases.push_back(
        {1, 2, T, 64, Layout::kStridedD, seed += 4, boolean, "boolean T " + std::to_string(T)});
    // A finite bias per head (nothing closed), causal.
    SdpaOptions bias = causal_options(true);
    bias.attn_mask = mask_of(1, 3, T, [](int64_t b, int64_t h, int64_t i, int64_t j) {
      return 4.0f * hash01(b, h, i, j) - 2.0f;
    });
    cases.push_back(
        {2, 3, T, 128, Layout::kFusedQkv, seed += 4, bias, "bias T " + std::to_string(T)});
    // Documents packed into one sequence (block diagonal, -inf between), with
    // dropout: whole tiles hidden, and tiles cut by a document's edge.
    SdpaOptions docs = causal_options(true);
    docs.attn_mask = mask_of(1, 1, T, [](int64_t, int64_t, int64_t i, int64_t j) {
      return i / 70 == j / 70 ? 0.0f : kNegInf;
    });
    docs.dropout_p = 0.2f;
    docs.dropout_seed = seed;
    cases.push_back(
        {2, 2, T, 64, Layout::kHeadMajor, seed += 4, docs, "documents T " + std::to_string(T)});
  }
  expect_routed_cases(cases, "masks");
}

// A row whose keys the mask all closes (-inf) gets output 0 and lse -inf, and
// adds nothing to the gradients, as in the specification; the other rows are
// unchanged by it.
TEST(SdpaCore, RowsTheMaskClosesWhollyGiveZero) {
  ATTN_REQUIRE_CORE_PATH();
  with_each_core_path([&](const std::string&) {
    for (const int64_t T : {50, 150}) {
      SCOPED_TRACE(T);
      const Inputs in = make_inputs(1, 2, T, 64, Layout::kHeadMajor, 2300 + uint64_t(T));
      auto closed_row = [](int64_t i) { return (i >= 10 && i < 20) || i == 99; };
      SdpaOptions o;
      o.attn_mask = mask_of(1, 1, T, [&](int64_t, int64_t, int64_t i, int64_t j) {
        return closed_row(i) || j > i ? kNegInf : 0.0f;
      });
      Worst worst;
      const Result r = check_routed(in, o, worst, "closed rows");
      for (int64_t h = 0; h < 2; ++h)
        for (int64_t i = 0; i < T; ++i) {
          const float lse = r.f.lse.at({0, h, i});
          if (!closed_row(i)) {
            EXPECT_TRUE(std::isfinite(lse)) << i;
            continue;
          }
          EXPECT_EQ(lse, kNegInf) << i;
          for (int64_t d = 0; d < 64; ++d) {
            EXPECT_EQ(r.f.out.to(kF32).at({0, h, i, d}), 0.0f);
            EXPECT_EQ(r.g.dq.to(kF32).at({0, h, i, d}), 0.0f);
          }
        }
    }
  });
}

// The route changes the bits (it is taken), and forcing the core's path to
// "widened to fp32" turns it off: the widened path's bits come back.
TEST(SdpaCore, ForcingTheWidenedPathTurnsTheRouteOff) {
  ATTN_REQUIRE_CORE_PATH();
  with_each_core_path([&](const std::string& path) {
    const Inputs in = make_inputs(1, 2, 200, 64, Layout::kHeadMajor, 77);
    SdpaOptions o;
    o.is_causal = true;
    Result on, off;
    {
      EXPECT_STREQ(kn::sdpa_bf16_path(in.q, in.k, in.v, o), path.c_str());
      on = run(in.q, in.k, in.v, in.dout, o, SdpaBackend::kFused);
    }
    {
      const attn::test::Bf16PathGuard widened("widened to fp32");
      ASSERT_TRUE(widened.forced());
      EXPECT_STREQ(kn::sdpa_bf16_path(in.q, in.k, in.v, o), kWidened);
      EXPECT_STREQ(kn::sdpa_bf16_path(), kWidened);
      off = run(in.q, in.k, in.v, in.dout, o, SdpaBackend::kFused);
    }
    EXPECT_FALSE(same_bits(on.f.out, off.f.out));
    EXPECT_FALSE(same_bits(on.g.dq, off.g.dq));
    // The widened path is the fp32 kernel on the widened values, rounded once.
    const Tensor q = in.q.to(kF32), k = in.k.to(kF32), v = in.v.to(kF32);
    EXPECT_TRUE(same_bits(off.f.out, attn::scaled_dot_product_attention(q, k, v, o).to(kBf16)));
  });
}

// The path of a call the AMX kernel does not take: the sdpa kernel's, on
// VDPBF16PS where kernels::bf16_dot_engine_chosen() says so, else on the
// widened tiles.
const char* sdpa_kernel_path() { return kn::bf16_dot_engine_chosen() ? "AVX512-BF16" : kWidened; }

// Calls beyond the AMX kernel's problem (window, ALiBi, softcap, D != Dv, a
// negative scale) run on the sdpa kernel: on the AVX512-BF16 path its
// VDPBF16PS products, within the core's bounds of the specification and not
// the widened path's bits; where it is the widened tiles, their bits.
TEST(SdpaCore, CallsBeyondTheAmxKernelRunOnTheSdpaKernel) {
  ATTN_REQUIRE_CORE_PATH();
  with_each_core_path([&](const std::string& path) {
    const bool dot = std::string(sdpa_kernel_path()) == "AVX512-BF16";
    if (path == "AVX512-BF16") {
      EXPECT_TRUE(dot);
    }
    struct Variant {
      const char* name;
      int64_t Hkv, Tk, Dv;
      SdpaOptions o;
    };
    std::vector<Variant> variants;
    auto add = [&](const char* name, int64_t Hkv, int64_t Tk, int64_t Dv, auto edit) {
      Variant v{name, Hkv, Tk, Dv, SdpaOptions{}};
      v.o.is_causal = true;
      edit(v.o);
      variants.push_back(v);
    };
    add("window", 2, 40, 64, [](SdpaOptions& o) { o.window_left = 8; });
    add("alibi", 2, 40, 64, [](SdpaOptions& o) { o.alibi_slopes = Tensor({2}, {0.5f, 0.25f}); });
    add("softcap", 2, 40, 64, [](SdpaOptions& o) { o.softcap = 5.0f; });
    add("D != Dv", 2, 40, 32, [](SdpaOptions&) {});
    add("negative scale", 2, 40, 64, [](SdpaOptions& o) { o.scale = -0.125f; });
    for (const Variant& var : variants) {
      SCOPED_TRACE(var.name);
      const Tensor q = randn_bf16({1, 2, 40, 64}, 1), k = randn_bf16({1, var.Hkv, var.Tk, 64}, 2),
                   v = randn_bf16({1, var.Hkv, var.Tk, var.Dv}, 3),
                   dout = randn_bf16({1, 2, 40, var.Dv}, 4);
      EXPECT_STREQ(kn::sdpa_bf16_path(q, k, v, var.o), sdpa_kernel_path());
      const Result routed = run(q, k, v, dout, var.o, SdpaBackend::kFused);
      const Result spec =
          run(q.to(kF32), k.to(kF32), v.to(kF32), dout.to(kF32), var.o, SdpaBackend::kReference);
      EXPECT_LE(rel_err(routed.f.out, spec.f.out), kOutTol) << "out";
      EXPECT_LE(lse_err(routed.f.lse, spec.f.lse), kLseTol) << "lse";
      EXPECT_LE(rel_err(routed.g.dq, spec.g.dq), kGradTol) << "dq";
      EXPECT_LE(rel_err(routed.g.dk, spec.g.dk), kGradTol) << "dk";
      EXPECT_LE(rel_err(routed.g.dv, spec.g.dv), kGradTol) << "dv";
      const attn::test::Bf16PathGuard widened("widened to fp32");
      const Result wide = run(q, k, v, dout, var.o, SdpaBackend::kFused);
      EXPECT_EQ(same_bits(routed.f.out, wide.f.out), !dot);
      EXPECT_EQ(same_bits(routed.g.dq, wide.g.dq), !dot);
      EXPECT_EQ(same_bits(routed.g.dk, wide.g.dk), !dot);
      EXPECT_EQ(same_bits(routed.g.dv, wide.g.dv), !dot);
    }
    // The reference backend is named as such.
    const Tensor q = randn_bf16({1, 1, 8, 16}, 5);
    SdpaOptions ref;
    ref.backend = SdpaBackend::kReference;
    EXPECT_STREQ(kn::sdpa_bf16_path(q, q, q, ref), "reference (fp32 on the widened values)");
  });
}

// The routed backward checks its tensors as the widened one does.
TEST(SdpaCore, RoutedBackwardChecksItsTensors) {
  ATTN_REQUIRE_CORE_PATH();
  with_each_core_path([&](const std::string&) {
    const Inputs in = make_inputs(1, 2, 20, 64, Layout::kHeadMajor, 3);
    SdpaOptions o;
    o.is_causal = true;
    const attn::SdpaForward f = attn::scaled_dot_product_attention_forward(in.q, in.k, in.v, o);
    EXPECT_THROW(attn::scaled_dot_product_attention_backward(in.dout.to(kF32), in.q, in.k, in.v,
                                                             f.out, f.lse, o),
                 std::invalid_argument);
    EXPECT_THROW(attn::scaled_dot_product_attention_backward(in.dout, in.q, in.k, in.v, f.out,
                                                             f.lse.slice(2, 0, 10), o),
                 std::invalid_argument);
    EXPECT_THROW(attn::scaled_dot_product_attention_backward(in.dout.slice(2, 0, 10), in.q, in.k,
                                                             in.v, f.out, f.lse, o),
                 std::invalid_argument);
  });
}

// ---- the raw layer routed (sdpa_forward_routed / sdpa_backward_routed) ----------------
// What the Python binding calls: the same route on the caller's buffers. On
// every layout (in place or packed copies, outputs written through their
// strides, lse non-contiguous) its bits are the Tensor entry points' (the
// same core on the same values), forward and backward; and a call the core
// cannot serve takes kernels::sdpa_* as before.
attn::SdpaStrides strides4(const Tensor& t) {
  return {t.stride(0), t.stride(1), t.stride(2), t.stride(3)};
}

attn::SdpaProblemBf16 raw_problem(const Inputs& in, const SdpaOptions& o) {
  attn::SdpaProblemBf16 p;
  p.B = in.q.size(0), p.Hq = in.q.size(1), p.Hkv = in.k.size(1), p.Tq = in.q.size(2),
  p.Tk = in.k.size(2), p.D = in.q.size(3), p.Dv = in.v.size(3);
  p.q = in.q.data_ptr<attn::BFloat16>(), p.k = in.k.data_ptr<attn::BFloat16>(),
  p.v = in.v.data_ptr<attn::BFloat16>();
  p.q_strides = strides4(in.q), p.k_strides = strides4(in.k), p.v_strides = strides4(in.v);
  p.is_causal = o.is_causal;
  p.causal_alignment = o.causal_alignment;
  p.scale = o.scale ? *o.scale : 1.0f / std::sqrt(float(p.D));
  p.window_left = o.window_left;
  p.dropout_p = o.dropout_p, p.dropout_seed = o.dropout_seed;
  if (!o.attn_mask.empty()) {  // a 4-D float32 additive mask, as the binding passes it
    const Tensor& m = o.attn_mask;
    int64_t st[4];
    for (int64_t d = 0; d < 4; ++d) st[d] = m.size(d) == 1 ? 0 : m.stride(d);
    p.mask = m.data_ptr<float>();
    p.mask_strides = {st[0], st[1], st[2], st[3]};
  }
  return p;
}

// A (B, H, T, W) bf16 buffer in `layout` (outputs: head-major, token-major or strided d).
Tensor empty_in(Layout layout, int64_t B, int64_t H, int64_t T, int64_t W) {
  switch (layout) {
    case Layout::kTokenMajor:
    case Layout::kFusedQkv:
      return Tensor::empty({B, T, H, W}, kBf16).transpose(1, 2);
    case Layout::kStridedD:
      return Tensor::empty({B, H, W, T}, kBf16).transpose(2, 3);
    case Layout::kHeadMajor:
      break;
  }
  return Tensor::empty({B, H, T, W}, kBf16);
}

Result run_raw(const Inputs& in, const SdpaOptions& o, Layout out_layout) {
  const attn::SdpaProblemBf16 p = raw_problem(in, o);
  const int64_t B = p.B, H = p.Hq, T = p.Tq, D = p.D;
  Result r;
  r.f.out = empty_in(out_layout, B, H, T, D);
  // lse (B, H, T) as a (B, T, H) buffer's transposed view: never the core's layout.
  r.f.lse = Tensor::empty({B, T, H}).transpose(1, 2);
  attn::SdpaOutputBf16 o_raw;
  o_raw.out = r.f.out.data_ptr<attn::BFloat16>(), o_raw.out_strides = strides4(r.f.out);
  o_raw.lse = r.f.lse.data_ptr<float>();
  o_raw.lse_strides = attn::SdpaStrides{r.f.lse.stride(0), r.f.lse.stride(1), r.f.lse.stride(2), 1};
  attn::sdpa_forward_routed(o_raw, p);
  r.g.dq = empty_in(out_layout, B, H, T, D);
  r.g.dk = empty_in(out_layout, B, p.Hkv, p.Tk, D);
  r.g.dv = empty_in(out_layout, B, p.Hkv, p.Tk, D);
  attn::SdpaBackwardIOBf16 io;
  io.dout = in.dout.data_ptr<attn::BFloat16>(), io.dout_strides = strides4(in.dout);
  io.out = r.f.out.data_ptr<attn::BFloat16>(), io.out_strides = strides4(r.f.out);
  io.lse = r.f.lse.data_ptr<float>(), io.lse_strides = o_raw.lse_strides;
  io.dq = r.g.dq.data_ptr<attn::BFloat16>(), io.dq_strides = strides4(r.g.dq);
  io.dk = r.g.dk.data_ptr<attn::BFloat16>(), io.dk_strides = strides4(r.g.dk);
  io.dv = r.g.dv.data_ptr<attn::BFloat16>(), io.dv_strides = strides4(r.g.dv);
  attn::sdpa_backward_routed(io, p);
  return r;
}

void expect_same_result(const Result& a, const Result& b) {
  EXPECT_TRUE(same_bits(a.f.out, b.f.out)) << "out";
  EXPECT_TRUE(same_bits(a.f.lse, b.f.lse)) << "lse";
  EXPECT_TRUE(same_bits(a.g.dq, b.g.dq)) << "dq";
  EXPECT_TRUE(same_bits(a.g.dk, b.g.dk)) << "dk";
  EXPECT_TRUE(same_bits(a.g.dv, b.g.dv)) << "dv";
}

TEST(SdpaCore, RawRoutedCallsGiveTheTensorEntryPointsBitsOnEveryLayout) {
  ATTN_REQUIRE_CORE_PATH();
  with_each_core_path([&](const std::string& path) {
    uint64_t seed = 1300;
    for (const Layout in_layout :
         {Layout::kHeadMajor, Layout::kTokenMajor, Layout::kFusedQkv, Layout::kStridedD})
      for (const Layout out_layout : {Layout::kHeadMajor, Layout::kTokenMajor, Layout::kStridedD})
        for (const bool causal : {true, false}) {
          SCOPED_TRACE("in " + std::to_string(int(in_layout)) + " out " +
                       std::to_string(int(out_layout)) + (causal ? " causal" : " full"));
          const Inputs in = make_inputs(2, 3, 45, 64, in_layout, seed += 4);
          SdpaOptions o;
          o.is_causal = causal;
          o.dropout_p = causal ? 0.0f : 0.1f;
          o.dropout_seed = seed;
          EXPECT_STREQ(kn::sdpa_bf16_path(raw_problem(in, o)), path.c_str());
          expect_same_result(run_raw(in, o, out_layout),
                             run(in.q, in.k, in.v, in.dout, o, SdpaBackend::kFused));
        }
  });
}

// The raw layer (the Python binding's calls) runs an additive mask that is
// exactly the causal pattern (-inf, or transformers' float32 minimum, above the
// diagonal) as is_causal: on the core's kernel, with is_causal's bits; a mask
// that differs in one entry runs the same path's masked kernel, to another result.
TEST(SdpaCore, RawCausalMaskRunsAsIsCausal) {
  ATTN_REQUIRE_CORE_PATH();
  with_each_core_path([&](const std::string& path) {
    const int64_t T = 90;
    const Inputs in = make_inputs(2, 3, T, 64, Layout::kHeadMajor, 1900);
    SdpaOptions causal;
    causal.is_causal = true;
    const Result want = run_raw(in, causal, Layout::kHeadMajor);
    for (const float closed :
         {-std::numeric_limits<float>::infinity(), std::numeric_limits<float>::lowest()}) {
      Tensor mask({1, 1, T, T});
      for (int64_t i = 0; i < T; ++i)
        for (int64_t j = 0; j < T; ++j) mask.at({0, 0, i, j}) = j <= i ? 0.0f : closed;
      SdpaOptions o;
      o.attn_mask = mask;
      SCOPED_TRACE(closed);
      EXPECT_STREQ(kn::sdpa_bf16_path(raw_problem(in, o)), path.c_str());
      expect_same_result(run_raw(in, o, Layout::kHeadMajor), want);
      mask.at({0, 0, 40, 41}) = 0.0f;  // not causal: the masked kernel, another result
      EXPECT_STREQ(kn::sdpa_bf16_path(raw_problem(in, o)), path.c_str());
      EXPECT_FALSE(same_bits(run_raw(in, o, Layout::kHeadMajor).f.out, want.f.out));
    }
  });
}

// The routed forward and backward read their inputs in place and write out,
// lse and the gradients through their strides (no token-major copies): their
// bits must be the core's on packed token-major copies of the same values
// (what the route ran before), for every input layout, head-major outputs
// (PyTorch's) and the Tensor entry points.
TEST(SdpaCore, InPlaceCallsGiveTheCoresBitsOnItsPackedCopies) {
  ATTN_REQUIRE_CORE_PATH();
  with_each_core_path([&](const std::string&) {
    uint64_t seed = 1700;
    for (const Layout in_layout :
         {Layout::kHeadMajor, Layout::kTokenMajor, Layout::kFusedQkv, Layout::kStridedD})
      for (const bool causal : {true, false}) {
        SCOPED_TRACE("in " + std::to_string(int(in_layout)) + (causal ? " causal" : " full"));
        const int64_t B = 2, H = 3, T = 70, D = 80;
        const Inputs in = make_inputs(B, H, T, D, in_layout, seed += 4);
        SdpaOptions o;
        o.is_causal = causal;
        o.dropout_p = causal ? 0.0f : 0.1f;
        o.dropout_seed = seed;
        // The core on packed (B, T, H, D) copies.
        const Tensor qt = in.q.transpose(1, 2).contiguous(), kt = in.k.transpose(1, 2).contiguous(),
                     vt = in.v.transpose(1, 2).contiguous();
        Tensor out_core = Tensor::empty({B, T, H, D}, kBf16), lse_core({B, H, T});
        kn::FlashAttentionParams fp;
        fp.B = B, fp.T = T, fp.H = H, fp.hd = D, fp.causal = causal;
        fp.dropout_p = o.dropout_p, fp.dropout_seed = o.dropout_seed;
        kn::flash_attention_forward_bf16(
            out_core.data_ptr<attn::BFloat16>(), lse_core.data(), qt.data_ptr<attn::BFloat16>(),
            kt.data_ptr<attn::BFloat16>(), vt.data_ptr<attn::BFloat16>(), fp);
        const Tensor want = out_core.transpose(1, 2);
        const Result raw = run_raw(in, o, Layout::kHeadMajor);
        EXPECT_TRUE(same_bits(raw.f.out, want)) << "raw out";
        EXPECT_TRUE(same_bits(raw.f.lse, lse_core)) << "raw lse";
        o.backend = SdpaBackend::kFused;
        const attn::SdpaForward f = attn::scaled_dot_product_attention_forward(in.q, in.k, in.v, o);
        EXPECT_TRUE(f.out.is_contiguous());
        EXPECT_TRUE(same_bits(f.out, want)) << "tensor out";
        EXPECT_TRUE(same_bits(f.lse, lse_core)) << "tensor lse";
        // Backward: the core on packed copies of dout and its own out, lse.
        const Tensor dout_t = in.dout.transpose(1, 2).contiguous();
        Tensor dq = Tensor::empty({B, T, H, D}, kBf16), dk = Tensor::empty({B, T, H, D}, kBf16),
               dv = Tensor::empty({B, T, H, D}, kBf16);
        kn::flash_attention_backward_bf16(
            dq.data_ptr<attn::BFloat16>(), dk.data_ptr<attn::BFloat16>(),
            dv.data_ptr<attn::BFloat16>(), dout_t.data_ptr<attn::BFloat16>(),
            qt.data_ptr<attn::BFloat16>(), kt.data_ptr<attn::BFloat16>(),
            vt.data_ptr<attn::BFloat16>(), out_core.data_ptr<attn::BFloat16>(), lse_core.data(),
            fp);
        EXPECT_TRUE(same_bits(raw.g.dq, dq.transpose(1, 2))) << "raw dq";
        EXPECT_TRUE(same_bits(raw.g.dk, dk.transpose(1, 2))) << "raw dk";
        EXPECT_TRUE(same_bits(raw.g.dv, dv.transpose(1, 2))) << "raw dv";
        const attn::SdpaGrads g =
            attn::scaled_dot_product_attention_backward(in.dout, in.q, in.k, in.v, f.out, f.lse, o);
        EXPECT_TRUE(g.dq.is_contiguous() && g.dk.is_contiguous() && g.dv.is_contiguous());
        EXPECT_TRUE(same_bits(g.dq, dq.transpose(1, 2))) << "tensor dq";
        EXPECT_TRUE(same_bits(g.dk, dk.transpose(1, 2))) << "tensor dk";
        EXPECT_TRUE(same_bits(g.dv, dv.transpose(1, 2))) << "tensor dv";
      }
  });
}

TEST(SdpaCore, RawRoutedCallsBeyondTheAmxKernelTakeTheSdpaKernel) {
  ATTN_REQUIRE_CORE_PATH();
  with_each_core_path([&](const std::string&) {
    const Inputs in = make_inputs(1, 2, 40, 64, Layout::kTokenMajor, 3);
    SdpaOptions o;
    o.is_causal = true;
    o.window_left = 8;
    EXPECT_STREQ(kn::sdpa_bf16_path(raw_problem(in, o)), sdpa_kernel_path());
    expect_same_result(run_raw(in, o, Layout::kHeadMajor),
                       run(in.q, in.k, in.v, in.dout, o, SdpaBackend::kFused));
    // The widened path forced: the raw rule follows it.
    const attn::test::Bf16PathGuard widened("widened to fp32");
    o.window_left = -1;
    EXPECT_STREQ(kn::sdpa_bf16_path(raw_problem(in, o)), kWidened);
    expect_same_result(run_raw(in, o, Layout::kTokenMajor),
                       run(in.q, in.k, in.v, in.dout, o, SdpaBackend::kFused));
  });
}

// The raw layer (the Python binding's calls) takes masks with any strides
// (here a transposed one, and a key-padding row broadcast over queries): the
// Tensor entry points' bits, on every layout.
TEST(SdpaCore, RawMaskedCallsGiveTheTensorEntryPointsBits) {
  ATTN_REQUIRE_CORE_PATH();
  with_each_core_path([&](const std::string& path) {
    const int64_t T = 100;
    const Tensor lower = mask_of(1, 1, T, [](int64_t, int64_t, int64_t i, int64_t j) {
      return j > i || hash01(0, 0, i, j) < 0.2f ? kLowest : 0.0f;
    });
    Tensor keys = Tensor::zeros({2, 1, 1, T});
    for (int64_t j = 70; j < T; ++j) keys.at({1, 0, 0, j}) = kNegInf;
    // The same values as `lower`, read with key stride T.
    const Tensor strided = lower.transpose(2, 3).contiguous().transpose(2, 3);
    ASSERT_EQ(strided.stride(3), T);
    struct Case {
      const char* name;
      Tensor mask;
      bool causal;
    };
    const std::vector<Case> masks{{"(1, 1, T, T)", lower, false},
                                  {"key stride T", strided, false},
                                  {"(B, 1, 1, T) with is_causal", keys, true}};
    uint64_t seed = 2500;
    for (const Layout layout : {Layout::kHeadMajor, Layout::kTokenMajor, Layout::kStridedD})
      for (const Case& c : masks) {
        SCOPED_TRACE(std::string(c.name) + " layout " + std::to_string(int(layout)));
        const Inputs in = make_inputs(2, 3, T, 64, layout, seed += 4);
        SdpaOptions o;
        o.attn_mask = c.mask;
        o.is_causal = c.causal;
        EXPECT_STREQ(kn::sdpa_bf16_path(raw_problem(in, o)), path.c_str());
        expect_same_result(run_raw(in, o, layout),
                           run(in.q, in.k, in.v, in.dout, o, SdpaBackend::kFused));
      }
  });
}

// ---- grouped-query heads on the core's kernels ---------------------------------------------
// K and V packed once per key/value head, read by each query head of its
// group; dK and dV summed over the group in one order, in both backward
// schedules (whole key/value heads per thread, or key- and query-tile tasks):
// against the specification, and the same bits on 1 and 2 threads.

TEST(SdpaCore, GroupedQueryHeadsMatchTheReference) {
  ATTN_REQUIRE_CORE_PATH();
  with_each_core_path([&](const std::string& path) {
    struct Heads {
      int64_t B, Hq, Hkv;
    };
    Worst worst;
    uint64_t seed = 2700;
    // On 2 threads: B·Hkv of 1 with 2 query heads (the split schedule: key-
    // and query-tile tasks), 1 and 2 with 4 and 6 (AVX512-BF16: a query head
    // per task, its dK, dV terms summed over the group after), 4 and 6 (whole
    // key/value heads); on 1 thread whole key/value heads, the same bits.
    for (const Heads hd :
         {Heads{1, 2, 1}, Heads{1, 4, 1}, Heads{1, 6, 2}, Heads{2, 4, 2}, Heads{2, 6, 3}})
      for (const int64_t T : {33, 130})
        for (const int variant : {0, 1, 2}) {
          SdpaOptions o;
          o.enable_gqa = true;
          o.is_causal = variant != 1;
          std::string what = "B " + std::to_string(hd.B) + " Hq " + std::to_string(hd.Hq) +
                             " Hkv " + std::to_string(hd.Hkv) + " T " + std::to_string(T);
          if (variant == 1) {  // full, a key-padding mask per batch
            Tensor pad = Tensor::zeros({hd.B, 1, 1, T});
            for (int64_t b = 0; b < hd.B; ++b)
              for (int64_t j = T - 5 - 20 * b; j < T; ++j) pad.at({b, 0, 0, j}) = kLowest;
            o.attn_mask = pad;
            what += " padded";
          }
          if (variant == 2) {  // causal with dropout
            o.dropout_p = 0.2f;
            o.dropout_seed = seed;
            what += " dropout";
          }
          const Layout layout = variant == 0 ? Layout::kTokenMajor : Layout::kHeadMajor;
          const Inputs in = make_inputs(hd.B, hd.Hq, T, 64, layout, seed += 4, hd.Hkv);
          const Result r = check_routed(in, o, worst, what);
          EXPECT_EQ(r.g.dk.shape(), (Shape{hd.B, hd.Hkv, T, 64})) << what;
#ifdef _OPENMP
          const int saved = omp_get_max_threads();
          omp_set_num_threads(1);
          const Result one = run(in.q, in.k, in.v, in.dout, o, SdpaBackend::kFused);
          omp_set_num_threads(2);
          const Result two = run(in.q, in.k, in.v, in.dout, o, SdpaBackend::kFused);
          omp_set_num_threads(saved);
          SCOPED_TRACE(what + ": 1 and 2 threads");
          expect_same_result(one, two);
#endif
          // The raw layer (the Python binding's calls): the same bits.
          EXPECT_STREQ(kn::sdpa_bf16_path(raw_problem(in, o)), path.c_str()) << what;
          expect_same_result(run_raw(in, o, Layout::kTokenMajor), r);
        }
    print(worst, (path + ", grouped-query heads").c_str());
  });
}

// ---- Tq != Tk on the core's kernels ------------------------------------------------------
// Queries and keys of different lengths (cross-attention; a chunk of new
// queries against a longer cache): full, causal top-left and bottom-right
// (where a query may see no key: output 0, lse -inf), grouped heads with a
// key-padding mask, and dropout; against the specification, the raw layer's bits.
TEST(SdpaCore, QueriesAndKeysOfDifferentLengthsMatchTheReference) {
  ATTN_REQUIRE_CORE_PATH();
  with_each_core_path([&](const std::string& path) {
    Worst worst;
    uint64_t seed = 2900;
    const std::vector<std::pair<int64_t, int64_t>> lengths{{33, 130}, {130, 33}, {64, 200},
                                                           {200, 64}, {1, 77},   {77, 1}};
    for (const auto& [Tq, Tk] : lengths)
      for (const int variant : {0, 1, 2, 3, 4}) {
        SdpaOptions o;
        std::string what = "Tq " + std::to_string(Tq) + " Tk " + std::to_string(Tk);
        int64_t Hq = 3, Hkv = 3;
        if (variant == 1) {
          o.is_causal = true;
          what += " causal top-left";
        } else if (variant == 2) {
          o.is_causal = true;
          o.causal_alignment = attn::CausalAlignment::kBottomRight;
          o.dropout_p = 0.2f;
          o.dropout_seed = seed;
          what += " causal bottom-right, dropout";
        } else if (variant == 4) {  // scale 0: every score 0, rows without keys still -inf
          o.is_causal = true;
          o.causal_alignment = attn::CausalAlignment::kBottomRight;
          o.scale = 0.0f;
          what += " causal bottom-right, scale 0";
        } else if (variant == 3) {  // grouped heads, a key-padding mask per batch
          Tensor pad = Tensor::zeros({2, 1, 1, Tk});
          for (int64_t j = Tk - Tk / 3; j < Tk; ++j) pad.at({1, 0, 0, j}) = kLowest;
          o.attn_mask = pad;
          what += " padded,";
          o.enable_gqa = true;
          Hkv = 1;
          what += " 3 heads on 1";
        } else {
          what += " full";
        }
        const Layout layout = variant % 2 == 0 ? Layout::kTokenMajor : Layout::kHeadMajor;
        const Inputs in = make_inputs(2, Hq, Tq, 64, layout, seed += 4, Hkv, Tk);
        const Result r = check_routed(in, o, worst, what);
        if (variant == 2 || variant == 4)  // bottom-right: query i sees keys j <= i + Tk - Tq
          for (int64_t i = 0; i < Tq && i + Tk - Tq < 0; ++i) {
            EXPECT_EQ(r.f.lse.at({0, 0, i}), kNegInf) << what << " row " << i;
            EXPECT_EQ(r.f.out.to(kF32).at({1, 2, i, 5}), 0.0f) << what << " row " << i;
          }
        EXPECT_STREQ(kn::sdpa_bf16_path(raw_problem(in, o)), path.c_str()) << what;
        SCOPED_TRACE(what + ": the raw layer");
        expect_same_result(run_raw(in, o, Layout::kHeadMajor), r);
      }
    print(worst, (path + ", Tq != Tk").c_str());
  });
}

}  // namespace
