// Reading a GPT checkpoint directory (attn/checkpoint.h): the metadata, the
// config (attn/model_config.h), the vocabulary, and the weights into a new model.
#include "attn/checkpoint.h"

#include <fmt/format.h>

#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "attn/model_config.h"
#include "attn/random.h"
#include "attn/safetensors.h"
#include "attn/state_dict.h"
#include "attn/utf8.h"

namespace attn::nn {
namespace {

// A model of `config` and `options` with the file's weights; optim.* tensors ignored.
void load_weights(const std::string& path, const io::SafetensorsFile& file, const GPTConfig& config,
                  const GPTOptions& options, std::unique_ptr<GPTModel>& model) {
  try {
    // Every weight is replaced by the file's: draw the initial ones from a
    // generator of their own, leaving the default generator as it was.
    Generator scratch;
    model = std::make_unique<GPTModel>(config, options, scratch);
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument(
        fmt::format("'{}': bad config: {}", printable(path), printable(e.what())));
  }
  const io::LoadResult r = io::load_state_dict(*model, file, /*strict=*/false);
  std::vector<std::string> unexpected;
  for (const auto& name : r.unexpected) {
    if (name.rfind("optim.", 0) != 0) unexpected.push_back(name);
  }
  if (!r.missing.empty()) {
    throw std::invalid_argument(fmt::format("'{}': {} of the model's tensors missing, first '{}'",
                                            printable(path), r.missing.size(),
                                            printable(r.missing.front())));
  }
  if (!unexpected.empty()) {
    throw std::invalid_argument(
        fmt::format("'{}': {} tensor(s) the model does not have, first '{}'", printable(path),
                    unexpected.size(), printable(unexpected.front())));
  }
  model->eval();
}

}  // namespace

Checkpoint load_checkpoint(const std::string& dir, std::unique_ptr<GPTModel>& model,
                           const GPTOptions& options) {
  namespace fs = std::filesystem;
  if (!fs::is_directory(dir)) {
    throw std::invalid_argument(
        fmt::format("checkpoint directory '{}' does not exist", printable(dir)));
  }
  const std::string path = (fs::path(dir) / "checkpoint.safetensors").string();
  if (!fs::exists(path)) {
    throw std::invalid_argument(
        fmt::format("'{}' does not exist (a checkpoint directory holds "
                    "checkpoint.safetensors)",
                    printable(path)));
  }
  const io::SafetensorsFile file = io::read_safetensors(path);
  Checkpoint ck;
  ck.metadata = file.metadata;
  auto meta = [&](const char* key) -> const std::string& {
    const auto it = file.metadata.find(key);
    if (it == file.metadata.end()) {
      throw std::invalid_argument(
          fmt::format("'{}': metadata has no \"{}\"", printable(path), printable(key)));
    }
    return it->second;
  };
  if (meta("format") != kCheckpointFormat) {
    throw std::invalid_argument(fmt::format("'{}': metadata \"format\" is \"{}\", expected \"{}\"",
                                            printable(path), meta("format"), kCheckpointFormat));
  }
  ck.config = config_from_json(meta("config"), path);
  if (const auto it = file.metadata.find("tokenizer"); it != file.metadata.end()) {
    if (it->second != "char" && it->second != "gpt2") {
      throw std::invalid_argument(
          fmt::format("'{}': metadata \"tokenizer\" is \"{}\", expected \"char\" or \"gpt2\"",
                      printable(path), printable(it->second)));
    }
    ck.tokenizer = it->second;
  }
  if (ck.tokenizer == "gpt2") {
    load_weights(path, file, ck.config, options, model);
    return ck;
  }

  nlohmann::json vocab;
  try {
    vocab = nlohmann::json::parse(meta("vocab"));
  } catch (const nlohmann::json::parse_error& e) {
    throw std::invalid_argument(fmt::format("'{}': metadata \"vocab\" is not valid JSON: {}",
                                            printable(path), printable(e.what())));
  }
  if (!vocab.is_array()) {
    throw std::invalid_argument(
        fmt::format("'{}': metadata \"vocab\" is not a JSON array", printable(path)));
  }
  std::map<std::string, size_t> first;  // character -> its id: each one once
  for (const auto& tok : vocab) {
    if (!tok.is_string() || utf8_characters(tok.get<std::string>()).size() != 1) {
      throw std::invalid_argument(fmt::format("'{}': vocab entry {} is not a one-character string",
                                              printable(path), printable(tok.dump())));
    }
    const auto [at, fresh] = first.emplace(tok.get<std::string>(), ck.vocab.size());
    if (!fresh) {
      throw std::invalid_argument(fmt::format(
          "'{}': vocab entry {} ({}) repeats entry {}: a character vocabulary holds each once",
          printable(path), ck.vocab.size(), printable(tok.dump()), at->second));
    }
    ck.vocab.push_back(tok.get<std::string>());
  }
  if (static_cast<int64_t>(ck.vocab.size()) != ck.config.vocab_size) {
    throw std::invalid_argument(fmt::format("'{}': vocab has {} tokens but config vocab_size is {}",
                                            printable(path), ck.vocab.size(),
                                            ck.config.vocab_size));
  }
  load_weights(path, file, ck.config, options, model);
  return ck;
}

}  // namespace attn::nn
