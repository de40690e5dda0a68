// Fused scaled-dot-product attention in bfloat16, forward and backward: the
// fp32 kernel's algorithm (sdpa_kernel.cpp, attn/kernels.h) with every
// matrix product on AVX512-BF16 dot products (VDPBF16PS: two bf16 products
// summed into each fp32 lane), fp32 scores, softmax statistics and
// accumulators, as PyTorch's bf16 flash attention keeps them.
//
// The products. VDPBF16PS multiplies pairs along the reduction axis, so
//   C[r, 0:W] (+)= Σ_p word(A[r, 2p], A[r, 2p+1]) · word(B[2p, 0:W], B[2p+1, 0:W])
// where a "word" is two bf16 side by side in 32 bits (the even index in the
// low half). The A operand is read as words through two strides (any layout
// whose pairs lie along the reduction axis); the B operand must be "pair
// interleaved": row p holds, for each output column w, the word
// (B[2p, w], B[2p+1, w]). Every operand is packed into one of those layouts
// from the token-major bf16 inputs (cheap: once per tile, reused by a group of
// tiles), and the fp32 weights P and dS are rounded to bf16 into them (one
// VCVTNE2PS2BF16 and one permute per 16 words).
//
// Forward, per (b, h, group of kGroup query tiles of Br = 64 rows), keys in tiles of 64:
//   Sᵀ (keys, Br)  = K_tile · Q_tileᵀ          A: K rows,  B: Qᵀ (dim pairs × queries)
//   online softmax down the key axis (vector lanes = queries), in base 2
//   O (Br, hd)     = α ⊙ O + P · V_tile        A: P (key pairs of Sᵀ interleaved),
//                                              B: V (key pairs × dims)
// Backward, per (b, h): groups of key tiles outside, query tiles inside:
//   S  (Br, Bc) = Q Kᵀ,  dP = dO Vᵀ             A: Q, dO rows;  B: Kᵀ, Vᵀ (dim pairs × keys)
//   P = 2^(c·S − lse2),  dS = scale · P ⊙ (dP ⊙ Z − D)      (fp32)
//   dV += (P ⊙ Z)ᵀ dO,  dK += dSᵀ Q             A: query pairs interleaved; B: dO, Q pairs
//   dQ += dS K                                   A: dS rows;  B: K (key pairs × dims)
// dQ, dK and dV accumulate in fp32 and are rounded to bf16 once, at the end.
// Threads, tile order, causal skipping and the Philox dropout noise are the
// fp32 kernel's, so the results do not depend on the thread count either.
// The sdpa routes' extras (flash_bf16_strided.h): any row strides;
// grouped-query heads (the backward's unit a key/value head and its query
// heads); Tk != T keys; and an additive mask, whose 64 x 64 tiles (this
// kernel's query and key tiles) tile_mask-inl.h classifies once a call: a
// tile it hides wholly is skipped, forward and backward, one with values to
// add takes its scores to base 2 with them added (c·S + log2(e)·mask; the
// forward's key-major Sᵀ reads the mask's tile transposed), and a row whose
// keys are all closed gives output 0 and lse -inf, as in the sdpa kernel.
//
// AVX512-BF16 is not among Highway 1.0.3's targets, so this file uses the
// intrinsics under a target pragma (after every header: inline functions from
// headers keep the default target and cannot be merged with AVX-512 copies)
// and runs only when the CPU reports the feature. Elsewhere the public entry
// points run the sdpa kernel's bf16 tiles (the "widened" path: each tile
// widened to fp32 as it is packed, the fp32 kernel's products and bits;
// kernels/flash_as_sdpa.h). It used to widen whole tensors into fresh buffers
// first, which made it ~1.8x slower than fp32 (Xeon, T = 1024; now ~1.0x). The
// vector helpers it shares with the AMX kernel (exp2, lane masks, rounding
// into words) are in avx512_bf16-inl.h.
#include <fmt/format.h>
#include <hwy/aligned_allocator.h>
#include <immintrin.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "attn/cpu.h"
#include "attn/kernels.h"
#include "attn/tensor.h"
#include "kernels/avx512_bf16-inl.h"
#include "kernels/flash_as_sdpa.h"
#include "kernels/flash_attention_amx.h"
#include "kernels/flash_bf16_strided.h"
#include "kernels/philox.h"
#include "kernels/tile_mask-inl.h"

#ifdef _OPENMP
#include <omp.h>
#endif

namespace attn::kernels {
namespace {

using Words = hwy::AlignedFreeUniquePtr<uint32_t[]>;
using Floats = hwy::AlignedFreeUniquePtr<float[]>;
Words words(size_t n) { return hwy::AllocateAligned<uint32_t>(std::max<size_t>(n, 1)); }
Floats floats(size_t n) { return hwy::AllocateAligned<float>(std::max<size_t>(n, 1)); }

constexpr size_t kN = 16;         // fp32 lanes of a 512-bit vector
constexpr size_t kNV = 4;         // vectors per micro-kernel row
constexpr size_t kMR = 6;         // micro-kernel rows: 6·4 accumulators + 6 broadcasts + 1 load
constexpr size_t kBr = kNV * kN;  // forward query tile (64)
constexpr size_t kBcFwd = 64;     // forward key tile (a multiple of 4 for Philox)
constexpr size_t kBc = kNV * kN;  // backward key tile (64)
constexpr size_t kBrBwd = 64;     // backward query tile
constexpr size_t kGroup = 4;      // tiles sharing the other side's tile while it is in cache
// The most floats of query heads' dK, dV terms the per-head backward keeps
// (256 MB); beyond, the split schedule.
constexpr size_t kTermsFloatsMax = size_t{64} << 20;
constexpr float kLog2e = 1.44269504088896340736f;
constexpr float kLn2 = 0.69314718055994530942f;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

size_t RoundUp(size_t x, size_t m) { return (x + m - 1) / m * m; }
size_t Pairs(size_t n) { return (n + 1) / 2; }

// The params with the keys: Tk keys for the T queries, the causal offset:
// query i sees key j <= i + off (0: top-left; Tk - T: bottom-right), and an
// additive mask's tiles (tile_mask-inl.h). Tk = T, off = 0 and no mask are
// the core's own problem.
struct Problem : FlashAttentionParams {
  size_t Tk = 0;
  int64_t off = 0;
  const avx512::TileMask* mask = nullptr;
  Problem(const FlashAttentionParams& p, int64_t keys, bool bottom_right)
      : FlashAttentionParams(p),
        Tk(size_t(keys > 0 ? keys : p.T)),
        off(bottom_right ? int64_t(Tk) - p.T : 0) {}
  // How many keys (from key 0) the query rows before i_end see together.
  size_t KeyEnd(size_t i_end) const {
    if (!causal) return Tk;
    const int64_t e = int64_t(i_end) + off;
    return e <= 0 ? 0 : std::min(Tk, size_t(e));
  }
  // The first query that sees key j (causal).
  size_t FirstQuery(size_t j) const {
    const int64_t i = int64_t(j) - off;
    return i <= 0 ? 0 : size_t(i);
  }
};

int MaxThreads() {
#ifdef _OPENMP
  return omp_get_max_threads();
#else
  return 1;
#endif
}

// Two bf16 as one word: lo at the even index (the low half), hi at the odd one.
uint32_t Word(uint16_t lo, uint16_t hi) { return uint32_t(lo) | (uint32_t(hi) << 16); }

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,fma")
// GCC 12's AVX-512 headers start some intrinsics from an "undefined" vector
// (_mm512_undefined_*), which -W(maybe-)uninitialized reports once inlined.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

// The vector helpers of both bf16 kernels (avx512_bf16-inl.h).
using avx512::Elements32;
using avx512::Exp2;
using avx512::InterleaveIndex;
using avx512::InterleaveToWords;
using avx512::LanesBelow;
using avx512::RowToWords;

// ---- packing the bf16 inputs: O(tile) per tile (the products are O(tile²)) ----------------

// Rows r < n of a token-major head (hd bf16 each, `stride` apart) as words:
// dst (rows, hd2) with word p of row r = (x[r][2p], x[r][2p+1]); zero past hd
// and past n. Masked loads: nothing past a row's hd values is read.
void PackRows(uint32_t* dst, const uint16_t* x, size_t stride, size_t n, size_t rows, size_t hd) {
  const size_t width = 2 * Pairs(hd);  // bf16 per packed row
  auto* out = reinterpret_cast<uint16_t*>(dst);
  for (size_t r = 0; r < rows; ++r)
    for (size_t c0 = 0; c0 < width; c0 += 32) {
      const __m512i v = r < n ? _mm512_maskz_loadu_epi16(Elements32(c0, hd), x + r * stride + c0)
                              : _mm512_setzero_si512();
      _mm512_mask_storeu_epi16(out + r * width + c0, Elements32(c0, width), v);
    }
}

// The same words transposed: dst (hd2, cols), dst[p · cols + r] = (x[r][2p], x[r][2p+1]).
// Even hd: 16 rows at a time by gathers. Odd hd: plain loops, which read no
// further than x[r][hd - 1].
void PackRowsT(uint32_t* dst, const uint16_t* x, size_t stride, size_t n, size_t cols, size_t hd) {
  const size_t hd2 = Pairs(hd);
  if (hd % 2 == 0 && cols % kN == 0) {
    const __m512i offsets =  // bytes from row r0 to rows r0 .. r0 + 15
        _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                           _mm512_set1_epi32(int(2 * stride)));
    for (size_t r0 = 0; r0 < cols; r0 += kN) {
      const __mmask16 rows = LanesBelow(r0, n);
      const uint16_t* base = x + r0 * stride;
      for (size_t pr = 0; pr < hd2; ++pr)
        _mm512_storeu_si512(
            dst + pr * cols + r0,
            _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), rows, offsets, base + 2 * pr, 1));
    }
    return;
  }
  for (size_t r = 0; r < cols; ++r)
    for (size_t pr = 0; pr < hd2; ++pr) {
      const uint16_t lo = r < n ? x[r * stride + 2 * pr] : 0;
      const uint16_t hi = r < n && 2 * pr + 1 < hd ? x[r * stride + 2 * pr + 1] : 0;
      dst[pr * cols + r] = Word(lo, hi);
    }
}

// Pairs of rows interleaved: dst (rows/2, hdp), dst[p · hdp + d] = (x[2p][d], x[2p+1][d]);
// zero past hd and for rows past n.
void PackRowPairs(uint32_t* dst, const uint16_t* x, size_t stride, size_t n, size_t rows, size_t hd,
                  size_t hdp) {
  const __m512i idx = InterleaveIndex();
  for (size_t pr = 0; pr < Pairs(rows); ++pr) {
    const uint16_t* a = x + 2 * pr * stride;
    for (size_t d0 = 0; d0 < hdp; d0 += kN) {
      const __mmask16 dims = LanesBelow(d0, hd);
      const __m256i va =
          2 * pr < n ? _mm256_maskz_loadu_epi16(dims, a + d0) : _mm256_setzero_si256();
      const __m256i vb =
          2 * pr + 1 < n ? _mm256_maskz_loadu_epi16(dims, a + stride + d0) : _mm256_setzero_si256();
      const __m512i both = _mm512_inserti64x4(_mm512_castsi256_si512(va), vb, 1);
      _mm512_storeu_si512(dst + pr * hdp + d0, _mm512_permutexvar_epi16(idx, both));
    }
  }
}

// ---- the micro-kernel and its driver (the fp32 kernel's, on words) ---------------------------

enum Mode { kOverwrite = 0, kAccumulate = 1, kScaleAccumulate = 2 };

// C[r, 0:V·N] = init + Σ_{p<K} A[r·ars + p·aks] · B[p·bs + 0:V·N] (words: dot products
// of bf16 pairs) for r < R; init is 0, C, or c_scale[r]·C by Mode.
template <int kMode, size_t R, size_t V>
void MicroKernel(const uint32_t* __restrict A, size_t ars, size_t aks,
                 const uint32_t* __restrict Bm, size_t bs, size_t K, float* __restrict C, size_t cs,
                 const float* __restrict c_scale) {
  __m512 acc[R][V];
#pragma GCC unroll 8
  for (size_t r = 0; r < R; ++r) {
    const __m512 cr = kMode == kScaleAccumulate ? _mm512_set1_ps(c_scale[r]) : _mm512_setzero_ps();
#pragma GCC unroll 4
    for (size_t v = 0; v < V; ++v) {
      if constexpr (kMode == kOverwrite) {
        acc[r][v] = _mm512_setzero_ps();
      } else if constexpr (kMode == kAccumulate) {
        acc[r][v] = _mm512_loadu_ps(C + r * cs + v * kN);
      } else {
        acc[r][v] = _mm512_mul_ps(cr, _mm512_loadu_ps(C + r * cs + v * kN));
      }
    }
  }
  for (size_t k = 0; k < K; ++k) {
    __m512bh a[R];
#pragma GCC unroll 8
    for (size_t r = 0; r < R; ++r) a[r] = (__m512bh)_mm512_set1_epi32(int(A[r * ars + k * aks]));
    const uint32_t* __restrict b_row = Bm + k * bs;
#pragma GCC unroll 4
    for (size_t v = 0; v < V; ++v) {
      const __m512bh bv = (__m512bh)_mm512_loadu_si512(b_row + v * kN);
#pragma GCC unroll 8
      for (size_t r = 0; r < R; ++r) acc[r][v] = _mm512_dpbf16_ps(acc[r][v], a[r], bv);
    }
  }
#pragma GCC unroll 8
  for (size_t r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (size_t v = 0; v < V; ++v) _mm512_storeu_ps(C + r * cs + v * kN, acc[r][v]);
}

using MicroFn = void (*)(const uint32_t*, size_t, size_t, const uint32_t*, size_t, size_t, float*,
                         size_t, const float*);

template <int kMode, size_t... I>
constexpr std::array<MicroFn, sizeof...(I)> MicroTable(std::index_sequence<I...>) {
  return {&MicroKernel<kMode, I / kNV + 1, I % kNV + 1>...};
}

// The part of a block of rows [r0, r0 + nr) a causal tile needs: pairs [k0, k1)
// of the reduction, vectors [v0, v1) of the first width chunk.
struct Span {
  size_t k0, k1, v0, v1;
};

// C (M, W) op= A (M, 2K) · B (2K, W) on words; W a multiple of N (see MicroKernel).
template <int kMode, class SpanFn>
void GemmSpans(size_t M, size_t W, const uint32_t* A, size_t ars, size_t aks, const uint32_t* Bm,
               size_t bs, float* C, size_t cs, const float* c_scale, SpanFn span) {
  static constexpr auto table = MicroTable<kMode>(std::make_index_sequence<kMR * kNV>());
  for (size_t w0 = 0; w0 < W; w0 += kNV * kN) {
    const size_t nv = std::min(kNV, (W - w0) / kN);
    for (size_t r0 = 0; r0 < M; r0 += kMR) {
      const size_t nr = std::min(kMR, M - r0);
      const Span sp = span(r0, nr);
      const size_t v0 = w0 == 0 ? sp.v0 : 0, v1 = w0 == 0 ? std::min(nv, sp.v1) : nv;
      const size_t K = sp.k1 > sp.k0 ? sp.k1 - sp.k0 : 0;
      if (v0 >= v1 || (K == 0 && kMode == kAccumulate)) continue;
      table[(nr - 1) * kNV + (v1 - v0 - 1)](
          A + r0 * ars + sp.k0 * aks, ars, aks, Bm + sp.k0 * bs + w0 + v0 * kN, bs, K,
          C + r0 * cs + w0 + v0 * kN, cs, c_scale ? c_scale + r0 : nullptr);
    }
  }
}

// Philox4x32-10 for L counters at once (vectorised by the compiler); same bits as philox.h.
template <size_t L>
void PhiloxLanes(uint32_t* __restrict x0, uint32_t* __restrict x1, uint32_t* __restrict x2,
                 uint32_t* __restrict x3, uint64_t key) {
  uint32_t k0, k1;
  philox_key(key, k0, k1);
  for (int round = 0; round < kPhiloxRounds; ++round) {
    for (size_t m = 0; m < L; ++m) philox_round(x0[m], x1[m], x2[m], x3[m], k0, k1);
    philox_bump_key(k0, k1);
  }
}

// ---- forward ------------------------------------------------------------------------------

struct ForwardScratch {
  Words qT;            // (G, hd2, Br)   Q tileᵀ: dim pairs × queries
  Words kR;            // (Bc, hd2)      K tile rows
  Words vP;            // (Bc/2, hdp)    V tile: key pairs × dims
  Floats sT;           // (Bc, Br)       scores, key-major
  Words pW;            // (Bc/2, Br)     weights in bf16: key pairs × queries
  Floats z;            // (Bc, Br)       the tile's dropout noise
  Floats maskT;        // (Bc, Br)       the mask's tile, key-major
  Floats o;            // (G, Br, hdp)   unnormalised outputs
  Floats m, l, alpha;  // (G, Br) running max (base 2), sum, rescale
  ForwardScratch(size_t hd, size_t hdp)
      : qT(words(kGroup * Pairs(hd) * kBr)),
        kR(words(kBcFwd * Pairs(hd))),
        vP(words(kBcFwd / 2 * hdp)),
        sT(floats(kBcFwd * kBr)),
        pW(words(kBcFwd / 2 * kBr)),
        z(floats(kBcFwd * kBr)),
        maskT(floats(kBcFwd * kBr)),
        o(floats(kGroup * kBr * hdp)),
        m(floats(kGroup * kBr)),
        l(floats(kGroup * kBr)),
        alpha(floats(kGroup * kBr)) {}
};

// One query tile [i0, i0 + in) against keys [j0, j0 + jn) (packed in kR, vP).
void ForwardStep(const Problem& p, int64_t b, int64_t h, size_t i0, size_t in, size_t j0, size_t jn,
                 const uint32_t* kR, const uint32_t* vP, const uint32_t* qT, ForwardScratch& s,
                 float* __restrict o, float* __restrict m, float* __restrict l,
                 float* __restrict alpha) {
  const size_t hd = size_t(p.hd), hd2 = Pairs(hd), hdp = RoundUp(hd, kN);
  const DropoutRule rule(p.dropout_p);
  float* __restrict sT = s.sT.get();
  uint32_t* __restrict pW = s.pW.get();
  // A tile some of whose keys the first query does not see (the diagonal).
  const bool diagonal = p.causal && j0 + jn > p.KeyEnd(i0 + 1);
  // Sᵀ (jn, Br) = K_tile · Q_tileᵀ; on the diagonal, key j skips the query vectors before it.
  GemmSpans<kOverwrite>(jn, kBr, kR, hd2, 1, qT, kBr, sT, kBr, nullptr, [&](size_t r0, size_t) {
    const size_t i = p.FirstQuery(j0 + r0);
    return Span{0, hd2, diagonal && i > i0 ? std::min(kNV, (i - i0) / kN) : 0, kNV};
  });
  // A mask with values to add on this tile: Sᵀ taken to base 2 in place with
  // them added (c·S + log2(e)·mask; the mask's tile transposed, keys by
  // queries), so that c is 1 below. A closed key's score is -inf: weight 0.
  const bool adds = p.mask && p.mask->Adds(b, h, i0, j0);
  if (adds) {
    float* __restrict mT = s.maskT.get();
    p.mask->LoadTransposed(b, h, i0, in, j0, jn, mT);
    const __m512 c0 = _mm512_set1_ps(p.scale * kLog2e), l2e = _mm512_set1_ps(kLog2e);
    for (size_t jj = 0; jj < jn; ++jj)
      for (size_t v0 = 0; v0 < kBr; v0 += kN) {
        const __m512 add = _mm512_mul_ps(l2e, _mm512_loadu_ps(mT + jj * kBr + v0));
        float* s_at = sT + jj * kBr + v0;
        _mm512_storeu_ps(s_at, _mm512_fmadd_ps(_mm512_loadu_ps(s_at), c0, add));
      }
  }
  // Online softmax down the key axis, N queries per vector, in base 2
  // (c = scale · log2 e, or 1 after the mask's add); key j counts for lanes i >= j only.
  const __m512 c = _mm512_set1_ps(adds ? 1.0f : p.scale * kLog2e);
  const __m512 neg_inf = _mm512_set1_ps(kNegInf);
  auto past = [&](size_t v0, size_t j) -> __mmask16 {  // lanes i0 + v0 + lane that see key j
    return diagonal ? __mmask16(~LanesBelow(i0 + v0, p.FirstQuery(j))) : __mmask16(0xFFFF);
  };
  for (size_t v0 = 0; v0 < kBr; v0 += kN) {
    __m512 tile_max = neg_inf;
    for (size_t jj = 0; jj < jn; ++jj)
      tile_max = _mm512_mask_max_ps(tile_max, past(v0, j0 + jj), tile_max,
                                    _mm512_loadu_ps(sT + jj * kBr + v0));
    // c · max in base 2; a lane with no key here keeps -inf (also when c = 0).
    tile_max = _mm512_mask_mul_ps(neg_inf, _mm512_cmp_ps_mask(tile_max, neg_inf, _CMP_NEQ_OQ),
                                  tile_max, c);
    const __m512 m_old = _mm512_loadu_ps(m + v0);
    const __m512 m_new = _mm512_max_ps(m_old, tile_max);
    _mm512_storeu_ps(alpha + v0, Exp2(_mm512_sub_ps(m_old, m_new)));  // 0 on the first tile
    _mm512_storeu_ps(m + v0, m_new);
  }
  if (rule.active()) {  // z (jn, Br): one Philox block per query lane serves 4 keys
    alignas(64) uint32_t x[4][kBr];
    for (size_t jj = 0; jj < jn; jj += 4) {
      for (size_t lane = 0; lane < kBr; ++lane) {
        x[0][lane] = uint32_t((j0 + jj) >> 2), x[1][lane] = uint32_t(i0 + lane);
        x[2][lane] = uint32_t(h), x[3][lane] = uint32_t(b);
      }
      PhiloxLanes<kBr>(x[0], x[1], x[2], x[3], p.dropout_seed);
      for (size_t t = 0; t < 4 && jj + t < jn; ++t)
        for (size_t lane = 0; lane < kBr; ++lane)
          s.z[(jj + t) * kBr + lane] = rule.noise(x[t][lane]);
    }
  }
  // P = 2^(c·S − m) two keys at a time: summed into l (before dropout: l is
  // the softmax denominator), times Z, rounded to bf16 and key pairs
  // interleaved into pW (a missing odd key is zero).
  for (size_t v0 = 0; v0 < kBr; v0 += kN) {
    const __m512 m_new = _mm512_loadu_ps(m + v0);
    __m512 sum = _mm512_setzero_ps();
    for (size_t pr = 0; pr < Pairs(jn); ++pr) {
      const size_t jj = 2 * pr;
      __m512 p0 = _mm512_maskz_mov_ps(
          past(v0, j0 + jj), Exp2(_mm512_fmsub_ps(_mm512_loadu_ps(sT + jj * kBr + v0), c, m_new)));
      __m512 p1 = _mm512_setzero_ps();
      if (jj + 1 < jn)
        p1 = _mm512_maskz_mov_ps(
            past(v0, j0 + jj + 1),
            Exp2(_mm512_fmsub_ps(_mm512_loadu_ps(sT + (jj + 1) * kBr + v0), c, m_new)));
      sum = _mm512_add_ps(_mm512_add_ps(sum, p0), p1);
      if (rule.active()) {
        p0 = _mm512_mul_ps(p0, _mm512_loadu_ps(s.z.get() + jj * kBr + v0));
        if (jj + 1 < jn) p1 = _mm512_mul_ps(p1, _mm512_loadu_ps(s.z.get() + (jj + 1) * kBr + v0));
      }
      _mm512_storeu_si512(pW + pr * kBr + v0, InterleaveToWords(p0, p1));
    }
    _mm512_storeu_ps(l + v0,
                     _mm512_fmadd_ps(_mm512_loadu_ps(alpha + v0), _mm512_loadu_ps(l + v0), sum));
  }
  // O (in, hdp) = α ⊙ O + P (in, jn) · V_tile; on the diagonal, queries up to i stop at key i.
  GemmSpans<kScaleAccumulate>(
      in, hdp, pW, 1, kBr, vP, hdp, o, hdp, alpha, [&](size_t r0, size_t nr) {
        const size_t seen = p.KeyEnd(i0 + r0 + nr);
        const size_t keys = !diagonal ? jn : seen > j0 ? std::min(jn, seen - j0) : 0;
        return Span{0, Pairs(keys), 0, kNV};
      });
}

void ForwardGroup(uint16_t* out, float* lse, const uint16_t* q, const uint16_t* k,
                  const uint16_t* v, const Problem& p, const ForwardStrides& st, int64_t b,
                  int64_t h, int64_t hk, size_t i_first, size_t ng, ForwardScratch& s) {
  const size_t T = size_t(p.T), hd = size_t(p.hd), hd2 = Pairs(hd), hdp = RoundUp(hd, kN);
  auto tile_i0 = [&](size_t g) { return i_first + g * kBr; };
  auto tile_in = [&](size_t g) { return std::min(kBr, T - tile_i0(g)); };
  const uint16_t* q_head = q + b * st.q.b + h * st.q.h;
  for (size_t g = 0; g < ng; ++g)
    PackRowsT(s.qT.get() + g * hd2 * kBr, q_head + tile_i0(g) * st.q.t, size_t(st.q.t), tile_in(g),
              kBr, hd);
  std::fill(s.m.get(), s.m.get() + ng * kBr, kNegInf);
  std::fill(s.l.get(), s.l.get() + ng * kBr, 0.0f);
  std::fill(s.o.get(), s.o.get() + ng * kBr * hdp, 0.0f);
  auto key_end = [&](size_t g) { return p.KeyEnd(tile_i0(g) + tile_in(g)); };
  const uint16_t* k_head = k + b * st.k.b + hk * st.k.h;
  const uint16_t* v_head = v + b * st.v.b + hk * st.v.h;
  // Whether query tile g sees keys of the tile at j0: before its causal end,
  // and not hidden wholly by the mask (a hidden tile changes nothing).
  auto sees = [&](size_t g, size_t j0) {
    return j0 < key_end(g) && !(p.mask && p.mask->Hidden(b, h, tile_i0(g), j0));
  };
  for (size_t j0 = 0; j0 < key_end(ng - 1); j0 += kBcFwd) {
    bool any = false;
    for (size_t g = 0; g < ng; ++g) any = any || sees(g, j0);
    if (!any) continue;
    const size_t jn_all = std::min(kBcFwd, key_end(ng - 1) - j0);
    PackRows(s.kR.get(), k_head + j0 * st.k.t, size_t(st.k.t), jn_all, kBcFwd, hd);
    PackRowPairs(s.vP.get(), v_head + j0 * st.v.t, size_t(st.v.t), jn_all, kBcFwd, hd, hdp);
    for (size_t g = 0; g < ng; ++g) {
      if (!sees(g, j0)) continue;
      const size_t jn = std::min(kBcFwd, key_end(g) - j0);
      ForwardStep(p, b, h, tile_i0(g), tile_in(g), j0, jn, s.kR.get(), s.vP.get(),
                  s.qT.get() + g * hd2 * kBr, s, s.o.get() + g * kBr * hdp, s.m.get() + g * kBr,
                  s.l.get() + g * kBr, s.alpha.get() + g * kBr);
    }
  }
  // O /= l, rounded to bf16; lse = (m + log2 l) · ln 2; a query that sees no
  // key (Tq != Tk, causal), or only keys the mask closes, gets 0 and -inf.
  for (size_t g = 0; g < ng; ++g) {
    const float* o = s.o.get() + g * kBr * hdp;
    const float* m = s.m.get() + g * kBr;
    const float* l = s.l.get() + g * kBr;
    for (size_t i = 0; i < tile_in(g); ++i) {
      const size_t t = tile_i0(g) + i;
      const float inv_l = l[i] > 0.0f ? 1.0f / l[i] : 0.0f;
      uint16_t* oi = out + b * st.out.b + h * st.out.h + int64_t(t) * st.out.t;
      for (size_t dd = 0; dd < hd; ++dd) oi[dd] = to_bfloat16(o[i * hdp + dd] * inv_l).bits;
      lse[b * st.lse.b + h * st.lse.h + int64_t(t) * st.lse.t] =
          l[i] > 0.0f ? (m[i] + std::log2(l[i])) * kLn2 : kNegInf;
    }
  }
}

// G query heads per key/value head (query head h reads key/value head h / G).
void Forward(uint16_t* out, float* lse, const uint16_t* q, const uint16_t* k, const uint16_t* v,
             const Problem& p, const ForwardStrides& st, int64_t G) {
  const size_t hd = size_t(p.hd), hdp = RoundUp(hd, kN);
  const int64_t n_qt = (p.T + int64_t(kBr) - 1) / int64_t(kBr);
  const int64_t n_groups = (n_qt + int64_t(kGroup) - 1) / int64_t(kGroup);
  const int64_t BH = p.B * p.H;
#pragma omp parallel
  {
    ForwardScratch scratch(hd, hdp);
#pragma omp for schedule(dynamic, 1)
    for (int64_t item = 0; item < BH * n_groups; ++item) {
      const int64_t group = n_groups - 1 - item / BH, bh = item % BH;
      const int64_t first = group * int64_t(kGroup);
      const size_t ng = size_t(std::min(int64_t(kGroup), n_qt - first));
      const int64_t h = bh % p.H;
      ForwardGroup(out, lse, q, k, v, p, st, bh / p.H, h, h / G, size_t(first) * kBr, ng, scratch);
    }
  }
}

// ---- backward -----------------------------------------------------------------------------

struct BackwardScratch {
  Words kT, vT;    // (G, hd2, Bc)      K, V tilesᵀ: dim pairs × keys
  Words kP;        // (G, Bc/2, hdp)    K tiles: key pairs × dims
  Words qR, dOR;   // (BrBwd, hd2)      Q, dO tile rows
  Words qP, dOP;   // (BrBwd/2, hdp)    Q, dO tiles: query pairs × dims
  Floats S, dP;    // (BrBwd, Bc)       scores, dO Vᵀ
  Words dSW;       // (BrBwd, Bc/2)     dS rows in bf16
  Words PzT, dST;  // (BrBwd/2, Bc)     P ⊙ Z, dS: query pairs × keys
  Floats dK, dV;   // (G, Bc, hdp)      fp32 accumulators
  Floats dKh, dVh;  // (G, Bc, hdp)      the same: one query head's terms (grouped heads)
  Floats dQ;       // (G, T, hdp) a unit's whole-head dQ, or (BrBwd, hdp) for one query tile
  Floats z;        // (2, Bc)           two rows of dropout noise
  BackwardScratch(size_t dq_rows, size_t hd, size_t hdp)
      : kT(words(kGroup * Pairs(hd) * kBc)),
        vT(words(kGroup * Pairs(hd) * kBc)),
        kP(words(kGroup * kBc / 2 * hdp)),
        qR(words(kBrBwd * Pairs(hd))),
        dOR(words(kBrBwd * Pairs(hd))),
        qP(words(kBrBwd / 2 * hdp)),
        dOP(words(kBrBwd / 2 * hdp)),
        S(floats(kBrBwd * kBc)),
        dP(floats(kBrBwd * kBc)),
        dSW(words(kBrBwd * kBc / 2)),
        PzT(words(kBrBwd / 2 * kBc)),
        dST(words(kBrBwd / 2 * kBc)),
        dK(floats(kGroup * kBc * hdp)),
        dV(floats(kGroup * kBc * hdp)),
        dKh(floats(kGroup * kBc * hdp)),
        dVh(floats(kGroup * kBc * hdp)),
        dQ(floats(std::max(dq_rows, kBrBwd) * hdp)),
        z(floats(2 * kBc)) {}
};

// One head (b, h): its first rows and the elements between its rows, and its
// D and lse (base 2).
struct HeadView {
  int64_t b, h, hk;  // hk: the key/value head h reads
  const uint16_t *q, *k, *v, *dout;
  size_t q_t, k_t, v_t, dout_t;
  const float* D;     // (T) rowsum(dO ⊙ O)
  const float* lse2;  // (T)
};

HeadView MakeHeadView(const uint16_t* dout, const uint16_t* q, const uint16_t* k, const uint16_t* v,
                      const float* D, const float* lse2, const FlashAttentionParams& p,
                      const BackwardStrides& st, int64_t b, int64_t h, int64_t G) {
  const size_t T = size_t(p.T), bh = size_t(b * p.H + h);
  const int64_t hk = h / G;
  auto at = [&](const uint16_t* x, const RowStrides& r, int64_t head) {
    return x + b * r.b + head * r.h;
  };
  return HeadView{b,
                  h,
                  hk,
                  at(q, st.q, h),
                  at(k, st.k, hk),
                  at(v, st.v, hk),
                  at(dout, st.dout, h),
                  size_t(st.q.t),
                  size_t(st.k.t),
                  size_t(st.v.t),
                  size_t(st.dout.t),
                  D + bh * T,
                  lse2 + bh * T};
}

// Key tile g of a group: Kᵀ, Vᵀ (for S and dP) and K's key pairs (for dQ).
void PackKeyTile(BackwardScratch& s, size_t g, const HeadView& hv, const FlashAttentionParams& p,
                 size_t j0, size_t jn) {
  const size_t hd = size_t(p.hd), hd2 = Pairs(hd), hdp = RoundUp(hd, kN);
  PackRowsT(s.kT.get() + g * hd2 * kBc, hv.k + j0 * hv.k_t, hv.k_t, jn, kBc, hd);
  PackRowsT(s.vT.get() + g * hd2 * kBc, hv.v + j0 * hv.v_t, hv.v_t, jn, kBc, hd);
  PackRowPairs(s.kP.get() + g * kBc / 2 * hdp, hv.k + j0 * hv.k_t, hv.k_t, jn, kBc, hd, hdp);
}

// Query tile [i0, i0 + in): Q and dO as rows (for S and dP) and as query pairs (for dK, dV).
void PackQueryTile(BackwardScratch& s, const HeadView& hv, const FlashAttentionParams& p, size_t i0,
                   size_t in) {
  const size_t hd = size_t(p.hd), hdp = RoundUp(hd, kN);
  PackRows(s.qR.get(), hv.q + i0 * hv.q_t, hv.q_t, in, kBrBwd, hd);
  PackRows(s.dOR.get(), hv.dout + i0 * hv.dout_t, hv.dout_t, in, kBrBwd, hd);
  PackRowPairs(s.qP.get(), hv.q + i0 * hv.q_t, hv.q_t, in, kBrBwd, hd, hdp);
  PackRowPairs(s.dOP.get(), hv.dout + i0 * hv.dout_t, hv.dout_t, in, kBrBwd, hd, hdp);
}

// One pair (key tile g of the group, keys [j0, j0 + jn); the packed query tile
// [i0, i0 + in)): recompute P and dS, then accumulate whichever of dK, dV
// (Bc, hdp) and dQ (in, hdp) are given. The pairs of an output are visited
// in one order by every caller.
void TilePair(const HeadView& hv, const Problem& p, size_t g, size_t j0, size_t jn, size_t i0,
              size_t in, BackwardScratch& s, float* dK, float* dV, float* dQ) {
  if (p.mask && p.mask->Hidden(hv.b, hv.h, i0, j0)) return;  // every weight exactly 0
  const avx512::TileMask* adds = p.mask && p.mask->Adds(hv.b, hv.h, i0, j0) ? p.mask : nullptr;
  const size_t hd = size_t(p.hd), hd2 = Pairs(hd), hdp = RoundUp(hd, kN);
  const DropoutRule rule(p.dropout_p);
  float* __restrict S = s.S.get();
  float* __restrict dP = s.dP.get();
  const bool diagonal = p.causal && j0 + jn > p.KeyEnd(i0 + 1);
  const bool masked = jn < kBc || diagonal;
  auto key_vectors = [&](size_t r0, size_t nr) {
    const size_t seen = p.KeyEnd(i0 + r0 + nr);
    const size_t v1 = !diagonal ? kNV : seen > j0 ? std::min(kNV, (seen - j0 + kN - 1) / kN) : 0;
    return Span{0, hd2, 0, v1};
  };
  // S (in, Bc) = Q Kᵀ;  dP (in, Bc) = dO Vᵀ.
  GemmSpans<kOverwrite>(in, kBc, s.qR.get(), hd2, 1, s.kT.get() + g * hd2 * kBc, kBc, S, kBc,
                        nullptr, key_vectors);
  GemmSpans<kOverwrite>(in, kBc, s.dOR.get(), hd2, 1, s.vT.get() + g * hd2 * kBc, kBc, dP, kBc,
                        nullptr, key_vectors);
  // Two query rows at a time: P = 2^(c·S − lse2) (2^(c·S + log2(e)·mask − lse2)
  // where the mask adds, the forward's rounding), Pz = P ⊙ Z, dS = scale · P ⊙
  // (dP ⊙ Z − D), rounded to bf16 as dS rows (for dQ) and, query pairs
  // interleaved, Pz and dS (for dV, dK); a missing odd row is zero.
  const __m512 c = _mm512_set1_ps(p.scale * kLog2e);
  const __m512 l2e = _mm512_set1_ps(kLog2e);
  const __m512 scale_v = _mm512_set1_ps(p.scale);
  uint32_t* __restrict dSW = s.dSW.get();
  uint32_t* __restrict PzT = s.PzT.get();
  uint32_t* __restrict dST = s.dST.get();
  for (size_t pr = 0; pr < Pairs(in); ++pr) {
    const size_t rows = std::min<size_t>(2, in - 2 * pr);
    __m512 lse_i[2], D_i[2];
    __mmask16 valid[2][kNV];  // keys j valid for query i: j < Tk and (causal) j <= i + off
    const float* mask_row[2] = {nullptr, nullptr};
    for (size_t t = 0; t < 2; ++t) {
      const size_t ii = 2 * pr + std::min(t, rows - 1), i = i0 + ii;
      if (adds) mask_row[t] = adds->Row(hv.b, hv.h, i);
      lse_i[t] = _mm512_set1_ps(hv.lse2[i]);
      D_i[t] = _mm512_set1_ps(hv.D[i]);
      const size_t seen = p.KeyEnd(i + 1);
      const size_t j_lim = t < rows ? (seen > j0 ? std::min(jn, seen - j0) : 0) : 0;
      for (size_t vv = 0; vv < kNV; ++vv)
        valid[t][vv] = masked || t >= rows ? LanesBelow(vv * kN, j_lim) : __mmask16(0xFFFF);
      if (rule.active() && t < rows) {  // z (2, Bc): Philox block m serves keys 4m .. 4m+3
        constexpr size_t kBlocks = kBc / 4;
        alignas(64) uint32_t x[4][kBlocks];
        for (size_t m = 0; m < kBlocks; ++m) {
          x[0][m] = uint32_t(j0 / 4 + m), x[1][m] = uint32_t(i);
          x[2][m] = uint32_t(hv.h), x[3][m] = uint32_t(hv.b);
        }
        PhiloxLanes<kBlocks>(x[0], x[1], x[2], x[3], p.dropout_seed);
        for (size_t m = 0; m < kBlocks; ++m)
          for (size_t u = 0; u < 4; ++u) s.z[t * kBc + 4 * m + u] = rule.noise(x[u][m]);
      }
    }
    __m512 pz[2][kNV], ds[2][kNV];
    for (size_t t = 0; t < 2; ++t)
      for (size_t vv = 0; vv < kNV; ++vv) {
        const size_t at = (2 * pr + std::min(t, rows - 1)) * kBc + vv * kN;
        const __m512 sv = _mm512_loadu_ps(S + at);
        const __m512 pv =
            adds ? Exp2(_mm512_sub_ps(
                       _mm512_fmadd_ps(sv, c,
                                       _mm512_mul_ps(l2e, adds->Load(mask_row[t], j0 + vv * kN,
                                                                     LanesBelow(vv * kN, jn)))),
                       lse_i[t]))
                 : Exp2(_mm512_fmsub_ps(sv, c, lse_i[t]));
        __m512 dpv = _mm512_loadu_ps(dP + at);
        __m512 pzv = pv;
        if (rule.active()) {
          const __m512 zv = _mm512_loadu_ps(s.z.get() + t * kBc + vv * kN);
          dpv = _mm512_mul_ps(dpv, zv);
          pzv = _mm512_mul_ps(pv, zv);
        }
        const __m512 dsv = _mm512_mul_ps(_mm512_mul_ps(pv, _mm512_sub_ps(dpv, D_i[t])), scale_v);
        pz[t][vv] = _mm512_maskz_mov_ps(valid[t][vv], pzv);
        ds[t][vv] = _mm512_maskz_mov_ps(valid[t][vv], dsv);
      }
    for (size_t vv = 0; vv < kNV; ++vv) {
      _mm512_storeu_si512(PzT + pr * kBc + vv * kN, InterleaveToWords(pz[0][vv], pz[1][vv]));
      _mm512_storeu_si512(dST + pr * kBc + vv * kN, InterleaveToWords(ds[0][vv], ds[1][vv]));
    }
    for (size_t t = 0; t < rows; ++t)
      for (size_t vv = 0; vv < kNV; vv += 2)
        _mm512_storeu_si512(dSW + (2 * pr + t) * (kBc / 2) + vv * kN / 2,
                            RowToWords(ds[t][vv], ds[t][vv + 1]));
  }
  // dV (Bc, hdp) += Pzᵀ dO;  dK (Bc, hdp) += dSᵀ Q;  dQ (in, hdp) += dS K.
  // On the diagonal, keys from j see queries from i = j only (from the pair
  // holding j), and queries up to i see keys up to i only.
  auto from_query = [&](size_t r0, size_t) {
    const size_t i = p.FirstQuery(j0 + r0);
    return Span{diagonal && i > i0 ? std::min(Pairs(in), (i - i0) / 2) : 0, Pairs(in), 0, kNV};
  };
  auto to_key = [&](size_t r0, size_t nr) {
    const size_t seen = p.KeyEnd(i0 + r0 + nr);
    const size_t keys = !diagonal ? jn : seen > j0 ? std::min(jn, seen - j0) : 0;
    return Span{0, Pairs(keys), 0, kNV};
  };
  if (dV)
    GemmSpans<kAccumulate>(jn, hdp, PzT, 1, kBc, s.dOP.get(), hdp, dV, hdp, nullptr, from_query);
  if (dK)
    GemmSpans<kAccumulate>(jn, hdp, dST, 1, kBc, s.qP.get(), hdp, dK, hdp, nullptr, from_query);
  if (dQ)
    GemmSpans<kAccumulate>(in, hdp, dSW, kBc / 2, 1, s.kP.get() + g * kBc / 2 * hdp, hdp, dQ, hdp,
                           nullptr, to_key);
}

// The first query tile that sees key j0 (all of them when not causal).
size_t FirstQueryTile(const Problem& p, size_t j0) {
  return p.causal ? p.FirstQuery(j0) / kBrBwd * kBrBwd : 0;
}

// Rows of an fp32 (n, hdp) accumulator rounded into a token-major bf16 buffer.
void StoreRows(uint16_t* dst, size_t stride, const float* acc, size_t n, size_t hd, size_t hdp) {
  for (size_t r = 0; r < n; ++r)
    for (size_t dd = 0; dd < hd; ++dd) dst[r * stride + dd] = to_bfloat16(acc[r * hdp + dd]).bits;
}

// One query head's dK and dV terms, fp32 rows (Tk, hdp) each, kept for the
// sum over its group (Backward's per-head schedule).
struct HeadTerms {
  float* dk = nullptr;
  float* dv = nullptr;
};

// dst[0 .. n) += src[0 .. n) (n a multiple of 16).
void AddRow(float* __restrict dst, const float* __restrict src, size_t n) {
  for (size_t i = 0; i < n; i += kN)
    _mm512_storeu_ps(dst + i, _mm512_add_ps(_mm512_loadu_ps(dst + i), _mm512_loadu_ps(src + i)));
}

// dK, dV of key tiles j_first, j_first + Bc, ... (ng of them) of one
// key/value head, summed over the query heads that read it (heads[0 .. G),
// in order; query tiles in order inside), written out, or with `terms` (G =
// 1) kept in fp32 as the one head's terms; with dQ (G, T, hdp) given, the
// heads' dQ accumulates too. With G > 1 each head's terms are summed alone
// and the heads' sums then added in order (the first copied): the
// association of the per-head schedule's sum over kept terms, so that every
// schedule gives the same bits.
void KeyGroupTask(uint16_t* dk, uint16_t* dv, float* dQ, const HeadView* heads, int64_t G,
                  const Problem& p, const BackwardStrides& st, size_t j_first, size_t ng,
                  BackwardScratch& s, HeadTerms terms = {}) {
  const size_t T = size_t(p.T), hd = size_t(p.hd), hdp = RoundUp(hd, kN);
  auto tile_j0 = [&](size_t g) { return j_first + g * kBc; };
  auto tile_jn = [&](size_t g) { return std::min(kBc, p.Tk - tile_j0(g)); };
  for (size_t g = 0; g < ng; ++g) PackKeyTile(s, g, heads[0], p, tile_j0(g), tile_jn(g));
  std::fill(s.dK.get(), s.dK.get() + ng * kBc * hdp, 0.0f);
  std::fill(s.dV.get(), s.dV.get() + ng * kBc * hdp, 0.0f);
  const bool per_head = G > 1;
  float* dK_acc = per_head ? s.dKh.get() : s.dK.get();
  float* dV_acc = per_head ? s.dVh.get() : s.dV.get();
  for (int64_t u = 0; u < G; ++u) {
    const HeadView& hv = heads[u];
    float* dQ_head = dQ ? dQ + size_t(u) * T * hdp : nullptr;
    if (per_head) {
      std::fill(dK_acc, dK_acc + ng * kBc * hdp, 0.0f);
      std::fill(dV_acc, dV_acc + ng * kBc * hdp, 0.0f);
    }
    for (size_t i0 = FirstQueryTile(p, j_first); i0 < T; i0 += kBrBwd) {
      const size_t in = std::min(kBrBwd, T - i0);
      PackQueryTile(s, hv, p, i0, in);
      for (size_t g = 0; g < ng; ++g) {
        if (FirstQueryTile(p, tile_j0(g)) > i0) break;
        TilePair(hv, p, g, tile_j0(g), tile_jn(g), i0, in, s, dK_acc + g * kBc * hdp,
                 dV_acc + g * kBc * hdp, dQ_head ? dQ_head + i0 * hdp : nullptr);
      }
    }
    if (per_head) {  // the head's sums into the group's: the first copied, the others added
      if (u == 0) {
        std::copy(dK_acc, dK_acc + ng * kBc * hdp, s.dK.get());
        std::copy(dV_acc, dV_acc + ng * kBc * hdp, s.dV.get());
      } else {
        AddRow(s.dK.get(), dK_acc, ng * kBc * hdp);
        AddRow(s.dV.get(), dV_acc, ng * kBc * hdp);
      }
    }
  }
  if (terms.dk) {  // one head's terms, kept in fp32
    for (size_t g = 0; g < ng; ++g) {
      std::copy(s.dK.get() + g * kBc * hdp, s.dK.get() + (g * kBc + tile_jn(g)) * hdp,
                terms.dk + tile_j0(g) * hdp);
      std::copy(s.dV.get() + g * kBc * hdp, s.dV.get() + (g * kBc + tile_jn(g)) * hdp,
                terms.dv + tile_j0(g) * hdp);
    }
    return;
  }
  const HeadView& hv = heads[0];
  for (size_t g = 0; g < ng; ++g) {
    const int64_t t = int64_t(tile_j0(g));
    StoreRows(dk + hv.b * st.dk.b + hv.hk * st.dk.h + t * st.dk.t, size_t(st.dk.t),
              s.dK.get() + g * kBc * hdp, tile_jn(g), hd, hdp);
    StoreRows(dv + hv.b * st.dv.b + hv.hk * st.dv.h + t * st.dv.t, size_t(st.dv.t),
              s.dV.get() + g * kBc * hdp, tile_jn(g), hd, hdp);
  }
}

// dQ of query tile i0: its key tiles in order, the same pairs as KeyGroupTask's.
void QueryTileTask(uint16_t* dq, const HeadView& hv, const Problem& p, const BackwardStrides& st,
                   size_t i0, BackwardScratch& s) {
  const size_t T = size_t(p.T), hd = size_t(p.hd), hdp = RoundUp(hd, kN);
  const size_t in = std::min(kBrBwd, T - i0);
  float* dQ = s.dQ.get();  // (in, hdp)
  std::fill(dQ, dQ + in * hdp, 0.0f);
  PackQueryTile(s, hv, p, i0, in);
  for (size_t j0 = 0; j0 < p.Tk && FirstQueryTile(p, j0) <= i0; j0 += kBc) {
    const size_t jn = std::min(kBc, p.Tk - j0);
    PackKeyTile(s, 0, hv, p, j0, jn);
    TilePair(hv, p, 0, j0, jn, i0, in, s, nullptr, nullptr, dQ);
  }
  StoreRows(dq + hv.b * st.dq.b + hv.h * st.dq.h + int64_t(i0) * st.dq.t, size_t(st.dq.t), dQ, in,
            hd, hdp);
}

// One key/value head and the G query heads that read it (heads[0 .. G)), or
// with `terms` one query head (G = 1), its dK, dV terms kept (KeyGroupTask).
void BackwardUnit(uint16_t* dq, uint16_t* dk, uint16_t* dv, const HeadView* heads, int64_t G,
                  const Problem& p, const BackwardStrides& st, BackwardScratch& s,
                  HeadTerms terms = {}) {
  const size_t T = size_t(p.T), hd = size_t(p.hd), hdp = RoundUp(hd, kN);
  std::fill(s.dQ.get(), s.dQ.get() + size_t(G) * T * hdp, 0.0f);
  for (size_t j0 = 0; j0 < p.Tk; j0 += kGroup * kBc)
    KeyGroupTask(dk, dv, s.dQ.get(), heads, G, p, st, j0,
                 std::min(kGroup, (p.Tk - j0 + kBc - 1) / kBc), s, terms);
  for (int64_t u = 0; u < G; ++u) {
    const HeadView& hv = heads[u];
    StoreRows(dq + hv.b * st.dq.b + hv.h * st.dq.h, size_t(st.dq.t),
              s.dQ.get() + size_t(u) * T * hdp, T, hd, hdp);
  }
}

void Backward(uint16_t* dq, uint16_t* dk, uint16_t* dv, const uint16_t* dout, const uint16_t* q,
              const uint16_t* k, const uint16_t* v, const uint16_t* out, const float* lse,
              const Problem& p, const BackwardStrides& st, int64_t G) {
  const size_t T = size_t(p.T), hd = size_t(p.hd), hdp = RoundUp(hd, kN);
  const int64_t BH = p.B * p.H, Hkv = p.H / G, BHkv = p.B * Hkv;
  // D = rowsum(dO ⊙ O) from the bf16 values, and lse · log2(e): (B, H, T) each.
  auto D = floats(size_t(BH) * T);
  auto lse2 = floats(size_t(BH) * T);
#pragma omp parallel for schedule(static)
  for (int64_t bh = 0; bh < BH; ++bh) {
    const int64_t b = bh / p.H, h = bh % p.H;
    for (size_t i = 0; i < T; ++i) {
      const int64_t t = int64_t(i);
      const uint16_t* dout_i = dout + b * st.dout.b + h * st.dout.h + t * st.dout.t;
      const uint16_t* out_i = out + b * st.out.b + h * st.out.h + t * st.out.t;
      float sum = 0.0f;
      for (size_t dd = 0; dd < hd; ++dd)
        sum += to_float(BFloat16{dout_i[dd]}) * to_float(BFloat16{out_i[dd]});
      // A query that sees no key (lse -inf): +inf, so that its P is 2^-inf = 0.
      const float lse_i = lse[b * st.lse.b + h * st.lse.h + t * st.lse.t];
      D[size_t(bh) * T + i] = lse_i == kNegInf ? 0.0f : sum;
      lse2[size_t(bh) * T + i] = lse_i == kNegInf ? -kNegInf : lse_i * kLog2e;
    }
  }
  auto view = [&](int64_t bh) {
    return MakeHeadView(dout, q, k, v, D.get(), lse2.get(), p, st, bh / p.H, bh % p.H, G);
  };
  // The query heads of unit (b, key/value head hk), in order.
  auto unit_views = [&](int64_t unit) {
    std::vector<HeadView> heads;
    const int64_t b = unit / Hkv, hk = unit % Hkv;
    for (int64_t h = hk * G; h < (hk + 1) * G; ++h) heads.push_back(view(b * p.H + h));
    return heads;
  };
  const int64_t threads = MaxThreads();
  if (!(threads > 1 && BHkv < 2 * threads)) {  // a whole unit per thread
#pragma omp parallel
    {
      BackwardScratch scratch(size_t(G) * T, hd, hdp);
#pragma omp for schedule(dynamic, 1)
      for (int64_t unit = 0; unit < BHkv; ++unit)
        BackwardUnit(dq, dk, dv, unit_views(unit).data(), G, p, st, scratch);
    }
    return;
  }
  // Few units but grouped-query heads, two query heads or more per thread:
  // a query head per thread, all its key groups, its dQ summed in the same
  // pass and its dK, dV terms kept in fp32 (within kTermsFloatsMax); then each
  // key/value head's terms summed over its group in order (KeyGroupTask's
  // association, so the same bits as the schedules above and below).
  const size_t Tk = p.Tk;
  if (G > 1 && BH >= 2 * threads && size_t(BH) * Tk * 2 * hdp <= kTermsFloatsMax) {
    auto dk_terms = floats(size_t(BH) * Tk * hdp);
    auto dv_terms = floats(size_t(BH) * Tk * hdp);
#pragma omp parallel
    {
      BackwardScratch scratch(T, hd, hdp);
#pragma omp for schedule(dynamic, 1)
      for (int64_t bh = 0; bh < BH; ++bh) {
        const HeadView hv = view(bh);
        BackwardUnit(
            dq, dk, dv, &hv, 1, p, st, scratch,
            {dk_terms.get() + size_t(bh) * Tk * hdp, dv_terms.get() + size_t(bh) * Tk * hdp});
      }
      // dK, dV of each key/value head's key j: its group's terms in order.
      Floats sum = floats(hdp);
#pragma omp for schedule(static)
      for (int64_t row = 0; row < BHkv * int64_t(Tk); ++row) {
        const int64_t b = row / (Hkv * int64_t(Tk)), hk = row / int64_t(Tk) % Hkv;
        const size_t j = size_t(row % int64_t(Tk));
        auto reduce = [&](const float* terms, uint16_t* dst, const RowStrides& rs) {
          const size_t h0 = size_t(b * p.H + hk * G);
          std::copy(terms + (h0 * Tk + j) * hdp, terms + (h0 * Tk + j + 1) * hdp, sum.get());
          for (size_t u = 1; u < size_t(G); ++u)
            AddRow(sum.get(), terms + ((h0 + u) * Tk + j) * hdp, hdp);
          StoreRows(dst + b * rs.b + hk * rs.h + int64_t(j) * rs.t, size_t(rs.t), sum.get(), 1, hd,
                    hdp);
        };
        reduce(dk_terms.get(), dk, st.dk);
        reduce(dv_terms.get(), dv, st.dv);
      }
    }
    return;
  }
  // Else dK, dV over key-tile groups, then dQ over query tiles (S and dP recomputed).
  const int64_t n_kt = int64_t((p.Tk + kBc - 1) / kBc), n_qt = int64_t((T + kBrBwd - 1) / kBrBwd);
  const int64_t n_kg = (n_kt + int64_t(kGroup) - 1) / int64_t(kGroup);
#pragma omp parallel
  {
    BackwardScratch scratch(kBrBwd, hd, hdp);
#pragma omp for schedule(dynamic, 1)
    for (int64_t item = 0; item < BHkv * n_kg; ++item) {
      const int64_t kg = item / BHkv, unit = item % BHkv;
      const int64_t first = kg * int64_t(kGroup);
      KeyGroupTask(dk, dv, nullptr, unit_views(unit).data(), G, p, st, size_t(first) * kBc,
                   size_t(std::min(int64_t(kGroup), n_kt - first)), scratch);
    }
#pragma omp for schedule(dynamic, 1)
    for (int64_t item = 0; item < BH * n_qt; ++item) {
      const int64_t qt = n_qt - 1 - item / BH, bh = item % BH;
      QueryTileTask(dq, view(bh), p, st, size_t(qt) * kBrBwd, scratch);
    }
  }
}

#pragma GCC diagnostic pop
#pragma GCC pop_options

// ---- the paths and the choice between them --------------------------------------------

// The paths, best first where the CPU has them all. AMX runs where the CPU
// has the tiles and the kernel lets this process use them. Without AMX the
// choice between VDPBF16PS and the widened fp32 kernel is measured: Intel
// cores run VDPBF16PS (two products a lane) at half the rate of FMA (one
// product a lane, twice the instructions per cycle), so the bf16 dot product
// does the same work no faster (measured, one thread: widened 10% faster at
// T = 4096, 13% slower at T = 1024); AMD Zen 4/5 run them at one rate. AVX512-BF16
// therefore comes before "widened to fp32" only when the measured bf16
// dot-product peak is about the fp32 FMA peak (>= 0.75 of it; src/cpu/bf16_peak.cpp,
// fma_peak.cpp; probed once, the first time the choice is needed, on the quick
// timing of src/cpu/peak_rate.h: about 0.25 s, where the full probes attn bench reports
// take about 2 s).
// A forced SIMD target below AVX-512 (ATTN_SIMD_TARGET=AVX2) stands for a CPU
// without it, so "widened to fp32" comes first there and the others, which
// use AVX-512 registers, after it (forcing one still runs it).
enum class Path { kAmx, kAvx512Bf16, kWidened };
int g_forced = -1;  // -1: automatic
bool Avx512Bf16BeatsWidened() {
  static const bool beats = [] {
    if (!cpu::has_avx512_bf16()) return false;
    // The rates differ by 2x or not at all; the rule's 0.75 keeps a loaded
    // machine's noise (tens of %) from flipping the choice.
    return cpu::bf16_dot_beats_fma(cpu::bf16_dot_peak_gflops_quick(),
                                   cpu::fma_peak_gflops_quick());
  }();
  return beats;
}
// The peaks are probed only under an AVX-512 target (the FMA peak is the
// target's own), and kept.
std::vector<Path> Paths() {
  const bool avx512 = simd_target_has_avx512(), amx = amx::amx_usable();
  const bool dot_first = avx512 && Avx512Bf16BeatsWidened();  // false without AVX512-BF16
  std::vector<Path> paths;
  if (avx512 && amx) paths.push_back(Path::kAmx);
  if (dot_first) paths.push_back(Path::kAvx512Bf16);
  paths.push_back(Path::kWidened);
  if (cpu::has_avx512_bf16() && !dot_first) paths.push_back(Path::kAvx512Bf16);
  if (!avx512 && amx) paths.push_back(Path::kAmx);
  return paths;
}
Path ChosenPath() {
  if (g_forced >= 0) return Path(g_forced);
  if (!simd_target_has_avx512()) return Path::kWidened;
  if (amx::amx_usable()) return Path::kAmx;  // no need to probe the peaks
  return Avx512Bf16BeatsWidened() ? Path::kAvx512Bf16 : Path::kWidened;
}
const char* PathName(Path path) {
  switch (path) {
    case Path::kAmx:
      return "AMX";
    case Path::kAvx512Bf16:
      return "AVX512-BF16";
    case Path::kWidened:
      break;
  }
  return "widened to fp32";
}

const uint16_t* bits(const BFloat16* x) { return reinterpret_cast<const uint16_t*>(x); }
uint16_t* bits(BFloat16* x) { return reinterpret_cast<uint16_t*>(x); }

// The strided form off AMX: the AVX512-BF16 kernel on the core's problem,
// with a mask, grouped-query heads and Tq != Tk.
void CheckStridedServes(Path path, const SdpaExtras& x, const FlashAttentionParams& p) {
  if (path != Path::kAvx512Bf16)
    throw std::invalid_argument(
        "flash attention bf16: the strided form needs the AMX or AVX512-BF16 path, the chosen "
        "path is " +
        std::string(PathName(path)));
  if (x.Tk < 0 || x.Hkv < 0 || (x.Hkv > 0 && p.H % x.Hkv != 0))
    throw std::invalid_argument(fmt::format(
        "flash attention bf16: the AVX512-BF16 path takes Tk >= 0 and Hkv dividing H ({}); got "
        "Tk {}, Hkv {}",
        p.H, x.Tk, x.Hkv));
}

// The strided form's problem on the AVX512-BF16 kernel; `tiles` holds the
// mask's tile classes while it runs.
Problem StridedProblem(const FlashAttentionParams& p, const SdpaExtras& x,
                       std::unique_ptr<const avx512::TileMask>& tiles) {
  Problem pr(p, x.Tk, x.bottom_right);
  if (x.mask.data)
    tiles = std::make_unique<const avx512::TileMask>(x.mask, p.B, p.H, size_t(p.T), pr.Tk);
  pr.mask = tiles.get();
  return pr;
}

}  // namespace

void flash_attention_forward_bf16(BFloat16* out, float* lse, const BFloat16* q, const BFloat16* k,
                                  const BFloat16* v, const FlashAttentionParams& params) {
  const FlashAttentionParams p = validated(params);
  if (ChosenPath() == Path::kAmx) {
    amx::forward(bits(out), lse, bits(q), bits(k), bits(v), p);
    return;
  }
  if (ChosenPath() == Path::kAvx512Bf16) {
    Forward(bits(out), lse, bits(q), bits(k), bits(v), Problem(p, p.T, false),
            token_major_strides(p), 1);
    return;
  }
  ForwardAsSdpa(out, lse, q, k, v, p);
}

void flash_attention_backward_bf16(BFloat16* dq, BFloat16* dk, BFloat16* dv, const BFloat16* dout,
                                   const BFloat16* q, const BFloat16* k, const BFloat16* v,
                                   const BFloat16* out, const float* lse,
                                   const FlashAttentionParams& params) {
  const FlashAttentionParams p = validated(params);
  if (ChosenPath() == Path::kAmx) {
    amx::backward(bits(dq), bits(dk), bits(dv), bits(dout), bits(q), bits(k), bits(v), bits(out),
                  lse, p);
    return;
  }
  if (ChosenPath() == Path::kAvx512Bf16) {
    Backward(bits(dq), bits(dk), bits(dv), bits(dout), bits(q), bits(k), bits(v), bits(out), lse,
             Problem(p, p.T, false), token_major_backward_strides(p), 1);
    return;
  }
  BackwardAsSdpa(dq, dk, dv, dout, q, k, v, out, lse, p);
}

void flash_attention_forward_bf16(uint16_t* out, float* lse, const uint16_t* q, const uint16_t* k,
                                  const uint16_t* v, const FlashAttentionParams& params,
                                  const ForwardStrides& st, const SdpaExtras& x) {
  const FlashAttentionParams p = validated(params);
  const Path path = ChosenPath();
  if (path == Path::kAmx) return amx::forward(out, lse, q, k, v, p, st, x);
  CheckStridedServes(path, x, p);
  std::unique_ptr<const avx512::TileMask> tiles;
  Forward(out, lse, q, k, v, StridedProblem(p, x, tiles), st, x.Hkv > 0 ? p.H / x.Hkv : 1);
}

void flash_attention_backward_bf16(uint16_t* dq, uint16_t* dk, uint16_t* dv, const uint16_t* dout,
                                   const uint16_t* q, const uint16_t* k, const uint16_t* v,
                                   const uint16_t* out, const float* lse,
                                   const FlashAttentionParams& params, const BackwardStrides& st,
                                   const SdpaExtras& x) {
  const FlashAttentionParams p = validated(params);
  const Path path = ChosenPath();
  if (path == Path::kAmx) return amx::backward(dq, dk, dv, dout, q, k, v, out, lse, p, st, x);
  CheckStridedServes(path, x, p);
  std::unique_ptr<const avx512::TileMask> tiles;
  Backward(dq, dk, dv, dout, q, k, v, out, lse, StridedProblem(p, x, tiles), st,
           x.Hkv > 0 ? p.H / x.Hkv : 1);
}

const char* flash_attention_bf16_path() { return PathName(ChosenPath()); }

std::vector<std::string> flash_attention_bf16_paths() {
  std::vector<std::string> names;
  for (const Path path : Paths()) names.emplace_back(PathName(path));
  return names;
}

bool flash_attention_bf16_use_path(const char* name) {
  g_forced = -1;
  if (name == nullptr) return true;
  for (const Path path : {Path::kAmx, Path::kAvx512Bf16, Path::kWidened}) {
    if (std::string(PathName(path)) != name) continue;
    if (path == Path::kAmx && !amx::amx_usable()) return false;
    if (path == Path::kAvx512Bf16 && !cpu::has_avx512_bf16()) return false;
    g_forced = int(path);
    return true;
  }
  return false;
}

}  // namespace attn::kernels
