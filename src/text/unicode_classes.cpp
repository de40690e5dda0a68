// The Unicode classes of GPT-2's pattern, from PCRE2 and pinned to tiktoken
// (unicode_classes.h).
#define PCRE2_CODE_UNIT_WIDTH 8
#include "text/unicode_classes.h"

#include <pcre2.h>

#include <algorithm>
#include <mutex>
#include <stdexcept>
#include <string>

#include "attn/utf8.h"

namespace attn::text {

namespace detail {
uint8_t class_table[kMaxCodePoint + 1];
std::array<std::atomic<bool>, kBlocks> block_ready{};
}  // namespace detail

namespace {

// Where PCRE2 10.42 (Debian 12, Unicode 14.0) and tiktoken 0.14's regex engine
// (Rust's regex crate, Unicode 16.0) disagree, tiktoken wins. Found by
// comparing every scalar value (test_tokenizer_unicode.cpp lists PCRE2's
// differences and fails on one that no correction covers, or on a correction
// that is no longer needed).
constexpr ClassCorrection kCorrections[] = {
    // MONGOLIAN VOWEL SEPARATOR: PCRE2 still counts it as \s (it was Zs before
    // Unicode 6.3); it is Cf now, and tiktoken's \s (the White_Space property)
    // leaves it out: "x \u180eab" gives the piece " \u180e", then "ab".
    {0x180E, 0x180E, CharClass::kOther},
    // The rest are letters (L) and digits (N) that Unicode 15.0, 15.1 and 16.0
    // added: unassigned, i.e. "other", in PCRE2's Unicode 14 data. By block:
    {0x1C89, 0x1C8A, CharClass::kLetter},    // Cyrillic Extended-C
    {0xA7CB, 0xA7CD, CharClass::kLetter},    // Latin Extended-D
    {0xA7DA, 0xA7DC, CharClass::kLetter},    // Latin Extended-D
    {0x105C0, 0x105F3, CharClass::kLetter},  // Todhri
    {0x10D40, 0x10D49, CharClass::kNumber},  // Garay digits
    {0x10D4A, 0x10D65, CharClass::kLetter},  // Garay
    {0x10D6F, 0x10D85, CharClass::kLetter},  // Garay
    {0x10EC2, 0x10EC4, CharClass::kLetter},  // Arabic Extended-C
    {0x1123F, 0x11240, CharClass::kLetter},  // Khojki
    {0x11380, 0x11389, CharClass::kLetter},  // Tulu-Tigalari
    {0x1138B, 0x1138B, CharClass::kLetter},  // Tulu-Tigalari
    {0x1138E, 0x1138E, CharClass::kLetter},  // Tulu-Tigalari
    {0x11390, 0x113B5, CharClass::kLetter},  // Tulu-Tigalari
    {0x113B7, 0x113B7, CharClass::kLetter},  // Tulu-Tigalari
    {0x113D1, 0x113D1, CharClass::kLetter},  // Tulu-Tigalari
    {0x113D3, 0x113D3, CharClass::kLetter},  // Tulu-Tigalari
    {0x116D0, 0x116E3, CharClass::kNumber},  // Myanmar Extended-C digits
    {0x11BC0, 0x11BE0, CharClass::kLetter},  // Sunuwar
    {0x11BF0, 0x11BF9, CharClass::kNumber},  // Sunuwar digits
    {0x11F02, 0x11F02, CharClass::kLetter},  // Kawi
    {0x11F04, 0x11F10, CharClass::kLetter},  // Kawi
    {0x11F12, 0x11F33, CharClass::kLetter},  // Kawi
    {0x11F50, 0x11F59, CharClass::kNumber},  // Kawi digits
    {0x1342F, 0x1342F, CharClass::kLetter},  // Egyptian Hieroglyphs
    {0x13441, 0x13446, CharClass::kLetter},  // Egyptian Hieroglyph Format Controls
    {0x13460, 0x143FA, CharClass::kLetter},  // Egyptian Hieroglyphs Extended-A
    {0x16100, 0x1611D, CharClass::kLetter},  // Gurung Khema
    {0x16130, 0x16139, CharClass::kNumber},  // Gurung Khema digits
    {0x16D40, 0x16D6C, CharClass::kLetter},  // Kirat Rai
    {0x16D70, 0x16D79, CharClass::kNumber},  // Kirat Rai digits
    {0x18CFF, 0x18CFF, CharClass::kLetter},  // Khitan Small Script
    {0x1B132, 0x1B132, CharClass::kLetter},  // Small Kana Extension
    {0x1B155, 0x1B155, CharClass::kLetter},  // Small Kana Extension
    {0x1CCF0, 0x1CCF9, CharClass::kNumber},  // outlined digits (Legacy Computing Supplement)
    {0x1D2C0, 0x1D2D3, CharClass::kNumber},  // Kaktovik Numerals
    {0x1DF25, 0x1DF2A, CharClass::kLetter},  // Latin Extended-G
    {0x1E030, 0x1E06D, CharClass::kLetter},  // Cyrillic Extended-D
    {0x1E4D0, 0x1E4EB, CharClass::kLetter},  // Nag Mundari
    {0x1E4F0, 0x1E4F9, CharClass::kNumber},  // Nag Mundari digits
    {0x1E5D0, 0x1E5ED, CharClass::kLetter},  // Ol Onal
    {0x1E5F0, 0x1E5F0, CharClass::kLetter},  // Ol Onal
    {0x1E5F1, 0x1E5FA, CharClass::kNumber},  // Ol Onal digits
    {0x2B739, 0x2B739, CharClass::kLetter},  // CJK Unified Ideographs Extension C
    {0x2EBF0, 0x2EE5D, CharClass::kLetter},  // CJK Unified Ideographs Extension I
    {0x31350, 0x323AF, CharClass::kLetter},  // CJK Unified Ideographs Extension H
};

// One compiled pattern asks PCRE2 for the class of one character: group 1
// \p{L}, group 2 \p{N}, group 3 \s.
class Pcre2Classifier {
 public:
  Pcre2Classifier() {
    int error = 0;
    PCRE2_SIZE offset = 0;
    const auto* pattern = reinterpret_cast<PCRE2_SPTR>(R"(^(?:(\p{L})|(\p{N})|(\s)))");
    code_ = pcre2_compile(pattern, PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP, &error, &offset,
                          nullptr);
    if (code_ == nullptr) throw std::runtime_error("PCRE2 cannot compile the class pattern");
    pcre2_jit_compile(code_, PCRE2_JIT_COMPLETE);  // falls back to the interpreter if JIT is off
    match_ = pcre2_match_data_create_from_pattern(code_, nullptr);
  }
  ~Pcre2Classifier() {
    pcre2_match_data_free(match_);
    pcre2_code_free(code_);
  }
  Pcre2Classifier(const Pcre2Classifier&) = delete;
  Pcre2Classifier& operator=(const Pcre2Classifier&) = delete;

  // Not thread-safe (one match data); callers hold a lock.
  CharClass classify(char32_t cp) {
    if (cp >= 0xD800 && cp <= 0xDFFF) return CharClass::kOther;
    const std::string s = encode_utf8(cp);
    const int rc = pcre2_match(code_, reinterpret_cast<PCRE2_SPTR>(s.data()), s.size(), 0,
                               PCRE2_NO_UTF_CHECK, match_, nullptr);
    if (rc <= 1) return CharClass::kOther;  // no match (or no group set)
    return static_cast<CharClass>(rc - 1);  // rc - 1 is the highest group set
  }

 private:
  pcre2_code* code_ = nullptr;
  pcre2_match_data* match_ = nullptr;
};

std::mutex& classifier_mutex() {
  static std::mutex m;
  return m;
}

Pcre2Classifier& classifier() {
  static Pcre2Classifier c;
  return c;
}

}  // namespace

namespace detail {

void fill_block(size_t block) {
  std::lock_guard lock(classifier_mutex());
  if (block_ready[block].load(std::memory_order_acquire)) return;
  const char32_t first = static_cast<char32_t>(block << kBlockBits);
  const char32_t last = first + (1u << kBlockBits) - 1;
  for (char32_t cp = first; cp <= last; ++cp)
    class_table[cp] = static_cast<uint8_t>(classifier().classify(cp));
  for (const ClassCorrection& c : kCorrections) {
    for (char32_t cp = std::max(c.first, first); cp <= std::min(c.last, last); ++cp)
      class_table[cp] = static_cast<uint8_t>(c.cls);
  }
  block_ready[block].store(true, std::memory_order_release);
}

}  // namespace detail

std::span<const ClassCorrection> class_corrections() { return kCorrections; }

CharClass pcre2_char_class(char32_t cp) {
  std::lock_guard lock(classifier_mutex());
  return classifier().classify(cp);
}

}  // namespace attn::text
