// special_tokens.h - GPT-2's "<|endoftext|>" in a command's input, by
// tiktoken's rule, the same in every command (tokenize, generate, eval,
// train --tokenizer gpt2, prepare): text that holds it is refused unless
// --allow-special, which encodes it as the special token 50256. (tiktoken's
// encode raises for it unless allowed_special names it; attn's Python
// Tokenizer does the same.) A character-level model has no special tokens,
// and a tokenizer.json's added tokens are matched as Hugging Face's tokenizers
// matches them, so neither comes here.
#pragma once

#include <string>
#include <string_view>

namespace attn::cli {

inline constexpr std::string_view kEndOfText = "<|endoftext|>";

// Throws std::invalid_argument when `text` holds "<|endoftext|>" and it is
// not allowed: "WHAT holds "<|endoftext|>" at byte N: ...", naming the flag.
void refuse_special_tokens(std::string_view text, const std::string& what, bool allowed);

// The same for a file, read in blocks (attn prepare's inputs, which may be
// larger than memory); the file's errors are left to its reader.
void refuse_special_tokens_in_file(const std::string& path, bool allowed);

}  // namespace attn::cli
