// src/random/cephes.h - the single-precision Cephes log and sincos that
// PyTorch's vectorised normal sampler uses, one lane at a time.
//
// torch 1.13 draws randn for 16 or more float32 elements with
// normal_fill_16_AVX2, which evaluates log256_ps and sincos256_ps from
// aten/src/ATen/native/cpu/avx_mathfun.h (Julien Pommier's port of Cephes'
// logf/sinf/cosf). PyTorch compiles that file with GCC's default FMA
// contraction, so some multiply-adds are fused; the functions here reproduce
// the same operations in the same order, with the fused ones written as
// std::fmaf, and give the same bits as the AVX2 code lane for lane.
// (See docs/rng.md, section 4.)
#pragma once

namespace attn::detail {

// Natural logarithm of x > 0 by Cephes' range reduction and degree-8
// polynomial; NaN for x <= 0.
float cephes_logf(float x);

// sin(x) and cos(x) by Cephes' reduction to [-pi/4, pi/4] (x scaled by 4/pi,
// octant j rounded up to even) and its two minimax polynomials; good for
// |x| < 8192, which covers the [0, 2*pi) angles of Box-Muller.
struct SinCos {
  float sin;
  float cos;
};
SinCos cephes_sincosf(float x);

// normal_fill_16_AVX2 on one block of 16 uniforms u in [0, 1): for j < 8,
//   radius = sqrt(-2 log(1 - u[j])),  theta = 2 pi u[j + 8],
//   u[j]     = fma(radius * cos(theta), std, mean),
//   u[j + 8] = fma(radius * sin(theta), std, mean).
void normal_fill16(float* u, float mean, float std);  // u: (16), in place

}  // namespace attn::detail
