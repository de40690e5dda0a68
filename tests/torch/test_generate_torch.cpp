// `attn generate`'s decoding against PyTorch 1.13 (tests/torch/oracle_generate.py):
// the book's GPTModel decoded with the book's generate_text_simple (greedy) and
// generate (top-k, temperature, torch.multinomial), both cropping to the last
// context_length tokens. attn loads torch's weights (float32 bits), then
// nn::generate with the cache, and without it, must give torch's token ids
// exactly: greedy, and for every sampled run with Generator(run_seed) in place
// of torch.manual_seed(run_seed) (sample_next reproduces torch.multinomial's
// draw); runs with eos_id stop where the book's does. The logits of the last position over the
// greedy sequence are within 1e-4 absolute of torch's.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "attn/generate.h"
#include "attn/gpt.h"
#include "attn/random.h"
#include "oracle.h"

namespace attn::test {
namespace {

using Json = nlohmann::json;
using namespace attn::nn;

Tensor ids_tensor(const Json& rows) {
  std::vector<int64_t> flat;
  for (const Json& row : rows) {
    for (const Json& v : row) flat.push_back(v.get<int64_t>());
  }
  return Tensor::from_int64(
      {static_cast<int64_t>(rows.size()), static_cast<int64_t>(rows[0].size())}, flat);
}

TEST(GenerateTorch, TokensEqualTheBooksGenerate) {
  const Json file = read_oracle_json<Json>("generate.json", "oracle_generate.py");
  const Json& cases = file.at("cases");
  ASSERT_GE(cases.size(), 4u);
  int sampled_runs = 0;
  for (const Json& c : cases) {
    const Json& cj = c.at("config");
    SCOPED_TRACE(cj.dump());
    const GPTConfig cfg{.vocab_size = cj.at("vocab_size"),
                        .context_length = cj.at("context_length"),
                        .emb_dim = cj.at("emb_dim"),
                        .n_heads = cj.at("n_heads"),
                        .n_layers = cj.at("n_layers"),
                        .drop_rate = cj.at("drop_rate").get<float>(),
                        .qkv_bias = cj.at("qkv_bias")};
    GPTModel model(cfg);
    std::map<std::string, Tensor> state;
    for (auto& [name, t] : model.state_dict()) state.emplace(name, t);
    for (const Json& p : c.at("params")) {
      const std::string name = p.at(0);
      ASSERT_EQ(state.count(name), 1u) << name;
      state.at(name).copy_(tensor_from_bits_json(p.at(1)));
    }
    model.eval();
    const Tensor prompt = ids_tensor(c.at("prompt"));
    const int64_t n = c.at("max_new_tokens");
    const Tensor greedy = ids_tensor(c.at("greedy"));
    for (bool use_cache : {true, false}) {
      Generator gen(0);
      const Tensor out =
          generate(model, prompt, {.max_new_tokens = n, .use_cache = use_cache}, gen);
      EXPECT_EQ(out.to_int64_vector(), greedy.to_int64_vector()) << "greedy, cache " << use_cache;
    }
    const int64_t C = cfg.context_length;
    const int64_t len = greedy.size(1);
    const Tensor window = greedy.slice(1, std::max<int64_t>(0, len - C), len).contiguous();
    GPTKVCache cache = make_gpt_kv_cache(model, greedy.size(0));
    const Tensor logits = forward_cached(model, window, cache);
    const Tensor last = logits.select(1, logits.size(1) - 1).contiguous();
    const Tensor expected = tensor_from_json(c.at("last_logits"));
    EXPECT_LE(max_abs_diff(last, expected), 1e-4f);
    for (const Json& run : c.at("sampled")) {
      SCOPED_TRACE(run.dump().substr(0, 80));
      for (bool use_cache : {true, false}) {
        Generator gen(run.at("seed").get<uint64_t>());
        const Tensor out =
            generate(model, prompt,
                     {.max_new_tokens = n,
                      .temperature = run.at("temperature").get<float>(),
                      .top_k = run.at("top_k").get<int64_t>(),
                      .use_cache = use_cache,
                      .eos_id = run.contains("eos_id") ? std::optional<int64_t>(run.at("eos_id"))
                                                       : std::nullopt},
                     gen);
        EXPECT_EQ(out.to_int64_vector(), ids_tensor(run.at("ids")).to_int64_vector())
            << "cache " << use_cache;
      }
      ++sampled_runs;
    }
  }
  EXPECT_GE(sampled_runs, 16);  // 10 sampled, 6 with eos_id
}

}  // namespace
}  // namespace attn::test
