// src/kernels/avx512_transpose-inl.h - a 16 x 16 transpose of 32-bit elements
// in AVX-512 registers: the one shuffle network of the attention kernels'
// packing (flash_tiles-inl.h's ScaledTransposeN, fp32 tiles transposed as they
// are scaled; bf16_dot.cpp's pack_rows_t, words of two bf16 moved as floats).
//
// Compiled under its own target pragma, AVX-512F alone, so that it inlines
// into every caller that has at least that: Highway's AVX-512 targets and the
// AVX512-BF16 and AMX files. Include it with the other headers, at the top of
// the file, outside any namespace and outside any target pragma; call it only
// where the CPU has AVX-512.
#ifndef ATTN_KERNELS_AVX512_TRANSPOSE_INL_H_
#define ATTN_KERNELS_AVX512_TRANSPOSE_INL_H_

// GCC 12's AVX-512 headers start some intrinsics from an "undefined" vector
// (_mm512_undefined_*), which -Wmaybe-uninitialized reports where they are
// inlined; the state that counts is the one their definitions were read in.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop

#include <cstddef>

#pragma GCC push_options
#pragma GCC target("avx512f")

namespace attn::kernels::avx512 {

// a[i] is row i (16 lanes); afterwards a[j] holds lane j of every row.
inline void Transpose16(__m512 (&a)[16]) {
  __m512 t[16];
  for (size_t k = 0; k < 8; ++k) {  // pairs of rows interleaved
    t[2 * k] = _mm512_unpacklo_ps(a[2 * k], a[2 * k + 1]);
    t[2 * k + 1] = _mm512_unpackhi_ps(a[2 * k], a[2 * k + 1]);
  }
  for (size_t k = 0; k < 4; ++k) {  // 4 x 4 blocks within each 128-bit lane
    a[4 * k] = _mm512_shuffle_ps(t[4 * k], t[4 * k + 2], 0x44);
    a[4 * k + 1] = _mm512_shuffle_ps(t[4 * k], t[4 * k + 2], 0xEE);
    a[4 * k + 2] = _mm512_shuffle_ps(t[4 * k + 1], t[4 * k + 3], 0x44);
    a[4 * k + 3] = _mm512_shuffle_ps(t[4 * k + 1], t[4 * k + 3], 0xEE);
  }
  for (size_t k = 0; k < 2; ++k)  // then the 128-bit lanes across registers
    for (size_t q = 0; q < 4; ++q) {
      t[8 * k + q] = _mm512_shuffle_f32x4(a[8 * k + q], a[8 * k + 4 + q], 0x88);
      t[8 * k + 4 + q] = _mm512_shuffle_f32x4(a[8 * k + q], a[8 * k + 4 + q], 0xDD);
    }
  for (size_t q = 0; q < 8; ++q) {
    a[q] = _mm512_shuffle_f32x4(t[q], t[8 + q], 0x88);
    a[8 + q] = _mm512_shuffle_f32x4(t[q], t[8 + q], 0xDD);
  }
}

}  // namespace attn::kernels::avx512

#pragma GCC pop_options

#endif  // ATTN_KERNELS_AVX512_TRANSPOSE_INL_H_
