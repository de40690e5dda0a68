// The plain scaled-dot-product attention of attn/sdpa.h: the specification the
// fused kernel (src/kernels/sdpa_kernel.cpp) is tested against. One query row
// at a time: its Tk scores, the softmax, the output; backward recomputes the
// row from the saved lse. fp32 throughout, strides followed as given. A
// variable-length packed batch: sequence by sequence, each through its view
// (sdpa_sequence) as a batched problem of its own.
#include "attn/sdpa_problem.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/philox.h"

namespace attn::ref {

namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

const float* at(const float* base, const SdpaStrides& s, int64_t b, int64_t h, int64_t t) {
  return base + b * s.b + h * s.h + t * s.t;
}
float* at(float* base, const SdpaStrides& s, int64_t b, int64_t h, int64_t t) {
  return base + b * s.b + h * s.h + t * s.t;
}

// Whether query i may see key j by the causal rule and the window (attn/sdpa.h).
bool in_band(const SdpaProblem& p, int64_t i, int64_t j) {
  const int64_t delta = p.causal_alignment == CausalAlignment::kBottomRight ? p.Tk - p.Tq : 0;
  if (p.is_causal && j > i + delta) return false;
  if (p.window_right >= 0 && j > i + delta + p.window_right) return false;
  if (p.window_left >= 0 && j < i + delta - p.window_left) return false;
  return true;
}

// The scores of query i of head (b, h) against every key: s (Tk), and, with a
// softcap, t (Tk) = tanh(scale · q·k / softcap) for the backward's chain rule.
void row_scores(std::vector<float>& s, std::vector<float>& t, const SdpaProblem& p, int64_t b,
                int64_t h, int64_t i) {
  const int64_t hk = h / (p.Hq / p.Hkv);
  const int64_t delta = p.causal_alignment == CausalAlignment::kBottomRight ? p.Tk - p.Tq : 0;
  const float* qi = at(p.q, p.q_strides, b, h, i);
  for (int64_t j = 0; j < p.Tk; ++j) {
    const float* kj = at(p.k, p.k_strides, b, hk, j);
    float dot = 0.0f;
    for (int64_t d = 0; d < p.D; ++d) dot += qi[d * p.q_strides.d] * kj[d * p.k_strides.d];
    float sij = p.scale * dot;
    if (p.softcap > 0.0f) {
      t[size_t(j)] = std::tanh(sij / p.softcap);
      sij = p.softcap * t[size_t(j)];
    }
    if (p.alibi_slopes)
      sij -= p.alibi_slopes[b * p.alibi_b_stride + h] * float(std::llabs(i + delta - j));
    const SdpaStrides& m = p.mask_strides;
    if (p.mask) sij += p.mask[b * m.b + h * m.h + i * m.t + j * m.d];
    if (p.bool_mask && p.bool_mask[b * m.b + h * m.h + i * m.t + j * m.d] == 0) sij = kNegInf;
    if (!in_band(p, i, j)) sij = kNegInf;
    s[size_t(j)] = sij;
  }
}

// The dropout factor Z[i, j] of head (b, h): the Philox stream of attn/kernels.h.
void row_noise(std::vector<float>& z, const SdpaProblem& p, int64_t b, int64_t h, int64_t i) {
  const kernels::DropoutRule rule(p.dropout_p);
  for (int64_t j0 = 0; j0 < p.Tk; j0 += 4) {
    const kernels::PhiloxBlock r = kernels::philox_dropout_block(p.dropout_seed, b, h, i, j0);
    for (int64_t j = j0; j < std::min(j0 + 4, p.Tk); ++j)
      z[size_t(j)] = rule.active() ? rule.noise(r.x[j - j0]) : 1.0f;
  }
}

// Batch b's rows (a whole batched problem's b, or a varlen sequence's view run as batch b).
void forward_batch(const SdpaOutput& o, const SdpaProblem& p, int64_t b) {
  const int64_t group = p.Hq / p.Hkv;
  const SdpaStrides ls = sdpa_lse_strides(o.lse_strides, p);
  std::vector<float> s(size_t(p.Tk)), t(size_t(p.Tk)), z(size_t(p.Tk), 1.0f), out_row(size_t(p.Dv));
  for (int64_t h = 0; h < p.Hq; ++h)
    for (int64_t i = 0; i < p.Tq; ++i) {
      row_scores(s, t, p, b, h, i);
      // softmax: P = exp(s - max) / Σ exp(s - max); an all -inf row (or no key) stays 0.
      const float m = s.empty() ? kNegInf : *std::max_element(s.begin(), s.end());
      float* lse = o.lse + b * ls.b + h * ls.h + i * ls.t;
      float* oi = at(o.out, o.out_strides, b, h, i);
      if (m == kNegInf) {
        *lse = kNegInf;
        for (int64_t d = 0; d < p.Dv; ++d) oi[d * o.out_strides.d] = 0.0f;
        continue;
      }
      float l = 0.0f;
      for (float& sj : s) {
        sj = std::exp(sj - m);
        l += sj;
      }
      *lse = m + std::log(l);
      if (p.dropout_p > 0.0f) row_noise(z, p, b, h, i);
      std::fill(out_row.begin(), out_row.end(), 0.0f);
      for (int64_t j = 0; j < p.Tk; ++j) {
        const float pz = s[size_t(j)] / l * z[size_t(j)];  // (P ⊙ Z)[i, j]
        const float* vj = at(p.v, p.v_strides, b, h / group, j);
        for (int64_t d = 0; d < p.Dv; ++d) out_row[size_t(d)] += pz * vj[d * p.v_strides.d];
      }
      for (int64_t d = 0; d < p.Dv; ++d) oi[d * o.out_strides.d] = out_row[size_t(d)];
    }
}

// For row i: P = exp(s - lse), dPz[j] = dO_i · v_j, dP = dPz ⊙ Z,
// dS = P ⊙ (dP - Σ_j P dP) (⊙ (1 - t²) with a softcap),
// dq_i = scale · Σ_j dS[j] k_j, dk_j += scale · dS[j] q_i, dv_j += (P ⊙ Z)[j] dO_i.
// Batch b's rows, as forward_batch.
void backward_batch(const SdpaBackwardIO& io, const SdpaProblem& p, int64_t b) {
  const int64_t group = p.Hq / p.Hkv;
  const SdpaStrides ls = sdpa_lse_strides(io.lse_strides, p);
  for (int64_t h = 0; h < p.Hkv; ++h) {
    for (int64_t j = 0; j < p.Tk; ++j) {
      float* dkj = at(io.dk, io.dk_strides, b, h, j);
      float* dvj = at(io.dv, io.dv_strides, b, h, j);
      for (int64_t d = 0; d < p.D; ++d) dkj[d * io.dk_strides.d] = 0.0f;
      for (int64_t d = 0; d < p.Dv; ++d) dvj[d * io.dv_strides.d] = 0.0f;
    }
  }
  std::vector<float> s(size_t(p.Tk)), t(size_t(p.Tk)), z(size_t(p.Tk), 1.0f), dP(size_t(p.Tk));
  std::vector<float> dq_row(size_t(p.D));
  for (int64_t h = 0; h < p.Hq; ++h)
    for (int64_t i = 0; i < p.Tq; ++i) {
      const int64_t hk = h / group;
      std::fill(dq_row.begin(), dq_row.end(), 0.0f);
      const float lse = io.lse[b * ls.b + h * ls.h + i * ls.t];
      if (lse != kNegInf) {
        row_scores(s, t, p, b, h, i);
        if (p.dropout_p > 0.0f) row_noise(z, p, b, h, i);
        const float* doi = at(io.dout, io.dout_strides, b, h, i);
        float sum_p_dp = 0.0f;
        for (int64_t j = 0; j < p.Tk; ++j) {
          s[size_t(j)] = std::exp(s[size_t(j)] - lse);  // P[i, j]
          const float* vj = at(p.v, p.v_strides, b, hk, j);
          float dpz = 0.0f;
          for (int64_t d = 0; d < p.Dv; ++d)
            dpz += doi[d * io.dout_strides.d] * vj[d * p.v_strides.d];
          dP[size_t(j)] = dpz * z[size_t(j)];
          sum_p_dp += s[size_t(j)] * dP[size_t(j)];
        }
        const float* qi = at(p.q, p.q_strides, b, h, i);
        for (int64_t j = 0; j < p.Tk; ++j) {
          const float pij = s[size_t(j)];
          if (pij == 0.0f) continue;  // masked (or underflowed): no gradient
          float ds = pij * (dP[size_t(j)] - sum_p_dp);
          if (p.softcap > 0.0f) ds *= 1.0f - t[size_t(j)] * t[size_t(j)];
          const float* kj = at(p.k, p.k_strides, b, hk, j);
          float* dkj = at(io.dk, io.dk_strides, b, hk, j);
          float* dvj = at(io.dv, io.dv_strides, b, hk, j);
          for (int64_t d = 0; d < p.D; ++d) {
            dq_row[size_t(d)] += p.scale * ds * kj[d * p.k_strides.d];
            dkj[d * io.dk_strides.d] += p.scale * ds * qi[d * p.q_strides.d];
          }
          const float pz = pij * z[size_t(j)];
          for (int64_t d = 0; d < p.Dv; ++d)
            dvj[d * io.dv_strides.d] += pz * doi[d * io.dout_strides.d];
        }
      }
      float* dqi = at(io.dq, io.dq_strides, b, h, i);
      for (int64_t d = 0; d < p.D; ++d) dqi[d * io.dq_strides.d] = dq_row[size_t(d)];
    }
}

}  // namespace

// A varlen problem: each sequence through its own view (attn/sdpa_problem.h's sdpa_sequence), as batch b.
void sdpa_forward(const SdpaOutput& o, const SdpaProblem& p) {
  for (int64_t b = 0; b < p.B; ++b) {
    if (p.cu_seqlens_q)
      forward_batch(sdpa_sequence(o, p, b), sdpa_sequence(p, b), b);
    else
      forward_batch(o, p, b);
  }
}

void sdpa_backward(const SdpaBackwardIO& io, const SdpaProblem& p) {
  for (int64_t b = 0; b < p.B; ++b) {
    if (p.cu_seqlens_q)
      backward_batch(sdpa_sequence(io, p, b), sdpa_sequence(p, b), b);
    else
      backward_batch(io, p, b);
  }
}

}  // namespace attn::ref
