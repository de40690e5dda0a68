// Hugging Face GPT-2 directories (attn/hf_gpt2.h) against the fixtures of
// tests/fixtures/make_hf_gpt2_fixtures.py: transformers' logits for each file
// dtype and layout, every bad input's message, GPT-2 124M's shapes and
// parameter count, F16 conversion, export and re-read, and the sliding-window
// perplexity against transformers'.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "attn/generate.h"
#include "attn/gpt.h"
#include "attn/hf_gpt2.h"
#include "attn/random.h"
#include "attn/safetensors.h"
#include "cli.h"
#include "bits.h"

namespace attn::test {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

const std::string kFixtures = std::string(ATTN_TESTS_DIR) + "/fixtures/hf_gpt2";
constexpr float kLogitTolerance = 1e-4f;

const json& expected() {
  static const json j = json::parse(read_text(kFixtures + "/expected.json"));
  return j;
}

std::vector<int64_t> fixture_ids() { return expected().at("ids").get<std::vector<int64_t>>(); }

// The largest |attn - transformers| over the fixed ids' logits (T, V).
float max_logit_error(nn::GPTModel& model, const std::string& variant) {
  const std::vector<int64_t> ids = fixture_ids();
  const Tensor logits =
      model.forward(Tensor::from_int64({1, static_cast<int64_t>(ids.size())}, ids)).contiguous();
  const json& want = expected().at("logits").at(variant);
  const int64_t V = model.config().vocab_size;
  EXPECT_EQ(want.size(), ids.size());
  float worst = 0.0f;
  for (size_t t = 0; t < want.size(); ++t) {
    EXPECT_EQ(static_cast<int64_t>(want[t].size()), V);
    for (int64_t v = 0; v < V; ++v) {
      const float diff =
          std::fabs(logits.data()[static_cast<int64_t>(t) * V + v] - want[t][v].get<float>());
      worst = std::isnan(diff) ? INFINITY : std::max(worst, diff);
    }
  }
  return worst;
}

TEST(HfGpt2, LogitsMatchTransformersForEveryFileDtypeAndLayout) {
  struct Case {
    const char* variant;
    const char* dtype;
    bool prefixed, lm_head;
    int64_t buffers;
  };
  for (const Case c : {Case{"fp32", "F32", true, false, 0}, Case{"fp16", "F16", true, false, 0},
                       Case{"bf16", "BF16", false, false, 0},
                       Case{"buffers", "F16", true, false, 4},
                       Case{"untied", "F32", true, true, 0}}) {
    SCOPED_TRACE(c.variant);
    std::unique_ptr<nn::GPTModel> model;
    const io::HfGpt2Info info = io::load_hf_gpt2(kFixtures + "/" + c.variant, model);
    EXPECT_EQ(info.file_dtype, c.dtype);
    EXPECT_EQ(info.prefixed, c.prefixed);
    EXPECT_EQ(info.lm_head_stored, c.lm_head);
    EXPECT_EQ(info.ignored_buffers, c.buffers);
    EXPECT_EQ(model->out_head.weight.is(model->tok_emb.weight), !c.lm_head);
    EXPECT_FALSE(model->is_training());
    const float err = max_logit_error(*model, c.variant);
    EXPECT_LT(err, kLogitTolerance);
    std::printf("[ info     ] %s: largest |attn - transformers| logit difference %.3g\n",
                c.variant, static_cast<double>(err));
  }
}

TEST(HfGpt2, CachedGenerationSeesTheSameLogits) {
  std::unique_ptr<nn::GPTModel> model;
  io::load_hf_gpt2(kFixtures + "/fp16", model);
  const std::vector<int64_t> ids = fixture_ids();
  nn::GPTKVCache cache = nn::make_gpt_kv_cache(*model, 1);
  const Tensor cached =
      nn::forward_cached(*model, Tensor::from_int64({1, static_cast<int64_t>(ids.size())}, ids),
                         cache)
          .contiguous();
  const json& want = expected().at("logits").at("fp16");
  for (size_t t = 0; t < ids.size(); ++t) {
    for (int64_t v = 0; v < 512; ++v)
      EXPECT_NEAR(cached.data()[static_cast<int64_t>(t) * 512 + v], want[t][v].get<float>(),
                  kLogitTolerance);
  }
}

TEST(HfGpt2, Bf16ComputeStaysCloseToTransformersFp32) {
  std::unique_ptr<nn::GPTModel> model;
  io::load_hf_gpt2(kFixtures + "/fp32", model, {.dtype = DType::kBFloat16});
  const float err = max_logit_error(*model, "fp32");
  EXPECT_GT(err, 0.0f);  // bf16 products do differ
  EXPECT_LT(err, 0.1f);
}

// ---- errors ------------------------------------------------------------------------------------

// A copy of a fixture directory to break.
std::string copy_fixture(const std::string& variant) {
  const std::string dir = temp_path("hf_" + variant);
  fs::create_directories(dir);
  for (const auto& e : fs::directory_iterator(kFixtures + "/" + variant))
    fs::copy_file(e.path(), fs::path(dir) / e.path().filename());
  return dir;
}

void write_text(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

// fp32's config.json with one key changed (or removed when value is null).
std::string with_config(const std::string& key, const json& value, bool remove = false) {
  const std::string dir = copy_fixture("fp32");
  json cfg = json::parse(read_text(dir + "/config.json"));
  if (remove) {
    cfg.erase(key);
  } else {
    cfg[key] = value;
  }
  write_text(dir + "/config.json", cfg.dump());
  return dir;
}

// fp32's tensors, edited, written back.
std::string with_tensors(
    const std::function<void(std::vector<std::pair<std::string, Tensor>>&)>& edit) {
  const std::string dir = copy_fixture("fp32");
  io::SafetensorsFile f = io::read_safetensors(dir + "/model.safetensors");
  edit(f.tensors);
  io::write_safetensors(dir + "/model.safetensors", f.tensors, f.metadata);
  return dir;
}

std::string load_error(const std::string& dir) {
  std::unique_ptr<nn::GPTModel> model;
  try {
    io::load_model_dir(dir, model);
  } catch (const std::exception& e) {
    EXPECT_EQ(model, nullptr);
    return e.what();
  }
  ADD_FAILURE() << dir << " loaded";
  return "";
}

void expect_contains(const std::string& message, const std::string& part) {
  EXPECT_NE(message.find(part), std::string::npos) << "message: " << message << "\nlacks: " << part;
  for (unsigned char ch : message) EXPECT_TRUE(ch >= 0x20 && ch != 0x7F) << message;
}

// parse_hf_gpt2_config on text (what the config fuzzer feeds it): values that
// fit a double or an int64 but not what attn builds are refused.
TEST(HfGpt2, ConfigTextOutOfRange) {
  auto error = [](const std::string& extra) {
    const std::string text = R"({"n_embd": 32, "n_layer": 2, "n_head": 4, "n_positions": 64, "vocab_size": 512)" +
                             extra + "}";
    try {
      (void)attn::io::parse_hf_gpt2_config(text, "c.json");
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string("(accepted)");
  };
  EXPECT_EQ(error(""), "(accepted)");
  EXPECT_EQ(error(R"(, "layer_norm_epsilon": 1e300)"),
            "'c.json': layer_norm_epsilon must be a number > 0, got 1e+300");  // inf as a float
  // The key twice: the JSON reader keeps the last, a uint64 that reads as a negative int64.
  EXPECT_NE(error(R"(, "n_layer": 18446744073709551615)").find("\"n_layer\" must be an integer in [1, 2147483647]"),
            std::string::npos);
  EXPECT_NE(error(R"(, "vocab_size": 4294967296)").find("\"vocab_size\" must be an integer in [1, 2147483647], got 4294967296"),
            std::string::npos);
  const std::string bad_json = error(",\xff");
  EXPECT_NE(bad_json.find("'c.json': not valid JSON: "), std::string::npos) << bad_json;
  EXPECT_EQ(bad_json.find('\xff'), std::string::npos) << bad_json;  // escaped
}

TEST(HfGpt2, ConfigErrorsNameTheKey) {
  expect_contains(load_error(with_config("n_embd", nullptr, true)),
                  "config.json': no \"n_embd\" (GPT-2's config has n_embd, n_layer, n_head, "
                  "n_positions, vocab_size)");
  expect_contains(load_error(with_config("n_head", "4")),
                  "config.json': \"n_head\" must be an integer in [1, 2147483647], got \"4\"");
  expect_contains(load_error(with_config("n_head", 5)), "n_embd (32) must be divisible by n_head (5)");
  expect_contains(load_error(with_config("activation_function", "relu")),
                  "activation_function \"relu\" is not supported: attn computes GELU's tanh "
                  "approximation (\"gelu_new\" or \"gelu_pytorch_tanh\")");
  expect_contains(load_error(with_config("n_inner", 100)),
                  "n_inner 100 is not supported: attn's feed-forward width is 4 x n_embd = 128");
  expect_contains(load_error(with_config("scale_attn_by_inverse_layer_idx", true)),
                  "scale_attn_by_inverse_layer_idx true is not supported");
  expect_contains(load_error(with_config("layer_norm_epsilon", -1)),
                  "layer_norm_epsilon must be a number > 0, got -1");
  expect_contains(load_error(with_config("model_type", "llama")),
                  "model_type is \"llama\"; here attn reads GPT-2 (\"gpt2\")");
  expect_contains(load_error(with_config("activation_function", "gelu\x1b[31m")),
                  "activation_function \"gelu\\u001b[31m\" is not supported");
  // gelu_pytorch_tanh is the same function.
  std::unique_ptr<nn::GPTModel> model;
  const io::HfGpt2Info info =
      io::load_hf_gpt2(with_config("activation_function", "gelu_pytorch_tanh"), model);
  EXPECT_EQ(info.hf.activation_function, "gelu_pytorch_tanh");
  EXPECT_LT(max_logit_error(*model, "fp32"), kLogitTolerance);
}

TEST(HfGpt2, TensorErrorsNameTheKey) {
  const std::string missing = with_tensors([](auto& t) {
    std::erase_if(t, [](const auto& p) { return p.first == "transformer.h.1.mlp.c_fc.bias"; });
  });
  expect_contains(load_error(missing),
                  "model.safetensors': no tensor 'h.1.mlp.c_fc.bias' (nor "
                  "'transformer.h.1.mlp.c_fc.bias'); config.json says n_layer 2");
  const std::string unknown =
      with_tensors([](auto& t) { t.emplace_back("transformer.h.2.ln_1.weight", Tensor({32})); });
  expect_contains(load_error(unknown),
                  "tensor 'transformer.h.2.ln_1.weight' is not a GPT-2 weight of this config "
                  "(n_layer 2;");
  const std::string raw_name =
      with_tensors([](auto& t) { t.emplace_back("evil\x1b[2J\u202e", Tensor({1})); });
  expect_contains(load_error(raw_name), "tensor 'evil\\x1B[2J\\u{202E}' is not a GPT-2 weight");
  const std::string shape = with_tensors([](auto& t) {
    for (auto& [name, v] : t)
      if (name == "transformer.h.0.attn.c_attn.weight") v = Tensor({96, 32});
  });
  expect_contains(load_error(shape),
                  "tensor 'transformer.h.0.attn.c_attn.weight' has shape (96, 32), expected (32, "
                  "96) for config.json's n_embd 32, vocab_size 512, n_positions 64");
  const std::string dtype = with_tensors([](auto& t) {
    for (auto& [name, v] : t)
      if (name == "transformer.ln_f.bias") v = Tensor::from_int64({32}, std::vector<int64_t>(32));
  });
  expect_contains(load_error(dtype),
                  "tensor 'transformer.ln_f.bias' has dtype I64; GPT-2 weights are F32, F16 or BF16");
  const std::string both = with_tensors([](auto& t) { t.emplace_back("ln_f.bias", Tensor({32})); });
  expect_contains(load_error(both), "holds both 'ln_f.bias' and 'transformer.ln_f.bias'");
  const std::string untied = with_config("tie_word_embeddings", false);
  expect_contains(load_error(untied),
                  "no tensor 'lm_head.weight', which config.json's tie_word_embeddings false needs");
  const std::string bad_lm_head = with_tensors([](auto& t) { t.emplace_back("lm_head.weight", Tensor({512, 31})); });
  expect_contains(load_error(bad_lm_head),
                  "tensor 'lm_head.weight' has shape (512, 31), expected (512, 32)");
  // A buffer name past n_layer is not a buffer.
  const std::string far_buffer =
      with_tensors([](auto& t) { t.emplace_back("transformer.h.7.attn.bias", Tensor({1})); });
  expect_contains(load_error(far_buffer), "tensor 'transformer.h.7.attn.bias' is not a GPT-2 weight");
}

TEST(HfGpt2, FileErrorsSayWhatToDo) {
  const std::string pickle = copy_fixture("fp32");
  fs::remove(pickle + "/model.safetensors");
  write_text(pickle + "/pytorch_model.bin", "PK\x03\x04 not really");
  expect_contains(load_error(pickle),
                  "pytorch_model.bin' is a PyTorch pickle (torch.save), which attn does not read "
                  "(unpickling can run code); convert it once to '" +
                      pickle + "/model.safetensors' with: python3 -c \"import torch; from "
                               "safetensors.torch import save_file; sd = torch.load('");
  const std::string book = temp_path("book");
  fs::create_directories(book);
  write_text(book + "/model.pth", "\x80\x02pickle");
  const std::string book_err = load_error(book);
  expect_contains(book_err, "model.pth' is a PyTorch pickle (torch.save)");
  expect_contains(book_err, "'format': 'attn-checkpoint-1', 'tokenizer': 'gpt2'");
  expect_contains(load_error(book + "/model.pth"), "model.pth' is a PyTorch pickle");
  const std::string sharded = copy_fixture("fp32");
  fs::remove(sharded + "/model.safetensors");
  write_text(sharded + "/model.safetensors.index.json", "{}");
  expect_contains(load_error(sharded), "holds a sharded checkpoint (model.safetensors.index.json)");
  const std::string none = copy_fixture("fp32");
  fs::remove(none + "/model.safetensors");
  expect_contains(load_error(none), "model.safetensors' does not exist (a Hugging Face model "
                                    "directory has config.json and model.safetensors)");
  const std::string garbage = copy_fixture("fp32");
  write_text(garbage + "/model.safetensors", "garbage");
  expect_contains(load_error(garbage), "model.safetensors': truncated: 7 bytes");
  const std::string bad_json = copy_fixture("fp32");
  write_text(bad_json + "/config.json", "{\"n_embd\": ");
  expect_contains(load_error(bad_json), "config.json': not valid JSON");
}

// ---- GPT-2 124M: shapes and parameter count --------------------------------------------------

TEST(HfGpt2, Gpt2SmallShapesAndParameterCount) {
  const std::string dir = temp_path("gpt2_124m");
  fs::create_directories(dir);
  write_text(dir + "/config.json",
             R"({"activation_function": "gelu_new", "model_type": "gpt2", "n_ctx": 1024,
                 "n_embd": 768, "n_head": 12, "n_layer": 12, "n_positions": 1024,
                 "layer_norm_epsilon": 1e-05, "vocab_size": 50257})");
  const io::HfGpt2Config hf = io::read_hf_gpt2_config(dir);
  const nn::GPTConfig& c = hf.config;
  EXPECT_EQ(c.vocab_size, 50257);
  EXPECT_EQ(c.context_length, 1024);
  EXPECT_EQ(c.emb_dim, 768);
  EXPECT_EQ(c.n_heads, 12);
  EXPECT_EQ(c.n_layers, 12);
  EXPECT_TRUE(c.qkv_bias);
  EXPECT_TRUE(c.tie_embeddings);
  EXPECT_EQ(c.layer_norm_eps, 1e-5f);
  EXPECT_EQ(hf.activation_function, "gelu_new");

  Generator gen(1);
  {
  nn::GPTModel gpt2(c, {}, gen);
  EXPECT_EQ(gpt2.num_parameters(), 124'439'808);
  const auto state = io::hf_gpt2_state_dict(gpt2);
  EXPECT_EQ(state.size(), 2u + 12u * 12u + 2u);  // wte, wpe, 12 per block, ln_f; no lm_head
  int64_t total = 0;
  std::map<std::string, Shape> shapes;
  for (const auto& [name, t] : state) {
    total += t.numel();
    shapes[name] = t.shape();
  }
  EXPECT_EQ(total, 124'439'808);
  EXPECT_EQ(shapes.at("wte.weight"), (Shape{50257, 768}));
  EXPECT_EQ(shapes.at("wpe.weight"), (Shape{1024, 768}));
  EXPECT_EQ(shapes.at("h.11.attn.c_attn.weight"), (Shape{768, 2304}));
  EXPECT_EQ(shapes.at("h.11.attn.c_attn.bias"), (Shape{2304}));
  EXPECT_EQ(shapes.at("h.0.attn.c_proj.weight"), (Shape{768, 768}));
  EXPECT_EQ(shapes.at("h.0.mlp.c_fc.weight"), (Shape{768, 3072}));
  EXPECT_EQ(shapes.at("h.0.mlp.c_proj.weight"), (Shape{3072, 768}));
  EXPECT_EQ(shapes.at("ln_f.bias"), (Shape{768}));
  EXPECT_EQ(shapes.count("lm_head.weight"), 0u);
  }

  nn::GPTModel book(nn::GPT_CONFIG_124M, {}, gen);
  EXPECT_EQ(book.num_parameters(), 163'009'536);
  EXPECT_FALSE(book.out_head.weight.is(book.tok_emb.weight));
}

TEST(HfGpt2, LargerConfigsRead) {
  struct Size {
    int64_t E, L, H;
  };
  for (const Size s : {Size{1024, 24, 16}, Size{1280, 36, 20}, Size{1600, 48, 25}}) {
    const std::string dir = temp_path("gpt2_cfg");
    fs::create_directories(dir);
    write_text(dir + "/config.json",
               json{{"n_embd", s.E}, {"n_layer", s.L}, {"n_head", s.H}, {"n_positions", 1024},
                    {"vocab_size", 50257}}
                   .dump());
    const nn::GPTConfig c = io::read_hf_gpt2_config(dir).config;
    EXPECT_EQ(c.emb_dim, s.E);
    EXPECT_EQ(c.n_layers, s.L);
    EXPECT_EQ(c.n_heads, s.H);
    EXPECT_EQ(c.emb_dim / c.n_heads, 64);
  }
}

// ---- F16 -------------------------------------------------------------------------------------

TEST(HfGpt2, HalfConversionIsExactAndRoundsToNearestEven) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float f = io::half_to_float(static_cast<uint16_t>(h));
    if (std::isnan(f)) {
      EXPECT_EQ((h & 0x7C00u), 0x7C00u);
      EXPECT_TRUE(std::isnan(io::half_to_float(io::float_to_half(f))));
      continue;
    }
    ASSERT_EQ(io::float_to_half(f), h) << h;  // every half survives the round trip
  }
  EXPECT_EQ(io::half_to_float(0x3C00), 1.0f);
  EXPECT_EQ(io::half_to_float(0xC000), -2.0f);
  EXPECT_EQ(io::half_to_float(0x7BFF), 65504.0f);
  EXPECT_EQ(io::half_to_float(0x0001), std::ldexp(1.0f, -24));
  // Halfway cases go to the even neighbour; past 65504 + half an ulp is infinity.
  EXPECT_EQ(io::float_to_half(1.0f + std::ldexp(1.0f, -11)), 0x3C00);
  EXPECT_EQ(io::float_to_half(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3C02);
  EXPECT_EQ(io::float_to_half(65519.0f), 0x7BFF);
  EXPECT_EQ(io::float_to_half(65520.0f), 0x7C00);
  EXPECT_EQ(io::float_to_half(-1e9f), 0xFC00);
  EXPECT_EQ(io::float_to_half(std::ldexp(1.0f, -25)), 0x0000);   // halfway to the least: even
  EXPECT_EQ(io::float_to_half(std::ldexp(3.0f, -26)), 0x0001);
  EXPECT_EQ(io::float_to_half(std::ldexp(1023.5f, -24)), 0x0400);  // rounds up into the normals
}

// ---- writing ---------------------------------------------------------------------------------

// Every tensor of two safetensors files equal in name, dtype, shape and bytes.
void expect_same_tensors(const std::string& a_path, const std::string& b_path) {
  const io::MappedSafetensors a(a_path), b(b_path);
  std::map<std::string, const io::SafetensorsEntry*> bs;
  for (const auto& e : b.header().entries) bs[e.name] = &e;
  size_t weights = 0;
  for (const auto& e : a.header().entries) {
    if (e.name.ends_with(".attn.bias") || e.name.ends_with(".attn.masked_bias")) continue;
    ++weights;
    std::string key = e.name;
    if (!bs.count(key)) key = "transformer." + key;
    ASSERT_TRUE(bs.count(key)) << e.name;
    const io::SafetensorsEntry& f = *bs.at(key);
    EXPECT_EQ(e.dtype, f.dtype) << e.name;
    EXPECT_EQ(e.shape, f.shape) << e.name;
    const auto x = a.bytes(e), y = b.bytes(f);
    EXPECT_TRUE(x.size() == y.size() && attn::test::same_bytes(x.data(), y.data(), x.size()))
        << e.name;
  }
  EXPECT_EQ(weights, bs.size());
}

TEST(HfGpt2, ExportThenReadGivesIdenticalWeights) {
  struct Case {
    const char* variant;
    io::HfDType dtype;
  };
  for (const Case c : {Case{"fp32", io::HfDType::kFloat32}, Case{"fp16", io::HfDType::kFloat16},
                       Case{"bf16", io::HfDType::kBFloat16},
                       Case{"untied", io::HfDType::kFloat32}}) {
    SCOPED_TRACE(c.variant);
    std::unique_ptr<nn::GPTModel> model, again;
    io::load_hf_gpt2(kFixtures + "/" + c.variant, model);
    const std::string out = temp_path("export");
    io::save_hf_gpt2(*model, out, c.dtype);
    // Same bytes as transformers wrote (bf16: transformers' names had their prefix removed).
    expect_same_tensors(kFixtures + "/" + c.variant + "/model.safetensors",
                        out + "/model.safetensors");
    const io::HfGpt2Info info = io::load_hf_gpt2(out, again);
    EXPECT_TRUE(info.prefixed);
    auto a = model->state_dict(), b = again->state_dict();
    ASSERT_EQ(a.size(), b.size());
    for (size_t i = 0; i < a.size(); ++i) {
      EXPECT_EQ(a[i].first, b[i].first);
      const Tensor x = a[i].second.contiguous(), y = b[i].second.contiguous();
      ASSERT_EQ(x.shape(), y.shape()) << a[i].first;
      EXPECT_TRUE(attn::test::same_bits(x, y)) << a[i].first;
    }
    const json cfg = json::parse(read_text(out + "/config.json"));
    EXPECT_EQ(cfg.at("model_type"), "gpt2");
    EXPECT_EQ(cfg.at("n_embd"), 32);
    EXPECT_EQ(cfg.at("layer_norm_epsilon").get<double>(), 1e-05);
    EXPECT_EQ(cfg.at("tie_word_embeddings"), std::string(c.variant) != "untied");
  }
}

TEST(HfGpt2, BookModelExportsWithZeroQkvBiasAndStoredHead) {
  // The book's configuration (no q|k|v bias, untied head) maps onto GPT-2's layout.
  Generator gen(7);
  nn::GPTModel book({.vocab_size = 40, .context_length = 16, .emb_dim = 16, .n_heads = 2,
                     .n_layers = 1, .drop_rate = 0.0f, .qkv_bias = false},
                    {}, gen);
  book.eval();
  const std::string out = temp_path("book_hf");
  io::save_hf_gpt2(book, out);
  std::unique_ptr<nn::GPTModel> hf;
  const io::HfGpt2Info info = io::load_hf_gpt2(out, hf);
  EXPECT_TRUE(info.lm_head_stored);
  const Tensor ids = Tensor::from_int64({1, 5}, {1, 7, 3, 39, 0});
  const Tensor a = book.forward(ids).contiguous(), b = hf->forward(ids).contiguous();
  for (int64_t i = 0; i < a.numel(); ++i) EXPECT_NEAR(a.data()[i], b.data()[i], 1e-5f) << i;
  const io::SafetensorsFile f = io::read_safetensors(out + "/model.safetensors");
  for (const auto& [name, t] : f.tensors) {
    if (name == "transformer.h.0.attn.c_attn.bias") {
      for (int64_t i = 0; i < t.numel(); ++i) EXPECT_EQ(t.data()[i], 0.0f);
    }
  }
}

// ---- perplexity ------------------------------------------------------------------------------

TEST(HfGpt2, SlidingWindowPerplexityMatchesTransformers) {
  std::unique_ptr<nn::GPTModel> model;
  io::load_hf_gpt2(kFixtures + "/fp32", model);
  const std::vector<int64_t> ids = expected().at("eval_ids").get<std::vector<int64_t>>();
  for (const json& want : expected().at("eval")) {
    const int64_t context = want.at("context"), stride = want.at("stride");
    SCOPED_TRACE(::testing::Message() << "context " << context << " stride " << stride);
    const nn::PerplexityResult r = nn::sliding_window_perplexity(*model, ids, context, stride);
    EXPECT_EQ(r.tokens, want.at("tokens").get<int64_t>());
    EXPECT_NEAR(r.mean_loss, want.at("mean_loss").get<double>(), 1e-5);
    EXPECT_NEAR(r.perplexity / want.at("perplexity").get<double>(), 1.0, 1e-5);
  }
  EXPECT_THROW(nn::sliding_window_perplexity(*model, ids, 65, 10), std::invalid_argument);
  EXPECT_THROW(nn::sliding_window_perplexity(*model, ids, 32, 33), std::invalid_argument);
  EXPECT_THROW(nn::sliding_window_perplexity(*model, {5}, 32, 16), std::invalid_argument);
  EXPECT_THROW(nn::sliding_window_perplexity(*model, {5, 512}, 32, 16), std::invalid_argument);
}

// ---- top-p -----------------------------------------------------------------------------------

TEST(HfGpt2, TopPKeepsTheNucleus) {
  // probs softmax([3, 2, 1, 0]) = 0.644, 0.237, 0.087, 0.032.
  const Tensor logits = Tensor::of({1, 4}, {1.0f, 3.0f, 0.0f, 2.0f});
  std::map<int64_t, int> seen_small, seen_mid;
  Generator gen(11);
  for (int i = 0; i < 400; ++i) {
    ++seen_small[nn::sample_next(logits, 1.0f, 0, 0.5f, gen)[0]];
    ++seen_mid[nn::sample_next(logits, 1.0f, 0, 0.85f, gen)[0]];
  }
  EXPECT_EQ(seen_small.size(), 1u);  // 0.644 >= 0.5: the top token alone
  EXPECT_EQ(seen_small.count(1), 1u);
  EXPECT_EQ(seen_mid.size(), 2u);  // 0.644 < 0.85 <= 0.881: two tokens
  EXPECT_GT(seen_mid[1], seen_mid[3]);
  EXPECT_GT(seen_mid[3], 0);
  // top_p 1 is the book's sampler, draw for draw.
  Generator g1(3), g2(3);
  for (int i = 0; i < 20; ++i)
    EXPECT_EQ(nn::sample_next(logits, 0.7f, 3, 1.0f, g1), nn::sample_next(logits, 0.7f, 3, g2));
  Generator g(1);
  EXPECT_THROW(nn::sample_next(logits, 0.0f, 0, 0.5f, g), std::invalid_argument);
  EXPECT_THROW(nn::sample_next(logits, 1.0f, 0, 0.0f, g), std::invalid_argument);
  EXPECT_THROW(nn::sample_next(logits, 1.0f, 0, 1.5f, g), std::invalid_argument);
}

}  // namespace
}  // namespace attn::test
