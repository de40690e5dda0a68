// attn/utf8.h - strict UTF-8: the text of a character-level model is split
// into code points (attn train's vocabulary, attn generate's prompt, the
// labels of attn plot attention) by these three functions and no others.
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

}  // namespace attn
