// `attn bench` as scripts meet it: the JSON rows bench/compare_torch.py reads,
// the table's columns, and one-line usage errors that name the bad value.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "cli.h"

using attn::test::lines_of;
using attn::test::run_cli;
using attn::test::ScopedEnv;

namespace {

TEST(BenchCli, JsonRowsHaveTheFieldsCompareTorchReads) {
  ATTN_REQUIRE_CLI();
  for (const std::string kind : {"core", "module", "sdpa"}) {
    const auto r = run_cli("bench --json --kind " + kind +
                           " --batch 2 --tokens 33 --d-model 48 --heads 3 --mode fwdbwd "
                           "--repeats 2");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const auto rows = nlohmann::json::parse(r.out);
    ASSERT_TRUE(rows.is_array());
    ASSERT_EQ(rows.size(), 1u);
    const auto& row = rows[0];
    EXPECT_EQ(row["kind"], kind);
    EXPECT_EQ(row["mode"], "fwdbwd");
    EXPECT_EQ(row["B"], 2);
    EXPECT_EQ(row["T"], 33);
    EXPECT_EQ(row["head_dim"], 16);
    EXPECT_EQ(row["backend"], "fused");
    const double median = row["ms_median"], min = row["ms_min"];
    EXPECT_GT(median, 0.0);
    EXPECT_LE(min, median);
    EXPECT_TRUE(row["pct_sgemm"].is_null());  // --json skips sgemm unless --sgemm
    EXPECT_TRUE(row["pct_peak"].is_null());   // and the FMA peak
    // It says so, with the peaks' keys there and null (nothing stands in for them).
    EXPECT_FALSE(row["machine"]["peaks_measured"].get<bool>()) << row["machine"];
    for (const char* key : {"clock_ghz", "fma_peak", "bf16_dot_peak", "amx_bf16_peak"})
      EXPECT_TRUE(row["machine"].contains(key) && row["machine"][key].is_null()) << key;
    // FLOPs: module fwd+bwd = 3 × projections + 3.5 × causal core forward.
    const double B = 2, T = 33, d = 48;
    const double core = 4.0 * B * T * T * d / 2.0;
    const double expected =
        kind != "module" ? 3.5 * core : 3.0 * 4.0 * 2.0 * B * T * d * d + 3.5 * core;
    EXPECT_NEAR(double(row["flops"]), expected, 1e-6 * expected);
  }
}

// A windowed sdpa row counts the pairs of its band: Σ_i min(i + 1, W) for
// --sliding-window-size W (each query sees itself and the W - 1 keys before it).
TEST(BenchCli, SdpaWindowCountsTheBandsPairs) {
  ATTN_REQUIRE_CLI();
  const auto r = run_cli(
      "bench --json --kind sdpa --sliding-window-size 6 --shapes 2x33x48x3 --mode fwd --repeats 1");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto rows = nlohmann::json::parse(r.out);
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_EQ(rows[0]["sliding_window_size"], 6);
  EXPECT_EQ(rows[0]["backend"], "fused w6");
  double pairs = 0;
  for (int i = 0; i < 33; ++i) pairs += std::min(i + 1, 6);
  const double expected = 4.0 * 2 * pairs * 48;
  EXPECT_NEAR(double(rows[0]["flops"]), expected, 1e-9 * expected);
}

// The SDPA table's cases: the causal square counts the core's T²/2 (as is_causal
// or as a dense mask; GQA counts the query heads), Tq queries against T keys
// count their pairs: Tq·T without a mask, the band's with is_causal.
TEST(BenchCli, SdpaCasesCountTheirPairs) {
  ATTN_REQUIRE_CLI();
  struct Case {
    std::string flags, backend;
    double pairs;
  };
  for (const auto& c : {Case{"--mask bool", "fused bool-mask", 33.0 * 33 / 2},
                        Case{"--mask float", "fused float-mask", 33.0 * 33 / 2},
                        Case{"--kv-heads 1", "fused gqa1", 33.0 * 33 / 2},
                        Case{"--no-causal --query-tokens 7", "fused full tq7", 7.0 * 33},
                        Case{"--query-tokens 40", "fused tq40", 33.0 * 34 / 2 + 7 * 33}}) {
    const auto r =
        run_cli("bench --json --kind sdpa --shapes 2x33x48x3 --mode fwdbwd --repeats 1 " + c.flags);
    ASSERT_EQ(r.exit_code, 0) << c.flags << "\n" << r.err;
    const auto rows = nlohmann::json::parse(r.out);
    ASSERT_EQ(rows.size(), 1u);
    EXPECT_EQ(rows[0]["backend"], c.backend) << c.flags;
    if (c.backend == "fused gqa1") {
      EXPECT_EQ(rows[0]["kv_heads"], 1);
    }
    const double expected = 3.5 * 4.0 * 2 * c.pairs * 48;
    EXPECT_NEAR(double(rows[0]["flops"]), expected, 1e-9 * expected) << c.flags;
  }
}

// --kind sdpa --dtype bfloat16 times the bf16 tensors; the row names the path that ran:
// the AMX kernel where that is the bf16 path and the call its problem (square
// causal here), else the sdpa kernel on VDPBF16PS where the path is
// AVX512-BF16 (a window too: every call), else bf16 tiles widened to fp32 (as
// with the widened path forced, or a window on AMX without the dot engine).
TEST(BenchCli, SdpaRunsInBfloat16AndNamesItsPath) {
  ATTN_REQUIRE_CLI();
  const std::string cmd =
      "bench --json --kind sdpa --dtype bf16 --shapes 1x40x32x2 --mode fwdbwd --repeats 1";
  const auto r = run_cli(cmd);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto rows = nlohmann::json::parse(r.out);
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_EQ(rows[0]["dtype"], "bfloat16");
  const std::string core = rows[0]["machine"]["bf16_path"];
  EXPECT_EQ(rows[0]["backend"], core == "AMX"           ? "fused-amx"
                                : core == "AVX512-BF16" ? "fused-bf16dot"
                                                        : "fused-wide");
  EXPECT_EQ(rows[0]["bf16_path"], core == "widened to fp32" ? "bf16 tiles widened to fp32" : core);
  {  // a window: the sdpa kernel, on its dot engine where the path is AVX512-BF16
    const auto w = run_cli(cmd + " --sliding-window-size 9");
    ASSERT_EQ(w.exit_code, 0) << w.err;
    const auto wrows = nlohmann::json::parse(w.out);
    ASSERT_EQ(wrows.size(), 1u);
    const std::string path = wrows[0]["bf16_path"];
    if (core == "AVX512-BF16") {
      EXPECT_EQ(path, "AVX512-BF16");
    }
    if (core == "widened to fp32") {
      EXPECT_EQ(path, "bf16 tiles widened to fp32");
    }
    EXPECT_EQ(wrows[0]["backend"], path == "AVX512-BF16" ? "fused-bf16dot w9" : "fused-wide w9");
  }
  {
    const auto w = run_cli(cmd + " --bf16-path 'widened to fp32'");
    ASSERT_EQ(w.exit_code, 0) << w.err;
    const auto wrows = nlohmann::json::parse(w.out);
    ASSERT_EQ(wrows.size(), 1u);
    EXPECT_EQ(wrows[0]["backend"], "fused-wide");
    EXPECT_EQ(wrows[0]["bf16_path"], "bf16 tiles widened to fp32");
  }
}

// An sdpa-varlen row: one packed batch of the --seqlens lengths; its FLOPs are
// the sum of each sequence's causal pairs; without --seqlens, the shape's B of T.
TEST(BenchCli, SdpaVarlenCountsEachSequencesPairs) {
  ATTN_REQUIRE_CLI();
  const auto r = run_cli(
      "bench --json --kind sdpa-varlen --seqlens 7,33,1,20 --shapes 1x8x48x3 --mode fwdbwd "
      "--repeats 1");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto rows = nlohmann::json::parse(r.out);
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_EQ(rows[0]["kind"], "sdpa-varlen");
  EXPECT_EQ(rows[0]["shape"], "4s61x48x3");
  EXPECT_EQ(rows[0]["seqlens"], nlohmann::json::array({7, 33, 1, 20}));
  double pairs = 0;
  for (double T : {7.0, 33.0, 1.0, 20.0}) pairs += T * T / 2.0;
  const double expected = 3.5 * 4.0 * pairs * 48;
  EXPECT_NEAR(double(rows[0]["flops"]), expected, 1e-9 * expected);
  const auto same =
      run_cli("bench --json --kind sdpa,sdpa-varlen --shapes 2x33x48x3 --mode fwd --repeats 1");
  ASSERT_EQ(same.exit_code, 0) << same.err;
  const auto both = nlohmann::json::parse(same.out);
  ASSERT_EQ(both.size(), 2u);
  EXPECT_EQ(both[1]["shape"], "2s66x48x3");
  EXPECT_EQ(both[0]["flops"], both[1]["flops"]);
}

// --kind sdpa-varlen --dtype bfloat16 times bf16 packed tensors, on the sdpa
// kernel's bf16 engine: VDPBF16PS where the bf16 path is AVX512-BF16, else
// widened tiles; --alibi and --softcap put their score modifiers on the rows.
TEST(BenchCli, SdpaVarlenRunsInBfloat16AndNamesItsPath) {
  ATTN_REQUIRE_CLI();
  const auto r = run_cli(
      "bench --json --kind sdpa-varlen --dtype bfloat16 --seqlens 9,40,1 --shapes 1x8x32x2 "
      "--mode fwdbwd --repeats 1 --alibi --softcap 30");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto rows = nlohmann::json::parse(r.out);
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_EQ(rows[0]["kind"], "sdpa-varlen");
  EXPECT_EQ(rows[0]["dtype"], "bfloat16");
  const std::string path = rows[0]["bf16_path"];
  if (rows[0]["machine"]["bf16_path"] == "AVX512-BF16") {
    EXPECT_EQ(path, "AVX512-BF16");
  }
  if (rows[0]["machine"]["bf16_path"] == "widened to fp32") {
    EXPECT_EQ(path, "bf16 tiles widened to fp32");
  }
  EXPECT_EQ(rows[0]["backend"],
            std::string(path == "AVX512-BF16" ? "fused-bf16dot" : "fused-wide") + " alibi cap30");
  EXPECT_EQ(rows[0]["alibi"], true);
  EXPECT_EQ(rows[0]["softcap"], 30.0);
  EXPECT_EQ(rows[0]["shape"], "3s50x32x2");
  for (const char* bad : {"0", "-1", "inf"}) {
    const auto e = run_cli(std::string("bench --kind sdpa --softcap ") + bad);
    EXPECT_NE(e.exit_code, 0) << bad;
    EXPECT_NE(e.err.find("--softcap must be a finite number > 0"), std::string::npos) << e.err;
  }
}

TEST(BenchCli, SgemmFlagAddsBothYardsticks) {
  ATTN_REQUIRE_CLI();
  const auto r = run_cli(
      "bench --json --sgemm --sgemm-n 64 --kind core --shapes 1x20x32x2 --mode fwd --repeats 1");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto row = nlohmann::json::parse(r.out)[0];
  ASSERT_TRUE(row["pct_sgemm"].is_number()) << r.out;
  ASSERT_TRUE(row["pct_peak"].is_number()) << r.out;
  // Both are the same GFLOP/s over a positive rate.
  EXPECT_GT(double(row["pct_sgemm"]), 0.0);
  EXPECT_GT(double(row["pct_peak"]), 0.0);
  // The peaks came with the machine facts, FLOP/cycle and all.
  const auto m = row["machine"];
  EXPECT_TRUE(m["peaks_measured"].get<bool>()) << m;
  EXPECT_GT(double(m["fma_peak"]["gflops"]), 0.0);
  EXPECT_GT(double(m["clock_ghz"]), 0.0);
  EXPECT_GT(double(m["fma_peak"]["flops_per_cycle"]), 0.0);
}

// --no-probe in the table: sgemm still runs, the peaks do not (about 5 s
// saved), and nothing stands in for them: a note in the header, "-" under
// % peak. (In JSON: BlasPinnedToPrescottLosesTheFastEngine.)
TEST(BenchCli, NoProbeSaysThePeaksWereNotMeasured) {
  ATTN_REQUIRE_CLI();
  const auto t = run_cli(
      "bench --no-probe --sgemm-n 64 --kind core --shapes 1x20x32x2 --mode fwd --repeats 1");
  ASSERT_EQ(t.exit_code, 0) << t.err;
  EXPECT_NE(t.out.find("peaks not measured (--no-probe)"), std::string::npos) << t.out;
  EXPECT_EQ(t.out.find("core clock "), std::string::npos) << t.out;
  EXPECT_EQ(t.out.find("fp32 FMA peak ("), std::string::npos) << t.out;
  EXPECT_EQ(t.out.find("% of peak"), std::string::npos) << t.out;
  EXPECT_NE(t.out.find("GFLOP/s; % sgemm below is of the faster"), std::string::npos) << t.out;
  bool row_seen = false;
  for (const auto& line : lines_of(t.out)) {
    if (line.find("1x20x32x2") == std::string::npos) continue;
    row_seen = true;
    EXPECT_EQ(line.substr(line.find_last_not_of(' ')), "-") << line;  // % peak
  }
  EXPECT_TRUE(row_seen) << t.out;
  EXPECT_NE(run_cli("bench --help").out.find("--no-probe"), std::string::npos);
}

TEST(BenchCli, ReferenceBackendIsTimedWhenAskedFor) {
  ATTN_REQUIRE_CLI();
  const auto r = run_cli(
      "bench --json --kind module --backend reference --shapes 1x20x32x2 --mode fwd --repeats 1");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(nlohmann::json::parse(r.out)[0]["backend"], "reference");
}

TEST(BenchCli, TablePrintsEveryCaseAndTheFormula) {
  ATTN_REQUIRE_CLI();
  const auto r = run_cli("bench --shapes 1x40x32x2 --repeats 1 --sgemm-n 128");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  int rows = 0;
  for (const auto& line : lines_of(r.out)) {
    if (line.find("1x40x32x2") != std::string::npos) ++rows;
  }
  EXPECT_EQ(rows, 4) << r.out;  // core and module, fwd and fwdbwd
  EXPECT_NE(r.out.find("% sgemm"), std::string::npos);
  EXPECT_NE(r.out.find("% peak"), std::string::npos);
  EXPECT_NE(r.out.find("fp32 FMA peak"), std::string::npos);
  EXPECT_NE(r.out.find("4*B*H*T^2*hd/2"), std::string::npos);
  // The header names the CPU, the clock, the peaks per cycle and every path.
  for (const char* part :
       {"core clock ", " GHz", "FLOP/cycle/core", "SIMD target ", "paths: flash kernel ",
        "bf16 attention ", "sdpa bf16 ", "decode gemv bf16 ", "gemm: fast engine ", "; BLAS ",
        "bf16 gemm ", "AMX bf16 peak", "bf16 dot-product peak"})
    EXPECT_NE(r.out.find(part), std::string::npos) << part << "\n" << r.out;
}

TEST(BenchCli, BadValuesAreOneLineUsageErrors) {
  ATTN_REQUIRE_CLI();
  struct Case {
    std::string args, message;
  };
  for (const auto& c :
       {Case{"bench --kind nosuch",
             "--kind must be core, module, sdpa, sdpa-varlen or all, got 'nosuch'"},
        Case{"bench --mode back", "--mode must be fwd, fwdbwd or all, got 'back'"},
        Case{"bench --shapes 1x2x3", "a shape is BxTxDxH, e.g. 1x1024x768x12; got '1x2x3'"},
        Case{"bench --shapes 1x8x10x3",
             "d_model divisible by heads, got B=1 T=8 d_model=10 heads=3"},
        Case{"bench --backend gpu", "--backend must be auto, reference or fused, got 'gpu'"},
        Case{"bench --threads -3", "bench: --threads: must be a whole number in 1..4096, got '-3'"},
        Case{"bench --kind core,sdpa,gpu",
             "--kind must be core, module, sdpa, sdpa-varlen or all, got 'core,sdpa,gpu'"},
        Case{"bench --kind sdpa --dtype float16",
             "bench: --dtype must be float32, bfloat16 or all, got 'float16'"},
        Case{"bench --kind sdpa --sliding-window-size 0",
             "bench: --sliding-window-size: must be a whole number in 1..1048576, got '0'"},
        Case{"bench --kind sdpa --mask soft",
             "bench: --mask must be bool, float or padded, got 'soft'"},
        Case{"bench --kind sdpa --kv-heads 5", "bench: --kv-heads must divide --heads 12, got 5"},
        Case{"bench --kind sdpa-varlen --dtype float16",
             "bench: --dtype must be float32, bfloat16 or all, got 'float16'"},
        Case{"bench --kind sdpa-varlen --seqlens 5,0,7",
             "bench: --seqlens: must be a whole number in 1..1048576, got '0'"},
        Case{"bench --kind core --seqlens 5,7",
             "bench: --seqlens applies to --kind sdpa-varlen only"}}) {
    const auto r = run_cli(c.args);
    EXPECT_EQ(r.exit_code, 2) << c.args << "\n" << r.err;
    EXPECT_EQ(r.out, "") << c.args;
    const auto lines = lines_of(r.err);
    ASSERT_EQ(lines.size(), 1u) << c.args << "\n" << r.err;
    EXPECT_NE(lines[0].find(c.message), std::string::npos) << lines[0];
  }
}

// A count of 0 is refused, not read as "use the default" (exit 2, one line
// naming the option and the value), and so is a negative one.
TEST(BenchCli, ZeroCountsAreUsageErrorsNotDefaults) {
  ATTN_REQUIRE_CLI();
  for (const auto& [option, range] :
       {std::pair{"--tokens", "1..1048576"}, std::pair{"--repeats", "1..1000000"},
        std::pair{"--threads", "1..4096"}, std::pair{"--batch", "1..65536"},
        std::pair{"--d-model", "1..65536"}, std::pair{"--heads", "1..4096"},
        std::pair{"--sgemm-n", "1..32768"}, std::pair{"--memory-tokens", "1..1048576"}}) {
    for (const std::string value : {"0", "-1"}) {
      // The rest would be a quick valid run, so only the bad value can fail it.
      const std::string args = "bench --json --kind core --mode fwd --shapes 1x8x16x2 " +
                               std::string(option) + " " + value;
      const auto r = run_cli(args);
      EXPECT_EQ(r.exit_code, 2) << args << "\n" << r.err;
      EXPECT_EQ(r.out, "") << args;
      EXPECT_EQ(r.err, "attn: bench: " + std::string(option) + ": must be a whole number in " +
                           range + ", got '" + value + "'\n")
          << args;
    }
  }
}

TEST(BenchCli, ExplicitCountsAreUsed) {
  // The values that used to be the only way to say "default" must not be
  // confused with it now: --tokens 1, --repeats 1 and --threads 1 run as given.
  ATTN_REQUIRE_CLI();
  const auto r = run_cli(
      "bench --json --kind core --mode fwd --tokens 1 --d-model 16 --heads 2 "
      "--repeats 1 --threads 1");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto row = nlohmann::json::parse(r.out).at(0);
  EXPECT_EQ(row["T"], 1);
  EXPECT_EQ(row["B"], 1);  // not given: the default
  EXPECT_EQ(row["repeats"], 1);
  EXPECT_EQ(row["omp_threads"], 1);
}

// ---- forcing paths: the environment and the flags -------------------------------------

const std::string kTiny = "bench --json --kind core --shapes 1x20x32x2 --mode fwd --repeats 1";

TEST(BenchCli, UnknownForcedPathsAreOneLineUsageErrorsListingTheValidNames) {
  ATTN_REQUIRE_CLI();
  struct Case {
    const char* variable;
    const char* value;
    std::string message;
  };
  for (const auto& c :
       {Case{"ATTN_GEMM_ENGINE", "mkl", "ATTN_GEMM_ENGINE='mkl' is not an engine of this build"},
        Case{"ATTN_SIMD_TARGET", "AVX9", "ATTN_SIMD_TARGET='AVX9' is not a path this CPU can run"},
        Case{"ATTN_BF16_PATH", "fp8", "ATTN_BF16_PATH='fp8' is not a path this CPU can run"},
        Case{"ATTN_GEMV_BF16_PATH", "fp8",
             "ATTN_GEMV_BF16_PATH='fp8' is not a path this CPU can run"},
        Case{"ATTN_BF16_GEMM", "amx", "ATTN_BF16_GEMM='amx' is not a bf16 route of this build"}}) {
    const ScopedEnv env(c.variable, c.value);
    const auto r = run_cli(kTiny);
    EXPECT_EQ(r.exit_code, 2) << c.variable;
    EXPECT_EQ(lines_of(r.err).size(), 1u) << r.err;
    EXPECT_NE(r.err.find(c.message), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("valid: "), std::string::npos) << r.err;
  }
  {
    const ScopedEnv env("ATTN_GEMM_ENGINE", "mkl");
    EXPECT_NE(run_cli(kTiny).err.find("valid: onednn, blas, auto"), std::string::npos);
  }
  for (const std::string flag : {"--target AVX9", "--bf16-path fp8"}) {
    const auto r = run_cli(kTiny + " " + flag);
    EXPECT_EQ(r.exit_code, 2) << flag;
    EXPECT_EQ(lines_of(r.err).size(), 1u) << r.err;
    EXPECT_NE(r.err.find("must be one of"), std::string::npos) << r.err;
  }
}

// Every target this CPU runs can be forced, by flag or by variable, and the
// rows and the machine facts say so.
TEST(BenchCli, ForcedTargetAndBf16PathRun) {
  ATTN_REQUIRE_CLI();
  const auto all = run_cli(kTiny);
  ASSERT_EQ(all.exit_code, 0) << all.err;
  const auto machine = nlohmann::json::parse(all.out)[0]["machine"];
  for (const std::string target : machine["simd_targets"]) {
    const auto by_flag = run_cli(kTiny + " --target " + target);
    ASSERT_EQ(by_flag.exit_code, 0) << by_flag.err;
    EXPECT_EQ(nlohmann::json::parse(by_flag.out)[0]["simd_target"], target);
    const ScopedEnv env("ATTN_SIMD_TARGET", target.c_str());
    const auto by_env = run_cli(kTiny);
    ASSERT_EQ(by_env.exit_code, 0) << by_env.err;
    EXPECT_EQ(nlohmann::json::parse(by_env.out)[0]["machine"]["simd_target"], target);
  }
  {  // the bf16 products' route: the widened one runs everywhere
    const ScopedEnv env("ATTN_BF16_GEMM", "widened");
    const auto r = run_cli(kTiny);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const auto m = nlohmann::json::parse(r.out)[0]["machine"];
    EXPECT_EQ(m["gemm_bf16_route"], "widened");
    EXPECT_EQ(m["gemm_bf16_reason"], "ATTN_BF16_GEMM=widened");
    EXPECT_EQ(m["gemm_bf16"].get<std::string>().rfind("bf16 widened to fp32", 0), 0u);
  }
  for (const std::string path : machine["gemv_bf16_paths"]) {  // the decode GEMV's bf16 path
    const ScopedEnv env("ATTN_GEMV_BF16_PATH", path.c_str());
    const auto r = run_cli(kTiny);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(nlohmann::json::parse(r.out)[0]["machine"]["gemv_bf16_path"], path);
  }
  for (const std::string path : machine["bf16_paths"]) {
    const auto r = run_cli(kTiny + " --dtype bf16 --bf16-path '" + path + "'");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(nlohmann::json::parse(r.out)[0]["bf16_path"], path);
    const ScopedEnv env("ATTN_BF16_PATH", path.c_str());
    const auto e = run_cli(kTiny + " --dtype bf16");
    ASSERT_EQ(e.exit_code, 0) << e.err;
    EXPECT_EQ(nlohmann::json::parse(e.out)[0]["bf16_path"], path);
  }
}

TEST(BenchCli, GemmEngineIsForcedByTheEnvironment) {
  ATTN_REQUIRE_CLI();
  for (const std::string engine : {"onednn", "blas"}) {
    const ScopedEnv env("ATTN_GEMM_ENGINE", engine.c_str());
    const auto r = run_cli(kTiny);
    if (engine == "onednn" && r.exit_code == 2 &&
        r.err.find("not an engine of this build") != std::string::npos)
      continue;  // built without oneDNN
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const auto m = nlohmann::json::parse(r.out)[0]["machine"];
    EXPECT_EQ(m["fast_gemm_engine"], engine);
    EXPECT_EQ(m["fast_gemm_reason"], "ATTN_GEMM_ENGINE=" + engine);
  }
}

// A BLAS pinned to an old core (OpenBLAS's Prescott kernels: SSE3, a fraction
// of an AVX-512 core's peak): the fast engine stays oneDNN and bench names the core.
TEST(BenchCli, BlasPinnedToPrescottLosesTheFastEngine) {
  ATTN_REQUIRE_CLI();
  const ScopedEnv env("OPENBLAS_CORETYPE", "Prescott");
  const auto r = run_cli(kTiny + " --sgemm --no-probe --sgemm-n 256");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto row = nlohmann::json::parse(r.out)[0];
  const auto m = row["machine"];
  // --no-probe: sgemm ran, the peaks did not, and they are null, not estimated.
  EXPECT_GT(double(row["pct_sgemm"]), 0.0) << r.out;
  EXPECT_TRUE(row["pct_peak"].is_null()) << r.out;
  EXPECT_FALSE(m["peaks_measured"].get<bool>()) << m;
  for (const char* key : {"clock_ghz", "fma_peak", "bf16_dot_peak", "amx_bf16_peak"})
    EXPECT_TRUE(m[key].is_null()) << key << ": " << m;
  const std::string blas = m["blas"];
  if (blas.find("OpenBLAS") == std::string::npos) GTEST_SKIP() << "not OpenBLAS: " << blas;
  EXPECT_NE(blas.find("Prescott"), std::string::npos) << blas;
  const auto engines = m["fast_gemm_reason"].get<std::string>();
  if (engines == "built without oneDNN") GTEST_SKIP() << engines;
  EXPECT_EQ(m["fast_gemm_engine"], "onednn") << engines;
  EXPECT_EQ(engines.rfind("oneDNN unless ATTN_GEMM_ENGINE=blas", 0), 0u) << engines;
}

}  // namespace
