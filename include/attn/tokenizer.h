// attn/tokenizer.h - GPT-2's byte-level BPE tokenizer, giving the ids that
// tiktoken's "gpt2" encoding gives for every valid UTF-8 text.
//
// Text -> ids in three steps:
//   1. the text is split into pieces by GPT-2's pattern
//        's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
//      (leftmost alternative first; \p{L}, \p{N} and \s are the Unicode classes
//      of tiktoken's regex engine, docs/tokenizer.md);
//   2. a piece that is itself a token becomes that token;
//   3. any other piece is merged byte pair by byte pair, always the adjacent
//      pair whose joined bytes have the lowest merge rank (leftmost on a tie),
//      until no joined pair is a token.
// "<|endoftext|>" in the text is a special token (50256) only with
// allow_special; otherwise it is ordinary text like any other.
//
// Ids are int64_t, the type of attn's token tensors. Errors are exceptions
// whose messages name the values (a byte offset, an id and the vocabulary size,
// a file and line); bytes from the input pass through attn::printable.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace attn::text {

struct Vocabulary;  // src/text/vocabulary.h

class Tokenizer {
 public:
  // GPT-2's vocabulary (50,257 tokens), embedded in the library: no file is
  // read at run time. Built on first use; thread-safe.
  static const Tokenizer& gpt2();
  // A vocabulary in Hugging Face's files: vocab.json (token string -> id, in
  // GPT-2's byte-to-unicode form, ids 0..N-1) and merges.txt (one merge "A B"
  // per line in rank order, after an optional "#version" line). The same
  // formats as GPT-2's encoder.json and vocab.bpe. Throws std::runtime_error
  // naming the file and the line or key for a malformed file.
  static Tokenizer from_files(const std::string& vocab_json, const std::string& merges_txt);
  // dir/vocab.json + dir/merges.txt when both exist, else a copy of gpt2().
  static Tokenizer from_directory(const std::string& dir);

  // The ids of UTF-8 text. allow_special: "<|endoftext|>" -> eot_token(); else
  // it is ordinary text. Throws std::invalid_argument("... invalid UTF-8 at
  // byte offset N: ...") for text that is not valid UTF-8.
  std::vector<int64_t> encode(std::string_view text, bool allow_special = false) const;
  // The same ids, computed on `threads` threads (0: OpenMP's maximum). The
  // text is cut only where the pattern cannot join a piece across the cut.
  std::vector<int64_t> encode_parallel(std::string_view text, bool allow_special = false,
                                       int threads = 0) const;
  // The bytes of the tokens, joined (a character split across two ids within
  // the sequence comes out whole). Throws std::out_of_range for an id outside
  // [0, vocab_size()).
  std::string decode(std::span<const int64_t> ids) const;
  // The raw bytes of one token (not necessarily valid UTF-8 on their own).
  const std::string& token_bytes(int64_t id) const;
  int64_t vocab_size() const;  // 50257 for gpt2
  // The id of "<|endoftext|>" (50256 for gpt2); -1 when the vocabulary has none.
  int64_t eot_token() const;

 private:
  explicit Tokenizer(std::shared_ptr<const Vocabulary> vocab);
  std::shared_ptr<const Vocabulary> vocab_;
};

// Writes GPT-2's vocabulary into dir as Hugging Face names it: dir/vocab.json
// and dir/merges.txt (byte for byte data/gpt2/encoder.json and vocab.bpe, which
// are those files), each atomically. The directory must exist. Throws
// std::runtime_error naming the file when it cannot be written.
void write_gpt2_vocabulary(const std::string& dir);

// GPT-2's vocabulary as a tokenizer.json (what transformers' GPT2TokenizerFast
// saves: a ByteLevel pre-tokenizer with GPT-2's regex, the BPE model with
// vocab.json's ids and merges.txt's merges in rank order, <|endoftext|> an
// added special token, a ByteLevel decoder), for a model trained on GPT-2's
// tokens and written in the Hub layout (attn/hf_decoder.h); attn/hf_tokenizer.h
// reads it back to the same ids as gpt2().encode(text, allow_special=true).
std::string gpt2_tokenizer_json();

// Decoded text for streaming generation, one id at a time: holds back the
// bytes of a UTF-8 character split across tokens until it is complete. Bytes
// that can never complete a character (a stray continuation byte, 0xFF) are
// passed on as they are.
class StreamDecoder {
 public:
  explicit StreamDecoder(const Tokenizer& tok);
  // The text that is now ready (may be empty); throws std::out_of_range for a
  // bad id, as Tokenizer::decode does.
  std::string push(int64_t id);
  // What is left at the end (an incomplete character's bytes as they are).
  std::string flush();

 private:
  const Tokenizer* tok_;
  std::string pending_;
};

}  // namespace attn::text
