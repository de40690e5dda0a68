// src/text/unicode_classes.h - the three Unicode classes of GPT-2's
// pre-tokenizer pattern (\p{L}, \p{N}, \s), as tiktoken's regex engine has them.
//
// The classes come from PCRE2 (JIT, PCRE2_UTF | PCRE2_UCP), asked once per
// block of 256 code points on first use, then corrected where Debian 12's
// PCRE2 (Unicode 14) and tiktoken disagree; each correction is listed with its
// reason in unicode_classes.cpp. tests/unit/test_tokenizer_unicode.cpp checks
// every scalar value 0..0x10FFFF against tiktoken's ranges
// (tests/fixtures/tokenizer/unicode_classes.json).
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <span>

namespace attn::text {

// \p{L}, \p{N} and \s are disjoint; kOther is everything else (and is what
// [^\s\p{L}\p{N}] matches).
enum class CharClass : uint8_t { kOther = 0, kLetter = 1, kNumber = 2, kSpace = 3 };

constexpr char32_t kMaxCodePoint = 0x10FFFF;
constexpr int kBlockBits = 8;  // blocks of 256 code points
constexpr size_t kBlocks = (kMaxCodePoint + 1) >> kBlockBits;

namespace detail {
// class_table[cp] is valid once block_ready[cp >> kBlockBits] is set.
extern uint8_t class_table[kMaxCodePoint + 1];
extern std::array<std::atomic<bool>, kBlocks> block_ready;
void fill_block(size_t block);  // thread-safe
}  // namespace detail

// The class of one code point (cp <= 0x10FFFF; surrogates are kOther).
inline CharClass char_class(char32_t cp) {
  const size_t block = cp >> kBlockBits;
  if (!detail::block_ready[block].load(std::memory_order_acquire)) detail::fill_block(block);
  return static_cast<CharClass>(detail::class_table[cp]);
}

// A range of code points whose class is set to tiktoken's, over PCRE2's.
struct ClassCorrection {
  char32_t first, last;
  CharClass cls;
};
std::span<const ClassCorrection> class_corrections();

// PCRE2's answer alone, before the corrections (for the tests).
CharClass pcre2_char_class(char32_t cp);

}  // namespace attn::text
