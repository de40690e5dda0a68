// attn/rope_kernel.h - rotary position embedding on raw rows: the rows the
// Tensor functions of attn/rope.h (and the fused attention block, attn/fused.h)
// rotate, the plain loop that specifies it (src/reference/rope_reference.cpp)
// and the same loop with the rows in parallel (src/kernels/rope_kernel.cpp).
// The maths and the tables are attn/rope.h's.
#pragma once

#include <cstdint>

#include "attn/bfloat16.h"

namespace attn {

// ---- the raw layer ---------------------------------------------------------------------
// rows rows of hd values; row r at x + r_offset(r) (below), its position
// positions(r). The Tensor functions resolve (B, H, T) strides into these.
struct RopeRows {
  int64_t B = 1, H = 1, T = 1, hd = 2;
  int64_t stride_b = 0, stride_h = 0, stride_t = 0;  // in elements; stride over hd is 1
  int64_t position_offset = 0;
  const float* cos = nullptr;  // (L, hd) contiguous
  const float* sin = nullptr;
  bool inverse = false;  // the backward's transposed map
};

namespace ref {
// The specification: each row y = x ⊙ cos + rotate_half(x) ⊙ sin (or the
// transposed map), in place, one row after another.
void rope_rows(float* x, const RopeRows& r);
void rope_rows(BFloat16* x, const RopeRows& r);
}  // namespace ref

namespace kernels {
// The same maths, rows in parallel; identical bits to ref::rope_rows.
void rope_rows(float* x, const RopeRows& r);
void rope_rows(BFloat16* x, const RopeRows& r);
}  // namespace kernels

}  // namespace attn
