// src/kernels/avx512_bf16-inl.h - the AVX-512 vector helpers the bf16
// attention engines share (bf16_dot.cpp, the sdpa kernel's VDPBF16PS engine,
// the "AVX512-BF16" path; flash_attention_amx.cpp, the "AMX" path): exp2,
// lane and element masks, fp32 -> bf16 rounding into words, bf16 -> fp32
// widening loads and the horizontal reductions of 16 lanes.
//
// AVX512-BF16 is not among Highway 1.0.3's targets, so these are intrinsics,
// compiled here under their own target pragma (the role HWY_BEFORE_NAMESPACE
// plays in flash_tiles-inl.h): include this header with the other headers, at
// the top of the file, outside any namespace and outside any target pragma.
// GCC inlines them into any caller whose target is a superset (bf16_dot.cpp's,
// and the AMX kernel's, which adds amx-tile and amx-bf16); callers run only
// where the CPU reports AVX512-BF16. Being the one copy, both engines round
// the same way bit for bit.
#ifndef ATTN_KERNELS_AVX512_BF16_INL_H_
#define ATTN_KERNELS_AVX512_BF16_INL_H_

#include <immintrin.h>

#include <cstddef>
#include <cstdint>

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,fma")
// GCC 12's AVX-512 headers start some intrinsics from an "undefined" vector
// (_mm512_undefined_*), which -Wmaybe-uninitialized reports once inlined.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

namespace attn::kernels::avx512 {

// 2^x with a relative error below 2e-7 for x >= -125 (Cephes exp2f's
// polynomial on [-1/2, 1/2]); VSCALEFPS applies 2^n. x below -125 (and -inf,
// NaN: callers mask the lanes whose scores are not to count) gives exactly 0
// with those lanes masked off, so no result is subnormal: an underflowing
// result costs a ~160-cycle microcode assist on Intel cores, and every masked
// score of a diagonal tile paid it (kernels/flash_tiles-inl.h, Exp2).
inline __m512 Exp2(__m512 x) {
  const __mmask16 live = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-125.0f), _CMP_GE_OQ);
  const __m512 n =
      _mm512_maskz_roundscale_ps(live, x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 f = _mm512_maskz_sub_ps(live, x, n);  // [-1/2, 1/2]; 0 off the live lanes
  __m512 p = _mm512_set1_ps(1.535336188319500e-4f);
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.339887440266574e-3f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(9.618437357674640e-3f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(5.550332471162809e-2f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(2.402264791363012e-1f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.931472028550421e-1f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
  return _mm512_maskz_scalef_ps(live, p, n);
}

// Lanes (of 16 fp32) whose index i0 + lane is below `limit`.
inline __mmask16 LanesBelow(size_t i0, size_t limit) {
  if (limit <= i0) return 0;
  return limit - i0 >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << (limit - i0)) - 1u);
}

// Mask of the elements [c0, min(limit, c0 + 32)) of a chunk of 32 (bf16).
inline __mmask32 Elements32(size_t c0, size_t limit) {
  if (limit <= c0) return 0;
  return limit - c0 >= 32 ? __mmask32(0xFFFFFFFFu) : __mmask32((1u << (limit - c0)) - 1u);
}

// The permutation of 32 bf16 (a0..a15, b0..b15) into 16 words (a[w], b[w]).
inline __m512i InterleaveIndex() {
  return _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22,
                          6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
}

// 16 fp32 of row a and 16 of row b, rounded to bf16 (nearest even) and
// interleaved into 16 words (a[w], b[w]).
inline __m512i InterleaveToWords(__m512 a, __m512 b) {
  const __m512i both = (__m512i)_mm512_cvtne2ps_pbh(b, a);  // a0..a15, b0..b15
  return _mm512_permutexvar_epi16(InterleaveIndex(), both);
}

// 32 fp32 of one row (lo: the first 16) rounded to bf16: 16 consecutive words.
inline __m512i RowToWords(__m512 lo, __m512 hi) { return (__m512i)_mm512_cvtne2ps_pbh(hi, lo); }

// The 16 bf16 at p whose lanes are in `lanes`, widened to fp32 (exact: a bf16
// is the top half of an fp32); zero in the other lanes, which are not read.
inline __m512 LoadWidened(__mmask16 lanes, const uint16_t* p) {
  return _mm512_castsi512_ps(
      _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(lanes, p)), 16));
}

// Largest and total of 16 lanes, in a fixed order (not _mm512_reduce_*_ps:
// GCC 12's header trips -Wuninitialized).
inline float HMax(__m512 v) {
  const __m256 a = _mm256_max_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1));
  __m128 b = _mm_max_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
  b = _mm_max_ps(b, _mm_movehl_ps(b, b));
  b = _mm_max_ss(b, _mm_shuffle_ps(b, b, 1));
  return _mm_cvtss_f32(b);
}
inline float HSum(__m512 v) {
  const __m256 a = _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1));
  __m128 b = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
  b = _mm_add_ps(b, _mm_movehl_ps(b, b));
  b = _mm_add_ss(b, _mm_shuffle_ps(b, b, 1));
  return _mm_cvtss_f32(b);
}

}  // namespace attn::kernels::avx512

#pragma GCC diagnostic pop
#pragma GCC pop_options

#endif  // ATTN_KERNELS_AVX512_BF16_INL_H_
