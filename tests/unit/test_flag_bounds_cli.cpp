// Issue 46, numbers at the edges: every numeric flag of attn eval, prepare,
// bench and walkthrough is bounded as it is parsed or before anything is read
// or allocated, refused with one stderr line naming the flag and the value
// (exit code 2), and nothing is created. (train's and generate's flags:
// TrainCli.SizesAtTheEdgesAreRefusedAsParsed in test_train.cpp.)
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "cli.h"

namespace {

using attn::test::lines_of;
using attn::test::run_cli_capped;

struct Case {
  std::string args, needle;
};

void expect_refused(const std::vector<Case>& cases) {
  for (const Case& c : cases) {
    const auto r = run_cli_capped(c.args);  // 4 GiB: a bound that failed would not take the machine
    EXPECT_EQ(r.exit_code, 2) << c.args << "\n" << r.err;
    EXPECT_EQ(lines_of(r.err).size(), 1u) << c.args << "\n" << r.err;
    EXPECT_NE(r.err.find(c.needle), std::string::npos) << c.needle << " not in: " << r.err;
    EXPECT_TRUE(r.out.empty()) << c.args << "\n" << r.out;
  }
}

TEST(FlagBoundsCli, BenchSizesAreBoundedBeforeAnythingRuns) {
  ATTN_REQUIRE_CLI();
  const auto range = [](const std::string& flag, const std::string& min_max,
                        const std::string& typed) {
    return "bench: " + flag + ": must be a whole number in " + min_max + ", got '" + typed + "'";
  };
  expect_refused({
      {"bench --tokens 0", range("--tokens", "1..1048576", "0")},
      {"bench --tokens 2000000", range("--tokens", "1..1048576", "2000000")},
      {"bench --batch 65537", range("--batch", "1..65536", "65537")},
      {"bench --d-model 65537", range("--d-model", "1..65536", "65537")},
      {"bench --heads 4097", range("--heads", "1..4096", "4097")},
      {"bench --repeats 1000001", range("--repeats", "1..1000000", "1000001")},
      {"bench --threads 4097", range("--threads", "1..4096", "4097")},
      {"bench --sgemm-n 32769", range("--sgemm-n", "1..32768", "32769")},
      {"bench --memory-tokens 1048577", range("--memory-tokens", "1..1048576", "1048577")},
      {"bench --kv-heads 4097", range("--kv-heads", "1..4096", "4097")},
      {"bench --query-tokens 1048577", range("--query-tokens", "1..1048576", "1048577")},
      {"bench --kind decode --head-dim 65537", range("--head-dim", "1..65536", "65537")},
      {"bench --kind decode --queries 17", "--queries in 1..16; got heads 12"},
      {"bench --bandwidth-mib 65537", range("--bandwidth-mib", "1..65536", "65537")},
      {"bench --sliding-window-size 1048577",
       range("--sliding-window-size", "1..1048576", "1048577")},
      {"bench --kind sdpa-varlen --seqlens 4,2000000", range("--seqlens", "1..1048576", "2000000")},
      {"bench --softcap nan", "--softcap must be a finite number > 0, got nan"},
      // Sizes each within bounds whose product is not (8 tensors of B·T·D floats).
      {"bench --shapes 8x1048576x768x12",
       "the shape 8x1048576x768x12 would hold about 192 GiB, more than the limit of 64 GiB"},
      {"bench --batch 64 --tokens 1048576 --d-model 4096 --heads 32 --kind sdpa",
       "more than the limit of 64 GiB"},
      // Past the flag's type (int for --repeats, int64 for --tokens, a list's entry): the
      // text as typed and the flag's range (CLI11 alone made --tokens int64's largest).
      {"bench --repeats 3000000000", range("--repeats", "1..1000000", "3000000000")},
      {"bench --tokens 9223372036854775808",
       range("--tokens", "1..1048576", "9223372036854775808")},
      {"bench --tokens 18446744073709551616",
       range("--tokens", "1..1048576", "18446744073709551616")},
      {"bench --tokens 0x400", range("--tokens", "1..1048576", "0x400")},
      {"bench --kind sdpa-varlen --seqlens 4,-9223372036854775809",
       range("--seqlens", "1..1048576", "-9223372036854775809")},
      // A number of the type with no range of its own: the type's range.
      {"bench --kind decode --queries 9223372036854775808",
       "bench: --queries: must be a whole number in -9223372036854775808..9223372036854775807, "
       "got '9223372036854775808'"},
  });
}

TEST(FlagBoundsCli, PrepareCountsAreBoundedAndNothingIsCreated) {
  ATTN_REQUIRE_CLI();
  const std::string text = attn::test::temp_path("prepare.txt");
  std::ofstream(text) << "Hello world\n";
  const std::string out = attn::test::temp_path("shards");
  const std::string base = "prepare --tokenizer gpt2 '" + text + "' --out '" + out + "' ";
  expect_refused({
      {base + "--shard-tokens 0",
       "prepare: --shard-tokens: must be a whole number in 1..1073741824, got '0'"},
      {base + "--shard-tokens 1073741825",
       "prepare: --shard-tokens: must be a whole number in 1..1073741824, got '1073741825'"},
      {base + "--threads -1", "prepare: --threads: must be a whole number in 0..4096, got '-1'"},
      {base + "--threads 4097",
       "prepare: --threads: must be a whole number in 0..4096, got '4097'"},
      {base + "--shard-tokens 1e9",
       "prepare: --shard-tokens: must be a whole number in 1..1073741824, got '1e9'"},
      {base + "--shard-tokens 99999999999999999999",
       "prepare: --shard-tokens: must be a whole number in 1..1073741824, got "
       "'99999999999999999999'"},
  });
  EXPECT_FALSE(std::filesystem::exists(out));
  std::filesystem::remove(text);
}

TEST(FlagBoundsCli, EvalWindowIsBoundedByTheModel) {
  ATTN_REQUIRE_CLI();
  const std::string fixtures = std::string(ATTN_TESTS_DIR) + "/fixtures/hf_gpt2";
  const std::string base =
      "eval --model '" + fixtures + "/fp32' --file '" + fixtures + "/eval.txt' ";
  expect_refused({
      // Below any model's window: refused as parsed.
      {base + "--context 1", "eval: --context: must be a whole number in 2..1048576, got '1'"},
      {base + "--context 65", "--context must be in 2..64 (the model's context_length), got 65"},
      {base + "--context 32 --stride 0",
       "eval: --stride: must be a whole number in 1..1048576, got '0'"},
      {base + "--context 32 --stride 33", "--stride must be in 1..32 (the context), got 33"},
      // Past int64: the text as typed and the range any model allows (the model's own,
      // 2..64 here, is checked when it is read).
      {base + "--context 99999999999999999999",
       "eval: --context: must be a whole number in 2..1048576, got '99999999999999999999'"},
      {base + "--stride -9223372036854775809",
       "eval: --stride: must be a whole number in 1..1048576, got '-9223372036854775809'"},
  });
}

TEST(FlagBoundsCli, WalkthroughChapterEpochsAndSeedAreChecked) {
  ATTN_REQUIRE_CLI();
  expect_refused({
      {"walkthrough --chapter 6", "--chapter"},
      {"walkthrough --chapter 5 --section train --epochs 1001",
       "--epochs must be in 1..1000 (the notebook trains 10), got 1001"},
      {"walkthrough --seed 18446744073709551616",
       "--seed: '18446744073709551616' is not an integer"},
      // The value is escaped, not echoed raw.
      {"walkthrough --seed \"$(printf '1\\033[2J')\"", "--seed: '1\\x1B[2J' is not an integer"},
  });
}

// Every integer flag of every command, given a number past uint64: refused as
// it is parsed (attn::cli::add_option, tools/attn/flag_checks.h) with one line
// naming the flag, a range and the text as typed, where CLI11 alone had made
// it int64's largest value (and a command then named that). The flags with a
// range of their own name it (the other rows of this file and
// TrainCli.SizesAtTheEdgesAreRefusedAsParsed); the rest name their type's,
// and their own range (the model's, another flag's) is checked when the
// command runs.
TEST(FlagBoundsCli, EveryIntegerFlagNamesTheTextPastItsType) {
  ATTN_REQUIRE_CLI();
  const std::string typed = "99999999999999999999";
  for (const std::string flag : {"bench --batch",
                                 "bench --tokens",
                                 "bench --d-model",
                                 "bench --heads",
                                 "bench --repeats",
                                 "bench --threads",
                                 "bench --sgemm-n",
                                 "bench --memory-tokens",
                                 "bench --bandwidth-mib",
                                 "bench --kv-heads",
                                 "bench --query-tokens",
                                 "bench --sliding-window-size",
                                 "bench --head-dim",
                                 "bench --queries",
                                 "bench --seqlens",
                                 "eval --context",
                                 "eval --stride",
                                 "eval -t",
                                 "generate -n",
                                 "generate --top-k",
                                 "generate --seed",
                                 "generate --n-kv-groups",
                                 "generate --sliding-window-size",
                                 "generate --sliding-window-stride",
                                 "generate --repeats",
                                 "generate --prompt-tokens",
                                 "generate -t",
                                 "serve --port",
                                 "serve --parallel",
                                 "serve --ctx-size",
                                 "serve --kv-cache-mb",
                                 "serve --block-size",
                                 "serve --queue-size",
                                 "serve --step-tokens",
                                 "serve --max-body-bytes",
                                 "serve --http-threads",
                                 "serve --timeout",
                                 "serve -t",
                                 "plot attention --layer",
                                 "plot attention -t",
                                 "plot mask --tq",
                                 "plot mask --tk",
                                 "plot mask --sliding-window-size",
                                 "plot mask --heads",
                                 "plot mask --kv-heads",
                                 "plot mask --seqlens",
                                 "walkthrough --chapter",
                                 "walkthrough --epochs",
                                 "walkthrough -t",
                                 "prepare --shard-tokens",
                                 "prepare -t",
                                 "train -t",
                                 "train --seed",
                                 "train --n-layers",
                                 "train --n-heads",
                                 "train --emb-dim",
                                 "train --head-dim",
                                 "train --ffn-dim",
                                 "train --context-length",
                                 "train --batch-size",
                                 "train --grad-accum-steps",
                                 "train --max-iters",
                                 "train --warmup-iters",
                                 "train --eval-interval",
                                 "train --eval-iters",
                                 "train --epochs",
                                 "train --stride",
                                 "train --latent-dim",
                                 "train --sliding-window-size",
                                 "train --sliding-window-stride",
                                 "train --n-kv-groups"}) {
    const auto r = run_cli_capped(flag + " " + typed);
    EXPECT_EQ(r.exit_code, 2) << flag << "\n" << r.err;
    EXPECT_EQ(lines_of(r.err).size(), 1u) << flag << "\n" << r.err;
    EXPECT_TRUE(r.out.empty()) << flag << "\n" << r.out;
    // "-t" and "-n" are named by their long names.
    const std::string name = flag.substr(flag.rfind(' ') + 1);
    const std::string long_name = name == "-t"   ? "--threads"
                                  : name == "-n" ? "--max-new-tokens"
                                                 : name;
    EXPECT_NE(r.err.find(long_name + ": must be a whole number in "), std::string::npos)
        << flag << "\n"
        << r.err;
    EXPECT_NE(r.err.find(", got '" + typed + "'\n"), std::string::npos) << flag << "\n" << r.err;
  }
  // serve's ranges as they are parsed; a flag whose range is checked when its command
  // runs refuses what is not a number of its type by the type's range.
  expect_refused({
      {"serve --model x --port 65536",
       "serve: --port: must be a whole number in 0..65535, got '65536'"},
      {"serve --model x --parallel 0",
       "serve: --parallel: must be a whole number in 1..1024, got '0'"},
      {"serve --model x --block-size 1025",
       "serve: --block-size: must be a whole number in 1..1024, got '1025'"},
      {"serve --model x --queue-size -1",
       "serve: --queue-size: must be a whole number in 0..9223372036854775807, got '-1'"},
      {"serve --model x --max-body-bytes 1023",
       "serve: --max-body-bytes: must be a whole number in 1024..9223372036854775807, got '1023'"},
      {"serve --model x --timeout 0",
       "serve: --timeout: must be a whole number in 1..2147483647, got '0'"},
      {"generate --config 124m --benchmark -t 4097",
       "generate: --threads: must be a whole number in 1..4096, got '4097'"},
      {"plot mask --tq 0x10 --out x.svg",
       "--tq: must be a whole number in -9223372036854775808..9223372036854775807, got '0x10'"},
      {"walkthrough --chapter 2147483648",
       "--chapter: must be a whole number in -2147483648..2147483647, got '2147483648'"},
  });
}

}  // namespace
