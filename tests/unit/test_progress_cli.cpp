// The one progress display of the long commands (tools/attn/progress.h) as a
// user meets it: attn prepare and attn train --recipe book-ch5 on a pipe (plain
// lines on stderr, the last one at 100%), in a pseudo-terminal (script(1): a
// bar redrawn with \r and ESC[K, a rate and an ETA), and with --quiet (nothing
// on stderr). stdout is the same in every case.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "attn/atomic_file.h"
#include "cli.h"
#include "pictures.h"

namespace {

using attn::test::run_cli;
using attn::test::temp_path;

// A text of `bytes` bytes of The Verdict, repeated.
std::string verdict_text(size_t bytes) {
  const std::string verdict =
      attn::test::read_text(std::string(ATTN_DATA_DIR) + "/the-verdict.txt");
  std::string text;
  while (text.size() < bytes) text += verdict;
  text.resize(bytes);
  return text;
}

TEST(ProgressCli, PrepareShowsLinesABarOrNothing) {
  ATTN_REQUIRE_CLI();
  const std::string in = temp_path("corpus.txt");
  attn::io::write_file_atomically(in, verdict_text(300000));
  // A pipe: the last line, at 100% (0.3 of 0.3 MB).
  const std::string out = temp_path("shards");
  const auto piped = run_cli("prepare --tokenizer gpt2 '" + in + "' --out '" + out + "'");
  ASSERT_EQ(piped.exit_code, 0) << piped.err;
  EXPECT_EQ(piped.err.rfind("prepare: 0.3/0.3 MB (100%), ", 0), 0u) << piped.err;
  EXPECT_EQ(piped.err.find('\x1b'), std::string::npos) << piped.err;
  EXPECT_NE(piped.out.find("attn prepare: 1 file -> "), std::string::npos) << piped.out;
  // --quiet: nothing on stderr, the same summary on stdout.
  const std::string quiet_out = temp_path("shards");
  const auto quiet = run_cli("prepare --tokenizer gpt2 -q '" + in + "' --out '" + quiet_out + "'");
  ASSERT_EQ(quiet.exit_code, 0) << quiet.err;
  EXPECT_EQ(quiet.err, "");
  EXPECT_NE(quiet.out.find("attn prepare: 1 file -> "), std::string::npos) << quiet.out;
  // A terminal: the bar, redrawn in place, with its rate.
  const std::string tty_out = temp_path("shards");
  std::string tty;
  ASSERT_EQ(attn::test::run_shell("env -u CI TERM=xterm script -qec \"'" +
                                      std::string(ATTN_CLI_PATH) + "' prepare --tokenizer gpt2 '" +
                                      in + "' --out '" + tty_out + "'\" /dev/null",
                                  &tty),
            0)
      << tty;
  EXPECT_NE(tty.find("\r\x1b[Kprepare [########################] 0.3/0.3 MB  "), std::string::npos)
      << tty;
  EXPECT_NE(tty.find(" MB/s"), std::string::npos) << tty;
  for (const auto& dir : {out, quiet_out, tty_out}) std::filesystem::remove_all(dir);
  std::filesystem::remove(in);
}

TEST(ProgressCli, BookRecipeShowsLinesOrNothing) {
  ATTN_REQUIRE_CLI();
  const std::string text = temp_path("verdict.txt");
  attn::io::write_file_atomically(text, verdict_text(3000));
  const std::string flags =
      " --n-layers 1 --n-heads 2 --emb-dim 16 --context-length 32 --stride 32 --epochs 1 "
      "--eval-iters 2 -t 1";
  const std::string a = temp_path("run"), b = temp_path("run");
  const auto lines =
      run_cli("train --recipe book-ch5 --text '" + text + "' --out '" + a + "'" + flags);
  ASSERT_EQ(lines.exit_code, 0) << lines.err;
  const auto err = attn::test::lines_of(lines.err);
  ASSERT_FALSE(err.empty());
  EXPECT_NE(err.back().find(" steps (100%), "), std::string::npos) << lines.err;
  EXPECT_EQ(err.back().rfind("train: ", 0), 0u) << lines.err;
  EXPECT_NE(err.back().find(", loss "), std::string::npos) << lines.err;
  const auto quiet =
      run_cli("train --recipe book-ch5 -q --text '" + text + "' --out '" + b + "'" + flags);
  ASSERT_EQ(quiet.exit_code, 0) << quiet.err;
  EXPECT_EQ(quiet.err, "");
  // The same run, printed the same (the timings aside).
  EXPECT_EQ(attn::test::lines_of(quiet.out).size(), attn::test::lines_of(lines.out).size());
  for (const auto& dir : {a, b}) std::filesystem::remove_all(dir);
  std::filesystem::remove(text);
}

}  // namespace
