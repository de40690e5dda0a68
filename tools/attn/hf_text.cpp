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
