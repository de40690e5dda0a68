// about.h - what `attn --version` and `attn --completion bash` print: the
// build (version, commit, SIMD targets, GEMM engines, MPI, Python) and a bash
// completion script generated from the CLI11 app itself, so that it names
// exactly the commands and options the binary has.
#pragma once

#include <CLI/CLI.hpp>
#include <string>

namespace attn::cli {

// Several lines: "attn 0.1.0 (commit 74073b2c1a3d)" first (help2man and
// scripts read that one), then the build's engines and options.
std::string version_text();

// A bash completion script for `attn` (complete -F _attn attn): the
// subcommands at each level, each command's options, file names after an
// option that takes a value.
std::string bash_completion(const CLI::App& app);

}  // namespace attn::cli
