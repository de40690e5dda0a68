// attn/bfloat16.h - the bfloat16 number: the high half of a float32's bits,
// as PyTorch stores torch.bfloat16, and its conversions to and from float32.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace attn {

// A bfloat16 value as PyTorch stores it: the high half of a float32's bits.
struct BFloat16 {
  uint16_t bits = 0;
};
// float32 -> bfloat16 with round-to-nearest-even, as PyTorch's vectorised CPU
// cast (.to(torch.bfloat16) of a tensor) rounds; every NaN becomes 0xFFFF, as
// that cast writes it (c10's scalar round_to_nearest_even, which PyTorch uses
// for a 0-d tensor, writes 0x7FC0 instead: both are NaN).
inline BFloat16 to_bfloat16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  if ((u & 0x7F800000u) == 0x7F800000u && (u & 0x007FFFFFu) != 0) return {0xFFFF};
  const uint32_t rounding_bias = 0x7FFFu + ((u >> 16) & 1u);
  return {static_cast<uint16_t>((u + rounding_bias) >> 16)};
}
// bfloat16 -> float32 is exact.
inline float to_float(BFloat16 b) {
  const uint32_t u = static_cast<uint32_t>(b.bits) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// src[0:n] widened to float32 into dst[0:n] (exact), vectorised for AVX-512
// and AVX2 where the CPU has them (chosen at load time): how gemm_bf16's
// widened route loads its operands (the Highway kernels widen in registers,
// src/kernels/bf16_load-inl.h).
void to_float(const BFloat16* src, float* dst, size_t n);

}  // namespace attn
