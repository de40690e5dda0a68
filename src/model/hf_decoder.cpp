// Llama 3 / Qwen2 / Qwen3 / Gemma 3 directories (attn/hf_decoder.h): config.json
// in both of the Hub's forms, generation_config.json, and the weights from one
// safetensors file or the shards of an index.
#include "attn/hf_decoder.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <stdexcept>

#include "attn/atomic_file.h"
#include "attn/bfloat16.h"
#include "attn/safetensors.h"
#include "attn/utf8.h"

namespace attn::io {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;

std::string named(const std::string& s) {
  std::string out = "'";
  out += printable(s);
  out += "'";
  return out;
}

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error(fmt::format("cannot read {}", named(path)));
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

Json parse_json(std::string_view text, const std::string& file) {
  try {
    Json j = Json::parse(text);
    if (!j.is_object())
      throw std::invalid_argument(fmt::format("{}: not a JSON object", named(file)));
    return j;
  } catch (const Json::exception& e) {
    throw std::invalid_argument(
        fmt::format("{}: not valid JSON: {}", named(file), printable(e.what(), 4096)));
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

namespace {

// The feed-forward's names: attn's (the book's) and transformers'.
constexpr std::pair<const char*, const char*> kFeedForwardNames[] = {
    {".mlp.fc1.", ".mlp.gate_proj."},
    {".mlp.fc2.", ".mlp.up_proj."},
    {".mlp.fc3.", ".mlp.down_proj."}};

// name with the first of kFeedForwardNames' `from` sides it holds replaced by the other side.
std::string renamed(const std::string& name, bool to_hf) {
  for (const auto& [attn_part, hf_part] : kFeedForwardNames) {
    const char* from = to_hf ? attn_part : hf_part;
    const char* to = to_hf ? hf_part : attn_part;
    const size_t at = name.find(from);
    if (at != std::string::npos)
      return name.substr(0, at) + to + name.substr(at + std::strlen(from));
  }
  return name;
}

}  // namespace

std::string hf_decoder_name(const std::string& attn_name) { return renamed(attn_name, true); }

std::string attn_decoder_name(const std::string& hf_name) { return renamed(hf_name, false); }

std::vector<std::string> hf_decoder_weight_files(const std::string& dir,
                                                 std::map<std::string, std::string>* weight_map) {
  const fs::path d(dir);
  std::vector<std::string> out;
  if (fs::is_regular_file(d / "model.safetensors")) {
    out.push_back((d / "model.safetensors").string());
    return out;
  }
  if (!fs::is_regular_file(d / "model.safetensors.index.json")) {
    throw std::invalid_argument(fmt::format(
        "{} has neither model.safetensors nor model.safetensors.index.json", named(dir)));
  }
  const std::string index = (d / "model.safetensors.index.json").string();
  const Json j = parse_json(read_text(index), index);
  if (!j.contains("weight_map") || !j.at("weight_map").is_object()) {
    throw std::invalid_argument(fmt::format("{}: no \"weight_map\" object", named(index)));
  }
  std::set<std::string> files;
  for (const auto& [name, file] : j.at("weight_map").items()) {
    if (!file.is_string()) {
      throw std::invalid_argument(fmt::format("{}: the file of {} must be a string, got {}",
                                              named(index), named(name),
                                              printable(file.dump(), 200)));
    }
    const std::string f = file.get<std::string>();
    if (f.empty() || f.find('/') != std::string::npos || f.find('\\') != std::string::npos ||
        f == "." || f == ".." || f.find('\0') != std::string::npos) {
      throw std::invalid_argument(
          fmt::format("{}: shard {} of {} is not a file name inside the directory", named(index),
                      named(f), named(name)));
    }
    if (weight_map) (*weight_map)[name] = f;
    files.insert(f);
  }
  for (const std::string& f : files) out.push_back((d / f).string());
  return out;
}

HfDecoderInfo load_hf_decoder(const std::string& dir, std::unique_ptr<nn::DecoderLM>& model,
                              DType dtype, bool in_place_weights) {
  if (dtype != DType::kFloat32 && dtype != DType::kBFloat16) {
    throw std::invalid_argument(fmt::format(
        "load_hf_decoder: dtype must be float32 or bfloat16, got {}", dtype_name(dtype)));
  }
  HfDecoderInfo info;
  info.hf = read_hf_decoder_config(dir);
  const fs::path d(dir);

  std::map<std::string, std::string> weight_map;  // tensor -> file (sharded)
  info.weight_files = hf_decoder_weight_files(dir, &weight_map);

  std::vector<std::shared_ptr<MappedSafetensors>> maps;
  std::map<std::string, std::pair<const MappedSafetensors*, const SafetensorsEntry*>> tensors;
  std::set<std::string> dtypes;
  for (const std::string& path : info.weight_files) {
    maps.push_back(std::make_shared<MappedSafetensors>(path, /*copy_on_write=*/true));
    const std::string base = fs::path(path).filename().string();
    for (const SafetensorsEntry& e : maps.back()->header().entries) {
      if (!weight_map.empty()) {
        const auto it = weight_map.find(e.name);
        if (it == weight_map.end() || it->second != base) {
          throw std::invalid_argument(fmt::format(
              "{}: holds {}, which the index does not place there", named(path), named(e.name)));
        }
      }
      if (!tensors.emplace(e.name, std::make_pair(maps.back().get(), &e)).second) {
        throw std::invalid_argument(
            fmt::format("{}: {} is stored twice", named(path), named(e.name)));
      }
    }
  }
  for (const auto& [name, file] : weight_map) {
    if (!tensors.count(name)) {
      throw std::invalid_argument(fmt::format("{}: the index places {} there, but it is not in it",
                                              named((d / file).string()), named(name)));
    }
  }

  // Each layer has several weights: a config naming more layers than the files
  // hold tensors is refused before the model's per-layer structures are built.
  if (info.hf.config.num_layers > static_cast<int64_t>(tensors.size())) {
    throw std::invalid_argument(
        fmt::format("{}: config.json has {} layers, but the weights hold only {} tensors",
                    named(dir), info.hf.config.num_layers, tensors.size()));
  }
  {
    const nn::NoInitScope no_init;  // every weight comes from the files (checked below)
    model = std::make_unique<nn::DecoderLM>(info.hf.config);
  }
  std::map<const MappedSafetensors*, std::shared_ptr<MappedSafetensors>> maps_by_ptr;
  for (const auto& m : maps) maps_by_ptr[m.get()] = m;
  std::set<std::string> used;
  for (auto& [attn_name, param] : model->named_parameters()) {
    const std::string name = hf_decoder_name(attn_name);
    const auto it = tensors.find(name);
    if (it == tensors.end()) {
      throw std::invalid_argument(
          fmt::format("{}: no tensor {}, which a {} with this config.json has", named(dir),
                      named(name), info.hf.model_type));
    }
    const auto& [map, e] = it->second;
    if (e->shape != param->value.shape()) {
      throw std::invalid_argument(fmt::format("{}: {} is {}, config.json makes it {}",
                                              named(map->path()), named(name), shape_str(e->shape),
                                              shape_str(param->value.shape())));
    }
    // Read in place where the file holds the compute dtype (F32, or BF16 for a
    // bf16 matrix): the tensor views the private mapping, which stays while
    // any such tensor lives (a page written becomes the process's own).
    const bool bf16_matrix = dtype == DType::kBFloat16 && param->value.dim() == 2;
    const DType want = bf16_matrix ? DType::kBFloat16 : DType::kFloat32;
    std::byte* in_place = map->mutable_data(*e);
    const auto align = static_cast<uintptr_t>(element_size(want));
    if (in_place_weights && e->dtype == safetensors_dtype_name(want) && in_place != nullptr &&
        reinterpret_cast<uintptr_t>(in_place) % align == 0 && e->nbytes() > 0) {
      const std::shared_ptr<MappedSafetensors> owner = maps_by_ptr.at(map);
      param->value = Tensor::wrap(owner, in_place, e->shape, want);
      ++info.mapped;
    } else {
      if (bf16_matrix) {  // a matrix, kept bf16
        param->value = Tensor::empty(e->shape, DType::kBFloat16);
        map->read_bfloat16(*e, reinterpret_cast<uint16_t*>(param->value.data_ptr<BFloat16>()));
      } else {
        map->read_float32(*e, param->value.data());
      }
      map->release(*e);  // the file's pages leave this process once copied
    }
    dtypes.insert(e->dtype);
    used.insert(name);
    ++info.tensors;
  }
  for (const auto& [name, where] : tensors) {
    if (used.count(name)) continue;
    const bool tied_head = name == "lm_head.weight" && info.hf.config.tie_embeddings;
    if (tied_head || name.ends_with(".rotary_emb.inv_freq")) {
      ++info.ignored;
      continue;
    }
    throw std::invalid_argument(
        fmt::format("{}: unknown tensor {} for a {} (attn reads transformers' "
                    "names: model.embed_tokens, model.layers.N..., model.norm, lm_head)",
                    named(where.first->path()), named(name), info.hf.model_type));
  }
  info.file_dtype = dtypes.size() == 1 ? *dtypes.begin() : "mixed";
  if (info.hf.config.tie_embeddings) {  // the head views the embedding's new value
    nn::tie(model->lm_head.weight, model->model.embed_tokens.weight);
  }
  model->eval();
  return info;
}

// ---- writing ----------------------------------------------------------------------------------

namespace {

// A float as JSON in its shortest decimal form (1e-06, not 9.99999997e-07).
Json shortest(float f) { return std::stod(fmt::format("{}", f)); }

Json rope_json(const nn::RopeScaling& r) {
  Json j = Json::object();
  switch (r.type) {
    case nn::RopeScaling::Type::kDefault:
      break;
    case nn::RopeScaling::Type::kLinear:
      j["factor"] = shortest(r.factor);
      break;
    case nn::RopeScaling::Type::kLlama3:
      j["factor"] = shortest(r.factor);
      j["high_freq_factor"] = shortest(r.high_freq_factor);
      j["low_freq_factor"] = shortest(r.low_freq_factor);
      j["original_max_position_embeddings"] = r.original_context_length;
      break;
  }
  j["rope_theta"] = shortest(r.theta);
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
  j["rms_norm_eps"] = shortest(c.norm_eps);
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
    j["attn_logit_softcapping"] = attn_cap > 0 ? shortest(attn_cap) : Json();
    j["final_logit_softcapping"] = c.final_softcap > 0 ? shortest(c.final_softcap) : Json();
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

void save_hf_decoder(nn::DecoderLM& model, const HfDecoderConfig& hf, const std::string& dir,
                     const HfDecoderSaveOptions& options) {
  if (options.dtype != DType::kFloat32 && options.dtype != DType::kBFloat16) {
    throw std::invalid_argument(fmt::format(
        "save_hf_decoder: dtype must be float32 or bfloat16, got {}", dtype_name(options.dtype)));
  }
  HfDecoderConfig out = hf;
  out.config = model.config();
  const std::string config =
      hf_decoder_config_json(out, options.dtype == DType::kBFloat16 ? "bfloat16" : "float32");
  std::vector<std::pair<std::string, Tensor>> tensors;
  for (auto& [name, param] : model.named_parameters())  // a tied head is not a parameter of its own
    tensors.emplace_back(hf_decoder_name(name), param->value.to(options.dtype));
  Json gen = Json::object();
  if (hf.bos_token_id) gen["bos_token_id"] = *hf.bos_token_id;
  if (hf.eos_token_ids.size() == 1) {
    gen["eos_token_id"] = hf.eos_token_ids[0];
  } else if (!hf.eos_token_ids.empty()) {
    gen["eos_token_id"] = hf.eos_token_ids;
  }
  if (out.config.pad_token_id >= 0) gen["pad_token_id"] = out.config.pad_token_id;

  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) {
    throw std::runtime_error(
        fmt::format("save_hf_decoder: cannot make {}: {}", named(dir), ec.message()));
  }
  const fs::path d(dir);
  write_safetensors((d / "model.safetensors").string(), tensors, {{"format", "pt"}});
  write_file_atomically((d / "config.json").string(), config);
  write_file_atomically((d / "generation_config.json").string(), gen.dump(2) + "\n");
  if (!options.tokenizer_json.empty())
    write_file_atomically((d / "tokenizer.json").string(), options.tokenizer_json);
  if (!options.tokenizer_config_json.empty())
    write_file_atomically((d / "tokenizer_config.json").string(), options.tokenizer_config_json);
}

}  // namespace attn::io
