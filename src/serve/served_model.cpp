// served_model.cpp - ServedModel (served_model.h): GPT-2 and the decoder families.
#include "served_model.h"

#include <fmt/format.h>

#include <filesystem>
#include <stdexcept>

#include "attn/decoder.h"
#include "attn/generate.h"
#include "attn/gpt.h"
#include "attn/hf_decoder.h"
#include "attn/hf_gpt2.h"
#include "attn/hf_tokenizer.h"
#include "attn/tokenizer.h"
#include "attn/utf8.h"

namespace attn::serve {
namespace {

namespace fs = std::filesystem;

std::string default_name(const std::string& dir) {
  fs::path p = fs::path(dir).lexically_normal();
  if (p.filename().empty()) p = p.parent_path();
  return p.filename().string();
}

void check_ids(const std::vector<int64_t>& ids, int64_t vocab) {
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || ids[i] >= vocab) {
      throw std::invalid_argument(
          fmt::format("token {} of the text has id {}, outside the model's vocabulary of {} tokens",
                      i, ids[i], vocab));
    }
  }
}

// The ids in [0, n), in order.
std::vector<int64_t> known_ids(std::span<const int64_t> ids, int64_t n) {
  std::vector<int64_t> kept;
  kept.reserve(ids.size());
  for (const int64_t id : ids) {
    if (id >= 0 && id < n) kept.push_back(id);
  }
  return kept;
}

// A Llama 3 / Qwen / Gemma directory and its tokenizer.json.
class DecoderModel final : public ServedModel {
 public:
  DecoderModel(const ServedModelOptions& o) {
    const io::HfDecoderInfo info = io::load_hf_decoder(o.dir, model_, o.dtype);
    const fs::path tj = fs::path(o.dir) / "tokenizer.json";
    if (!fs::is_regular_file(tj)) {
      throw std::invalid_argument(
          fmt::format("'{}' has no tokenizer.json (attn serve reads Hugging Face's tokenizer.json)",
                      printable(o.dir)));
    }
    tok_ = std::make_unique<text::HfTokenizer>(text::HfTokenizer::from_file(tj.string()));
    family_ = info.hf.model_type;
    vocab_size_ = model_->config().vocab_size;
    context_length_ = model_->config().context_length;
    eos_ids_ = info.hf.eos_token_ids;
  }
  std::vector<int64_t> encode(const std::string& text, bool add_special_tokens) const override {
    std::vector<int64_t> ids = tok_->encode(text, add_special_tokens);
    check_ids(ids, vocab_size_);
    return ids;
  }
  // Ids the model has and the tokenizer lacks (a vocabulary padded past the
  // tokenizer's, as Qwen's 151,936 rows over 151,669 tokens) have no text.
  std::string decode(std::span<const int64_t> ids) const override {
    return tok_->decode(known_ids(ids, tok_->vocab_size()));
  }
  nn::PagedKVCache make_cache(int64_t block_size, int64_t num_blocks) override {
    return nn::make_paged_kv_cache(*model_, block_size, num_blocks, kv_dtype_);
  }
  Tensor step(std::span<const int64_t> ids, std::span<const nn::PagedSequence> seqs,
              nn::PagedKVCache& cache) override {
    return nn::forward_paged(*model_, ids, seqs, cache);
  }
  int64_t kv_bytes_per_token() const override {
    const nn::DecoderConfig& c = model_->config();
    return 2 * element_size(kv_dtype_) * c.num_layers * c.num_kv_heads * c.head_dim;
  }

 private:
  std::unique_ptr<nn::DecoderLM> model_;
  std::unique_ptr<text::HfTokenizer> tok_;
};

// A GPT-2 directory (or an attn checkpoint): GPT-2's byte-level BPE, or a
// checkpoint's character vocabulary.
class GptModel final : public ServedModel {
 public:
  GptModel(const ServedModelOptions& o) {
    if (o.dtype != DType::kFloat32) {
      throw std::invalid_argument(
          "--dtype bfloat16 serves Llama / Qwen / Gemma directories; a GPT-2 model is served in "
          "float32");
    }
    md_ = io::load_model_dir(o.dir, model_);
    model_->eval();
    vocab_size_ = model_->config().vocab_size;
    context_length_ = model_->config().context_length;
    family_ = md_.tokenizer == "gpt2" ? "gpt2" : "gpt-char";
    if (md_.tokenizer == "gpt2") {
      tok_ = std::make_unique<text::Tokenizer>(text::Tokenizer::from_directory(o.dir));
      const int64_t eot = tok_->eot_token();
      if (eot >= 0 && eot < vocab_size_) eos_ids_.push_back(eot);
    }
    nn::make_paged_kv_cache(*model_, 1, 1);  // refuses a model the paged path does not run
  }
  std::vector<int64_t> encode(const std::string& text, bool) const override {
    std::vector<int64_t> ids = tok_ ? tok_->encode(text, true) : nn::encode_text(md_.vocab, text);
    check_ids(ids, vocab_size_);
    return ids;
  }
  std::string decode(std::span<const int64_t> ids) const override {
    if (tok_) return tok_->decode(known_ids(ids, tok_->vocab_size()));
    return nn::decode_ids(md_.vocab, known_ids(ids, static_cast<int64_t>(md_.vocab.size())));
  }
  nn::PagedKVCache make_cache(int64_t block_size, int64_t num_blocks) override {
    return nn::make_paged_kv_cache(*model_, block_size, num_blocks, kv_dtype_);
  }
  Tensor step(std::span<const int64_t> ids, std::span<const nn::PagedSequence> seqs,
              nn::PagedKVCache& cache) override {
    return nn::forward_paged(*model_, ids, seqs, cache);
  }
  int64_t kv_bytes_per_token() const override {
    return 2 * element_size(kv_dtype_) * model_->config().n_layers * model_->config().emb_dim;
  }

 private:
  std::unique_ptr<nn::GPTModel> model_;
  io::ModelDir md_;
  std::unique_ptr<text::Tokenizer> tok_;
};

}  // namespace

std::unique_ptr<ServedModel> ServedModel::load(const ServedModelOptions& options) {
  if (!fs::is_directory(options.dir)) {
    throw std::invalid_argument(
        fmt::format("--model '{}' is not a directory", printable(options.dir)));
  }
  std::unique_ptr<ServedModel> m;
  if (io::is_hf_decoder_dir(options.dir)) {
    m = std::make_unique<DecoderModel>(options);
  } else {
    m = std::make_unique<GptModel>(options);
  }
  if (options.kv_dtype != DType::kFloat32 && options.kv_dtype != DType::kBFloat16) {
    throw std::invalid_argument(fmt::format("the KV cache holds float32 or bfloat16, got {}",
                                            dtype_name(options.kv_dtype)));
  }
  m->kv_dtype_ = options.kv_dtype;
  m->dir_ = options.dir;
  m->name_ = options.name.empty() ? default_name(options.dir) : options.name;
  return m;
}

}  // namespace attn::serve
