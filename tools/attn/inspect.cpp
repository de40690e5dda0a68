// `attn inspect FILE` (inspect.h).
#include "inspect.h"

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "attn/float_decimal.h"
#include "attn/hf_decoder.h"
#include "attn/hf_gpt2.h"
#include "attn/hf_tokenizer.h"
#include "attn/model_config.h"
#include "attn/utf8.h"
#include "flag_checks.h"

namespace attn::cli {

namespace {

// A name or metadata string as printed: as it is when it is plain text, else
// quoted and escaped by attn::printable (C0 and C1 controls, bidi overrides
// and other invisible code points, bytes that are not UTF-8 as \xHH), so that
// no escape sequence reaches the terminal and a space cannot split a column.
std::string shown(const std::string& s) {
  const std::string p = attn::printable(s, 4096);
  if (!s.empty() && p == s && s.find_first_of(" \"") == std::string::npos) return s;
  std::string out = "\"";
  for (const char c : p) out += c == '"' ? std::string("\\\"") : std::string(1, c);
  return out + "\"";
}

// A path (bytes) into the JSON: KEY alone when UTF-8, else KEY with U+FFFD
// for the bad bytes and KEY_hex with every byte (attn/utf8.h).
void put_bytes(nlohmann::ordered_json& j, const char* key, const std::string& bytes) {
  j[key] = utf8_replacing_invalid(bytes);
  if (!is_utf8(bytes)) j[std::string(key) + "_hex"] = hex_of(bytes);
}

// JSON text of any strings: every non-ASCII character as \uXXXX, so that the
// output carries no raw control or bidi character (a path that is not UTF-8
// went in through put_bytes; `replace` is a backstop against type_error.316).
template <typename J>
std::string json_text(const J& j) {
  return j.dump(2, ' ', /*ensure_ascii=*/true, nlohmann::json::error_handler_t::replace) + "\n";
}

}  // namespace

std::string inspect_text(const std::string& path, const io::SafetensorsHeader& header) {
  int64_t elements = 0;
  for (const auto& e : header.entries) elements += e.nbytes() / e.element_size;
  std::string out =
      fmt::format("{}: {} tensors, {} elements; {} bytes of header, {} bytes of data\n",
                  attn::printable(path, 4096), header.entries.size(), elements, header.header_bytes,
                  header.data_bytes);
  std::vector<std::vector<std::string>> rows = {
      {"name", "dtype", "shape", "bytes", "data_offsets"}};
  for (const auto& e : header.entries) {
    rows.push_back({shown(e.name), e.dtype, shape_str(e.shape), std::to_string(e.nbytes()),
                    fmt::format("[{}, {})", e.begin, e.end)});
  }
  std::vector<size_t> width(rows[0].size(), 0);
  for (const auto& row : rows) {
    for (size_t c = 0; c < row.size(); ++c) width[c] = std::max(width[c], row[c].size());
  }
  for (const auto& row : rows) {
    std::string line;
    for (size_t c = 0; c < row.size(); ++c) {
      // Numbers right-aligned, text left-aligned; no trailing spaces.
      const bool right = c == 3;
      const std::string cell = right ? fmt::format("{:>{}}", row[c], width[c]) : row[c];
      line += (c == 0 ? "" : "  ") + cell;
      if (!right && c + 1 < row.size()) line.append(width[c] - row[c].size(), ' ');
    }
    out += line + "\n";
  }
  out += fmt::format("metadata: {}\n", header.metadata.empty()
                                           ? "(none)"
                                           : std::to_string(header.metadata.size()) + " entries");
  for (const auto& [key, value] : header.metadata)
    out += fmt::format("  {}: {}\n", shown(key), shown(value));
  return out;
}

std::string inspect_json(const std::string& path, const io::SafetensorsHeader& header) {
  nlohmann::ordered_json j;
  put_bytes(j, "file", path);
  j["header_bytes"] = header.header_bytes;
  j["data_bytes"] = header.data_bytes;
  j["tensors"] = nlohmann::ordered_json::array();
  for (const auto& e : header.entries) {
    j["tensors"].push_back({{"name", e.name},
                            {"dtype", e.dtype},
                            {"shape", e.shape},
                            {"bytes", e.nbytes()},
                            {"data_offsets", {e.begin, e.end}}});
  }
  j["metadata"] = header.metadata;
  return json_text(j);
}

namespace {

namespace fs = std::filesystem;

// 124439808 -> "124,439,808"
std::string thousands(int64_t n) {
  std::string digits = std::to_string(n), out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return out;
}

// The summary of a model directory, as ordered JSON (the text form prints it).
// "rope_type theta[, factor F]" of one RoPE entry.
nlohmann::ordered_json rope_json(const nn::RopeScaling& r) {
  nlohmann::ordered_json j;
  j["rope_type"] = nn::rope_type_name(r.type);
  j["rope_theta"] = shortest_decimal(r.theta);
  if (r.type != nn::RopeScaling::Type::kDefault) j["factor"] = shortest_decimal(r.factor);
  if (r.type == nn::RopeScaling::Type::kLlama3) {
    j["low_freq_factor"] = shortest_decimal(r.low_freq_factor);
    j["high_freq_factor"] = shortest_decimal(r.high_freq_factor);
    j["original_max_position_embeddings"] = r.original_context_length;
  }
  return j;
}

// A Llama 3 / Qwen / Gemma directory: its config as attn reads it, and the
// files' headers (no weights read).
nlohmann::ordered_json decoder_summary(const std::string& dir, nlohmann::ordered_json j) {
  const io::HfDecoderConfig hf = io::read_hf_decoder_config(dir);
  const nn::DecoderConfig& c = hf.config;
  int64_t params = 0, tensors = 0;
  bool lm_head = false;
  std::map<std::string, int64_t> dtypes;
  const std::vector<std::string> files = io::hf_decoder_weight_files(dir);
  for (const std::string& file : files) {
    for (const auto& e : io::read_safetensors_header(file).entries) {
      if (e.name.ends_with(".rotary_emb.inv_freq")) continue;
      ++tensors;
      lm_head = lm_head || e.name == "lm_head.weight";
      params += e.nbytes() / e.element_size;
      ++dtypes[e.dtype];
    }
  }
  std::string layers;  // "S" sliding, "F" full, per layer
  for (int64_t i = 0; i < c.num_layers; ++i) layers += c.layer_window(i) > 0 ? 'S' : 'F';
  j["kind"] = "huggingface-" + hf.model_type;
  nlohmann::ordered_json cfg;
  cfg["model_type"] = hf.model_type;
  cfg["num_hidden_layers"] = c.num_layers;
  cfg["hidden_size"] = c.hidden_size;
  cfg["intermediate_size"] = c.intermediate_size;
  cfg["num_attention_heads"] = c.num_heads;
  cfg["num_key_value_heads"] = c.num_kv_heads;
  cfg["head_dim"] = c.head_dim;
  cfg["vocab_size"] = c.vocab_size;
  cfg["max_position_embeddings"] = c.context_length;
  cfg["layers"] = layers;
  if (c.sliding_window > 0) cfg["sliding_window"] = c.sliding_window;
  cfg["rope"] = rope_json(c.rope);
  if (c.sliding_window > 0) cfg["rope_local"] = rope_json(c.rope_local);
  cfg["qk_norm"] = c.qk_norm;
  cfg["qkv_bias"] = c.qkv_bias;
  cfg["activation"] = c.activation == nn::GateActivation::kSiLU ? "silu" : "gelu_pytorch_tanh";
  if (c.attn_softcap > 0) cfg["attn_logit_softcapping"] = shortest_decimal(c.attn_softcap);
  if (hf.unapplied_attn_softcap > 0) {
    cfg["attn_logit_softcapping_unapplied"] = shortest_decimal(hf.unapplied_attn_softcap);
  }
  if (c.final_softcap > 0) cfg["final_logit_softcapping"] = shortest_decimal(c.final_softcap);
  cfg["tie_word_embeddings"] = c.tie_embeddings;
  cfg["config_form"] = hf.config_form;
  j["config"] = cfg;
  j["parameters"] = params;
  j["dtype"] = dtypes.size() == 1 ? dtypes.begin()->first : std::string("mixed");
  j["tied"] = c.tie_embeddings;
  j["tensors"] = tensors;
  j["files"] = files.size();
  j["eos_token_ids"] = hf.eos_token_ids;
  std::string tok = "none";
  if (fs::exists(fs::path(dir) / "tokenizer.json")) {
    try {  // what attn reads of it, or why it does not
      const text::HfTokenizer t =
          text::HfTokenizer::from_file((fs::path(dir) / "tokenizer.json").string());
      tok = fmt::format("tokenizer.json: {} ids; {}", t.vocab_size(), t.describe());
    } catch (const std::exception& e) {
      tok = fmt::format("tokenizer.json, refused: {}", e.what());
    }
  } else {
    for (const char* name : {"tokenizer.model", "original/tokenizer.model"}) {
      if (fs::exists(fs::path(dir) / name)) {
        tok = std::string(name) + " (attn reads tokenizer.json only)";
        break;
      }
    }
  }
  j["tokenizer"] = tok;
  return j;
}

nlohmann::ordered_json model_summary(const std::string& dir) {
  nlohmann::ordered_json j;
  put_bytes(j, "directory", dir);
  if (io::is_hf_decoder_dir(dir)) return decoder_summary(dir, j);
  if (io::is_hf_gpt2_dir(dir)) {
    const io::HfGpt2Config hf = io::read_hf_gpt2_config(dir);
    const nn::GPTConfig& c = hf.config;
    const std::string weights = (fs::path(dir) / "model.safetensors").string();
    if (!fs::exists(weights)) {
      throw std::invalid_argument(
          fmt::format("'{}' does not exist (a Hugging Face model directory has config.json and "
                      "model.safetensors)",
                      printable(weights)));
    }
    const io::MappedSafetensors file(weights);  // the header only is read
    int64_t params = 0, buffers = 0, tensors = 0;
    bool prefixed = false, lm_head = false;
    std::map<std::string, int64_t> dtypes;
    for (const auto& e : file.header().entries) {
      std::string key = e.name;
      if (key.starts_with("transformer.")) {
        prefixed = true;
        key = key.substr(12);
      }
      if (key.ends_with(".attn.bias") || key.ends_with(".attn.masked_bias")) {
        ++buffers;
        continue;
      }
      ++tensors;
      lm_head = lm_head || key == "lm_head.weight";
      params += e.nbytes() / e.element_size;
      ++dtypes[e.dtype];
    }
    j["kind"] = "huggingface-gpt2";
    j["config"] = {{"n_embd", c.emb_dim},
                   {"n_layer", c.n_layers},
                   {"n_head", c.n_heads},
                   {"n_positions", c.context_length},
                   {"vocab_size", c.vocab_size},
                   {"layer_norm_epsilon", shortest_decimal(c.layer_norm_eps)},
                   {"activation_function", hf.activation_function},
                   {"tie_word_embeddings", c.tie_embeddings}};
    j["parameters"] = params;
    j["dtype"] = dtypes.size() == 1 ? dtypes.begin()->first : std::string("mixed");
    j["tied"] = !lm_head;
    j["tensors"] = tensors;
    j["prefix"] = prefixed ? "transformer." : "";
    j["buffers_ignored"] = buffers;
    const bool own = fs::exists(fs::path(dir) / "vocab.json") && fs::exists(fs::path(dir) / "merges.txt");
    j["tokenizer"] = own ? "vocab.json + merges.txt" : "gpt2 (GPT-2's)";
    return j;
  }
  const std::string path = (fs::path(dir) / "checkpoint.safetensors").string();
  if (!fs::exists(path)) {
    throw std::invalid_argument(fmt::format(
        "'{}' is neither a Hugging Face model directory (config.json) nor an attn checkpoint "
        "directory (checkpoint.safetensors)",
        printable(dir)));
  }
  const io::SafetensorsHeader header = io::read_safetensors_header(path);
  int64_t params = 0;
  bool out_head = false;
  std::map<std::string, int64_t> dtypes;
  for (const auto& e : header.entries) {
    // Training state and the causal masks (buffers) are not parameters.
    if (e.name.starts_with("optim.") || e.name.ends_with(".mask")) continue;
    out_head = out_head || e.name == "out_head.weight";
    params += e.nbytes() / e.element_size;
    ++dtypes[e.dtype];
  }
  auto meta = [&](const char* key) {
    const auto it = header.metadata.find(key);
    return it == header.metadata.end() ? std::string() : it->second;
  };
  const nn::GPTConfig c = nn::config_from_json(meta("config"), path);
  j["kind"] = "attn-checkpoint";
  j["config"] = nlohmann::ordered_json::parse(nn::config_to_json(c));
  j["parameters"] = params;
  j["dtype"] = dtypes.size() == 1 ? dtypes.begin()->first : std::string("mixed");
  j["tied"] = !out_head;
  const std::string tok = meta("tokenizer").empty() ? "char" : meta("tokenizer");
  j["tokenizer"] = tok;
  if (!meta("iter").empty()) j["iter"] = meta("iter");
  return j;
}

std::string summary_text(const nlohmann::ordered_json& j) {
  const std::string kind = j["kind"].get<std::string>();
  std::string out = fmt::format(
      "{}: {}\n",
      printable(j.contains("directory_hex") ? bytes_of_hex(j["directory_hex"].get<std::string>())
                                            : j["directory"].get<std::string>()),
      kind == "huggingface-gpt2"
          ? std::string("Hugging Face GPT-2 (config.json + model.safetensors)")
      : kind.starts_with("huggingface-")
          ? fmt::format("Hugging Face {} (config.json + {} safetensors file(s))", kind.substr(12),
                        j["files"].get<int64_t>())
          : std::string("attn checkpoint (checkpoint.safetensors)"));
  std::string cfg;
  for (const auto& [k, v] : j["config"].items())
    cfg +=
        (cfg.empty() ? "" : ", ") + printable(k) + " " +
        printable(v.is_string() ? v.get<std::string>()
                                : v.dump(-1, ' ', true, nlohmann::json::error_handler_t::replace));
  out += "  config: " + cfg + "\n";
  out += fmt::format("  parameters: {} ({})\n", thousands(j["parameters"].get<int64_t>()),
                     j["tied"].get<bool>() ? "output head tied to the token embedding"
                                           : "output head stored");
  out += fmt::format("  dtype: {}\n", printable(j["dtype"].get<std::string>()));
  if (j.contains("eos_token_ids")) {
    out += fmt::format("  tensors: {}\n  eos_token_ids: {}\n", j["tensors"].get<int64_t>(),
                       j["eos_token_ids"].dump());
  } else if (j.contains("tensors")) {
    out += fmt::format("  tensors: {}, names {}; {} buffer(s) ignored\n",
                       j["tensors"].get<int64_t>(),
                       j["prefix"] == "" ? "without a prefix" : "with \"transformer.\"",
                       j["buffers_ignored"].get<int64_t>());
  }
  // The checkpoint's own metadata: escaped, as every byte from a file.
  out += fmt::format("  tokenizer: {}\n", printable(j["tokenizer"].get<std::string>(), 4096));
  if (j.contains("iter"))
    out += fmt::format("  iteration: {}\n", printable(j["iter"].get<std::string>()));
  return out;
}

}  // namespace

Command add_inspect_command(CLI::App& app) {
  struct Flags {
    std::string file;
    bool json = false;
  };
  auto flags = std::make_shared<Flags>();
  CLI::App* cmd = app.add_subcommand(
      "inspect",
      "List a safetensors file's tensors (name, dtype, shape, bytes) and metadata, after checking "
      "every offset, size, dtype and shape in its header against the file; or summarise a model "
      "directory (config, parameters, dtype, tied head, tokenizer)");
  cmd->footer(
      "Examples:\n  attn inspect model.safetensors\n  attn inspect --json model.safetensors\n"
      "  attn inspect gpt2            # a Hugging Face GPT-2 directory or an attn checkpoint "
      "directory");
  add_option(cmd, "file", flags->file, "The safetensors file, or a model directory")
      ->required()
      ->type_name("FILE|DIR");
  cmd->add_flag("--json", flags->json, "Print one JSON object instead of the table");
  auto run = [flags]() -> int {
    if (fs::is_directory(flags->file)) {
      const nlohmann::ordered_json j = model_summary(flags->file);
      std::cout << (flags->json ? json_text(j) : summary_text(j));
      std::cout.flush();
      return std::cout ? 0 : 1;
    }
    const io::SafetensorsHeader header = io::read_safetensors_header(flags->file);
    std::cout << (flags->json ? inspect_json(flags->file, header)
                              : inspect_text(flags->file, header));
    std::cout.flush();
    return std::cout ? 0 : 1;
  };
  return Command{cmd, run};
}

}  // namespace attn::cli
