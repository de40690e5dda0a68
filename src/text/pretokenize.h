// src/text/pretokenize.h - GPT-2's pre-tokenizer as a hand-written matcher of
//   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
// with the regex's leftmost-first semantics, over text that is valid UTF-8.
// The classes are char_class() (unicode_classes.h).
#pragma once

#include <cstddef>
#include <string_view>

#include "text/unicode_classes.h"

namespace attn::text {

// One code point of valid UTF-8 starting at p (at least one byte available).
struct CodePoint {
  char32_t cp;
  size_t len;
};
inline CodePoint decode_valid_utf8(const unsigned char* p) {
  const unsigned char b = p[0];
  if (b < 0x80) return {b, 1};
  if (b < 0xE0) return {static_cast<char32_t>(((b & 0x1Fu) << 6) | (p[1] & 0x3Fu)), 2};
  if (b < 0xF0)
    return {static_cast<char32_t>(((b & 0x0Fu) << 12) | ((p[1] & 0x3Fu) << 6) | (p[2] & 0x3Fu)), 3};
  return {static_cast<char32_t>(((b & 0x07u) << 18) | ((p[1] & 0x3Fu) << 12) |
                                ((p[2] & 0x3Fu) << 6) | (p[3] & 0x3Fu)),
          4};
}

// The end of the piece that starts at byte i (i < text.size()).
inline size_t piece_end(std::string_view text, size_t i) {
  const auto* s = reinterpret_cast<const unsigned char*>(text.data());
  const size_t n = text.size();
  // 's|'t|'re|'ve|'m|'ll|'d  (lower case only, as in GPT-2's pattern)
  if (s[i] == '\'' && i + 1 < n) {
    const unsigned char a = s[i + 1];
    if (a == 's' || a == 't' || a == 'm' || a == 'd') return i + 2;
    if (i + 2 < n) {
      const unsigned char b = s[i + 2];
      if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return i + 3;
    }
  }
  CodePoint c = decode_valid_utf8(s + i);
  CharClass cls = char_class(c.cp);
  size_t j = i + c.len;
  // " ?X+" for X in L, N, other: a single space joins the run after it.
  if (c.cp == ' ' && j < n) {
    const CodePoint next = decode_valid_utf8(s + j);
    const CharClass next_cls = char_class(next.cp);
    if (next_cls != CharClass::kSpace) {
      cls = next_cls;
      j += next.len;
    }
  }
  if (cls != CharClass::kSpace) {
    while (j < n) {
      c = decode_valid_utf8(s + j);
      if (char_class(c.cp) != cls) break;
      j += c.len;
    }
    return j;
  }
  // A run of \s from i. \s+(?!\S): the whole run at the end of the text, else
  // the run less its last character (which is followed by \S) when that leaves
  // one or more; \s+: a single \s before \S.
  size_t last = i;
  while (j < n) {
    c = decode_valid_utf8(s + j);
    if (char_class(c.cp) != CharClass::kSpace) break;
    last = j;
    j += c.len;
  }
  if (j == n) return j;
  return last > i ? last : j;
}

// Calls on_piece(piece) for each piece of the text, in order.
template <typename F>
void for_each_piece(std::string_view text, F&& on_piece) {
  size_t i = 0;
  while (i < text.size()) {
    const size_t end = piece_end(text, i);
    on_piece(text.substr(i, end - i));
    i = end;
  }
}

}  // namespace attn::text
