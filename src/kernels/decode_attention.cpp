// Flash-decoding (attn/decode_attention.h states the maths and the split):
// work items (b, kv head, chunk of kDecodeChunk keys) over OpenMP threads, each
// writing a partial (m, l, o) per query row of its group; then each output row
// combines its chunks' partials by log-sum-exp in chunk order. Highway dynamic
// dispatch for the vector code (fp32 rows, or bf16 rows widened as loaded).
#include "attn/decode_attention.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <type_traits>
#include <vector>

#include "attn/tensor.h"
#include "cpu/hwy_targets.h"
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/decode_attention.cpp"
#include <hwy/cache_control.h>
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>
// After highway.h: the -inl header is compiled once per target.
#include <hwy/contrib/math/math-inl.h>  // NOLINT(build/include_order)
#include "kernels/bf16_load-inl.h"

#ifndef ATTN_DECODE_ATTENTION_SHARED
#define ATTN_DECODE_ATTENTION_SHARED
namespace attn::kernels::detail {

// The keys [lo, hi) some query of the call can see, and the chunks that cover
// them: chunk c (c0 <= c < c0 + n) is [c·kDecodeChunk, (c + 1)·kDecodeChunk)
// clipped to [lo, hi). Fixed by the problem alone (never by the thread count).
struct DecodeSplit {
  int64_t lo, hi, c0, n;
};
inline DecodeSplit decode_split(const DecodeProblem& p) {
  const int64_t first = p.length - p.Tq;  // the first new query's position
  const int64_t lo = p.window_left < 0 ? 0 : std::max<int64_t>(0, first - p.window_left);
  const int64_t hi = p.length;
  const int64_t c0 = lo / kDecodeChunk, c1 = (hi + kDecodeChunk - 1) / kDecodeChunk;
  return {lo, hi, c0, c1 - c0};
}

}  // namespace attn::kernels::detail
#endif

HWY_BEFORE_NAMESPACE();
namespace attn::kernels {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using DF = hn::ScalableTag<float>;
using VF = hn::Vec<DF>;

// Lanes(DF) elements at p as fp32: loaded, or bf16 widened (exact: the bf16
// bits are the high half of the float's).
HWY_INLINE VF LoadRow(DF d, const float* p) { return hn::LoadU(d, p); }
HWY_INLINE VF LoadRow(DF d, const uint16_t* p) { return LoadBf16(d, p); }
inline float Scalar(float x) { return x; }
inline float Scalar(uint16_t bits) { return to_float(BFloat16{bits}); }

// Asks for the row j of pf (rows D apart) to be brought into the caches, for
// j < pf_n: the loops below fetch the next rows they will need while they
// compute on this ones (the value rows of the chunk during its scores, the
// next chunk's key rows during its weighted sum), so that the memory streams
// without a pause at each chunk's start.
// bf16 only: its chunks are half as long a stream (32 KiB of keys at D = 64),
// and measured under load the 4k step went 1.06 -> 0.93 ms and 32k 25 -> 15
// ms with it, while fp32, whose streams the hardware prefetcher follows on its
// own, went 1.53 -> 1.85 ms at 4k: fp32 rows are not asked for.
template <class T>
HWY_INLINE void PrefetchRow(const T* pf, size_t pf_n, size_t j, size_t D) {
  if constexpr (std::is_same_v<T, float>) return;
  if (pf == nullptr || j >= pf_n) return;
  const auto* row = reinterpret_cast<const char*>(pf + j * D);
  for (size_t b = 0; b < D * sizeof(T); b += 64) hwy::Prefetch(row + b);
}

// Σ_i q[i] · k[i], n elements: two vector chains, then across lanes, then the
// scalar tail.
template <class T>
HWY_INLINE float Dot(DF d, const float* q, const T* k, size_t n) {
  const size_t L = hn::Lanes(d);
  VF a0 = hn::Zero(d), a1 = hn::Zero(d);
  size_t i = 0;
  for (; i + 2 * L <= n; i += 2 * L) {
    a0 = hn::MulAdd(hn::LoadU(d, q + i), LoadRow(d, k + i), a0);
    a1 = hn::MulAdd(hn::LoadU(d, q + i + L), LoadRow(d, k + i + L), a1);
  }
  if (i + L <= n) {
    a0 = hn::MulAdd(hn::LoadU(d, q + i), LoadRow(d, k + i), a0);
    i += L;
  }
  float s = hn::GetLane(hn::SumOfLanes(d, hn::Add(a0, a1)));
  for (; i < n; ++i) s += q[i] * Scalar(k[i]);
  return s;
}

#if HWY_TARGET != HWY_SCALAR
// v (128 bits) = the lanes of v folded by halves: its lanes' sum is v's.
template <class D>
HWY_INLINE auto Fold128(D d, hn::Vec<D> v) {
  if constexpr (hn::MaxLanes(d) > 4) {
    const hn::Half<D> dh;
    return Fold128(dh, hn::Add(hn::LowerHalf(dh, v), hn::UpperHalf(dh, v)));
  } else {
    return v;
  }
}
#endif

// s[j] = scale · q · K[j] for j in [a, e) (K's rows D apart). Four keys at a
// time, one vector chain each, their four sums across lanes found together
// (folded to 128 bits, then transposed by interleaving: one vector of four
// scores); the rest one key at a time.
template <class T>
HWY_INLINE void Scores(DF d, const float* q, const T* K, size_t D, size_t a, size_t e, float scale,
                       float* s, const T* pf, size_t pf_n) {
  size_t j = a;
#if HWY_TARGET != HWY_SCALAR  // 4 lanes or more
  {
    const size_t L = hn::Lanes(d), Dv = D / L * L;
    for (; j + 4 <= e; j += 4) {
      const T* k0 = K + j * D;
      for (size_t jj = j; jj < j + 4; ++jj) PrefetchRow(pf, pf_n, jj, D);
      VF c0 = hn::Zero(d), c1 = hn::Zero(d), c2 = hn::Zero(d), c3 = hn::Zero(d);
      for (size_t i = 0; i < Dv; i += L) {
        const VF qv = hn::LoadU(d, q + i);
        c0 = hn::MulAdd(qv, LoadRow(d, k0 + i), c0);
        c1 = hn::MulAdd(qv, LoadRow(d, k0 + D + i), c1);
        c2 = hn::MulAdd(qv, LoadRow(d, k0 + 2 * D + i), c2);
        c3 = hn::MulAdd(qv, LoadRow(d, k0 + 3 * D + i), c3);
      }
      const auto f0 = Fold128(d, c0), f1 = Fold128(d, c1), f2 = Fold128(d, c2), f3 = Fold128(d, c3);
      const hn::DFromV<decltype(f0)> d4;
      // [f0₀+f0₂, f1₀+f1₂, f0₁+f0₃, f1₁+f1₃] and the same for f2, f3.
      const auto u = hn::Add(hn::InterleaveLower(d4, f0, f1), hn::InterleaveUpper(d4, f0, f1));
      const auto w = hn::Add(hn::InterleaveLower(d4, f2, f3), hn::InterleaveUpper(d4, f2, f3));
      auto sums = hn::Add(hn::ConcatLowerLower(d4, w, u), hn::ConcatUpperUpper(d4, w, u));
      if (Dv < D) {  // the columns past the last full vector
        HWY_ALIGN float tail[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        for (size_t kk = 0; kk < 4; ++kk) {
          for (size_t i = Dv; i < D; ++i) tail[kk] += q[i] * Scalar(k0[kk * D + i]);
        }
        sums = hn::Add(sums, hn::Load(d4, tail));
      }
      hn::StoreU(hn::Mul(hn::Set(d4, scale), sums), d4, s + j);
    }
  }
#endif
  for (; j < e; ++j) {
    PrefetchRow(pf, pf_n, j, D);
    s[j] = scale * Dot(d, q, K + j * D, D);
  }
}

// o (D) = Σ_{j in [a, e)} w[j] · V[j] (V's rows D apart). Columns in blocks of
// 4 vectors held in registers across the keys, two sets (even and odd keys)
// so that no add waits for the one before it; then single vectors; then a
// scalar tail.
template <class T>
HWY_INLINE void WeightedSum(DF d, float* o, const float* w, const T* V, size_t D, size_t a,
                            size_t e, const T* pf, size_t pf_n) {
  const size_t L = hn::Lanes(d);
  size_t i = 0;
  for (; i + 4 * L <= D; i += 4 * L) {
    VF x0 = hn::Zero(d), x1 = hn::Zero(d), x2 = hn::Zero(d), x3 = hn::Zero(d);
    VF y0 = hn::Zero(d), y1 = hn::Zero(d), y2 = hn::Zero(d), y3 = hn::Zero(d);
    size_t j = a;
    for (; j + 2 <= e; j += 2) {
      if (i == 0) {
        PrefetchRow(pf, pf_n, j, D);
        PrefetchRow(pf, pf_n, j + 1, D);
      }
      const T* v = V + j * D + i;
      const VF w0 = hn::Set(d, w[j]), w1 = hn::Set(d, w[j + 1]);
      x0 = hn::MulAdd(w0, LoadRow(d, v), x0);
      x1 = hn::MulAdd(w0, LoadRow(d, v + L), x1);
      x2 = hn::MulAdd(w0, LoadRow(d, v + 2 * L), x2);
      x3 = hn::MulAdd(w0, LoadRow(d, v + 3 * L), x3);
      y0 = hn::MulAdd(w1, LoadRow(d, v + D), y0);
      y1 = hn::MulAdd(w1, LoadRow(d, v + D + L), y1);
      y2 = hn::MulAdd(w1, LoadRow(d, v + D + 2 * L), y2);
      y3 = hn::MulAdd(w1, LoadRow(d, v + D + 3 * L), y3);
    }
    if (j < e) {
      const T* v = V + j * D + i;
      const VF w0 = hn::Set(d, w[j]);
      x0 = hn::MulAdd(w0, LoadRow(d, v), x0);
      x1 = hn::MulAdd(w0, LoadRow(d, v + L), x1);
      x2 = hn::MulAdd(w0, LoadRow(d, v + 2 * L), x2);
      x3 = hn::MulAdd(w0, LoadRow(d, v + 3 * L), x3);
    }
    hn::StoreU(hn::Add(x0, y0), d, o + i);
    hn::StoreU(hn::Add(x1, y1), d, o + i + L);
    hn::StoreU(hn::Add(x2, y2), d, o + i + 2 * L);
    hn::StoreU(hn::Add(x3, y3), d, o + i + 3 * L);
  }
  for (; i + L <= D; i += L) {
    VF x = hn::Zero(d), y = hn::Zero(d);
    size_t j = a;
    for (; j + 2 <= e; j += 2) {
      x = hn::MulAdd(hn::Set(d, w[j]), LoadRow(d, V + j * D + i), x);
      y = hn::MulAdd(hn::Set(d, w[j + 1]), LoadRow(d, V + (j + 1) * D + i), y);
    }
    if (j < e) x = hn::MulAdd(hn::Set(d, w[j]), LoadRow(d, V + j * D + i), x);
    hn::StoreU(hn::Add(x, y), d, o + i);
  }
  for (; i < D; ++i) {
    float x = 0.0f;
    for (size_t j = a; j < e; ++j) x += w[j] * Scalar(V[j * D + i]);
    o[i] = x;
  }
}

// One work item: the keys [j0, j1) of one kv head (K, V point at its row 0)
// for R query rows q (R, D) fp32. Row r sees the keys [lo[r], hi[r]). Writes
// per row m[r] (the largest visible score, -inf if none), l[r] = Σ exp(s - m)
// and o (R, D) = Σ exp(s - m) · v. s: scratch of R · (j1 - j0) floats; ae of 2R.
template <class T>
void Chunk(const float* q, const T* K, const T* V, size_t D, float scale, size_t R,
           const int64_t* lo, const int64_t* hi, int64_t j0, int64_t j1, int64_t next_n, float* s,
           size_t* ae, float* m, float* l, float* o) {
  const DF d;
  const size_t L = hn::Lanes(d);
  const size_t C = size_t(j1 - j0);
  // Each row's visible part of the chunk, [a, e) relative to j0.
  size_t* a = ae;
  size_t* e = ae + R;
  for (size_t r = 0; r < R; ++r) {
    a[r] = size_t(std::clamp(lo[r], j0, j1) - j0);
    e[r] = size_t(std::clamp(hi[r], j0, j1) - j0);
  }
  // Scores, one row after the other over its visible keys (the chunk's key
  // rows come from memory for the first row, from L2 for the others).
  const T* Kc = K + size_t(j0) * D;
  for (size_t r = 0; r < R; ++r) {
    if (a[r] >= e[r]) continue;
    // The first row's pass fetches the chunk's value rows meanwhile.
    Scores(d, q + r * D, Kc, D, a[r], e[r], scale, s + r * C, r == 0 ? V + size_t(j0) * D : nullptr,
           C);
  }
  // Each row's exp(s - m) in place, and l.
  for (size_t r = 0; r < R; ++r) {
    float* sr = s + r * C;
    std::fill(o + r * D, o + (r + 1) * D, 0.0f);
    if (a[r] >= e[r]) {
      m[r] = -std::numeric_limits<float>::infinity();
      l[r] = 0.0f;
      continue;
    }
    float mr = sr[a[r]];  // the largest score: vector lanes, then across them
    size_t jm = a[r];
    if (e[r] - a[r] >= L) {
      VF mv = hn::LoadU(d, sr + jm);
      for (jm += L; jm + L <= e[r]; jm += L) mv = hn::Max(mv, hn::LoadU(d, sr + jm));
      mr = hn::GetLane(hn::MaxOfLanes(d, mv));
    }
    for (; jm < e[r]; ++jm) mr = std::max(mr, sr[jm]);
    const VF mv = hn::Set(d, mr);
    VF sum = hn::Zero(d);
    size_t j = a[r];
    for (; j + L <= e[r]; j += L) {
      const VF x = hn::Exp(d, hn::Sub(hn::LoadU(d, sr + j), mv));
      hn::StoreU(x, d, sr + j);
      sum = hn::Add(sum, x);
    }
    float lr = hn::GetLane(hn::SumOfLanes(d, sum));
    for (; j < e[r]; ++j) {
      sr[j] = std::exp(sr[j] - mr);
      lr += sr[j];
    }
    m[r] = mr;
    l[r] = lr;
  }
  // o = Σ p · v, one row after the other over its visible keys (the chunk's
  // value rows come from memory for the first row, from L2 for the others).
  for (size_t r = 0; r < R; ++r) {
    if (a[r] >= e[r]) continue;
    // The first row's pass fetches the next chunk's first key rows meanwhile.
    WeightedSum(d, o + r * D, s + r * C, V + size_t(j0) * D, D, a[r], e[r],
                r == 0 ? K + size_t(j1) * D : nullptr, size_t(next_n));
  }
}

inline void StoreOut(float* o, float x) { *o = x; }
inline void StoreOut(uint16_t* o, float x) { *o = to_bfloat16(x).bits; }

// T: float or uint16_t (bf16 bits) for q, keys, values and out alike.
template <class T>
void Forward(T* out, const T* q, const T* keys, const T* values, const DecodeProblem& p) {
  const detail::DecodeSplit split = detail::decode_split(p);
  const int64_t G = p.Hq / p.Hkv, R = G * p.Tq, D = p.D, nc = split.n;
  const int64_t items = p.B * p.Hkv * nc;
  // Each row r = gi·Tq + t of a group (query head g·G + gi, query t) sees [lo, hi).
  std::vector<int64_t> lo(static_cast<size_t>(R)), hi(static_cast<size_t>(R));
  for (int64_t gi = 0; gi < G; ++gi) {
    for (int64_t t = 0; t < p.Tq; ++t) {
      const int64_t pos = p.length - p.Tq + t, r = gi * p.Tq + t;
      lo[size_t(r)] = p.window_left < 0 ? 0 : std::max<int64_t>(0, pos - p.window_left);
      hi[size_t(r)] = pos + 1;
    }
  }
  // Partials of every item when there are several chunks (one chunk: the
  // item's result is final and goes straight to out).
  std::unique_ptr<float[]> part_o, part_m, part_l;
  if (nc > 1) {
    part_o.reset(new float[size_t(items * R * D)]);
    part_m.reset(new float[size_t(items * R)]);
    part_l.reset(new float[size_t(items * R)]);
  }
  // Each group's query rows (b, g, r = gi·Tq + t), widened to fp32 once.
  std::vector<float> qf(static_cast<size_t>(p.B * p.Hkv * R * D));
  for (int64_t bg = 0; bg < p.B * p.Hkv; ++bg) {
    const int64_t b = bg / p.Hkv, g = bg % p.Hkv;
    for (int64_t gi = 0; gi < G; ++gi) {
      for (int64_t t = 0; t < p.Tq; ++t) {
        const T* src = q + b * p.q_batch_stride + t * p.q_stride + (g * G + gi) * D;
        float* dst = qf.data() + (bg * R + gi * p.Tq + t) * D;
        for (int64_t i = 0; i < D; ++i) dst[i] = Scalar(src[i]);
      }
    }
  }
  const auto out_row = [&](int64_t b, int64_t gi_row, int64_t g) {
    const int64_t gi = gi_row / p.Tq, t = gi_row % p.Tq;
    return out + b * p.o_batch_stride + t * p.o_stride + (g * G + gi) * D;
  };
  const int64_t kv_elems = p.B * p.Hkv * (split.hi - split.lo) * D;
#pragma omp parallel if (items > 1 && kv_elems >= 16384)
  {
    std::vector<float> s(static_cast<size_t>(R * kDecodeChunk)), m(static_cast<size_t>(R)),
        l(static_cast<size_t>(R)), o(static_cast<size_t>(R * D));
    std::vector<size_t> ae(static_cast<size_t>(2 * R));
#pragma omp for schedule(static)
    for (int64_t item = 0; item < items; ++item) {
      const int64_t bg = item / nc, c = split.c0 + item % nc;
      const int64_t b = bg / p.Hkv, g = bg % p.Hkv;
      const int64_t j0 = std::max(split.lo, c * kDecodeChunk);
      const int64_t j1 = std::min(split.hi, (c + 1) * kDecodeChunk);
      const size_t off = size_t(bg * p.capacity * D);
      float* pm = nc > 1 ? part_m.get() + item * R : m.data();
      float* pl = nc > 1 ? part_l.get() + item * R : l.data();
      float* po = nc > 1 ? part_o.get() + item * R * D : o.data();
      Chunk(qf.data() + bg * R * D, keys + off, values + off, size_t(D), p.scale, size_t(R),
            lo.data(), hi.data(), j0, j1, std::min(split.hi - j1, j1 - j0), s.data(), ae.data(), pm,
            pl, po);
      if (nc == 1) {
        for (int64_t r = 0; r < R; ++r) {
          T* dst = out_row(b, r, g);
          for (int64_t i = 0; i < D; ++i) StoreOut(dst + i, po[r * D + i] / pl[r]);
        }
      }
    }
    if (nc > 1) {
      // Each output row (b, g, r): its chunks' partials in chunk order.
      const int64_t rows = p.B * p.Hkv * R;
#pragma omp for schedule(static)
      for (int64_t row = 0; row < rows; ++row) {
        const int64_t bg = row / R, r = row % R;
        const int64_t first = bg * nc;  // the item of the group's first chunk
        float M = -std::numeric_limits<float>::infinity();
        for (int64_t c = 0; c < nc; ++c) M = std::max(M, part_m[size_t((first + c) * R + r)]);
        float Lsum = 0.0f;
        std::fill(o.begin(), o.begin() + D, 0.0f);
        for (int64_t c = 0; c < nc; ++c) {
          const int64_t at = (first + c) * R + r;
          const float w = std::exp(part_m[size_t(at)] - M);  // 0 for a chunk it cannot see
          Lsum += w * part_l[size_t(at)];
          const float* oc = part_o.get() + at * D;
          for (int64_t i = 0; i < D; ++i) o[size_t(i)] += w * oc[i];
        }
        T* dst = out_row(bg / p.Hkv, r, bg % p.Hkv);
        for (int64_t i = 0; i < D; ++i) StoreOut(dst + i, o[size_t(i)] / Lsum);
      }
    }
  }
}

void ForwardF32(float* out, const float* q, const float* keys, const float* values,
                const DecodeProblem& p) {
  Forward(out, q, keys, values, p);
}
void ForwardBf16(uint16_t* out, const uint16_t* q, const uint16_t* keys, const uint16_t* values,
                 const DecodeProblem& p) {
  Forward(out, q, keys, values, p);
}

// NOLINTNEXTLINE(google-readability-namespace-comments)
}  // namespace HWY_NAMESPACE
}  // namespace attn::kernels
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace attn::kernels {

HWY_EXPORT(ForwardF32);
HWY_EXPORT(ForwardBf16);

void decode_attention_forward(float* out, const float* q, const float* keys, const float* values,
                              const DecodeProblem& p) {
  HWY_DYNAMIC_DISPATCH(ForwardF32)(out, q, keys, values, validated(p));
}

void decode_attention_forward_bf16(BFloat16* out, const BFloat16* q, const BFloat16* keys,
                                   const BFloat16* values, const DecodeProblem& p) {
  HWY_DYNAMIC_DISPATCH(ForwardBf16)
  (reinterpret_cast<uint16_t*>(out), reinterpret_cast<const uint16_t*>(q),
   reinterpret_cast<const uint16_t*>(keys), reinterpret_cast<const uint16_t*>(values),
   validated(p));
}

int64_t decode_attention_kv_bytes(const DecodeProblem& p, int64_t element_bytes) {
  const detail::DecodeSplit split = detail::decode_split(validated(p));
  return p.B * p.Hkv * (split.hi - split.lo) * p.D * 2 * element_bytes;
}

}  // namespace attn::kernels
#endif  // HWY_ONCE
