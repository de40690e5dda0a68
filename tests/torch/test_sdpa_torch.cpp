// scaled_dot_product_attention (attn/sdpa.h) against PyTorch 1.13's explicit
// maths in float64 (tests/torch/oracle_sdpa.py): 72 random configurations of
// Tq != Tk with both causal alignments, GQA ratios 1, 2, 4, 8, boolean and
// additive masks of every broadcast shape, windows, ALiBi, softcap, explicit
// scales, D != Dv; the output, lse and the three gradients, for the plain
// reference and for the fused kernel.
//
// Tolerance: max |attn − torch| <= 1e-5 · max(1, max |torch|) per tensor
// (attn sums in float32, torch's result is float64 rounded once; the largest
// error seen is about 1.1e-6); lse within 1e-5 · max(1, |lse|), and -inf
// exactly where torch has it (rows with no key). The same for packed
// variable-length batches (sdpa_varlen_*, sdpa_varlen.json).
//
// bfloat16 (sdpa_bf16.json, 48 cases of the same kinds): torch's float64 maths
// on the bf16-rounded inputs; attn's bf16 results must lie within bf16's
// rounding of them: |attn − torch| <= 2^-8 · |torch| + 1e-5 · max(1, max |torch|)
// per element (2^-8: round to nearest with 8 significant bits; 1e-5: the
// float32 sums, as above). The fused backward is given the bf16 out torch's
// output rounds to, and compared with the gradients that use D = rowsum(dout ⊙
// out_bf16) (what it computes, and PyTorch's flash backward); the reference
// recomputes D from P, and is compared with autograd's exact gradients.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <iostream>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "attn/kernels.h"
#include "attn/sdpa.h"
#include "bf16_path_guard.h"
#include "oracle.h"

namespace attn::test {
namespace {

using Json = nlohmann::json;

constexpr double kTolerance = 1e-5;

double rel_err(const Tensor& got, const Tensor& want) {
  EXPECT_EQ(got.shape(), want.shape());
  const std::vector<float> x = got.to_vector(), y = want.to_vector();
  double worst = 0.0, scale = 1.0;
  for (size_t n = 0; n < x.size(); ++n) {
    if (std::isnan(x[n])) return std::numeric_limits<double>::infinity();
    worst = std::max(worst, double(std::fabs(x[n] - y[n])));
    scale = std::max(scale, double(std::fabs(y[n])));
  }
  return worst / scale;
}

std::string describe(const Json& c) {
  return "seed " + std::to_string(c.at("seed").get<int>()) + ": " + c.at("B").dump() + "x" +
         c.at("Hq").dump() + "/" + c.at("Hkv").dump() + " heads, Tq " + c.at("Tq").dump() +
         ", Tk " + c.at("Tk").dump() + ", D " + c.at("D").dump() + ", Dv " + c.at("Dv").dump() +
         ", causal " + c.at("is_causal").dump() + ", bottom_right " + c.at("bottom_right").dump() +
         ", window (" + c.at("window_left").dump() + ", " + c.at("window_right").dump() +
         "), alibi " + c.at("alibi").dump() + ", softcap " + c.at("softcap").dump() + ", mask " +
         c.at("mask").get<std::string>() + " " + c.at("mask_shape").dump();
}

// A case's SdpaOptions, as oracle_sdpa.py recorded them (its mask and ALiBi
// slopes from the case's inputs).
SdpaOptions options_of(const Json& c) {
  const Json& in = c.at("inputs");
  SdpaOptions o;
  o.is_causal = c.at("is_causal").get<bool>();
  o.causal_alignment =
      c.at("bottom_right").get<bool>() ? CausalAlignment::kBottomRight : CausalAlignment::kTopLeft;
  o.window_left = c.at("window_left").get<int64_t>();
  o.window_right = c.at("window_right").get<int64_t>();
  o.softcap = c.at("softcap").get<float>();
  if (!c.at("scale").is_null()) o.scale = c.at("scale").get<float>();
  o.enable_gqa = c.at("Hq") != c.at("Hkv");
  const std::string mask = c.at("mask").get<std::string>();
  if (mask != "none") {
    o.attn_mask = tensor_from_bits_json(in.at("mask"));
    o.attn_mask_type = mask == "bool" ? MaskType::kBoolean : MaskType::kAdditive;
  }
  if (in.contains("alibi_slopes")) o.alibi_slopes = tensor_from_bits_json(in.at("alibi_slopes"));
  return o;
}

TEST(SdpaTorch, ReferenceAndKernelMatchTorchExplicitMaths) {
  const Json file = read_oracle_json("sdpa.json", "oracle_sdpa.py");
  const Json& cases = file.at("cases");
  ASSERT_GE(cases.size(), 60u);
  double worst[2] = {0.0, 0.0};
  for (const Json& c : cases) {
    SCOPED_TRACE(describe(c));
    const Json& in = c.at("inputs");
    const Tensor q = tensor_from_bits_json(in.at("q")), k = tensor_from_bits_json(in.at("k"));
    const Tensor v = tensor_from_bits_json(in.at("v")), dout = tensor_from_bits_json(in.at("dout"));
    SdpaOptions o = options_of(c);
    const Json& want = c.at("expected");
    for (SdpaBackend backend : {SdpaBackend::kReference, SdpaBackend::kFused}) {
      SCOPED_TRACE(backend == SdpaBackend::kReference ? "reference" : "fused");
      o.backend = backend;
      const SdpaForward f = scaled_dot_product_attention_forward(q, k, v, o);
      const SdpaGrads g = scaled_dot_product_attention_backward(dout, q, k, v, f.out, f.lse, o);
      double& w = worst[backend == SdpaBackend::kFused];
      const auto check = [&](const char* name, const Tensor& got) {
        const double err = rel_err(got, tensor_from_bits_json(want.at(name)));
        w = std::max(w, err);
        EXPECT_LE(err, kTolerance) << name;
      };
      check("out", f.out);
      check("dq", g.dq);
      check("dk", g.dk);
      check("dv", g.dv);
      const std::vector<float> lse = f.lse.to_vector();
      const std::vector<float> lse_want = tensor_from_bits_json(want.at("lse")).to_vector();
      ASSERT_EQ(lse.size(), lse_want.size());
      for (size_t n = 0; n < lse.size(); ++n) {
        if (std::isinf(lse_want[n])) {
          EXPECT_EQ(lse[n], lse_want[n]) << "lse[" << n << "]";
        } else {
          EXPECT_NEAR(lse[n], lse_want[n], kTolerance * std::max(1.0f, std::fabs(lse_want[n])))
              << "lse[" << n << "]";
        }
      }
    }
  }
  std::cout << "[sdpa vs torch] largest relative error: reference " << worst[0] << ", fused "
            << worst[1] << " over " << cases.size() << " cases\n";
}

// max over elements of |got − want| / (2^-8 · |want| + 1e-5 · max(1, max |want|)): <= 1 passes.
double bf16_bound_ratio(const Tensor& got, const Tensor& want) {
  EXPECT_EQ(got.shape(), want.shape());
  const std::vector<float> x = got.to_vector(), y = want.to_vector();
  double scale = 1.0;
  for (float w : y) scale = std::max(scale, double(std::fabs(w)));
  double worst = 0.0;
  for (size_t n = 0; n < x.size(); ++n) {
    if (std::isnan(x[n])) return std::numeric_limits<double>::infinity();
    const double err = std::fabs(double(x[n]) - double(y[n]));
    worst = std::max(worst, err / (std::fabs(double(y[n])) / 256.0 + kTolerance * scale));
  }
  return worst;
}

TEST(SdpaTorch, Bfloat16WithinRoundingOfTorchOnBf16Inputs) {
  // The bounds below are the widened path's (fp32 sums, out rounded once): keep the
  // kernel off its AMX route (test_sdpa_amx.cpp tests that one against torch's maths too).
  const attn::test::Bf16PathGuard widened("widened to fp32");
  const Json file = read_oracle_json("sdpa_bf16.json", "oracle_sdpa.py");
  const Json& cases = file.at("cases");
  ASSERT_GE(cases.size(), 40u);
  const DType bf16 = DType::kBFloat16;
  double worst[2] = {0.0, 0.0}, fused_vs_exact = 0.0;
  for (const Json& c : cases) {
    SCOPED_TRACE(describe(c));
    const Json& in = c.at("inputs");
    const Tensor q = tensor_from_bits_json(in.at("q")).to(bf16);
    const Tensor k = tensor_from_bits_json(in.at("k")).to(bf16);
    const Tensor v = tensor_from_bits_json(in.at("v")).to(bf16);
    const Tensor dout = tensor_from_bits_json(in.at("dout")).to(bf16);
    SdpaOptions o = options_of(c);
    const Json& want = c.at("expected");
    const Tensor out_bf16 = tensor_from_bits_json(want.at("out_bf16")).to(bf16);
    for (SdpaBackend backend : {SdpaBackend::kReference, SdpaBackend::kFused}) {
      const bool fused = backend == SdpaBackend::kFused;
      SCOPED_TRACE(fused ? "fused" : "reference");
      o.backend = backend;
      const SdpaForward f = scaled_dot_product_attention_forward(q, k, v, o);
      ASSERT_EQ(f.out.dtype(), bf16);
      const SdpaGrads g = scaled_dot_product_attention_backward(dout, q, k, v, out_bf16, f.lse, o);
      ASSERT_EQ(g.dq.dtype(), bf16);
      const auto check = [&](const char* name, const Tensor& got, const std::string& key) {
        const double ratio = bf16_bound_ratio(got, tensor_from_bits_json(want.at(key)));
        worst[fused] = std::max(worst[fused], ratio);
        EXPECT_LE(ratio, 1.0) << name << " against " << key;
      };
      check("out", f.out, "out");
      const std::string suffix = fused ? "_from_out_bf16" : "";
      check("dq", g.dq, "dq" + suffix);
      check("dk", g.dk, "dk" + suffix);
      check("dv", g.dv, "dv" + suffix);
      if (fused)
        for (const auto& [got, key] : {std::pair{&g.dq, "dq"}, {&g.dk, "dk"}, {&g.dv, "dv"}})
          fused_vs_exact =
              std::max(fused_vs_exact, rel_err(*got, tensor_from_bits_json(want.at(key))));
      const std::vector<float> lse = f.lse.to_vector();
      const std::vector<float> lse_want = tensor_from_bits_json(want.at("lse")).to_vector();
      ASSERT_EQ(lse.size(), lse_want.size());
      for (size_t n = 0; n < lse.size(); ++n) {
        if (std::isinf(lse_want[n])) {
          EXPECT_EQ(lse[n], lse_want[n]) << "lse[" << n << "]";
        } else {
          EXPECT_NEAR(lse[n], lse_want[n], kTolerance * std::max(1.0f, std::fabs(lse_want[n])))
              << "lse[" << n << "]";
        }
      }
    }
  }
  std::cout << "[sdpa bf16 vs torch] largest error / bf16 bound: reference " << worst[0]
            << ", fused " << worst[1] << " over " << cases.size()
            << " cases; fused gradients vs the exact ones (D from the exact out): largest "
               "relative error "
            << fused_vs_exact << "\n";
}

// Rows whose softmax sits on one key (sdpa_exact.json, issue 44): Tk = 1,
// causal with window_left = 0, a boolean mask leaving one key per row, and an
// additive mask putting all of a row's weight but e^-40 on one key; float32
// and bf16 inputs. The softmax's gradient with respect to a lone key's score
// is exactly 0, so dq and dk are exactly 0 (torch's float64 maths gives 0 too)
// in the first three kinds and below 1e-15 in the last; every engine must
// give exactly 0 there, and |attn − torch| <= 1e-12 for the near one-hot rows
// (the row term D = rowsum(dO ⊙ O) summed as dP is: sdpa_kernel.cpp's
// RowTerms; before it, up to 7e-5 of noise). out, lse and dv within the
// bounds of the tests above (fp32: 1e-5 relative; bf16: bf16's rounding),
// bf16 gradients against those with D from the bf16 out. Engines: fp32 on
// each SIMD target, bf16 widened to fp32, bf16 on AVX512-BF16 products; and
// the plain reference.
TEST(SdpaTorch, RowsOnOneKeyHaveExactGradientsOnEveryEngine) {
  const Json file = read_oracle_json("sdpa_exact.json", "oracle_sdpa.py");
  const Json& cases = file.at("cases");
  ASSERT_GE(cases.size(), 32u);
  const DType bf16 = DType::kBFloat16;
  double near_worst = 0.0;
  size_t runs = 0;
  for (const Json& c : cases) {
    SCOPED_TRACE(c.at("kind").get<std::string>() + ", " + describe(c));
    const bool is_bf16 = c.contains("expected") && c.at("expected").contains("out_bf16");
    const bool exact_zero = c.at("kind") != "near one-hot";
    const Json& in = c.at("inputs");
    auto input = [&](const char* name) {
      const Tensor x = tensor_from_bits_json(in.at(name));
      return is_bf16 ? x.to(bf16) : x;
    };
    const Tensor q = input("q"), k = input("k"), v = input("v"), dout = input("dout");
    SdpaOptions o = options_of(c);
    const Json& want = c.at("expected");
    // (engine, SIMD target or "", bf16 path or nullptr)
    struct Run {
      std::string name, target;
      const char* path;
      SdpaBackend backend;
    };
    std::vector<Run> engines{{"reference", "", nullptr, SdpaBackend::kReference}};
    if (!is_bf16) {
      for (const std::string& t : kernels::flash_attention_targets())
        engines.push_back({"fp32 " + t, t, nullptr, SdpaBackend::kFused});
    } else {
      engines.push_back({"bf16 widened to fp32", "", "widened to fp32", SdpaBackend::kFused});
      const std::vector<std::string> paths = kernels::flash_attention_bf16_paths();
      if (std::find(paths.begin(), paths.end(), "AVX512-BF16") != paths.end()) {
        const Bf16PathGuard forced("AVX512-BF16");
        if (kernels::bf16_dot_engine_chosen())
          engines.push_back({"bf16 AVX512-BF16", "", "AVX512-BF16", SdpaBackend::kFused});
      }
    }
    for (const Run& e : engines) {
      SCOPED_TRACE(e.name);
      if (!e.target.empty()) {
        ASSERT_TRUE(kernels::flash_attention_use_target(e.target.c_str()));
      }
      const Bf16PathGuard path(e.path ? e.path : kernels::flash_attention_bf16_path());
      o.backend = e.backend;
      const SdpaForward f = scaled_dot_product_attention_forward(q, k, v, o);
      const Tensor out_used = is_bf16 ? tensor_from_bits_json(want.at("out_bf16")).to(bf16) : f.out;
      const SdpaGrads g = scaled_dot_product_attention_backward(dout, q, k, v, out_used, f.lse, o);
      kernels::flash_attention_use_target(nullptr);
      ++runs;
      // bf16 fused: the gradients with D from the bf16 out; the reference recomputes D from P.
      const std::string suffix =
          is_bf16 && e.backend == SdpaBackend::kFused ? "_from_out_bf16" : "";
      const auto close = [&](const char* name, const Tensor& got, const std::string& key) {
        const Tensor w = tensor_from_bits_json(want.at(key));
        if (is_bf16) {
          EXPECT_LE(bf16_bound_ratio(got, w), 1.0) << name;
        } else {
          EXPECT_LE(rel_err(got, w), kTolerance) << name;
        }
      };
      close("out", f.out, "out");
      close("dv", g.dv, "dv" + suffix);
      for (const auto& [got, name] : {std::pair{&g.dq, "dq"}, {&g.dk, "dk"}}) {
        const std::vector<float> x = got->to_vector();
        const std::vector<float> y = tensor_from_bits_json(want.at(name + suffix)).to_vector();
        ASSERT_EQ(x.size(), y.size());
        double worst = 0.0;
        size_t nonzero = 0;
        for (size_t n = 0; n < x.size(); ++n) {
          worst = std::max(worst, std::fabs(double(x[n]) - double(y[n])));
          nonzero += x[n] != 0.0f;
        }
        if (exact_zero) {
          EXPECT_EQ(nonzero, 0u) << name << ": " << nonzero << " of " << x.size()
                                 << " values not 0, largest |value| " << worst;
        } else {
          EXPECT_LE(worst, 1e-12) << name;
          near_worst = std::max(near_worst, worst);
        }
      }
      const std::vector<float> lse = f.lse.to_vector();
      const std::vector<float> lse_want = tensor_from_bits_json(want.at("lse")).to_vector();
      ASSERT_EQ(lse.size(), lse_want.size());
      for (size_t n = 0; n < lse.size(); ++n) {
        if (std::isinf(lse_want[n])) {
          EXPECT_EQ(lse[n], lse_want[n]) << "lse[" << n << "]";
        } else {
          EXPECT_NEAR(lse[n], lse_want[n], kTolerance * std::max(1.0f, std::fabs(lse_want[n])))
              << "lse[" << n << "]";
        }
      }
    }
  }
  std::cout << "[sdpa one key vs torch] " << runs << " runs over " << cases.size()
            << " cases; near one-hot rows: largest |dq, dk − torch| " << near_worst << "\n";
}

// Packed variable-length batches (sdpa_varlen_*): 32 random configurations of
// 1-4 sequences with lengths 0, 1, 3, 8, 16, 17, 33 (Tq_b != Tk_b), each
// sequence the explicit maths on its own rows (oracle_sdpa.py's varlen_sdpa);
// output, lse (Hq, total_q) and the three gradients, reference and kernel.
TEST(SdpaTorch, VarlenReferenceAndKernelMatchTorchPerSequence) {
  const Json file = read_oracle_json("sdpa_varlen.json", "oracle_sdpa.py");
  const Json& cases = file.at("cases");
  ASSERT_GE(cases.size(), 30u);
  double worst[2] = {0.0, 0.0};
  for (const Json& c : cases) {
    SCOPED_TRACE("seed " + std::to_string(c.at("seed").get<int>()) + ": lens_q " +
                 c.at("lens_q").dump() + ", lens_k " + c.at("lens_k").dump() + ", " +
                 c.at("Hq").dump() + "/" + c.at("Hkv").dump() + " heads, D " + c.at("D").dump() +
                 ", Dv " + c.at("Dv").dump() + ", causal " + c.at("is_causal").dump() +
                 ", bottom_right " + c.at("bottom_right").dump() + ", window (" +
                 c.at("window_left").dump() + ", " + c.at("window_right").dump() + "), alibi " +
                 c.at("alibi").dump() + ", softcap " + c.at("softcap").dump());
    const Json& in = c.at("inputs");
    const Tensor q = tensor_from_bits_json(in.at("q")), k = tensor_from_bits_json(in.at("k"));
    const Tensor v = tensor_from_bits_json(in.at("v")), dout = tensor_from_bits_json(in.at("dout"));
    std::vector<int64_t> cu_q{0}, cu_k{0};
    int64_t max_q = 0, max_k = 0;
    for (int64_t n : c.at("lens_q").get<std::vector<int64_t>>())
      cu_q.push_back(cu_q.back() + n), max_q = std::max(max_q, n);
    for (int64_t n : c.at("lens_k").get<std::vector<int64_t>>())
      cu_k.push_back(cu_k.back() + n), max_k = std::max(max_k, n);
    const Tensor cu_seqlens_q = Tensor::from_int64({int64_t(cu_q.size())}, cu_q);
    const Tensor cu_seqlens_k = Tensor::from_int64({int64_t(cu_k.size())}, cu_k);
    SdpaOptions o;
    o.is_causal = c.at("is_causal").get<bool>();
    o.causal_alignment = c.at("bottom_right").get<bool>() ? CausalAlignment::kBottomRight
                                                          : CausalAlignment::kTopLeft;
    o.window_left = c.at("window_left").get<int64_t>();
    o.window_right = c.at("window_right").get<int64_t>();
    o.softcap = c.at("softcap").get<float>();
    if (!c.at("scale").is_null()) o.scale = c.at("scale").get<float>();
    o.enable_gqa = c.at("Hq") != c.at("Hkv");
    if (in.contains("alibi_slopes")) o.alibi_slopes = tensor_from_bits_json(in.at("alibi_slopes"));
    const Json& want = c.at("expected");
    for (SdpaBackend backend : {SdpaBackend::kReference, SdpaBackend::kFused}) {
      SCOPED_TRACE(backend == SdpaBackend::kReference ? "reference" : "fused");
      o.backend = backend;
      const SdpaForward f =
          sdpa_varlen_forward(q, k, v, cu_seqlens_q, cu_seqlens_k, max_q, max_k, o);
      const SdpaGrads g = sdpa_varlen_backward(dout, q, k, v, f.out, f.lse, cu_seqlens_q,
                                               cu_seqlens_k, max_q, max_k, o);
      double& w = worst[backend == SdpaBackend::kFused];
      const auto check = [&](const char* name, const Tensor& got) {
        const double err = rel_err(got, tensor_from_bits_json(want.at(name)));
        w = std::max(w, err);
        EXPECT_LE(err, kTolerance) << name;
      };
      check("out", f.out);
      check("dq", g.dq);
      check("dk", g.dk);
      check("dv", g.dv);
      const std::vector<float> lse = f.lse.to_vector();
      const Tensor lse_want_t = tensor_from_bits_json(want.at("lse"));
      EXPECT_EQ(f.lse.shape(), lse_want_t.shape());
      const std::vector<float> lse_want = lse_want_t.to_vector();
      ASSERT_EQ(lse.size(), lse_want.size());
      for (size_t n = 0; n < lse.size(); ++n) {
        if (std::isinf(lse_want[n])) {
          EXPECT_EQ(lse[n], lse_want[n]) << "lse[" << n << "]";
        } else {
          EXPECT_NEAR(lse[n], lse_want[n], kTolerance * std::max(1.0f, std::fabs(lse_want[n])))
              << "lse[" << n << "]";
        }
      }
    }
  }
  std::cout << "[sdpa varlen vs torch] largest relative error: reference " << worst[0] << ", fused "
            << worst[1] << " over " << cases.size() << " cases\n";
}

}  // namespace
}  // namespace attn::test
