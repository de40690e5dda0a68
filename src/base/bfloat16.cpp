// bfloat16 conversions over arrays (attn/bfloat16.h).
#include "attn/bfloat16.h"

namespace attn {

// Compiled for AVX-512, AVX2 and the baseline and chosen at load time (the
// library has no SIMD dispatch at this level; with SSE2 alone the widening was
// ~6% of a bf16 training step on an Intel core without AMX).
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
__attribute__((target_clones("avx512f", "avx2", "default")))
#endif
void to_float(const BFloat16* src, float* dst, size_t n) {
  const auto* __restrict s = reinterpret_cast<const uint16_t*>(src);
  auto* __restrict d = reinterpret_cast<uint32_t*>(dst);
  for (size_t j = 0; j < n; ++j) d[j] = uint32_t(s[j]) << 16;
}

}  // namespace attn
