// src/kernels/peak_rate.h - the timing harness of the machine-peak probes
// (fma_peak.cpp, bf16_peak.cpp): every OpenMP thread runs independent chains
// at once, the run grows until one takes >= 20 ms (a few scheduler ticks),
// and the median of `repeats` timed runs is the rate.
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <stdexcept>
#include <string>
#include <vector>

namespace attn::kernels {

// chains(iters, &flops) runs `iters` steps on the calling thread, sets the
// FLOPs it did and returns a value to keep (so the chains cannot be dropped).
// `fn` names the probe in the errors: repeats < 1, non-finite chains.
template <class Chains>
double median_peak_gflops(const char* fn, int repeats, const Chains& chains) {
  if (repeats < 1) {
    throw std::invalid_argument(std::string(fn) + ": repeats must be >= 1, got " +
                                std::to_string(repeats));
  }
  using Clock = std::chrono::steady_clock;
  // GFLOP/s of all threads running `iters` steps at once.
  const auto rate = [&](size_t iters) {
    double flops = 0, sink = 0;
    const auto t0 = Clock::now();
#pragma omp parallel reduction(+ : flops, sink)
    {
      double f = 0;
      sink += double(chains(iters, &f));
      flops += f;
    }
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    if (!std::isfinite(sink)) throw std::runtime_error(std::string(fn) + ": non-finite chains");
    return flops / s * 1e-9;
  };
  size_t iters = size_t{1} << 16;
  for (auto t0 = Clock::now(); iters < (size_t{1} << 32); iters *= 2, t0 = Clock::now()) {
    rate(iters);
    if (std::chrono::duration<double>(Clock::now() - t0).count() >= 0.02) break;
  }
  std::vector<double> rates;
  for (int rep = 0; rep < repeats; ++rep) rates.push_back(rate(iters));
  std::sort(rates.begin(), rates.end());
  return rates[rates.size() / 2];
}

}  // namespace attn::kernels
