// Flash-decoding (attn/decode_attention.h states the maths and the split):
// work items (query tile, kv head, chunk of kDecodeChunk keys) over OpenMP
// threads, each writing a partial (m, l, o) per query row of its group; then
// each output row combines its chunks' partials by log-sum-exp in chunk order.
// Highway dynamic dispatch for the vector code (fp32 rows, or bf16 rows
// widened as loaded). The loops read the cache's rows through a row view: a
// stride (a dense cache, a ring) or a table of row pointers per chunk (a paged
// pool), so both are one code.
#include "attn/decode_attention.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <type_traits>
#include <utility>
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

// A query tile: the new queries [t0, t0 + nt) of sequence b (nt <=
// kMaxDecodeQueries), at positions pos0 .. pos0 + nt - 1; the keys [lo, hi)
// some query of it can see, and the chunks that cover them: chunk c (c0 <= c <
// c0 + nc) is [c·kDecodeChunk, (c + 1)·kDecodeChunk) clipped to [lo, hi). Its
// work items are item0 + g·nc + (c - c0) for kv head g; q_row0 counts the
// query rows of the tiles before it. Fixed by the problem alone (never by the
// thread count).
struct DecodeTile {
  int64_t b, t0, nt, pos0, lo, hi, c0, nc, item0, q_row0;
};
inline std::vector<DecodeTile> decode_tiles(const DecodeProblem& p, int64_t* items) {
  std::vector<DecodeTile> tiles;
  int64_t item = 0, q_row = 0;
  for (int64_t b = 0; b < p.B; ++b) {
    const int64_t Tq = decode_queries(p, b), L = decode_keys(p, b);
    for (int64_t t0 = 0; t0 < Tq; t0 += kMaxDecodeQueries) {
      const int64_t nt = std::min(kMaxDecodeQueries, Tq - t0);
      const int64_t pos0 = L - Tq + t0;
      const int64_t lo = p.window_left < 0 ? 0 : std::max<int64_t>(0, pos0 - p.window_left);
      const int64_t hi = pos0 + nt;
      const int64_t c0 = lo / kDecodeChunk, c1 = (hi + kDecodeChunk - 1) / kDecodeChunk;
      tiles.push_back({b, t0, nt, pos0, lo, hi, c0, c1 - c0, item, q_row});
      item += p.Hkv * (c1 - c0);
      q_row += nt;
    }
  }
  *items = item;
  return tiles;
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

// Asks for the row pf[j] (n elements) to be brought into the caches, for
// j < pf_n: the loops below fetch the next rows they will need while they
// compute on this ones (the value rows of the chunk during its scores, the
// next chunk's key rows during its weighted sum), so that the memory streams
// without a pause at each chunk's start.
// bf16 only: its chunks are half as long a stream (32 KiB of keys at D = 64),
// and measured under load the 4k step went 1.06 -> 0.93 ms and 32k 25 -> 15
// ms with it, while fp32, whose streams the hardware prefetcher follows on its
// own, went 1.53 -> 1.85 ms at 4k: fp32 rows are not asked for.
template <class Rows>
HWY_INLINE void PrefetchRow(const Rows* pf, size_t pf_n, size_t j, size_t n) {
  using T = typename Rows::Element;
  if constexpr (std::is_same_v<T, float>) return;
  if (pf == nullptr || j >= pf_n) return;
  const auto* row = reinterpret_cast<const char*>((*pf)[j]);
  for (size_t b = 0; b < n * sizeof(T); b += 64) hwy::Prefetch(row + b);
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

// s[j] = scale · q · K[j] for j in [a, e) (K[j]: key row j, D wide). Four keys
// at a time, one vector chain each, their four sums across lanes found
// together (folded to 128 bits, then transposed by interleaving: one vector of
// four scores); the rest one key at a time.
template <class Rows, class PfRows>
HWY_INLINE void Scores(DF d, const float* q, const Rows& K, size_t D, size_t a, size_t e,
                       float scale, float* s, const PfRows* pf, size_t pf_n, size_t pf_len) {
  size_t j = a;
#if HWY_TARGET != HWY_SCALAR  // 4 lanes or more
  {
    using T = typename Rows::Element;
    const size_t L = hn::Lanes(d), Dv = D / L * L;
    for (; j + 4 <= e; j += 4) {
      // Rows j + 1 .. j + 3 from row j (a dense cache: as offsets of one pointer, which
      // measured 1.5x faster than four row addresses computed apart).
      const T *k0 = K[j], *k1 = K.after(k0, j, 1), *k2 = K.after(k0, j, 2), *k3 = K.after(k0, j, 3);
      for (size_t jj = j; jj < j + 4; ++jj) PrefetchRow(pf, pf_n, jj, pf_len);
      VF c0 = hn::Zero(d), c1 = hn::Zero(d), c2 = hn::Zero(d), c3 = hn::Zero(d);
      for (size_t i = 0; i < Dv; i += L) {
        const VF qv = hn::LoadU(d, q + i);
        c0 = hn::MulAdd(qv, LoadRow(d, k0 + i), c0);
        c1 = hn::MulAdd(qv, LoadRow(d, k1 + i), c1);
        c2 = hn::MulAdd(qv, LoadRow(d, k2 + i), c2);
        c3 = hn::MulAdd(qv, LoadRow(d, k3 + i), c3);
      }
      const auto f0 = Fold128(d, c0), f1 = Fold128(d, c1), f2 = Fold128(d, c2), f3 = Fold128(d, c3);
      const hn::DFromV<decltype(f0)> d4;
      // [f0₀+f0₂, f1₀+f1₂, f0₁+f0₃, f1₁+f1₃] and the same for f2, f3.
      const auto u = hn::Add(hn::InterleaveLower(d4, f0, f1), hn::InterleaveUpper(d4, f0, f1));
      const auto w = hn::Add(hn::InterleaveLower(d4, f2, f3), hn::InterleaveUpper(d4, f2, f3));
      auto sums = hn::Add(hn::ConcatLowerLower(d4, w, u), hn::ConcatUpperUpper(d4, w, u));
      if (Dv < D) {  // the columns past the last full vector
        HWY_ALIGN float tail[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        const T* ks[4] = {k0, k1, k2, k3};
        for (size_t kk = 0; kk < 4; ++kk) {
          for (size_t i = Dv; i < D; ++i) tail[kk] += q[i] * Scalar(ks[kk][i]);
        }
        sums = hn::Add(sums, hn::Load(d4, tail));
      }
      hn::StoreU(hn::Mul(hn::Set(d4, scale), sums), d4, s + j);
    }
  }
#endif
  for (; j < e; ++j) {
    PrefetchRow(pf, pf_n, j, pf_len);
    s[j] = scale * Dot(d, q, K[j], D);
  }
}

// s[j] for j in [a, e), the scores of the query at position pos whose keys
// start at j0: softcap · tanh(s / softcap) when softcap > 0, then
// - slope · (pos - (j0 + j)) when slope is given (attn/sdpa.h's order).
HWY_INLINE void ScoreMods(DF d, float* s, size_t a, size_t e, float softcap, const float* slope,
                          int64_t pos, int64_t j0) {
  if (softcap > 0.0f) {
    const size_t L = hn::Lanes(d);
    const VF c = hn::Set(d, softcap);
    size_t j = a;
    for (; j + L <= e; j += L) {
      hn::StoreU(hn::Mul(c, hn::Tanh(d, hn::Div(hn::LoadU(d, s + j), c))), d, s + j);
    }
    for (; j < e; ++j) s[j] = softcap * std::tanh(s[j] / softcap);
  }
  if (slope != nullptr) {
    for (size_t j = a; j < e; ++j) s[j] += -*slope * static_cast<float>(pos - (j0 + int64_t(j)));
  }
}

// o (Dv) = Σ_{j in [a, e)} w[j] · V[j] (V[j]: value row j, Dv wide). Columns
// in blocks of 4 vectors held in registers across the keys, two sets (even and
// odd keys) so that no add waits for the one before it; then single vectors;
// then a scalar tail.
template <class Rows, class PfRows>
HWY_INLINE void WeightedSum(DF d, float* o, const float* w, const Rows& V, size_t Dv, size_t a,
                            size_t e, const PfRows* pf, size_t pf_n, size_t pf_len) {
  using T = typename Rows::Element;
  const size_t L = hn::Lanes(d);
  size_t i = 0;
  for (; i + 4 * L <= Dv; i += 4 * L) {
    VF x0 = hn::Zero(d), x1 = hn::Zero(d), x2 = hn::Zero(d), x3 = hn::Zero(d);
    VF y0 = hn::Zero(d), y1 = hn::Zero(d), y2 = hn::Zero(d), y3 = hn::Zero(d);
    size_t j = a;
    for (; j + 2 <= e; j += 2) {
      if (i == 0) {
        PrefetchRow(pf, pf_n, j, pf_len);
        PrefetchRow(pf, pf_n, j + 1, pf_len);
      }
      const T* v = V[j] + i;
      const T* u = V.after(v, j, 1);
      const VF w0 = hn::Set(d, w[j]), w1 = hn::Set(d, w[j + 1]);
      x0 = hn::MulAdd(w0, LoadRow(d, v), x0);
      x1 = hn::MulAdd(w0, LoadRow(d, v + L), x1);
      x2 = hn::MulAdd(w0, LoadRow(d, v + 2 * L), x2);
      x3 = hn::MulAdd(w0, LoadRow(d, v + 3 * L), x3);
      y0 = hn::MulAdd(w1, LoadRow(d, u), y0);
      y1 = hn::MulAdd(w1, LoadRow(d, u + L), y1);
      y2 = hn::MulAdd(w1, LoadRow(d, u + 2 * L), y2);
      y3 = hn::MulAdd(w1, LoadRow(d, u + 3 * L), y3);
    }
    if (j < e) {
      const T* v = V[j] + i;
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
  for (; i + L <= Dv; i += L) {
    VF x = hn::Zero(d), y = hn::Zero(d);
    size_t j = a;
    for (; j + 2 <= e; j += 2) {
      x = hn::MulAdd(hn::Set(d, w[j]), LoadRow(d, V[j] + i), x);
      y = hn::MulAdd(hn::Set(d, w[j + 1]), LoadRow(d, V[j + 1] + i), y);
    }
    if (j < e) x = hn::MulAdd(hn::Set(d, w[j]), LoadRow(d, V[j] + i), x);
    hn::StoreU(hn::Add(x, y), d, o + i);
  }
  for (; i < Dv; ++i) {
    float x = 0.0f;
    for (size_t j = a; j < e; ++j) x += w[j] * Scalar(V[j][i]);
    o[i] = x;
  }
}

// Row j of a run of cache rows, as the loops above read them: `stride`
// elements apart (a dense cache: the address computed), or through a table of
// row pointers (a paged pool: rows wherever their pages lie).
template <class T>
struct StridedRows {
  using Element = T;
  const T* base;
  size_t stride;
  const T* operator[](size_t j) const { return base + j * stride; }
  // Row j + m given p = row j (+ any column offset).
  const T* after(const T* p, size_t, size_t m) const { return p + m * stride; }
};
template <class T>
struct TableRows {
  using Element = T;
  const T* const* at;
  const T* operator[](size_t j) const { return at[j]; }
  const T* after(const T* p, size_t j, size_t m) const { return at[j + m] + (p - at[j]); }
};

// The rows of one work item's chunk: its keys and values, and the next
// chunk's first keys (to fetch ahead).
template <class Rows>
struct ChunkRows {
  Rows K, V;    // C rows each
  Rows K_next;  // next_n key rows of the next chunk
  size_t C, next_n;
};

// One work item: the keys [j0, j0 + C) of one kv head for R query rows q (R,
// D) fp32. Row r sees the keys [lo[r], hi[r]) and sits at position pos[r] with
// ALiBi slope slopes[r] (slopes nullptr: none). Writes per row m[r] (the
// largest visible score, -inf if none), l[r] = Σ exp(s - m) and o (R, Dv) =
// Σ exp(s - m) · v. s: scratch of R · C floats; ae of 2R.
template <class Rows>
HWY_INLINE void Chunk(const float* q, const ChunkRows<Rows>& rows, size_t D, size_t Dv, float scale,
                      float softcap, size_t R, const int64_t* lo, const int64_t* hi,
                      const int64_t* pos, const float* slopes, int64_t j0, float* s, size_t* ae,
                      float* m, float* l, float* o) {
  const DF d;
  const size_t L = hn::Lanes(d);
  const size_t C = rows.C;
  const int64_t j1 = j0 + int64_t(C);
  // Each row's visible part of the chunk, [a, e) relative to j0.
  size_t* a = ae;
  size_t* e = ae + R;
  for (size_t r = 0; r < R; ++r) {
    a[r] = size_t(std::clamp(lo[r], j0, j1) - j0);
    e[r] = size_t(std::clamp(hi[r], j0, j1) - j0);
  }
  // Scores, one row after the other over its visible keys (the chunk's key
  // rows come from memory for the first row, from L2 for the others).
  for (size_t r = 0; r < R; ++r) {
    if (a[r] >= e[r]) continue;
    // The first row's pass fetches the chunk's value rows meanwhile.
    Scores(d, q + r * D, rows.K, D, a[r], e[r], scale, s + r * C, r == 0 ? &rows.V : nullptr, C,
           Dv);
    if (softcap > 0.0f || slopes != nullptr) {
      ScoreMods(d, s + r * C, a[r], e[r], softcap, slopes ? slopes + r : nullptr, pos[r], j0);
    }
  }
  // Each row's exp(s - m) in place, and l.
  for (size_t r = 0; r < R; ++r) {
    float* sr = s + r * C;
    std::fill(o + r * Dv, o + (r + 1) * Dv, 0.0f);
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
    WeightedSum(d, o + r * Dv, s + r * C, rows.V, Dv, a[r], e[r], r == 0 ? &rows.K_next : nullptr,
                rows.next_n, D);
  }
}

inline void StoreOut(float* o, float x) { *o = x; }
inline void StoreOut(uint16_t* o, float x) { *o = to_bfloat16(x).bits; }

// TQ: q and out, TKV: keys and values; float or uint16_t (bf16 bits) each.
template <class TQ, class TKV>
void Forward(TQ* out, const TQ* q, const TKV* keys, const TKV* values, const DecodeProblem& p) {
  int64_t items = 0;
  const std::vector<detail::DecodeTile> tiles = detail::decode_tiles(p, &items);
  const int64_t G = p.Hq / p.Hkv, D = p.D, Dv = p.Dv;
  // Which tile each item belongs to, and where the partials of the tiles with
  // several chunks go (one chunk: the item's result is final and goes straight
  // to out).
  std::vector<int32_t> tile_of(static_cast<size_t>(items));
  std::vector<int64_t> part_row0(tiles.size(), -1);
  int64_t part_rows = 0, queries = 0;
  std::vector<std::pair<int32_t, int32_t>> combine;  // (tile, kv head) to combine
  for (size_t i = 0; i < tiles.size(); ++i) {
    const detail::DecodeTile& tile = tiles[i];
    std::fill(tile_of.begin() + tile.item0, tile_of.begin() + tile.item0 + p.Hkv * tile.nc,
              int32_t(i));
    if (tile.nc > 1) {
      part_row0[i] = part_rows;
      part_rows += p.Hkv * tile.nc * G * tile.nt;
      for (int64_t g = 0; g < p.Hkv; ++g) combine.emplace_back(int32_t(i), int32_t(g));
    }
    queries += tile.nt;
  }
  int64_t Rmax = 0;  // the most query rows of one item
  for (const detail::DecodeTile& tile : tiles) Rmax = std::max(Rmax, G * tile.nt);
  std::unique_ptr<float[]> part_o, part_m, part_l;
  if (part_rows > 0) {
    part_o.reset(new float[size_t(part_rows * Dv)]);
    part_m.reset(new float[size_t(part_rows)]);
    part_l.reset(new float[size_t(part_rows)]);
  }
  // Each group's query rows (tile, g, r = gi·nt + t), widened to fp32 once.
  std::vector<float> qf(static_cast<size_t>(queries * p.Hq * D));
  for (const detail::DecodeTile& tile : tiles) {
    for (int64_t h = 0; h < p.Hq; ++h) {
      for (int64_t t = 0; t < tile.nt; ++t) {
        const TQ* src = q + decode_q_offset(p, tile.b, tile.t0 + t) + h * D;
        float* dst = qf.data() + ((tile.q_row0 * p.Hq) + h * tile.nt + t) * D;
        for (int64_t i = 0; i < D; ++i) dst[i] = Scalar(src[i]);
      }
    }
  }
  // Output row r = gi·nt + t of group g of a tile.
  const auto out_row = [&](const detail::DecodeTile& tile, int64_t g, int64_t r) {
    const int64_t gi = r / tile.nt, t = r % tile.nt;
    return out + decode_o_offset(p, tile.b, tile.t0 + t) + (g * G + gi) * Dv;
  };
  int64_t kv_rows = 0;
  for (const detail::DecodeTile& tile : tiles) kv_rows += tile.hi - tile.lo;
  const int64_t kv_elems = kv_rows * p.Hkv * (D + Dv) / 2;
#pragma omp parallel if (items > 1 && kv_elems >= 16384)
  {
    std::vector<float> s(static_cast<size_t>(Rmax * kDecodeChunk)), m(static_cast<size_t>(Rmax)),
        l(static_cast<size_t>(Rmax)), o(static_cast<size_t>(Rmax * Dv)),
        slopes(static_cast<size_t>(Rmax));
    std::vector<int64_t> lo(static_cast<size_t>(Rmax)), hi(lo.size()), pos(lo.size());
    std::vector<size_t> ae(static_cast<size_t>(2 * Rmax));
    std::vector<const TKV*> kp(kDecodeChunk), vp(kDecodeChunk), kn(kDecodeChunk);
#pragma omp for schedule(static)
    for (int64_t item = 0; item < items; ++item) {
      const detail::DecodeTile& tile = tiles[size_t(tile_of[size_t(item)])];
      const int64_t g = (item - tile.item0) / tile.nc, c = tile.c0 + (item - tile.item0) % tile.nc;
      const int64_t R = G * tile.nt;
      const int64_t j0 = std::max(tile.lo, c * kDecodeChunk);
      const int64_t j1 = std::min(tile.hi, (c + 1) * kDecodeChunk);
      const int64_t next_n = std::min(tile.hi - j1, j1 - j0);
      for (int64_t r = 0; r < R; ++r) {
        const int64_t gi = r / tile.nt, at = tile.pos0 + r % tile.nt;
        pos[size_t(r)] = at;
        lo[size_t(r)] = p.window_left < 0 ? 0 : std::max<int64_t>(0, at - p.window_left);
        hi[size_t(r)] = at + 1;
        if (p.alibi_slopes != nullptr) slopes[size_t(r)] = p.alibi_slopes[g * G + gi];
      }
      const bool direct = tile.nc == 1;
      const int64_t at =
          direct ? 0 : part_row0[size_t(tile_of[size_t(item)])] + (item - tile.item0) * R;
      float* pm = direct ? m.data() : part_m.get() + at;
      float* pl = direct ? l.data() : part_l.get() + at;
      float* po = direct ? o.data() : part_o.get() + at * Dv;
      const auto chunk = [&](const auto& rows) {
        Chunk(qf.data() + (tile.q_row0 * p.Hq + g * G * tile.nt) * D, rows, size_t(D), size_t(Dv),
              p.scale, p.softcap, size_t(R), lo.data(), hi.data(), pos.data(),
              p.alibi_slopes ? slopes.data() : nullptr, j0, s.data(), ae.data(), pm, pl, po);
      };
      const size_t C = size_t(j1 - j0);
      if (p.block_table == nullptr) {  // a dense cache: rows a stride apart
        const size_t ks = size_t(p.k_strides.row), vs = size_t(p.v_strides.row);
        const TKV* k = keys + decode_cache_offset(p, p.k_strides, tile.b, g, 0);
        const TKV* v = values + decode_cache_offset(p, p.v_strides, tile.b, g, 0);
        chunk(ChunkRows<StridedRows<TKV>>{
            {k + j0 * ks, ks}, {v + j0 * vs, vs}, {k + j1 * ks, ks}, C, size_t(next_n)});
      } else {  // a paged pool: each row where its page lies
        for (int64_t j = j0; j < j1; ++j) {
          kp[size_t(j - j0)] = keys + decode_cache_offset(p, p.k_strides, tile.b, g, j);
          vp[size_t(j - j0)] = values + decode_cache_offset(p, p.v_strides, tile.b, g, j);
        }
        if constexpr (!std::is_same_v<TKV, float>) {  // fetched ahead: bf16 only (PrefetchRow)
          for (int64_t j = j1; j < j1 + next_n; ++j)
            kn[size_t(j - j1)] = keys + decode_cache_offset(p, p.k_strides, tile.b, g, j);
        }
        chunk(ChunkRows<TableRows<TKV>>{{kp.data()}, {vp.data()}, {kn.data()}, C, size_t(next_n)});
      }
      if (direct) {
        for (int64_t r = 0; r < R; ++r) {
          TQ* dst = out_row(tile, g, r);
          for (int64_t i = 0; i < Dv; ++i) StoreOut(dst + i, po[r * Dv + i] / pl[r]);
        }
      }
    }
    // Each output row (tile, g, r) of a tile with several chunks: its chunks'
    // partials in chunk order.
#pragma omp for schedule(static)
    for (int64_t task = 0; task < int64_t(combine.size()); ++task) {
      const auto [ti, g] = combine[size_t(task)];
      const detail::DecodeTile& tile = tiles[size_t(ti)];
      const int64_t R = G * tile.nt, nc = tile.nc;
      const int64_t first = part_row0[size_t(ti)] + g * nc * R;  // chunk c's rows at first + c·R
      for (int64_t r = 0; r < R; ++r) {
        float M = -std::numeric_limits<float>::infinity();
        for (int64_t c = 0; c < nc; ++c) M = std::max(M, part_m[size_t(first + c * R + r)]);
        float Lsum = 0.0f;
        std::fill(o.begin(), o.begin() + Dv, 0.0f);
        for (int64_t c = 0; c < nc; ++c) {
          const int64_t row = first + c * R + r;
          const float w = std::exp(part_m[size_t(row)] - M);  // 0 for a chunk it cannot see
          Lsum += w * part_l[size_t(row)];
          const float* oc = part_o.get() + row * Dv;
          for (int64_t i = 0; i < Dv; ++i) o[size_t(i)] += w * oc[i];
        }
        TQ* dst = out_row(tile, g, r);
        for (int64_t i = 0; i < Dv; ++i) StoreOut(dst + i, o[size_t(i)] / Lsum);
      }
    }
  }
}

void ForwardF32(float* out, const float* q, const float* keys, const float* values,
                const DecodeProblem& p) {
  Forward(out, q, keys, values, p);
}
void ForwardF32Bf16(float* out, const float* q, const uint16_t* keys, const uint16_t* values,
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
HWY_EXPORT(ForwardF32Bf16);
HWY_EXPORT(ForwardBf16);

void decode_attention_forward(float* out, const float* q, const float* keys, const float* values,
                              const DecodeProblem& p) {
  HWY_DYNAMIC_DISPATCH(ForwardF32)(out, q, keys, values, validated(p));
}

void decode_attention_forward(float* out, const float* q, const BFloat16* keys,
                              const BFloat16* values, const DecodeProblem& p) {
  HWY_DYNAMIC_DISPATCH(ForwardF32Bf16)
  (out, q, reinterpret_cast<const uint16_t*>(keys), reinterpret_cast<const uint16_t*>(values),
   validated(p));
}

void decode_attention_forward_bf16(BFloat16* out, const BFloat16* q, const BFloat16* keys,
                                   const BFloat16* values, const DecodeProblem& p) {
  HWY_DYNAMIC_DISPATCH(ForwardBf16)
  (reinterpret_cast<uint16_t*>(out), reinterpret_cast<const uint16_t*>(q),
   reinterpret_cast<const uint16_t*>(keys), reinterpret_cast<const uint16_t*>(values),
   validated(p));
}

int64_t decode_attention_kv_bytes(const DecodeProblem& p_in, int64_t element_bytes) {
  const DecodeProblem p = validated(p_in);
  int64_t items = 0, rows = 0;
  for (const detail::DecodeTile& tile : detail::decode_tiles(p, &items)) rows += tile.hi - tile.lo;
  return rows * p.Hkv * (p.D + p.Dv) * element_bytes;
}

}  // namespace attn::kernels
#endif  // HWY_ONCE
