// The book's own RoPE (standalone-llama32.ipynb: compute_rope_params,
// apply_rope) and MultiHeadLatentAttention (ch04/05_mla/gpt_with_kv_mla.py),
// recorded once under PyTorch 1.13 by tests/torch/record_rope_mla.py into the
// committed tests/fixtures/rope_mla/book.json, against attn's.
//
// RoPE: attn's tables follow the book's float32 steps; they differ by float
// rounding of θ and of cos/sin (<= 1e-6 + 1e-7·p at row p, p·θ_0 = p being the
// largest angle); the rotations of the book's own tables agree within 1e-6
// relative, at offset 0 and at a KV-cache offset. MLA: the state_dict's names
// and order, the book's latent_dim default, the weights from manual_seed (attn's
// generator draws PyTorch's stream), y, dx, every parameter gradient and the
// cached decode within 2e-5 · max(1, |value|) (both float32).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <optional>
#include <string>
#include <vector>

#include "attn/generate.h"
#include "attn/gpt.h"
#include "attn/mla.h"
#include "attn/ops.h"
#include "attn/random.h"
#include "attn/rope.h"
#include "oracle.h"

namespace attn::test {
namespace {

using Json = nlohmann::json;

Json fixture() { return read_fixture_json("rope_mla/book.json"); }

double rel_err(const Tensor& got, const Tensor& want) {
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

TEST(RopeMlaBook, RopeMatchesTheBooksFunctions) {
  const Json file = fixture();
  ASSERT_EQ(file.at("rope").size(), 3u);
  double worst_table = 0.0, worst = 0.0;
  for (const Json& c : file.at("rope")) {
    const int64_t hd = c.at("head_dim"), L = c.at("context_length"), offset = c.at("offset");
    SCOPED_TRACE("head_dim " + std::to_string(hd) + ", freq_config " + c.at("freq_config").dump());
    std::optional<RopeFreqConfig> freq;
    if (!c.at("freq_config").is_null()) {
      const Json& f = c.at("freq_config");
      freq = RopeFreqConfig{f.at("factor"), f.at("low_freq_factor"), f.at("high_freq_factor"),
                            f.at("original_context_length")};
    }
    const RopeParams p = compute_rope_params(hd, c.at("theta_base").get<float>(), L, freq);
    const Tensor cos_half = tensor_from_bits_json(c.at("cos_half"));
    const Tensor sin_half = tensor_from_bits_json(c.at("sin_half"));
    // The book's tables (the second half repeats the first, checked when recorded).
    const Tensor cos = cat({cos_half, cos_half}, 1), sin = cat({sin_half, sin_half}, 1);
    for (int64_t pos = 0; pos < L; ++pos) {
      const double bound = 1e-6 + 1e-7 * double(pos);
      for (int64_t i = 0; i < hd; ++i) {
        const double d = std::max(std::fabs(p.cos.at({pos, i}) - cos.at({pos, i})),
                                  std::fabs(p.sin.at({pos, i}) - sin.at({pos, i})));
        worst_table = std::max(worst_table, d);
        ASSERT_LE(d, bound) << "row " << pos << " column " << i;
      }
    }
    const Tensor x = tensor_from_bits_json(c.at("x")), dy = tensor_from_bits_json(c.at("dy"));
    for (RopeBackend b : {RopeBackend::kReference, RopeBackend::kKernel}) {
      for (int64_t off : {int64_t{0}, offset}) {
        const RopeOptions o{.position_offset = off, .backend = b};
        const std::string sfx = off == 0 ? "" : "_offset";
        const double ey =
            rel_err(apply_rope(x, cos, sin, o), tensor_from_bits_json(c.at("y" + sfx)));
        const double ed =
            rel_err(apply_rope_backward(dy, cos, sin, o), tensor_from_bits_json(c.at("dx" + sfx)));
        EXPECT_LE(ey, 1e-6) << "y" << sfx;
        EXPECT_LE(ed, 1e-6) << "dx" << sfx;
        worst = std::max({worst, ey, ed});
      }
    }
  }
  std::cout << "[rope vs book] tables max |diff| " << worst_table << "; y, dx max rel err " << worst
            << "\n";
}

TEST(RopeMlaBook, MultiHeadLatentAttentionMatchesTheBooksModule) {
  const Json file = fixture();
  ASSERT_EQ(file.at("mla").size(), 2u);
  double worst = 0.0;
  for (const Json& c : file.at("mla")) {
    SCOPED_TRACE("seed " + c.at("seed").dump());
    const Json& ld = c.at("latent_dim");
    // The book's constructor order and draws: manual_seed(seed), then the module.
    Generator gen(c.at("seed").get<uint64_t>());
    nn::MultiHeadLatentAttention m({.d_in = c.at("d_in"),
                                    .d_out = c.at("d_out"),
                                    .num_heads = c.at("num_heads"),
                                    .qkv_bias = c.at("qkv_bias"),
                                    .latent_dim = ld.is_null() ? 0 : ld.get<int64_t>()},
                                   gen);
    EXPECT_EQ(m.latent_dim(), c.at("latent_dim_used").get<int64_t>());
    std::vector<std::string> keys;
    for (auto& [name, value] : m.state_dict()) {
      keys.push_back(name);
      EXPECT_EQ(rel_err(value, tensor_from_bits_json(c.at("state_dict").at(name))), 0.0) << name;
    }
    EXPECT_EQ(keys, c.at("state_dict_keys").get<std::vector<std::string>>());
    // The input was drawn after the module, from the same stream.
    const Tensor x = tensor_from_bits_json(c.at("x"));
    const Tensor y = m.forward(x);
    double e = rel_err(y, tensor_from_bits_json(c.at("y")));
    EXPECT_LE(e, 2e-5) << "y";
    worst = std::max(worst, e);
    m.zero_grad();
    e = rel_err(m.backward(tensor_from_bits_json(c.at("dy"))), tensor_from_bits_json(c.at("dx")));
    EXPECT_LE(e, 2e-5) << "dx";
    worst = std::max(worst, e);
    for (auto& [name, p] : m.named_parameters()) {
      e = rel_err(p->grad, tensor_from_bits_json(c.at("grads").at(name)));
      EXPECT_LE(e, 2e-5) << name;
      worst = std::max(worst, e);
    }
    m.eval();
    const int64_t B = c.at("B"), T = c.at("T"), P = c.at("prefill");
    nn::LatentKVCache cache = nn::make_latent_kv_cache(m, B, T);
    const Json& steps = c.at("cached_steps");
    ASSERT_EQ(int64_t(steps.size()), T - P + 1);
    e = rel_err(nn::forward_cached(m, x.slice(1, 0, P), cache), tensor_from_bits_json(steps[0]));
    worst = std::max(worst, e);
    EXPECT_LE(e, 2e-5) << "prefill";
    for (int64_t t = P; t < T; ++t) {
      e = rel_err(nn::forward_cached(m, x.slice(1, t, t + 1), cache),
                  tensor_from_bits_json(steps[size_t(t - P + 1)]));
      EXPECT_LE(e, 2e-5) << "step " << t;
      worst = std::max(worst, e);
    }
    e = rel_err(cache.c_kv.slice(1, 0, cache.length), tensor_from_bits_json(c.at("cache_c_kv")));
    EXPECT_LE(e, 2e-5) << "cache_c_kv";
  }
  std::cout << "[mla vs book] max rel err " << worst << "\n";
}

// The book's MLA GPT (gpt_with_kv_mla.py's GPTModel, cfg latent_dim 6) as
// GPTConfig::latent_dim: the same state_dict names, the weights from
// manual_seed(123) (the logits agree), and the book's greedy tokens with and
// without the cache.
TEST(RopeMlaBook, LatentAttentionGptMatchesTheBooksModel) {
  const Json g = fixture().at("mla_gpt");
  const Json& c = g.at("config");
  const nn::GPTConfig cfg{.vocab_size = c.at("vocab_size"),
                          .context_length = c.at("context_length"),
                          .emb_dim = c.at("emb_dim"),
                          .n_heads = c.at("n_heads"),
                          .n_layers = c.at("n_layers"),
                          .drop_rate = c.at("drop_rate"),
                          .qkv_bias = c.at("qkv_bias"),
                          .latent_dim = c.at("latent_dim")};
  manual_seed(g.at("seed").get<uint64_t>());
  nn::GPTModel model(cfg);
  model.eval();
  std::vector<std::string> keys;
  for (auto& [name, t] : model.state_dict()) keys.push_back(name);
  EXPECT_EQ(keys, g.at("state_dict_keys").get<std::vector<std::string>>());
  const auto ids = g.at("ids").get<std::vector<int64_t>>();
  const Tensor logits = model.forward(Tensor::from_int64({1, int64_t(ids.size())}, ids));
  const double e = rel_err(logits, tensor_from_bits_json(g.at("logits")));
  EXPECT_LE(e, 2e-5);
  const auto prompt = g.at("prompt").get<std::vector<int64_t>>();
  for (bool use_cache : {true, false}) {
    const auto want =
        g.at("tokens").at(use_cache ? "cache" : "no_cache").get<std::vector<int64_t>>();
    Generator gen(1);
    const Tensor out = nn::generate(
        model, Tensor::from_int64({1, int64_t(prompt.size())}, prompt),
        {.max_new_tokens = int64_t(want.size() - prompt.size()), .use_cache = use_cache}, gen);
    EXPECT_EQ(out.to_int64_vector(), want) << "use_cache " << use_cache;
  }
  std::cout << "[mla gpt vs book] logits max rel err " << e << "\n";
}

}  // namespace
}  // namespace attn::test
