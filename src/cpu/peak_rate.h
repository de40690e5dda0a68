// src/cpu/peak_rate.h - the timing harness of the machine-peak probes
// (fma_peak.cpp, bf16_peak.cpp, amx_peak.cpp) and the clock they are checked
// against (kernels::cpu_clock_ghz, fma_peak.cpp).
//
// Why a probe can read low, and what this harness does about each:
// - too few independent chains: a chain waits for its own last result, so
//   chains < latency × units leaves units idle (Zen 3: 4 cycles × 2 FMA pipes
//   needs 8; Intel's AVX-512 cores 4 × 2). The probes compile several chain
//   counts (templates) and the harness sweeps them, keeping the fastest;
// - a clock still ramping up: one warm-up of >= 200 ms on every thread before
//   anything is timed (frequency governors take tens of ms);
// - runs too short for the timer, or disturbed: every timed run lasts >= 20 ms
//   (a few scheduler ticks) and the rate is the median of `repeats` of them.
// - a busy machine (other processes taking turns on the cores): each thread's
//   rate is its FLOPs over its own CPU time (CLOCK_THREAD_CPUTIME_ID), not the
//   wall clock, so time spent descheduled does not count. The machine's rate
//   is the threads' mean rate times the threads that can run at once,
//   min(threads, hardware threads): more OpenMP threads than hardware threads
//   cannot add up to more than the hardware.
// Every OpenMP thread runs the chains at once.
//
// The timing is a parameter: the reported peaks (attn bench) take the long
// one above, about 1 s a probe; a path choice made inside a run (the bf16
// attention path, flash_attention_bf16.cpp) takes kQuickPeakTiming, since the
// rates it compares differ by 2x or 4x, not by the few % the long timing
// resolves.
#pragma once

#include <time.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "attn/cpu.h"

namespace attn::cpu {

struct PeakTiming {
  double warmup_s = 0.2;  // the warm-up before anything is timed
  double run_s = 0.02;    // the least wall-clock time of one timed run
};
inline constexpr PeakTiming kQuickPeakTiming{0.03, 0.003};

inline double thread_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

// How many threads of `threads` run at once: at most `hardware` (0: unknown,
// all of them); by default the hardware threads of this machine.
inline int threads_at_once(int threads, int hardware) {
  return hardware > 0 ? std::min(threads, hardware) : threads;
}
inline int threads_at_once(int threads) {
  return threads_at_once(threads, int(std::thread::hardware_concurrency()));
}

// The machine's rate in GFLOP/s from its threads' rates (FLOPs over each
// thread's CPU time, summed over `threads` threads): their mean times the
// threads that run at once. Pure: the tests drive it with given readings.
inline double machine_gflops(double sum_of_thread_rates, int threads, int hardware) {
  if (threads < 1) return 0.0;
  return sum_of_thread_rates / threads * threads_at_once(threads, hardware) * 1e-9;
}

// run(variant, iters, &flops) runs chain layout `variant` (0 .. variants-1)
// for `iters` steps on the calling thread, sets the FLOPs it did and returns a
// value to keep (so the chains cannot be dropped). chains_of(variant) is the
// number of independent accumulators of that layout. `fn` names the probe in
// the errors: repeats < 1, non-finite chains. Fills gflops, chains, threads.
template <class Run, class ChainsOf>
PeakProbe sweep_peak(const char* fn, int repeats, size_t variants, const Run& run,
                     const ChainsOf& chains_of, PeakTiming timing = {}) {
  if (repeats < 1) {
    throw std::invalid_argument(std::string(fn) + ": repeats must be >= 1, got " +
                                std::to_string(repeats));
  }
  using Clock = std::chrono::steady_clock;
  const auto seconds_since = [](Clock::time_point t0) {
    return std::chrono::duration<double>(Clock::now() - t0).count();
  };
  // GFLOP/s of all threads running `iters` steps of `variant` at once: the
  // mean of the threads' rates (FLOPs over their CPU time) times those that
  // run at once.
  int threads = 1;
  const auto rate = [&](size_t variant, size_t iters) {
    double rates = 0, sink = 0;
    int n = 0;
#pragma omp parallel reduction(+ : rates, sink, n)
    {
      double f = 0;
      const double t0 = thread_cpu_seconds();
      sink += double(run(variant, iters, &f));
      const double s = thread_cpu_seconds() - t0;
      rates += s > 0 ? f / s : 0.0;
      n += 1;
    }
    if (!std::isfinite(sink)) throw std::runtime_error(std::string(fn) + ": non-finite chains");
    threads = n;
    return machine_gflops(rates, n, int(std::thread::hardware_concurrency()));
  };
  // The run length: doubled until one run of the first layout takes >= run_s
  // (20 ms) of wall-clock time.
  size_t iters = size_t{1} << 12;
  for (;;) {
    const auto t0 = Clock::now();
    rate(0, iters);
    if (seconds_since(t0) >= timing.run_s || iters >= (size_t{1} << 34)) break;
    iters *= 2;
  }
  // Warm-up: >= warmup_s (200 ms) of the same work, so the clock has settled.
  for (const auto t0 = Clock::now(); seconds_since(t0) < timing.warmup_s;) rate(0, iters);
  // The sweep: one run of each layout; the fastest is timed `repeats` times.
  size_t best = 0;
  double best_rate = 0;
  for (size_t v = 0; v < variants; ++v) {
    const double r = rate(v, iters);
    if (r > best_rate) best = v, best_rate = r;
  }
  std::vector<double> rates;
  for (int rep = 0; rep < repeats; ++rep) rates.push_back(rate(best, iters));
  std::sort(rates.begin(), rates.end());
  PeakProbe p;
  p.gflops = rates[rates.size() / 2];
  p.chains = int(chains_of(best));
  p.threads = threads;
  return p;
}

// Fills flops_per_cycle, expected_per_cycle, plausible and the verdict of a
// probe whose gflops, threads, lanes and clock_ghz are set, with `running`
// threads at once: FLOP/cycle per thread = gflops / (running · GHz), checked
// against flops_per_unit · units (e.g. fp32 FMA: 2 · lanes per FMA unit, units
// {1, 2}; sorted): plausible from 0.75x the least to 1.1x the most. `what`
// names the unit in the verdict, e.g. "FMA unit". Pure: no measurement
// (peak_rate.cpp; the tests drive it with given readings).
PeakProbe& judge_peak_at(PeakProbe& p, int running, double flops_per_unit,
                         const std::vector<double>& units, const char* what);
// The same after measuring the clock (cpu_clock_ghz(5)) beside the probe,
// with this machine's threads at once.
PeakProbe& judge_peak(PeakProbe& p, double flops_per_unit, const std::vector<double>& units,
                      const char* what);

}  // namespace attn::cpu
