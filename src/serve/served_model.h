// served_model.h - the model `attn serve` serves: a GPT-2 directory (or an
// attn checkpoint) or a Llama 3 / Qwen / Gemma directory, with its tokenizer,
// its end-of-text ids and one batched step over a paged cache, behind one
// interface the engine and the HTTP layer use.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "attn/paged_kv_cache.h"
#include "attn/tensor.h"

namespace attn::serve {

struct ServedModelOptions {
  std::string dir;                // the model directory
  std::string name;               // the id clients send as "model"; "" -> the directory's name
  DType dtype = DType::kFloat32;  // Llama / Qwen / Gemma: kBFloat16 reads bf16 weights
  DType kv_dtype = DType::kFloat32;  // the paged pool's keys and values: float32 or bfloat16
};

class ServedModel {
 public:
  // Loads DIR as `attn generate --model DIR` does. Throws std::invalid_argument
  // naming the directory and what is wrong.
  static std::unique_ptr<ServedModel> load(const ServedModelOptions& options);
  virtual ~ServedModel() = default;

  const std::string& name() const { return name_; }
  const std::string& dir() const { return dir_; }
  const std::string& family() const { return family_; }  // "gpt2", "qwen3", ...
  int64_t vocab_size() const { return vocab_size_; }
  int64_t context_length() const { return context_length_; }
  // Ids that end a completion (not part of its text).
  const std::vector<int64_t>& eos_ids() const { return eos_ids_; }

  // UTF-8 text -> ids as the model's tokenizer gives them (a Hugging Face
  // tokenizer with its post-processor's special tokens, as transformers' and
  // vLLM's prompts are). Throws std::invalid_argument naming what cannot be
  // encoded (an id past the model's vocabulary).
  // add_special_tokens false: the text alone (a chat template's output, which
  // spells its own special tokens).
  virtual std::vector<int64_t> encode(const std::string& text,
                                      bool add_special_tokens = true) const = 0;
  // ids -> text; bytes of a character split across ids stay as they are.
  virtual std::string decode(std::span<const int64_t> ids) const = 0;

  virtual nn::PagedKVCache make_cache(int64_t block_size, int64_t num_blocks) = 0;
  // nn::forward_paged: ids (N), sequence after sequence -> logits (S, V).
  virtual Tensor step(std::span<const int64_t> ids, std::span<const nn::PagedSequence> seqs,
                      nn::PagedKVCache& cache) = 0;
  // Bytes of key and value per token of one sequence (all layers).
  virtual int64_t kv_bytes_per_token() const = 0;

 protected:
  std::string name_, dir_, family_;
  DType kv_dtype_ = DType::kFloat32;
  int64_t vocab_size_ = 0, context_length_ = 0;
  std::vector<int64_t> eos_ids_;
};

}  // namespace attn::serve
