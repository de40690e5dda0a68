// prepare.h - `attn prepare`: a corpus tokenized once into token shards
// (attn/token_shards.h) that `attn train --data-shards DIR` reads.
//
//   attn prepare --tokenizer gpt2 IN... --out DIR [--shard-tokens N] [--threads N] [--verify]
//
// Bad input (a missing file, invalid UTF-8, an existing manifest in DIR) is one
// line on stderr and exit code 1; a misuse of the options exit code 2.
#pragma once

#include "command.h"

namespace attn::cli {

// Registers the `prepare` subcommand on the app.
Command add_prepare_command(CLI::App& app);

}  // namespace attn::cli
