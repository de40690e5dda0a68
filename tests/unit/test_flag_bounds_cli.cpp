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
  expect_refused({
      {"bench --tokens 0", "--tokens must be >= 1, got 0"},
      {"bench --tokens 2000000", "--tokens must be at most 1048576, got 2000000"},
      {"bench --batch 65537", "--batch must be at most 65536, got 65537"},
      {"bench --d-model 65537", "--d-model must be at most 65536, got 65537"},
      {"bench --heads 4097", "--heads must be at most 4096, got 4097"},
      {"bench --repeats 1000001", "--repeats must be at most 1000000, got 1000001"},
      {"bench --threads 4097", "--threads must be at most 4096, got 4097"},
      {"bench --sgemm-n 32769", "--sgemm-n must be at most 32768, got 32769"},
      {"bench --memory-tokens 1048577", "--memory-tokens must be at most 1048576, got 1048577"},
      {"bench --kv-heads 4097", "--kv-heads must be at most 4096, got 4097"},
      {"bench --query-tokens 1048577", "--query-tokens must be at most 1048576, got 1048577"},
      {"bench --kind decode --head-dim 65537", "--head-dim must be at most 65536, got 65537"},
      {"bench --kind decode --queries 17", "--queries in 1..16; got heads 12"},
      {"bench --bandwidth-mib 65537", "--bandwidth-mib must be at most 65536, got 65537"},
      {"bench --sliding-window-size 1048577",
       "--sliding-window-size must be at most 1048576, got 1048577"},
      {"bench --kind sdpa-varlen --seqlens 4,2000000",
       "--seqlens holds lengths in 1..1048576, got 2000000"},
      {"bench --softcap nan", "--softcap must be a finite number > 0, got nan"},
      // Sizes each within bounds whose product is not (8 tensors of B·T·D floats).
      {"bench --shapes 8x1048576x768x12",
       "the shape 8x1048576x768x12 would hold about 192 GiB, more than the limit of 64 GiB"},
      {"bench --batch 64 --tokens 1048576 --d-model 4096 --heads 32 --kind sdpa",
       "more than the limit of 64 GiB"},
      // Past the flag's type: CLI11 names the flag and the value (an int), or
      // takes int64's largest (an int64; still refused by the bound).
      {"bench --repeats 3000000000", "--repeats = 3000000000"},
      {"bench --tokens 9223372036854775808", "--tokens must be at most 1048576"},
  });
}

TEST(FlagBoundsCli, PrepareCountsAreBoundedAndNothingIsCreated) {
  ATTN_REQUIRE_CLI();
  const std::string text = attn::test::temp_path("prepare.txt");
  std::ofstream(text) << "Hello world\n";
  const std::string out = attn::test::temp_path("shards");
  const std::string base = "prepare --tokenizer gpt2 '" + text + "' --out '" + out + "' ";
  expect_refused({
      {base + "--shard-tokens 0", "--shard-tokens must be in 1..1073741824, got 0"},
      {base + "--shard-tokens 1073741825",
       "--shard-tokens must be in 1..1073741824, got 1073741825"},
      {base + "--threads -1", "--threads must be in 0..4096, got -1"},
      {base + "--threads 4097", "--threads must be in 0..4096, got 4097"},
      {base + "--shard-tokens 1e9", "--shard-tokens = 1e9"},
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
      {base + "--context 1", "--context must be in 2..64 (the model's context_length), got 1"},
      {base + "--context 65", "--context must be in 2..64 (the model's context_length), got 65"},
      {base + "--context 32 --stride 0", "--stride must be in 1..32 (the context), got 0"},
      {base + "--context 32 --stride 33", "--stride must be in 1..32 (the context), got 33"},
      {base + "--context 99999999999999999999", "--context must be in 2..64"},
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

}  // namespace
