// Llama 3, Qwen2, Qwen3 and Gemma 3 directories (attn/hf_decoder.h) and the
// decoder they build (attn/decoder.h) against the fixtures of
// tests/fixtures/make_open_model_fixtures.py: transformers 5.24's logits, loss,
// every parameter's gradient and greedy generation with its own KV cache, for
// each family, both config forms, F32 / F16 / BF16 files and a sharded one.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "attn/decoder.h"
#include "attn/hf_decoder.h"
#include "attn/hf_tokenizer.h"
#include "attn/safetensors.h"
#include "attn/utf8.h"
#include "cli.h"

namespace attn::test {
namespace {

namespace fs = std::filesystem;

const std::string kFixtures = std::string(ATTN_TESTS_DIR) + "/fixtures/open_models";

struct Expected {
  std::map<std::string, Tensor> t;
  const Tensor& at(const std::string& name) const {
    const auto it = t.find(name);
    if (it == t.end()) throw std::out_of_range("expected.safetensors has no " + name);
    return it->second;
  }
};

Expected expected(const std::string& name) {
  Expected e;
  for (auto& [key, value] :
       io::read_safetensors(kFixtures + "/" + name + "/expected.safetensors").tensors) {
    e.t[key] = value;
  }
  return e;
}

// max |a - b| / max |b|.
float relative_error(const Tensor& a, const Tensor& b) {
  EXPECT_EQ(a.shape(), b.shape());
  const std::vector<float> x = a.to_vector(), y = b.to_vector();
  float worst = 0.0f, scale = 0.0f;
  for (size_t i = 0; i < y.size() && i < x.size(); ++i) {
    const float d = std::fabs(x[i] - y[i]);
    worst = std::isnan(d) ? INFINITY : std::max(worst, d);
    scale = std::max(scale, std::fabs(y[i]));
  }
  return scale > 0.0f ? worst / scale : worst;
}

const char* const kCases[] = {"llama3", "llama32_bf16_sharded", "qwen3", "qwen2",
                              "gemma3", "gemma3_softcap_old",   "gemma2"};

class HfDecoderCase : public ::testing::TestWithParam<const char*> {};

TEST_P(HfDecoderCase, LogitsLossAndGradientsMatchTransformers) {
  std::unique_ptr<nn::DecoderLM> model;
  const io::HfDecoderInfo info = io::load_hf_decoder(kFixtures + "/" + GetParam(), model);
  const Expected want = expected(GetParam());
  const Tensor& ids = want.at("ids");
  const Tensor mine = model->forward(ids);
  const float logit_error = relative_error(mine, want.at("logits"));
  EXPECT_LE(logit_error, 1e-5f) << GetParam();

  model->train();
  model->zero_grad();
  const float loss = model->forward_loss(ids);
  EXPECT_NEAR(loss, want.at("loss").item(), 1e-5f * std::fabs(want.at("loss").item()));
  model->backward_loss();
  int64_t grads = 0;
  for (auto& [name, p] : model->named_parameters()) {
    const std::string key = "grad." + io::hf_decoder_name(name);
    ASSERT_TRUE(want.t.count(key)) << key;
    EXPECT_LE(relative_error(p->grad, want.at(key)), 2e-5f) << GetParam() << " " << key;
    ++grads;
  }
  const auto stored = std::count_if(want.t.begin(), want.t.end(),
                                    [](const auto& kv) { return kv.first.starts_with("grad."); });
  EXPECT_EQ(grads, stored);
  EXPECT_GT(info.tensors, 0);
}

// Mixed precision (set_compute_dtype(kBFloat16), as torch.autocast): the
// logits, the loss and every gradient within bf16 rounding of transformers'
// float32 ones (bf16 keeps 8 bits, 2^-9 relative per operand; through every
// product and the attention's operands, forward and back, these random
// fixtures measure 1.2-4.4e-2 of the largest gradient and up to 2.3e-2 of the
// largest logit), and not the float32 bits.
TEST_P(HfDecoderCase, MixedPrecisionTracksFloat32) {
  std::unique_ptr<nn::DecoderLM> model;
  io::load_hf_decoder(kFixtures + "/" + GetParam(), model);
  model->set_compute_dtype(DType::kBFloat16);
  const Expected want = expected(GetParam());
  const Tensor& ids = want.at("ids");
  model->train();
  model->zero_grad();
  const float loss = model->forward_loss(ids);
  EXPECT_NEAR(loss, want.at("loss").item(), 1e-2f * std::fabs(want.at("loss").item()));
  EXPECT_NE(loss, want.at("loss").item());
  model->backward_loss();
  float worst = 0.0f;
  for (auto& [name, p] : model->named_parameters()) {
    const float e = relative_error(p->grad, want.at("grad." + io::hf_decoder_name(name)));
    EXPECT_LE(e, 8e-2f) << GetParam() << " " << name;
    worst = std::max(worst, e);
  }
  EXPECT_GT(worst, 1e-5f);  // the products ran in bf16
  model->eval();
  EXPECT_LE(relative_error(model->forward(ids), want.at("logits")), 4e-2f);
  model->set_compute_dtype(DType::kFloat32);  // and back: transformers' float32 bits again
  EXPECT_LE(relative_error(model->forward(ids), want.at("logits")), 1e-5f);
  EXPECT_THROW(model->set_compute_dtype(DType::kInt64), std::invalid_argument);
  std::printf("[  BF16    ] %s: largest gradient error %.3g of the largest gradient\n", GetParam(),
              double(worst));
}

TEST_P(HfDecoderCase, GreedyGenerationWithTheCacheMatchesTransformers) {
  std::unique_ptr<nn::DecoderLM> model;
  io::load_hf_decoder(kFixtures + "/" + GetParam(), model);
  const Expected want = expected(GetParam());
  Generator gen(0);
  const Tensor out = nn::generate(*model, want.at("prompt"), {.max_new_tokens = 6}, gen);
  EXPECT_EQ(out.to_int64_vector(), want.at("greedy").to_int64_vector()) << GetParam();
}

// Prefill in chunks of 3, then one token at a time: every row equals the full
// forward's (the sliding layers' rings of window rows cover chunks that span them).
TEST_P(HfDecoderCase, CachedChunksEqualTheFullForward) {
  std::unique_ptr<nn::DecoderLM> model;
  io::load_hf_decoder(kFixtures + "/" + GetParam(), model);
  const Expected want = expected(GetParam());
  const Tensor ids = want.at("ids");  // (2, 12)
  const Tensor full = model->forward(ids);
  for (const int64_t chunk : {1, 3, 5, 12}) {
    nn::DecoderKVCache cache = nn::make_kv_cache(*model, 2, 12);
    for (int64_t t = 0; t < 12; t += chunk) {
      const int64_t n = std::min<int64_t>(chunk, 12 - t);
      const Tensor logits = nn::forward_cached(*model, ids.slice(1, t, t + n).contiguous(), cache);
      EXPECT_LE(relative_error(logits, full.slice(1, t, t + n).contiguous()), 2e-6f)
          << GetParam() << " chunk " << chunk << " at " << t;
    }
    EXPECT_EQ(cache.length, 12);
  }
}

// bf16 weights (inference): the matrices rounded to bf16, each product's
// activations rounded as they enter it, float32 sums. Against the float32
// model on the same file: within bf16's rounding (the BF16 files' weights are
// exact, so only the activations' rounding remains there).
TEST_P(HfDecoderCase, Bf16WeightsStayWithinBf16Rounding) {
  std::unique_ptr<nn::DecoderLM> fp32, bf16, mapped;
  io::load_hf_decoder(kFixtures + "/" + GetParam(), fp32);
  io::load_hf_decoder(kFixtures + "/" + GetParam(), bf16, DType::kBFloat16);
  io::load_hf_decoder(kFixtures + "/" + GetParam(), mapped, DType::kBFloat16, true);
  EXPECT_EQ(bf16->weights_dtype(), DType::kBFloat16);
  EXPECT_EQ(bf16->lm_head.weight.value.dtype(), DType::kBFloat16);
  const Tensor ids = expected(GetParam()).at("ids");
  const Tensor want = fp32->forward(ids);
  const float error = relative_error(bf16->forward(ids), want);
  EXPECT_EQ(mapped->forward(ids).to_vector(), bf16->forward(ids).to_vector()) << GetParam();
  EXPECT_LE(error, 2e-2f) << GetParam();
  EXPECT_GT(error, 0.0f) << GetParam();  // the activations are rounded
  // The same weights rounded by use_bf16_weights on a float32 model: the same logits.
  fp32->use_bf16_weights();
  EXPECT_EQ(fp32->forward(ids).to_vector(), bf16->forward(ids).to_vector()) << GetParam();
  bf16->train();
  EXPECT_THROW(bf16->forward(ids), std::logic_error);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, HfDecoderCase, ::testing::ValuesIn(kCases));

// The book's own Llama 3.2, Qwen3 and Gemma 3 classes on the same random
// weights (tests/fixtures/make_book_model_fixtures.py): a second reference,
// written independently of transformers.
class BookModels : public ::testing::TestWithParam<const char*> {};

TEST_P(BookModels, LogitsEqualTheBooksClassesAndTransformers) {
  const std::string dir = std::string(ATTN_TESTS_DIR) + "/fixtures/book_models/" + GetParam();
  std::unique_ptr<nn::DecoderLM> model;
  (void)io::load_hf_decoder(dir, model);
  std::map<std::string, Tensor> want;
  for (auto& [key, value] : io::read_safetensors(dir + "/expected.safetensors").tensors) want[key] = value;
  const Tensor mine = model->forward(want.at("ids"));
  EXPECT_LE(relative_error(mine, want.at("book_logits")), 1e-5f) << GetParam();
  EXPECT_LE(relative_error(mine, want.at("transformers_logits")), 1e-5f) << GetParam();
  // And through the cache, a token at a time after a 5-token prompt.
  nn::DecoderKVCache cache = nn::make_kv_cache(*model, 2, 12);
  const Tensor& ids = want.at("ids");
  const Tensor& book = want.at("book_logits");
  const Tensor first = nn::forward_cached(*model, ids.slice(1, 0, 5).contiguous(), cache);
  EXPECT_LE(relative_error(first, book.slice(1, 0, 5).contiguous()), 1e-5f);
  for (int64_t t = 5; t < 12; ++t) {
    const Tensor step = nn::forward_cached(*model, ids.slice(1, t, t + 1).contiguous(), cache);
    EXPECT_LE(relative_error(step, book.slice(1, t, t + 1).contiguous()), 1e-5f)
        << GetParam() << " position " << t;
  }
}

INSTANTIATE_TEST_SUITE_P(Book, BookModels, ::testing::Values("llama32", "qwen3", "gemma3"));

TEST(HfDecoder, ReadsBothConfigForms) {
  const io::HfDecoderConfig g = io::read_hf_decoder_config(kFixtures + "/gemma3");
  EXPECT_EQ(g.config_form, "rope_parameters");
  EXPECT_EQ(g.config.layer_sliding, (std::vector<bool>{true, true, false, true}));
  EXPECT_EQ(g.config.sliding_window, 4);
  EXPECT_EQ(g.config.rope.type, nn::RopeScaling::Type::kLinear);
  EXPECT_FLOAT_EQ(g.config.rope.factor, 8.0f);
  EXPECT_FLOAT_EQ(g.config.rope_local.theta, 10000.0f);
  EXPECT_FLOAT_EQ(g.config.attention_scale, 1.0f / std::sqrt(24.0f));
  const io::HfDecoderConfig o = io::read_hf_decoder_config(kFixtures + "/gemma3_softcap_old");
  EXPECT_EQ(o.config_form, "rope_theta");
  EXPECT_EQ(o.config.layer_sliding, (std::vector<bool>{true, false, true, false}));
  EXPECT_FLOAT_EQ(o.config.attn_softcap, 0.0f);  // as transformers' Gemma 3: read, not applied
  EXPECT_FLOAT_EQ(o.unapplied_attn_softcap, 5.0f);
  EXPECT_FLOAT_EQ(o.config.final_softcap, 3.0f);
  const io::HfDecoderConfig g2 = io::read_hf_decoder_config(kFixtures + "/gemma2");
  EXPECT_EQ(g2.config.layer_sliding, (std::vector<bool>{true, false, true}));
  EXPECT_FLOAT_EQ(g2.config.attn_softcap, 5.0f);
  EXPECT_FALSE(g2.config.qk_norm);
  EXPECT_EQ(g2.config.pad_token_id, 0);
  const io::HfDecoderConfig l = io::read_hf_decoder_config(kFixtures + "/llama32_bf16_sharded");
  EXPECT_EQ(l.config_form, "rope_theta");
  EXPECT_EQ(l.config.rope.type, nn::RopeScaling::Type::kLlama3);
  EXPECT_FLOAT_EQ(l.config.rope.factor, 32.0f);
  EXPECT_EQ(l.config.rope.original_context_length, 32);
  EXPECT_TRUE(l.config.tie_embeddings);
  const io::HfDecoderConfig q = io::read_hf_decoder_config(kFixtures + "/qwen2");
  EXPECT_TRUE(q.config.qkv_bias);
  EXPECT_FALSE(q.config.o_bias);
  EXPECT_EQ(q.eos_token_ids, (std::vector<int64_t>{2}));
}

// Weights the file holds in the compute dtype are read in place (a private,
// copy-on-write mapping): writing one (an optimizer step) leaves the file as it was.
TEST(HfDecoder, WeightsInTheComputeDtypeAreMappedNotCopied) {
  const fs::path d = fs::path(::testing::TempDir()) / "attn_hf_decoder_mapped";
  fs::remove_all(d);
  fs::copy(kFixtures + "/llama3", d, fs::copy_options::recursive);
  const std::string before = read_text((d / "model.safetensors").string());
  {
    std::unique_ptr<nn::DecoderLM> model;
    EXPECT_EQ(io::load_hf_decoder(d.string(), model).mapped, 0);  // copied by default
    const io::HfDecoderInfo info = io::load_hf_decoder(d.string(), model, DType::kFloat32, true);
    EXPECT_EQ(info.mapped, info.tensors);  // F32 file, float32 compute: every tensor
    model->lm_head.weight.value.fill_(0.5f);
    EXPECT_EQ(model->lm_head.weight.value.to_vector()[0], 0.5f);
    std::unique_ptr<nn::DecoderLM> bf16;
    const io::HfDecoderInfo b =
        io::load_hf_decoder(kFixtures + "/llama32_bf16_sharded", bf16, DType::kBFloat16, true);
    EXPECT_EQ(b.mapped, 2 * 7 + 1);  // the matrices: 7 per layer and the embedding; not the norms
  }
  EXPECT_EQ(read_text((d / "model.safetensors").string()), before);
  fs::remove_all(d);
}

TEST(HfDecoder, SlidingLayersKeepOnlyTheirWindow) {
  std::unique_ptr<nn::DecoderLM> model;
  io::load_hf_decoder(kFixtures + "/gemma3", model);
  const nn::DecoderKVCache cache = nn::make_kv_cache(*model, 1, 64);
  ASSERT_EQ(cache.layers.size(), 4u);
  EXPECT_EQ(cache.layers[0].keys.size(2), 4);   // sliding: the window
  EXPECT_EQ(cache.layers[2].keys.size(2), 64);  // full: the capacity
  const nn::DecoderKVCache half = nn::make_kv_cache(*model, 1, 64, DType::kBFloat16);
  EXPECT_EQ(half.layers[2].values.dtype(), DType::kBFloat16);
  EXPECT_EQ(2 * half.bytes(), cache.bytes());
  EXPECT_THROW(nn::make_kv_cache(*model, 1, 64, DType::kInt64), std::invalid_argument);
}

// ---- refusals ---------------------------------------------------------------------------------

std::string config_text(const std::string& name) {
  std::ifstream in(kFixtures + "/" + name + "/config.json");
  return std::string(std::istreambuf_iterator<char>(in), {});
}

std::string replaced(std::string s, const std::string& from, const std::string& to) {
  const size_t at = s.find(from);
  EXPECT_NE(at, std::string::npos) << from;
  if (at != std::string::npos) s.replace(at, from.size(), to);
  return s;
}

void expect_refused(const std::string& text, const std::string& needle) {
  try {
    io::parse_hf_decoder_config(text, "config.json");
    ADD_FAILURE() << "accepted; wanted an error with " << needle;
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(HfDecoder, RefusesConfigsItDoesNotCompute) {
  const std::string llama = config_text("llama3");
  expect_refused(replaced(llama, "\"llama\"", "\"mistral\""),
                 "attn reads llama, qwen2, qwen3, gemma2, gemma3_text");
  expect_refused(replaced(llama, "\"rope_type\": \"llama3\"", "\"rope_type\": \"yarn\""),
                 "rope_type 'yarn'; attn computes default, linear and llama3");
  expect_refused(replaced(llama, "\"hidden_act\": \"silu\"", "\"hidden_act\": \"relu\""),
                 "activation 'relu'");
  expect_refused(replaced(llama, "\"num_key_value_heads\": 2", "\"num_key_value_heads\": 3"),
                 "num_heads 4 must be a multiple of num_kv_heads 3");
  expect_refused(replaced(llama, "\"mlp_bias\": false", "\"mlp_bias\": true"), "mlp_bias");
  expect_refused(replaced(llama, "\"hidden_size\": 32", "\"hidden_size\": -32"),
                 "\"hidden_size\" must be an integer");
  expect_refused(replaced(llama, "\"original_max_position_embeddings\": 32", "\"x\": 32"),
                 "original_max_position_embeddings");
  expect_refused("[1, 2]", "not a JSON object");
  expect_refused("{\"model_type\": \"llama\"", "not valid JSON");
  const std::string gemma = config_text("gemma3");
  expect_refused(replaced(gemma, "\"full_attention\",\n", "\"chunked_attention\",\n"),
                 "chunked_attention");
}

// A copy of a fixture directory to break.
fs::path copy_fixture(const std::string& name, const std::string& as) {
  const fs::path to = fs::path(::testing::TempDir()) / ("attn_hf_decoder_" + as);
  fs::remove_all(to);
  fs::copy(kFixtures + "/" + name, to, fs::copy_options::recursive);
  return to;
}

void expect_load_refused(const fs::path& dir, const std::string& needle) {
  std::unique_ptr<nn::DecoderLM> model;
  try {
    io::load_hf_decoder(dir.string(), model);
    ADD_FAILURE() << "loaded; wanted an error with " << needle;
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
  fs::remove_all(dir);
}

TEST(HfDecoder, RefusesFilesThatDisagreeWithTheConfig) {
  {  // a tensor missing: the untied head
    const fs::path d = copy_fixture("llama3", "untied");
    std::string cfg = config_text("llama3");
    std::ofstream(d / "config.json")
        << replaced(cfg, "\"num_hidden_layers\": 2", "\"num_hidden_layers\": 3");
    expect_load_refused(d, "no tensor 'model.layers.2.");
  }
  {  // layers by the hundred million (issue 46): refused before any per-layer list is built
    EXPECT_THROW(
        {
          try {
            (void)io::parse_hf_decoder_config(
                replaced(config_text("llama3"), "\"num_hidden_layers\": 2",
                         "\"num_hidden_layers\": 100000000"),
                "config.json");
          } catch (const std::invalid_argument& e) {
            EXPECT_NE(std::string(e.what()).find(
                          "\"num_hidden_layers\" must be at most 4096, got 100000000"),
                      std::string::npos)
                << e.what();
            throw;
          }
        },
        std::invalid_argument);
    // More layers than the weights have tensors: refused before the model is built.
    const fs::path d = copy_fixture("llama3", "layers");
    std::ofstream(d / "config.json") << replaced(config_text("llama3"), "\"num_hidden_layers\": 2",
                                                 "\"num_hidden_layers\": 4000");
    expect_load_refused(d, "config.json has 4000 layers, but the weights hold only");
  }
  {  // a shape the config does not make
    const fs::path d = copy_fixture("llama3", "shape");
    std::ofstream(d / "config.json") << replaced(config_text("llama3"), "\"intermediate_size\": 48",
                                                 "\"intermediate_size\": 40");
    expect_load_refused(d, "config.json makes it (40, 32)");
  }
  {  // a tensor the model does not have
    const fs::path d = copy_fixture("llama3", "unknown");
    std::ofstream(d / "config.json")
        << replaced(config_text("llama3"), "\"num_hidden_layers\": 2", "\"num_hidden_layers\": 1");
    expect_load_refused(d, "unknown tensor 'model.layers.1.");
  }
  {  // an index whose shard leaves the directory
    const fs::path d = copy_fixture("llama32_bf16_sharded", "escape");
    std::ifstream in(d / "model.safetensors.index.json");
    std::string index((std::istreambuf_iterator<char>(in)), {});
    in.close();
    const std::string from = "\"model-00001-of-00002.safetensors\"";
    index.replace(index.find(from), from.size(), "\"../model-00001-of-00002.safetensors\"");
    std::ofstream(d / "model.safetensors.index.json") << index;
    expect_load_refused(d, "is not a file name inside the directory");
  }
  {  // no weights at all
    const fs::path d = copy_fixture("qwen2", "empty");
    fs::remove(d / "model.safetensors");
    expect_load_refused(d, "has neither model.safetensors nor model.safetensors.index.json");
  }
}

// ---- from the CLI ------------------------------------------------------------------------------

std::string joined(const std::vector<int64_t>& ids, const char* sep) {
  std::string out;
  for (size_t i = 0; i < ids.size(); ++i) out += (i ? sep : "") + std::to_string(ids[i]);
  return out;
}

TEST(HfDecoderCli, GenerateGivesTransformersGreedyIds) {
  ATTN_REQUIRE_CLI();
  for (const char* name : {"gemma3", "qwen2", "llama32_bf16_sharded"}) {
    const Expected want = expected(name);
    const CliResult r = run_cli("generate --model '" + kFixtures + "/" + name + "' --prompt-ids " +
                                joined(want.at("prompt").to_int64_vector(), ",") +
                                " --print-ids --greedy --max-new-tokens 6");
    EXPECT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(r.out, joined(want.at("greedy").to_int64_vector(), " ") + "\n") << name;
  }
}

// --kv-dtype: a bf16 cache holds half the bytes, says so, and decodes.
TEST(HfDecoderCli, Bf16KvCacheHalvesTheCache) {
  ATTN_REQUIRE_CLI();
  const std::string base = "generate --model '" + kFixtures +
                           "/qwen3' --benchmark --json --prompt-tokens 20 --max-new-tokens 8";
  const CliResult f32 = run_cli(base), b16 = run_cli(base + " --kv-dtype bfloat16"),
                  follows = run_cli(base + " --dtype bfloat16");
  ASSERT_EQ(f32.exit_code, 0) << f32.err;
  ASSERT_EQ(b16.exit_code, 0) << b16.err;
  ASSERT_EQ(follows.exit_code, 0) << follows.err;
  const auto a = nlohmann::json::parse(f32.out), b = nlohmann::json::parse(b16.out),
             c = nlohmann::json::parse(follows.out);
  EXPECT_EQ(a["kv_dtype"], "float32");
  EXPECT_EQ(b["kv_dtype"], "bfloat16");
  EXPECT_EQ(c["kv_dtype"], "bfloat16");  // auto: as --dtype
  EXPECT_EQ(2 * b["kv_cache_bytes"].get<int64_t>(), a["kv_cache_bytes"].get<int64_t>());
}

// The two fixtures with a tokenizer.json: text in, text out, and a perplexity.
constexpr const char* kTextPrompt = "First Citizen:\nBefore we proceed any further, hear me speak.";

TEST(HfDecoderCli, TextPromptsGenerateAsTransformers) {
  ATTN_REQUIRE_CLI();
  for (const char* name : {"llama3", "qwen3"}) {
    const std::string dir = kFixtures + "/" + name;
    const Expected want = expected(name);
    const text::HfTokenizer tok = text::HfTokenizer::from_file(dir + "/tokenizer.json");
    EXPECT_EQ(tok.encode(kTextPrompt), want.at("text_prompt_ids").to_int64_vector()) << name;
    const std::vector<int64_t> greedy = want.at("text_greedy").to_int64_vector();
    CliResult r = run_cli("generate --model '" + dir + "' --prompt '" + kTextPrompt +
                          "' --print-ids --greedy --max-new-tokens 8");
    EXPECT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(r.out, joined(greedy, " ") + "\n") << name;
    r = run_cli("generate --model '" + dir + "' --prompt '" + kTextPrompt +
                "' --greedy --max-new-tokens 8");
    EXPECT_EQ(r.exit_code, 0) << r.err;
    const size_t n = want.at("text_prompt_ids").numel();
    const std::vector<int64_t> added(greedy.begin() + static_cast<std::ptrdiff_t>(n), greedy.end());
    EXPECT_EQ(r.out, std::string(kTextPrompt) + tok.decode(added) + "\n") << name;
  }
}

TEST(HfDecoderCli, EvalIsTheirPerplexityGuide) {
  ATTN_REQUIRE_CLI();
  // The first 1,200 characters of the-verdict.txt, as the fixture script scores them.
  const std::vector<char32_t> cps =
      decode_utf8(read_text(std::string(ATTN_TESTS_DIR) + "/../data/the-verdict.txt"));
  std::string text;
  for (size_t i = 0; i < 1200 && i < cps.size(); ++i) text += encode_utf8(cps[i]);
  const std::string file = temp_path("verdict.txt");
  std::ofstream(file, std::ios::binary) << text;
  for (const char* name : {"llama3", "qwen3"}) {
    const Expected want = expected(name);
    const CliResult r = run_cli("eval --model '" + kFixtures + "/" + name + "' --file '" + file +
                                "' --context 64 --stride 32 --json");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const nlohmann::json j = nlohmann::json::parse(r.out);
    EXPECT_EQ(j["tokens"].get<int64_t>(), want.at("eval_ids").numel() - 1) << name;
    EXPECT_NEAR(j["mean_loss"].get<double>(), want.at("eval_loss").item(),
                1e-5 * want.at("eval_loss").item())
        << name;
  }
  std::remove(file.c_str());
}

TEST(HfDecoderCli, InspectSummarisesTheDirectory) {
  ATTN_REQUIRE_CLI();
  const CliResult r = run_cli("inspect --json '" + kFixtures + "/gemma3'");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["kind"], "huggingface-gemma3_text");
  EXPECT_EQ(j["config"]["layers"], "SSFS");
  EXPECT_EQ(j["config"]["rope"]["rope_type"], "linear");
  EXPECT_EQ(j["parameters"], 43680);
  EXPECT_EQ(j["dtype"], "F32");
  EXPECT_EQ(j["tokenizer"], "none");
  const CliResult q = run_cli("inspect --json '" + kFixtures + "/qwen3'");
  ASSERT_EQ(q.exit_code, 0) << q.err;
  const std::string tok = nlohmann::json::parse(q.out)["tokenizer"].get<std::string>();
  EXPECT_EQ(tok.rfind("tokenizer.json: 1205 ids; BPE", 0), 0u) << tok;
}

TEST(HfDecoderCli, RefusalsAreOneLine) {
  ATTN_REQUIRE_CLI();
  const std::string dir = kFixtures + "/qwen3",
                    bare = kFixtures + "/gemma3";  // bare: no tokenizer.json
  for (const std::string& args :
       {"generate --model '" + bare + "' --prompt hello",
        "generate --model '" + bare + "' --prompt-ids 1,2",
        "generate --model '" + dir + "' --prompt-ids 1,5000 --print-ids",
        "generate --model '" + dir + "' --prompt-ids 1 --print-ids --dtype float16",
        "generate --model '" + dir + "' --prompt-ids 1 --print-ids --max-new-tokens 64",
        "generate --model '" + dir + "' --prompt-ids 1 --print-ids --kv-dtype float16",
        "eval --model '" + bare + "' --file '" + dir + "/config.json'",
        "tokenize --tokenizer '" + bare + "' hello"}) {
    const CliResult r = run_cli(args);
    EXPECT_NE(r.exit_code, 0) << args;
    EXPECT_EQ(lines_of(r.err).size(), 1u) << args << ": " << r.err;
  }
}

}  // namespace
}  // namespace attn::test
