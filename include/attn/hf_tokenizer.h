// attn/hf_tokenizer.h - the tokenizers of today's open models from their
// tokenizer.json, the file Hugging Face's `tokenizers` (and transformers'
// fast tokenizers) read: Llama 3's and Qwen's byte-level BPE, Gemma's
// SentencePiece-style BPE with byte fallback; ids equal to tokenizers'.
//
// encode(text) runs the file's pipeline as tokenizers runs it:
//   1. added tokens (the file's "added_tokens": specials such as <|im_start|>,
//      and ordinary ones such as <think>) are found first, leftmost-longest, on
//      the raw text ("normalized": false) or on the normalised text ("normalized":
//      true), with their lstrip / rstrip / single_word; the text between them
//      goes on;
//   2. normalizer: NFC, NFD, NFKC, NFKD (utf8proc), Replace, Prepend, Sequence;
//   3. pre_tokenizer: Split (a String or a Regex, run by PCRE2 with JIT; the
//      behaviours Isolated, Removed, MergedWithPrevious, MergedWithNext,
//      Contiguous; invert), ByteLevel (GPT-2's byte-to-unicode map, its regex
//      when use_regex, add_prefix_space), Metaspace, Sequence;
//   4. model BPE: each piece's characters, merged pair by pair, lowest merge
//      rank first (leftmost on a tie); ignore_merges (a piece that is a token
//      is that token), byte_fallback (a character outside the vocabulary as
//      its <0xXX> byte tokens), unk_token with fuse_unk;
//   5. post_processor, when add_special_tokens: TemplateProcessing's single
//      template (Llama 3's and Gemma's BOS), ByteLevel, Sequence.
// decode(ids) maps ids to their tokens (skipping specials when asked) and runs
// the decoder: ByteLevel, Replace, ByteFallback, Fuse, Strip, Metaspace,
// Sequence; bytes that do not form UTF-8 become U+FFFD, as tokenizers' lossy
// conversion makes them.
//
// Anything else in a file (another model type, normalizer, pre-tokenizer,
// post-processor or decoder, BPE dropout, a continuing_subword_prefix) is
// refused when the file is read, by an exception naming the file and the
// component and listing what attn reads. Input text must be valid UTF-8
// (std::invalid_argument naming the byte offset otherwise).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace attn::text {

class HfTokenizer {
 public:
  // Reads and checks a tokenizer.json; `name` stands for it in messages.
  static HfTokenizer from_file(const std::string& path);
  static HfTokenizer from_json(std::string_view json, const std::string& name = "tokenizer.json");

  // The ids of UTF-8 text; add_special_tokens runs the post-processor (the
  // BOS that Llama 3 and Gemma put in front).
  std::vector<int64_t> encode(std::string_view text, bool add_special_tokens = true) const;
  // The text of ids (the decoder's output); skip_special_tokens drops the
  // added tokens marked special. Throws std::out_of_range for an unknown id.
  std::string decode(std::span<const int64_t> ids, bool skip_special_tokens = false) const;

  // One more than the largest id (the model's vocabulary and the added tokens).
  int64_t vocab_size() const;
  // The id of a token string (the model's vocabulary or an added token).
  std::optional<int64_t> token_to_id(std::string_view token) const;
  // The token string of an id, as the file spells it ("Ġworld", "▁the", "<0x41>").
  const std::string& id_to_token(int64_t id) const;
  bool is_special(int64_t id) const;
  // A one-line summary: the model, normalizer, pre-tokenizer, post-processor and decoder types.
  std::string describe() const;

  struct Impl;

 private:
  explicit HfTokenizer(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<const Impl> impl_;
};

}  // namespace attn::text
