// A checkpoint's metadata (attn/checkpoint.h): the format, the config
// (attn/model_config.h), the tokenizer and the character vocabulary, checked
// before any weight is read. Apart from the weights (checkpoint.cpp) so that
// the libFuzzer target fuzz_checkpoint_metadata (tests/fuzz) compiles it
// without the model.
#include <fmt/format.h>

#include <map>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "attn/checkpoint.h"
#include "attn/model_config.h"
#include "attn/utf8.h"

namespace attn::nn {

Checkpoint read_checkpoint_metadata(const std::map<std::string, std::string>& metadata,
                                    const std::string& path) {
  Checkpoint ck;
  ck.metadata = metadata;
  auto meta = [&](const char* key) -> const std::string& {
    const auto it = metadata.find(key);
    if (it == metadata.end()) {
      throw std::invalid_argument(
          fmt::format("'{}': metadata has no \"{}\"", printable(path), printable(key)));
    }
    return it->second;
  };
  if (meta("format") != kCheckpointFormat) {
    throw std::invalid_argument(fmt::format("'{}': metadata \"format\" is \"{}\", expected \"{}\"",
                                            printable(path), printable(meta("format"), 200),
                                            kCheckpointFormat));
  }
  ck.config = config_from_json(meta("config"), path);
  if (const auto it = metadata.find("tokenizer"); it != metadata.end()) {
    if (it->second != "char" && it->second != "gpt2") {
      throw std::invalid_argument(
          fmt::format("'{}': metadata \"tokenizer\" is \"{}\", expected \"char\" or \"gpt2\"",
                      printable(path), printable(it->second)));
    }
    ck.tokenizer = it->second;
  }
  if (ck.tokenizer == "gpt2") return ck;

  nlohmann::json vocab;
  try {
    vocab = nlohmann::json::parse(meta("vocab"));
  } catch (const nlohmann::json::exception& e) {  // parse_error, or out_of_range for 1e400
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
  return ck;
}

}  // namespace attn::nn
