// The CPU's fp32 multiply-add peak on the SIMD target the kernels run: the
// ceiling that "close to the machine's limit" is measured against (attn bench
// prints it beside the sgemm rate). Same Highway dispatch as the flash kernel,
// so it measures the vector width the kernel itself uses.
//
// Each OpenMP thread runs kChains independent chains acc = acc · b + c for
// `iters` steps. With more chains than (FMA latency × FMA units) the
// multiply-add units never wait, so the rate is the units' throughput:
//   FLOPs = 2 · lanes · kChains · iters · threads.
// The chains start from different values so the compiler cannot merge them,
// and their sum is returned so it cannot drop them.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

#include "attn/kernels.h"

#ifdef _OPENMP
#include <omp.h>
#endif

#include "kernels/hwy_targets.h"  // the same targets as the flash kernel
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/fma_peak.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

HWY_BEFORE_NAMESPACE();
namespace attn::kernels {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// 12 chains cover latency 4-6 × 2 units (the common x86 cores) and still leave
// registers for b and c on 16-register targets.
constexpr size_t kChains = 12;

// Returns the sum of the chains (to be kept); *flops gets the FLOPs done.
float FmaChains(size_t iters, double* flops) {
  const hn::ScalableTag<float> d;
  using V = hn::Vec<decltype(d)>;
  const V b = hn::Set(d, 0.999999f), c = hn::Set(d, 1e-7f);
  V acc[kChains];
#pragma GCC unroll 12
  for (size_t i = 0; i < kChains; ++i) acc[i] = hn::Set(d, 1.0f + 0.01f * float(i));
  for (size_t it = 0; it < iters; ++it) {
#pragma GCC unroll 12
    for (size_t i = 0; i < kChains; ++i) acc[i] = hn::MulAdd(acc[i], b, c);
  }
  V sum = acc[0];
  for (size_t i = 1; i < kChains; ++i) sum = hn::Add(sum, acc[i]);
  *flops = 2.0 * double(hn::Lanes(d)) * double(kChains) * double(iters);
  return hn::GetLane(hn::SumOfLanes(d, sum));
}

// NOLINTNEXTLINE(google-readability-namespace-comments)
}  // namespace HWY_NAMESPACE
}  // namespace attn::kernels
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace attn::kernels {

HWY_EXPORT(FmaChains);

double fma_peak_gflops(int repeats) {
  if (repeats < 1)
    throw std::invalid_argument("fma_peak_gflops: repeats must be >= 1, got " +
                                std::to_string(repeats));
  using Clock = std::chrono::steady_clock;
  // GFLOP/s of all threads running `iters` steps at once.
  auto rate = [](size_t iters) {
    double flops = 0, sink = 0;
    const auto t0 = Clock::now();
#pragma omp parallel reduction(+ : flops, sink)
    {
      double f = 0;
      sink += double(HWY_DYNAMIC_DISPATCH(FmaChains)(iters, &f));
      flops += f;
    }
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    if (!std::isfinite(sink)) throw std::runtime_error("fma_peak_gflops: non-finite chains");
    return flops / s * 1e-9;
  };
  // Grow the run until one takes >= 20 ms (a few scheduler ticks), then time it.
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
#endif  // HWY_ONCE
