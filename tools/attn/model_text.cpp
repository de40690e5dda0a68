// model_text.cpp - ModelText (model_text.h).
#include "model_text.h"

#include <fmt/format.h>

#include <filesystem>
#include <stdexcept>

#include "attn/generate.h"
#include "attn/tokenizer.h"
#include "attn/utf8.h"
#include "special_tokens.h"

namespace attn::cli {

namespace fs = std::filesystem;

struct ModelText::Impl {
  std::string kind;                // "char" or "gpt2"
  std::vector<std::string> vocab;  // char: id -> character
  int64_t vocab_size = 0;          // the model's
  bool own_files = false;          // gpt2: DIR's vocab.json + merges.txt
  std::optional<text::Tokenizer> tokenizer;  // gpt2
  std::optional<text::StreamDecoder> stream;  // gpt2: reads *tokenizer
};

ModelText::ModelText(const io::ModelDir& model) : impl_(std::make_unique<Impl>()) {
  impl_->kind = model.tokenizer;
  impl_->vocab = model.vocab;
  impl_->vocab_size = model.config.vocab_size;
  if (impl_->kind == "gpt2") {
    impl_->own_files = fs::is_regular_file(fs::path(model.dir) / "vocab.json") &&
                       fs::is_regular_file(fs::path(model.dir) / "merges.txt");
    impl_->tokenizer.emplace(text::Tokenizer::from_directory(model.dir));
    impl_->stream.emplace(*impl_->tokenizer);
  }
}

ModelText::~ModelText() = default;

std::vector<int64_t> ModelText::encode(const std::string& text, const std::string& what,
                                       bool allow_special) const {
  if (impl_->kind != "gpt2") return nn::encode_text(impl_->vocab, text);
  refuse_special_tokens(text, what, allow_special);
  std::vector<int64_t> ids = impl_->tokenizer->encode(text, allow_special);
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] >= impl_->vocab_size) {
      throw std::invalid_argument(fmt::format(
          "token {} of the text, id {} ('{}'), is outside the model's vocabulary of {} tokens",
          i, ids[i], printable(impl_->tokenizer->token_bytes(ids[i])), impl_->vocab_size));
    }
  }
  return ids;
}

std::string ModelText::push(int64_t id) {
  if (impl_->kind != "gpt2") return nn::decode_ids(impl_->vocab, {id});
  return impl_->stream->push(id);
}

std::string ModelText::flush() { return impl_->kind == "gpt2" ? impl_->stream->flush() : ""; }

std::optional<int64_t> ModelText::end_of_text() const {
  if (impl_->kind != "gpt2") return std::nullopt;
  const int64_t eot = impl_->tokenizer->eot_token();
  if (eot < 0 || eot >= impl_->vocab_size) return std::nullopt;
  return eot;
}

std::string ModelText::describe() const {
  if (impl_->kind != "gpt2") return fmt::format("char ({} characters)", impl_->vocab.size());
  return impl_->own_files ? "gpt2 BPE (the directory's vocab.json + merges.txt)"
                          : "gpt2 BPE (GPT-2's vocabulary)";
}

}  // namespace attn::cli
