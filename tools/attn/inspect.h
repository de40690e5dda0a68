// inspect.h - `attn inspect FILE`: a safetensors file's tensors (name, dtype,
// shape, bytes, data offsets) and metadata, read from its header alone after
// the checks of attn/safetensors.h; a malformed file is one line on stderr
// naming what is wrong, and exit code 1.
#pragma once

#include <string>

#include "attn/safetensors.h"
#include "command.h"

namespace attn::cli {

// The text `attn inspect` prints for a header read from `path`.
std::string inspect_text(const std::string& path, const io::SafetensorsHeader& header);
// The same as one JSON object: {"file", "header_bytes", "data_bytes", "tensors": [{"name",
// "dtype", "shape", "bytes", "data_offsets"}], "metadata": {...}}.
std::string inspect_json(const std::string& path, const io::SafetensorsHeader& header);

// Registers the `inspect` subcommand on the app.
Command add_inspect_command(CLI::App& app);

}  // namespace attn::cli
