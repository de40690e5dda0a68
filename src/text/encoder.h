// src/text/encoder.h - the pieces of Tokenizer::encode that the tests reach
// directly: UTF-8 validation, encoding of one stretch of ordinary text with a
// cache of multi-token pieces, and the cut points of encode_parallel.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "text/vocabulary.h"

namespace attn::text {

// Throws std::invalid_argument("<what>: invalid UTF-8 at byte offset N: <why>
// (byte 0xHH)") at the first malformed, overlong, surrogate or out-of-range
// sequence, or one cut short by the end (the messages of attn::decode_utf8).
void validate_utf8(std::string_view text, const char* what);

// Encodes ordinary text (valid UTF-8, no special tokens) piece by piece. A
// piece that is one token costs one hash lookup; the ids of a multi-token piece
// are kept in a direct-mapped cache of kCacheSlots entries, so a frequent word
// is merged once per encoder.
class PieceEncoder {
 public:
  explicit PieceEncoder(const Vocabulary& v);
  void encode(std::string_view text, std::vector<int64_t>& out);

 private:
  static constexpr size_t kCacheSlots = 4096;
  static constexpr size_t kMaxCachedBytes = 64;
  struct Slot {
    std::string piece;
    std::vector<int64_t> ids;
  };
  const Vocabulary& v_;
  std::vector<Slot> cache_;
};

// Whether the pattern's pieces of text[0, p) and text[p, end) are exactly the
// pieces of the whole text on either side of p (0 < p < text.size()). True
// where the character before p is not \s, text[p] is one space U+0020 and the
// character after it is not \s: the space then begins " ?X+" and no piece can
// run across p; or where text[p-1] is '\n' after a character that is not \s
// and text[p] begins a character that is not \s: the newline, a one-character
// \s run followed by \S, is a piece of its own on both sides of the cut.
bool is_safe_cut(std::string_view text, size_t p);

// Up to `parts` - 1 cut points, each the first safe cut at or after an even
// share of the text, increasing.
std::vector<size_t> cut_points(std::string_view text, size_t parts);

}  // namespace attn::text
