// src/kernels/tile_mask-inl.h - an additive mask (sdpa's attn_mask,
// kernels/flash_bf16_strided.h's AdditiveMask) as the AMX attention kernel
// (flash_attention_amx.cpp, the "AMX" path) reads it, in query and key tiles
// of 64. Its 64 x 64 tiles in each of its planes (the (b, h) pairs its
// strides tell apart) are classified once a call, as sdpa_kernel.cpp's
// MaskBlocks classifies its 16 x 16 blocks: whether a tile holds a value that
// is open (kernels/sdpa_mask.h), and one that is not 0. A tile with no open
// value is skipped (its weights are exactly 0), one of zeros adds nothing;
// the kernel reads the values of the others along a query's row (Load).
//
// AVX-512 intrinsics under their own target pragma, as avx512_bf16-inl.h:
// include this header with the other headers, outside any namespace and any
// target pragma; its callers run only where the CPU has AVX-512.
#ifndef ATTN_KERNELS_TILE_MASK_INL_H_
#define ATTN_KERNELS_TILE_MASK_INL_H_

#include <immintrin.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <vector>

#include "kernels/avx512_bf16-inl.h"
#include "kernels/flash_bf16_strided.h"
#include "kernels/sdpa_mask.h"

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,fma")
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

namespace attn::kernels::avx512 {

class TileMask {
 public:
  static constexpr size_t kTile = 64;  // query and key tile
  static constexpr size_t kN = 16;     // fp32 lanes

  // The mask of B batches and H query heads, Tq queries and Tk keys. Reads
  // every value once, in parallel over the tile rows (call it outside a
  // parallel region).
  TileMask(const AdditiveMask& m, int64_t B, int64_t H, size_t Tq, size_t Tk)
      : m_(m),
        per_b_(m.b != 0),
        per_h_(m.h != 0),
        planes_h_(per_h_ ? size_t(H) : 1),
        nti_((Tq + kTile - 1) / kTile),
        ntj_((Tk + kTile - 1) / kTile),
        flags_((per_b_ ? size_t(B) : 1) * planes_h_ * nti_ * ntj_, 0) {
    const int64_t tile_rows = int64_t(flags_.size() / std::max<size_t>(ntj_, 1));
#pragma omp parallel for schedule(static) if (tile_rows > 1)
    for (int64_t r = 0; r < tile_rows; ++r) {
      const size_t plane = size_t(r) / nti_, ti = size_t(r) % nti_;
      const int64_t b = int64_t(plane / planes_h_), h = int64_t(plane % planes_h_);
      uint8_t* f = flags_.data() + size_t(r) * ntj_;
      const __m512 closed = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
      const __m512 l2e = _mm512_set1_ps(kMaskLog2e);
      for (size_t i = ti * kTile; i < std::min(Tq, (ti + 1) * kTile); ++i) {
        const float* row = Row(b, h, i);
        for (size_t tj = 0; tj < ntj_; ++tj) {
          __mmask16 open = 0, nonzero = 0;
          for (size_t j = tj * kTile; j < std::min(Tk, (tj + 1) * kTile); j += kN) {
            const __mmask16 valid = LanesBelow(j, Tk);
            const __m512 x = Load(row, j, valid);
            // mask_value_closes in vectors: log2(e) · x == -inf
            open |= _mm512_mask_cmp_ps_mask(valid, _mm512_mul_ps(l2e, x), closed, _CMP_NEQ_UQ);
            nonzero |= _mm512_mask_cmp_ps_mask(valid, x, _mm512_setzero_ps(), _CMP_NEQ_UQ);
          }
          f[tj] |= uint8_t((open ? kOpen : 0) | (nonzero ? kNonZero : 0));
        }
      }
    }
  }

  // Whether every value of query tile i0 x key tile j0 of head (b, h) is
  // closed; whether one is not 0 (i0, j0 multiples of 64).
  bool Hidden(int64_t b, int64_t h, size_t i0, size_t j0) const {
    return (Flags(b, h, i0, j0) & kOpen) == 0;
  }
  bool Adds(int64_t b, int64_t h, size_t i0, size_t j0) const {
    return (Flags(b, h, i0, j0) & kNonZero) != 0;
  }
  // Query i's row of head (b, h), and its keys j .. j + 15 (the valid lanes; 0 elsewhere).
  const float* Row(int64_t b, int64_t h, size_t i) const {
    return m_.data + b * m_.b + h * m_.h + int64_t(i) * m_.t;
  }
  __m512 Load(const float* row, size_t j, __mmask16 valid) const {
    if (m_.d == 1) return _mm512_maskz_loadu_ps(valid, row + j);
    alignas(64) float x[kN] = {};
    for (size_t u = 0; u < kN; ++u)
      if ((valid >> u) & 1) x[u] = row[int64_t(j + u) * m_.d];
    return _mm512_load_ps(x);
  }

 private:
  static constexpr uint8_t kOpen = 1, kNonZero = 2;
  uint8_t Flags(int64_t b, int64_t h, size_t i0, size_t j0) const {
    const size_t plane = size_t(per_b_ ? b : 0) * planes_h_ + size_t(per_h_ ? h : 0);
    return flags_[(plane * nti_ + i0 / kTile) * ntj_ + j0 / kTile];
  }
  AdditiveMask m_;
  bool per_b_, per_h_;
  size_t planes_h_, nti_, ntj_;
  std::vector<uint8_t> flags_;  // (plane, query tile, key tile)
};

}  // namespace attn::kernels::avx512

#pragma GCC diagnostic pop
#pragma GCC pop_options

#endif  // ATTN_KERNELS_TILE_MASK_INL_H_
