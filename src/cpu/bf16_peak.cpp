// The CPU's bf16 dot-product peak (AVX512-BF16's VDPBF16PS): the ceiling of a
// bf16 kernel with fp32 accumulation, beside fma_peak.cpp's fp32 ceiling.
// AVX512-BF16 is not among Highway 1.0.3's targets here, so this probe is
// written with the intrinsic under a function target attribute and runs only
// when the CPU reports the feature (checked at run time; the build stays
// portable).
//
// Each OpenMP thread runs kChains independent chains acc += a·b (pairs of
// bf16 products summed into each of the 16 fp32 lanes) for `iters` steps:
//   FLOPs = 16 lanes · 2 products · 2 (multiply, add) · kChains · iters · threads.
// The chain count is swept over 8..24 (32 registers; peak_rate.h).
#include <immintrin.h>

#include <cstddef>

#include "attn/cpu.h"
#include "cpu/peak_rate.h"

namespace attn::cpu {
namespace {

template <int kChains>
__attribute__((target("avx512f,avx512bf16"))) float dot_chains(size_t iters, double* flops) {
  __m512 acc[kChains];
#pragma GCC unroll 32
  for (int i = 0; i < kChains; ++i) acc[i] = _mm512_set1_ps(0.01f * float(i));
  // 1.0 and 2^-20 in bf16: the chains grow slowly and stay finite.
  const __m512bh a = (__m512bh)_mm512_set1_epi16(0x3F80);
  const __m512bh b = (__m512bh)_mm512_set1_epi16(0x3580);
  for (size_t it = 0; it < iters; ++it) {
#pragma GCC unroll 32
    for (int i = 0; i < kChains; ++i) acc[i] = _mm512_dpbf16_ps(acc[i], a, b);
  }
  __m512 sum = acc[0];
  for (int i = 1; i < kChains; ++i) sum = _mm512_add_ps(sum, acc[i]);
  *flops = 16.0 * 2.0 * 2.0 * kChains * double(iters);
  // (Not _mm512_reduce_add_ps: GCC 12's header trips -Wuninitialized.)
  alignas(64) float lanes[16];
  _mm512_store_ps(lanes, sum);
  float total = 0.0f;
  for (const float lane : lanes) total += lane;
  return total;
}

using ChainsFn = float (*)(size_t, double*);
constexpr int kChainCounts[] = {8, 10, 12, 14, 16, 18, 20, 22, 24};
constexpr ChainsFn kRuns[] = {dot_chains<8>,  dot_chains<10>, dot_chains<12>,
                              dot_chains<14>, dot_chains<16>, dot_chains<18>,
                              dot_chains<20>, dot_chains<22>, dot_chains<24>};

}  // namespace

namespace {
PeakProbe dot_sweep(int repeats, PeakTiming timing) {
  return sweep_peak(
      "bf16_dot_peak_gflops", repeats, std::size(kRuns),
      [](size_t variant, size_t iters, double* flops) { return kRuns[variant](iters, flops); },
      [](size_t variant) { return kChainCounts[variant]; }, timing);
}
}  // namespace

PeakProbe bf16_dot_peak_probe(int repeats) {
  if (repeats >= 1 && !has_avx512_bf16()) {
    PeakProbe none;
    none.verdict = "no AVX512-BF16";
    return none;
  }
  PeakProbe p = dot_sweep(repeats, PeakTiming{});
  p.lanes = 16;
  // One VDPBF16PS: 16 lanes x 2 products x 2 FLOPs; half, one or two a cycle.
  return judge_peak(p, 64.0, {0.5, 1.0, 2.0}, "VDPBF16PS unit");
}

double bf16_dot_peak_gflops(int repeats) { return bf16_dot_peak_probe(repeats).gflops; }

double bf16_dot_peak_gflops_quick() {
  return has_avx512_bf16() ? dot_sweep(3, kQuickPeakTiming).gflops : 0.0;
}

}  // namespace attn::cpu
