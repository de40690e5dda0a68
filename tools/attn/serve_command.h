// serve_command.h - `attn serve`: an OpenAI-compatible HTTP server for a
// model directory (src/serve/: the engine's continuous batching over a paged
// key/value cache, the endpoints; docs/serve.md).
//
//   attn serve --model DIR [--host 127.0.0.1] [--port 8080] [--parallel 4]
//              [--ctx-size N] [--kv-cache-mb MB] [--api-key KEY] ...
// Runs until SIGTERM or SIGINT: then it refuses new requests, lets running
// ones finish within --shutdown-grace seconds, cancels the rest and exits 0.
#pragma once

#include "command.h"

namespace attn::cli {

Command add_serve_command(CLI::App& app);

}  // namespace attn::cli
