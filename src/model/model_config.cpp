// A GPTConfig as a checkpoint's "config" JSON, and back (attn/model_config.h).
#include "attn/model_config.h"

#include <fmt/format.h>

#include <nlohmann/json.hpp>
#include <stdexcept>
#include <utility>

#include "attn/utf8.h"

namespace attn::nn {

std::string config_to_json(const GPTConfig& c) {
  nlohmann::ordered_json j;
  j["vocab_size"] = c.vocab_size;
  j["context_length"] = c.context_length;
  j["emb_dim"] = c.emb_dim;
  j["n_heads"] = c.n_heads;
  j["n_layers"] = c.n_layers;
  j["drop_rate"] = static_cast<double>(c.drop_rate);
  j["qkv_bias"] = c.qkv_bias;
  // Written only when not the book's values, so the book's checkpoints keep their bytes.
  if (c.layer_norm_eps != GPTConfig{}.layer_norm_eps)
    j["layer_norm_eps"] = static_cast<double>(c.layer_norm_eps);
  if (c.tie_embeddings) j["tie_embeddings"] = true;
  if (c.rope) {
    j["rope"] = true;
    j["theta_base"] = static_cast<double>(c.theta_base);
  }
  if (c.latent_dim > 0) j["latent_dim"] = c.latent_dim;
  if (c.n_kv_groups != 0) j["n_kv_groups"] = c.n_kv_groups;
  if (c.sliding_window_size != 0) {
    j["sliding_window_size"] = c.sliding_window_size;
    j["sliding_window_stride"] = c.sliding_window_stride;
  }
  return j.dump();
}

namespace {

// More layers than any model has (the largest published have under 200); a
// config above it is refused before per-layer lists are built (issue 46).
constexpr int64_t kMaxLayers = 4096;

int64_t config_int(const nlohmann::json& cfg, const char* key, const std::string& file) {
  if (!cfg.contains(key)) {
    throw std::invalid_argument(
        fmt::format("'{}': metadata \"config\" lacks \"{}\"", printable(file), printable(key)));
  }
  const nlohmann::json& v = cfg.at(key);
  if (!v.is_number_integer()) {
    throw std::invalid_argument(fmt::format("'{}': config \"{}\" must be an integer, got {}",
                                            printable(file), printable(key), printable(v.dump())));
  }
  return v.get<int64_t>();
}

}  // namespace

GPTConfig config_from_json(const std::string& json, const std::string& file) {
  nlohmann::json cfg;
  try {
    cfg = nlohmann::json::parse(json);
  } catch (const nlohmann::json::exception& e) {  // parse_error, or out_of_range for 1e400
    throw std::invalid_argument(fmt::format("'{}': metadata \"config\" is not valid JSON: {}",
                                            printable(file), printable(e.what())));
  }
  if (!cfg.is_object()) {
    throw std::invalid_argument(
        fmt::format("'{}': metadata \"config\" is not a JSON object", printable(file)));
  }
  GPTConfig c;
  c.vocab_size = config_int(cfg, "vocab_size", file);
  c.context_length = config_int(cfg, "context_length", file);
  c.emb_dim = config_int(cfg, "emb_dim", file);
  c.n_heads = config_int(cfg, "n_heads", file);
  c.n_layers = config_int(cfg, "n_layers", file);
  if (c.n_layers > kMaxLayers) {  // blocks are built from it before any weight is read
    throw std::invalid_argument(fmt::format("'{}': config \"n_layers\" must be at most {}, got {}",
                                            printable(file), kMaxLayers, c.n_layers));
  }
  if (!cfg.contains("drop_rate") || !cfg.at("drop_rate").is_number()) {
    throw std::invalid_argument(
        fmt::format("'{}': config \"drop_rate\" is missing or not a number", printable(file)));
  }
  c.drop_rate = cfg.at("drop_rate").get<float>();
  if (!cfg.contains("qkv_bias") || !cfg.at("qkv_bias").is_boolean()) {
    throw std::invalid_argument(
        fmt::format("'{}': config \"qkv_bias\" is missing or not a boolean", printable(file)));
  }
  c.qkv_bias = cfg.at("qkv_bias").get<bool>();
  if (cfg.contains("layer_norm_eps")) {
    if (!cfg.at("layer_norm_eps").is_number()) {
      throw std::invalid_argument(
          fmt::format("'{}': config \"layer_norm_eps\" is not a number", printable(file)));
    }
    c.layer_norm_eps = cfg.at("layer_norm_eps").get<float>();
  }
  if (cfg.contains("tie_embeddings")) {
    if (!cfg.at("tie_embeddings").is_boolean()) {
      throw std::invalid_argument(
          fmt::format("'{}': config \"tie_embeddings\" is not a boolean", printable(file)));
    }
    c.tie_embeddings = cfg.at("tie_embeddings").get<bool>();
  }
  if (cfg.contains("rope")) {
    if (!cfg.at("rope").is_boolean()) {
      throw std::invalid_argument(
          fmt::format("'{}': config \"rope\" is not a boolean", printable(file)));
    }
    c.rope = cfg.at("rope").get<bool>();
  }
  if (cfg.contains("latent_dim")) {
    if (!cfg.at("latent_dim").is_number_integer()) {
      throw std::invalid_argument(
          fmt::format("'{}': config \"latent_dim\" is not an integer", printable(file)));
    }
    c.latent_dim = cfg.at("latent_dim").get<int64_t>();
  }
  if (cfg.contains("theta_base")) {
    if (!cfg.at("theta_base").is_number()) {
      throw std::invalid_argument(
          fmt::format("'{}': config \"theta_base\" is not a number", printable(file)));
    }
    c.theta_base = cfg.at("theta_base").get<float>();
  }
  // The book's bonus attention (absent: the chapter-4 model).
  for (const auto& [key, field] : {std::pair{"n_kv_groups", &c.n_kv_groups},
                                   std::pair{"sliding_window_size", &c.sliding_window_size},
                                   std::pair{"sliding_window_stride", &c.sliding_window_stride}}) {
    if (cfg.contains(key)) *field = config_int(cfg, key, file);
  }
  return c;
}

}  // namespace attn::nn
