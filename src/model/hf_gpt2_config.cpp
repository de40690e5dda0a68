// Hugging Face GPT-2's config.json (attn/hf_gpt2.h): the keys attn reads,
// checked, into a GPTConfig. Its own file so that the libFuzzer target
// (tests/fuzz/fuzz_hf_config.cpp) builds it with nothing but the JSON reader.
#include <fmt/format.h>

#include <cmath>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <string_view>

#include "attn/hf_gpt2.h"
#include "attn/utf8.h"

namespace attn::io {
namespace {

using Json = nlohmann::json;

std::string named(const std::string& s) {
  std::string out = "'";  // (appending, not "'" + ...: GCC 12's false -Wrestrict at -O3)
  out += printable(s);
  out += "'";
  return out;
}


// Sizes above this are no GPT-2 (and 4 x n_embd must not overflow).
constexpr int64_t kMaxSize = (int64_t{1} << 31) - 1;
// More layers than any model has (the largest published have under 200); a
// config above it is refused before per-layer lists are built (issue 46).
constexpr int64_t kMaxLayers = 4096;

int64_t positive_int(const Json& j, const char* key, const std::string& file) {
  if (!j.contains(key)) {
    throw std::invalid_argument(fmt::format("{}: no \"{}\" (GPT-2's config has n_embd, n_layer, "
                                            "n_head, n_positions, vocab_size)",
                                            named(file), key));
  }
  const Json& v = j.at(key);
  // An unsigned value above INT64_MAX reads as negative: refused too.
  if (!v.is_number_integer() || v.get<int64_t>() < 1 || v.get<int64_t>() > kMaxSize) {
    throw std::invalid_argument(fmt::format("{}: \"{}\" must be an integer in [1, {}], got {}",
                                            named(file), key, kMaxSize, printable(v.dump())));
  }
  return v.get<int64_t>();
}

}  // namespace

HfGpt2Config parse_hf_gpt2_config(std::string_view text, const std::string& file) {
  Json j;
  try {
    j = Json::parse(text);
  } catch (const Json::exception& e) {
    throw std::invalid_argument(
        fmt::format("{}: not valid JSON: {}", named(file), printable(e.what(), 4096)));
  }
  if (!j.is_object()) throw std::invalid_argument(fmt::format("{}: not a JSON object", named(file)));
  if (j.contains("model_type") &&
      (!j.at("model_type").is_string() || j.at("model_type").get<std::string>() != "gpt2")) {
    throw std::invalid_argument(
        fmt::format("{}: model_type is {}; here attn reads GPT-2 (\"gpt2\"); "
                    "Llama, Qwen and Gemma directories go to attn generate, "
                    "eval, tokenize and inspect",
                    named(file), printable(j.at("model_type").dump())));
  }
  HfGpt2Config out;
  nn::GPTConfig& c = out.config;
  c.emb_dim = positive_int(j, "n_embd", file);
  c.n_layers = positive_int(j, "n_layer", file);
  if (c.n_layers > kMaxLayers) {  // blocks are built from it before any weight is read
    throw std::invalid_argument(fmt::format("{}: \"n_layer\" must be at most {}, got {}",
                                            named(file), kMaxLayers, c.n_layers));
  }
  c.n_heads = positive_int(j, "n_head", file);
  c.context_length = positive_int(j, "n_positions", file);
  c.vocab_size = positive_int(j, "vocab_size", file);
  c.qkv_bias = true;
  c.drop_rate = 0.0f;  // attn uses a loaded model for inference
  if (c.emb_dim % c.n_heads != 0) {
    throw std::invalid_argument(fmt::format("{}: n_embd ({}) must be divisible by n_head ({})",
                                            named(file), c.emb_dim, c.n_heads));
  }
  c.layer_norm_eps = 1e-5f;
  if (j.contains("layer_norm_epsilon")) {
    const Json& v = j.at("layer_norm_epsilon");
    // Checked as the float it becomes (1e300 is a finite double but not a float).
    if (!v.is_number() || !(v.get<float>() > 0.0f) || !std::isfinite(v.get<float>())) {
      throw std::invalid_argument(fmt::format("{}: layer_norm_epsilon must be a number > 0, got {}",
                                              named(file), printable(v.dump())));
    }
    c.layer_norm_eps = v.get<float>();
  }
  c.tie_embeddings = true;
  if (j.contains("tie_word_embeddings")) {
    if (!j.at("tie_word_embeddings").is_boolean()) {
      throw std::invalid_argument(fmt::format("{}: tie_word_embeddings must be true or false, got {}",
                                              named(file),
                                              printable(j.at("tie_word_embeddings").dump())));
    }
    c.tie_embeddings = j.at("tie_word_embeddings").get<bool>();
  }
  out.activation_function = "gelu_new";
  if (j.contains("activation_function")) {
    const Json& v = j.at("activation_function");
    const std::string act = v.is_string() ? v.get<std::string>() : v.dump();
    if (!v.is_string() || (act != "gelu_new" && act != "gelu_pytorch_tanh")) {
      throw std::invalid_argument(fmt::format(
          "{}: activation_function {} is not supported: attn computes GELU's tanh approximation "
          "(\"gelu_new\" or \"gelu_pytorch_tanh\")",
          named(file), printable(v.dump())));
    }
    out.activation_function = act;
  }
  if (j.contains("n_inner") && !j.at("n_inner").is_null() &&
      !(j.at("n_inner").is_number_integer() && j.at("n_inner").get<int64_t>() == 4 * c.emb_dim)) {
    throw std::invalid_argument(fmt::format(
        "{}: n_inner {} is not supported: attn's feed-forward width is 4 x n_embd = {}",
        named(file), printable(j.at("n_inner").dump()), 4 * c.emb_dim));
  }
  auto require_flag = [&](const char* key, bool expected) {
    if (j.contains(key) && !(j.at(key).is_boolean() && j.at(key).get<bool>() == expected)) {
      throw std::invalid_argument(fmt::format("{}: {} {} is not supported (attn computes GPT-2's "
                                              "attention with {} {})",
                                              named(file), key, printable(j.at(key).dump()), key,
                                              expected ? "true" : "false"));
    }
  };
  require_flag("scale_attn_weights", true);
  require_flag("scale_attn_by_inverse_layer_idx", false);
  require_flag("reorder_and_upcast_attn", false);
  return out;
}


}  // namespace attn::io
