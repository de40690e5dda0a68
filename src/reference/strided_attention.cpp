// The plain version of the fused kernels' maths (attn/functional.h,
// ref::strided_attention_*): loops, one (b, h, i) at a time, fp64 sums, in the
// kernels' token-major layout and parameters, so that the kernels are tested
// against it element for element.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "attn/functional.h"
#include "attn/kernels.h"

namespace attn::ref {

using kernels::FlashAttentionParams;
using kernels::validated;

namespace {

struct ExpScores {
  double max;  // max_j s_j
  double sum;  // Σ_j e[j]
};

// e[j] = exp(s_j − max s) for the keys j < n_keys that query qi of head (b, h)
// sees, with s_j = scale · qi · k_j (fp64).
ExpScores exp_scores(double* e, const float* qi, const float* k, int64_t b, int64_t h,
                     int64_t n_keys, const FlashAttentionParams& p) {
  double max_s = -std::numeric_limits<double>::infinity();
  for (int64_t j = 0; j < n_keys; ++j) {
    const float* kj = k + (b * p.T + j) * p.k_stride + h * p.hd;
    double dot = 0.0;
    for (int64_t d = 0; d < p.hd; ++d) dot += double(qi[d]) * double(kj[d]);
    e[j] = double(p.scale) * dot;
    max_s = std::max(max_s, e[j]);
  }
  double sum = 0.0;
  for (int64_t j = 0; j < n_keys; ++j) {
    e[j] = std::exp(e[j] - max_s);
    sum += e[j];
  }
  return {max_s, sum};
}

}  // namespace

void strided_attention_forward(float* out, float* lse, const float* q, const float* k,
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
        const auto [max_s, sum] = exp_scores(s.data(), qi, k, b, h, n_keys, p);
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

void strided_attention_backward(float* dq, float* dk, float* dv, const float* dout, const float* q,
                                const float* k, const float* v, const float* noise,
                                const FlashAttentionParams& params) {
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
        const double sum = exp_scores(P.data(), qi, k, b, h, n_keys, p).sum;
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

}  // namespace attn::ref
