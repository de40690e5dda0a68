// attn/chat_template.h - chat templates: a conversation wrapped in the
// tokens a chat model was trained on, exactly as transformers'
// tokenizer.apply_chat_template(messages, tokenize=False,
// add_generation_prompt=..., **kwargs) renders it, from the Jinja template the
// model directory carries (Qwen3 with and without thinking, Llama 3.x,
// Gemma 2/3, Qwen2.5, and others written in the same subset of Jinja).
//
//   auto chat = attn::text::ChatTemplate::from_model_dir("Qwen3-0.6B");
//   std::string prompt = chat->apply({{"system", "Be brief."}, {"user", "Hi"}},
//                                    {.kwargs_json = R"({"enable_thinking": false})"});
//   // "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n
//   //  <|im_start|>assistant\n<think>\n\n</think>\n\n"
//
// The template sees what transformers passes it: `messages` (each message's
// keys whose value is not null; `reasoning_content` also given as `thinking`
// when a message carries one under either name), `tools` and `documents`
// (none unless given), `add_generation_prompt`, the tokenizer's named special
// tokens (bos_token, eos_token, unk_token, sep_token, pad_token, cls_token,
// mask_token, from tokenizer_config.json) and the caller's extra variables,
// which override the special tokens. The template runs in attn's Jinja2
// interpreter (src/text/jinja.h: the language subset, what it refuses), in the
// environment transformers sets up: trim_blocks, lstrip_blocks, loop
// controls, raise_exception, strftime_now (local time), tojson as json.dumps.
//
// Rendered text is tokenized without the tokenizer's post-processor
// (HfTokenizer::encode(text, false)): the template writes the BOS itself.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace attn::text {

// One message: a role ("system", "user", "assistant", "tool") and its text.
struct ChatMessage {
  std::string role;
  std::string content;
};

struct ChatOptions {
  // Append the header that starts the assistant's reply (transformers' default
  // is false; generating from a chat needs true).
  bool add_generation_prompt = true;
  // Further template variables as a JSON object, e.g. {"enable_thinking":
  // false} (Qwen3), {"date_string": "26 Jul 2024"} (Llama 3.2), {"tools":
  // [...]} (a JSON schema per tool). "" for none. `messages` and
  // `add_generation_prompt` cannot be given here.
  std::string kwargs_json = {};
  // transformers' continue_final_message: "" (off), "content" (its True) or
  // another field of the last message ("reasoning_content", "thinking",
  // "reasoning"): the text ends inside that field, with no end-of-turn after
  // it, so the model continues the reply (a prefilled answer). As transformers
  // does it: the field gets a tag, the conversation is rendered, and the text
  // is cut where the tag is (trailing whitespace the template trimmed stays
  // trimmed). Needs add_generation_prompt false; throws std::invalid_argument
  // when the last message has no such field, the template never reads it, or
  // the rendered text does not hold it.
  std::string continue_final_message = {};
};

class ChatTemplate {
 public:
  // The template source and the tokenizer's named special tokens ("bos_token"
  // -> "<|begin_of_text|>", ...). `name` stands for the template in messages.
  // Throws std::invalid_argument("NAME line N: ...") when the source does not
  // parse or uses Jinja outside attn's subset.
  explicit ChatTemplate(std::string_view source,
                        std::map<std::string, std::string> special_tokens = {},
                        std::string name = "chat template");

  // The template of a model directory, where transformers looks for it:
  // DIR/chat_template.jinja, else tokenizer_config.json's "chat_template" (a
  // string, or a list of {"name", "template"} of which "default" is used and
  // "tool_use" when tools are given), else DIR/chat_template.json's
  // "chat_template"; the special tokens from tokenizer_config.json. nullopt
  // when the directory has none of these; throws std::invalid_argument naming
  // the file when one is malformed or its template does not parse.
  static std::optional<ChatTemplate> from_model_dir(const std::string& dir);

  // The template of a file (a .json file's "chat_template", as
  // chat_template.json or tokenizer_config.json hold it; any other file's text
  // as Jinja) with the special tokens of model_dir's tokenizer_config.json
  // (none when model_dir is ""). Throws std::invalid_argument naming the file.
  static ChatTemplate from_file(const std::string& path, const std::string& model_dir = "");

  // The conversation rendered as text. Throws std::invalid_argument for an
  // empty conversation, text that is not UTF-8 or kwargs_json that is not a
  // JSON object, and std::runtime_error("NAME line N: ...") for an error the
  // template raises (raise_exception: "the template raised an exception:
  // Conversation roles must alternate ...") or meets while rendering.
  std::string apply(const std::vector<ChatMessage>& messages,
                    const ChatOptions& options = {}) const;

  // The same from messages as a JSON array of objects (an OpenAI-style request's
  // "messages": content may be a list of parts, tool_calls, reasoning_content ...).
  // apply and apply_json keep no state between calls: threads may call them at
  // once on one ChatTemplate (a server's requests).
  std::string apply_json(std::string_view messages_json, const ChatOptions& options = {}) const;

  // A named special token ("eos_token"), if tokenizer_config.json gave it.
  std::optional<std::string> special_token(const std::string& name) const;
  const std::map<std::string, std::string>& special_tokens() const;
  // The default template's source.
  const std::string& source() const;

  struct Impl;

 private:
  explicit ChatTemplate(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<const Impl> impl_;
};

}  // namespace attn::text
