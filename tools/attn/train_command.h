// train_command.h - `attn train --text FILE --out DIR`: trains a
// character-level GPT on a UTF-8 text (attn/train.h) and writes
// DIR/checkpoint.safetensors and DIR/metrics.jsonl. See docs/training.md.
//
// Exit codes: 0 finished; 130 stopped by SIGINT after the current step (a
// checkpoint of that step written; --resume continues it); 1 a failure (bad
// text, unwritable DIR, a checkpoint that does not match); 2 a usage error (a
// bad flag value).
#pragma once

#include "command.h"

namespace attn::cli {

// Registers the `train` subcommand on the app.
Command add_train_command(CLI::App& app);

}  // namespace attn::cli
