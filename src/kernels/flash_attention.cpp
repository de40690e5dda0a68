// Fused scaled-dot-product attention, forward and backward (FlashAttention-2
// style): the maths, the layouts and the dropout rule are described in
// attn/kernels.h. Since the sdpa kernel (sdpa_kernel.cpp, attn/sdpa.h) grew
// from this file's and covers its problem exactly (kernels/flash_as_sdpa.h),
// the two entry points here describe their token-major buffers to it and run
// it: one fp32 kernel to tune (its tiles, exp2 and micro-kernel are
// kernels/flash_tiles-inl.h), the bits of both entry points the same.
// What stays here: the SIMD target report and choice (Highway's dynamic
// dispatch is process-wide, so it is the sdpa kernel's too).
#include <string>
#include <string_view>
#include <vector>

#include "attn/kernels.h"
#include "attn/sdpa_problem.h"
#include "kernels/flash_as_sdpa.h"
#include "cpu/hwy_targets.h"
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/flash_attention.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

HWY_BEFORE_NAMESPACE();
namespace attn::kernels {
namespace HWY_NAMESPACE {

const char* TargetName() { return hwy::TargetName(HWY_TARGET); }

// NOLINTNEXTLINE(google-readability-namespace-comments)
}  // namespace HWY_NAMESPACE
}  // namespace attn::kernels
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace attn::kernels {

HWY_EXPORT(TargetName);

void flash_attention_forward(float* out, float* lse, const float* q, const float* k, const float* v,
                             const FlashAttentionParams& params) {
  ForwardAsSdpa(out, lse, q, k, v, validated(params));
}

void flash_attention_backward(float* dq, float* dk, float* dv, const float* dout, const float* q,
                              const float* k, const float* v, const float* out, const float* lse,
                              const FlashAttentionParams& params) {
  BackwardAsSdpa(dq, dk, dv, dout, q, k, v, out, lse, validated(params));
}

const char* flash_attention_target() { return HWY_DYNAMIC_DISPATCH(TargetName)(); }

bool simd_target_has_avx512() {
  return std::string_view(flash_attention_target()).substr(0, 4) == "AVX3";
}

std::vector<std::string> flash_attention_targets() {
  std::vector<std::string> names;
  for (int64_t target : hwy::SupportedAndGeneratedTargets())
    names.push_back(hwy::TargetName(target));
  return names;
}

bool flash_attention_use_target(const char* name) {
  hwy::SetSupportedTargetsForTest(0);  // the CPU's own list again
  if (name == nullptr) return true;
  for (int64_t target : hwy::SupportedAndGeneratedTargets()) {
    if (std::string(hwy::TargetName(target)) == name) {
      hwy::SetSupportedTargetsForTest(target);
      return true;
    }
  }
  return false;
}

}  // namespace attn::kernels
#endif  // HWY_ONCE
