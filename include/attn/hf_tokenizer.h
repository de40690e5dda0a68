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
// The two files a directory may carry instead (from_file tells them apart):
//   - a SentencePiece model (`tokenizer.model`: Gemma's, Llama 2's), run by
//     Debian's libsentencepiece: its control pieces (<bos>, <eos>, <pad>) and
//     <unk> are special added tokens matched in the text first, as
//     transformers' converted tokenizer matches them; the text between them is
//     sentencepiece's (user-defined pieces such as <start_of_turn> included);
//     add_special_tokens puts <bos> in front; decode is sentencepiece's;
//   - Llama 3's `original/tokenizer.model`, tiktoken's rank file (one
//     "base64(token bytes) rank" a line): read as transformers converts it
//     (TikTokenConverter): byte-level BPE with the ranks as ids, merges from
//     the ranks, Llama 3's Split regex, Meta's 256 special tokens numbered
//     after the ranks (<|begin_of_text|> ... <|eot_id|> <|python_tag|>, then
//     reserved), <|begin_of_text|> in front.
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

// How a SentencePiece model reads (HfTokenizer::from_sentencepiece): what a
// model directory's tokenizer_config.json says beside it.
struct SentencePieceOptions {
  bool legacy = false;        // "legacy": every piece of text gets the dummy prefix
  bool add_bos_token = true;  // "add_bos_token": BOS in front when specials are added
};

class HfTokenizer {
 public:
  // Reads and checks a tokenizer.json, a SentencePiece model or a tiktoken
  // rank file (by its contents); `name` stands for it in messages.
  static HfTokenizer from_file(const std::string& path);
  // A model directory's tokenizer: DIR/tokenizer.json, else DIR/tokenizer.model,
  // else DIR/original/tokenizer.model (Llama 3's); a SentencePiece model with
  // DIR/tokenizer_config.json's "legacy" (false when absent, as transformers 5)
  // and "add_bos_token" (true when absent, as Gemma's and Llama 2's files say).
  // Throws std::invalid_argument naming the directory when it has none of them.
  static HfTokenizer from_directory(const std::string& dir);
  static HfTokenizer from_json(std::string_view json, const std::string& name = "tokenizer.json");
  // A SentencePiece model's bytes (the ModelProto). Throws std::invalid_argument
  // naming the file when libsentencepiece cannot read it. The text between
  // special tokens is encoded as transformers 5's tokenizer converted from the
  // model encodes it (Metaspace): spaces kept as they are, and the model's
  // dummy prefix "▁" in front of text that does not start with a space: of
  // every piece of text between specials with options.legacy (tokenizer_config.json's,
  // a Llama tokenizer's old rule, prepend_scheme "always"), else of the text at
  // the very start only (transformers 5's default, "first"). Decoding drops
  // one space at the start of the output. Models without a dummy prefix or
  // whitespace folding (Gemma's) are sentencepiece's own either way.
  static HfTokenizer from_sentencepiece(std::string_view model,
                                        const std::string& name = "tokenizer.model",
                                        const SentencePieceOptions& options = {});
  // A tiktoken rank file's text, with Llama 3's pattern and special tokens.
  static HfTokenizer from_tiktoken(std::string_view ranks,
                                   const std::string& name = "tokenizer.model");
  // The tokenizer.json that from_tiktoken reads the rank file as.
  static std::string tiktoken_to_json(std::string_view ranks,
                                      const std::string& name = "tokenizer.model");

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
