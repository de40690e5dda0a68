// hf_text.h - the text side of a Llama 3 / Qwen / Gemma directory for
// `attn generate`, `attn eval` and `attn tokenize`: DIR/tokenizer.json
// (attn/hf_tokenizer.h), and decoding generated ids as they come.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "attn/hf_tokenizer.h"

namespace attn::cli {

// The tokenizer.json of a model directory, or a tokenizer.json file itself.
// Throws std::invalid_argument naming the path when there is none.
text::HfTokenizer load_hf_tokenizer(const std::string& dir_or_file);

// Streaming decode as transformers' TextStreamer does it: the generated ids
// decoded whole after each one, and only the new end printed, held back while
// it ends in U+FFFD (a character split across tokens).
class HfStreamText {
 public:
  explicit HfStreamText(const text::HfTokenizer& tok) : tok_(tok) {}
  std::string push(int64_t id);
  std::string flush();

 private:
  const text::HfTokenizer& tok_;
  std::vector<int64_t> ids_;
  size_t printed_ = 0;  // bytes of decode(ids_) already given out
};

}  // namespace attn::cli
