// bench/sgemm_rate.h - the machine's fp32 matrix-product rate, the yardstick
// every attn benchmark reports its GFLOP/s against (% of sgemm). Used by the
// Google Benchmark programs here and by `attn bench`.
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <stdexcept>
#include <vector>

#include "attn/gemm.h"
#include "attn/random.h"
#include "attn/tensor.h"

namespace attn::bench {

// GFLOP/s of one gemm::sgemm of n x n x n (2·n³ FLOPs) on the given engine
// (attn/gemm.h): the median of `repeats` timings after one warm-up. Throws if
// the product is not finite.
inline double sgemm_gflops(int n = 4096, int repeats = 5,
                           gemm::Engine engine = gemm::Engine::kBlas) {
  Generator gen(5);
  const Tensor a = randn({n, n}, gen), b = randn({n, n}, gen);
  std::vector<float> c(static_cast<size_t>(n) * static_cast<size_t>(n));
  std::vector<double> rates;
  for (int rep = 0; rep <= repeats; ++rep) {
    const auto t0 = std::chrono::steady_clock::now();
    gemm::sgemm(gemm::Trans::kNo, gemm::Trans::kNo, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f,
                c.data(), n, engine);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (rep > 0) rates.push_back(2.0 * double(n) * n * n / s * 1e-9);  // rep 0 warms up
  }
  if (!std::all_of(c.begin(), c.end(), [](float x) { return std::isfinite(x); })) {
    throw std::runtime_error("sgemm: non-finite result");
  }
  std::sort(rates.begin(), rates.end());
  return rates[rates.size() / 2];
}

}  // namespace attn::bench
