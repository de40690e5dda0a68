// attn/char_tokenizer.h - the character-level tokenizer of nanoGPT's
// Shakespeare runs and of `attn train --tokenizer char`: the distinct code
// points of a text, sorted, are the vocabulary, and every character is one
// token.
//
//   text::CharTokenizer tok = text::CharTokenizer::from_text("hello");  // vocab e h l o
//   std::vector<int64_t> ids = tok.encode("hole");                       // {1, 3, 2, 0}
//   tok.decode(ids) == "hole"
//
// Its vocabulary as a JSON array of one-character strings in id order is a
// checkpoint's metadata "vocab" (attn/checkpoint.h). Errors name the byte
// offset or the id at fault.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace attn::text {

class CharTokenizer {
 public:
  // The distinct code points of text, sorted; throws std::invalid_argument
  // for invalid UTF-8 (naming the byte offset) or an empty text.
  static CharTokenizer from_text(std::string_view text);
  // A vocabulary in id order, each entry one character as UTF-8 (a
  // checkpoint's "vocab"); throws std::invalid_argument for an entry that is
  // not exactly one character, or a repeated one.
  explicit CharTokenizer(std::vector<std::string> vocab);

  // Token ids of text; throws std::invalid_argument naming the byte offset of
  // invalid UTF-8 or of a character outside the vocabulary.
  std::vector<int64_t> encode(std::string_view text) const;
  // Text of token ids; throws std::out_of_range naming an id outside [0, size()).
  std::string decode(const std::vector<int64_t>& ids) const;
  int64_t size() const { return static_cast<int64_t>(vocab_.size()); }
  const std::vector<std::string>& vocab() const { return vocab_; }
  // The vocabulary as a JSON array string, and back.
  std::string to_json() const;
  static CharTokenizer from_json(const std::string& json);

 private:
  std::vector<std::string> vocab_;   // id -> character (UTF-8)
  std::map<char32_t, int64_t> ids_;  // code point -> id
};

}  // namespace attn::text
