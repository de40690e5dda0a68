// attn/cpu.h - what the CPU can do: its instruction-set features, asked at
// run time, and its peak arithmetic rates, measured. The kernels' automatic
// path choices ask the features (and, for the bf16 attention path, compare
// the fp32 and bf16 peaks); `attn bench` and the benchmarks report every
// kernel against the peaks, the ceilings "close to the limit" is measured
// against (docs/gemm.md). Nothing here depends on the rest of attn.
#pragma once

#include <string>

namespace attn::cpu {

// ---- features ----------------------------------------------------------------------------
// Whether the CPU has AVX512-BF16 (VDPBF16PS) and AVX-512F, asked at run time.
bool has_avx512_bf16();
// Whether AMX bf16 can run here: the CPU has AMX-TILE and AMX-BF16, the OS
// enabled the tile state (XCR0) and Linux granted this process the tile data
// permission (arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA), asked once).
bool has_amx_bf16();

// ---- peaks -------------------------------------------------------------------------------
// What a peak probe measured (src/cpu/peak_rate.h says how): every OpenMP
// thread runs independent accumulator chains; the chain count is swept (8..24
// on 32-register targets, 8..14 on 16-register ones) and the fastest kept,
// after a warm-up of >= 200 ms, as the median of `repeats` runs of >= 20 ms.
// Cross-checked against the core clock (cpu_clock_ghz): FLOP per cycle per
// thread must be one of the rates the vector width allows (e.g. fp32 FMA on
// 16 lanes: 32 with one FMA unit, 64 with two); `plausible` says whether it is
// and `verdict` says which rate it matched or why it is off.
struct PeakProbe {
  double gflops = 0;              // all threads, GFLOP/s (0: the CPU lacks the instruction)
  int threads = 0;                // OpenMP threads that ran chains
  int chains = 0;                 // independent accumulators per thread at the best rate
  int lanes = 0;                  // fp32 results per instruction (AMX: per tile, 256)
  double clock_ghz = 0;           // the core clock measured beside it (0: unknown)
  double flops_per_cycle = 0;     // per thread: gflops / (threads · clock_ghz)
  double expected_per_cycle = 0;  // the nearest rate the hardware allows
  bool plausible = false;
  std::string verdict;  // e.g. "2 FMA units x 16 lanes", or what is wrong
};
// The core clock in GHz: a chain of dependent one-cycle integer adds on the
// calling thread, timed on the thread's CPU time (a busy machine does not
// slow it), median of `repeats` runs of ~5 ms after a warm-up. 0 off x86-64.
// Throws for repeats < 1.
double cpu_clock_ghz(int repeats = 5);
// The machine's fp32 multiply-add peak, over all OpenMP threads, on the SIMD
// target the kernels run (the probe is compiled for the kernels' Highway
// targets, src/cpu/hwy_targets.h, and Highway's choice of target is
// process-wide: kernels::flash_attention_use_target moves both). The hard
// ceiling for any fp32 kernel here; benchmarks report against it beside the
// sgemm rate. fma_peak_gflops is its gflops. Throw for repeats < 1.
PeakProbe fma_peak_probe(int repeats = 5);
double fma_peak_gflops(int repeats = 5);
// The bf16 dot-product peak (VDPBF16PS chains: bf16 products summed in fp32;
// src/cpu/bf16_peak.cpp), the ceiling of a bf16 kernel on the AVX512-BF16
// path; gflops 0 when the CPU has no AVX512-BF16. Throw for repeats < 1.
PeakProbe bf16_dot_peak_probe(int repeats = 5);
double bf16_dot_peak_gflops(int repeats = 5);
// The fp32 FMA and bf16 dot-product peaks (GFLOP/s) from the same sweeps on
// short runs (a 30 ms warm-up, runs of >= 3 ms, median of 3; about 0.1 s each
// against about 1 s) and without the clock check: what the bf16 attention
// path choice compares, once per process, where the two rates differ by 2x
// or more. The bf16 one is 0 without AVX512-BF16.
double fma_peak_gflops_quick();
double bf16_dot_peak_gflops_quick();
// The rule that choice applies to them: VDPBF16PS products are worth taking
// over fp32 FMAs on widened operands when the bf16 dot-product peak is at
// least 0.75 of the fp32 FMA peak (AMD Zen 4/5: about 2x; Intel: 0.5x, where
// each VDPBF16PS issues at half the FMA's rate). False when either is 0.
bool bf16_dot_beats_fma(double bf16_dot_gflops, double fma_gflops);
// The AMX bf16 peak (TDPBF16PS into four 16x16 fp32 tile accumulators;
// src/cpu/amx_peak.cpp): gflops 0 where has_amx_bf16() is false.
// Throw for repeats < 1.
PeakProbe amx_bf16_peak_probe(int repeats = 5);
double amx_bf16_peak_gflops(int repeats = 5);

}  // namespace attn::cpu
