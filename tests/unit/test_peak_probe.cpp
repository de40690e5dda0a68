// The machine-peak probes (attn/cpu.h: fma_peak_probe, bf16_dot_peak_probe,
// amx_bf16_peak_probe), the clock they are checked against, and the bf16 path
// rule that compares them. Their logic is tested on given readings (the
// arithmetic of a machine's rate, the verdict from GFLOP/s, threads and clock,
// the path choice from two peaks); the probes themselves only run here and
// report finite figures of the right shape. No test asserts how fast this
// machine is: a busy, throttled or instrumented (sanitizer) machine reads low,
// which is what attn bench's verdict says, not a failure.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <vector>

#include "attn/cpu.h"
#include "attn/kernels.h"
#include "cpu/peak_rate.h"

namespace cpu = attn::cpu;
namespace kn = attn::kernels;

namespace {

// ---- the logic, on given readings --------------------------------------------------------

TEST(PeakProbe, ThreadsAtOnceAreAtMostTheHardwares) {
  EXPECT_EQ(cpu::threads_at_once(4, 2), 2);
  EXPECT_EQ(cpu::threads_at_once(2, 16), 2);
  EXPECT_EQ(cpu::threads_at_once(3, 0), 3);  // hardware unknown
}

// The mean of the threads' rates (FLOPs over their own CPU time) times the
// threads that run at once: time a thread spent descheduled does not count,
// and more threads than cores add nothing.
TEST(PeakProbe, MachineRateIsTheThreadsMeanTimesThoseThatRunAtOnce) {
  EXPECT_DOUBLE_EQ(cpu::machine_gflops(2e9 + 4e9, 2, 2), 6.0);
  EXPECT_DOUBLE_EQ(cpu::machine_gflops(4 * 1e9, 4, 2), 2.0);
  EXPECT_DOUBLE_EQ(cpu::machine_gflops(4 * 1e9, 4, 0), 4.0);
  EXPECT_DOUBLE_EQ(cpu::machine_gflops(0.0, 0, 2), 0.0);
}

struct JudgeCase {
  const char* what;
  double gflops;  // of `running` threads at clock_ghz
  int running;
  double clock_ghz;
  int lanes;
  double per_unit;  // FLOP per cycle of one unit
  std::vector<double> units;
  const char* unit;
  bool plausible;
  double expected_per_cycle;  // 0: not set
  std::string verdict;        // the whole verdict, or its start
};

// The verdict from the readings: FLOP/cycle per thread against the rates the
// vector width allows, plausible from 0.75x the least to 1.1x the most.
TEST(PeakProbe, VerdictFromTheReadings) {
  const std::vector<JudgeCase> cases = {
      {"2 FMA units of 16 lanes", 2 * 3.0 * 64, 2, 3.0, 16, 32, {1, 2}, "FMA unit", true, 64,
       "2 FMA units x 16 lanes"},
      {"1 FMA unit of 8 lanes", 1 * 2.5 * 16, 1, 2.5, 8, 16, {1, 2}, "FMA unit", true, 16,
       "1 FMA unit x 8 lanes"},
      {"just above 0.75 of the least", 2 * 3.0 * 24.5, 2, 3.0, 16, 32, {1, 2}, "FMA unit", true, 32,
       "1 FMA unit x 16 lanes"},
      {"just below 0.75 of the least", 2 * 3.0 * 23.5, 2, 3.0, 16, 32, {1, 2}, "FMA unit", false,
       32, "below the 32 FLOP/cycle of 1 FMA unit"},
      {"below 0.75 of the least", 2 * 3.0 * 20, 2, 3.0, 16, 32, {1, 2}, "FMA unit", false, 32,
       "below the 32 FLOP/cycle of 1 FMA unit: the probe under-reads"},
      {"just below 1.1 of the most", 2 * 3.0 * 70, 2, 3.0, 16, 32, {1, 2}, "FMA unit", true, 64,
       "2 FMA units x 16 lanes"},
      {"just above 1.1 of the most", 2 * 3.0 * 71, 2, 3.0, 16, 32, {1, 2}, "FMA unit", false, 64,
       "above the 64 FLOP/cycle"},
      {"above 1.1 of the most", 2 * 3.0 * 80, 2, 3.0, 16, 32, {1, 2}, "FMA unit", false, 64,
       "above the 64 FLOP/cycle the vector width allows"},
      {"VDPBF16PS at half the FMA's rate", 2 * 2.0 * 32, 2, 2.0, 16, 64, {0.5, 1, 2},
       "VDPBF16PS unit", true, 32,
       "0.5 VDPBF16PS unit x 16 lanes"},
      {"not measured", 0.0, 2, 3.0, 16, 32, {1, 2}, "FMA unit", false, 0, "not measured"},
      {"clock unknown", 100.0, 2, 0.0, 16, 32, {1, 2}, "FMA unit", false, 0, "clock unknown"},
  };
  for (const JudgeCase& c : cases) {
    cpu::PeakProbe p;
    p.gflops = c.gflops;
    p.threads = c.running;
    p.clock_ghz = c.clock_ghz;
    p.lanes = c.lanes;
    cpu::judge_peak_at(p, c.running, c.per_unit, c.units, c.unit);
    EXPECT_EQ(p.plausible, c.plausible) << c.what << ": " << p.verdict;
    EXPECT_EQ(p.verdict.rfind(c.verdict, 0), 0u) << c.what << ": " << p.verdict;
    if (c.expected_per_cycle > 0) {
      EXPECT_DOUBLE_EQ(p.expected_per_cycle, c.expected_per_cycle) << c.what;
      EXPECT_NEAR(p.flops_per_cycle, c.gflops / (c.running * c.clock_ghz), 1e-12) << c.what;
    }
  }
}

// The bf16 attention path's rule: VDPBF16PS first when its peak is at least
// 0.75 of the fp32 FMA peak (AMD Zen 4/5 read about 2x; Intel cores 0.5x).
TEST(PeakProbe, Bf16PathRuleFromTwoPeaks) {
  EXPECT_TRUE(cpu::bf16_dot_beats_fma(460.0, 230.0));   // Zen 4
  EXPECT_FALSE(cpu::bf16_dot_beats_fma(115.0, 230.0));  // an Intel core
  EXPECT_TRUE(cpu::bf16_dot_beats_fma(0.75 * 200.0, 200.0));
  EXPECT_FALSE(cpu::bf16_dot_beats_fma(0.74 * 200.0, 200.0));
  EXPECT_FALSE(cpu::bf16_dot_beats_fma(0.0, 200.0));  // no AVX512-BF16
  EXPECT_FALSE(cpu::bf16_dot_beats_fma(100.0, 0.0));
}

// ---- the probes run: finite figures of the right shape, printed --------------------------

// What every measured probe reports, whatever the machine's load: a finite,
// positive rate, its chains among those swept, a clock, a FLOP/cycle and a
// verdict (plausible or not: a slowed machine reads low).
void expect_reported(const cpu::PeakProbe& p, int chains_min, int chains_max) {
  EXPECT_TRUE(std::isfinite(p.gflops));
  EXPECT_GT(p.gflops, 0.0);
  EXPECT_GE(p.threads, 1);
  EXPECT_GE(p.chains, chains_min);
  EXPECT_LE(p.chains, chains_max);
  EXPECT_TRUE(std::isfinite(p.flops_per_cycle));
  EXPECT_FALSE(p.verdict.empty());
}

TEST(PeakProbe, ClockIsMeasured) {
  const double ghz = cpu::cpu_clock_ghz(3);
  std::printf("core clock: %.2f GHz\n", ghz);
  EXPECT_TRUE(std::isfinite(ghz));
#if defined(__x86_64__)
  EXPECT_GT(ghz, 0.0);
#endif
  EXPECT_THROW(cpu::cpu_clock_ghz(0), std::invalid_argument);
}

TEST(PeakProbe, FmaPeakIsReported) {
  const cpu::PeakProbe p = cpu::fma_peak_probe(3);
  std::printf(
      "fp32 FMA peak on %s: %.1f GFLOP/s, %d threads, %d chains, %.2f GHz, %.1f "
      "FLOP/cycle/core: %s\n",
      kn::flash_attention_target(), p.gflops, p.threads, p.chains, p.clock_ghz, p.flops_per_cycle,
      p.verdict.c_str());
  ASSERT_GE(p.lanes, 1);
  EXPECT_EQ(p.lanes & (p.lanes - 1), 0) << p.lanes;  // a power of two
  // 8..24 chains on AVX-512 (32 registers), 8..14 elsewhere.
  expect_reported(p, 8, p.lanes >= 16 ? 24 : 14);
  EXPECT_GT(cpu::fma_peak_gflops(1), 0.0);
}

// The same probe on every target this CPU runs: the lanes follow the target.
TEST(PeakProbe, FmaPeakFollowsTheForcedTarget) {
  for (const std::string& target : kn::flash_attention_targets()) {
    if (target == "EMU128" || target == "SCALAR") continue;  // emulated: no FMA unit to find
    ASSERT_TRUE(kn::flash_attention_use_target(target.c_str()));
    const cpu::PeakProbe p = cpu::fma_peak_probe(1);
    std::printf("%s: %.1f GFLOP/s, %d lanes, %d chains, %.1f FLOP/cycle: %s\n", target.c_str(),
                p.gflops, p.lanes, p.chains, p.flops_per_cycle, p.verdict.c_str());
    EXPECT_EQ(p.lanes, target.rfind("AVX3", 0) == 0 ? 16 : target == "AVX2" ? 8 : 4) << target;
    EXPECT_GT(p.gflops, 0.0) << target;
    EXPECT_TRUE(std::isfinite(p.flops_per_cycle)) << target;
  }
  kn::flash_attention_use_target(nullptr);
}

TEST(PeakProbe, Bf16DotPeakIsReportedOrZero) {
  const cpu::PeakProbe p = cpu::bf16_dot_peak_probe(3);
  if (!cpu::has_avx512_bf16()) {
    EXPECT_EQ(p.gflops, 0.0);
    EXPECT_FALSE(p.plausible);
    GTEST_SKIP() << "no AVX512-BF16";
  }
  std::printf("bf16 dot peak: %.1f GFLOP/s, %d chains, %.1f FLOP/cycle/core: %s\n", p.gflops,
              p.chains, p.flops_per_cycle, p.verdict.c_str());
  EXPECT_EQ(p.lanes, 16);
  expect_reported(p, 8, 24);
}

TEST(PeakProbe, AmxPeakIsReportedOrZero) {
  const cpu::PeakProbe p = cpu::amx_bf16_peak_probe(3);
  if (!cpu::has_amx_bf16()) {
    EXPECT_EQ(p.gflops, 0.0);
    EXPECT_FALSE(p.verdict.empty());
    GTEST_SKIP() << "no AMX bf16 here";
  }
  std::printf("AMX bf16 peak: %.1f GFLOP/s, %.1f FLOP/cycle/core: %s\n", p.gflops,
              p.flops_per_cycle, p.verdict.c_str());
  EXPECT_EQ(p.lanes, 256);
  expect_reported(p, 4, 4);
}

TEST(PeakProbe, RepeatsBelowOneThrowNamingTheProbe) {
  for (const auto& [name, probe] :
       {std::pair<std::string, cpu::PeakProbe (*)(int)>{"fma_peak_gflops", cpu::fma_peak_probe},
        {"bf16_dot_peak_gflops", cpu::bf16_dot_peak_probe},
        {"amx_bf16_peak_gflops", cpu::amx_bf16_peak_probe}}) {
    try {
      probe(0);
      ADD_FAILURE() << name << " took repeats = 0";
    } catch (const std::invalid_argument& e) {
      EXPECT_EQ(std::string(e.what()), name + ": repeats must be >= 1, got 0");
    }
  }
}

// The quick readings the bf16 path choice takes (short runs) are rates like the
// full probes' (printed side by side; the choice itself is the rule above).
TEST(PeakProbe, QuickPeaksAreReported) {
  const double fma = cpu::fma_peak_gflops(3), fma_quick = cpu::fma_peak_gflops_quick();
  std::printf("fp32 FMA peak: %.1f GFLOP/s, quick %.1f\n", fma, fma_quick);
  EXPECT_TRUE(std::isfinite(fma_quick));
  EXPECT_GT(fma_quick, 0.0);
  const double dot = cpu::bf16_dot_peak_gflops(3), dot_quick = cpu::bf16_dot_peak_gflops_quick();
  if (!cpu::has_avx512_bf16()) {
    EXPECT_EQ(dot_quick, 0.0);
    GTEST_SKIP() << "no AVX512-BF16";
  }
  std::printf("bf16 dot peak: %.1f GFLOP/s, quick %.1f: VDPBF16PS %s\n", dot, dot_quick,
              cpu::bf16_dot_beats_fma(dot_quick, fma_quick) ? "first" : "after widening");
  EXPECT_TRUE(std::isfinite(dot_quick));
  EXPECT_GT(dot_quick, 0.0);
}

}  // namespace
