// attn's grouped-query and sliding-window attention against the book's own
// modules: tests/fixtures/gqa_swa/book_1.13.json holds what
// rasbt/LLMs-from-scratch's GroupedQueryAttention, MultiHeadAttentionWithSWA
// and their GPTModels (ch04/04_gqa, ch04/06_swa) computed under PyTorch 1.13,
// recorded once by tests/torch/record_gqa_swa.py from a fetched copy. The
// differential oracle (tests/torch/oracle_gqa_swa.py) writes the same maths in
// its own words; attn matching both shows the oracle is the book's.
//
// Per module: the state_dict keys, the parameters' bits (CRC-32) from the seed,
// y, x.grad and every parameter grad, and the key/value cache (a prefill, then
// one token at a time) against the book's cached outputs (its SWA cache keeps
// only the window). Per GPT: the parameters' bits, the logits of a fixed batch,
// and greedy generation with attn's cache and without = the book's tokens.
// Tolerance: 2e-5 · max(1, max|book|).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "attn/generate.h"
#include "attn/gpt.h"
#include "attn/kv_cache.h"
#include "attn/nn.h"
#include "attn/ops.h"
#include "attn/random.h"
#include "oracle.h"

namespace attn::test {
namespace {

using Json = nlohmann::json;
using namespace attn::nn;

const Json& fixture() {
  static const Json j = read_fixture_json("gqa_swa/book_1.13.json");
  return j;
}

void expect_close(const Tensor& got, const Json& want_json, const std::string& what,
                  double& worst) {
  const Tensor want = tensor_from_json(want_json);
  ASSERT_EQ(got.shape(), want.shape()) << what;
  float m = 0.0f;
  for (const float v : want.values()) m = std::max(m, std::fabs(v));
  const double diff = max_abs_diff(got, want);
  EXPECT_LE(diff, 2e-5 * std::max(1.0, double(m))) << what;
  worst = std::max(worst, diff);
}

void expect_params(Module& m, const Json& crcs) {
  const auto params = m.named_parameters();
  ASSERT_EQ(params.size(), crcs.size());
  for (size_t i = 0; i < params.size(); ++i) {
    EXPECT_EQ(params[i].first, crcs[i][0].get<std::string>());
    EXPECT_EQ(crc32(params[i].second->value), crcs[i][1].get<uint32_t>())
        << "random-number mismatch in " << params[i].first;
  }
}

TEST(GqaSwaBook, ModulesMatchTheBook) {
  const Json& cases = fixture().at("modules");
  ASSERT_EQ(cases.size(), 9u);
  double worst = 0.0;
  for (const Json& c : cases) {
    SCOPED_TRACE(c.at("kind").get<std::string>() + " seed " + std::to_string(c.at("seed").get<int>()));
    const Tensor x = tensor_from_bits_json(c.at("x")), dy = tensor_from_bits_json(c.at("dy"));
    const int64_t T = c.at("T");
    for (const AttentionBackend backend : {AttentionBackend::kAuto, AttentionBackend::kReference}) {
      manual_seed(c.at("seed").get<uint64_t>());
      std::unique_ptr<MultiHeadAttention> m;
      if (c.at("kind") == "gqa") {
        m = std::make_unique<GroupedQueryAttention>(GroupedQueryAttentionOptions{
            .d_in = c.at("d_in"), .d_out = c.at("d_out"), .context_length = T,
            .num_heads = c.at("num_heads"), .num_kv_groups = c.at("num_kv_groups"),
            .qkv_bias = c.at("qkv_bias"), .backend = backend});
      } else {
        m = std::make_unique<MultiHeadAttentionWithSWA>(MultiHeadAttentionWithSWAOptions{
            .d_in = c.at("d_in"), .d_out = c.at("d_out"), .context_length = T,
            .num_heads = c.at("num_heads"), .qkv_bias = c.at("qkv_bias"),
            .sliding_window_size = c.at("sliding_window_size"), .backend = backend});
      }
      std::vector<std::string> keys;
      for (const auto& [name, t] : m->state_dict()) keys.push_back(name);
      EXPECT_EQ(keys, c.at("state_dict").get<std::vector<std::string>>());
      expect_params(*m, c.at("param_crc32"));
      m->eval();
      expect_close(m->forward(x), c.at("y"), "y", worst);
      expect_close(m->backward(dy), c.at("dx"), "dx", worst);
      for (const auto& [name, p] : m->named_parameters())
        expect_close(p->grad, c.at("grads").at(name), name + ".grad", worst);
      const int64_t prefill = c.at("prefill");
      KVCache cache = make_kv_cache(*m, x.size(0));
      std::vector<Tensor> parts{forward_cached(*m, slice(x, 1, 0, prefill), cache)};
      for (int64_t t = prefill; t < T; ++t) parts.push_back(forward_cached(*m, slice(x, 1, t, t + 1), cache));
      expect_close(cat(parts, 1), c.at("y_cached"), "y_cached", worst);
    }
  }
  std::printf("[   BOOK   ] gqa_swa modules: %zu cases x 2 paths, max |attn - book| %.3g\n",
              cases.size(), worst);
}

TEST(GqaSwaBook, GptMatchesTheBook) {
  const Json& cases = fixture().at("gpt");
  ASSERT_EQ(cases.size(), 4u);
  double worst = 0.0;
  for (const Json& c : cases) {
    const Json& j = c.at("config");
    SCOPED_TRACE(j.dump());
    const GPTConfig cfg{.vocab_size = j.at("vocab_size"),
                        .context_length = j.at("context_length"),
                        .emb_dim = j.at("emb_dim"),
                        .n_heads = j.at("n_heads"),
                        .n_layers = j.at("n_layers"),
                        .drop_rate = j.at("drop_rate").get<float>(),
                        .qkv_bias = j.at("qkv_bias"),
                        .n_kv_groups = j.value("n_kv_groups", int64_t{0}),
                        .sliding_window_size = j.value("sliding_window_size", int64_t{0}),
                        .sliding_window_stride = j.value("sliding_window_stride", int64_t{-1})};
    manual_seed(c.at("seed").get<uint64_t>());
    GPTModel model(cfg);
    expect_params(model, c.at("param_crc32"));
    EXPECT_EQ(model.state_dict().size(), model.named_parameters().size()) << "no buffers";
    model.eval();
    const auto ids = c.at("ids").get<std::vector<std::vector<int64_t>>>();
    std::vector<int64_t> flat;
    for (const auto& r : ids) flat.insert(flat.end(), r.begin(), r.end());
    const Tensor idx = Tensor::from_int64({int64_t(ids.size()), int64_t(ids[0].size())}, flat);
    expect_close(model.forward(idx), c.at("logits"), "logits", worst);
    const std::vector<int64_t> prompt = c.at("prompt");
    const std::vector<int64_t> want = c.at("generated_cache");
    EXPECT_EQ(want, c.at("generated_no_cache").get<std::vector<int64_t>>());
    for (const bool use_cache : {true, false}) {
      Generator gen(1);
      const Tensor out =
          generate(model, Tensor::from_int64({1, int64_t(prompt.size())}, prompt),
                   {.max_new_tokens = int64_t(want.size() - prompt.size()), .use_cache = use_cache},
                   gen);
      EXPECT_EQ(out.to_int64_vector(), want) << (use_cache ? "with" : "without") << " the cache";
    }
  }
  std::printf("[   BOOK   ] gqa_swa GPTs: %zu models, max |logits attn - book| %.3g\n",
              cases.size(), worst);
}

}  // namespace
}  // namespace attn::test
