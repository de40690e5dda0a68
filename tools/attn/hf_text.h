// hf_text.h - the text side of a Llama 3 / Qwen / Gemma directory for
// `attn generate`, `attn eval` and `attn tokenize`: DIR/tokenizer.json
// (attn/hf_tokenizer.h), its chat template (attn/chat_template.h) for --chat,
// and decoding generated ids as they come.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "attn/chat_template.h"
#include "attn/hf_tokenizer.h"

namespace attn::cli {

// The tokenizer.json of a model directory, or a tokenizer.json file itself.
// Throws std::invalid_argument naming the path when there is none.
text::HfTokenizer load_hf_tokenizer(const std::string& dir_or_file);

// --chat's prompt: --prompt as the user's message (after --system's, when
// given) through the directory's chat template, or the one in `template_file`
// (--chat-template) with the directory's special tokens, with the template
// variables of `kwargs_json` (--chat-template-kwargs) and the header of the
// assistant's reply. `command` names the command in messages. Throws
// std::invalid_argument with one line when the directory has no template.
struct ChatPrompt {
  std::string text;                // the rendered conversation
  std::optional<std::string> eos;  // the template's eos_token, a stop token of the reply
};
ChatPrompt render_chat_prompt(const std::string& command, const std::string& dir,
                              const std::string& template_file,
                              const std::optional<std::string>& system, const std::string& prompt,
                              const std::string& kwargs_json);

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
