// bench/yardsticks.h - what the Google Benchmark programs report their rates
// against, measured once at start-up: the fast engine's sgemm (bench/sgemm_rate.h)
// and the CPU's fp32 multiply-add peak on the kernel's SIMD target
// (cpu::fma_peak_gflops). Counters per benchmark:
//   GFLOP         useful GFLOP/s (iteration-invariant rate)
//   pct_of_sgemm  that rate as a percentage of the sgemm rate
//   pct_of_peak   that rate as a percentage of the FMA peak
// ATTN_BENCH_SKIP_SGEMM=1 skips both measurements (the percentages are then
// against 1 GFLOP/s).
#pragma once

#include <benchmark/benchmark.h>

#include <cstdio>
#include <cstdlib>

#include "attn/cpu.h"
#include "attn/gemm.h"
#include "attn/kernels.h"
#include "sgemm_rate.h"

namespace attn::bench {

struct Yardsticks {
  double sgemm_gflops = 1.0;
  double peak_gflops = 1.0;
};

inline Yardsticks& yardsticks() {
  static Yardsticks y;
  return y;
}

// Measures both (unless ATTN_BENCH_SKIP_SGEMM=1) and prints them.
inline void measure_yardsticks() {
  kernels::apply_path_environment();  // ATTN_SIMD_TARGET, ATTN_BF16_PATH (docs/gemm.md)
  const char* skip = std::getenv("ATTN_BENCH_SKIP_SGEMM");
  if (!(skip && *skip == '1')) {
    yardsticks().peak_gflops = cpu::fma_peak_gflops();
    yardsticks().sgemm_gflops = sgemm_gflops(4096, 5, gemm::Engine::kFast);
  }
  std::printf("fp32 FMA peak (%s, median of 5): %.1f GFLOP/s\n", kernels::flash_attention_target(),
              yardsticks().peak_gflops);
  std::printf("sgemm 4096^3 (%s, median of 5): %.1f GFLOP/s\n", gemm::fast_gemm_name(),
              yardsticks().sgemm_gflops);
}

inline void add_rate_counters(benchmark::State& state, double flops_per_iter) {
  const double gflop = flops_per_iter * 1e-9;
  constexpr auto kRate = benchmark::Counter::kIsIterationInvariantRate;
  state.counters["GFLOP"] = benchmark::Counter(gflop, kRate);
  state.counters["pct_of_sgemm"] =
      benchmark::Counter(gflop * 100.0 / yardsticks().sgemm_gflops, kRate);
  state.counters["pct_of_peak"] =
      benchmark::Counter(gflop * 100.0 / yardsticks().peak_gflops, kRate);
}

}  // namespace attn::bench
