// main.cpp - the `attn` command line: parses, dispatches to one subcommand, and
// turns every error into one line on stderr.
//
// Exit codes: 0 success (and --help, --version, and `attn` alone, which prints
// the help); 1 the command failed; 2 a usage error (unknown command, option or
// value). Help goes to stdout. An error is one line, "attn: COMMAND: ...".
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <omp.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <exception>
#include <iostream>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "about.h"
#include "attn/attn.h"
#include "attn/gemm.h"
#include "attn/kernels.h"
#include "attn/utf8.h"
#include "bench.h"
#include "command.h"
#include "eval.h"
#include "export.h"
#include "flag_checks.h"
#include "generate_command.h"
#include "inspect.h"
#include "omp_policy.h"
#include "plot.h"
#include "prepare.h"
#include "serve_command.h"
#include "tokenize.h"
#include "train_command.h"
#include "walkthrough.h"

namespace {

constexpr int kFailure = 1;
constexpr int kUsage = 2;

// An error here is always one line, and carries no raw bytes from the input:
// CLI11's messages may span lines and quote a command-line value as given, and
// a library message may quote a file's bytes. Line breaks become spaces, then
// attn::printable escapes every control character and every byte that is not
// valid UTF-8 (\xFF).
std::string one_line(std::string message) {
  for (char& c : message) {
    if (c == '\n' || c == '\r') c = ' ';
  }
  while (!message.empty() && message.back() == ' ') message.pop_back();
  return attn::printable(message, 4096);
}

int fail(int code, const std::string& message) {
  std::cerr << "attn: " << one_line(message) << std::endl;
  return code;
}

// The message of a failed command, as the user reads it: "NAME: what went
// wrong", the command named once, and no library function's qualified name
// ("Tokenizer::encode_parallel: invalid UTF-8 ..." is "invalid UTF-8 ..."): a
// leading "A::b: " is the library's bookkeeping, not the user's. Names without
// "::" ("MultiHeadAttention: d_out ...") name a module, and stay.
std::string command_message(const std::string& name, std::string_view message) {
  const std::string prefix = name + ": ";
  if (message.substr(0, prefix.size()) == prefix) message.remove_prefix(prefix.size());
  while (true) {
    const size_t colon = message.find(": ");
    if (colon == std::string_view::npos) break;
    const std::string_view head = message.substr(0, colon);
    const bool identifier = std::all_of(head.begin(), head.end(), [](char c) {
      return std::isalnum(static_cast<unsigned char>(c)) != 0 || c == '_' || c == ':';
    });
    if (!identifier || head.find("::") == std::string_view::npos || head.front() == ':') break;
    message.remove_prefix(colon + 2);
  }
  return prefix + std::string(message);
}

// The command the user typed (the top-level one, "plot" for "plot loss"), or
// "" when none was reached.
std::string typed_command(const CLI::App& app) {
  const auto parsed = app.get_subcommands();
  return parsed.empty() ? std::string() : parsed.front()->get_name();
}

std::string command_names(const std::vector<attn::cli::Command>& commands) {
  std::vector<std::string> names;
  for (const auto& c : commands) names.push_back(c.app->get_name());
  return fmt::format("{}", fmt::join(names, ", "));
}

}  // namespace

int main(int argc, char** argv) {
  // Bounded OpenMP spinning (omp_policy.h): may execute this binary again, once.
  attn::cli::apply_omp_policy(argv);
  CLI::App app{
      "attn: the attention mechanisms of GPT-style models as readable C++, printing the same "
      "numbers PyTorch 1.13 prints for the same seed.",
      "attn"};
  // The version, the commit, and what the build has (about.h); its first line
  // is "attn VERSION (commit HASH)".
  app.set_version_flag("--version", [] {
    std::string text = attn::cli::version_text();
    if (!text.empty() && text.back() == '\n') text.pop_back();
    return text;
  });
  app.require_subcommand(1);
  app.footer("Run 'attn COMMAND --help' for the options of a command.");
  // The bash completion script, generated from the commands below (installed
  // as share/bash-completion/completions/attn).
  app.add_option_function<std::string>(
         "--completion",
         [&app](const std::string& shell) {
           if (shell != "bash") {
             throw CLI::ValidationError("--completion",
                                        "only 'bash' is supported, not '" + shell + "'");
           }
           std::cout << attn::cli::bash_completion(app);
           throw CLI::Success();
         },
         "Print a completion script for SHELL (bash) and exit")
      ->type_name("SHELL");

  std::vector<attn::cli::Command> commands;
  commands.push_back(attn::cli::add_walkthrough_command(app));
  commands.push_back(attn::cli::add_bench_command(app));
  commands.push_back(attn::cli::add_inspect_command(app));
  commands.push_back(attn::cli::add_plot_command(app));
  commands.push_back(attn::cli::add_generate_command(app));
  commands.push_back(attn::cli::add_train_command(app));
  commands.push_back(attn::cli::add_tokenize_command(app));
  commands.push_back(attn::cli::add_prepare_command(app));
  commands.push_back(attn::cli::add_export_command(app));
  commands.push_back(attn::cli::add_eval_command(app));
  commands.push_back(attn::cli::add_serve_command(app));

  // -t/--threads on every command that computes, as llama.cpp spells it:
  // train, prepare and bench have their own; the others take OpenMP's and the
  // BLAS's thread count here (as train's --threads sets them).
  std::optional<int> threads;
  for (const char* path : {"walkthrough", "generate", "eval", "serve", "plot attention"}) {
    CLI::App* cmd = &app;
    for (const auto& name : CLI::detail::split(path, ' ')) cmd = cmd->get_subcommand(name);
    attn::cli::add_option(cmd, "-t,--threads", threads,
                          "OpenMP and BLAS threads (default: OMP_NUM_THREADS, else every core)")
        ->type_name("N");
    attn::cli::in_range(cmd->get_option("--threads"), 1, 4096);
  }

  // `attn` alone: the help, as git and cargo print it, and success.
  if (argc == 1) {
    std::cout << app.help();
    return std::cout ? 0 : kFailure;
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForVersion& e) {
    std::cout << e.what() << std::endl;
    return 0;
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help: to stdout, exit 0
    const bool no_command = app.get_subcommands().empty();
    if (no_command && !app.remaining().empty()) {
      return fail(kUsage, fmt::format("unknown command '{}' (known: {})", app.remaining().front(),
                                      command_names(commands)));
    }
    if (no_command && dynamic_cast<const CLI::RequiredError*>(&e) != nullptr) {
      return fail(kUsage, fmt::format("no command given (known: {}); see 'attn --help'",
                                      command_names(commands)));
    }
    const std::string name = typed_command(app);
    return fail(kUsage, name.empty() ? std::string(e.what()) : command_message(name, e.what()));
  }

  // The paths forced by the environment (ATTN_SIMD_TARGET, ATTN_BF16_PATH,
  // ATTN_GEMV_BF16_PATH, ATTN_GEMM_ENGINE, ATTN_BF16_GEMM; attn bench --help): an
  // unknown name is a usage error.
  try {
    attn::kernels::apply_path_environment();
    const char* engine = std::getenv("ATTN_GEMM_ENGINE");
    if (engine != nullptr && *engine != '\0') attn::gemm::fast_gemm_engine();
    const char* bf16_route = std::getenv("ATTN_BF16_GEMM");
    if (bf16_route != nullptr && *bf16_route != '\0') attn::gemm::gemm_bf16_route();
  } catch (const std::invalid_argument& e) {
    return fail(kUsage, e.what());
  }

  for (const auto& command : commands) {
    if (!command.app->parsed()) continue;
    try {
      if (threads) {
        omp_set_num_threads(*threads);
        attn::gemm::set_blas_threads(*threads);
      }
      return command.run();
    } catch (const attn::cli::UsageError& e) {
      return fail(kUsage, command_message(command.app->get_name(), e.what()));
    } catch (const std::exception& e) {
      return fail(kFailure, command_message(command.app->get_name(), e.what()));
    }
  }
  return fail(kUsage, "no command given; see 'attn --help'");
}
