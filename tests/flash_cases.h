// tests/flash_cases.h - what the fp32 and bf16 flash-kernel tests share: the
// shape of one case, the errors they measure, and the relative error.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

namespace attn::test {

struct FlashCase {
  int64_t B, T, H, hd;
  bool causal;
  float dropout_p = 0.0f;
  bool fused_qkv = false;  // q, k, v side by side in one (B, T, 3·H·hd) buffer
  float input_scale = 1.0f;
};

inline std::string flash_case_name(const FlashCase& c) {
  return "B=" + std::to_string(c.B) + " T=" + std::to_string(c.T) + " H=" + std::to_string(c.H) +
         " hd=" + std::to_string(c.hd) + (c.causal ? " causal" : " full") +
         " p=" + std::to_string(c.dropout_p) + (c.fused_qkv ? " qkv" : "");
}

// Kernel against reference: the relative errors of the output, lse and the three gradients.
struct FlashErrors {
  double out, lse, dq, dk, dv;
};

// max |a − b| / max |b| (max |a − b| where b is all zeros); infinity where
// one side is NaN and the other is not.
inline double flash_rel_err(const std::vector<float>& a, const std::vector<float>& b) {
  double max_diff = 0.0, max_ref = 0.0;
  for (size_t n = 0; n < a.size(); ++n) {
    if (std::isnan(a[n]) != std::isnan(b[n])) return std::numeric_limits<double>::infinity();
    max_diff = std::max(max_diff, std::abs(double(a[n]) - double(b[n])));
    max_ref = std::max(max_ref, std::abs(double(b[n])));
  }
  return max_ref > 0.0 ? max_diff / max_ref : max_diff;
}

}  // namespace attn::test
