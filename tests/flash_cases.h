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

// The fixed set behind both kernels' "largest errors" tests: one case of each
// kind the other tests cover (tile edges, a single token, head widths 7 to
// 256, full attention, a long sequence, dropout, a peaked softmax, fused QKV).
inline std::vector<FlashCase> flash_largest_error_cases() {
  FlashCase peaked{2, 200, 2, 64, true};
  peaked.input_scale = 5.0f;
  FlashCase qkv{2, 77, 3, 24, false};
  qkv.fused_qkv = true;
  return {{1, 1, 2, 16, true},   {1, 65, 2, 64, true},  {1, 129, 2, 80, false},
          {2, 70, 3, 256, true}, {1, 37, 2, 7, false},  {1, 300, 2, 64, true},
          {2, 130, 2, 64, true, 0.5f}, peaked, qkv};
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
