// The plain side of attn/kernels.h: parameter checks, the Philox generator and
// its dropout noise, and the loop-by-loop attention the fused kernels are
// tested against.
#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "attn/kernels.h"
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
  const DropoutRule rule(p.dropout_p);
  for (int64_t b = 0; b < p.B; ++b)
    for (int64_t h = 0; h < p.H; ++h)
      for (int64_t i = 0; i < p.T; ++i) {
        float* row = noise + ((b * p.H + h) * p.T + i) * p.T;  // (T)
        for (int64_t j0 = 0; j0 < p.T; j0 += 4) {
          const PhiloxBlock r = philox_dropout_block(p.dropout_seed, b, h, i, j0);
          for (int64_t j = j0; j < std::min(j0 + 4, p.T); ++j) row[j] = rule.noise(r.x[j - j0]);
        }
      }
}

// ---- plain attention, one (b, h, i) at a time ----------------------------------------

void attention_reference_forward(float* out, float* lse, const float* q, const float* k,
                                 const float* v, const float* noise,
                                 const FlashAttentionParams& params) {
  const FlashAttentionParams p = validated(params);
  const int64_t T = p.T, H = p.H, hd = p.hd;
  std::vector<double> s(T);   // (T) scores of one query, then its weights
  std::vector<double> o(hd);  // (hd)
  for (int64_t b = 0; b < p.B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < T; ++i) {
        const float* qi = q + (b * T + i) * p.q_stride + h * hd;
        const int64_t n_keys = p.causal ? i + 1 : T;  // keys j > i are masked (weight 0)
        double max_s = -std::numeric_limits<double>::infinity();
        for (int64_t j = 0; j < n_keys; ++j) {
          const float* kj = k + (b * T + j) * p.k_stride + h * hd;
          double dot = 0.0;
          for (int64_t d = 0; d < hd; ++d) dot += double(qi[d]) * double(kj[d]);
          s[j] = double(p.scale) * dot;
          max_s = std::max(max_s, s[j]);
        }
        double sum = 0.0;
        for (int64_t j = 0; j < n_keys; ++j) {
          s[j] = std::exp(s[j] - max_s);
          sum += s[j];
        }
        lse[(b * H + h) * T + i] = float(max_s + std::log(sum));
        std::fill(o.begin(), o.end(), 0.0);
        const float* zi = noise ? noise + ((b * H + h) * T + i) * T : nullptr;  // (T)
        for (int64_t j = 0; j < n_keys; ++j) {
          const double w = s[j] / sum * (zi ? double(zi[j]) : 1.0);
          const float* vj = v + (b * T + j) * p.v_stride + h * hd;
          for (int64_t d = 0; d < hd; ++d) o[d] += w * double(vj[d]);
        }
        float* oi = out + (b * T + i) * p.o_stride + h * hd;
        for (int64_t d = 0; d < hd; ++d) oi[d] = float(o[d]);
      }
}

void attention_reference_backward(float* dq, float* dk, float* dv, const float* dout,
                                  const float* q, const float* k, const float* v,
                                  const float* noise, const FlashAttentionParams& params) {
  const FlashAttentionParams p = validated(params);
  const int64_t T = p.T, H = p.H, hd = p.hd;
  std::vector<double> P(T), dP(T);  // (T) one query's weights, their grads
  std::vector<double> dq_h(T * hd), dk_h(T * hd), dv_h(T * hd);  // (T, hd) one head
  for (int64_t b = 0; b < p.B; ++b)
    for (int64_t h = 0; h < H; ++h) {
      std::fill(dq_h.begin(), dq_h.end(), 0.0);
      std::fill(dk_h.begin(), dk_h.end(), 0.0);
      std::fill(dv_h.begin(), dv_h.end(), 0.0);
      for (int64_t i = 0; i < T; ++i) {
        const float* qi = q + (b * T + i) * p.q_stride + h * hd;
        const float* doi = dout + (b * T + i) * p.o_stride + h * hd;
        const float* zi = noise ? noise + ((b * H + h) * T + i) * T : nullptr;  // (T)
        const int64_t n_keys = p.causal ? i + 1 : T;
        // Recompute the softmax row.
        double max_s = -std::numeric_limits<double>::infinity();
        for (int64_t j = 0; j < n_keys; ++j) {
          const float* kj = k + (b * T + j) * p.k_stride + h * hd;
          double dot = 0.0;
          for (int64_t d = 0; d < hd; ++d) dot += double(qi[d]) * double(kj[d]);
          P[j] = double(p.scale) * dot;
          max_s = std::max(max_s, P[j]);
        }
        double sum = 0.0;
        for (int64_t j = 0; j < n_keys; ++j) {
          P[j] = std::exp(P[j] - max_s);
          sum += P[j];
        }
        for (int64_t j = 0; j < n_keys; ++j) P[j] /= sum;
        // dP = (dO Vᵀ) ⊙ Z; softmax backward dS = P ⊙ (dP − Σ_j P dP).
        double sum_p_dp = 0.0;
        for (int64_t j = 0; j < n_keys; ++j) {
          const float* vj = v + (b * T + j) * p.v_stride + h * hd;
          double dot = 0.0;
          for (int64_t d = 0; d < hd; ++d) dot += double(doi[d]) * double(vj[d]);
          dP[j] = dot * (zi ? double(zi[j]) : 1.0);
          sum_p_dp += P[j] * dP[j];
        }
        for (int64_t j = 0; j < n_keys; ++j) {
          const double z = zi ? double(zi[j]) : 1.0;
          const double dS = P[j] * (dP[j] - sum_p_dp) * double(p.scale);  // d loss / d (q·k)
          const float* kj = k + (b * T + j) * p.k_stride + h * hd;
          for (int64_t d = 0; d < hd; ++d) {
            dq_h[i * hd + d] += dS * double(kj[d]);
            dk_h[j * hd + d] += dS * double(qi[d]);
            dv_h[j * hd + d] += P[j] * z * double(doi[d]);
          }
        }
      }
      for (int64_t t = 0; t < T; ++t)
        for (int64_t d = 0; d < hd; ++d) {
          dq[(b * T + t) * p.q_stride + h * hd + d] = float(dq_h[t * hd + d]);
          dk[(b * T + t) * p.k_stride + h * hd + d] = float(dk_h[t * hd + d]);
          dv[(b * T + t) * p.v_stride + h * hd + d] = float(dv_h[t * hd + d]);
        }
    }
}

}  // namespace attn::kernels
