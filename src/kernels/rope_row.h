// src/kernels/rope_row.h - one row of rotary position embedding (attn/rope.h),
// the loop both ref::rope_rows and kernels::rope_rows run, so the two agree bit
// for bit. The pairs (i, i + h) are independent and contiguous in x, cos and
// sin: the compiler vectorises the loop. It sits with the kernels, the lower
// layer, so that src/reference includes it from below (as it does philox.h)
// and no kernel includes anything of src/reference.
#pragma once

#include <cstdint>

#include "attn/tensor.h"

namespace attn::detail {

// x (hd) in place; c, s the position's rows (hd) of the cos and sin tables.
// Forward:  y_i = x_i c_i - x_{i+h} s_i,          y_{i+h} = x_{i+h} c_{i+h} + x_i s_{i+h}
// Inverse:  y_i = x_i c_i + x_{i+h} s_{i+h},      y_{i+h} = x_{i+h} c_{i+h} - x_i s_i
// (each product rounded, then the sum: the book's (x * cos) + (rotated * sin)).
inline void rope_row(float* __restrict x, const float* __restrict c, const float* __restrict s,
                     int64_t hd, bool inverse) {
  const int64_t h = hd / 2;
  float* __restrict x1 = x;
  float* __restrict x2 = x + h;
  if (!inverse) {
    for (int64_t i = 0; i < h; ++i) {
      const float a = x1[i], b = x2[i];
      const float p = a * c[i], q = b * s[i];
      const float r = b * c[i + h], t = a * s[i + h];
      x1[i] = p - q;
      x2[i] = r + t;
    }
  } else {
    for (int64_t i = 0; i < h; ++i) {
      const float a = x1[i], b = x2[i];
      const float p = a * c[i], q = b * s[i + h];
      const float r = b * c[i + h], t = a * s[i];
      x1[i] = p + q;
      x2[i] = r - t;
    }
  }
}

// A bfloat16 row: widened to float32 in `buf` (hd), rotated, rounded once.
inline void rope_row(BFloat16* x, const float* c, const float* s, int64_t hd, bool inverse,
                     float* buf) {
  for (int64_t i = 0; i < hd; ++i) buf[i] = to_float(x[i]);
  rope_row(buf, c, s, hd, inverse);
  for (int64_t i = 0; i < hd; ++i) x[i] = to_bfloat16(buf[i]);
}

}  // namespace attn::detail
