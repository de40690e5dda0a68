// attn/utf8.h - strict UTF-8: the text of a character-level model is split
// into code points (attn train's vocabulary, attn generate's prompt, the
// labels of attn plot attention) by these three functions and no others; and
// printable(), which every error message built from outside bytes goes through.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace attn {

// The one UTF-8 sequence decoder every reader of UTF-8 here uses
// (decode_utf8, printable, the tokenizer's validation): the valid sequence at
// text[i] (i < text.size()), returning its length 1..4 and setting cp; or 0 for
// a malformed, overlong, surrogate, out-of-range or cut-short sequence, with
// *why (when given) saying which ("invalid lead byte", "overlong encoding", ...).
// Inline: the tokenizer validates every input through it.
inline size_t utf8_sequence(std::string_view text, size_t i, char32_t& cp,
                            const char** why = nullptr) {
  const auto byte = [&](size_t k) { return static_cast<unsigned char>(text[k]); };
  const auto bad = [&](const char* reason) -> size_t {
    if (why != nullptr) *why = reason;
    return 0;
  };
  const unsigned char b0 = byte(i);
  size_t len = 0;
  char32_t min = 0;
  if (b0 < 0x80) {
    cp = b0;
    return 1;
  } else if ((b0 & 0xE0) == 0xC0) {
    len = 2, cp = b0 & 0x1F, min = 0x80;
  } else if ((b0 & 0xF0) == 0xE0) {
    len = 3, cp = b0 & 0x0F, min = 0x800;
  } else if ((b0 & 0xF8) == 0xF0) {
    len = 4, cp = b0 & 0x07, min = 0x10000;
  } else {
    return bad((b0 & 0xC0) == 0x80 ? "unexpected continuation byte" : "invalid lead byte");
  }
  if (i + len > text.size()) return bad("sequence cut short by the end of the text");
  for (size_t k = 1; k < len; ++k) {
    const unsigned char b = byte(i + k);
    if ((b & 0xC0) != 0x80) return bad("missing continuation byte");
    cp = (cp << 6) | (b & 0x3F);
  }
  if (cp < min) return bad("overlong encoding");
  if (cp >= 0xD800 && cp <= 0xDFFF) return bad("surrogate code point");
  if (cp > 0x10FFFF) return bad("code point above U+10FFFF");
  return len;
}

// The code points of UTF-8 text. Throws std::invalid_argument("invalid UTF-8
// at byte offset N: ...") for a malformed, overlong, surrogate or out-of-range
// sequence, or one cut short by the end of the text.
std::vector<char32_t> decode_utf8(std::string_view text);

// One code point as UTF-8 (1 to 4 bytes); throws std::invalid_argument for a
// surrogate or a value above U+10FFFF.
std::string encode_utf8(char32_t code_point);

// The characters of UTF-8 text, each as its own UTF-8 bytes ("aé" -> {"a", "é"});
// the errors of decode_utf8.
std::vector<std::string> utf8_characters(std::string_view text);

// Bytes as Python's bytes.decode("utf-8", errors="replace") makes them text
// (what tiktoken's decode returns for GPT-2 tokens that split a character):
// each valid sequence kept, each maximal ill-formed subpart (a lead byte and
// the continuation bytes that can still follow it, or one byte that can start
// nothing) one U+FFFD.
std::string utf8_replacing_invalid(std::string_view bytes);

// Bytes in JSON, losslessly (issue 46: paths are bytes). A JSON string holds
// Unicode text, and a Linux path may be any bytes but NUL, so a value that is
// not valid UTF-8 is written under two keys: KEY, its text with U+FFFD for
// each ill-formed part (utf8_replacing_invalid: for people and for readers
// that know nothing more), and KEY_hex, its bytes in lowercase hex (for
// readers that need the path back: attn takes KEY_hex when it is there).
// Valid UTF-8 is written as KEY alone, as always. Escaping each bad byte as
// \u00XX instead would name another file (U+00FF is the two bytes C3 BF), and
// Python's surrogateescape (\uDCFF) is refused by strict JSON readers.
bool is_utf8(std::string_view bytes);
// "2f74c3a9ff" for "/t\xC3\xA9\xFF".
std::string hex_of(std::string_view bytes);
// The bytes of hex_of's text; std::invalid_argument for an odd length or a
// character that is not a hex digit.
std::string bytes_of_hex(std::string_view hex);

// Bytes from outside (a file name, a tensor name, header text, tokenizer
// input, a command-line value) made safe to put in a message, so that no
// message ever carries raw input bytes to a terminal or a log:
//   - printable ASCII and valid UTF-8 characters pass through unchanged
//     ("model.safetensors", "Größe", "日本");
//   - a byte that is not part of valid UTF-8 becomes \xHH ("\xFF");
//   - ASCII controls become \n, \r, \t or \xHH, DEL \x7F;
//   - the invisible or reordering code points (C1 controls U+0080..U+009F,
//     U+200B..U+200F, U+2028..U+202E, U+2060..U+206F, U+FEFF) become \u{XXXX};
//   - a backslash stays a single backslash.
// At most max_bytes bytes of input are shown; a longer input ends in "...".
std::string printable(std::string_view bytes, size_t max_bytes = 256);

}  // namespace attn
