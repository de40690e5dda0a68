// Fused scaled-dot-product attention, forward and backward (FlashAttention-2
// style), SIMD via Highway's dynamic dispatch. The maths, the layouts and the
// dropout rule are described in attn/kernels.h; this file is how.
//
// Every matrix product here is one small GEMM shape,
//   C[r, 0:W] (+)= Σ_k A[r·ars + k·aks] · B[k·bs + 0:W],
// computed by a register-blocked micro-kernel (kernels/flash_tiles-inl.h, shared
// with sdpa_kernel.cpp): kMR rows of A broadcast against
// up to kNV vectors of a row of B. A is read through strides, so the
// transposed operands (Pᵀ, dSᵀ) cost nothing; B rows must be contiguous.
//
// Forward, per (b, h, group of kGroup query tiles of Br = kNV·N rows), keys in
// tiles of kBcFwd, each K/V tile used by the whole group while it is in cache:
//   Sᵀ (keys, Br)  = K_tile · (c·Q_tileᵀ)       c = scale·log2(e): the scores in base 2
//   online softmax down the key axis of Sᵀ (vector lanes = queries, no shuffles)
//   O (Br, hd)     = α ⊙ O + Pᵀᵀ · V_tile         α = 2^(m_old − m_new)
// Backward, per (b, h): groups of key tiles of Bc = kNV·N keys outside, query
// tiles of kBrBwd rows inside; dK and dV accumulate in the thread's buffers, dQ
// in place. A thread owns a whole head, or (few heads) the key-tile and then
// the query-tile tasks of a head: every sum runs in one fixed order either way,
// so the bits do not depend on the thread count, and no atomics are needed.
// Causal tiles above the diagonal are never visited; tiles on it skip the
// masked triangle at micro-kernel granularity.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "attn/kernels.h"
#include "kernels/philox.h"

#ifdef _OPENMP
#include <omp.h>
#endif

#include "kernels/hwy_targets.h"
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/flash_attention.cpp"
#include <hwy/aligned_allocator.h>
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include "kernels/flash_tiles-inl.h"

HWY_BEFORE_NAMESPACE();
namespace attn::kernels {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

constexpr size_t kBr = kNV * kN;  // forward query tile: one micro-kernel row width
constexpr size_t kBcFwd = 64;     // forward key tile (a multiple of 4 for Philox)
constexpr size_t kBc = kNV * kN;  // backward key tile
constexpr size_t kBrBwd = 64;     // backward query tile

// ---- forward ------------------------------------------------------------------------------

// Query tiles per work item: they share every K and V tile while it is in
// cache, so long sequences stream K and V (and walk their pages) once per kGroup tiles.
constexpr size_t kGroup = 4;

struct ForwardScratch {
  hwy::AlignedFreeUniquePtr<float[]> qT;           // (G, hd, Br)   c·Qᵀ of each query tile
  hwy::AlignedFreeUniquePtr<float[]> sT;           // (Bc, Br)      scores, then weights, key-major
  hwy::AlignedFreeUniquePtr<float[]> o;            // (G, Br, hdp)  unnormalised outputs
  hwy::AlignedFreeUniquePtr<float[]> v_pad;        // (Bc, hdp)     V tile padded (hd % N != 0)
  hwy::AlignedFreeUniquePtr<float[]> m, l, alpha;  // (G, Br) running max, sum, rescale
  explicit ForwardScratch(size_t hd, size_t hdp)
      : qT(hwy::AllocateAligned<float>(kGroup * hd * kBr)),
        sT(hwy::AllocateAligned<float>(kBcFwd * kBr)),
        o(hwy::AllocateAligned<float>(kGroup * kBr * hdp)),
        v_pad(hwy::AllocateAligned<float>(kBcFwd * hdp)),
        m(hwy::AllocateAligned<float>(kGroup * kBr)),
        l(hwy::AllocateAligned<float>(kGroup * kBr)),
        alpha(hwy::AllocateAligned<float>(kGroup * kBr)) {}
};

// One query tile [i0, i0 + in) against keys [j0, j0 + jn): scores, online
// softmax, O update. qT, o, m, l, alpha are the tile's own state.
void ForwardStep(const FlashAttentionParams& p, int64_t b, int64_t h, size_t i0, size_t in,
                 size_t j0, size_t jn, const float* k_tile, const float* v_tile,
                 size_t v_tile_stride, const float* HWY_RESTRICT qT, float* HWY_RESTRICT sT,
                 float* HWY_RESTRICT o, float* HWY_RESTRICT m, float* HWY_RESTRICT l,
                 float* HWY_RESTRICT alpha) {
  const DF d;
  const size_t hd = size_t(p.hd), hdp = RoundUp(hd, kN);
  const DropoutRule rule(p.dropout_p);
  // Sᵀ (jn, Br) = K_tile · qT; on the diagonal, keys j0+r0.. skip the query
  // vectors that lie wholly before them.
  const bool diagonal = p.causal && j0 + jn - 1 > i0;
  GemmSpans<kOverwrite>(jn, kBr, k_tile, p.k_stride, 1, qT, kBr, sT, kBr, nullptr,
                        [&](size_t r0, size_t) {
                          const size_t j = j0 + r0;
                          return Span{0, hd, diagonal && j > i0 ? (j - i0) / kN : 0, kNV};
                        });
  if (diagonal) {  // -inf where j > i
    for (size_t jj = 0; jj < jn; ++jj) {
      const size_t j = j0 + jj;
      for (size_t v0 = 0; v0 < kBr && i0 + v0 < j; v0 += kN) {
        const auto future = hn::Lt(hn::Iota(d, float(i0 + v0)), hn::Set(d, float(j)));
        float* sp = sT + jj * kBr + v0;
        hn::Store(hn::IfThenElse(future, hn::Set(d, kNegInf), hn::Load(d, sp)), d, sp);
      }
    }
  }
  // Online softmax down the key axis, N queries per vector.
  for (size_t v0 = 0; v0 < kBr; v0 += kN) {
    VF tile_max = hn::Set(d, kNegInf);
    for (size_t jj = 0; jj < jn; ++jj)
      tile_max = hn::Max(tile_max, hn::Load(d, sT + jj * kBr + v0));
    const VF m_old = hn::Load(d, m + v0);
    const VF m_new = hn::Max(m_old, tile_max);
    VF sum = hn::Zero(d);
    for (size_t jj = 0; jj < jn; ++jj) {
      float* sp = sT + jj * kBr + v0;
      const VF pv = Exp2(d, hn::Sub(hn::Load(d, sp), m_new));
      hn::Store(pv, d, sp);
      sum = hn::Add(sum, pv);
    }
    const VF a = Exp2(d, hn::Sub(m_old, m_new));  // 0 on the first tile (m_old = -inf)
    hn::Store(a, d, alpha + v0);
    hn::Store(m_new, d, m + v0);
    hn::Store(hn::MulAdd(a, hn::Load(d, l + v0), sum), d, l + v0);
  }
  if (rule.active()) {  // P ⊙ Z after the sums: l stays the softmax denominator
    DropoutTileT<kBr>(rule, p.dropout_seed, b, h, i0, j0, jn, sT);
  }
  // O (in, hdp) = α ⊙ O + P (in, jn) · V_tile (jn, hdp), P read from Sᵀ; on the
  // diagonal, queries up to i stop at key i.
  GemmSpans<kScaleAccumulate>(in, hdp, sT, 1, kBr, v_tile, v_tile_stride, o, hdp, alpha,
                              [&](size_t r0, size_t nr) {
                                const size_t i_end = i0 + r0 + nr;  // one past the last query
                                return Span{0, diagonal ? std::min(jn, i_end - j0) : jn, 0, kNV};
                              });
}

// Query tiles i_first, i_first + Br, ... (ng of them) of head (b, h): each key
// tile is visited once for all of them.
void ForwardGroup(float* out, float* lse, const float* q, const float* k, const float* v,
                  const FlashAttentionParams& p, int64_t b, int64_t h, size_t i_first, size_t ng,
                  ForwardScratch& s) {
  const size_t T = size_t(p.T), hd = size_t(p.hd), hdp = RoundUp(hd, kN);
  const float c = p.scale * kLog2e;
  const size_t head = size_t(h) * hd;
  auto tile_i0 = [&](size_t g) { return i_first + g * kBr; };
  auto tile_in = [&](size_t g) { return std::min(kBr, T - tile_i0(g)); };
  for (size_t g = 0; g < ng; ++g) {
    // qT (hd, Br) = c · Q_tileᵀ, zero columns past T.
    float* HWY_RESTRICT qT = s.qT.get() + g * hd * kBr;
    const size_t i0 = tile_i0(g), in = tile_in(g);
    for (size_t i = 0; i < kBr; ++i) {
      const float* qi = i < in ? q + (size_t(b) * T + i0 + i) * p.q_stride + head : nullptr;
      for (size_t dd = 0; dd < hd; ++dd) qT[dd * kBr + i] = qi ? c * qi[dd] : 0.0f;
    }
  }
  std::fill(s.m.get(), s.m.get() + ng * kBr, kNegInf);
  std::fill(s.l.get(), s.l.get() + ng * kBr, 0.0f);
  std::fill(s.o.get(), s.o.get() + ng * kBr * hdp, 0.0f);

  // Keys j >= key_end(g) are masked for every row of tile g.
  auto key_end = [&](size_t g) { return p.causal ? tile_i0(g) + tile_in(g) : T; };
  const size_t group_key_end = key_end(ng - 1);
  const float* k_head = k + size_t(b) * T * p.k_stride + head;  // (T, hd), rows k_stride apart
  const float* v_head = v + size_t(b) * T * p.v_stride + head;
  for (size_t j0 = 0; j0 < group_key_end; j0 += kBcFwd) {
    const size_t next_end = std::min(group_key_end, j0 + 2 * kBcFwd);
    PrefetchRows(k_head, p.k_stride, std::min(j0 + kBcFwd, next_end), next_end, hd);
    PrefetchRows(v_head, p.v_stride, std::min(j0 + kBcFwd, next_end), next_end, hd);
    const float* v_tile = v_head + j0 * p.v_stride;
    size_t v_tile_stride = p.v_stride;
    if (hdp != hd) {  // B rows must hold whole vectors: a zero-padded copy
      const size_t jn = std::min(kBcFwd, group_key_end - j0);
      for (size_t jj = 0; jj < jn; ++jj) {
        std::copy(v_tile + jj * p.v_stride, v_tile + jj * p.v_stride + hd,
                  s.v_pad.get() + jj * hdp);
        std::fill(s.v_pad.get() + jj * hdp + hd, s.v_pad.get() + (jj + 1) * hdp, 0.0f);
      }
      v_tile = s.v_pad.get();
      v_tile_stride = hdp;
    }
    for (size_t g = 0; g < ng; ++g) {
      if (j0 >= key_end(g)) continue;
      const size_t jn = std::min(kBcFwd, key_end(g) - j0);
      ForwardStep(p, b, h, tile_i0(g), tile_in(g), j0, jn, k_head + j0 * p.k_stride, v_tile,
                  v_tile_stride, s.qT.get() + g * hd * kBr, s.sT.get(), s.o.get() + g * kBr * hdp,
                  s.m.get() + g * kBr, s.l.get() + g * kBr, s.alpha.get() + g * kBr);
    }
  }
  // O /= l; lse = ln(2^m · l) = (m + log2 l) · ln 2.
  for (size_t g = 0; g < ng; ++g) {
    const float* o = s.o.get() + g * kBr * hdp;
    const float* m = s.m.get() + g * kBr;
    const float* l = s.l.get() + g * kBr;
    for (size_t i = 0; i < tile_in(g); ++i) {
      const size_t t = tile_i0(g) + i;
      const float inv_l = 1.0f / l[i];
      float* oi = out + (size_t(b) * T + t) * p.o_stride + head;
      for (size_t dd = 0; dd < hd; ++dd) oi[dd] = o[i * hdp + dd] * inv_l;
      lse[(size_t(b) * p.H + h) * T + t] = (m[i] + std::log2(l[i])) * kLn2;
    }
  }
}

void Forward(float* out, float* lse, const float* q, const float* k, const float* v,
             const FlashAttentionParams& p) {
  const size_t hd = size_t(p.hd), hdp = RoundUp(hd, kN);
  const int64_t n_qt = (p.T + int64_t(kBr) - 1) / int64_t(kBr);
  const int64_t n_groups = (n_qt + int64_t(kGroup) - 1) / int64_t(kGroup);
  const int64_t BH = p.B * p.H;
  const int64_t n_items = BH * n_groups;
#pragma omp parallel
  {
    ForwardScratch scratch(hd, hdp);
    // Heaviest groups first (causal: the last query tiles), then dynamic
    // scheduling: the greedy longest-first rule balances the triangle.
#pragma omp for schedule(dynamic, 1)
    for (int64_t item = 0; item < n_items; ++item) {
      const int64_t group = n_groups - 1 - item / BH;
      const int64_t bh = item % BH;
      const int64_t first = group * int64_t(kGroup);
      const size_t ng = size_t(std::min(int64_t(kGroup), n_qt - first));
      ForwardGroup(out, lse, q, k, v, p, bh / p.H, bh % p.H, size_t(first) * kBr, ng, scratch);
    }
  }
}

// ---- backward -----------------------------------------------------------------------------

struct BackwardScratch {
  hwy::AlignedFreeUniquePtr<float[]> kT, vT;     // (G, hd, Bc)  c·K_tileᵀ, V_tileᵀ
  hwy::AlignedFreeUniquePtr<float[]> S, dP, Pz;  // (BrBwd, Bc)
  hwy::AlignedFreeUniquePtr<float[]> dK, dV;     // (G, Bc, hdp)
  hwy::AlignedFreeUniquePtr<float[]> z;          // (Bc) one row of dropout noise
  // Padded copies of one head, (T, hdp) each, only when hd % N != 0.
  hwy::AlignedFreeUniquePtr<float[]> q_pad, k_pad, do_pad, dq_pad;
  BackwardScratch(size_t T, size_t hd, size_t hdp)
      : kT(hwy::AllocateAligned<float>(kGroup * hd * kBc)),
        vT(hwy::AllocateAligned<float>(kGroup * hd * kBc)),
        S(hwy::AllocateAligned<float>(kBrBwd * kBc)),
        dP(hwy::AllocateAligned<float>(kBrBwd * kBc)),
        Pz(hwy::AllocateAligned<float>(kBrBwd * kBc)),
        dK(hwy::AllocateAligned<float>(kGroup * kBc * hdp)),
        dV(hwy::AllocateAligned<float>(kGroup * kBc * hdp)),
        z(hwy::AllocateAligned<float>(kBc)) {
    if (hdp != hd) {
      q_pad = hwy::AllocateAligned<float>(T * hdp);
      k_pad = hwy::AllocateAligned<float>(T * hdp);
      do_pad = hwy::AllocateAligned<float>(T * hdp);
      dq_pad = hwy::AllocateAligned<float>(T * hdp);
    }
  }
};

// A (T, hd) strided head copied into a (T, hdp) zero-padded buffer.
void PadHead(float* dst, const float* src, size_t stride, size_t T, size_t hd, size_t hdp) {
  for (size_t t = 0; t < T; ++t) {
    std::copy(src + t * stride, src + t * stride + hd, dst + t * hdp);
    std::fill(dst + t * hdp + hd, dst + (t + 1) * hdp, 0.0f);
  }
}

// One head (b, h) as the tile pairs read it. Row t of q starts at q + t · q_stride
// (likewise k, v, dout); the B operands of the products (rows of Q, K, dO) and
// the dQ accumulator are the buffers themselves when hd is a whole number of
// vectors, else zero-padded copies with stride hdp.
struct HeadView {
  int64_t b, h;
  const float *q, *k, *v, *dout;
  const float *qB, *kB, *doB;
  size_t qBs, kBs, doBs;
  float* dQ;
  size_t dQs;
  const float* D;     // (T) rowsum(dO ⊙ O)
  const float* lse2;  // (T) lse in base 2, to match the base-2 scores
};

HeadView MakeHeadView(float* dq, const float* dout, const float* q, const float* k, const float* v,
                      const float* D, const float* lse2, const FlashAttentionParams& p, int64_t b,
                      int64_t h) {
  const size_t T = size_t(p.T), head = size_t(h) * size_t(p.hd), bh = size_t(b * p.H + h);
  HeadView hv{};
  hv.b = b, hv.h = h;
  hv.q = q + size_t(b) * T * p.q_stride + head;
  hv.k = k + size_t(b) * T * p.k_stride + head;
  hv.v = v + size_t(b) * T * p.v_stride + head;
  hv.dout = dout + size_t(b) * T * p.o_stride + head;
  hv.qB = hv.q, hv.kB = hv.k, hv.doB = hv.dout;
  hv.qBs = p.q_stride, hv.kBs = p.k_stride, hv.doBs = p.o_stride;
  hv.dQ = dq + size_t(b) * T * p.q_stride + head;
  hv.dQs = p.q_stride;
  hv.D = D + bh * T;
  hv.lse2 = lse2 + bh * T;
  return hv;
}

// kT (hd, Bc) = c · K_tileᵀ, vT (hd, Bc) = V_tileᵀ for keys [j0, j0 + jn), zero columns past T.
void PackKeyTile(float* HWY_RESTRICT kT, float* HWY_RESTRICT vT, const HeadView& hv,
                 const FlashAttentionParams& p, size_t j0, size_t jn) {
  const size_t hd = size_t(p.hd);
  const float c = p.scale * kLog2e;
  for (size_t jj = 0; jj < kBc; ++jj) {
    if (jj < jn) {
      const float* kj = hv.k + (j0 + jj) * p.k_stride;
      const float* vj = hv.v + (j0 + jj) * p.v_stride;
      for (size_t dd = 0; dd < hd; ++dd) {
        kT[dd * kBc + jj] = c * kj[dd];
        vT[dd * kBc + jj] = vj[dd];
      }
    } else {
      for (size_t dd = 0; dd < hd; ++dd) kT[dd * kBc + jj] = vT[dd * kBc + jj] = 0.0f;
    }
  }
}

// One pair (keys [j0, j0 + jn) packed in s.kT/s.vT, queries [i0, i0 + in)):
// recompute P and dS, then accumulate whichever of dK, dV (Bc, hdp) and the
// head's dQ rows are given (nullptr skips). Every caller visits the pairs of an
// output in the same order, so the sums are the same bits however the pairs
// are spread over threads.
void TilePair(const HeadView& hv, const FlashAttentionParams& p, size_t j0, size_t jn, size_t i0,
              size_t in, const float* kT, const float* vT, BackwardScratch& s, float* dK, float* dV,
              float* dQ) {
  const DF d;
  const size_t hd = size_t(p.hd), hdp = RoundUp(hd, kN);
  const DropoutRule rule(p.dropout_p);
  float* HWY_RESTRICT S = s.S.get();
  float* HWY_RESTRICT dP = s.dP.get();
  float* HWY_RESTRICT Pz = s.Pz.get();
  // S (in, Bc) = c · Q Kᵀ (base-2 scores);  dP (in, Bc) = dO Vᵀ.
  // On the diagonal a block of queries ending at i_end - 1 needs keys < i_end only.
  const bool diagonal = p.causal && j0 + jn - 1 > i0;
  const bool masked = jn < kBc || diagonal;
  auto key_vectors = [&](size_t r0, size_t nr) {
    const size_t i_end = i0 + r0 + nr;
    const size_t v1 = !diagonal ? kNV : i_end > j0 ? (i_end - j0 + kN - 1) / kN : 0;
    return Span{0, hd, 0, v1};
  };
  GemmSpans<kOverwrite>(in, kBc, hv.q + i0 * p.q_stride, p.q_stride, 1, kT, kBc, S, kBc, nullptr,
                        key_vectors);
  GemmSpans<kOverwrite>(in, kBc, hv.dout + i0 * p.o_stride, p.o_stride, 1, vT, kBc, dP, kBc,
                        nullptr, key_vectors);
  // P = 2^(S − lse2); Pz = P ⊙ Z; dS = scale · P ⊙ (dP ⊙ Z − D), stored in dP.
  const VF scale_v = hn::Set(d, p.scale);
  for (size_t ii = 0; ii < in; ++ii) {
    const size_t i = i0 + ii;
    const VF lse_i = hn::Set(d, hv.lse2[i]);
    const VF D_i = hn::Set(d, hv.D[i]);
    if (rule.active()) {  // z (Bc): Philox block m serves keys 4m .. 4m+3
      DropoutRowNoise<kBc>(rule, p.dropout_seed, hv.b, hv.h, i, j0, s.z.get());
    }
    // Keys j valid for query i: j < T and (causal) j <= i.
    const size_t j_lim = std::min(jn, p.causal ? (i + 1 > j0 ? i + 1 - j0 : 0) : jn);
    for (size_t v0 = 0; v0 < kBc; v0 += kN) {
      const size_t at = ii * kBc + v0;
      VF pv = Exp2(d, hn::Sub(hn::Load(d, S + at), lse_i));
      VF dpv = hn::Load(d, dP + at);
      if (rule.active()) {
        const VF zv = hn::Load(d, s.z.get() + v0);
        dpv = hn::Mul(dpv, zv);
        hn::Store(hn::Mul(pv, zv), d, Pz + at);
      } else {
        hn::Store(pv, d, Pz + at);
      }
      VF ds = hn::Mul(hn::Mul(pv, hn::Sub(dpv, D_i)), scale_v);
      if (masked) {
        const auto valid = hn::Lt(hn::Iota(d, float(v0)), hn::Set(d, float(j_lim)));
        ds = hn::IfThenElseZero(valid, ds);
        hn::Store(hn::IfThenElseZero(valid, hn::Load(d, Pz + at)), d, Pz + at);
      }
      hn::Store(ds, d, dP + at);
    }
  }
  // dV (Bc, hdp) += Pzᵀ dO;  dK (Bc, hdp) += dSᵀ Q;  dQ (in, hdp) += dS K.
  // On the diagonal, keys from j see queries from i = j only, and queries up
  // to i see keys up to i only.
  auto from_query = [&](size_t r0, size_t) {
    const size_t j = j0 + r0;
    return Span{diagonal && j > i0 ? j - i0 : 0, in, 0, kNV};
  };
  auto to_key = [&](size_t r0, size_t nr) {
    const size_t i_end = i0 + r0 + nr;
    return Span{0, !diagonal ? jn : i_end > j0 ? std::min(jn, i_end - j0) : 0, 0, kNV};
  };
  if (dV)
    GemmSpans<kAccumulate>(jn, hdp, Pz, 1, kBc, hv.doB + i0 * hv.doBs, hv.doBs, dV, hdp, nullptr,
                           from_query);
  if (dK)
    GemmSpans<kAccumulate>(jn, hdp, dP, 1, kBc, hv.qB + i0 * hv.qBs, hv.qBs, dK, hdp, nullptr,
                           from_query);
  if (dQ)
    GemmSpans<kAccumulate>(in, hdp, dP, kBc, 1, hv.kB + j0 * hv.kBs, hv.kBs, dQ + i0 * hv.dQs,
                           hv.dQs, nullptr, to_key);
}

// Query tiles [i0, ...) that see key tile j0: causal skips those whose last row is before j0.
size_t FirstQueryTile(const FlashAttentionParams& p, size_t j0) {
  return p.causal ? j0 / kBrBwd * kBrBwd : 0;
}

// dK, dV of key tiles j_first, j_first + Bc, ... (ng of them; all their query
// tiles, in order), written out; dQ accumulated too when given. The group
// shares each query tile's rows of Q, dO and dQ while they are in cache.
void KeyGroupTask(float* dk, float* dv, float* dQ, const HeadView& hv,
                  const FlashAttentionParams& p, size_t j_first, size_t ng, BackwardScratch& s) {
  const size_t T = size_t(p.T), hd = size_t(p.hd), hdp = RoundUp(hd, kN);
  auto tile_j0 = [&](size_t g) { return j_first + g * kBc; };
  auto tile_jn = [&](size_t g) { return std::min(kBc, T - tile_j0(g)); };
  for (size_t g = 0; g < ng; ++g)
    PackKeyTile(s.kT.get() + g * hd * kBc, s.vT.get() + g * hd * kBc, hv, p, tile_j0(g),
                tile_jn(g));
  std::fill(s.dK.get(), s.dK.get() + ng * kBc * hdp, 0.0f);
  std::fill(s.dV.get(), s.dV.get() + ng * kBc * hdp, 0.0f);
  for (size_t i0 = FirstQueryTile(p, j_first); i0 < T; i0 += kBrBwd) {
    const size_t in = std::min(kBrBwd, T - i0);
    const size_t next_end = std::min(T, i0 + in + kBrBwd);
    PrefetchRows(hv.q, p.q_stride, i0 + in, next_end, hd);
    PrefetchRows(hv.dout, p.o_stride, i0 + in, next_end, hd);
    if (dQ) PrefetchRows(dQ, hv.dQs, i0 + in, next_end, hd);
    for (size_t g = 0; g < ng; ++g) {
      if (FirstQueryTile(p, tile_j0(g)) > i0) break;  // later key tiles start later still
      TilePair(hv, p, tile_j0(g), tile_jn(g), i0, in, s.kT.get() + g * hd * kBc,
               s.vT.get() + g * hd * kBc, s, s.dK.get() + g * kBc * hdp, s.dV.get() + g * kBc * hdp,
               dQ);
    }
  }
  const size_t head = size_t(hv.h) * hd;
  for (size_t g = 0; g < ng; ++g)
    for (size_t jj = 0; jj < tile_jn(g); ++jj) {
      const size_t t = size_t(hv.b) * T + tile_j0(g) + jj;
      const float* dK = s.dK.get() + (g * kBc + jj) * hdp;
      const float* dV = s.dV.get() + (g * kBc + jj) * hdp;
      std::copy(dK, dK + hd, dk + t * p.k_stride + head);
      std::copy(dV, dV + hd, dv + t * p.v_stride + head);
    }
}

// dQ of query tile i0: its key tiles in order, the same pairs as KeyGroupTask's.
void QueryTileTask(const HeadView& hv, const FlashAttentionParams& p, size_t i0,
                   BackwardScratch& s) {
  const size_t T = size_t(p.T), hd = size_t(p.hd);
  const size_t in = std::min(kBrBwd, T - i0);
  for (size_t i = i0; i < i0 + in; ++i)
    std::fill(hv.dQ + i * hv.dQs, hv.dQ + i * hv.dQs + hd, 0.0f);
  for (size_t j0 = 0; j0 < T && FirstQueryTile(p, j0) <= i0; j0 += kBc) {
    const size_t jn = std::min(kBc, T - j0);
    PackKeyTile(s.kT.get(), s.vT.get(), hv, p, j0, jn);
    TilePair(hv, p, j0, jn, i0, in, s.kT.get(), s.vT.get(), s, nullptr, nullptr, hv.dQ);
  }
}

// The whole head in one pass: key tiles outside, dQ accumulated in place.
void BackwardHead(float* dq, float* dk, float* dv, HeadView hv, const FlashAttentionParams& p,
                  BackwardScratch& s) {
  const size_t T = size_t(p.T), hd = size_t(p.hd), hdp = RoundUp(hd, kN);
  if (hdp != hd) {
    PadHead(s.q_pad.get(), hv.q, p.q_stride, T, hd, hdp);
    PadHead(s.k_pad.get(), hv.k, p.k_stride, T, hd, hdp);
    PadHead(s.do_pad.get(), hv.dout, p.o_stride, T, hd, hdp);
    hv.qB = s.q_pad.get(), hv.kB = s.k_pad.get(), hv.doB = s.do_pad.get();
    hv.qBs = hv.kBs = hv.doBs = hdp;
    hv.dQ = s.dq_pad.get();
    hv.dQs = hdp;
  }
  for (size_t i = 0; i < T; ++i) std::fill(hv.dQ + i * hv.dQs, hv.dQ + i * hv.dQs + hdp, 0.0f);
  for (size_t j0 = 0; j0 < T; j0 += kGroup * kBc)
    KeyGroupTask(dk, dv, hv.dQ, hv, p, j0, std::min(kGroup, (T - j0 + kBc - 1) / kBc), s);
  if (hdp != hd) {
    float* dq_head = dq + size_t(hv.b) * T * p.q_stride + size_t(hv.h) * hd;
    for (size_t i = 0; i < T; ++i)
      std::copy(hv.dQ + i * hdp, hv.dQ + i * hdp + hd, dq_head + i * p.q_stride);
  }
}

int MaxThreads() {
#ifdef _OPENMP
  return omp_get_max_threads();
#else
  return 1;
#endif
}

void Backward(float* dq, float* dk, float* dv, const float* dout, const float* q, const float* k,
              const float* v, const float* out, const float* lse, const FlashAttentionParams& p) {
  const size_t T = size_t(p.T), hd = size_t(p.hd), hdp = RoundUp(hd, kN);
  const int64_t BH = p.B * p.H;
  // D = rowsum(dO ⊙ O) and lse · log2(e), (B, H, T) each: the O(T) per head that backward keeps.
  auto D = hwy::AllocateAligned<float>(size_t(BH) * T);
  auto lse2 = hwy::AllocateAligned<float>(size_t(BH) * T);
#pragma omp parallel for schedule(static)
  for (int64_t bh = 0; bh < BH; ++bh) {
    const int64_t b = bh / p.H, h = bh % p.H;
    for (size_t i = 0; i < T; ++i) {
      const size_t at = (size_t(b) * T + i) * p.o_stride + size_t(h) * hd;
      float sum = 0.0f;
      for (size_t dd = 0; dd < hd; ++dd) sum += dout[at + dd] * out[at + dd];
      D[size_t(bh) * T + i] = sum;
      lse2[size_t(bh) * T + i] = lse[size_t(bh) * T + i] * kLog2e;
    }
  }
  auto view = [&](int64_t bh) {
    return MakeHeadView(dq, dout, q, k, v, D.get(), lse2.get(), p, bh / p.H, bh % p.H);
  };
  // With at least two heads per thread, one thread per head: five products per
  // tile pair. With fewer, split every head: dK, dV over key tiles, then dQ
  // over query tiles (recomputing S and dP: seven products per pair). Both
  // visit each output's pairs in the same order, so the bits are the same.
  const int64_t threads = MaxThreads();
  const bool split = hdp == hd && threads > 1 && BH < 2 * threads;
  if (!split) {
#pragma omp parallel
    {
      BackwardScratch scratch(T, hd, hdp);
#pragma omp for schedule(dynamic, 1)
      for (int64_t bh = 0; bh < BH; ++bh) BackwardHead(dq, dk, dv, view(bh), p, scratch);
    }
    return;
  }
  const int64_t n_kt = int64_t((T + kBc - 1) / kBc), n_qt = int64_t((T + kBrBwd - 1) / kBrBwd);
  const int64_t n_kg = (n_kt + int64_t(kGroup) - 1) / int64_t(kGroup);
#pragma omp parallel
  {
    BackwardScratch scratch(T, hd, hdp);
    // Causal: the first key tiles and the last query tiles are the longest; start with them.
#pragma omp for schedule(dynamic, 1)
    for (int64_t item = 0; item < BH * n_kg; ++item) {
      const int64_t kg = item / BH, bh = item % BH;
      const int64_t first = kg * int64_t(kGroup);
      KeyGroupTask(dk, dv, nullptr, view(bh), p, size_t(first) * kBc,
                   size_t(std::min(int64_t(kGroup), n_kt - first)), scratch);
    }
#pragma omp for schedule(dynamic, 1)
    for (int64_t item = 0; item < BH * n_qt; ++item) {
      const int64_t qt = n_qt - 1 - item / BH, bh = item % BH;
      QueryTileTask(view(bh), p, size_t(qt) * kBrBwd, scratch);
    }
  }
}

const char* TargetName() { return hwy::TargetName(HWY_TARGET); }

// NOLINTNEXTLINE(google-readability-namespace-comments)
}  // namespace HWY_NAMESPACE
}  // namespace attn::kernels
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace attn::kernels {

HWY_EXPORT(Forward);
HWY_EXPORT(Backward);
HWY_EXPORT(TargetName);

void flash_attention_forward(float* out, float* lse, const float* q, const float* k, const float* v,
                             const FlashAttentionParams& params) {
  const FlashAttentionParams p = validated(params);
  HWY_DYNAMIC_DISPATCH(Forward)(out, lse, q, k, v, p);
}

void flash_attention_backward(float* dq, float* dk, float* dv, const float* dout, const float* q,
                              const float* k, const float* v, const float* out, const float* lse,
                              const FlashAttentionParams& params) {
  const FlashAttentionParams p = validated(params);
  HWY_DYNAMIC_DISPATCH(Backward)(dq, dk, dv, dout, q, k, v, out, lse, p);
}

const char* flash_attention_target() { return HWY_DYNAMIC_DISPATCH(TargetName)(); }

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
