// The bf16 GEMV's rows on AVX512-BF16 (attn/decode_kernels.h, path
// "AVX512-BF16"): VDPBF16PS multiplies 32 bf16 of a weight row by 32 bf16 of
// x, pairwise, and adds each pair's two exact products into one of 16 fp32
// lanes. x and a row of W are both contiguous along k, so the pairs (k, k+1)
// line up with no packing. One row after the other (four independent chains
// per row), the last K mod 32 columns through masked loads (zeros add nothing).
// AVX512-BF16 is not among Highway 1.0.3's targets: this file is compiled
// with a function-level target and called only when the CPU reports the
// feature (decode_kernels.cpp checks at run time; the build stays portable).
#include <immintrin.h>

#include <cstddef>
#include <cstdint>

namespace attn::kernels::detail {

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512bf16")
// GCC 12's AVX-512 headers start some intrinsics from an "undefined" vector,
// which -Wmaybe-uninitialized reports once inlined.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

namespace {

// The 32 bf16 at p (only the first `n` when n < 32, zeros after).
inline __m512bh Load32(const uint16_t* p, size_t n) {
  if (n >= 32) return (__m512bh)_mm512_loadu_si512(p);
  const __mmask32 mask = (__mmask32)((uint64_t{1} << n) - 1);
  return (__m512bh)_mm512_maskz_loadu_epi16(mask, p);
}

// Σ of the 16 lanes (not _mm512_reduce_add_ps: GCC 12's header trips
// -Wuninitialized).
inline float Sum(__m512 v) {
  const __m256 h = _mm256_add_ps(_mm512_castps512_ps256(v),
                                 _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
  const __m128 q = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
  const __m128 p = _mm_add_ps(q, _mm_movehl_ps(q, q));
  return _mm_cvtss_f32(_mm_add_ss(p, _mm_movehdup_ps(p)));
}

}  // namespace

void gemv_bf16_rows_avx512(float* y, const uint16_t* x, const uint16_t* W, const float* bias,
                           size_t n0, size_t n1, size_t K) {
  // One row after the other (the weights in memory order), each in four
  // chains over 128 columns at a time.
  const size_t K4 = K / 128 * 128;
  for (size_t n = n0; n < n1; ++n) {
    const uint16_t* w = W + n * K;
    __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps(), a2 = _mm512_setzero_ps(),
           a3 = _mm512_setzero_ps();
    size_t k = 0;
    for (; k < K4; k += 128) {
      a0 = _mm512_dpbf16_ps(a0, Load32(w + k, 32), Load32(x + k, 32));
      a1 = _mm512_dpbf16_ps(a1, Load32(w + k + 32, 32), Load32(x + k + 32, 32));
      a2 = _mm512_dpbf16_ps(a2, Load32(w + k + 64, 32), Load32(x + k + 64, 32));
      a3 = _mm512_dpbf16_ps(a3, Load32(w + k + 96, 32), Load32(x + k + 96, 32));
    }
    for (; k < K; k += 32) a0 = _mm512_dpbf16_ps(a0, Load32(w + k, K - k), Load32(x + k, K - k));
    y[n] = Sum(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3))) +
           (bias != nullptr ? bias[n] : 0.0f);
  }
}

#pragma GCC diagnostic pop
#pragma GCC pop_options

}  // namespace attn::kernels::detail
