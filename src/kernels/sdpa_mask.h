// src/kernels/sdpa_mask.h - which additive-mask values close their key, as the
// sdpa kernel reads them: it adds log2(e) · mask to scores in base 2, so a
// value whose product is -inf (-inf itself, or one below -FLT_MAX / log2(e),
// about -2.4e38, such as the float32 minimum that transformers' masks hold for
// a masked key) gives its key a weight of exactly 0. The kernel's block
// classes (sdpa_kernel.cpp) and the entry points' causal-mask rule
// (attention/sdpa.cpp) both ask this.
#pragma once

#include <limits>

namespace attn::kernels {

inline constexpr float kMaskLog2e = 1.44269504088896340736f;

inline bool mask_value_closes(float m) {
  return kMaskLog2e * m == -std::numeric_limits<float>::infinity();
}

}  // namespace attn::kernels
