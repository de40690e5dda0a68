// The config.json of a Llama 3 / Qwen2 / Qwen3 / Gemma 3 directory
// (attn/hf_decoder.h), read in both of the Hub's forms with its
// generation_config.json, and written back in today's form. Apart from the
// weights (hf_decoder.cpp) so that the libFuzzer target fuzz_hf_decoder_config
// (tests/fuzz) compiles the reader without the model.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <stdexcept>

#include "attn/float_decimal.h"
#include "attn/hf_decoder.h"
#include "attn/read_file.h"
#include "attn/utf8.h"
#include "model/hf_json.h"

namespace attn::io {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;
using hf::named;

Json parse_json(std::string_view text, const std::string& file) {
  return hf::parse_json_object(text, file);
}

// config.json and generation_config.json: regular files of at most 64 MiB
// (the Hub's are a few kB).
constexpr uint64_t kMaxConfigBytes = uint64_t{64} << 20;

std::string read_text(const std::string& path) {
  try {
    return read_file(path, kMaxConfigBytes);
  } catch (const std::runtime_error& e) {
    throw std::invalid_argument(e.what());
  }
}

constexpr int64_t kMaxSize = (int64_t{1} << 31) - 1;
// More layers than any model has (the largest published have under 200); a
// config above it is refused before per-layer lists are built (issue 46).
constexpr int64_t kMaxLayers = 4096;

// The reader of one config.json: typed lookups whose errors name the file and key.
struct Reader {
  const Json& j;
  const std::string& file;

  bool has(const char* key) const { return j.contains(key) && !j.at(key).is_null(); }
  std::string value_of(const Json& v) const { return printable(v.dump()); }

  int64_t integer(const char* key, std::optional<int64_t> fallback = std::nullopt,
                  int64_t lo = 1) const {
    if (!has(key)) {
      if (fallback) return *fallback;
      throw std::invalid_argument(fmt::format("{}: no \"{}\"", named(file), key));
    }
    const Json& v = j.at(key);
    if (!v.is_number_integer() || v.get<int64_t>() < lo || v.get<int64_t>() > kMaxSize) {
      throw std::invalid_argument(fmt::format("{}: \"{}\" must be an integer in [{}, {}], got {}",
                                              named(file), key, lo, kMaxSize, value_of(v)));
    }
    return v.get<int64_t>();
  }
  float number(const Json& obj, const char* key, float fallback, bool positive = true) const {
    if (!obj.contains(key) || obj.at(key).is_null()) return fallback;
    const Json& v = obj.at(key);
    if (!v.is_number() || !std::isfinite(v.get<float>()) ||
        (positive && !(v.get<float>() > 0.0f))) {
      throw std::invalid_argument(fmt::format("{}: \"{}\" must be a {}number, got {}", named(file),
                                              key, positive ? "positive " : "", value_of(v)));
    }
    return v.get<float>();
  }
  float number(const char* key, float fallback, bool positive = true) const {
    return number(j, key, fallback, positive);
  }
  bool boolean(const char* key, bool fallback) const {
    if (!has(key)) return fallback;
    if (!j.at(key).is_boolean()) {
      throw std::invalid_argument(fmt::format("{}: \"{}\" must be true or false, got {}",
                                              named(file), key, value_of(j.at(key))));
    }
    return j.at(key).get<bool>();
  }
  std::string string(const char* key, const std::string& fallback) const {
    if (!has(key)) return fallback;
    if (!j.at(key).is_string()) {
      throw std::invalid_argument(fmt::format("{}: \"{}\" must be a string, got {}", named(file),
                                              key, value_of(j.at(key))));
    }
    return j.at(key).get<std::string>();
  }

  // One rope_parameters entry (or the older rope_scaling object, with theta beside it).
  nn::RopeScaling rope(const Json& obj, float theta, const char* where) const {
    nn::RopeScaling r;
    r.theta = number(obj, "rope_theta", theta);
    std::string type = "default";
    for (const char* key : {"rope_type", "type"}) {
      if (obj.contains(key) && !obj.at(key).is_null()) {
        if (!obj.at(key).is_string()) {
          throw std::invalid_argument(fmt::format("{}: {}.{} must be a string, got {}", named(file),
                                                  where, key, value_of(obj.at(key))));
        }
        type = obj.at(key).get<std::string>();
        break;
      }
    }
    if (type == "default") {
      r.type = nn::RopeScaling::Type::kDefault;
    } else if (type == "linear") {
      r.type = nn::RopeScaling::Type::kLinear;
      r.factor = number(obj, "factor", 1.0f);
    } else if (type == "llama3") {
      r.type = nn::RopeScaling::Type::kLlama3;
      r.factor = number(obj, "factor", 8.0f);
      r.low_freq_factor = number(obj, "low_freq_factor", 1.0f);
      r.high_freq_factor = number(obj, "high_freq_factor", 4.0f);
      if (!obj.contains("original_max_position_embeddings")) {
        throw std::invalid_argument(
            fmt::format("{}: {} of rope_type llama3 has no \"original_max_position_embeddings\"",
                        named(file), where));
      }
      const Json& v = obj.at("original_max_position_embeddings");
      if (!v.is_number_integer() || v.get<int64_t>() < 1 || v.get<int64_t>() > kMaxSize) {
        throw std::invalid_argument(fmt::format(
            "{}: {}.original_max_position_embeddings must be a positive integer, got {}",
            named(file), where, value_of(v)));
      }
      r.original_context_length = v.get<int64_t>();
    } else {
      throw std::invalid_argument(
          fmt::format("{}: {} has rope_type {}; attn computes default, linear and llama3",
                      named(file), where, named(type)));
    }
    if (obj.contains("partial_rotary_factor") && obj.at("partial_rotary_factor") != Json(1.0) &&
        obj.at("partial_rotary_factor") != Json(1)) {
      throw std::invalid_argument(
          fmt::format("{}: {}.partial_rotary_factor {}: attn rotates whole heads", named(file),
                      where, value_of(obj.at("partial_rotary_factor"))));
    }
    return r;
  }
};

std::vector<int64_t> token_ids(const Json& v, const std::string& file, const char* key) {
  std::vector<int64_t> out;
  if (v.is_null()) return out;
  const auto one = [&](const Json& x) {
    if (!x.is_number_integer() || x.get<int64_t>() < 0) {
      throw std::invalid_argument(fmt::format("{}: \"{}\" must hold token ids, got {}", named(file),
                                              key, printable(x.dump())));
    }
    out.push_back(x.get<int64_t>());
  };
  if (v.is_array()) {
    for (const Json& x : v) one(x);
  } else {
    one(v);
  }
  return out;
}

}  // namespace

const char* hf_decoder_types() { return "llama, qwen2, qwen3, gemma2, gemma3_text"; }

HfDecoderConfig parse_hf_decoder_config(std::string_view text, const std::string& file) {
  const Json j = parse_json(text, file);
  const Reader r{j, file};
  HfDecoderConfig out;
  out.model_type = r.string("model_type", "");
  const std::string& type = out.model_type;
  const bool llama = type == "llama", qwen2 = type == "qwen2", qwen3 = type == "qwen3",
             gemma2 = type == "gemma2", gemma3 = type == "gemma3_text", gemma = gemma2 || gemma3;
  if (!llama && !qwen2 && !qwen3 && !gemma) {
    throw std::invalid_argument(fmt::format("{}: model_type {}; attn reads {} (and gpt2)",
                                            named(file), named(type), hf_decoder_types()));
  }
  nn::DecoderConfig& c = out.config;
  c.family = type;
  c.vocab_size = r.integer("vocab_size");
  c.hidden_size = r.integer("hidden_size");
  c.intermediate_size = r.integer("intermediate_size");
  c.num_layers = r.integer("num_hidden_layers");
  // Per-layer lists are built from it: a hostile 1e8 must fail here (issue 46).
  if (c.num_layers > kMaxLayers) {
    throw std::invalid_argument(fmt::format("{}: \"num_hidden_layers\" must be at most {}, got {}",
                                            named(file), kMaxLayers, c.num_layers));
  }
  c.num_heads = r.integer("num_attention_heads");
  c.num_kv_heads = r.integer("num_key_value_heads", c.num_heads);
  c.head_dim = r.integer("head_dim", gemma ? int64_t{256} : c.hidden_size / c.num_heads);
  c.context_length = r.integer("max_position_embeddings");
  c.norm_eps = r.number("rms_norm_eps", 1e-6f, false);
  c.tie_embeddings = r.boolean("tie_word_embeddings", gemma);
  out.torch_dtype = r.string("dtype", r.string("torch_dtype", ""));
  if (r.has("eos_token_id"))
    out.eos_token_ids = token_ids(j.at("eos_token_id"), file, "eos_token_id");
  if (r.has("pad_token_id")) {
    const std::vector<int64_t> pad = token_ids(j.at("pad_token_id"), file, "pad_token_id");
    if (pad.size() == 1 && pad[0] < c.vocab_size) c.pad_token_id = pad[0];
  }
  if (r.has("bos_token_id")) {
    const std::vector<int64_t> bos = token_ids(j.at("bos_token_id"), file, "bos_token_id");
    if (bos.size() == 1) out.bos_token_id = bos[0];
  }

  const std::string act =
      r.string(gemma ? "hidden_activation" : "hidden_act", gemma ? "gelu_pytorch_tanh" : "silu");
  if (gemma && (act == "gelu_pytorch_tanh" || act == "gelu_tanh")) {
    c.activation = nn::GateActivation::kGeluTanh;
  } else if (!gemma && act == "silu") {
    c.activation = nn::GateActivation::kSiLU;
  } else {
    throw std::invalid_argument(fmt::format("{}: activation {}; attn computes {} for {}",
                                            named(file), named(act),
                                            gemma ? "gelu_pytorch_tanh" : "silu", type));
  }
  const bool attention_bias = r.boolean("attention_bias", false);
  c.qkv_bias = qwen2 || attention_bias;
  c.o_bias = !qwen2 && attention_bias;
  if (r.boolean("mlp_bias", false)) {
    throw std::invalid_argument(
        fmt::format("{}: mlp_bias true: attn's feed-forward has no biases", named(file)));
  }
  c.qk_norm = qwen3 || gemma3;
  if (gemma) {
    c.norm_weight_offset = 1.0f;
    c.sandwich_norms = true;
    c.scale_embeddings = true;
    const float scalar = r.number("query_pre_attn_scalar", 256.0f);
    c.attention_scale = static_cast<float>(std::pow(double{scalar}, -0.5));
    // Gemma 2's defaults are 50 and 30 (a null turns one off); Gemma 3's none.
    // transformers' Gemma 3 attention reads attn_logit_softcapping but does not
    // apply it: neither does attn (HfDecoderConfig::unapplied_attn_softcap).
    const auto softcap = [&](const char* key, float gemma2_default) {
      if (!j.contains(key)) return gemma2 ? gemma2_default : 0.0f;
      return r.number(key, 0.0f);
    };
    c.attn_softcap = softcap("attn_logit_softcapping", 50.0f);
    c.final_softcap = softcap("final_logit_softcapping", 30.0f);
    if (gemma3) {
      out.unapplied_attn_softcap = c.attn_softcap;
      c.attn_softcap = 0.0f;
    }
    if (r.boolean("use_bidirectional_attention", false)) {
      throw std::invalid_argument(fmt::format(
          "{}: use_bidirectional_attention true (an embedding model): attn's decoder is causal",
          named(file)));
    }
  } else {
    for (const char* key : {"attn_logit_softcapping", "final_logit_softcapping"}) {
      if (r.has(key))
        throw std::invalid_argument(
            fmt::format("{}: \"{}\" is Gemma's; {} has none", named(file), key, type));
    }
  }

  // Which layers slide.
  bool sliding_enabled = gemma;
  if (qwen2 || qwen3) sliding_enabled = r.boolean("use_sliding_window", false);
  if (sliding_enabled)
    c.sliding_window =
        r.integer("sliding_window", gemma ? int64_t{4096} : std::optional<int64_t>{});
  if (r.has("layer_types")) {
    const Json& lt = j.at("layer_types");
    if (!lt.is_array() || static_cast<int64_t>(lt.size()) != c.num_layers) {
      throw std::invalid_argument(
          fmt::format("{}: layer_types must list num_hidden_layers ({}) types, got {}", named(file),
                      c.num_layers, printable(lt.dump(), 200)));
    }
    for (const Json& t : lt) {
      if (t == "full_attention") {
        c.layer_sliding.push_back(false);
      } else if (t == "sliding_attention") {
        c.layer_sliding.push_back(sliding_enabled);
      } else {
        throw std::invalid_argument(fmt::format(
            "{}: layer_types holds {}; attn computes full_attention and sliding_attention",
            named(file), printable(t.dump())));
      }
    }
  } else if (gemma) {
    const int64_t pattern = r.integer("sliding_window_pattern", gemma2 ? int64_t{2} : int64_t{6});
    for (int64_t i = 0; i < c.num_layers; ++i) c.layer_sliding.push_back((i + 1) % pattern != 0);
  } else if (sliding_enabled) {
    const int64_t first = r.integer("max_window_layers", c.num_layers, 0);
    for (int64_t i = 0; i < c.num_layers; ++i) c.layer_sliding.push_back(i >= first);
  }

  // RoPE, in either form.
  if (r.has("rope_parameters")) {
    out.config_form = "rope_parameters";
    const Json& rp = j.at("rope_parameters");
    if (!rp.is_object()) {
      throw std::invalid_argument(fmt::format("{}: rope_parameters must be an object, got {}",
                                              named(file), printable(rp.dump(), 200)));
    }
    if (gemma3) {
      const Json empty = Json::object();
      const Json& full = rp.contains("full_attention") ? rp.at("full_attention") : empty;
      const Json& local = rp.contains("sliding_attention") ? rp.at("sliding_attention") : empty;
      if (!full.is_object() || !local.is_object()) {
        throw std::invalid_argument(
            fmt::format("{}: rope_parameters' full_attention and sliding_attention must be objects",
                        named(file)));
      }
      c.rope = r.rope(full, 1e6f, "rope_parameters.full_attention");
      c.rope_local = r.rope(local, 1e4f, "rope_parameters.sliding_attention");
    } else {
      c.rope = r.rope(rp, 10000.0f, "rope_parameters");
      c.rope_local = c.rope;
    }
  } else {
    out.config_form = "rope_theta";
    const float theta = r.number("rope_theta", gemma3 ? 1e6f : 10000.0f);
    const Json none = Json::object();
    const Json& scaling = r.has("rope_scaling") ? j.at("rope_scaling") : none;
    if (!scaling.is_object()) {
      throw std::invalid_argument(fmt::format("{}: rope_scaling must be an object or null, got {}",
                                              named(file), printable(scaling.dump(), 200)));
    }
    c.rope = r.rope(scaling, theta, "rope_scaling");
    c.rope.theta = theta;
    if (gemma3) {
      c.rope_local.theta = r.number("rope_local_base_freq", 10000.0f);
    } else {
      c.rope_local = c.rope;
    }
  }
  try {
    c.check();
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument(fmt::format("{}: {}", named(file), e.what()));
  }
  return out;
}

bool is_hf_decoder_dir(const std::string& dir) {
  const fs::path file = fs::path(dir) / "config.json";
  std::error_code ec;
  if (!fs::is_regular_file(file, ec)) return false;
  try {
    const Json j = Json::parse(read_text(file.string()));
    if (!j.is_object() || !j.contains("model_type") || !j.at("model_type").is_string())
      return false;
    const std::string t = j.at("model_type").get<std::string>();
    return t == "llama" || t == "qwen2" || t == "qwen3" || t == "gemma2" || t == "gemma3_text";
  } catch (const std::exception&) {
    return false;
  }
}

HfDecoderConfig read_hf_decoder_config(const std::string& dir) {
  const std::string file = (fs::path(dir) / "config.json").string();
  if (!fs::is_regular_file(file)) {
    throw std::invalid_argument(fmt::format(
        "{} does not exist (a Hugging Face model directory has config.json and model.safetensors)",
        named(file)));
  }
  HfDecoderConfig out = parse_hf_decoder_config(read_text(file), file);
  const std::string gen = (fs::path(dir) / "generation_config.json").string();
  if (fs::is_regular_file(gen)) {
    const Json j = parse_json(read_text(gen), gen);
    if (j.contains("eos_token_id")) {
      for (const int64_t id : token_ids(j.at("eos_token_id"), gen, "eos_token_id")) {
        if (std::find(out.eos_token_ids.begin(), out.eos_token_ids.end(), id) ==
            out.eos_token_ids.end()) {
          out.eos_token_ids.push_back(id);
        }
      }
    }
  }
  for (const int64_t id : out.eos_token_ids) {
    if (id >= out.config.vocab_size) {
      throw std::invalid_argument(fmt::format("{}: eos_token_id {} is not below vocab_size {}",
                                              named(file), id, out.config.vocab_size));
    }
  }
  return out;
}

// ---- writing ----------------------------------------------------------------------------------

namespace {

Json rope_json(const nn::RopeScaling& r) {
  Json j = Json::object();
  switch (r.type) {
    case nn::RopeScaling::Type::kDefault:
      break;
    case nn::RopeScaling::Type::kLinear:
      j["factor"] = shortest_decimal(r.factor);
      break;
    case nn::RopeScaling::Type::kLlama3:
      j["factor"] = shortest_decimal(r.factor);
      j["high_freq_factor"] = shortest_decimal(r.high_freq_factor);
      j["low_freq_factor"] = shortest_decimal(r.low_freq_factor);
      j["original_max_position_embeddings"] = r.original_context_length;
      break;
  }
  j["rope_theta"] = shortest_decimal(r.theta);
  j["rope_type"] = nn::rope_type_name(r.type);
  return j;
}

bool same_rope(const nn::RopeScaling& a, const nn::RopeScaling& b) {
  return a.type == b.type && a.theta == b.theta && a.factor == b.factor &&
         a.low_freq_factor == b.low_freq_factor && a.high_freq_factor == b.high_freq_factor &&
         a.original_context_length == b.original_context_length;
}

}  // namespace

std::string hf_decoder_config_json(const HfDecoderConfig& hf, const std::string& dtype) {
  const nn::DecoderConfig& c = hf.config;
  c.check();
  const std::string& type = hf.model_type;
  const bool llama = type == "llama", qwen2 = type == "qwen2", qwen3 = type == "qwen3",
             gemma2 = type == "gemma2", gemma3 = type == "gemma3_text", gemma = gemma2 || gemma3;
  auto refuse = [&](const std::string& what) {
    throw std::invalid_argument(
        fmt::format("hf_decoder_config_json: a {} config cannot say {}", named(type), what));
  };
  if (!llama && !qwen2 && !qwen3 && !gemma) {
    throw std::invalid_argument(fmt::format("hf_decoder_config_json: model_type {}; attn writes {}",
                                            named(type), hf_decoder_types()));
  }
  if (dtype != "float32" && dtype != "bfloat16")
    throw std::invalid_argument(fmt::format("hf_decoder_config_json: dtype {}", named(dtype)));
  // What the family fixes (parse_hf_decoder_config's rules read backwards).
  if (c.qk_norm != (qwen3 || gemma3)) refuse(fmt::format("qk_norm {}", c.qk_norm));
  if (qwen2 ? (!c.qkv_bias || c.o_bias) : c.qkv_bias != c.o_bias)
    refuse(fmt::format("qkv_bias {} with o_bias {}", c.qkv_bias, c.o_bias));
  if (c.sandwich_norms != gemma || c.scale_embeddings != gemma ||
      c.norm_weight_offset != (gemma ? 1.0f : 0.0f))
    refuse("these norms or embedding scale");
  if (c.activation != (gemma ? nn::GateActivation::kGeluTanh : nn::GateActivation::kSiLU))
    refuse("this activation");
  if (!gemma && (c.attn_softcap > 0 || c.final_softcap > 0)) refuse("softcapping");
  if (gemma3 && c.attn_softcap > 0)
    refuse("an applied attention softcap (transformers' Gemma 3 has none)");
  if (!gemma3 && !same_rope(c.rope, c.rope_local)) refuse("two RoPE tables");
  bool any_sliding = false;
  for (int64_t i = 0; i < c.num_layers; ++i) any_sliding = any_sliding || c.layer_window(i) > 0;
  if (llama && any_sliding) refuse("sliding-window layers");

  Json j = Json::object();  // sorted keys, as save_pretrained writes them
  const char* arch = llama    ? "LlamaForCausalLM"
                     : qwen2  ? "Qwen2ForCausalLM"
                     : qwen3  ? "Qwen3ForCausalLM"
                     : gemma2 ? "Gemma2ForCausalLM"
                              : "Gemma3ForCausalLM";
  j["architectures"] = Json::array({arch});
  if (!qwen2) j["attention_bias"] = c.o_bias;
  j["attention_dropout"] = 0.0;
  if (hf.bos_token_id) j["bos_token_id"] = *hf.bos_token_id;
  j["dtype"] = dtype;
  if (hf.eos_token_ids.size() == 1) {
    j["eos_token_id"] = hf.eos_token_ids[0];
  } else if (!hf.eos_token_ids.empty()) {
    j["eos_token_id"] = hf.eos_token_ids;
  }
  j["head_dim"] = c.head_dim;
  j[gemma ? "hidden_activation" : "hidden_act"] = gemma ? "gelu_pytorch_tanh" : "silu";
  j["hidden_size"] = c.hidden_size;
  j["initializer_range"] = 0.02;
  j["intermediate_size"] = c.intermediate_size;
  j["max_position_embeddings"] = c.context_length;
  if (llama) j["mlp_bias"] = false;
  j["model_type"] = type;
  j["num_attention_heads"] = c.num_heads;
  j["num_hidden_layers"] = c.num_layers;
  j["num_key_value_heads"] = c.num_kv_heads;
  if (c.pad_token_id >= 0) j["pad_token_id"] = c.pad_token_id;
  j["rms_norm_eps"] = shortest_decimal(c.norm_eps);
  j["tie_word_embeddings"] = c.tie_embeddings;
  j["use_cache"] = true;
  j["vocab_size"] = c.vocab_size;
  if (!llama) {
    Json types = Json::array();
    for (int64_t i = 0; i < c.num_layers; ++i)
      types.push_back(c.layer_window(i) > 0 ? "sliding_attention" : "full_attention");
    j["layer_types"] = types;
  }
  if (gemma) {
    // scale = query_pre_attn_scalar^-0.5: the scalar back, whole when it was.
    const double scalar = 1.0 / (double{c.attention_scale} * double{c.attention_scale});
    const double whole = std::round(scalar);
    if (std::abs(scalar - whole) <= 1e-4 * whole) {
      j["query_pre_attn_scalar"] = static_cast<int64_t>(whole);
    } else {
      j["query_pre_attn_scalar"] = scalar;
    }
    const float attn_cap = gemma3 ? hf.unapplied_attn_softcap : c.attn_softcap;
    j["attn_logit_softcapping"] = attn_cap > 0 ? Json(shortest_decimal(attn_cap)) : Json();
    j["final_logit_softcapping"] =
        c.final_softcap > 0 ? Json(shortest_decimal(c.final_softcap)) : Json();
    j["sliding_window"] = c.sliding_window > 0 ? Json(c.sliding_window) : Json(4096);
    j["use_bidirectional_attention"] = false;
  } else if (!llama) {
    j["sliding_window"] = any_sliding ? Json(c.sliding_window) : Json();
    j["use_sliding_window"] = any_sliding;
  }
  if (gemma3) {
    j["rope_parameters"] = {{"full_attention", rope_json(c.rope)},
                            {"sliding_attention", rope_json(c.rope_local)}};
  } else {
    j["rope_parameters"] = rope_json(c.rope);
  }
  return j.dump(2) + "\n";
}

}  // namespace attn::io
