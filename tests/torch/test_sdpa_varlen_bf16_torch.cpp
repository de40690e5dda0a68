// Packed variable-length batches in bfloat16 (sdpa_varlen_forward/backward on
// bf16 q, k, v, dout) against PyTorch 1.13's explicit maths in float64
// (tests/torch/oracle_sdpa.py, sdpa_varlen_bf16.json): 24 random packed batches
// of 1-4 sequences of 0, 1, 3, 8, 16, 17, 33 tokens (Tq_b != Tk_b, GQA, both
// alignments, windows, ALiBi per head and per sequence, softcap), each
// sequence the explicit maths on its own bf16-rounded rows.
//
// The reference and the fused kernel on each bf16 engine this CPU runs. The
// reference and the widened tiles ("widened to fp32"): as for the batched
// bf16 cases (test_sdpa_torch.cpp), |attn − torch| <= 2^-8 · |torch| + 1e-5 ·
// max(1, max |torch|) per element. VDPBF16PS ("AVX512-BF16"), which rounds P
// and dS to bf16 where they enter a product: the native bf16 bounds of the
// batched cases (test_sdpa_amx.cpp), |attn − torch| <= 8e-3 · max |torch| for
// out, 4e-2 · max |torch| for dq, dk, dv. lse within 1e-5 · max(1, |lse|) and
// -inf exactly where torch has it, on every engine. The fused backward is
// given torch's out rounded to bf16 and compared with the gradients whose D =
// rowsum(dout ⊙ out_bf16) (what it computes); the reference with autograd's.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <iostream>
#include <limits>
#include <string>
#include <vector>

#include "attn/kernels.h"
#include "attn/sdpa.h"
#include "bf16_path_guard.h"
#include "oracle.h"

namespace attn::test {
namespace {

using Json = nlohmann::json;

constexpr double kTolerance = 1e-5;

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

// max over elements of |got − want| / (limit · max |want|) (absolute where want is all 0).
double native_bound_ratio(const Tensor& got, const Tensor& want, double limit) {
  EXPECT_EQ(got.shape(), want.shape());
  const std::vector<float> x = got.to_vector(), y = want.to_vector();
  double scale = 0.0, err = 0.0;
  for (size_t n = 0; n < x.size(); ++n) {
    if (!std::isfinite(x[n])) return std::numeric_limits<double>::infinity();
    scale = std::max(scale, double(std::fabs(y[n])));
    err = std::max(err, std::fabs(double(x[n]) - double(y[n])));
  }
  return err / (limit * (scale > 0.0 ? scale : 1.0));
}

// The reference, then the fused kernel on "widened to fp32" and, where the CPU
// runs it, "AVX512-BF16".
struct EngineRun {
  const char* name;
  SdpaBackend backend;
  const char* path;  // the bf16 path forced (nullptr: as chosen)
  bool native;       // the native bf16 bounds
};

TEST(SdpaTorch, VarlenBfloat16WithinRoundingOfTorchPerSequence) {
  const Json file = read_oracle_json("sdpa_varlen_bf16.json", "oracle_sdpa.py");
  const Json& cases = file.at("cases");
  ASSERT_GE(cases.size(), 20u);
  const DType bf16 = DType::kBFloat16;
  std::vector<EngineRun> runs{{"reference", SdpaBackend::kReference, nullptr, false},
                              {"widened to fp32", SdpaBackend::kFused, "widened to fp32", false}};
  {
    const Bf16PathGuard dot("AVX512-BF16");
    if (dot.forced() && kernels::bf16_dot_engine_chosen())
      runs.push_back({"AVX512-BF16", SdpaBackend::kFused, "AVX512-BF16", true});
  }
  std::vector<double> worst(runs.size(), 0.0);
  for (const Json& c : cases) {
    SCOPED_TRACE("seed " + std::to_string(c.at("seed").get<int>()) + ": lens_q " +
                 c.at("lens_q").dump() + ", lens_k " + c.at("lens_k").dump() + ", " +
                 c.at("Hq").dump() + "/" + c.at("Hkv").dump() + " heads, D " + c.at("D").dump() +
                 ", Dv " + c.at("Dv").dump() + ", causal " + c.at("is_causal").dump() +
                 ", bottom_right " + c.at("bottom_right").dump() + ", window (" +
                 c.at("window_left").dump() + ", " + c.at("window_right").dump() + "), alibi " +
                 c.at("alibi").dump() + ", softcap " + c.at("softcap").dump());
    const Json& in = c.at("inputs");
    const Tensor q = tensor_from_bits_json(in.at("q")).to(bf16);
    const Tensor k = tensor_from_bits_json(in.at("k")).to(bf16);
    const Tensor v = tensor_from_bits_json(in.at("v")).to(bf16);
    const Tensor dout = tensor_from_bits_json(in.at("dout")).to(bf16);
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
    const Tensor out_bf16 = tensor_from_bits_json(want.at("out_bf16")).to(bf16);
    for (size_t r = 0; r < runs.size(); ++r) {
      const EngineRun& run = runs[r];
      const bool fused = run.backend == SdpaBackend::kFused;
      SCOPED_TRACE(run.name);
      const Bf16PathGuard forced(run.path);
      ASSERT_TRUE(forced.forced());
      o.backend = run.backend;
      const SdpaForward f =
          sdpa_varlen_forward(q, k, v, cu_seqlens_q, cu_seqlens_k, max_q, max_k, o);
      ASSERT_EQ(f.out.dtype(), bf16);
      const SdpaGrads g = sdpa_varlen_backward(dout, q, k, v, out_bf16, f.lse, cu_seqlens_q,
                                               cu_seqlens_k, max_q, max_k, o);
      ASSERT_EQ(g.dq.dtype(), bf16);
      ASSERT_EQ(g.dk.dtype(), bf16);
      const auto check = [&](const char* name, const Tensor& got, const std::string& key) {
        const Tensor expected = tensor_from_bits_json(want.at(key));
        const double ratio =
            run.native ? native_bound_ratio(got, expected, std::string(name) == "out" ? 8e-3 : 4e-2)
                       : bf16_bound_ratio(got, expected);
        worst[r] = std::max(worst[r], ratio);
        EXPECT_LE(ratio, 1.0) << name << " against " << key;
      };
      check("out", f.out, "out");
      const std::string suffix = fused ? "_from_out_bf16" : "";
      check("dq", g.dq, "dq" + suffix);
      check("dk", g.dk, "dk" + suffix);
      check("dv", g.dv, "dv" + suffix);
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
  std::cout << "[sdpa varlen bf16 vs torch] largest error / bound over " << cases.size()
            << " cases:";
  for (size_t r = 0; r < runs.size(); ++r) std::cout << " " << runs[r].name << " " << worst[r];
  std::cout << "\n";
}

}  // namespace
}  // namespace attn::test
