// The character-level tokenizer (attn/char_tokenizer.h).
#include "attn/char_tokenizer.h"

#include <fmt/format.h>

#include <nlohmann/json.hpp>
#include <set>
#include <stdexcept>
#include <utility>

#include "attn/utf8.h"

namespace attn::text {

using nlohmann::json;

CharTokenizer CharTokenizer::from_text(std::string_view text) {
  if (text.empty()) throw std::invalid_argument("the text is empty");
  const std::vector<char32_t> cps = decode_utf8(text);
  const std::set<char32_t> distinct(cps.begin(), cps.end());
  std::vector<std::string> vocab;
  for (char32_t cp : distinct) vocab.push_back(encode_utf8(cp));
  return CharTokenizer(std::move(vocab));
}

CharTokenizer::CharTokenizer(std::vector<std::string> vocab) : vocab_(std::move(vocab)) {
  if (vocab_.empty()) throw std::invalid_argument("CharTokenizer: the vocabulary is empty");
  for (size_t id = 0; id < vocab_.size(); ++id) {
    std::vector<char32_t> cps;
    try {
      cps = decode_utf8(vocab_[id]);
    } catch (const std::invalid_argument& e) {
      throw std::invalid_argument(
          fmt::format("CharTokenizer: vocabulary entry {}: {}", id, e.what()));
    }
    if (cps.size() != 1)
      throw std::invalid_argument(fmt::format(
          "CharTokenizer: vocabulary entry {} ({}) is {} characters, expected exactly 1", id,
          json(vocab_[id]).dump(), cps.size()));
    if (!ids_.emplace(cps[0], static_cast<int64_t>(id)).second)
      throw std::invalid_argument(
          fmt::format("CharTokenizer: vocabulary entry {} ({}) repeats entry {}", id,
                      json(vocab_[id]).dump(), ids_.at(cps[0])));
  }
}

std::vector<int64_t> CharTokenizer::encode(std::string_view text) const {
  const std::vector<char32_t> cps = decode_utf8(text);
  std::vector<int64_t> ids;
  ids.reserve(cps.size());
  size_t offset = 0;
  for (char32_t cp : cps) {
    const auto it = ids_.find(cp);
    if (it == ids_.end())
      throw std::invalid_argument(
          fmt::format("character U+{:04X} at byte offset {} is not in the vocabulary",
                      static_cast<uint32_t>(cp), offset));
    ids.push_back(it->second);
    offset += encode_utf8(cp).size();
  }
  return ids;
}

std::string CharTokenizer::decode(const std::vector<int64_t>& ids) const {
  std::string out;
  for (int64_t id : ids) {
    if (id < 0 || id >= size())
      throw std::out_of_range(
          fmt::format("token id {} is outside the vocabulary [0, {})", id, size()));
    out += vocab_[static_cast<size_t>(id)];
  }
  return out;
}

std::string CharTokenizer::to_json() const { return json(vocab_).dump(); }

CharTokenizer CharTokenizer::from_json(const std::string& text) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    throw std::invalid_argument(fmt::format("vocabulary: not JSON: {}", e.what()));
  }
  if (!j.is_array()) throw std::invalid_argument("vocabulary: expected a JSON array of strings");
  std::vector<std::string> vocab;
  for (const auto& e : j) {
    if (!e.is_string()) throw std::invalid_argument("vocabulary: expected a JSON array of strings");
    vocab.push_back(e.get<std::string>());
  }
  return CharTokenizer(std::move(vocab));
}

}  // namespace attn::text
