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
#include <cstddef>

#include "attn/kernels.h"
#include "kernels/peak_rate.h"

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
  return median_peak_gflops("fma_peak_gflops", repeats, [](size_t iters, double* flops) {
    return HWY_DYNAMIC_DISPATCH(FmaChains)(iters, flops);
  });
}

}  // namespace attn::kernels
#endif  // HWY_ONCE
