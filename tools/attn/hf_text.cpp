// hf_text.h: tokenizer.json beside a model, and streaming its decode.
#include "hf_text.h"

#include <fmt/format.h>

#include <filesystem>
#include <stdexcept>

#include "attn/utf8.h"

namespace attn::cli {

text::HfTokenizer load_hf_tokenizer(const std::string& dir_or_file) {
  namespace fs = std::filesystem;
  const fs::path p(dir_or_file);
  const fs::path file = fs::is_directory(p) ? p / "tokenizer.json" : p;
  if (!fs::is_regular_file(file)) {
    throw std::invalid_argument(fmt::format(
        "'{}' has no tokenizer.json (attn reads Hugging Face's tokenizer.json; give --prompt-ids "
        "otherwise)",
        printable(dir_or_file)));
  }
  return text::HfTokenizer::from_file(file.string());
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
