// hf_text.h: the tokenizer beside a model (tokenizer.json or tokenizer.model), and streaming
// its decode.
#include "hf_text.h"

#include <fmt/format.h>

#include <filesystem>
#include <stdexcept>

#include "attn/utf8.h"

namespace attn::cli {

text::HfTokenizer load_hf_tokenizer(const std::string& dir_or_file) {
  namespace fs = std::filesystem;
  const fs::path p(dir_or_file);
  if (fs::is_directory(p)) return text::HfTokenizer::from_directory(p.string());
  if (!fs::is_regular_file(p))
    throw std::invalid_argument(
        fmt::format("'{}' is not a tokenizer file or a directory", printable(dir_or_file)));
  return text::HfTokenizer::from_file(p.string());
}

ChatPrompt render_chat_prompt(const std::string& command, const std::string& dir,
                              const std::string& template_file,
                              const std::optional<std::string>& system, const std::string& prompt,
                              const std::string& kwargs_json) {
  std::optional<text::ChatTemplate> chat;
  if (!template_file.empty()) {
    chat = text::ChatTemplate::from_file(template_file, dir);
  } else {
    chat = text::ChatTemplate::from_model_dir(dir);
    if (!chat) {
      throw std::invalid_argument(fmt::format(
          "{}: --chat: '{}' has no chat template (tokenizer_config.json's chat_template, "
          "chat_template.jinja or chat_template.json); give one with --chat-template FILE",
          command, printable(dir)));
    }
  }
  std::vector<text::ChatMessage> messages;
  if (system) messages.push_back({"system", *system});
  messages.push_back({"user", prompt});
  return {chat->apply(messages, {.add_generation_prompt = true, .kwargs_json = kwargs_json}),
          chat->special_token("eos_token")};
}

std::string HfStreamText::push(int64_t id) {
  ids_.push_back(id);
  const std::string all = tok_.decode(ids_);
  // Hold back an incomplete character, and anything a later token may still rewrite.
  if (all.size() < printed_ || all.ends_with("\uFFFD")) return "";
  std::string out = all.substr(printed_);
  printed_ = all.size();
  return out;
}

std::string HfStreamText::flush() {
  const std::string all = tok_.decode(ids_);
  std::string out = all.size() > printed_ ? all.substr(printed_) : "";
  printed_ = all.size();
  return out;
}

}  // namespace attn::cli
