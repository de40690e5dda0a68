// bench_machine.h - the machine `attn bench` runs on, as the header above its
// table prints it and as every --json row's "machine" object gives it: the CPU
// (/proc/cpuinfo), the SIMD target and bf16 paths the kernels chose and those
// this CPU can run, the gemm engines, the threads and the OpenMP wait policy,
// and the peaks (attn/cpu.h: fp32 FMA, bf16 dot product, AMX; about 5 s to
// measure) beside the sgemm yardstick measured in the same run.
//
// The cases timed against these figures, and what % sgemm and % peak mean,
// are bench.h's.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "attn/cpu.h"

namespace attn::cli {

// What the header and --json's "machine" say: the CPU, the paths chosen, the
// peaks (measured only when `measure`: the three probes take about 5 s).
struct Machine {
  std::string cpu, family_model, simd_target, bf16_path, sdpa_bf16_path, gemv_bf16_path;
  std::vector<std::string> simd_targets, bf16_paths, gemv_bf16_paths;
  std::string fast_gemm, fast_gemm_engine, fast_gemm_reason, blas, gemm_bf16, gemm_bf16_route,
      gemm_bf16_reason;
  cpu::PeakProbe fma, bf16, amx;
  double clock_ghz = 0;
};

// Asks the kernels and the gemm engines which paths they take now (after any
// --target or --bf16-path), and probes the peaks when `measure`.
Machine machine_facts(bool measure);

// --json's "machine" object. `measured`: whether the peaks were probed. Without
// them the peaks are null and "peaks_measured" is false (--json without
// --sgemm, or --no-probe).
nlohmann::json machine_json(const Machine& m, bool measured);

// The sgemm yardstick of the run (bench/sgemm_rate.h): n³ on each engine, the
// median of `runs` timings, in GFLOP/s.
struct SgemmYardstick {
  int n = 4096;
  int runs = 5;
  double blas = 0, fast = 0;
};

// Prints the header above the table: the CPU and the threads, the SIMD target,
// the wait policy, the clock and the peaks (or that --no-probe skipped them),
// the paths and the gemm engines, the sgemm rates, `repeats` per case, and a
// warning for an implausible probe, an sgemm above the peak (a wrong probe) or
// an engine below half of it.
void print_machine_header(const Machine& m, bool peaks_measured, const SgemmYardstick& sgemm,
                          int repeats);

// The CPU's model name (/proc/cpuinfo), as the bench header prints it.
std::string cpu_name();

// The OpenMP threads the kernels run on (1 without OpenMP), and a way to set
// both OpenMP's and OpenBLAS's count (--threads).
int omp_threads();
void set_threads(int n);

}  // namespace attn::cli
