// model_text.h - the text side of a model directory for `attn generate` and
// `attn eval`: its tokenizer (a character-level checkpoint's vocabulary, or
// GPT-2's byte-level BPE), encoding a prompt and decoding generated ids as
// they come.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "attn/hf_gpt2.h"

namespace attn::cli {

class ModelText {
 public:
  // The tokenizer of a loaded model directory. "gpt2": DIR's own vocab.json +
  // merges.txt when present, else GPT-2's.
  explicit ModelText(const io::ModelDir& model);
  ~ModelText();
  ModelText(const ModelText&) = delete;
  ModelText& operator=(const ModelText&) = delete;

  // The ids of UTF-8 text; throws std::invalid_argument naming what cannot be
  // encoded. GPT-2's "<|endoftext|>" by tiktoken's rule (special_tokens.h):
  // refused, naming `what` ("the prompt", "--file 'x'"), unless allow_special.
  std::vector<int64_t> encode(const std::string& text, const std::string& what,
                              bool allow_special) const;
  // Streaming decode: the text that one more id completes (possibly "" while a
  // UTF-8 character is split across tokens), and what is left at the end.
  std::string push(int64_t id);
  std::string flush();
  // <|endoftext|>, where the tokenizer has it and the model's vocabulary reaches it.
  std::optional<int64_t> end_of_text() const;
  // "char (65 characters)", "gpt2 (GPT-2's vocab.json + merges.txt)", ...
  std::string describe() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace attn::cli
