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
#include <immintrin.h>

#include <cstddef>

#include "attn/kernels.h"
#include "kernels/peak_rate.h"

namespace attn::kernels {
namespace {

constexpr int kChains = 12;

__attribute__((target("avx512f,avx512bf16"))) float dot_chains(size_t iters, double* flops) {
  __m512 acc[kChains];
#pragma GCC unroll 12
  for (int i = 0; i < kChains; ++i) acc[i] = _mm512_set1_ps(0.01f * float(i));
  // 1.0 and 2^-20 in bf16: the chains grow slowly and stay finite.
  const __m512bh a = (__m512bh)_mm512_set1_epi16(0x3F80);
  const __m512bh b = (__m512bh)_mm512_set1_epi16(0x3580);
  for (size_t it = 0; it < iters; ++it) {
#pragma GCC unroll 12
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

}  // namespace

bool has_avx512_bf16() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512bf16") && __builtin_cpu_supports("avx512f");
}

double bf16_dot_peak_gflops(int repeats) {
  if (repeats >= 1 && !has_avx512_bf16()) return 0.0;
  return median_peak_gflops("bf16_dot_peak_gflops", repeats, dot_chains);
}

}  // namespace attn::kernels
