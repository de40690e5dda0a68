// state_dict() and named_buffers() of every chapter module against PyTorch
// 1.13's (tests/torch/oracle_state_dict.py): the same keys in the same order,
// the same shapes, and the buffers' values (the causal masks) exactly; and a
// buffer that nobody reads is never made.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "attn/nn.h"
#include "attn/tensor.h"
#include "oracle.h"

using attn::Shape;
using attn::Tensor;
using nlohmann::json;
using namespace attn::nn;

namespace {

// The attn module the oracle's case describes, built from the same arguments.
std::unique_ptr<Module> make(const std::string& name, const json& a) {
  const auto i = [&](const char* key, int64_t fallback = 0) { return a.value(key, fallback); };
  const float dropout = a.value("dropout", 0.0f);
  const bool bias = a.value("qkv_bias", false);
  if (name == "SelfAttention_v1") return std::make_unique<SelfAttentionV1>(SelfAttentionOptions{i("d_in"), i("d_out")});
  if (name == "SelfAttention_v2")
    return std::make_unique<SelfAttentionV2>(SelfAttentionOptions{.d_in = i("d_in"), .d_out = i("d_out"), .qkv_bias = bias});
  if (name == "CausalAttention")
    return std::make_unique<CausalAttention>(CausalAttentionOptions{.d_in = i("d_in"), .d_out = i("d_out"),
                                                                    .context_length = i("context_length"),
                                                                    .dropout = dropout, .qkv_bias = bias});
  const MultiHeadAttentionOptions mha{.d_in = i("d_in"), .d_out = i("d_out"), .context_length = i("context_length"),
                                      .dropout = dropout, .num_heads = i("num_heads", 1), .qkv_bias = bias};
  if (name == "MultiHeadAttentionWrapper") return std::make_unique<MultiHeadAttentionWrapper>(mha);
  if (name == "MultiHeadAttention") return std::make_unique<MultiHeadAttention>(mha);
  if (name == "Head" || name == "EncoderHead")
    return std::make_unique<Head>(HeadOptions{.n_embd = i("n_embd"), .head_size = i("head_size"),
                                              .block_size = i("block_size"), .dropout = dropout,
                                              .causal = a.value("causal", true)});
  if (name == "MultiHead")
    return std::make_unique<MultiHead>(MultiHeadOptions{.n_embd = i("n_embd"), .num_heads = i("num_heads"),
                                                        .head_size = i("head_size"), .block_size = i("block_size"),
                                                        .dropout = dropout, .causal = a.value("causal", true)});
  throw std::invalid_argument("state_dict.json: unknown module " + name);
}

}  // namespace

TEST(StateDictTorch, KeysShapesAndBuffersMatchPyTorch) {
  const json modules = attn::test::read_oracle_json("state_dict.json", "oracle_state_dict.py").at("modules");
  ASSERT_EQ(modules.size(), 8u);
  for (const json& m : modules) {
    const std::string name = m.at("name");
    const auto module = make(name, m.at("args"));
    std::vector<std::pair<std::string, Shape>> want, got;
    for (const json& e : m.at("state_dict")) want.emplace_back(e.at(0), e.at(1).get<Shape>());
    for (const auto& [key, t] : module->state_dict()) got.emplace_back(key, t.shape());
    EXPECT_EQ(got, want) << name;
    const auto buffers = module->named_buffers();
    ASSERT_EQ(buffers.size(), m.at("buffers").size()) << name;
    for (size_t b = 0; b < buffers.size(); ++b) {
      const json& e = m.at("buffers").at(b);
      EXPECT_EQ(buffers[b].first, e.at(0).get<std::string>()) << name;
      EXPECT_EQ(attn::max_abs_diff(*buffers[b].second, attn::test::tensor_from_json(e.at(1))), 0.0f)
          << name << " " << buffers[b].first;
    }
  }
}
