// Strict UTF-8 decoding and encoding (attn/utf8.h).
#include "attn/utf8.h"

#include <fmt/format.h>

#include <cstdint>
#include <stdexcept>

namespace attn {

std::vector<char32_t> decode_utf8(std::string_view text) {
  std::vector<char32_t> out;
  out.reserve(text.size());
  size_t i = 0;
  while (i < text.size()) {
    char32_t cp = 0;
    const char* why = nullptr;
    const size_t len = utf8_sequence(text, i, cp, &why);
    if (len == 0) {
      throw std::invalid_argument(fmt::format("invalid UTF-8 at byte offset {}: {} (byte 0x{:02X})",
                                              i, why, static_cast<unsigned char>(text[i])));
    }
    out.push_back(cp);
    i += len;
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

namespace {

bool invisible(char32_t cp) {
  return (cp >= 0x80 && cp <= 0x9F) || (cp >= 0x200B && cp <= 0x200F) ||
         (cp >= 0x2028 && cp <= 0x202E) || (cp >= 0x2060 && cp <= 0x206F) || cp == 0xFEFF;
}

}  // namespace

std::string printable(std::string_view bytes, size_t max_bytes) {
  const bool cut = bytes.size() > max_bytes;
  if (cut) bytes = bytes.substr(0, max_bytes);
  std::string out;
  out.reserve(bytes.size());
  size_t i = 0;
  while (i < bytes.size()) {
    char32_t cp = 0;
    const size_t len = utf8_sequence(bytes, i, cp);
    if (len == 0) {
      // At the cut, a character split by max_bytes is shown as cut, not as bad bytes.
      if (cut && bytes.size() - i < 4) break;
      out += fmt::format("\\x{:02X}", static_cast<unsigned char>(bytes[i]));
      ++i;
      continue;
    }
    if (cp == '\n') {
      out += "\\n";
    } else if (cp == '\r') {
      out += "\\r";
    } else if (cp == '\t') {
      out += "\\t";
    } else if (cp < 0x20 || cp == 0x7F) {
      out += fmt::format("\\x{:02X}", static_cast<uint32_t>(cp));
    } else if (invisible(cp)) {
      out += fmt::format("\\u{{{:04X}}}", static_cast<uint32_t>(cp));
    } else {
      out.append(bytes.substr(i, len));
    }
    i += len;
  }
  if (cut) out += "...";
  return out;
}

std::string utf8_replacing_invalid(std::string_view bytes) {
  static const std::string kReplacement = "\xEF\xBF\xBD";  // U+FFFD
  std::string out;
  out.reserve(bytes.size());
  const auto byte = [&](size_t k) { return static_cast<unsigned char>(bytes[k]); };
  for (size_t i = 0; i < bytes.size();) {
    char32_t cp = 0;
    const size_t len = utf8_sequence(bytes, i, cp);
    if (len > 0) {
      out.append(bytes.substr(i, len));
      i += len;
      continue;
    }
    // The maximal subpart: the lead byte (C2..F4) and the continuation bytes
    // that a valid sequence could have next (Unicode's table 3-7 ranges).
    const unsigned char b0 = byte(i);
    size_t need = b0 >= 0xC2 && b0 <= 0xDF ? 2 : b0 >= 0xE0 && b0 <= 0xEF ? 3
                                              : b0 >= 0xF0 && b0 <= 0xF4 ? 4 : 1;
    size_t k = 1;
    for (; k < need && i + k < bytes.size(); ++k) {
      const unsigned char b = byte(i + k);
      unsigned char lo = 0x80, hi = 0xBF;
      if (k == 1) {
        if (b0 == 0xE0) lo = 0xA0;
        if (b0 == 0xED) hi = 0x9F;
        if (b0 == 0xF0) lo = 0x90;
        if (b0 == 0xF4) hi = 0x8F;
      }
      if (b < lo || b > hi) break;
    }
    out += kReplacement;
    i += k;
  }
  return out;
}

bool is_utf8(std::string_view bytes) {
  for (size_t i = 0; i < bytes.size();) {
    char32_t cp = 0;
    const size_t n = utf8_sequence(bytes, i, cp);
    if (n == 0) return false;
    i += n;
  }
  return true;
}

std::string hex_of(std::string_view bytes) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  out.reserve(2 * bytes.size());
  for (const char c : bytes) {
    const auto b = static_cast<unsigned char>(c);
    out += kDigits[b >> 4];
    out += kDigits[b & 15];
  }
  return out;
}

std::string bytes_of_hex(std::string_view hex) {
  const auto digit = [&](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    throw std::invalid_argument(fmt::format("bytes_of_hex: '{}' is not hex", printable(hex, 64)));
  };
  if (hex.size() % 2 != 0) {
    throw std::invalid_argument(
        fmt::format("bytes_of_hex: '{}' has an odd length ({})", printable(hex, 64), hex.size()));
  }
  std::string out;
  out.reserve(hex.size() / 2);
  for (size_t i = 0; i < hex.size(); i += 2)
    out += static_cast<char>(digit(hex[i]) * 16 + digit(hex[i + 1]));
  return out;
}

}  // namespace attn
