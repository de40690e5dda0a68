// generate_command.h - `attn generate`: text from a GPT checkpoint, one token
// at a time with a key/value cache per layer (attn/generate.h), sampled as the
// book's chapter-5 generate does (top-k, then temperature; temperature 0 is
// argmax); --no-cache recomputes the whole prefix every step; --benchmark
// prints prompt-processing and generation tokens/s with and without the cache.
#pragma once

#include "command.h"

namespace attn::cli {

// Registers the `generate` subcommand on the app.
Command add_generate_command(CLI::App& app);

}  // namespace attn::cli
