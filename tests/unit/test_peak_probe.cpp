// The machine-peak probes (attn/cpu.h: fma_peak_probe, bf16_dot_peak_probe,
// amx_bf16_peak_probe) and the clock they are checked against: positive,
// finite figures whose FLOP per cycle is one the vector width allows. No
// duration is asserted (the machine may be busy; the probes time themselves on
// each thread's CPU time).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <stdexcept>
#include <string>

#include "attn/cpu.h"
#include "attn/kernels.h"

namespace cpu = attn::cpu;
namespace kn = attn::kernels;

namespace {

// What every measured probe must satisfy: positive and finite, its chains
// among those swept, and FLOP/cycle one of `per_unit` x units. Never above
// 1.1x the most the vector width allows (a broken probe or clock: the bug of
// issue 21); at least half the least (a busy machine can slow a shared core,
// the judge flags below 0.75x); and `plausible` exactly when the judge's
// bounds hold.
void expect_plausible(const cpu::PeakProbe& p, double per_unit, double units_min, double units_max,
                      int chains_min, int chains_max) {
  EXPECT_TRUE(std::isfinite(p.gflops));
  EXPECT_GT(p.gflops, 0.0);
  EXPECT_GE(p.threads, 1);
  EXPECT_GE(p.chains, chains_min);
  EXPECT_LE(p.chains, chains_max);
  EXPECT_GT(p.clock_ghz, 0.2);  // a core clock, GHz
  EXPECT_LT(p.clock_ghz, 10.0);
  EXPECT_TRUE(std::isfinite(p.flops_per_cycle));
  const double lo = per_unit * units_min, hi = per_unit * units_max;
  EXPECT_GE(p.flops_per_cycle, 0.5 * lo) << p.verdict;
  EXPECT_LE(p.flops_per_cycle, 1.1 * hi) << p.verdict;
  EXPECT_EQ(p.plausible, p.flops_per_cycle >= 0.75 * lo && p.flops_per_cycle <= 1.1 * hi)
      << p.verdict;
  EXPECT_FALSE(p.verdict.empty());
}

TEST(PeakProbe, ClockIsACoreClock) {
  const double ghz = cpu::cpu_clock_ghz(3);
#if defined(__x86_64__)
  EXPECT_GT(ghz, 0.2);
  EXPECT_LT(ghz, 10.0);
#endif
  EXPECT_TRUE(std::isfinite(ghz));
  EXPECT_THROW(cpu::cpu_clock_ghz(0), std::invalid_argument);
}

TEST(PeakProbe, FmaPeakIsOneOrTwoFmaUnitsOfTheVectorWidth) {
  const cpu::PeakProbe p = cpu::fma_peak_probe(3);
  std::printf(
      "fp32 FMA peak on %s: %.1f GFLOP/s, %d threads, %d chains, %.2f GHz, %.1f "
      "FLOP/cycle/core: %s\n",
      kn::flash_attention_target(), p.gflops, p.threads, p.chains, p.clock_ghz, p.flops_per_cycle,
      p.verdict.c_str());
  ASSERT_GE(p.lanes, 1);
  EXPECT_EQ(p.lanes & (p.lanes - 1), 0) << p.lanes;  // a power of two
  // 8..24 chains on AVX-512 (32 registers), 8..14 elsewhere.
  expect_plausible(p, 2.0 * p.lanes, 1, 2, 8, p.lanes >= 16 ? 24 : 14);
  EXPECT_EQ(cpu::fma_peak_gflops(1) > 0.0, true);
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

TEST(PeakProbe, Bf16DotPeakIsPlausibleOrZero) {
  const cpu::PeakProbe p = cpu::bf16_dot_peak_probe(3);
  if (!cpu::has_avx512_bf16()) {
    EXPECT_EQ(p.gflops, 0.0);
    EXPECT_FALSE(p.plausible);
    GTEST_SKIP() << "no AVX512-BF16";
  }
  std::printf("bf16 dot peak: %.1f GFLOP/s, %d chains, %.1f FLOP/cycle/core: %s\n", p.gflops,
              p.chains, p.flops_per_cycle, p.verdict.c_str());
  EXPECT_EQ(p.lanes, 16);
  expect_plausible(p, 64.0, 0.5, 2, 8, 24);
}

TEST(PeakProbe, AmxPeakIsPlausibleOrZero) {
  const cpu::PeakProbe p = cpu::amx_bf16_peak_probe(3);
  if (!cpu::has_amx_bf16()) {
    EXPECT_EQ(p.gflops, 0.0);
    EXPECT_FALSE(p.verdict.empty());
    GTEST_SKIP() << "no AMX bf16 here";
  }
  std::printf("AMX bf16 peak: %.1f GFLOP/s, %.1f FLOP/cycle/core: %s\n", p.gflops,
              p.flops_per_cycle, p.verdict.c_str());
  EXPECT_EQ(p.lanes, 256);
  expect_plausible(p, 1024.0, 0.5, 1, 4, 4);
  // Far above the vector units: the tiles are what AMX is for.
  EXPECT_GT(p.gflops, cpu::bf16_dot_peak_gflops(1));
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

// The quick readings the bf16 path choice takes (short runs) agree with the
// full probes: the same rate within the noise of a shared machine, and the
// same side of the choice's threshold (bf16 dot >= 0.75 fp32 FMA), where the
// CPUs differ by 2x (Intel 0.5, AMD Zen 4/5 about 2).
TEST(PeakProbe, QuickPeaksAgreeWithTheFullProbes) {
  const double fma = cpu::fma_peak_gflops(3), fma_quick = cpu::fma_peak_gflops_quick();
  std::printf("fp32 FMA peak: %.1f GFLOP/s, quick %.1f\n", fma, fma_quick);
  EXPECT_GE(fma_quick, 0.6 * fma);
  EXPECT_LE(fma_quick, 1.5 * fma);
  const double dot = cpu::bf16_dot_peak_gflops(3), dot_quick = cpu::bf16_dot_peak_gflops_quick();
  if (!cpu::has_avx512_bf16()) {
    EXPECT_EQ(dot_quick, 0.0);
    GTEST_SKIP() << "no AVX512-BF16";
  }
  std::printf("bf16 dot peak: %.1f GFLOP/s, quick %.1f\n", dot, dot_quick);
  EXPECT_GE(dot_quick, 0.6 * dot);
  EXPECT_LE(dot_quick, 1.5 * dot);
  EXPECT_EQ(dot_quick >= 0.75 * fma_quick, dot >= 0.75 * fma);
}

}  // namespace
