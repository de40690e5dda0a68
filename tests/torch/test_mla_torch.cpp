// MultiHeadLatentAttention (attn/mla.h) against PyTorch 1.13
// (tests/torch/oracle_mla.py: the book's module in our own words, float64):
// 10 random configurations (1, 2, 4 heads of width 1 .. 16, latent_dim 1 .. 16,
// with and without biases): the output, dx and every parameter's gradient, and
// the cached decode (a prefill, then one token at a time).
//
// Tolerance: max |attn − torch| <= 1e-5 · max(1, max |torch|) per tensor (attn
// in float32, torch in float64 rounded once).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "attn/mla.h"
#include "attn/ops.h"
#include "oracle.h"

namespace attn::test {
namespace {

using Json = nlohmann::json;

double rel_err(const Tensor& got, const Tensor& want) {
  EXPECT_EQ(got.shape(), want.shape());
  const std::vector<float> a = got.to_vector(), b = want.to_vector();
  double worst = 0.0, scale = 1.0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (!std::isfinite(a[i])) return INFINITY;
    worst = std::max(worst, std::fabs(double(a[i]) - b[i]));
    scale = std::max(scale, std::fabs(double(b[i])));
  }
  return worst / scale;
}

TEST(MlaTorch, ForwardGradientsAndCachedDecodeMatchTorch) {
  const Json file = read_oracle_json("mla.json", "oracle_mla.py");
  const Json& cases = file.at("cases");
  ASSERT_EQ(cases.size(), 10u);
  double worst = 0.0;
  for (const Json& c : cases) {
    SCOPED_TRACE(c.at("B").dump() + "x" + c.at("T").dump() + ", d_in " + c.at("d_in").dump() +
                 ", " + c.at("num_heads").dump() + " heads, d_out " + c.at("d_out").dump() +
                 ", latent " + c.at("latent_dim").dump() + ", bias " + c.at("qkv_bias").dump());
    nn::MultiHeadLatentAttention m({.d_in = c.at("d_in"),
                                    .d_out = c.at("d_out"),
                                    .num_heads = c.at("num_heads"),
                                    .qkv_bias = c.at("qkv_bias"),
                                    .latent_dim = c.at("latent_dim")});
    const Json& w = c.at("weights");
    ASSERT_EQ(m.state_dict().size(), w.size());
    for (auto& [name, value] : m.state_dict()) value.copy_(tensor_from_bits_json(w.at(name)));
    const Tensor x = tensor_from_bits_json(c.at("x"));
    const Tensor y = m.forward(x);
    double e = rel_err(y, tensor_from_bits_json(c.at("y")));
    EXPECT_LE(e, 1e-5) << "y";
    worst = std::max(worst, e);
    m.zero_grad();
    const Tensor dx = m.backward(tensor_from_bits_json(c.at("dy")));
    e = rel_err(dx, tensor_from_bits_json(c.at("dx")));
    EXPECT_LE(e, 1e-5) << "dx";
    worst = std::max(worst, e);
    for (auto& [name, p] : m.named_parameters()) {
      e = rel_err(p->grad, tensor_from_bits_json(c.at("grads").at(name)));
      EXPECT_LE(e, 1e-5) << name;
      worst = std::max(worst, e);
    }
    m.eval();
    const int64_t B = c.at("B"), T = c.at("T"), P = c.at("prefill");
    nn::LatentKVCache cache = nn::make_latent_kv_cache(m, B, T);
    std::vector<Tensor> steps{nn::forward_cached(m, x.slice(1, 0, P), cache)};
    for (int64_t t = P; t < T; ++t)
      steps.push_back(nn::forward_cached(m, x.slice(1, t, t + 1), cache));
    e = rel_err(cat(steps, 1), tensor_from_bits_json(c.at("cached_y")));
    EXPECT_LE(e, 1e-5) << "cached decode";
    worst = std::max(worst, e);
    EXPECT_EQ(cache.length, T);
  }
  std::cout << "[mla vs torch] max rel err " << worst << "\n";
}

}  // namespace
}  // namespace attn::test
