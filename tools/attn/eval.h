// eval.h - `attn eval`: a model's mean cross-entropy and perplexity on a text
// file, by transformers' sliding-window method.
#pragma once

#include "command.h"

namespace attn::cli {

Command add_eval_command(CLI::App& app);

}  // namespace attn::cli
