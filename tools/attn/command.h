// command.h - what every `attn` subcommand gives main.cpp, and the helpers they share.
//
// A subcommand file registers its CLI11 subcommand and options and returns a
// Command whose run() main calls after a successful parse. Usage errors found after
// parsing (a value CLI11 cannot judge) are thrown as UsageError and end as one line
// on stderr with exit code 2, like CLI11's own parse errors; any other exception is
// a failure: one line, exit code 1.
#pragma once

#include <CLI/CLI.hpp>
#include <functional>
#include <stdexcept>
#include <string>

#include "attn/atomic_file.h"

namespace attn::cli {

struct Command {
  CLI::App* app = nullptr;   // the parsed subcommand
  std::function<int()> run;  // returns the exit code
};

class UsageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Every file the subcommands write goes through attn::io's atomic writer
// (attn/atomic_file.h: temporary file, fsync, rename, fsync of the folder).
using io::write_file_atomically;

}  // namespace attn::cli
