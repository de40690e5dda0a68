// src/kernels/flash_tiles-inl.h - the tile machinery of the fp32 attention
// kernel (sdpa_kernel.cpp, which flash_attention.cpp runs): the vector type, exp2,
// Philox over vector lanes, and the register-blocked micro-kernel with its
// driver GemmSpans. Every product there is one small GEMM shape,
//   C[r, 0:W] (+)= Σ_k A[r·ars + k·aks] · B[k·bs + 0:W],
// A read through strides (so transposed operands cost nothing), B rows contiguous.
// A Highway per-target header: include it after <hwy/highway.h> in a file
// compiled once per target (foreach_target), outside any namespace.
#if defined(ATTN_KERNELS_FLASH_TILES_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef ATTN_KERNELS_FLASH_TILES_INL_H_
#undef ATTN_KERNELS_FLASH_TILES_INL_H_
#else
#define ATTN_KERNELS_FLASH_TILES_INL_H_
#endif

#include <hwy/highway.h>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <utility>

#include "kernels/avx512_transpose-inl.h"
#include "kernels/philox.h"

HWY_BEFORE_NAMESPACE();
namespace attn::kernels {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using DF = hn::ScalableTag<float>;
using VF = hn::Vec<DF>;
constexpr size_t kN = hn::MaxLanes(DF());  // floats per vector
constexpr size_t kNV = 4;                  // vectors per micro-kernel row
#if HWY_TARGET <= HWY_AVX3
constexpr size_t kMR = 6;  // 32 registers: 6·4 accumulators + 6 broadcasts + 1 load
#else
constexpr size_t kMR = 3;  // 16 registers: 3·4 accumulators + 3 broadcasts + 1 load
#endif
constexpr float kLog2e = 1.44269504088896340736f;
constexpr float kLn2 = 0.69314718055994530942f;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// 2^x for x <= 0 (the softmax's exponents), with a relative error below 1.7e-7 (1.67e-7 the
// largest on a grid of 2·10^6 points of [-1/2, 1/2], fp32's roundings included; 2.14e-7 with
// the unconstrained fit before, whose 2^0 was 1 + 2^-23): a degree-5 polynomial for 2^f on
// [-1/2, 1/2] whose constant term is 1, so that 2^0 = 1 exactly (minimax among those, max
// error 9.1e-8 in exact arithmetic), times 2^n. 2^0 = 1 makes the weight of a row's largest
// score exactly 1 and the online softmax's rescale exactly 1 once the row's maximum has
// settled (the unscaled micro-kernels then run: GemmSpansOn), so a row whose weight is all on
// one key outputs that key's value row exactly, and the backward's dS is then exactly 0
// there (issue 44). x below kExp2Min (and -inf, NaN) gives exactly 0, and no result is
// subnormal: an fp32 result that underflows (subnormal or rounded to 0) costs a microcode assist
// of ~160 cycles on Intel cores, for the whole vector. Every masked score of a diagonal tile
// (-inf) paid it: a 64 x 64 tile's softmax with its upper triangle at -inf took 170 cycles a
// vector against 11 (Xeon family 6 model 167, 2^-200 through VSCALEFPS). A weight below 2^-125
// beside the row's largest (1) is below fp32's resolution of any sum it joins. Per score the exp
// is about a tenth of the two products' FMAs, so its operation count sets much of the forward's
// speed. kernel_exp2 (attn/kernels.h) runs it for the tests.
HWY_INLINE VF Exp2Poly(DF d, VF f) {
  VF p = hn::Set(d, 1.3264728477224708e-3f);
  p = hn::MulAdd(p, f, hn::Set(d, 9.6715129911899567e-3f));
  p = hn::MulAdd(p, f, hn::Set(d, 5.5507335811853409e-2f));
  p = hn::MulAdd(p, f, hn::Set(d, 2.4022242426872253e-1f));
  p = hn::MulAdd(p, f, hn::Set(d, 6.9314700365066528e-1f));
  return hn::MulAdd(p, f, hn::Set(d, 1.0f));
}
constexpr float kExp2Min = -125.0f;  // 2^x below it is 0: p · 2^n stays normal
#if HWY_TARGET <= HWY_AVX3
// VREDUCEPS gives f = x - round(x) in one operation (round(x) = x - f, exactly):
// 9 vector operations (x <= 0 here, and 2^x above 2^127 would be +inf). The
// lanes below kExp2Min are masked off (a zeroing VREDUCEPS, then a zeroing
// VSCALEFPS), so their scaling never runs.
HWY_INLINE VF Exp2(DF d, VF x) {
  const __mmask16 live = _mm512_cmp_ps_mask(x.raw, hn::Set(d, kExp2Min).raw, _CMP_GE_OQ);
  const VF f{_mm512_maskz_reduce_ps(live, x.raw, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)};
  return VF{_mm512_maskz_scalef_ps(live, Exp2Poly(d, f).raw, hn::Sub(x, f).raw)};
}
#else
// Elsewhere (AVX2 and older) the rounding is the magic-number one: t = x + 1.5·2^23 rounds x to
// the nearest integer n (ties to even, as VROUNDPS) and leaves n in t's low mantissa bits, as
// 2^22 + n; shifted left by 23 that is n·2^23 (mod 2^32), which added to p's bits is p · 2^n.
// 13 vector operations, against 15 with a round, a conversion and a multiply, and the same bits
// (every float but NaN checked; NaN gives 0 here): p · 2^n is normal for n >= -125 (p >= 0.7), so
// adding to the exponent field is the exact product. The lanes below kExp2Min (and -inf, NaN) are
// zeroed by the compare; what t holds there is not read. x above 126 (never a softmax exponent; a
// wrong lse given to a backward) is taken as 126: a large finite weight, not a wrapped exponent.
HWY_INLINE VF Exp2(DF d, VF x) {
  const auto live = hn::Ge(x, hn::Set(d, kExp2Min));
  x = hn::Min(x, hn::Set(d, 126.0f));
  const VF magic = hn::Set(d, 12582912.0f);  // 1.5 · 2^23
  const VF t = hn::Add(x, magic);
  const VF p = Exp2Poly(d, hn::Sub(x, hn::Sub(t, magic)));  // f = x - n in [-1/2, 1/2]
  const hn::RebindToSigned<DF> di;
  const auto bits = hn::Add(hn::BitCast(di, p), hn::ShiftLeft<23>(hn::BitCast(di, t)));
  return hn::IfThenElseZero(live, hn::BitCast(d, bits));
}
#endif

// ScaledTransposeN: dst[j·ds + i] = c · src_i[j] for i, j < kN, src_i = src +
// i·ss: an N x N block (one vector a row) transposed in registers, scaled on
// the way; against N² scalar stores, N loads, N stores and 4N (AVX-512) or
// 3N (AVX2) shuffles. The same products c · x as a scalar loop, so the same
// bits. Src: fp32 rows, or bf16 rows widened exactly. Defined (and
// ATTN_HAVE_TRANSPOSE_N set) on AVX-512 and AVX2; other targets pack with scalar loops.
#undef ATTN_HAVE_TRANSPOSE_N
#if HWY_TARGET <= HWY_AVX3
#define ATTN_HAVE_TRANSPOSE_N 1
HWY_INLINE __m512 LoadWideN(const float* src) { return _mm512_loadu_ps(src); }
template <class B16>
HWY_INLINE __m512 LoadWideN(const B16* src) {
  static_assert(sizeof(B16) == 2, "bfloat16 rows");
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
template <class T>
HWY_INLINE void ScaledTransposeN(const T* HWY_RESTRICT src, size_t ss, float* HWY_RESTRICT dst,
                                 size_t ds, float c) {
  const __m512 cv = _mm512_set1_ps(c);
  __m512 r[16];
  for (size_t i = 0; i < 16; ++i) r[i] = _mm512_mul_ps(cv, LoadWideN(src + i * ss));
  avx512::Transpose16(r);
  for (size_t j = 0; j < 16; ++j) _mm512_storeu_ps(dst + j * ds, r[j]);
}
#elif HWY_TARGET == HWY_AVX2
#define ATTN_HAVE_TRANSPOSE_N 1
HWY_INLINE __m256 LoadWideN(const float* src) { return _mm256_loadu_ps(src); }
template <class B16>
HWY_INLINE __m256 LoadWideN(const B16* src) {
  static_assert(sizeof(B16) == 2, "bfloat16 rows");
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}
template <class T>
HWY_INLINE void ScaledTransposeN(const T* HWY_RESTRICT src, size_t ss, float* HWY_RESTRICT dst,
                                 size_t ds, float c) {
  const __m256 cv = _mm256_set1_ps(c);
  __m256 r[8], t[8];
  for (size_t i = 0; i < 8; ++i) r[i] = _mm256_mul_ps(cv, LoadWideN(src + i * ss));
  for (size_t k = 0; k < 4; ++k) {  // pairs of rows interleaved
    t[2 * k] = _mm256_unpacklo_ps(r[2 * k], r[2 * k + 1]);
    t[2 * k + 1] = _mm256_unpackhi_ps(r[2 * k], r[2 * k + 1]);
  }
  for (size_t k = 0; k < 2; ++k) {  // 4 x 4 blocks within each 128-bit lane
    r[4 * k] = _mm256_shuffle_ps(t[4 * k], t[4 * k + 2], 0x44);
    r[4 * k + 1] = _mm256_shuffle_ps(t[4 * k], t[4 * k + 2], 0xEE);
    r[4 * k + 2] = _mm256_shuffle_ps(t[4 * k + 1], t[4 * k + 3], 0x44);
    r[4 * k + 3] = _mm256_shuffle_ps(t[4 * k + 1], t[4 * k + 3], 0xEE);
  }
  for (size_t q = 0; q < 4; ++q) {  // then the 128-bit halves across registers
    t[q] = _mm256_permute2f128_ps(r[q], r[4 + q], 0x20);
    t[4 + q] = _mm256_permute2f128_ps(r[q], r[4 + q], 0x31);
  }
  for (size_t j = 0; j < 8; ++j) _mm256_storeu_ps(dst + j * ds, t[j]);
}
#endif

// Philox4x32-10 (kernels/philox.h) for L counters at once, one per lane of
// plain arrays, written so that the compiler vectorises it for this target
// (32 x 32 -> 64-bit multiplies: vpmuludq). Same bits as philox4x32_10.
template <size_t L>
HWY_INLINE void PhiloxLanes(uint32_t* HWY_RESTRICT x0, uint32_t* HWY_RESTRICT x1,
                            uint32_t* HWY_RESTRICT x2, uint32_t* HWY_RESTRICT x3, uint64_t key) {
  uint32_t k0, k1;
  philox_key(key, k0, k1);
  for (int round = 0; round < kPhiloxRounds; ++round) {
    for (size_t m = 0; m < L; ++m) philox_round(x0[m], x1[m], x2[m], x3[m], k0, k1);
    philox_bump_key(k0, k1);
  }
}

// The dropout noise of the fp32 kernels (the stream attn/kernels.h describes:
// Philox block (j / 4, i, h, b) gives keys j .. j + 3 of query i their noise),
// for any DropoutRule-like `rule` (active(), noise(bits)).
//
// A forward tile's probabilities in place: Sᵀ (jn, Br), row jj key j0 + jj,
// lane query i0 + lane (j0 a multiple of 4), each multiplied by its noise Z.
template <size_t kBr, class Rule>
HWY_INLINE void DropoutTileT(const Rule& rule, uint64_t seed, int64_t b, int64_t h, size_t i0,
                             size_t j0, size_t jn, float* HWY_RESTRICT sT) {
  alignas(64) uint32_t x[4][kBr];
  for (size_t jj = 0; jj < jn; jj += 4) {
    for (size_t lane = 0; lane < kBr; ++lane) {
      x[0][lane] = uint32_t((j0 + jj) >> 2), x[1][lane] = uint32_t(i0 + lane);
      x[2][lane] = uint32_t(h), x[3][lane] = uint32_t(b);
    }
    PhiloxLanes<kBr>(x[0], x[1], x[2], x[3], seed);
    for (size_t t = 0; t < 4 && jj + t < jn; ++t) {
      float* HWY_RESTRICT row = sT + (jj + t) * kBr;
      for (size_t lane = 0; lane < kBr; ++lane) row[lane] *= rule.noise(x[t][lane]);
    }
  }
}

// The backward's noise of query i against the kBc keys j0 .. j0 + kBc: z (kBc),
// Philox block m serving keys j0 + 4m .. j0 + 4m + 3.
template <size_t kBc, class Rule>
HWY_INLINE void DropoutRowNoise(const Rule& rule, uint64_t seed, int64_t b, int64_t h, size_t i,
                                size_t j0, float* HWY_RESTRICT z) {
  constexpr size_t kBlocks = kBc / 4;
  alignas(64) uint32_t x[4][kBlocks];
  for (size_t m = 0; m < kBlocks; ++m) {
    x[0][m] = uint32_t(j0 / 4 + m), x[1][m] = uint32_t(i);
    x[2][m] = uint32_t(h), x[3][m] = uint32_t(b);
  }
  PhiloxLanes<kBlocks>(x[0], x[1], x[2], x[3], seed);
  for (size_t m = 0; m < kBlocks; ++m)
    for (size_t t = 0; t < 4; ++t) z[4 * m + t] = rule.noise(x[t][m]);
}

// The forward's online softmax on a key-major tile of base-2 scores sT (jn,
// Br): lanes are queries (Br = kNV·N of them), rows keys. Per query: m_new =
// max(m, the tile's scores), P = 2^(S - m_new) in place, α = 2^(m - m_new),
// l = α·l + Σ P. A query whose scores so far are all -inf keeps m = -inf and
// l = 0 (the exponents are taken against 0 then, so no -inf - -inf). The kNV
// vectors of a row are done together: independent chains for the max and the sums.
HWY_INLINE void SoftmaxTileT(DF d, size_t jn, float* HWY_RESTRICT sT, float* HWY_RESTRICT m,
                             float* HWY_RESTRICT l, float* HWY_RESTRICT alpha) {
  constexpr size_t kBr = kNV * kN;
  VF mx[kNV], sum[kNV];
  for (size_t v = 0; v < kNV; ++v) mx[v] = hn::Load(d, m + v * kN), sum[v] = hn::Zero(d);
  for (size_t jj = 0; jj < jn; ++jj)
    for (size_t v = 0; v < kNV; ++v) mx[v] = hn::Max(mx[v], hn::Load(d, sT + jj * kBr + v * kN));
  VF m_use[kNV];
  for (size_t v = 0; v < kNV; ++v)
    m_use[v] = hn::IfThenZeroElse(hn::Eq(mx[v], hn::Set(d, kNegInf)), mx[v]);
  // One column of vectors at a time: its m and its sum stay in registers beside
  // Exp2's constants (with all kNV columns at once, 16-register targets spill them).
  for (size_t v = 0; v < kNV; ++v)
    for (size_t jj = 0; jj < jn; ++jj) {
      float* HWY_RESTRICT at = sT + jj * kBr + v * kN;
      const VF pv = Exp2(d, hn::Sub(hn::Load(d, at), m_use[v]));
      hn::Store(pv, d, at);
      sum[v] = hn::Add(sum[v], pv);
    }
  for (size_t v = 0; v < kNV; ++v) {
    const VF m_old = hn::Load(d, m + v * kN);
    const VF a = Exp2(d, hn::Sub(m_old, m_use[v]));  // 0 while m_old = -inf
    hn::Store(a, d, alpha + v * kN);
    hn::Store(mx[v], d, m + v * kN);
    hn::Store(hn::MulAdd(a, hn::Load(d, l + v * kN), sum[v]), d, l + v * kN);
  }
}

// ---- the micro-kernel and its driver ------------------------------------------------------

enum Mode { kOverwrite = 0, kAccumulate = 1, kScaleAccumulate = 2 };

// C[r, 0:V·N] = init + Σ_{k<K} A[r·ars + k·aks] · B[k·bs + 0:V·N] for r < R, where init is
// 0, C, or c_scale[r]·C by Mode.
template <int kMode, size_t R, size_t V>
void MicroKernel(const float* HWY_RESTRICT A, size_t ars, size_t aks, const float* HWY_RESTRICT Bm,
                 size_t bs, size_t K, float* HWY_RESTRICT C, size_t cs,
                 const float* HWY_RESTRICT c_scale) {
  const DF d;
  VF acc[R][V];
#pragma GCC unroll 8
  for (size_t r = 0; r < R; ++r) {
    const VF cr = kMode == kScaleAccumulate ? hn::Set(d, c_scale[r]) : hn::Zero(d);
#pragma GCC unroll 4
    for (size_t v = 0; v < V; ++v) {
      if constexpr (kMode == kOverwrite) {
        acc[r][v] = hn::Zero(d);
      } else if constexpr (kMode == kAccumulate) {
        acc[r][v] = hn::LoadU(d, C + r * cs + v * kN);
      } else {
        acc[r][v] = hn::Mul(cr, hn::LoadU(d, C + r * cs + v * kN));
      }
    }
  }
  for (size_t k = 0; k < K; ++k) {
    VF a[R];
#pragma GCC unroll 8
    for (size_t r = 0; r < R; ++r) a[r] = hn::Set(d, A[r * ars + k * aks]);
    const float* HWY_RESTRICT b_row = Bm + k * bs;
#pragma GCC unroll 4
    for (size_t v = 0; v < V; ++v) {
      const VF bv = hn::LoadU(d, b_row + v * kN);
#pragma GCC unroll 8
      for (size_t r = 0; r < R; ++r) acc[r][v] = hn::MulAdd(a[r], bv, acc[r][v]);
    }
  }
#pragma GCC unroll 8
  for (size_t r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (size_t v = 0; v < V; ++v) hn::StoreU(acc[r][v], d, C + r * cs + v * kN);
}

using MicroFn = void (*)(const float*, size_t, size_t, const float*, size_t, size_t, float*, size_t,
                         const float*);

template <int kMode, size_t... I>
constexpr std::array<MicroFn, sizeof...(I)> MicroTable(std::index_sequence<I...>) {
  return {&MicroKernel<kMode, I / kNV + 1, I % kNV + 1>...};
}

// The part of a block of rows [r0, r0 + nr) that a causal tile needs: the sum
// over k in [k0, k1) and the vectors [v0, v1) of the first width chunk.
struct Span {
  size_t k0, k1, v0, v1;
};

// C (M, W) op= A (M, K) · B (K, W); W a multiple of N. Rows of A at stride ars,
// its columns at stride aks; rows of B at stride bs; rows of C at stride cs.
// span(r0, nr) narrows the work of each block of rows: on tiles that cross the
// causal diagonal the products with masked entries are skipped (an overwritten
// C keeps stale values there, which the caller masks).
// after_block() runs after each micro-kernel call (a place to trickle prefetches).
struct NoHook {
  void operator()() const {}
};
// The driver over any micro-kernels of this shape (kMR rows, up to kNV vectors
// of kN lanes): `table` of kMode, indexed (rows - 1) · kNV + (vectors - 1), and
// `table_unscaled`, the same kernels without the scale (kAccumulate for
// kScaleAccumulate). Op: the operands' element (float here; the AVX512-BF16
// engine's words of two bf16, kernels/bf16_dot.h, whose reduction index counts pairs).
// A block of rows whose scales are all 1 (the online softmax's rescale once a
// row's running max has settled, most tiles of a long row) takes
// table_unscaled: 1 · C = C exactly, so the bits are the same.
template <int kMode, class Op, class Table, class SpanFn, class Hook = NoHook>
void GemmSpansOn(const Table& table, const Table& table_unscaled, size_t M, size_t W, const Op* A,
                 size_t ars, size_t aks, const Op* Bm, size_t bs, float* C, size_t cs,
                 const float* c_scale, SpanFn span, Hook after_block = Hook()) {
  for (size_t w0 = 0; w0 < W; w0 += kNV * kN) {
    const size_t nv = std::min(kNV, (W - w0) / kN);
    for (size_t r0 = 0; r0 < M; r0 += kMR) {
      const size_t nr = std::min(kMR, M - r0);
      const Span sp = span(r0, nr);
      const size_t v0 = w0 == 0 ? sp.v0 : 0, v1 = w0 == 0 ? std::min(nv, sp.v1) : nv;
      const size_t K = sp.k1 > sp.k0 ? sp.k1 - sp.k0 : 0;
      if (v0 >= v1 || (K == 0 && kMode == kAccumulate)) continue;
      bool unscaled = false;
      if constexpr (kMode == kScaleAccumulate) {
        unscaled = true;
        for (size_t r = 0; r < nr; ++r) unscaled &= c_scale[r0 + r] == 1.0f;
      }
      (unscaled ? table_unscaled : table)[(nr - 1) * kNV + (v1 - v0 - 1)](
          A + r0 * ars + sp.k0 * aks, ars, aks, Bm + sp.k0 * bs + w0 + v0 * kN, bs, K,
          C + r0 * cs + w0 + v0 * kN, cs, c_scale ? c_scale + r0 : nullptr);
      after_block();
    }
  }
}

// GemmSpansOn with this file's fp32 micro-kernels.
template <int kMode, class SpanFn, class Hook = NoHook>
void GemmSpans(size_t M, size_t W, const float* A, size_t ars, size_t aks, const float* Bm,
               size_t bs, float* C, size_t cs, const float* c_scale, SpanFn span,
               Hook after_block = Hook()) {
  static constexpr auto table = MicroTable<kMode>(std::make_index_sequence<kMR * kNV>());
  static constexpr auto table_unscaled = MicroTable < kMode == kScaleAccumulate
                                             ? kAccumulate
                                             : kMode > (std::make_index_sequence<kMR * kNV>());
  GemmSpansOn<kMode>(table, table_unscaled, M, W, A, ars, aks, Bm, bs, C, cs, c_scale, span,
                     after_block);
}

template <int kMode>
void Gemm(size_t M, size_t W, size_t K, const float* A, size_t ars, size_t aks, const float* Bm,
          size_t bs, float* C, size_t cs, const float* c_scale = nullptr) {
  GemmSpans<kMode>(M, W, A, ars, aks, Bm, bs, C, cs, c_scale, [K](size_t, size_t) {
    return Span{0, K, 0, kNV};
  });
}

inline size_t RoundUp(size_t x, size_t m) { return (x + m - 1) / m * m; }

// Asks for rows [t0, t1) of one head of a token-major buffer (hd elements each,
// rows a stride apart) to be brought towards L2 while the current tile is
// computed: with long sequences the next tile lives in L3 or memory, and rows
// a few KB apart defeat the hardware prefetchers.
// T: the element type (float, or a 16-bit bfloat16).
template <class T>
inline void PrefetchRows(const T* base, size_t stride, size_t t0, size_t t1, size_t hd) {
  constexpr size_t kLine = 64 / sizeof(T);
  for (size_t t = t0; t < t1; ++t)
    for (size_t dd = 0; dd < hd; dd += kLine) __builtin_prefetch(base + t * stride + dd, 0, 2);
}

// Rows [next, end) of up to two token-major heads (a: W_a wide, b: W_b wide),
// to be brought towards L2 a few rows at a time. A burst of hundreds of
// prefetches fills the L1 miss buffers and stalls the products behind it;
// spread over the micro-kernel calls of the current tile, the misses overlap
// the FMAs.
template <class T>
struct PrefetchTrickle {
  const T* a = nullptr;
  const T* b = nullptr;
  size_t a_stride = 0, b_stride = 0, a_width = 0, b_width = 0;
  size_t next = 0, end = 0, per_call = 1;
  void operator()() {
    for (size_t n = 0; n < per_call && next < end; ++n, ++next) {
      if (a) PrefetchRows(a, a_stride, next, next + 1, a_width);
      if (b) PrefetchRows(b, b_stride, next, next + 1, b_width);
    }
  }
  void rest() {
    per_call = end - next;
    (*this)();
  }
};

// NOLINTNEXTLINE(google-readability-namespace-comments)
}  // namespace HWY_NAMESPACE
}  // namespace attn::kernels
HWY_AFTER_NAMESPACE();

#endif  // ATTN_KERNELS_FLASH_TILES_INL_H_
