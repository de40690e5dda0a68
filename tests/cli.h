// tests/cli.h - running the built `attn` executable (ATTN_CLI_PATH) from a test and
// capturing its exit code, stdout and stderr.
#pragma once

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

namespace attn::test {

struct CliResult {
  int exit_code = -1;  // -1 when the process did not exit normally (a crash)
  std::string out;
  std::string err;
};

inline std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// A fresh path in the test's temporary folder.
// Unique per process even when a pid is reused by a later test process (ctest
// runs thousands, and a test may leave its files behind): pid, a random nonce
// drawn once per process, and a counter.
inline std::string temp_path(const std::string& stem) {
  static std::atomic<int> counter{0};
  static const unsigned nonce = std::random_device{}();
  return ::testing::TempDir() + "attn_" + std::to_string(::getpid()) + "_" + std::to_string(nonce) + "_" +
         std::to_string(counter++) + "_" + stem;
}

// Runs `<prefix>'attn' <args>` through the shell (prefix: shell words before
// the binary, such as a ulimit; args passed as written: quote them yourself).
inline CliResult run_cli_after(const std::string& prefix, const std::string& args) {
  CliResult r;
#ifdef ATTN_CLI_PATH
  const std::string out = temp_path("stdout"), err = temp_path("stderr");
  // (std::string("'") + ... rather than "'" + std::string(...): the latter
  // trips GCC 12's false -Wrestrict warning at -O3.)
  const std::string command =
      prefix + std::string("'") + ATTN_CLI_PATH + "' " + args + " >'" + out + "' 2>'" + err + "'";
  const int status = std::system(command.c_str());
  if (status != -1 && WIFEXITED(status)) r.exit_code = WEXITSTATUS(status);
  r.out = read_text(out);
  r.err = read_text(err);
  std::remove(out.c_str());
  std::remove(err.c_str());
#else
  (void)prefix;
  (void)args;
#endif
  return r;
}

// Runs `attn <args>` through the shell; args are passed as written (quote them yourself).
inline CliResult run_cli(const std::string& args) { return run_cli_after("", args); }

// run_cli under a memory cap for the tests of hostile input (issue 46): the
// `attn` child gets `ulimit -v` (RLIMIT_AS, its address space) of
// max_bytes, 4 GiB by default, so that a regression that allocates without
// bound fails that one test (std::bad_alloc, exit 1) instead of taking the
// machine's memory. Not under AddressSanitizer, whose shadow memory reserves
// terabytes of address space: there the child runs uncapped.
inline CliResult run_cli_capped(const std::string& args, uint64_t max_bytes = uint64_t{4} << 30) {
#if defined(__SANITIZE_ADDRESS__)
  (void)max_bytes;
  return run_cli(args);
#else
  return run_cli_after("ulimit -v " + std::to_string(max_bytes >> 10) + " && ", args);
#endif
}

inline std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

// Sets (or, for nullptr, unsets) an environment variable for the scope, then
// restores what was there; a child `attn` started meanwhile inherits it.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    if (value)
      setenv(name, value, 1);
    else
      unsetenv(name);
  }
  ~ScopedEnv() {
    if (old_)
      setenv(name_.c_str(), old_->c_str(), 1);
    else
      unsetenv(name_.c_str());
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  std::string name_;
  std::optional<std::string> old_;
};
}  // namespace attn::test

// Skips a test when the build has no `attn` executable.
#ifdef ATTN_CLI_PATH
#define ATTN_REQUIRE_CLI() (void)0
#else
#define ATTN_REQUIRE_CLI() GTEST_SKIP() << "built without the attn CLI (ATTN_CLI_PATH unset)"
#endif
