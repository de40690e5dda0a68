// The CPU's fp32 multiply-add peak on the SIMD target the kernels run: the
// ceiling that "close to the machine's limit" is measured against (attn bench
// prints it beside the sgemm rate). Same Highway dispatch as the flash kernel,
// so it measures the vector width the kernel itself uses. Also the core clock
// the peaks are checked against (the check itself, judge_peak, is peak_rate.cpp).
//
// Each OpenMP thread runs kChains independent chains acc = acc · b + c for
// `iters` steps. With at least (FMA latency × FMA units) chains the units never
// wait, so the rate is their throughput: FLOPs = 2 · lanes · kChains · iters
// per thread. That product differs by core (Intel's AVX-512 cores: 4 cycles ×
// 2 units = 8; AMD Zen 3: 4 × 2 on 256-bit vectors; Zen 4: 4 × 2 halves of
// 512 bits; older cores up to 5-6 × 2), and too many chains spill registers,
// so the count is swept (peak_rate.h): 8..24 on 32-register targets (AVX-512),
// 8..14 on 16-register ones (AVX2, SSE4), b and c taking the last two.
// The chains start from different values so the compiler cannot merge them,
// and their sum is returned so it cannot drop them.
#include <time.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "attn/cpu.h"
#include "cpu/hwy_targets.h"  // the same targets as the flash kernel
#include "cpu/peak_rate.h"
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "cpu/fma_peak.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

HWY_BEFORE_NAMESPACE();
namespace attn::cpu {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Returns the sum of the chains (to be kept); *flops gets the FLOPs done.
template <size_t kChains>
float FmaChains(size_t iters, double* flops) {
  const hn::ScalableTag<float> d;
  using V = hn::Vec<decltype(d)>;
  const V b = hn::Set(d, 0.999999f), c = hn::Set(d, 1e-7f);
  V acc[kChains];
#pragma GCC unroll 32
  for (size_t i = 0; i < kChains; ++i) acc[i] = hn::Set(d, 1.0f + 0.01f * float(i));
  for (size_t it = 0; it < iters; ++it) {
#pragma GCC unroll 32
    for (size_t i = 0; i < kChains; ++i) acc[i] = hn::MulAdd(acc[i], b, c);
  }
  V sum = acc[0];
  for (size_t i = 1; i < kChains; ++i) sum = hn::Add(sum, acc[i]);
  *flops = 2.0 * double(hn::Lanes(d)) * double(kChains) * double(iters);
  return hn::GetLane(hn::SumOfLanes(d, sum));
}

using ChainsFn = float (*)(size_t, double*);
#if HWY_TARGET <= HWY_AVX3  // AVX-512: 32 vector registers
constexpr size_t kChainCounts[] = {8, 10, 12, 14, 16, 18, 20, 22, 24};
constexpr ChainsFn kRuns[] = {FmaChains<8>,  FmaChains<10>, FmaChains<12>,
                              FmaChains<14>, FmaChains<16>, FmaChains<18>,
                              FmaChains<20>, FmaChains<22>, FmaChains<24>};
#else  // 16 vector registers
constexpr size_t kChainCounts[] = {8, 10, 12, 14};
constexpr ChainsFn kRuns[] = {FmaChains<8>, FmaChains<10>, FmaChains<12>, FmaChains<14>};
#endif

size_t FmaVariants() { return sizeof(kChainCounts) / sizeof(kChainCounts[0]); }
size_t FmaChainsOf(size_t variant) { return kChainCounts[variant]; }
float FmaRun(size_t variant, size_t iters, double* flops) { return kRuns[variant](iters, flops); }
size_t FmaLanes() { return hn::Lanes(hn::ScalableTag<float>()); }

// NOLINTNEXTLINE(google-readability-namespace-comments)
}  // namespace HWY_NAMESPACE
}  // namespace attn::cpu
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace attn::cpu {

HWY_EXPORT(FmaVariants);
HWY_EXPORT(FmaChainsOf);
HWY_EXPORT(FmaRun);
HWY_EXPORT(FmaLanes);

namespace {

#if defined(__x86_64__)
// `iters` × 32 dependent one-cycle adds: 32 cycles an iteration (the loop's
// decrement and branch run beside them on other ports). Register + register,
// not an immediate: Golden Cove (Alder Lake P, Sapphire Rapids) folds chains of
// small-immediate adds at rename and runs several a cycle.
uint64_t add_chain(uint64_t iters) {
  uint64_t x = 0;
  const uint64_t one = 1;
  asm volatile(
      "1:\n\t"
      ".rept 32\n\t"
      "addq %2, %0\n\t"
      ".endr\n\t"
      "decq %1\n\t"
      "jnz 1b"
      : "+r"(x), "+r"(iters)
      : "r"(one)
      : "cc");
  return x;
}
#endif

}  // namespace

double cpu_clock_ghz(int repeats) {
  if (repeats < 1) {
    throw std::invalid_argument("cpu_clock_ghz: repeats must be >= 1, got " +
                                std::to_string(repeats));
  }
#if defined(__x86_64__)
  // Cycles per CPU second of `iters` iterations.
  const auto ghz = [](uint64_t iters, double* seconds) {
    const double t0 = thread_cpu_seconds();
    const uint64_t adds = add_chain(iters);
    *seconds = thread_cpu_seconds() - t0;
    return double(adds) / *seconds * 1e-9;  // adds = cycles
  };
  uint64_t iters = 1 << 12;
  double s = 0;
  for (ghz(iters, &s); s < 0.005 && iters < (uint64_t{1} << 36);) {  // runs of >= 5 ms
    iters *= 2;
    ghz(iters, &s);
  }
  for (int i = 0; i < 4; ++i) ghz(iters, &s);  // warm-up: ~20 ms more
  std::vector<double> rates;
  for (int rep = 0; rep < repeats; ++rep) rates.push_back(ghz(iters, &s));
  std::sort(rates.begin(), rates.end());
  return rates[rates.size() / 2];
#else
  return 0.0;
#endif
}

namespace {
PeakProbe fma_sweep(int repeats, PeakTiming timing) {
  return sweep_peak(
      "fma_peak_gflops", repeats, HWY_DYNAMIC_DISPATCH(FmaVariants)(),
      [](size_t variant, size_t iters, double* flops) {
        return HWY_DYNAMIC_DISPATCH(FmaRun)(variant, iters, flops);
      },
      [](size_t variant) { return HWY_DYNAMIC_DISPATCH(FmaChainsOf)(variant); }, timing);
}
}  // namespace

PeakProbe fma_peak_probe(int repeats) {
  PeakProbe p = fma_sweep(repeats, PeakTiming{});
  p.lanes = int(HWY_DYNAMIC_DISPATCH(FmaLanes)());
  // One FMA: 2 FLOPs per lane; one or two FMA units per core.
  return judge_peak(p, 2.0 * p.lanes, {1.0, 2.0}, "FMA unit");
}

double fma_peak_gflops(int repeats) { return fma_peak_probe(repeats).gflops; }

double fma_peak_gflops_quick() { return fma_sweep(3, kQuickPeakTiming).gflops; }

}  // namespace attn::cpu
#endif  // HWY_ONCE
