// Rotary position embedding (attn/rope.h) against PyTorch 1.13
// (tests/torch/oracle_rope.py, the book's Llama-chapter maths in our own
// words): 24 random cases of head_dim 2 .. 128, position offsets, theta_base
// 100 .. 500000, with and without Llama 3's freq_config, float32 and bfloat16.
//
// Tables: compute_rope_params keeps the book's float32 steps, the oracle
// computes the angle p·θ in float64, so they differ by the float32 rounding of
// the angle: |Δ| <= 1e-6 + 2.5e-7·p at row p (θ_0 = 1 is the largest θ).
// Rotation on the oracle's tables: y and dx within 1e-6·max(1, |value|) for
// float32 (the same float32 products and sums; seen: 0), 1 bf16 ulp for bf16.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <optional>
#include <string>
#include <vector>

#include "attn/rope.h"
#include "oracle.h"

namespace attn::test {
namespace {

using Json = nlohmann::json;

double max_rel_err(const Tensor& got, const Tensor& want) {
  EXPECT_EQ(got.shape(), want.shape());
  const std::vector<float> a = got.to_vector(), b = want.to_vector();
  double worst = 0.0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (!std::isfinite(a[i])) return INFINITY;
    worst =
        std::max(worst, std::fabs(double(a[i]) - b[i]) / std::max(1.0, std::fabs(double(b[i]))));
  }
  return worst;
}

std::optional<RopeFreqConfig> freq_of(const Json& c) {
  const Json& f = c.at("freq_config");
  if (f.is_null()) return std::nullopt;
  return RopeFreqConfig{.factor = f.at("factor").get<float>(),
                        .low_freq_factor = f.at("low_freq_factor").get<float>(),
                        .high_freq_factor = f.at("high_freq_factor").get<float>(),
                        .original_context_length = f.at("original_context_length").get<int64_t>()};
}

TEST(RopeTorch, TablesRotationAndGradientsMatchTorch) {
  const Json file = read_oracle_json("rope.json", "oracle_rope.py");
  const Json& cases = file.at("cases");
  ASSERT_EQ(cases.size(), 24u);
  double worst_table = 0.0, worst_y = 0.0, worst_dx = 0.0;
  int bf16_cases = 0, freq_cases = 0;
  for (const Json& c : cases) {
    const int64_t hd = c.at("hd"), L = c.at("context_length"), offset = c.at("offset");
    const bool bf16 = c.at("bf16");
    SCOPED_TRACE("hd " + std::to_string(hd) + ", L " + std::to_string(L) + ", offset " +
                 std::to_string(offset) + ", theta_base " + c.at("theta_base").dump() +
                 ", freq_config " + c.at("freq_config").dump() + (bf16 ? ", bf16" : ""));
    bf16_cases += bf16;
    freq_cases += !c.at("freq_config").is_null();
    const Json& in = c.at("inputs");
    const Tensor cos = tensor_from_bits_json(in.at("cos")),
                 sin = tensor_from_bits_json(in.at("sin"));
    const RopeParams p = compute_rope_params(hd, c.at("theta_base").get<float>(), L, freq_of(c));
    ASSERT_EQ(p.cos.shape(), cos.shape());
    for (int64_t pos = 0; pos < L; ++pos) {
      const double bound = 1e-6 + 2.5e-7 * double(pos);
      for (int64_t i = 0; i < hd; ++i) {
        const double dc = std::fabs(p.cos.at({pos, i}) - cos.at({pos, i}));
        const double ds = std::fabs(p.sin.at({pos, i}) - sin.at({pos, i}));
        worst_table = std::max(worst_table, std::max(dc, ds) / bound);
        ASSERT_LE(std::max(dc, ds), bound) << "row " << pos << " column " << i;
      }
    }
    Tensor x = tensor_from_bits_json(in.at("x"));
    if (bf16) x = x.to(DType::kBFloat16);
    const Tensor dy = tensor_from_bits_json(in.at("dy"));
    const Tensor want_y = tensor_from_bits_json(c.at("outputs").at("y"));
    const Tensor want_dx = tensor_from_bits_json(c.at("outputs").at("dx"));
    for (RopeBackend backend : {RopeBackend::kReference, RopeBackend::kKernel}) {
      const RopeOptions o{.position_offset = offset, .backend = backend};
      const Tensor y = apply_rope(x, cos, sin, o);
      EXPECT_EQ(y.dtype(), x.dtype());
      const double ey = max_rel_err(y.to(DType::kFloat32), want_y);
      EXPECT_LE(ey, bf16 ? 1.0 / 128 : 1e-6);
      if (!bf16) worst_y = std::max(worst_y, ey);
      const double edx = max_rel_err(apply_rope_backward(dy, cos, sin, o), want_dx);
      EXPECT_LE(edx, 1e-6);
      worst_dx = std::max(worst_dx, edx);
    }
  }
  EXPECT_GE(bf16_cases, 3);
  EXPECT_GE(freq_cases, 5);
  std::cout << "[rope vs torch] tables: worst |diff| / bound " << worst_table
            << "; fp32 y max rel err " << worst_y << ", dx " << worst_dx << "\n";
}

}  // namespace
}  // namespace attn::test
