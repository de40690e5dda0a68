// tests/torch/gpt_config_json.h - the GPTConfig an oracle script recorded in
// its JSON ("config": the book's GPT_CONFIG keys; rope, theta_base and
// latent_dim where the model has them, else GPTConfig's defaults), for the
// torch tests of the GPT (test_gpt_torch.cpp, test_gpt_rope_torch.cpp,
// test_fused_ce_torch.cpp). Json: nlohmann::json or ordered_json.
#pragma once

#include <cstdint>

#include "attn/gpt.h"

namespace attn::test {

template <class Json>
nn::GPTConfig gpt_config_from_json(const Json& c) {
  nn::GPTConfig g;
  g.vocab_size = c.at("vocab_size").template get<int64_t>();
  g.context_length = c.at("context_length").template get<int64_t>();
  g.emb_dim = c.at("emb_dim").template get<int64_t>();
  g.n_heads = c.at("n_heads").template get<int64_t>();
  g.n_layers = c.at("n_layers").template get<int64_t>();
  g.drop_rate = c.at("drop_rate").template get<float>();
  g.qkv_bias = c.at("qkv_bias").template get<bool>();
  g.rope = c.value("rope", g.rope);
  g.theta_base = c.value("theta_base", g.theta_base);
  g.latent_dim = c.value("latent_dim", g.latent_dim);
  return g;
}

}  // namespace attn::test
