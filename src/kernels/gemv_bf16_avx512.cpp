// The bf16 GEMV's rows on AVX512-BF16 (attn/decode_kernels.h, path
// "AVX512-BF16"): VDPBF16PS multiplies 32 bf16 of a weight row by 32 bf16 of
// x, pairwise, and adds each pair's two exact products into one of 16 fp32
// lanes. x and a row of W are both contiguous along k, so the pairs (k, k+1)
// line up with no packing. Four rows at a time (four independent chains), the
// last K mod 32 columns through masked loads (zeros add nothing).
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
  size_t n = n0;
  for (; n + 4 <= n1; n += 4) {
    const uint16_t* w0 = W + n * K;
    const uint16_t* w1 = w0 + K;
    const uint16_t* w2 = w1 + K;
    const uint16_t* w3 = w2 + K;
    __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps(), a2 = _mm512_setzero_ps(),
           a3 = _mm512_setzero_ps();
    for (size_t k = 0; k < K; k += 32) {
      const size_t len = K - k;
      const __m512bh xv = Load32(x + k, len);
      a0 = _mm512_dpbf16_ps(a0, Load32(w0 + k, len), xv);
      a1 = _mm512_dpbf16_ps(a1, Load32(w1 + k, len), xv);
      a2 = _mm512_dpbf16_ps(a2, Load32(w2 + k, len), xv);
      a3 = _mm512_dpbf16_ps(a3, Load32(w3 + k, len), xv);
    }
    const float b0 = bias != nullptr ? bias[n] : 0.0f, b1 = bias != nullptr ? bias[n + 1] : 0.0f;
    const float b2 = bias != nullptr ? bias[n + 2] : 0.0f,
                b3 = bias != nullptr ? bias[n + 3] : 0.0f;
    y[n] = Sum(a0) + b0;
    y[n + 1] = Sum(a1) + b1;
    y[n + 2] = Sum(a2) + b2;
    y[n + 3] = Sum(a3) + b3;
  }
  for (; n < n1; ++n) {
    const uint16_t* w = W + n * K;
    __m512 a = _mm512_setzero_ps();
    for (size_t k = 0; k < K; k += 32)
      a = _mm512_dpbf16_ps(a, Load32(w + k, K - k), Load32(x + k, K - k));
    y[n] = Sum(a) + (bias != nullptr ? bias[n] : 0.0f);
  }
}

#pragma GCC diagnostic pop
#pragma GCC pop_options

}  // namespace attn::kernels::detail
