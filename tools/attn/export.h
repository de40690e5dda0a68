// export.h - `attn export`: a model directory (Hugging Face GPT-2 or attn
// checkpoint) written as a Hugging Face GPT-2 directory or as an attn
// checkpoint with the book's names.
#pragma once

#include "command.h"

namespace attn::cli {

Command add_export_command(CLI::App& app);

}  // namespace attn::cli
