// `attn bench --kind decode`: the JSON rows (KV bytes per step, GB/s, their
// share of the read bandwidth), the table, and one-line usage errors that
// name the bad value.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>

#include "cli.h"

using attn::test::lines_of;
using attn::test::run_cli;

namespace {

TEST(BenchDecodeCli, JsonRowsCountTheKvBytes) {
  ATTN_REQUIRE_CLI();
  // A small probe buffer (4 MiB) keeps the test short: the caches cycled
  // through span as much.
  const auto r = run_cli(
      "bench --json --kind decode --cache 300,1k --heads 8 --kv-heads 2 --head-dim 16 "
      "--queries 3 --dtype all --repeats 2 --bandwidth-mib 4");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto rows = nlohmann::json::parse(r.out);
  ASSERT_EQ(rows.size(), 4u);  // two dtypes x two caches
  for (size_t i = 0; i < rows.size(); ++i) {
    const auto& row = rows[i];
    const bool bf16 = i >= 2;
    const int64_t cache = i % 2 == 0 ? 300 : 1024;
    EXPECT_EQ(row["kind"], "decode");
    EXPECT_EQ(row["dtype"], bf16 ? "bfloat16" : "float32");
    EXPECT_EQ(row["cache"], cache);
    EXPECT_EQ(row["heads"], 8);
    EXPECT_EQ(row["kv_heads"], 2);
    EXPECT_EQ(row["queries"], 3);
    // Keys and values of 2 kv heads x cache rows x 16, read once.
    EXPECT_EQ(row["kv_bytes"], 2 * cache * 16 * 2 * (bf16 ? 2 : 4));
    const double median = row["ms_median"], gbs = row["gbs"], bw = row["bandwidth_gbs"];
    EXPECT_GT(median, 0.0);
    EXPECT_LE(double(row["ms_min"]), median);
    EXPECT_NEAR(gbs, double(row["kv_bytes"]) / (median * 1e-3) * 1e-9, 1e-9 * gbs);
    EXPECT_NEAR(double(row["pct_bandwidth"]), 100.0 * gbs / bw, 1e-9 * gbs);
    EXPECT_GE(row["copies"], 1);
  }
}

TEST(BenchDecodeCli, TablePrintsBandwidthAndShare) {
  ATTN_REQUIRE_CLI();
  const auto r = run_cli(
      "bench --kind decode --cache 2k --heads 4 --sliding-window-size 101 --repeats 1 "
      "--bandwidth-mib 4");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("read bandwidth (bw): "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("% bw"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("fp32    1    4    4   64   1    2048    101 "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("bw GB/s"), std::string::npos) << r.out;
}

TEST(BenchDecodeCli, UsageErrorsNameTheValue) {
  ATTN_REQUIRE_CLI();
  struct Case {
    std::string args, message;
  };
  const Case cases[] = {
      {"--kind decode --cache 4x", "bench: --cache takes lengths like 4096 or 4k (>= 1), got '4x'"},
      {"--kind decode --cache 0", "bench: --cache takes lengths like 4096 or 4k (>= 1), got '0'"},
      {"--kind decode --heads 12 --kv-heads 5",
       "bench: --kind decode needs --heads a multiple of --kv-heads, --head-dim >= 1, --batch >= "
       "1 and --queries in 1..16; got heads 12, kv-heads 5, head-dim 64, batch 1, queries 1"},
      {"--kind decode --queries 17",
       "bench: --kind decode needs --heads a multiple of --kv-heads, --head-dim >= 1, --batch >= "
       "1 and --queries in 1..16; got heads 12, kv-heads 12, head-dim 64, batch 1, queries 17"},
      {"--kind decode --cache 8 --queries 9", "bench: --cache 8 is shorter than --queries 9"},
      {"--kind decode,core", "bench: --kind decode runs alone, got 'decode,core'"},
      {"--kind decode --head-dim 0",
       "bench: --head-dim: must be a whole number in 1..65536, got '0'"},
      {"--kind decode --bandwidth-mib 0",
       "bench: --bandwidth-mib: must be a whole number in 1..65536, got '0'"},
  };
  for (const Case& c : cases) {
    const auto r = run_cli("bench " + c.args);
    EXPECT_EQ(r.exit_code, 2) << c.args << "\n" << r.err;
    const auto lines = lines_of(r.err);
    ASSERT_EQ(lines.size(), 1u) << c.args << "\n" << r.err;
    EXPECT_EQ(lines[0], "attn: " + c.message) << c.args;
  }
}

}  // namespace
