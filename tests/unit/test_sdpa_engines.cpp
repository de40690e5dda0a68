// One table of attention cases run on every engine this CPU has (issue 41, as
// ggml's test-backend-ops runs its ops on every backend): the sdpa kernel's
// schedule on fp32 for each SIMD target, on bf16 with its tiles widened
// ("widened to fp32"), on bf16 with VDPBF16PS products ("AVX512-BF16"), and the
// AMX kernel ("AMX", which hands the calls it does not take to the sdpa
// kernel). Every case (masks, windows, both causal alignments, ALiBi, softcap,
// grouped heads, Tq != Tk, Dv != D, dropout, token-major inputs, varlen) runs
// forward and backward on every engine, so that no engine serves fewer cases
// than fp32 does, and each is held to its bound:
// - fp32: max |fused − ref| <= 2e-5 · max(1, max |ref|) per tensor (test_sdpa.cpp's);
// - bf16 widened: the fp32 kernel's bits on the widened inputs, rounded once
//   (backward given the bf16 out, widened), bit for bit;
// - bf16 native (AVX512-BF16, AMX: P and dS rounded to bf16 where they enter a
//   product): max |got − spec| <= 8e-3 · max |spec| for out, 4e-2 · max |spec|
//   for dq, dk, dv (test_sdpa_amx.cpp's), spec the fp32 reference on the
//   widened inputs;
// lse within 2e-5 · max(1, |lse|) (1e-5 native) and -inf exactly where the
// reference has it, on every engine. And each engine gives the same bits on
// one thread and on two. The largest error per engine is printed.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <iostream>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "attn/kernels.h"
#include "attn/sdpa.h"
#include "attn/sdpa_strided.h"
#include "attn/tensor.h"
#include "bf16_path_guard.h"
#include "bits.h"
#include "gradcheck.h"

#ifdef _OPENMP
#include <omp.h>
#endif

namespace {

using attn::CausalAlignment;
using attn::DType;
using attn::MaskType;
using attn::SdpaBackend;
using attn::SdpaOptions;
using attn::Shape;
using attn::Tensor;
using attn::test::same_bits;
namespace kn = attn::kernels;

constexpr DType kF32 = DType::kFloat32, kBf16 = DType::kBFloat16;

// ---- the engines --------------------------------------------------------------------------

enum class Check { kFp32, kWidenedBits, kNative };

struct Engine {
  std::string name;
  DType dtype;
  std::string target;     // the SIMD target forced ("": the automatic one)
  const char* bf16_path;  // the bf16 path forced (bf16 engines)
  Check check;
};

std::vector<Engine> engines() {
  std::vector<Engine> out;
  for (const std::string& target : kn::flash_attention_targets())
    out.push_back({"fp32 " + target, kF32, target, nullptr, Check::kFp32});
  out.push_back({"bf16 widened to fp32", kBf16, "", "widened to fp32", Check::kWidenedBits});
  const std::vector<std::string> paths = kn::flash_attention_bf16_paths();
  for (const char* native : {"AVX512-BF16", "AMX"}) {
    if (std::find(paths.begin(), paths.end(), native) == paths.end()) continue;
    const attn::test::Bf16PathGuard forced(native);
    // AVX512-BF16 runs on the sdpa kernel's dot engine, which needs an AVX-512 target.
    if (std::string(native) == "AVX512-BF16" && !kn::bf16_dot_engine_chosen()) continue;
    out.push_back({std::string("bf16 ") + native, kBf16, "", native, Check::kNative});
  }
  return out;
}

// The engine's target and bf16 path, forced for the guard's life.
class EngineGuard {
 public:
  explicit EngineGuard(const Engine& e)
      : path_(e.bf16_path ? e.bf16_path : kn::flash_attention_bf16_path()) {
    if (!e.target.empty()) {
      EXPECT_TRUE(kn::flash_attention_use_target(e.target.c_str()));
    }
  }
  ~EngineGuard() { kn::flash_attention_use_target(nullptr); }
  EngineGuard(const EngineGuard&) = delete;
  EngineGuard& operator=(const EngineGuard&) = delete;

 private:
  attn::test::Bf16PathGuard path_;
};

// ---- the cases ----------------------------------------------------------------------------

enum class Mask { kNone, kPadded, kBias, kBool };

struct Case {
  const char* name;
  int64_t B = 1, Hq = 2, Hkv = 2, Tq = 70, Tk = 70, D = 32, Dv = 32;
  bool causal = true;
  CausalAlignment align = CausalAlignment::kTopLeft;
  int64_t left = -1, right = -1;
  bool alibi = false;
  float softcap = 0.0f;
  Mask mask = Mask::kNone;
  float dropout_p = 0.0f;
  bool token_major = false;
  std::vector<int64_t> lens_q = {}, lens_k = {};  // varlen: the packed sequences' lengths
};

std::vector<Case> cases() {
  std::vector<Case> t;
  auto add = [&](const char* name, auto edit) {
    Case c;
    c.name = name;
    edit(c);
    t.push_back(c);
  };
  add("causal", [](Case&) {});
  add("full, T on no tile edge", [](Case& c) { c.causal = false, c.Tq = c.Tk = 129; });
  add("one token", [](Case& c) { c.Tq = c.Tk = 1; });
  add("D 80, two batches", [](Case& c) { c.B = 2, c.D = c.Dv = 80; });
  add("odd D 13", [](Case& c) { c.D = c.Dv = 13; });
  add("Dv != D", [](Case& c) { c.D = 48, c.Dv = 24; });
  add("window 16", [](Case& c) { c.left = 16, c.Tq = c.Tk = 150; });
  add("window both sides, full", [](Case& c) { c.causal = false, c.left = 9, c.right = 5; });
  add("ALiBi", [](Case& c) { c.alibi = true, c.Hq = c.Hkv = 4; });
  add("softcap 5", [](Case& c) { c.softcap = 5.0f; });
  add("GQA 6/2", [](Case& c) { c.Hq = 6, c.Hkv = 2; });
  add("Tq < Tk, bottom-right", [](Case& c) {
    c.Tq = 20, c.Tk = 100, c.align = CausalAlignment::kBottomRight;
  });
  add("Tq > Tk, bottom-right (queries with no key)", [](Case& c) {
    c.Tq = 90, c.Tk = 40, c.align = CausalAlignment::kBottomRight;
  });
  add("padded mask (float32 minimum)", [](Case& c) { c.mask = Mask::kPadded, c.B = 2; });
  add("bias mask per head, full", [](Case& c) { c.mask = Mask::kBias, c.causal = false; });
  add("boolean mask, full", [](Case& c) { c.mask = Mask::kBool, c.causal = false; });
  add("dropout 0.2", [](Case& c) { c.dropout_p = 0.2f; });
  add("token-major", [](Case& c) { c.token_major = true, c.Hq = 3, c.Hkv = 3; });
  add("Gemma-like: GQA, window, softcap", [](Case& c) {
    c.Hq = 4, c.Hkv = 2, c.left = 31, c.softcap = 50.0f, c.Tq = c.Tk = 130, c.D = c.Dv = 64;
  });
  add("varlen", [](Case& c) { c.lens_q = {5, 70, 0, 33}, c.lens_k = {5, 70, 3, 33}; });
  add("varlen: GQA, bottom-right, window, ALiBi, Dv != D", [](Case& c) {
    c.lens_q = {17, 64, 1}, c.lens_k = {40, 64, 9}, c.Hq = 4, c.Hkv = 2, c.D = 24, c.Dv = 40;
    c.align = CausalAlignment::kBottomRight, c.left = 20, c.alibi = true;
  });
  return t;
}

Tensor randn(const Shape& shape, uint64_t seed) { return attn::test::random_tensor(shape, seed); }

struct Inputs {
  Tensor q, k, v, dout;  // fp32
  Tensor cu_q, cu_k;     // varlen
  int64_t max_q = 0, max_k = 0;
  SdpaOptions o;
};

Inputs make_inputs(const Case& c, uint64_t seed) {
  Inputs in;
  SdpaOptions& o = in.o;
  o.is_causal = c.causal;
  o.causal_alignment = c.align;
  o.window_left = c.left, o.window_right = c.right;
  o.enable_gqa = c.Hq != c.Hkv;
  o.softcap = c.softcap;
  o.dropout_p = c.dropout_p;
  o.dropout_seed = 1234 + seed;
  if (c.alibi) {
    std::vector<float> slopes(size_t(c.Hq));
    for (int64_t h = 0; h < c.Hq; ++h) slopes[size_t(h)] = std::exp2(-8.0f * float(h + 1) / float(c.Hq));
    o.alibi_slopes = Tensor({c.Hq}, slopes);
  }
  if (!c.lens_q.empty()) {
    std::vector<int64_t> cq{0}, ck{0};
    for (size_t b = 0; b < c.lens_q.size(); ++b) {
      cq.push_back(cq.back() + c.lens_q[b]), ck.push_back(ck.back() + c.lens_k[b]);
      in.max_q = std::max(in.max_q, c.lens_q[b]), in.max_k = std::max(in.max_k, c.lens_k[b]);
    }
    in.cu_q = Tensor::from_int64({int64_t(cq.size())}, cq);
    in.cu_k = Tensor::from_int64({int64_t(ck.size())}, ck);
    in.q = randn({cq.back(), c.Hq, c.D}, seed);
    in.k = randn({ck.back(), c.Hkv, c.D}, seed + 1);
    in.v = randn({ck.back(), c.Hkv, c.Dv}, seed + 2);
    in.dout = randn({cq.back(), c.Hq, c.Dv}, seed + 3);
    return in;
  }
  auto make = [&](int64_t H, int64_t T, int64_t W, uint64_t s) {
    return c.token_major ? randn({c.B, T, H, W}, s).transpose(1, 2) : randn({c.B, H, T, W}, s);
  };
  in.q = make(c.Hq, c.Tq, c.D, seed), in.k = make(c.Hkv, c.Tk, c.D, seed + 1);
  in.v = make(c.Hkv, c.Tk, c.Dv, seed + 2);
  in.dout = randn({c.B, c.Hq, c.Tq, c.Dv}, seed + 3);
  const float closed = std::numeric_limits<float>::lowest();
  switch (c.mask) {
    case Mask::kNone:
      break;
    case Mask::kPadded: {  // (B, 1, 1, Tk): the second sequence's last 25 keys closed
      Tensor m = Tensor::zeros({c.B, 1, 1, c.Tk});
      for (int64_t j = c.Tk - 25; j < c.Tk; ++j) m.at({c.B - 1, 0, 0, j}) = closed;
      o.attn_mask = m;
      break;
    }
    case Mask::kBias:  // (1, Hq, Tq, Tk) finite values
      o.attn_mask = randn({1, c.Hq, c.Tq, c.Tk}, seed + 9);
      break;
    case Mask::kBool: {  // (Tq, Tk), a quarter closed, the diagonal open
      Tensor m = Tensor::zeros({c.Tq, c.Tk});
      const Tensor u = randn({c.Tq, c.Tk}, seed + 8);
      for (int64_t i = 0; i < c.Tq; ++i)
        for (int64_t j = 0; j < c.Tk; ++j)
          m.at({i, j}) = i == j || u.at({i, j}) > -0.67f ? 1.0f : 0.0f;
      o.attn_mask = m;
      o.attn_mask_type = MaskType::kBoolean;
      break;
    }
  }
  return in;
}

struct Result {
  Tensor out, lse, dq, dk, dv;
};

// Forward, then backward given `out_for_backward` (the forward's own out when empty).
Result run(const Inputs& in, DType dtype, SdpaBackend backend, const Tensor& out_given = {}) {
  SdpaOptions o = in.o;
  o.backend = backend;
  const Tensor q = in.q.to(dtype), k = in.k.to(dtype), v = in.v.to(dtype),
               dout = in.dout.to(dtype);
  Result r;
  if (in.cu_q.empty()) {
    const attn::SdpaForward f = attn::scaled_dot_product_attention_forward(q, k, v, o);
    r.out = f.out, r.lse = f.lse;
    const Tensor out = out_given.empty() ? f.out : out_given;
    const attn::SdpaGrads g =
        attn::scaled_dot_product_attention_backward(dout, q, k, v, out, f.lse, o);
    r.dq = g.dq, r.dk = g.dk, r.dv = g.dv;
  } else {
    const attn::SdpaForward f =
        attn::sdpa_varlen_forward(q, k, v, in.cu_q, in.cu_k, in.max_q, in.max_k, o);
    r.out = f.out, r.lse = f.lse;
    const Tensor out = out_given.empty() ? f.out : out_given;
    const attn::SdpaGrads g = attn::sdpa_varlen_backward(dout, q, k, v, out, f.lse, in.cu_q,
                                                         in.cu_k, in.max_q, in.max_k, o);
    r.dq = g.dq, r.dk = g.dk, r.dv = g.dv;
  }
  return r;
}

// max |got − want| / (rel · max(floor, max |want|)); infinite for a non-finite got.
double ratio(const Tensor& got, const Tensor& want, double rel, double floor) {
  EXPECT_EQ(got.shape(), want.shape());
  const std::vector<float> x = got.to(kF32).to_vector(), y = want.to(kF32).to_vector();
  double err = 0.0, scale = floor;
  for (size_t n = 0; n < x.size(); ++n) {
    if (!std::isfinite(x[n])) return std::numeric_limits<double>::infinity();
    err = std::max(err, std::fabs(double(x[n]) - double(y[n])));
    scale = std::max(scale, std::fabs(double(y[n])));
  }
  return err / (rel * (scale > 0.0 ? scale : 1.0));
}

// lse within rel · max(1, |lse|), -inf exactly where want has it.
double lse_ratio(const Tensor& got, const Tensor& want, double rel) {
  const std::vector<float> x = got.to_vector(), y = want.to_vector();
  EXPECT_EQ(x.size(), y.size());
  double worst = 0.0;
  for (size_t n = 0; n < std::min(x.size(), y.size()); ++n) {
    if (std::isinf(y[n]) || std::isinf(x[n])) {
      if (x[n] != y[n]) return std::numeric_limits<double>::infinity();
      continue;
    }
    worst = std::max(worst, std::fabs(double(x[n]) - double(y[n])) /
                                (rel * std::max(1.0, std::fabs(double(y[n])))));
  }
  return worst;
}

// ---- the table on every engine ------------------------------------------------------------

TEST(SdpaEngines, EveryCaseOnEveryEngine) {
  const std::vector<Engine> all = engines();
  std::map<std::string, double> worst;
  uint64_t seed = 500;
  for (const Case& c : cases()) {
    SCOPED_TRACE(c.name);
    const Inputs in = make_inputs(c, seed += 10);
    const Result ref = run(in, kF32, SdpaBackend::kReference);
    for (const Engine& e : all) {
      SCOPED_TRACE(e.name);
      Result got;
      {
        const EngineGuard guard(e);
        got = run(in, e.dtype, SdpaBackend::kFused);
      }
      auto record = [&](double r) {
        worst[e.name] = std::max(worst[e.name], r);
        return r;
      };
      switch (e.check) {
        case Check::kFp32:
          EXPECT_LE(record(ratio(got.out, ref.out, 2e-5, 1.0)), 1.0) << "out";
          EXPECT_LE(record(lse_ratio(got.lse, ref.lse, 2e-5)), 1.0) << "lse";
          EXPECT_LE(record(ratio(got.dq, ref.dq, 2e-5, 1.0)), 1.0) << "dq";
          EXPECT_LE(record(ratio(got.dk, ref.dk, 2e-5, 1.0)), 1.0) << "dk";
          EXPECT_LE(record(ratio(got.dv, ref.dv, 2e-5, 1.0)), 1.0) << "dv";
          break;
        case Check::kWidenedBits: {
          // The fp32 kernel on the bf16 values widened; backward given the bf16 out.
          Inputs wide = in;
          wide.q = in.q.to(kBf16).to(kF32), wide.k = in.k.to(kBf16).to(kF32);
          wide.v = in.v.to(kBf16).to(kF32), wide.dout = in.dout.to(kBf16).to(kF32);
          const Result f32 = run(wide, kF32, SdpaBackend::kFused, got.out.to(kF32));
          EXPECT_TRUE(same_bits(got.out, f32.out.to(kBf16))) << "out";
          EXPECT_TRUE(same_bits(got.lse, f32.lse)) << "lse";
          EXPECT_TRUE(same_bits(got.dq, f32.dq.to(kBf16))) << "dq";
          EXPECT_TRUE(same_bits(got.dk, f32.dk.to(kBf16))) << "dk";
          EXPECT_TRUE(same_bits(got.dv, f32.dv.to(kBf16))) << "dv";
          break;
        }
        case Check::kNative: {
          Inputs wide = in;
          wide.q = in.q.to(kBf16).to(kF32), wide.k = in.k.to(kBf16).to(kF32);
          wide.v = in.v.to(kBf16).to(kF32), wide.dout = in.dout.to(kBf16).to(kF32);
          const Result spec = run(wide, kF32, SdpaBackend::kReference);
          EXPECT_LE(record(ratio(got.out, spec.out, 8e-3, 0.0)), 1.0) << "out";
          EXPECT_LE(record(lse_ratio(got.lse, spec.lse, 1e-5)), 1.0) << "lse";
          EXPECT_LE(record(ratio(got.dq, spec.dq, 4e-2, 0.0)), 1.0) << "dq";
          EXPECT_LE(record(ratio(got.dk, spec.dk, 4e-2, 0.0)), 1.0) << "dk";
          EXPECT_LE(record(ratio(got.dv, spec.dv, 4e-2, 0.0)), 1.0) << "dv";
          break;
        }
      }
    }
  }
  for (const auto& [name, r] : worst)
    std::cout << "[sdpa engines] " << name << ": largest error / bound " << r << "\n";
}

// A bool mask through the strided front door (PyTorch's bool attn_mask, as the
// Python binding passes it) is read where it lies, a byte per value: on every
// engine it gives the bits of the same pattern as an additive 0 / -inf mask,
// forward and backward, whatever its layout (one plane shared by every head,
// a plane per head with a row that sees no key and true stored as 7, a padding
// mask broadcast over queries, a transposed one), and the fp32 engines agree
// with the reference.
TEST(SdpaEngines, BoolMasksReadInPlaceGiveTheirAdditiveFormsBits) {
  const int64_t B = 2, Hq = 4, Hkv = 2, Tq = 70, Tk = 133, D = 32;
  struct Layout {
    const char* name;
    std::vector<int64_t> sizes;  // 4-D
    bool transposed = false;     // stored (keys, queries): key stride Tq
    bool causal_window = false;  // bottom-right causal with a window of 40
  };
  const std::vector<Layout> layouts = {
      {"(Tq, Tk) shared", {1, 1, Tq, Tk}},
      {"(B, Hq, Tq, Tk) per head", {B, Hq, Tq, Tk}},
      {"(B, 1, 1, Tk) padding", {B, 1, 1, Tk}},
      {"(Tq, Tk) transposed", {1, 1, Tq, Tk}, true},
      {"(Tq, Tk) shared, causal window", {1, 1, Tq, Tk}, false, true},
  };
  const Tensor q = randn({B, Hq, Tq, D}, 71), k = randn({B, Hkv, Tk, D}, 72),
               v = randn({B, Hkv, Tk, D}, 73), dout = randn({B, Hq, Tq, D}, 74);
  const Tensor u = randn({B, Hq, Tq, Tk}, 75);
  const char* who = "test";
  for (const Layout& L : layouts) {
    SCOPED_TRACE(L.name);
    const std::vector<int64_t>& n = L.sizes;
    const int64_t count = n[0] * n[1] * n[2] * n[3];
    // The pattern at (b, h, i, j) of the mask's own sizes; row (1, 3, 5) sees no key.
    std::vector<uint8_t> open(static_cast<size_t>(count));
    std::vector<int64_t> st = {n[1] * n[2] * n[3], n[2] * n[3], n[3], 1};
    if (L.transposed) st = {n[1] * n[2] * n[3], n[2] * n[3], 1, n[2]};
    std::vector<float> additive(static_cast<size_t>(count));
    for (int64_t b = 0; b < n[0]; ++b)
      for (int64_t h = 0; h < n[1]; ++h)
        for (int64_t i = 0; i < n[2]; ++i)
          for (int64_t j = 0; j < n[3]; ++j) {
            const bool no_key = n[1] > 1 && b == 1 && h == 3 && i == 5;
            const bool is_open = !no_key && (j == i || u.at({b, h, i, j}) > 0.0f);
            const size_t at = size_t(b * st[0] + h * st[1] + i * st[2] + j * st[3]);
            open[at] = is_open ? (j % 3 == 0 ? 7 : 1) : 0;
            additive[at] = is_open ? 0.0f : -std::numeric_limits<float>::infinity();
          }
    const attn::StridedTensor bool_mask(who, "attn_mask", reinterpret_cast<uintptr_t>(open.data()),
                                        "bool", n, st);
    const attn::StridedTensor float_mask(
        who, "attn_mask", reinterpret_cast<uintptr_t>(additive.data()), "float32", n, st);
    SdpaOptions o;
    o.enable_gqa = true;
    if (L.causal_window) {
      o.is_causal = true, o.causal_alignment = CausalAlignment::kBottomRight, o.window_left = 40;
    }
    for (const Engine& e : engines()) {
      SCOPED_TRACE(e.name);
      const EngineGuard guard(e);
      auto run_with = [&](const attn::StridedTensor& mask) {
        Result r;
        const Tensor qe = q.to(e.dtype), ke = k.to(e.dtype), ve = v.to(e.dtype),
                     de = dout.to(e.dtype);
        r.out = Tensor::zeros({B, Hq, Tq, D}).to(e.dtype), r.lse = Tensor::zeros({B, Hq, Tq});
        r.dq = Tensor::zeros({B, Hq, Tq, D}).to(e.dtype);
        r.dk = Tensor::zeros({B, Hkv, Tk, D}).to(e.dtype);
        r.dv = Tensor::zeros({B, Hkv, Tk, D}).to(e.dtype);
        const std::string dt = e.dtype == kF32 ? "float32" : "bfloat16";
        auto ref = [&](const char* name, const Tensor& t) {
          const uintptr_t data = e.dtype == kF32 || name == std::string("lse")
                                     ? reinterpret_cast<uintptr_t>(t.data_ptr<float>())
                                     : reinterpret_cast<uintptr_t>(t.data_ptr<attn::BFloat16>());
          std::vector<int64_t> strides(t.shape().size());
          for (size_t d = 0; d < strides.size(); ++d) strides[d] = t.stride(int64_t(d));
          return attn::StridedTensor(who, name, data, name == std::string("lse") ? "float32" : dt,
                                     t.shape(), strides);
        };
        attn::sdpa_forward_strided(who, ref("q", qe), ref("k", ke), ref("v", ve), ref("out", r.out),
                                   ref("lse", r.lse), &mask, nullptr, o);
        attn::sdpa_backward_strided(who, ref("dout", de), ref("q", qe), ref("k", ke), ref("v", ve),
                                    ref("out", r.out), ref("lse", r.lse), ref("dq", r.dq),
                                    ref("dk", r.dk), ref("dv", r.dv), &mask, nullptr, o);
        return r;
      };
      const Result got = run_with(bool_mask), want = run_with(float_mask);
      EXPECT_TRUE(same_bits(got.out, want.out)) << "out";
      EXPECT_TRUE(same_bits(got.lse, want.lse)) << "lse";
      EXPECT_TRUE(same_bits(got.dq, want.dq)) << "dq";
      EXPECT_TRUE(same_bits(got.dk, want.dk)) << "dk";
      EXPECT_TRUE(same_bits(got.dv, want.dv)) << "dv";
      if (e.check != Check::kFp32) continue;
      // The reference on the additive form, through the Tensor entry points.
      Inputs in;
      in.q = q, in.k = k, in.v = v, in.dout = dout, in.o = o;
      Tensor m({n[0], n[1], n[2], n[3]});
      for (int64_t b = 0; b < n[0]; ++b)
        for (int64_t h = 0; h < n[1]; ++h)
          for (int64_t i = 0; i < n[2]; ++i)
            for (int64_t j = 0; j < n[3]; ++j)
              m.at({b, h, i, j}) = additive[size_t(b * st[0] + h * st[1] + i * st[2] + j * st[3])];
      in.o.attn_mask = m;
      const Result ref = run(in, kF32, SdpaBackend::kReference);
      EXPECT_LE(ratio(got.out, ref.out, 2e-5, 1.0), 1.0) << "out";
      EXPECT_LE(lse_ratio(got.lse, ref.lse, 2e-5), 1.0) << "lse";
      EXPECT_LE(ratio(got.dq, ref.dq, 2e-5, 1.0), 1.0) << "dq";
      EXPECT_LE(ratio(got.dk, ref.dk, 2e-5, 1.0), 1.0) << "dk";
      EXPECT_LE(ratio(got.dv, ref.dv, 2e-5, 1.0), 1.0) << "dv";
    }
  }
}

// Each engine's bits do not depend on the thread count.
TEST(SdpaEngines, OneThreadAndTwoGiveTheSameBits) {
#ifdef _OPENMP
  const int threads = omp_get_max_threads();
  uint64_t seed = 900;
  for (const Case& c : cases()) {
    if (std::string(c.name) != "causal" && std::string(c.name) != "GQA 6/2" &&
        std::string(c.name) != "window 16" && std::string(c.name) != "varlen")
      continue;
    SCOPED_TRACE(c.name);
    const Inputs in = make_inputs(c, seed += 10);
    for (const Engine& e : engines()) {
      SCOPED_TRACE(e.name);
      const EngineGuard guard(e);
      omp_set_num_threads(1);
      const Result one = run(in, e.dtype, SdpaBackend::kFused);
      omp_set_num_threads(2);
      const Result two = run(in, e.dtype, SdpaBackend::kFused);
      omp_set_num_threads(threads);
      EXPECT_TRUE(same_bits(one.out, two.out)) << "out";
      EXPECT_TRUE(same_bits(one.lse, two.lse)) << "lse";
      EXPECT_TRUE(same_bits(one.dq, two.dq)) << "dq";
      EXPECT_TRUE(same_bits(one.dk, two.dk)) << "dk";
      EXPECT_TRUE(same_bits(one.dv, two.dv)) << "dv";
    }
  }
#else
  GTEST_SKIP() << "built without OpenMP";
#endif
}

}  // namespace
