// Issue 46, special files: a directory, /dev/null, /dev/zero or a FIFO given
// where a command reads a file (train --text, tokenize --file, prepare's
// inputs, inspect's safetensors file, plot loss's metrics.jsonl) is refused before it is opened,
// each kind with its own one-line message: no "no such file" for what exists, no empty result, no
// reading /dev/zero until memory runs out, no waiting for ever on a FIFO (the test would time out).
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

#include "cli.h"

namespace {

namespace fs = std::filesystem;

struct Case {
  std::string args;
  int code;
  std::string needle;
};

TEST(SpecialFilesCli, EachKindRefusedByNameWithoutOpeningIt) {
  ATTN_REQUIRE_CLI();
  const std::string dir = attn::test::temp_path("a_dir"), fifo = attn::test::temp_path("a_fifo"),
                    out = attn::test::temp_path("out");
  fs::create_directories(dir);
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  auto q = [](const std::string& s) { return "'" + s + "'"; };
  const std::string model = std::string(ATTN_TESTS_DIR) + "/fixtures/hf_gpt2/fp32";
  const std::vector<Case> cases = {
      {"train --text " + q(dir) + " --out " + q(out), 1,
       "--text '" + dir + "' is a directory, not a regular file"},
      {"train --text /dev/null --out " + q(out), 1,
       "--text '/dev/null' is a character device, not a regular file"},
      {"train --text /dev/zero --out " + q(out), 1, "--text '/dev/zero' is a character device"},
      {"train --text " + q(fifo) + " --out " + q(out), 1,
       "--text '" + fifo + "' is a FIFO (named pipe), not a regular file"},
      {"tokenize --file " + q(dir), 1, "--file '" + dir + "' is a directory, not a regular file"},
      {"tokenize --file " + q(fifo), 1, "--file '" + fifo + "' is a FIFO (named pipe)"},
      {"tokenize --file /dev/zero", 1, "--file '/dev/zero' is a character device"},
      {"inspect " + q(fifo), 1, "not a regular file: a FIFO (named pipe)"},
      {"inspect /dev/zero", 1, "not a regular file: a character device"},
      {"prepare --tokenizer gpt2 " + q(fifo) + " --out " + q(out), 1,
       "input '" + fifo + "' is a FIFO (named pipe), not a regular file"},
      {"prepare --tokenizer gpt2 " + q(dir) + " --out " + q(out), 1,
       "input '" + dir + "' is a directory, not a regular file"},
      {"prepare --tokenizer gpt2 /dev/zero --out " + q(out), 1,
       "input '/dev/zero' is a character device"},
      {"plot loss " + q(fifo) + " --out " + q(out + ".svg"), 1,
       "'" + fifo + "' is a FIFO (named pipe), not a regular file"},
      {"plot loss /dev/zero --out " + q(out + ".svg"), 1,
       "'/dev/zero' is a character device, not a regular file"},
      {"plot loss " + q(dir) + " --out " + q(out + ".svg"), 1,
       "'" + dir + "' is a directory, not a regular file"},
      // The other readers of a text: eval's --file (a FIFO blocked for ever),
      // generate's --prompt-file, and /dev/null as --text and prepare's input.
      {"eval --model " + q(model) + " --file " + q(fifo), 1,
       "--file '" + fifo + "' is a FIFO (named pipe), not a regular file"},
      {"eval --model " + q(model) + " --file /dev/zero", 1,
       "--file '/dev/zero' is a character device, not a regular file"},
      {"eval --model " + q(model) + " --file " + q(dir), 1,
       "--file '" + dir + "' is a directory, not a regular file"},
      {"generate --model " + q(model) + " --prompt-file " + q(fifo), 1,
       "--prompt-file '" + fifo + "' is a FIFO (named pipe), not a regular file"},
      {"generate --model " + q(model) + " --prompt-file /dev/zero", 1,
       "--prompt-file '/dev/zero' is a character device, not a regular file"},
      {"tokenize --file /dev/null", 1, "--file '/dev/null' is a character device"},
      {"prepare --tokenizer gpt2 /dev/null --out " + q(out), 1,
       "input '/dev/null' is a character device"},
  };
  for (const Case& c : cases) {
    const auto r =
        attn::test::run_cli_capped(c.args);  // /dev/zero read whole would not take the machine
    EXPECT_EQ(r.exit_code, c.code) << c.args << "\n" << r.err;
    EXPECT_EQ(r.out, "") << c.args;
    EXPECT_EQ(attn::test::lines_of(r.err).size(), 1u) << c.args << "\n" << r.err;
    EXPECT_NE(r.err.find(c.needle), std::string::npos) << c.needle << " not in: " << r.err;
    EXPECT_FALSE(fs::exists(out)) << c.args << " left --out behind";
    EXPECT_FALSE(fs::exists(out + ".svg")) << c.args << " wrote a picture";
  }
  fs::remove_all(dir);
  fs::remove(fifo);
}

}  // namespace
