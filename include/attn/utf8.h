// attn/utf8.h - strict UTF-8: the text of a character-level model is split
// into code points (attn train's vocabulary, attn generate's prompt, the
// labels of attn plot attention) by these three functions and no others; and
// printable(), which every error message built from outside bytes goes through.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace attn {

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
