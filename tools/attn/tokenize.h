// tokenize.h - `attn tokenize`: GPT-2's byte-level BPE (attn/tokenizer.h) on
// the command line.
//
//   attn tokenize [TEXT] [--file F] [--allow-special] [--json]
//       the ids of TEXT (or of F, or of stdin) on one line, space-separated;
//       --json: {"ids": [...], "tokens": [{"id", "token", "text"}]}, where
//       "token" is the vocabulary's own spelling (GPT-2's byte-to-unicode form,
//       "Ġworld") and "text" the token's bytes as a string, or null when they
//       are not valid UTF-8 on their own (part of a split character).
//   attn tokenize --decode [IDS...] [--file F]
//       the text of the ids (arguments, or whitespace- or comma-separated in F
//       or stdin), written as its bytes, nothing added.
// Bad input (invalid UTF-8, an id out of range, an unreadable file) is one
// line on stderr and exit code 1; a misuse of the options exit code 2.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "attn/tokenizer.h"
#include "command.h"

namespace attn::cli {

// The JSON `attn tokenize --json` prints for these ids.
std::string tokens_json(const text::Tokenizer& tok, const std::vector<int64_t>& ids);

// Ids written as decimal integers separated by white space or commas (an
// enclosing [ ] is allowed); throws std::invalid_argument naming the first
// word that is not one.
std::vector<int64_t> parse_ids(std::string_view text);

// Registers the `tokenize` subcommand on the app.
Command add_tokenize_command(CLI::App& app);

}  // namespace attn::cli
