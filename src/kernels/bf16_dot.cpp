// The AVX512-BF16 product engine (kernels/bf16_dot.h): packing into words and
// the VDPBF16PS micro-kernels. AVX512-BF16 is not among Highway 1.0.3's
// targets, so this file uses the intrinsics under a target pragma (after every
// header: inline functions from headers keep the default target); it runs only
// where the CPU reports the feature.
#include "kernels/bf16_dot.h"

#include <immintrin.h>

#include <utility>

#include "kernels/avx512_bf16-inl.h"
#include "kernels/avx512_transpose-inl.h"

namespace attn::kernels::bf16dot {
namespace {

uint32_t Word(uint16_t lo, uint16_t hi) { return uint32_t(lo) | (uint32_t(hi) << 16); }

}  // namespace

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,fma")
// GCC 12's AVX-512 headers start some intrinsics from an "undefined" vector
// (_mm512_undefined_*), which -W(maybe-)uninitialized reports once inlined.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

using avx512::Elements32;
using avx512::InterleaveIndex;
using avx512::InterleaveToWords;
using avx512::LanesBelow;
using avx512::RowToWords;

// ---- packing: O(tile) per tile (the products are O(tile²)) -------------------------------

// Masked loads: nothing past a row's hd values is read.
void pack_rows(uint32_t* dst, const uint16_t* x, size_t stride, size_t n, size_t rows, size_t hd) {
  const size_t width = 2 * Pairs(hd);  // bf16 per packed row
  auto* out = reinterpret_cast<uint16_t*>(dst);
  for (size_t r = 0; r < rows; ++r)
    for (size_t c0 = 0; c0 < width; c0 += 32) {
      const __m512i v = r < n ? _mm512_maskz_loadu_epi16(Elements32(c0, hd), x + r * stride + c0)
                              : _mm512_setzero_si512();
      _mm512_mask_storeu_epi16(out + r * width + c0, Elements32(c0, width), v);
    }
}

// Even hd: blocks of 16 rows x 16 words, loaded (masked: nothing past a row's
// hd values or past row n is read) and transposed in registers. Odd hd: plain
// loops, which read no further than x[r][hd - 1].
void pack_rows_t(uint32_t* dst, const uint16_t* x, size_t stride, size_t n, size_t cols,
                 size_t hd) {
  const size_t hd2 = Pairs(hd);
  if (hd % 2 == 0 && cols % kN == 0) {
    for (size_t r0 = 0; r0 < cols; r0 += kN)
      for (size_t p0 = 0; p0 < hd2; p0 += kN) {
        const __mmask16 words = LanesBelow(p0, hd2);
        __m512 a[16];
        for (size_t i = 0; i < 16; ++i)
          a[i] = r0 + i < n ? _mm512_castsi512_ps(
                                  _mm512_maskz_loadu_epi32(words, x + (r0 + i) * stride + 2 * p0))
                            : _mm512_setzero_ps();
        avx512::Transpose16(a);  // the 32-bit words moved as floats
        for (size_t j = 0; j < 16 && p0 + j < hd2; ++j)
          _mm512_storeu_si512(dst + (p0 + j) * cols + r0, _mm512_castps_si512(a[j]));
      }
    return;
  }
  for (size_t r = 0; r < cols; ++r)
    for (size_t pr = 0; pr < hd2; ++pr) {
      const uint16_t lo = r < n ? x[r * stride + 2 * pr] : 0;
      const uint16_t hi = r < n && 2 * pr + 1 < hd ? x[r * stride + 2 * pr + 1] : 0;
      dst[pr * cols + r] = Word(lo, hi);
    }
}

void pack_row_pairs(uint32_t* dst, const uint16_t* x, size_t stride, size_t n, size_t rows,
                    size_t hd, size_t hdp) {
  const __m512i idx = InterleaveIndex();
  for (size_t pr = 0; pr < Pairs(rows); ++pr) {
    const uint16_t* a = x + 2 * pr * stride;
    for (size_t d0 = 0; d0 < hdp; d0 += kN) {
      const __mmask16 dims = LanesBelow(d0, hd);
      const __m256i va =
          2 * pr < n ? _mm256_maskz_loadu_epi16(dims, a + d0) : _mm256_setzero_si256();
      const __m256i vb =
          2 * pr + 1 < n ? _mm256_maskz_loadu_epi16(dims, a + stride + d0) : _mm256_setzero_si256();
      const __m512i both = _mm512_inserti64x4(_mm512_castsi256_si512(va), vb, 1);
      _mm512_storeu_si512(dst + pr * hdp + d0, _mm512_permutexvar_epi16(idx, both));
    }
  }
}

void round_row_pairs(uint32_t* dst, const float* x, size_t stride, size_t n, size_t rows,
                     size_t W) {
  const __m512 zero = _mm512_setzero_ps();
  for (size_t pr = 0; pr < Pairs(rows); ++pr) {
    const float* a = x + 2 * pr * stride;
    const bool has_a = 2 * pr < n, has_b = 2 * pr + 1 < n;
    for (size_t w = 0; w < W; w += kN) {
      const __m512 va = has_a ? _mm512_loadu_ps(a + w) : zero;
      const __m512 vb = has_b ? _mm512_loadu_ps(a + stride + w) : zero;
      _mm512_storeu_si512(dst + pr * W + w, InterleaveToWords(va, vb));
    }
  }
}

void round_rows(uint32_t* dst, const float* x, size_t stride, size_t n, size_t W) {
  for (size_t r = 0; r < n; ++r)
    for (size_t w = 0; w < W; w += 2 * kN)
      _mm512_storeu_si512(dst + r * (W / 2) + w / 2,
                          RowToWords(_mm512_loadu_ps(x + r * stride + w),
                                     _mm512_loadu_ps(x + r * stride + w + kN)));
}

void lane_dots(float* out, const uint32_t* a, const uint32_t* b, size_t pairs) {
  __m512 acc = _mm512_setzero_ps();
  for (size_t p = 0; p < pairs; ++p)
    acc = _mm512_dpbf16_ps(acc, (__m512bh)_mm512_loadu_si512(a + p * kN),
                           (__m512bh)_mm512_loadu_si512(b + p * kN));
  _mm512_storeu_ps(out, acc);
}

// ---- the micro-kernel (the fp32 kernel's, on words) ----------------------------------------

namespace {

enum Mode { kOverwrite = 0, kAccumulate = 1, kScaleAccumulate = 2 };

template <int kMode, size_t R, size_t V>
void MicroKernel(const uint32_t* __restrict A, size_t ars, size_t aks,
                 const uint32_t* __restrict Bm, size_t bs, size_t K, float* __restrict C, size_t cs,
                 const float* __restrict c_scale) {
  __m512 acc[R][V];
#pragma GCC unroll 8
  for (size_t r = 0; r < R; ++r) {
    const __m512 cr = kMode == kScaleAccumulate ? _mm512_set1_ps(c_scale[r]) : _mm512_setzero_ps();
#pragma GCC unroll 4
    for (size_t v = 0; v < V; ++v) {
      if constexpr (kMode == kOverwrite) {
        acc[r][v] = _mm512_setzero_ps();
      } else if constexpr (kMode == kAccumulate) {
        acc[r][v] = _mm512_loadu_ps(C + r * cs + v * kN);
      } else {
        acc[r][v] = _mm512_mul_ps(cr, _mm512_loadu_ps(C + r * cs + v * kN));
      }
    }
  }
  for (size_t k = 0; k < K; ++k) {
    __m512bh a[R];
#pragma GCC unroll 8
    for (size_t r = 0; r < R; ++r) a[r] = (__m512bh)_mm512_set1_epi32(int(A[r * ars + k * aks]));
    const uint32_t* __restrict b_row = Bm + k * bs;
#pragma GCC unroll 4
    for (size_t v = 0; v < V; ++v) {
      const __m512bh bv = (__m512bh)_mm512_loadu_si512(b_row + v * kN);
#pragma GCC unroll 8
      for (size_t r = 0; r < R; ++r) acc[r][v] = _mm512_dpbf16_ps(acc[r][v], a[r], bv);
    }
  }
#pragma GCC unroll 8
  for (size_t r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (size_t v = 0; v < V; ++v) _mm512_storeu_ps(C + r * cs + v * kN, acc[r][v]);
}

template <int kMode, size_t... I>
constexpr MicroTable Table(std::index_sequence<I...>) {
  return {&MicroKernel<kMode, I / kNV + 1, I % kNV + 1>...};
}

}  // namespace

#pragma GCC diagnostic pop
#pragma GCC pop_options

const MicroTable& micro_table(int mode) {
  static constexpr MicroTable kTables[3] = {
      Table<kOverwrite>(std::make_index_sequence<kMR * kNV>()),
      Table<kAccumulate>(std::make_index_sequence<kMR * kNV>()),
      Table<kScaleAccumulate>(std::make_index_sequence<kMR * kNV>())};
  return kTables[mode];
}

}  // namespace attn::kernels::bf16dot
