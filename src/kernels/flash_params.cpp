// The scalar side of attn/kernels.h: the parameter checks every kernel runs,
// the Philox generator, and the core's dropout noise as the raw problem's
// (kernels::sdpa_dropout_noise, sdpa_problem.cpp). The plain maths the kernels
// are tested against is ref::strided_attention_*, in src/reference/.
#include <cmath>
#include <stdexcept>
#include <string>

#include "attn/kernels.h"
#include "attn/sdpa_problem.h"
#include "kernels/philox.h"

namespace attn::kernels {

namespace {

std::string str(int64_t v) { return std::to_string(v); }

}  // namespace

FlashAttentionParams validated(const FlashAttentionParams& params) {
  FlashAttentionParams p = params;
  const std::string where = "flash_attention: ";
  if (p.B < 1) throw std::invalid_argument(where + "B (" + str(p.B) + ") must be >= 1");
  if (p.T < 1) throw std::invalid_argument(where + "T (" + str(p.T) + ") must be >= 1");
  if (p.T > (int64_t{1} << 31))
    throw std::invalid_argument(where + "T (" + str(p.T) + ") must be <= 2^31");
  if (p.H < 1) throw std::invalid_argument(where + "H (" + str(p.H) + ") must be >= 1");
  if (p.hd < 1 || p.hd > kMaxHeadDim)
    throw std::invalid_argument(where + "head_dim (" + str(p.hd) + ") must be in [1, " +
                                str(kMaxHeadDim) + "]");
  if (!(p.dropout_p >= 0.0f && p.dropout_p < 1.0f))
    throw std::invalid_argument(where + "dropout_p (" + std::to_string(p.dropout_p) +
                                ") must be in [0, 1)");
  if (!std::isfinite(p.scale))
    throw std::invalid_argument(where + "scale (" + std::to_string(p.scale) + ") must be finite");
  if (p.scale < 0.0f) p.scale = 1.0f / std::sqrt(static_cast<float>(p.hd));
  const int64_t width = p.H * p.hd;  // d_out
  auto check_stride = [&](int64_t& s, const char* name) {
    if (s == 0) s = width;
    if (s < width)
      throw std::invalid_argument(where + name + " (" + str(s) + ") must be >= H * head_dim (" +
                                  str(p.H) + " * " + str(p.hd) + " = " + str(width) + ")");
  };
  check_stride(p.q_stride, "q_stride");
  check_stride(p.k_stride, "k_stride");
  check_stride(p.v_stride, "v_stride");
  check_stride(p.o_stride, "o_stride");
  return p;
}

void philox4x32(uint32_t out[4], const uint32_t counter[4], uint64_t key) {
  const PhiloxBlock r = philox4x32_10({counter[0], counter[1], counter[2], counter[3]}, key);
  for (int n = 0; n < 4; ++n) out[n] = r.x[n];
}

void flash_dropout_noise(float* noise, const FlashAttentionParams& params) {
  const FlashAttentionParams p = validated(params);
  sdpa_dropout_noise(noise, {p.H * p.T * p.T, p.T * p.T, p.T, 1}, p.B, p.H, p.T, p.T, p.dropout_p,
                     p.dropout_seed);
}

}  // namespace attn::kernels
