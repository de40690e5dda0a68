// Generating one token at a time against PyTorch 1.13: attn's key/value cache
// (attn/kv_cache.h) must reproduce, position by position, what the book's
// MultiHeadAttention computes on the whole sequence in PyTorch.
//
// tests/torch/oracle_kv_cache.py runs, per case,
//   torch.manual_seed(seed); model = MultiHeadAttention(...);
//   x = x_scale * torch.randn(B, T, d_in); model.eval(); y = model(x)
// Here attn repeats the seeding and construction, checks that its parameters
// have the float32 bits of torch's (CRC-32, in PyTorch's order) and that its
// randn gives torch's x (where torch ran its AVX2 kernel, which attn follows),
// then feeds torch's x through forward_cached token by token, and again as a
// prefill of half the sequence followed by one token at a time, and compares
// every output position with torch's y:
//   max|attn - torch| <= 1e-5 * max(1, max|torch y|)
// (absolute 1e-5 for the O(1) outputs of x = randn; relative for the two cases
// with x_scale 30 and 100, whose outputs reach about 40 and 130). A failure also
// shows err64, torch's own float32-vs-float64 difference on y, for diagnosis.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "attn/kv_cache.h"
#include "attn/nn.h"
#include "attn/ops.h"
#include "attn/random.h"
#include "oracle.h"

namespace attn::test {
namespace {

using Json = nlohmann::json;
using namespace attn::nn;

constexpr double kTolerance = 1e-5;  // relative to max(1, max|torch|)

using attn::test::crc32;

float max_abs(const Tensor& t) {
  float m = 0.0f;
  for (const float v : t.values()) m = std::max(m, std::fabs(v));
  return m;
}

TEST(KVCacheTorch, TokenByTokenMatchesTorchOnWholeSequences) {
  const Json file = attn::test::read_oracle_json<Json>("kv_cache.json", "oracle_kv_cache.py");
  const bool avx2 = file.at("cpu_capability").get<std::string>() == "AVX2";
  const Json& cases = file.at("cases");
  ASSERT_GE(cases.size(), 10u);
  double worst_diff = 0.0, worst_ratio = 0.0;
  int positions = 0;
  for (const Json& c : cases) {
    const Json& cfg = c.at("config");
    SCOPED_TRACE(cfg.dump());
    const int64_t B = cfg.at("B"), T = cfg.at("T"), d_in = cfg.at("d_in");
    manual_seed(cfg.at("seed").get<uint64_t>());
    MultiHeadAttention mha({.d_in = d_in,
                            .d_out = cfg.at("d_out"),
                            .context_length = cfg.at("context_length"),
                            .dropout = cfg.at("dropout").get<float>(),
                            .num_heads = cfg.at("num_heads"),
                            .qkv_bias = cfg.at("qkv_bias")});
    // 1. The same parameters, bit for bit, in PyTorch's order.
    const auto params = mha.named_parameters();
    const Json& crcs = c.at("param_crc32");
    ASSERT_EQ(params.size(), crcs.size());
    for (size_t i = 0; i < params.size(); ++i) {
      EXPECT_EQ(params[i].first, crcs[i][0].get<std::string>());
      EXPECT_EQ(crc32(params[i].second->value), crcs[i][1].get<uint32_t>())
          << "random-number mismatch in " << params[i].first;
    }
    // 2. The same input: attn's randn equals torch's where torch used AVX2.
    const Tensor x = tensor_from_bits_json(c.at("x"));  // (B, T, d_in)
    ASSERT_EQ(x.shape(), (Shape{B, T, d_in}));
    const Tensor x_attn = randn({B, T, d_in}) * cfg.at("x_scale").get<float>();
    if (avx2) {
      EXPECT_EQ(max_abs_diff(x_attn, x), 0.0f) << "random-number mismatch in x";
    }
    mha.eval();

    // 3. Generation, every position against torch's whole-sequence output.
    const Tensor y = tensor_from_json(c.at("y"));  // (B, T, d_out)
    const double tolerance = kTolerance * std::max(1.0, static_cast<double>(max_abs(y)));
    const double err64 = c.at("err64").get<double>();
    const int64_t prefill = std::max<int64_t>(1, T / 2);
    for (const bool with_prefill : {false, true}) {
      SCOPED_TRACE(with_prefill ? "prefill T/2, then one at a time" : "token by token");
      KVCache cache = make_kv_cache(mha, B);
      int64_t t = 0;
      while (t < T) {
        const int64_t n = (with_prefill && t == 0) ? prefill : 1;
        const Tensor y_new = forward_cached(mha, slice(x, 1, t, t + n), cache);  // (B, n, d_out)
        const double diff = max_abs_diff(y_new, slice(y, 1, t, t + n));
        EXPECT_LE(diff, tolerance) << "positions " << t << ".." << t + n - 1
                                   << " (torch's float32 vs float64: " << err64 << ")";
        worst_diff = std::max(worst_diff, diff);
        worst_ratio = std::max(worst_ratio, diff / tolerance);
        positions += static_cast<int>(n);
        t += n;
      }
      EXPECT_EQ(cache.length, T);
    }
  }
  std::printf(
      "[  TORCH   ] kv_cache: %zu cases, %d positions generated: max |attn - torch| %.3g, "
      "worst diff/(1e-5 * max(1, max|torch|)) %.3g\n",
      cases.size(), positions, worst_diff, worst_ratio);
  ::testing::Test::RecordProperty("max_diff_y", std::to_string(worst_diff));
  ::testing::Test::RecordProperty("worst_ratio", std::to_string(worst_ratio));
}

}  // namespace
}  // namespace attn::test
