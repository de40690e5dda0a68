// model_text.cpp - ModelText (model_text.h).
#include "model_text.h"

#include <fmt/format.h>

#include <stdexcept>

#include "attn/generate.h"
#include "attn/utf8.h"

namespace attn::cli {

struct ModelText::Impl {
  std::string kind;                // "char" or "gpt2"
  std::vector<std::string> vocab;  // char: id -> character
  int64_t vocab_size = 0;
};

ModelText::ModelText(const io::ModelDir& model) : impl_(std::make_unique<Impl>()) {
  impl_->kind = model.tokenizer;
  impl_->vocab = model.vocab;
  impl_->vocab_size = model.config.vocab_size;
  if (impl_->kind == "gpt2") {
    throw std::invalid_argument(fmt::format(
        "{} needs GPT-2's tokenizer for text, which this build of attn does not have yet; give "
        "token ids with --prompt-ids (and --print-ids) instead",
        printable(model.dir)));
  }
}

ModelText::~ModelText() = default;

std::vector<int64_t> ModelText::encode(const std::string& text) const {
  return nn::encode_text(impl_->vocab, text);
}

std::string ModelText::push(int64_t id) { return nn::decode_ids(impl_->vocab, {id}); }

std::string ModelText::flush() { return ""; }

std::optional<int64_t> ModelText::end_of_text() const { return std::nullopt; }

std::string ModelText::describe() const {
  return fmt::format("char ({} characters)", impl_->vocab.size());
}

}  // namespace attn::cli
