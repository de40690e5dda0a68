// Strict UTF-8 decoding and encoding (attn/utf8.h).
#include "attn/utf8.h"

#include <fmt/format.h>

#include <cstdint>
#include <stdexcept>

namespace attn {

std::vector<char32_t> decode_utf8(std::string_view text) {
  std::vector<char32_t> out;
  out.reserve(text.size());
  const auto byte = [&](size_t i) { return static_cast<unsigned char>(text[i]); };
  size_t i = 0;
  while (i < text.size()) {
    const unsigned char b0 = byte(i);
    auto bad = [&](const char* why) {
      return std::invalid_argument(
          fmt::format("invalid UTF-8 at byte offset {}: {} (byte 0x{:02X})", i, why, b0));
    };
    if (b0 < 0x80) {
      out.push_back(b0);
      ++i;
      continue;
    }
    int len = 0;
    char32_t cp = 0, min = 0;
    if ((b0 & 0xE0) == 0xC0) {
      len = 2, cp = b0 & 0x1F, min = 0x80;
    } else if ((b0 & 0xF0) == 0xE0) {
      len = 3, cp = b0 & 0x0F, min = 0x800;
    } else if ((b0 & 0xF8) == 0xF0) {
      len = 4, cp = b0 & 0x07, min = 0x10000;
    } else {
      throw bad((b0 & 0xC0) == 0x80 ? "unexpected continuation byte" : "invalid lead byte");
    }
    if (i + static_cast<size_t>(len) > text.size())
      throw bad("sequence cut short by the end of the text");
    for (int k = 1; k < len; ++k) {
      const unsigned char b = byte(i + static_cast<size_t>(k));
      if ((b & 0xC0) != 0x80) throw bad("missing continuation byte");
      cp = (cp << 6) | (b & 0x3F);
    }
    if (cp < min) throw bad("overlong encoding");
    if (cp >= 0xD800 && cp <= 0xDFFF) throw bad("surrogate code point");
    if (cp > 0x10FFFF) throw bad("code point above U+10FFFF");
    out.push_back(cp);
    i += static_cast<size_t>(len);
  }
  return out;
}

std::string encode_utf8(char32_t cp) {
  if ((cp >= 0xD800 && cp <= 0xDFFF) || cp > 0x10FFFF)
    throw std::invalid_argument(fmt::format("encode_utf8: U+{:04X} is not a Unicode scalar value",
                                            static_cast<uint32_t>(cp)));
  std::string s;
  if (cp < 0x80) {
    s += static_cast<char>(cp);
  } else if (cp < 0x800) {
    s += static_cast<char>(0xC0 | (cp >> 6));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    s += static_cast<char>(0xE0 | (cp >> 12));
    s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    s += static_cast<char>(0xF0 | (cp >> 18));
    s += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  }
  return s;
}

std::vector<std::string> utf8_characters(std::string_view text) {
  std::vector<std::string> out;
  for (const char32_t cp : decode_utf8(text)) out.push_back(encode_utf8(cp));
  return out;
}

}  // namespace attn
