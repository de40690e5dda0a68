// The fused scaled-dot-product attention of attn/sdpa.h, forward and backward
// (FlashAttention-2 style), SIMD via Highway's dynamic dispatch. The maths is
// ref::sdpa_forward/backward's (src/reference/sdpa_reference.cpp); this file is how.
//
// Every matrix product here is one small GEMM shape,
//   C[r, 0:W] (+)= Σ_k A[r·ars + k·aks] · B[k·bs + 0:W],
// computed by a register-blocked micro-kernel (kernels/flash_tiles-inl.h): kMR
// rows of A broadcast against up to kNV vectors of a row of B. A is read
// through strides, so the transposed operands (Pᵀ, dSᵀ) cost nothing; B rows
// must be contiguous. The forward keeps the scores key-major, Sᵀ (keys, Br) =
// K_tile · (c·Q_tileᵀ), so the online softmax runs down the key axis with the
// vector lanes as queries (no shuffles), and O (Br, Dv) = α ⊙ O + P · V_tile
// with α = 2^(m_old − m_new). The backward recomputes P from the saved lse and
// forms dV += Pᵀ dO, dP = dO Vᵀ, dS = P ⊙ (dP − Δ), dQ += dS K, dK += dSᵀ Q.
// (flash_attention_forward/backward, the core's fp32 and bf16 entry points,
// describe their token-major buffers to this kernel: kernels/flash_as_sdpa.h.)
//
// The problem is general: q, k, v, out each with (b, h, t) strides; Tq != Tk; the causal
// and window rules as one band of keys per query, [i + lo, i + hi] (lo = δ -
// window_left, hi = δ + min(window_right, 0 if causal)); query head h reads key
// and value head h / (Hq / Hkv); Dv may differ from D; scores go through
// softcap, ALiBi and the additive mask before the online softmax.
//
// bfloat16 (SdpaProblemBf16): every function below is a template on the
// element type T of q, k, v, out, dout, dq, dk, dv and on the product engine
// E (FmaEngine, DotEngine: see "the product engines" below). On FmaEngine a
// bf16 tile is widened exactly to fp32 where it is loaded or packed (Widen,
// TileRows) and the products are the fp32 ones, so the bits are the fp32
// kernel's on the widened values (the path "widened to fp32"). On DotEngine
// (the path "AVX512-BF16") the tiles are packed as bf16 words and every
// product runs on VDPBF16PS, P and dS rounded to bf16 where they enter one.
// Either way the softmax and accumulators are fp32, and out, dq, dk, dv are
// rounded to bf16 once, as they are stored (Narrow). No widened copy of a
// whole tensor is made (the fp32 dQ accumulator, (B, Hq, Tq, Dp), is the one
// whole buffer). The schedule, the band, the masks, softcap, ALiBi, dropout,
// varlen and the work split are the same code on both engines, so native
// bf16 serves every case fp32 does.
//
// Scores are kept in base 2: without a softcap Q is scaled by c =
// scale·log2(e); with one, by scale / softcap, and s₂ = softcap·log2(e)·tanh(x).
// ALiBi and the mask are added times log2(e).
//
// Forward, per (b, h, group of kGroupFwd query tiles of Br rows): the key tiles
// that meet the group's band, in tiles of kBcFwd; a tile wholly outside a
// query tile's band is never visited (a window costs O(T·w)); a tile that
// crosses the band's edge skips the products wholly outside it at
// micro-kernel granularity and sets the rest to -inf; a tile the mask hides
// wholly (-inf everywhere) is skipped too. A row whose scores are
// all -inf ends with l = 0: its output is 0 and its lse -inf.
// With enough heads to share out evenly (e.g. 12 heads on 2 threads) a
// thread takes whole heads instead: it copies the key/value head's K and V
// rows once into a contiguous per-thread block (on huge pages where Linux
// gives them) and runs all the head's query groups from it. A head of a
// token-major tensor spans every page of the tensor and its rows crowd a few
// L1 sets, so read in place it costs TLB walks and cache misses on every tile
// (T = 4096 fp32 forward, one thread: 268 -> 183 ms with this and the
// cheaper exp). Backward does the same with a unit's Q, dO and dQ (fp32).
// Backward, per (b, key/value head): groups of key tiles outside, then each
// query head of the group and its query tiles inside (the fixed grid of
// kBrBwd rows), so dK and dV sum over the group's heads in one fixed order; dQ
// accumulates in place. With few heads per thread the work is split into
// key-group tasks (dK, dV) and then query-tile tasks (dQ); both visit each
// output's tile pairs in the same order, so the bits do not depend on the
// thread count.
// Variable-length packed batches (p.cu_seqlens_q set): the same tasks, each
// on one sequence's view (attn/sdpa_problem.h's sdpa_sequence: its lengths, its first
// rows, b strides 0, run as batch b so Philox and ALiBi see the sequence
// index); forward schedules (sequence, query group) x head items in one loop,
// backward (sequence, key/value head) units or (sequence, key group) and
// (sequence, query tile) tasks. No padding, no copy of the packed inputs; each
// sequence's bits are those of the sequence run alone. In bf16 too: the
// varlen schedules and views are templates on T like the rest.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "attn/kernels.h"
#include "attn/sdpa_problem.h"
#include "kernels/bf16_dot.h"
#include "kernels/philox.h"
#include "kernels/sdpa_mask.h"

#ifdef _OPENMP
#include <omp.h>
#endif
#ifdef __linux__
#include <sys/mman.h>
#endif

#include "cpu/hwy_targets.h"
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/sdpa_kernel.cpp"
#include <hwy/aligned_allocator.h>
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>
// After highway.h: the -inl headers are compiled once per target.
// The tile machinery: exp2, Philox lanes, the micro-kernel.
#include "kernels/flash_tiles-inl.h"
#include "kernels/bf16_load-inl.h"

HWY_BEFORE_NAMESPACE();
namespace attn::kernels {
namespace HWY_NAMESPACE {
namespace {  // this file's own names

constexpr size_t kBr = kNV * kN;            // forward query tile: one micro-kernel row width
constexpr size_t kBcFwd = 64;               // forward key tile (a multiple of 4 for Philox)
constexpr size_t kBc = kNV * kN;            // backward key tile
constexpr size_t kBrBwd = 64;               // backward query tile
constexpr size_t kGroup = 4;                // backward: key tiles per task, sharing what they read
constexpr size_t kGroupFwd = 4;             // forward: query tiles per group, sharing each K, V tile
constexpr int64_t kFar = int64_t{1} << 40;  // an unbounded side of the band
// The most floats a thread copies a key/value head into (64 MB: Tk = 131072 at D = Dv = 64).
constexpr size_t kHeadRowsMax = size_t{16} << 20;
// The most floats of query heads' dK, dV terms the per-head backward keeps
// (256 MB: 16 query heads at Tk = 32768, D = Dv = 64); beyond, the split schedule.
constexpr size_t kTermsFloatsMax = size_t{64} << 20;
// How many rows ahead a loop that copies or packs the rows of a token-major
// head asks for them (PrefetchRows). Each row is on its own 4 KB page (rows are
// H·D floats apart), so every row costs a TLB walk (two-level under a
// hypervisor) and a miss to L3 or memory, ~1-2k cycles; a copy loop spends
// ~20 cycles a row, so only a long lead keeps enough misses in flight.
// T = 4096, one thread: 8 rows ahead left the copies and packing ~20% of the forward.
constexpr size_t kRowsAhead = 32;

// Query i sees keys j with i + lo <= j <= i + hi (before clipping to [0, Tk)).
struct Band {
  int64_t lo, hi;
  int64_t first_key(int64_t i) const { return i + lo; }
  int64_t last_key(int64_t i) const { return i + hi; }
  int64_t first_query(int64_t j) const { return j - hi; }
  int64_t last_query(int64_t j) const { return j - lo; }
  // Whether every (i, j) of queries [i0, i1) x keys [j0, j1) is inside.
  bool covers(int64_t i0, int64_t i1, int64_t j0, int64_t j1) const {
    return first_key(i1 - 1) <= j0 && j1 - 1 <= last_key(i0);
  }
  // Whether some (i, j) of the block is inside.
  bool meets(int64_t i0, int64_t i1, int64_t j0, int64_t j1) const {
    return first_key(i0) <= j1 - 1 && j0 <= last_key(i1 - 1);
  }
};

template <class T>
Band MakeBand(const SdpaProblemT<T>& p) {
  const int64_t delta = p.causal_alignment == CausalAlignment::kBottomRight ? p.Tk - p.Tq : 0;
  int64_t right = p.window_right;
  if (p.is_causal) right = right >= 0 ? std::min<int64_t>(right, 0) : 0;
  return {p.window_left >= 0 ? delta - p.window_left : -kFar, right >= 0 ? delta + right : kFar};
}

template <class T>
int64_t Delta(const SdpaProblemT<T>& p) {
  return p.causal_alignment == CausalAlignment::kBottomRight ? p.Tk - p.Tq : 0;
}

size_t Clamp(int64_t x, size_t hi) { return size_t(std::clamp<int64_t>(x, 0, int64_t(hi))); }

// -inf where lanes l of a row (query i0 + v0 + l) fall outside [first, last]
// (positions relative to i0 clipped to the tile, so floats hold them exactly).
HWY_INLINE VF BandMask(DF d, VF s, size_t v0, int64_t first, int64_t last) {
  const VF lane = hn::Iota(d, float(v0));
  const VF lo = hn::Set(d, float(std::clamp<int64_t>(first, -1, int64_t(kBr) + 1)));
  const VF hi = hn::Set(d, float(std::clamp<int64_t>(last, -1, int64_t(kBr) + 1)));
  const auto inside = hn::And(hn::Ge(lane, lo), hn::Le(lane, hi));
  return hn::IfThenElse(inside, s, hn::Set(d, kNegInf));
}

template <class T>
T* At(T* base, const SdpaStrides& s, int64_t b, int64_t h, int64_t t = 0) {
  return base + b * s.b + h * s.h + t * s.t;
}

// ---- the product engines ------------------------------------------------------------------
// The schedule below is one, templated on the element type T and on the
// engine E that runs its products (each C (+)= A · B of the tiles):
// - FmaEngine: fp32 FMAs on fp32 operands (flash_tiles-inl.h's micro-kernel),
//   on every Highway target; bf16 operands are widened exactly as they are
//   loaded, so bf16 gives the bits of fp32 on the widened values.
// - DotEngine: AVX512-BF16 (kernels/bf16_dot.h): bf16 operands packed into
//   words, pairs along each product's reduction axis, multiplied by
//   VDPBF16PS; the weights P and dS are rounded to bf16 where they enter a
//   product (as PyTorch's bf16 flash attention does), scores, softmax and
//   accumulators stay fp32. bf16 problems on AVX-512 targets, where
//   kernels::bf16_dot_engine_chosen() (attn/kernels.h: the bf16 path's choice).
// What differs is where the scale c goes (FmaEngine folds it into the packed
// Q or K; DotEngine multiplies the fp32 scores, since the words hold the
// inputs' own bf16 values) and the operands' layouts; the tiles, band, masks,
// softmax, dropout and work split are the same code.
struct FmaEngine {
  static constexpr bool kDot = false;
  using Op = float;  // a packed operand's element
  static size_t Reduction(size_t n) { return n; }
};
struct DotEngine {
  static constexpr bool kDot = true;
  using Op = uint32_t;  // two bf16
  static size_t Reduction(size_t n) { return bf16dot::Pairs(n); }
};
// The engine exists on this target: VDPBF16PS works on 512-bit vectors of kN = 16.
#if HWY_TARGET <= HWY_AVX3
constexpr bool kDotTarget = kN == bf16dot::kN && kNV == bf16dot::kNV && kMR == bf16dot::kMR;
#else
constexpr bool kDotTarget = false;
#endif

// Whether a problem of element type T runs on DotEngine.
template <class T>
bool DotEngineChosen() {
  return std::is_same_v<T, BFloat16> && kDotTarget && bf16_dot_engine_chosen();
}

inline const uint16_t* Bits(const BFloat16* x) { return reinterpret_cast<const uint16_t*>(x); }

// One product site of the schedule on engine E: C (M, W) op= A · B, A and B
// in E's layouts, span(r0, nr) in elements of the reduction (DotEngine takes
// the pairs that hold them: an element outside the span that shares a pair
// with one inside is multiplied too, and is 0 there, as the schedule
// guarantees by zeroing the weights outside the band).
template <class E, int kMode, class SpanFn, class Hook = NoHook>
HWY_INLINE void Product(size_t M, size_t W, const typename E::Op* A, size_t ars, size_t aks,
                        const typename E::Op* Bm, size_t bs, float* C, size_t cs,
                        const float* c_scale, SpanFn span, Hook after_block = Hook()) {
  if constexpr (E::kDot) {  // flash_tiles-inl.h's driver on the engine's micro-kernels
    GemmSpansOn<kMode>(
        bf16dot::micro_table(kMode),
        bf16dot::micro_table(kMode == kScaleAccumulate ? kAccumulate : kMode), M, W, A, ars, aks,
        Bm, bs, C, cs, c_scale,
        [&](size_t r0, size_t nr) {
          Span sp = span(r0, nr);
          sp.k0 /= 2, sp.k1 = bf16dot::Pairs(sp.k1);
          return sp;
        },
        after_block);
  } else {
    GemmSpans<kMode>(M, W, A, ars, aks, Bm, bs, C, cs, c_scale, span, after_block);
  }
}

// tanh(x) for the softcap. |x| >= 0.3: by the kernels' exp2, sign(x) · (1 − e)
// / (1 + e) with e = 2^(−2·log2(e)·|x|) <= 0.55 (exactly 0, so tanh exactly ±1,
// above 43), relative error below 4e-7 (exp2's 2.2e-7, times |dt/de| <= 2);
// below, where 1 − e would lose the relative precision a small capped score
// needs, tanh's series to x⁹ (the next term, 1382/155925 · x¹¹, is below 6e-8
// of tanh there). About half of Highway's Tanh's operations: Tanh made a
// softcap cost 40-50% of the forward; this, 20-25% (T = 4096, AMD Zen 5).
HWY_INLINE VF TanhScore(DF d, VF x) {
  const VF one = hn::Set(d, 1.0f);
  const VF x2 = hn::Mul(x, x);
  VF p = hn::Set(d, 62.0f / 2835.0f);
  p = hn::MulAdd(p, x2, hn::Set(d, -17.0f / 315.0f));
  p = hn::MulAdd(p, x2, hn::Set(d, 2.0f / 15.0f));
  p = hn::MulAdd(p, x2, hn::Set(d, -1.0f / 3.0f));
  const VF series = hn::MulAdd(hn::Mul(x, x2), p, x);
  const VF ax = hn::Abs(x);
  const VF e = Exp2(d, hn::Mul(hn::Set(d, -2.0f * kLog2e), ax));
  const VF by_exp = hn::CopySignToAbs(hn::Div(hn::Sub(one, e), hn::Add(one, e)), x);
  return hn::IfThenElse(hn::Lt(ax, hn::Set(d, 0.3f)), series, by_exp);
}

// x[0 .. n) *= c (n a multiple of N): DotEngine's scores taken to base 2.
HWY_INLINE void ScaleRows(float* HWY_RESTRICT x, size_t n, float c) {
  const DF d;
  const VF cv = hn::Set(d, c);
  for (size_t at = 0; at < n; at += kN) hn::Store(hn::Mul(cv, hn::Load(d, x + at)), d, x + at);
}

// ---- element types: fp32 in the tiles, T in memory ------------------------------------------

HWY_INLINE float Widen(float x) { return x; }
HWY_INLINE float Widen(BFloat16 x) { return to_float(x); }  // exact
template <class T>
HWY_INLINE T Narrow(float x) {
  if constexpr (std::is_same_v<T, float>) {
    return x;
  } else {
    return to_bfloat16(x);  // round to nearest even, as PyTorch's cast
  }
}

// dst[0:n] = src[0:n], inline vectors: the rows copied here are a few hundred
// bytes, where a call to memmove costs as much as the copy (a whole head's
// rows per head and thread: ~1.5% of the fp32 forward at T = 1024).
HWY_INLINE void CopyRow(float* HWY_RESTRICT dst, const float* HWY_RESTRICT src, size_t n) {
  const DF d;
  size_t w = 0;
  for (; w + kN <= n; w += kN) hn::StoreU(hn::LoadU(d, src + w), d, dst + w);
  for (; w < n; ++w) dst[w] = src[w];
}

// dst[0:W] = src[0:W] widened to fp32, dst[W:Wp] = 0.
HWY_INLINE void WidenRow(float* HWY_RESTRICT dst, const float* HWY_RESTRICT src, size_t W,
                         size_t Wp) {
  CopyRow(dst, src, W);
  std::fill(dst + W, dst + Wp, 0.0f);
}
HWY_INLINE void WidenRow(float* HWY_RESTRICT dst, const BFloat16* HWY_RESTRICT src, size_t W,
                         size_t Wp) {
  const DF d;
  const auto* bits = reinterpret_cast<const uint16_t*>(src);
  size_t w = 0;
  for (; w + kN <= W; w += kN) hn::StoreU(LoadBf16(d, bits + w), d, dst + w);
  for (; w < W; ++w) dst[w] = to_float(src[w]);
  std::fill(dst + W, dst + Wp, 0.0f);
}

// Rows [t0, t0 + n) of one head (`stride` elements apart, W wide) as fp32 rows
// of Wp the products read: the rows themselves when T is float and W = Wp,
// else widened and zero-padded into buf (n · Wp floats). Returns rows, stride.
template <class T>
std::pair<const float*, size_t> TileRows(float* HWY_RESTRICT buf, const T* head, size_t stride,
                                         size_t t0, size_t n, size_t W, size_t Wp) {
  if constexpr (std::is_same_v<T, float>) {
    if (W == Wp) return {head + t0 * stride, stride};
  }
  for (size_t r = 0; r < n; ++r) WidenRow(buf + r * Wp, head + (t0 + r) * stride, W, Wp);
  return {buf, Wp};
}

// Rows [t0, t0 + n) of one head widened (bf16) or copied (fp32) into buf,
// zero-padded to Wp: contiguous rows whatever the head's stride.
template <class T>
std::pair<const float*, size_t> PackRows(float* HWY_RESTRICT buf, const T* head, size_t stride,
                                         size_t t0, size_t n, size_t W, size_t Wp) {
  for (size_t r = 0; r < n; ++r) WidenRow(buf + r * Wp, head + (t0 + r) * stride, W, Wp);
  return {buf, Wp};
}

// The forward's K or V tile: rows of a head-major head (W apart, as
// PyTorch's (B, H, T, D) tensors) read in place where TileRows can (fp32, W =
// Wp); others copied (PackRows): a token-major head's rows lie a multiple of
// 1 KB apart and would fall into a few of L1's sets. The same values either way.
template <class T>
std::pair<const float*, size_t> ForwardTileRows(float* HWY_RESTRICT buf, const T* head,
                                                size_t stride, size_t t0, size_t n, size_t W,
                                                size_t Wp) {
  if (stride == W) return TileRows(buf, head, stride, t0, n, W, Wp);
  return PackRows(buf, head, stride, t0, n, W, Wp);
}

// What a widened tile buffer holds: rows from t0 of the head at `head`
// (nullptr: nothing yet). Consecutive tile pairs often read the same tile.
struct WideTag {
  const void* head = nullptr;
  size_t t0 = 0;
};

// TileRows, widening only when buf (tagged `tag`) does not hold those rows already.
template <class T>
std::pair<const float*, size_t> CachedTileRows(float* HWY_RESTRICT buf, WideTag& tag, const T* head,
                                               size_t stride, size_t t0, size_t n, size_t W,
                                               size_t Wp) {
  if (!std::is_same_v<T, float> && tag.head == head && tag.t0 == t0) return {buf, Wp};
  tag = {head, t0};
  return TileRows(buf, head, stride, t0, n, W, Wp);
}

// ---- the mask's blocks ---------------------------------------------------------------------

// The additive mask, classified once per call in blocks of kMaskBlock queries x
// kMaskBlock keys of each mask plane (the (b, h) pairs its strides tell apart:
// a (Tq, Tk) mask broadcast over batch and heads is one plane): whether a block
// holds an open value, a closed one, and a value that adds something (open and
// not 0). Closed is what kernels/sdpa_mask.h says: -inf, or a value whose
// base-2 product overflows to -inf, such as transformers' float32 minimum. A
// tile whose blocks are all closed changes nothing (its weights are exactly 0:
// the running max, sum and output keep their bits; backward adds exact zeros),
// so forward and backward skip it: a padding, block-diagonal or causal mask
// costs only the tiles it leaves open. A tile whose blocks are all open with 0
// (below a causal pattern's diagonal, a padding mask's open keys) skips the
// mask (x + 0 = x). A tile that is not aligned to the blocks (at a window's
// edge) is judged by the blocks it touches: never skipped wrongly. The mask is
// read once a call, in vectors along its rows, instead of a scan of each (b,
// h, tile) in turn: 12 heads sharing a 64 MB mask (T = 4096) read it 12 times
// and more (forward and backward).
//
// For the forward, whose scores are key-major (lanes are queries), the same
// pass also writes the mask's pattern as bits in key-major order: bit i of a
// key's row says whether query i may see it. Where a tile's values are all 0
// or closed (a bool mask, a 0 / -inf one, transformers' padding masks) the
// forward closes its scores by these bits, a vector select per N scores,
// instead of reading a float per score across the mask's rows (a strided
// scalar add was ~60% of a T = 4096 forward under a random mask). The bits
// are 1/32 of the mask's plane, so 12 heads reading them stay in cache.
constexpr size_t kMaskBlock = 16;

// An 8 x 8 bit matrix (byte r = row r, bit c = column c) transposed: bit c of
// byte r moves to bit r of byte c (Hacker's Delight, transpose8).
inline uint64_t TransposeBits8x8(uint64_t x) {
  x = (x & 0xAA55AA55AA55AA55ull) | ((x & 0x00AA00AA00AA00AAull) << 7) |
      ((x >> 7) & 0x00AA00AA00AA00AAull);
  x = (x & 0xCCCC3333CCCC3333ull) | ((x & 0x0000CCCC0000CCCCull) << 14) |
      ((x >> 14) & 0x0000CCCC0000CCCCull);
  x = (x & 0xF0F0F0F00F0F0F0Full) | ((x & 0x00000000F0F0F0F0ull) << 28) |
      ((x >> 28) & 0x00000000F0F0F0F0ull);
  return x;
}

class MaskBlocks {
 public:
  MaskBlocks() = default;  // no mask: nothing hidden, nothing added
  // with_bits: also the key-major open bits (the forward's).
  template <class T>
  MaskBlocks(const SdpaProblemT<T>& p, bool with_bits);
  // Whether the mask is closed on every (i, j) of queries [i0, i0 + in) x keys
  // [j0, j0 + jn) of head (b, h); whether it is 0 there (or there is no mask);
  // whether every value there is 0 or closed (OpenBits then tell them apart).
  bool Hidden(int64_t b, int64_t h, size_t i0, size_t in, size_t j0, size_t jn) const {
    return masked_ && (Flags(b, h, i0, in, j0, jn) & kOpen) == 0;
  }
  bool AddsNothing(int64_t b, int64_t h, size_t i0, size_t in, size_t j0, size_t jn) const {
    return !masked_ || (Flags(b, h, i0, in, j0, jn) & (kClosed | kAdds)) == 0;
  }
  bool OnlyClosesKeys(int64_t b, int64_t h, size_t i0, size_t in, size_t j0, size_t jn) const {
    return !bits_.empty() && (Flags(b, h, i0, in, j0, jn) & kAdds) == 0;
  }
  // Key j's row of open bits in head (b, h)'s plane: bit i % 8 of byte i / 8
  // is whether query i sees key j (0 past Tq, up to a whole tile).
  const uint8_t* OpenBits(int64_t b, int64_t h, size_t j) const {
    return bits_.data() + (Plane(b, h) * nkeys_ + j) * row_bytes_;
  }

 private:
  static constexpr uint8_t kOpen = 1, kClosed = 2, kAdds = 4;
  size_t Plane(int64_t b, int64_t h) const {
    return size_t(per_b_ ? b : 0) * planes_h_ + size_t(per_h_ ? h : 0);
  }
  uint8_t Flags(int64_t b, int64_t h, size_t i0, size_t in, size_t j0, size_t jn) const {
    const uint8_t* f = flags_.data() + Plane(b, h) * nbi_ * nbj_;
    uint8_t flags = 0;
    for (size_t bi = i0 / kMaskBlock; bi <= (i0 + in - 1) / kMaskBlock; ++bi)
      for (size_t bj = j0 / kMaskBlock; bj <= (j0 + jn - 1) / kMaskBlock; ++bj)
        flags |= f[bi * nbj_ + bj];
    return flags;
  }
  // Classifies the blocks (and writes the bits) of an additive or boolean mask.
  template <class M>
  void Scan(const M* mask, const SdpaStrides& ms, size_t planes, size_t Tq, size_t Tk);
  bool masked_ = false, per_b_ = false, per_h_ = false;
  size_t planes_h_ = 1, nbi_ = 0, nbj_ = 0, nkeys_ = 0, row_bytes_ = 0;
  std::vector<uint8_t> flags_;  // (plane, block row, block column)
  std::vector<uint8_t> bits_;   // (plane, key, query byte)
};

// Which of the N mask values at x close their key (kernels/sdpa_mask.h for an
// additive mask, false for a boolean one); `adds`: whether one of them is open
// and not 0 (never, for a boolean mask).
HWY_INLINE hn::Mask<DF> ClosedLanes(const float* HWY_RESTRICT x, bool& adds) {
  const DF d;
  const VF v = hn::LoadU(d, x);
  const auto closes = hn::Eq(hn::Mul(hn::Set(d, kMaskLog2e), v), hn::Set(d, kNegInf));
  adds = !hn::AllTrue(d, hn::Or(closes, hn::Eq(v, hn::Zero(d))));
  return closes;
}
HWY_INLINE hn::Mask<DF> ClosedLanes(const uint8_t* HWY_RESTRICT x, bool& adds) {
  const DF d;
  const hn::RebindToUnsigned<DF> du;
  const hn::Rebind<uint8_t, DF> d8;
  adds = false;
  return hn::RebindMask(d, hn::Eq(hn::PromoteTo(du, hn::LoadU(d8, x)), hn::Zero(du)));
}
inline bool Closes(float x, bool& adds) {
  const bool closes = mask_value_closes(x);
  adds = !closes && x != 0.0f;
  return closes;
}
inline bool Closes(uint8_t x, bool& adds) {
  adds = false;
  return x == 0;
}

template <class T>
MaskBlocks::MaskBlocks(const SdpaProblemT<T>& p, bool with_bits)
    : masked_(p.mask != nullptr || p.bool_mask != nullptr) {
  if (!masked_) return;
  const SdpaStrides& ms = p.mask_strides;
  per_b_ = ms.b != 0, per_h_ = ms.h != 0;  // a broadcast axis has stride 0
  planes_h_ = per_h_ ? size_t(p.Hq) : 1;
  const size_t planes = (per_b_ ? size_t(p.B) : 1) * planes_h_;
  const size_t Tq = size_t(p.Tq), Tk = size_t(p.Tk);
  nbi_ = (Tq + kMaskBlock - 1) / kMaskBlock, nbj_ = (Tk + kMaskBlock - 1) / kMaskBlock;
  flags_.assign(planes * nbi_ * nbj_, 0);
  if (with_bits) {
    // A row covers the query tiles (Tq rounded up to Br) and 8 bytes more,
    // so a vector's bits are read whole at the last tile.
    nkeys_ = Tk, row_bytes_ = RoundUp(Tq, kBr) / 8 + 8;
    bits_.assign(planes * nkeys_ * row_bytes_, 0);
  }
  if (p.mask)
    Scan(p.mask, ms, planes, Tq, Tk);
  else
    Scan(p.bool_mask, ms, planes, Tq, Tk);
}

template <class M>
void MaskBlocks::Scan(const M* mask, const SdpaStrides& ms, size_t planes, size_t Tq, size_t Tk) {
  uint8_t* const bits = bits_.empty() ? nullptr : bits_.data();
  const int64_t block_rows = int64_t(planes * nbi_);
#ifdef _OPENMP
  const bool parallel = block_rows > 1 && !omp_in_parallel();
#endif
#pragma omp parallel for schedule(static) if (parallel)
  for (int64_t r = 0; r < block_rows; ++r) {
    const size_t plane = size_t(r) / nbi_, bi = size_t(r) % nbi_;
    const int64_t b = int64_t(plane / planes_h_), h = int64_t(plane % planes_h_);
    uint8_t* f = flags_.data() + size_t(r) * nbj_;
    const DF d;
    // The block's rows a byte of queries at a time: i8 .. i8 + rows.
    for (size_t i8 = bi * kMaskBlock; i8 < std::min(Tq, (bi + 1) * kMaskBlock); i8 += 8) {
      const size_t rows = std::min<size_t>(8, Tq - i8);
      const M* mrow[8];
      for (size_t rr = 0; rr < rows; ++rr)
        mrow[rr] = mask + b * ms.b + h * ms.h + int64_t(i8 + rr) * ms.t;
      // This byte of queries in key j's row of bits: byte_of_key[j · row_bytes_].
      uint8_t* byte_of_key = bits ? bits + plane * nkeys_ * row_bytes_ + i8 / 8 : nullptr;
      for (size_t bj = 0; bj < nbj_; ++bj) {
        const size_t j1 = std::min(Tk, (bj + 1) * kMaskBlock);
        uint8_t flags = 0;
        size_t j = bj * kMaskBlock;
        if (ms.d == 1) {
          for (; j + kN <= j1; j += kN) {
            uint64_t open_bits[8] = {};  // row rr: bit c = key j + c open
            for (size_t rr = 0; rr < rows; ++rr) {
              bool adds;
              const auto closes = ClosedLanes(mrow[rr] + j, adds);
              if (!hn::AllTrue(d, closes)) flags |= kOpen;
              if (!hn::AllFalse(d, closes)) flags |= kClosed;
              if (adds) flags |= kAdds;
              if (byte_of_key) {
                uint8_t lanes[8] = {};
                hn::StoreMaskBits(d, hn::Not(closes), lanes);
                std::memcpy(&open_bits[rr], lanes, sizeof(uint64_t));
              }
            }
            if (!byte_of_key) continue;
            // 8 keys at a time: the rows' bytes for them, transposed into a
            // byte of query bits per key.
            for (size_t c = 0; c < kN; c += 8) {
              uint64_t m = 0;
              for (size_t rr = 0; rr < rows; ++rr) m |= ((open_bits[rr] >> c) & 0xFF) << (8 * rr);
              m = TransposeBits8x8(m);
              for (size_t cc = 0; cc < std::min<size_t>(8, kN - c); ++cc)
                byte_of_key[(j + c + cc) * row_bytes_] = uint8_t(m >> (8 * cc));
            }
          }
        }
        for (; j < j1; ++j) {
          uint8_t byte = 0;
          for (size_t rr = 0; rr < rows; ++rr) {
            bool adds;
            if (Closes(mrow[rr][int64_t(j) * ms.d], adds)) {
              flags |= kClosed;
            } else {
              flags |= kOpen;
              byte |= uint8_t(1u << rr);
            }
            if (adds) flags |= kAdds;
          }
          if (byte_of_key) byte_of_key[j * row_bytes_] = byte;
        }
        f[bj] |= flags;
      }
    }
  }
}

// ---- forward ------------------------------------------------------------------------------

int MaxThreads() {
#ifdef _OPENMP
  return omp_get_max_threads();
#else
  return 1;
#endif
}

// A key/value head's K (Tk, D) and V (Tk, Dvp) rows, copied (widened, padded)
// into one contiguous block per thread; on DotEngine its K rows as words (Tk,
// Pairs(D)) and V's key pairs (Pairs(Tk), Dvp).
template <class E>
struct HeadRows {
  const typename E::Op* k;
  const typename E::Op* v;
};

// A buffer of n floats for a whole head's rows, on huge pages where Linux
// grants them (madvise): a head of a token-major tensor spans every page of
// it, and with 4 KB pages the walks cost ~10% of the forward at T = 4096.
// Each thread keeps its last buffer (up to kHeadKeptBytes) for its next call:
// fresh memory costs a fault and a 2 MB clear per call and thread (~2% of the
// fp32 forward at T = 1024, B = 1, 12 heads; OpenMP's threads persist).
constexpr size_t kHeadKeptBytes = size_t{16} << 20;
struct KeptHeadBlock {
  float* data = nullptr;
  size_t bytes = 0;
  ~KeptHeadBlock() { std::free(data); }
};
inline KeptHeadBlock& KeptHead() {
  static thread_local KeptHeadBlock kept;
  return kept;
}
struct HeadBuffer {
  float* data = nullptr;
  size_t bytes = 0;
  HeadBuffer() = default;
  HeadBuffer(const HeadBuffer&) = delete;
  HeadBuffer& operator=(const HeadBuffer&) = delete;
  explicit HeadBuffer(size_t n) {
    if (n == 0) return;
    constexpr size_t kHuge = size_t{2} << 20;
    const size_t want = std::max(kHuge, (n * sizeof(float) + kHuge - 1) / kHuge * kHuge);
    KeptHeadBlock& kept = KeptHead();
    if (kept.data && kept.bytes >= want) {
      data = std::exchange(kept.data, nullptr), bytes = std::exchange(kept.bytes, 0);
      return;
    }
    bytes = want;
    // nullptr when refused: the caller then reads the head in place (no
    // exception may leave an OpenMP region).
    data = static_cast<float*>(std::aligned_alloc(kHuge, bytes));
#ifdef MADV_HUGEPAGE
    if (data) madvise(data, bytes, MADV_HUGEPAGE);
#endif
  }
  ~HeadBuffer() {
    KeptHeadBlock& kept = KeptHead();
    if (data && bytes <= kHeadKeptBytes && bytes > kept.bytes) {
      std::free(kept.data);
      kept.data = std::exchange(data, nullptr), kept.bytes = bytes;
    }
    std::free(data);
  }
};

// Copies key/value head (b, hk)'s rows into buf (Tk·(D + Dvp) floats).
template <class E, class T>
HeadRows<E> PackHead(float* HWY_RESTRICT buf, const SdpaProblemT<T>& p, int64_t b, int64_t hk) {
  const size_t Tk = size_t(p.Tk), D = size_t(p.D), Dv = size_t(p.Dv), Dvp = RoundUp(Dv, kN);
  const T* k_head = At(p.k, p.k_strides, b, hk);
  const T* v_head = At(p.v, p.v_strides, b, hk);
  if constexpr (E::kDot) {
    auto* k = reinterpret_cast<uint32_t*>(buf);
    uint32_t* v = k + Tk * bf16dot::Pairs(D);
    bf16dot::pack_rows(k, Bits(k_head), size_t(p.k_strides.t), Tk, Tk, D);
    bf16dot::pack_row_pairs(v, Bits(v_head), size_t(p.v_strides.t), Tk, Tk, Dv, Dvp);
    return {k, v};
  } else {
    float* k = buf;
    float* v = buf + Tk * D;
    for (size_t t = 0; t < Tk; ++t) {
      if (t + kRowsAhead < Tk) {
        PrefetchRows(k_head, size_t(p.k_strides.t), t + kRowsAhead, t + kRowsAhead + 1, D);
        PrefetchRows(v_head, size_t(p.v_strides.t), t + kRowsAhead, t + kRowsAhead + 1, Dv);
      }
      WidenRow(k + t * D, k_head + int64_t(t) * p.k_strides.t, D, D);
      WidenRow(v + t * Dvp, v_head + int64_t(t) * p.v_strides.t, Dv, Dvp);
    }
    return {k, v};
  }
}

// Key/value head (b, hk)'s rows in place when they already are PackHead's
// layout: fp32, K rows D apart and V rows Dv apart, Dv a whole number of
// vectors (PyTorch's head-major (B, H, T, D) tensors): the copy would hold the
// same values in the same places, so the bits do not change. {nullptr,
// nullptr} otherwise (bf16, token-major heads, padded V rows: PackHead).
template <class E, class T>
HeadRows<E> HeadInPlace(const SdpaProblemT<T>& p, int64_t b, int64_t hk) {
  if constexpr (std::is_same_v<T, float>) {
    const int64_t D = p.D, Dv = p.Dv;
    if (Dv % int64_t(kN) == 0 && p.v_strides.d == 1 && p.v_strides.t == Dv &&
        (D == 1 || p.k_strides.d == 1) && p.k_strides.t == D)
      return {At(p.k, p.k_strides, b, hk), At(p.v, p.v_strides, b, hk)};
  }
  return {nullptr, nullptr};
}

// E's operands, as E::Op: fp32 values (FmaEngine) or words (DotEngine) in the
// same buffers, sized for the larger (a word is as wide as a float).
template <class E>
typename E::Op* Ops(const hwy::AlignedFreeUniquePtr<float[]>& buf) {
  return reinterpret_cast<typename E::Op*>(buf.get());
}

struct ForwardScratch {
  // Fma: (G, D, Br) c·Qᵀ of each query tile; Dot: (G, Pairs(D), Br) Qᵀ's dim pairs × queries
  hwy::AlignedFreeUniquePtr<float[]> qT;
  hwy::AlignedFreeUniquePtr<float[]> sT;  // (Bc, Br)  scores, then weights, key-major
  hwy::AlignedFreeUniquePtr<float[]> o;   // (G, Br, Dvp)  unnormalised outputs
  // Fma: (Bc, Dvp) V tile copied, padded, widened; Dot: (Bc/2, Dvp) its key pairs
  hwy::AlignedFreeUniquePtr<float[]> v_pad;
  // Fma: (Bc, D) K tile copied or widened; Dot: (Bc, Pairs(D)) its rows as words
  hwy::AlignedFreeUniquePtr<float[]> k_wide;
  hwy::AlignedFreeUniquePtr<float[]> p_words;      // Dot: (Bc/2, Br) the weights' key pairs
  hwy::AlignedFreeUniquePtr<float[]> m, l, alpha;  // (G, Br) running max, sum, rescale
  ForwardScratch(size_t D, size_t Dvp)
      : qT(hwy::AllocateAligned<float>(kGroupFwd * D * kBr)),
        sT(hwy::AllocateAligned<float>(kBcFwd * kBr)),
        o(hwy::AllocateAligned<float>(kGroupFwd * kBr * Dvp)),
        v_pad(hwy::AllocateAligned<float>(kBcFwd * Dvp)),
        k_wide(hwy::AllocateAligned<float>(kBcFwd * D)),
        p_words(hwy::AllocateAligned<float>(kBcFwd / 2 * kBr)),
        m(hwy::AllocateAligned<float>(kGroupFwd * kBr)),
        l(hwy::AllocateAligned<float>(kGroupFwd * kBr)),
        alpha(hwy::AllocateAligned<float>(kGroupFwd * kBr)) {}
};

// Softcap, ALiBi and the mask on a key-major tile of base-2 scores sT (jn, Br)
// of queries i0.. (lanes) against keys j0.. (rows); `in` queries are real.
template <class T>
void ScoreMods(const SdpaProblemT<T>& p, const MaskBlocks& mask_blocks, int64_t b, int64_t h,
               size_t i0, size_t in, size_t j0, size_t jn, float* HWY_RESTRICT sT) {
  const DF d;
  if (p.softcap > 0.0f) {
    const VF cap = hn::Set(d, p.softcap * kLog2e);
    for (size_t at = 0; at < jn * kBr; at += kN)
      hn::Store(hn::Mul(cap, TanhScore(d, hn::Load(d, sT + at))), d, sT + at);
  }
  if (p.alibi_slopes) {  // - slope · |i + δ - j|
    const VF slope = hn::Set(d, -p.alibi_slopes[b * p.alibi_b_stride + h] * kLog2e);
    const int64_t delta = Delta(p);
    for (size_t jj = 0; jj < jn; ++jj)
      for (size_t v0 = 0; v0 < kBr; v0 += kN) {
        const VF dist = hn::Abs(hn::Iota(d, float(int64_t(i0 + v0) + delta - int64_t(j0 + jj))));
        float* sp = sT + jj * kBr + v0;
        hn::Store(hn::MulAdd(slope, dist, hn::Load(d, sp)), d, sp);
      }
  }
  if (mask_blocks.AddsNothing(b, h, i0, in, j0, jn)) return;
  if (mask_blocks.OnlyClosesKeys(b, h, i0, in, j0, jn)) {  // scores of closed keys -> -inf
    const VF closed = hn::Set(d, kNegInf);
    for (size_t jj = 0; jj < jn; ++jj) {
      const uint8_t* open = mask_blocks.OpenBits(b, h, j0 + jj);
      for (size_t v0 = 0; v0 < kBr; v0 += kN) {
        const size_t i = i0 + v0;
        float* sp = sT + jj * kBr + v0;
        if constexpr (kN % 8 == 0) {
          hn::Store(hn::IfThenElse(hn::LoadMaskBits(d, open + i / 8), hn::Load(d, sp), closed), d,
                    sp);
        } else {  // fewer than 8 lanes: this vector's bits moved to the byte's bottom
          const uint8_t lanes[8] = {uint8_t(open[i / 8] >> (i % 8))};
          hn::Store(hn::IfThenElse(hn::LoadMaskBits(d, lanes), hn::Load(d, sp), closed), d, sp);
        }
      }
    }
    return;
  }
  // Values to add: each row of Sᵀ gathers its keys' values down the mask's
  // query axis (lanes past the tile's `in` queries repeat the last one).
  const SdpaStrides& ms = p.mask_strides;
  const float* m0 = p.mask + b * ms.b + h * ms.h + int64_t(i0) * ms.t + int64_t(j0) * ms.d;
  if (std::abs(ms.t) <= int64_t(std::numeric_limits<int32_t>::max() / int64_t(kBr))) {
    const hn::RebindToSigned<DF> di;
    const VF l2e = hn::Set(d, kLog2e);
    for (size_t v0 = 0; v0 < in; v0 += kN) {
      const auto lane = hn::Min(hn::Iota(di, 0), hn::Set(di, int32_t(in - 1 - v0)));
      const auto offset = hn::Mul(lane, hn::Set(di, int32_t(ms.t)));
      for (size_t jj = 0; jj < jn; ++jj) {
        const float* base = m0 + int64_t(v0) * ms.t + int64_t(jj) * ms.d;
        float* sp = sT + jj * kBr + v0;
        hn::Store(hn::MulAdd(l2e, hn::GatherIndex(d, base, offset), hn::Load(d, sp)), d, sp);
      }
    }
    return;
  }
  for (size_t ii = 0; ii < in; ++ii)
    for (size_t jj = 0; jj < jn; ++jj)
      sT[jj * kBr + ii] += kLog2e * m0[int64_t(ii) * ms.t + int64_t(jj) * ms.d];
}

// One query tile [i0, i0 + in) against keys [j0, j0 + jn): scores, online
// softmax, O update. qT, o, m, l, alpha are the tile's own state; k_tile,
// v_tile and qT in E's layouts (k_tile rows, v_tile rows or key pairs, qT
// dims or dim pairs, their strides in E::Op); p_words DotEngine's weights.
template <class E, class T>
void ForwardStep(const SdpaProblemT<T>& p, const Band& band, const MaskBlocks& mask_blocks,
                 int64_t b, int64_t h, size_t i0, size_t in, size_t j0, size_t jn,
                 const typename E::Op* k_tile, size_t k_tile_stride, const typename E::Op* v_tile,
                 size_t v_tile_stride, const typename E::Op* HWY_RESTRICT qT,
                 float* HWY_RESTRICT sT, uint32_t* HWY_RESTRICT p_words, float* HWY_RESTRICT o,
                 float* HWY_RESTRICT m, float* HWY_RESTRICT l, float* HWY_RESTRICT alpha,
                 PrefetchTrickle<T>& prefetch, PrefetchTrickle<T>& ahead) {
  const DF d;
  const size_t D = size_t(p.D), Dvp = RoundUp(size_t(p.Dv), kN);
  const DropoutRule rule(p.dropout_p);
  const int64_t I0 = int64_t(i0), J0 = int64_t(j0);
  const bool edge = !band.covers(I0, I0 + int64_t(kBr), J0, J0 + int64_t(jn));
  // Sᵀ (jn, Br) = K_tile · qT; at the band's edge a block of keys skips the
  // query vectors wholly outside it.
  Product<E, kOverwrite>(
      jn, kBr, k_tile, k_tile_stride, 1, qT, kBr, sT, kBr, nullptr,
      [&](size_t r0, size_t nr) {
        if (!edge) return Span{0, D, 0, kNV};
        const int64_t first = band.first_query(J0 + int64_t(r0)) - I0;
        const int64_t last = band.last_query(J0 + int64_t(r0 + nr) - 1) - I0;
        const size_t v0 = first > 0 ? Clamp(first / int64_t(kN), kNV) : 0;
        const size_t v1 = last < 0 ? 0 : Clamp(last / int64_t(kN) + 1, kNV);
        return Span{0, D, v0, v1};
      },
      [&] {
        prefetch();
        ahead();
      });
  if constexpr (E::kDot)
    ScaleRows(sT, jn * kBr, p.softcap > 0.0f ? p.scale / p.softcap : p.scale * kLog2e);
  ScoreMods(p, mask_blocks, b, h, i0, in, j0, jn, sT);
  if (edge) {
    for (size_t jj = 0; jj < jn; ++jj) {
      const int64_t first = band.first_query(J0 + int64_t(jj)) - I0;
      const int64_t last = band.last_query(J0 + int64_t(jj)) - I0;
      for (size_t v0 = 0; v0 < kBr; v0 += kN) {
        float* sp = sT + jj * kBr + v0;
        hn::Store(BandMask(d, hn::Load(d, sp), v0, first, last), d, sp);
      }
    }
  }
  // Online softmax down the key axis, N queries per vector. A lane whose
  // scores so far are all -inf keeps m = -inf and l = 0 (exp2 is taken
  // against 0 instead, so no -inf - -inf).
  SoftmaxTileT(d, jn, sT, m, l, alpha);
  if (rule.active()) {  // P ⊙ Z after the sums: l stays the softmax denominator
    DropoutTileT<kBr>(rule, p.dropout_seed, b, h, i0, j0, jn, sT);
  }
  // O (in, Dvp) = α ⊙ O + P (in, jn) · V_tile (jn, Dvp), P read from Sᵀ
  // (DotEngine: rounded to bf16, key pairs interleaved); at the band's edge a
  // block of queries sums only over the keys its band reaches.
  const typename E::Op* weights = nullptr;
  if constexpr (E::kDot) {
    bf16dot::round_row_pairs(p_words, sT, kBr, jn, jn, kBr);
    weights = p_words;
  } else {
    weights = sT;
  }
  Product<E, kScaleAccumulate>(
      in, Dvp, weights, 1, kBr, v_tile, v_tile_stride, o, Dvp, alpha,
      [&](size_t r0, size_t nr) {
        if (!edge) return Span{0, jn, 0, kNV};
        const int64_t first = band.first_key(I0 + int64_t(r0)) - J0;
        const int64_t last = band.last_key(I0 + int64_t(r0 + nr) - 1) - J0;
        const size_t k0 = Clamp(first, jn), k1 = Clamp(last + 1, jn);
        return Span{k0, std::max(k0, k1), 0, kNV};
      },
      [&] {
        prefetch();
        ahead();
      });
}

// Query tiles i_first, i_first + Br, ... (ng of them) of head (b, h).
// `head`, when given, is the key/value head's rows already copied (HeadRows).
// q_next, when given, is the first of the q_next_n query rows (q's token
// stride apart) that the thread packs next: they are brought towards L2 while
// this group computes, with the group's output rows.
template <class E, class T>
void ForwardGroup(const SdpaOutputT<T>& out, const SdpaProblemT<T>& p, const Band& band,
                  const MaskBlocks& mask_blocks, int64_t b, int64_t h, size_t i_first, size_t ng,
                  ForwardScratch& s, const HeadRows<E>* head = nullptr, const T* q_next = nullptr,
                  size_t q_next_n = 0) {
  const size_t Tq = size_t(p.Tq), Tk = size_t(p.Tk), D = size_t(p.D), Dv = size_t(p.Dv);
  const size_t Dvp = RoundUp(Dv, kN);
  const float c = p.softcap > 0.0f ? p.scale / p.softcap : p.scale * kLog2e;
  const int64_t hk = h / (p.Hq / p.Hkv);
  auto tile_i0 = [&](size_t g) { return i_first + g * kBr; };
  auto tile_in = [&](size_t g) { return std::min(kBr, Tq - tile_i0(g)); };
  const T* q_head = At(p.q, p.q_strides, b, h);
  const size_t qs = size_t(p.q_strides.t);
  const size_t group_rows = std::min(ng * kBr, Tq - i_first);
  // Each query row asked for a few rows before it is read (rows a few KB
  // apart defeat the hardware prefetchers; a burst of them all stalls on the
  // L1 miss buffers).
  constexpr size_t kAhead = kRowsAhead;
  PrefetchRows(q_head, qs, i_first, i_first + std::min(kAhead, group_rows), D);
  const size_t Dr = E::Reduction(D);  // qT's rows, k_tile's row length
  for (size_t g = 0; g < ng; ++g) {
    if constexpr (E::kDot) {  // qT (Pairs(D), Br): Q_tileᵀ's dim pairs, zero past Tq
      bf16dot::pack_rows_t(Ops<E>(s.qT) + g * Dr * kBr, Bits(q_head + tile_i0(g) * qs), qs,
                           tile_in(g), kBr, D);
      continue;
    }
    // qT (D, Br) = c · Q_tileᵀ, zero columns past Tq.
    float* HWY_RESTRICT qT = s.qT.get() + g * D * kBr;
    const size_t i0 = tile_i0(g), in = tile_in(g);
#ifdef ATTN_HAVE_TRANSPOSE_N
    // A whole tile: blocks of N rows x N dims transposed in registers (the
    // scalar loop below stores one float at a time: ~2% of the forward at T =
    // 1024, AVX-512).
    if (in == kBr && D % kN == 0) {
      for (size_t i = 0; i < kBr; i += kN) {
        for (size_t r = i; r < i + kN; ++r) {
          const size_t ahead_row = g * kBr + r + kAhead;
          if (ahead_row < group_rows)
            PrefetchRows(q_head, qs, i_first + ahead_row, i_first + ahead_row + 1, D);
        }
        for (size_t dd = 0; dd < D; dd += kN)
          ScaledTransposeN(q_head + (i0 + i) * qs + dd, qs, qT + dd * kBr + i, kBr, c);
      }
      continue;
    }
#endif
    for (size_t i = 0; i < kBr; ++i) {
      const size_t ahead_row = g * kBr + i + kAhead;
      if (i < in && ahead_row < group_rows)
        PrefetchRows(q_head, qs, i_first + ahead_row, i_first + ahead_row + 1, D);
      const T* qi = i < in ? q_head + (i0 + i) * qs : nullptr;
      for (size_t dd = 0; dd < D; ++dd) qT[dd * kBr + i] = qi ? c * Widen(qi[dd]) : 0.0f;
    }
  }
  std::fill(s.m.get(), s.m.get() + ng * kBr, kNegInf);
  std::fill(s.l.get(), s.l.get() + ng * kBr, 0.0f);
  std::fill(s.o.get(), s.o.get() + ng * kBr * Dvp, 0.0f);

  // The keys tile g's band reaches: [key_begin(g), key_end(g)).
  auto key_begin = [&](size_t g) { return Clamp(band.first_key(int64_t(tile_i0(g))), Tk); };
  auto key_end = [&](size_t g) {
    return Clamp(band.last_key(int64_t(tile_i0(g) + tile_in(g)) - 1) + 1, Tk);
  };
  const size_t group_begin = key_begin(0) / 4 * 4, group_end = key_end(ng - 1);
  const T* k_head = At(p.k, p.k_strides, b, hk);
  const T* v_head = At(p.v, p.v_strides, b, hk);
  const size_t ks = size_t(p.k_strides.t), vs = size_t(p.v_strides.t);
  // This group's output rows and the next group's query rows, a row or so
  // after each micro-kernel call of the group (2·ceil(Br/6) calls a step):
  // else the final stores and the next packing wait on memory.
  size_t group_steps = 0;
  for (size_t j0 = group_begin; j0 < group_end; j0 += kBcFwd)
    for (size_t g = 0; g < ng; ++g) group_steps += j0 < key_end(g) && j0 + kBcFwd > key_begin(g);
  T* out_rows = At(out.out, out.out_strides, b, h, int64_t(i_first));
  PrefetchTrickle<T> ahead{out_rows,
                           q_next,
                           size_t(out.out_strides.t),
                           qs,
                           Dv,
                           D,
                           0,
                           q_next ? std::min(group_rows, q_next_n) : group_rows,
                           1};
  ahead.per_call = (ahead.end + 2 * group_steps * ((kBr + kMR - 1) / kMR) - 1) /
                   std::max<size_t>(1, 2 * group_steps * ((kBr + kMR - 1) / kMR));
  for (size_t j0 = group_begin; j0 < group_end; j0 += kBcFwd) {
    // The next tile's K and V rows, a row or so after each micro-kernel call
    // of this tile's steps (ng steps of about 2·ceil(Br/6) calls each).
    const size_t next_end = head ? j0 : std::min(group_end, j0 + 2 * kBcFwd);
    size_t steps = 0;
    for (size_t g = 0; g < ng; ++g) steps += j0 < key_end(g) && j0 + kBcFwd > key_begin(g);
    PrefetchTrickle<T> prefetch{k_head,   v_head, ks, vs, D, Dv, std::min(j0 + kBcFwd, next_end),
                                next_end, 1};
    const size_t calls = std::max<size_t>(1, steps * 2 * ((kBr + kMR - 1) / kMR));
    prefetch.per_call = (prefetch.end - prefetch.next + calls - 1) / calls;
    // K rows as they are (fp32) or widened (bf16); V's B rows must hold whole
    // vectors: as they are, or a zero-padded (and widened) copy.
    // Copied (or read from the thread's copy of the head) unless the head is
    // head-major (ForwardTileRows): rows of a token-major head lie a multiple
    // of 1 KB apart, so a tile read in place falls into a few of L1's sets and
    // is evicted while the products read it.
    // DotEngine: K's rows as words, V's key pairs (j0 is even).
    const size_t tile_jn = std::min(kBcFwd, group_end - j0);
    using Op = typename E::Op;
    std::pair<const Op*, size_t> k_tile, v_tile;
    if (head) {
      k_tile = {head->k + j0 * Dr, Dr};
      v_tile = {head->v + (E::kDot ? j0 / 2 : j0) * Dvp, Dvp};
    } else if constexpr (E::kDot) {
      bf16dot::pack_rows(Ops<E>(s.k_wide), Bits(k_head + j0 * ks), ks, tile_jn, tile_jn, D);
      bf16dot::pack_row_pairs(Ops<E>(s.v_pad), Bits(v_head + j0 * vs), vs, tile_jn, tile_jn, Dv,
                              Dvp);
      k_tile = {Ops<E>(s.k_wide), Dr};
      v_tile = {Ops<E>(s.v_pad), Dvp};
    } else {
      k_tile = ForwardTileRows(s.k_wide.get(), k_head, ks, j0, tile_jn, D, D);
      v_tile = ForwardTileRows(s.v_pad.get(), v_head, vs, j0, tile_jn, Dv, Dvp);
    }
    for (size_t g = 0; g < ng; ++g) {
      if (j0 >= key_end(g) || j0 + kBcFwd <= key_begin(g)) continue;
      const size_t jn = std::min(kBcFwd, key_end(g) - j0);
      if (mask_blocks.Hidden(b, h, tile_i0(g), tile_in(g), j0, jn)) continue;
      ForwardStep<E>(p, band, mask_blocks, b, h, tile_i0(g), tile_in(g), j0, jn, k_tile.first,
                     k_tile.second, v_tile.first, v_tile.second, Ops<E>(s.qT) + g * Dr * kBr,
                     s.sT.get(), Ops<DotEngine>(s.p_words), s.o.get() + g * kBr * Dvp,
                     s.m.get() + g * kBr, s.l.get() + g * kBr, s.alpha.get() + g * kBr, prefetch,
                     ahead);
    }
    prefetch.rest();
  }
  ahead.rest();
  // O /= l; lse = ln(2^m · l) = (m + log2 l) · ln 2; l = 0 (no key): O = 0, lse = -inf.
  const SdpaStrides ls = sdpa_lse_strides(out.lse_strides, p);
  T* o_head = out.out + b * out.out_strides.b + h * out.out_strides.h;
  auto prefetch_out_row = [&](size_t t) {  // with intent to write
    T* row = o_head + int64_t(t) * out.out_strides.t;
    for (size_t dd = 0; dd < Dv; dd += 64 / sizeof(T)) __builtin_prefetch(row + dd, 1, 3);
  };
  // The rows trickled in during the products are gone after a long head's K,
  // V streamed through L2: each row asked for again kRowsAhead before it is written.
  for (size_t t = i_first; t < i_first + std::min(kRowsAhead, group_rows); ++t)
    prefetch_out_row(t);
  for (size_t g = 0; g < ng; ++g) {
    const float* o = s.o.get() + g * kBr * Dvp;
    const float* m = s.m.get() + g * kBr;
    const float* l = s.l.get() + g * kBr;
    for (size_t i = 0; i < tile_in(g); ++i) {
      const size_t t = tile_i0(g) + i;
      const float inv_l = l[i] > 0.0f ? 1.0f / l[i] : 0.0f;
      if (t + kRowsAhead < i_first + group_rows) prefetch_out_row(t + kRowsAhead);
      T* oi = o_head + int64_t(t) * out.out_strides.t;
      for (size_t dd = 0; dd < Dv; ++dd) oi[dd] = Narrow<T>(o[i * Dvp + dd] * inv_l);
      out.lse[b * ls.b + h * ls.h + int64_t(t) * ls.t] =
          l[i] > 0.0f ? (m[i] + std::log2(l[i])) * kLn2 : kNegInf;
    }
  }
}

// A varlen problem: (sequence, query group) x head work items in one loop,
// each sequence through its view (sdpa_sequence) run as batch b; the groups
// furthest down their sequences first (the heaviest under a causal band), as below.
template <class E, class T>
void VarlenForward(const SdpaOutputT<T>& out, const SdpaProblemT<T>& p) {
  const size_t D = size_t(p.D), Dvp = RoundUp(size_t(p.Dv), kN);
  const int64_t group_rows = int64_t(kBr * kGroupFwd);
  std::vector<int64_t> n_groups(size_t(p.B));
  int64_t most = 0;
  for (int64_t b = 0; b < p.B; ++b) {
    const int64_t Tq = p.cu_seqlens_q[b + 1] - p.cu_seqlens_q[b];
    n_groups[size_t(b)] = (Tq + group_rows - 1) / group_rows;
    most = std::max(most, n_groups[size_t(b)]);
  }
  std::vector<std::pair<int64_t, int64_t>> items;  // (sequence, query group)
  for (int64_t group = most - 1; group >= 0; --group)
    for (int64_t b = 0; b < p.B; ++b)
      if (group < n_groups[size_t(b)]) items.emplace_back(b, group);
  const int64_t n_items = int64_t(items.size()) * p.Hq;
#pragma omp parallel
  {
    ForwardScratch scratch(D, Dvp);
#pragma omp for schedule(dynamic, 1)
    for (int64_t item = 0; item < n_items; ++item) {
      const auto [b, group] = items[size_t(item / p.Hq)];
      const int64_t h = item % p.Hq;
      const SdpaProblemT<T> ps = sdpa_sequence(p, b);
      const int64_t n_qt = (ps.Tq + int64_t(kBr) - 1) / int64_t(kBr);
      const int64_t first = group * int64_t(kGroupFwd);
      const size_t ng = size_t(std::min(int64_t(kGroupFwd), n_qt - first));
      ForwardGroup<E>(sdpa_sequence(out, p, b), ps, MakeBand(ps), MaskBlocks(), b, h,
                      size_t(first) * kBr, ng, scratch);
    }
  }
}

template <class E, class T>
void ForwardOn(const SdpaOutputT<T>& out, const SdpaProblemT<T>& p) {
  if (p.cu_seqlens_q) {
    VarlenForward<E>(out, p);
    return;
  }
  const Band band = MakeBand(p);
  const MaskBlocks mask_blocks(p, /*with_bits=*/true);
  const size_t D = size_t(p.D), Dvp = RoundUp(size_t(p.Dv), kN);
  const int64_t n_qt = (p.Tq + int64_t(kBr) - 1) / int64_t(kBr);
  const int64_t n_groups = (n_qt + int64_t(kGroupFwd) - 1) / int64_t(kGroupFwd);
  const int64_t BH = p.B * p.Hq;
  const int64_t n_items = BH * n_groups;
  // With enough heads to share out evenly, a thread takes whole heads: it
  // copies the key/value head's rows once into a contiguous buffer (on huge
  // pages) and runs every query group of the head from it. Else (few heads)
  // (query group, head) items, each K and V tile copied as it is read.
  const int64_t threads = MaxThreads();
  const size_t head_floats = size_t(p.Tk) * (D + Dvp);
  const bool by_head = n_groups > 1 && head_floats <= kHeadRowsMax &&
                       (BH >= 4 * threads || (BH >= threads && BH % threads == 0));
  if (by_head) {
    // Heads already in PackHead's layout are read in place: no buffer to fault in, no copy.
    const bool in_place = HeadInPlace<E>(p, 0, 0).k != nullptr;
#pragma omp parallel
    {
      ForwardScratch scratch(D, Dvp);
      HeadBuffer buf(in_place ? 0 : head_floats);
#pragma omp for schedule(dynamic, 1)
      for (int64_t bh = 0; bh < BH; ++bh) {
        const int64_t b = bh / p.Hq, h = bh % p.Hq;
        HeadRows<E> head = HeadInPlace<E>(p, b, h / (p.Hq / p.Hkv));
        if (!head.k && buf.data) head = PackHead<E>(buf.data, p, b, h / (p.Hq / p.Hkv));
        for (int64_t group = n_groups - 1; group >= 0; --group) {
          const int64_t first = group * int64_t(kGroupFwd);
          const size_t ng = size_t(std::min(int64_t(kGroupFwd), n_qt - first));
          // The group this thread packs next: the one before, in this head.
          const size_t next_first = group > 0 ? size_t(first - int64_t(kGroupFwd)) * kBr : 0;
          const T* q_next = group > 0 ? At(p.q, p.q_strides, b, h, int64_t(next_first)) : nullptr;
          ForwardGroup<E>(out, p, band, mask_blocks, b, h, size_t(first) * kBr, ng, scratch,
                          head.k ? &head : nullptr, q_next,
                          std::min(kGroupFwd * kBr, size_t(p.Tq) - next_first));
        }
      }
    }
    return;
  }
#pragma omp parallel
  {
    ForwardScratch scratch(D, Dvp);
    // Last query groups first (the heaviest under a causal band), then dynamic scheduling.
#pragma omp for schedule(dynamic, 1)
    for (int64_t item = 0; item < n_items; ++item) {
      const int64_t group = n_groups - 1 - item / BH;
      const int64_t bh = item % BH;
      const int64_t first = group * int64_t(kGroupFwd);
      const size_t ng = size_t(std::min(int64_t(kGroupFwd), n_qt - first));
      ForwardGroup<E>(out, p, band, mask_blocks, bh / p.Hq, bh % p.Hq, size_t(first) * kBr, ng,
                      scratch);
    }
  }
}

}  // namespace

template <class T>
void SdpaForwardImpl(const SdpaOutputT<T>& out, const SdpaProblemT<T>& p) {
  if constexpr (std::is_same_v<T, BFloat16> && kDotTarget) {
    if (DotEngineChosen<T>()) return ForwardOn<DotEngine>(out, p);
  }
  ForwardOn<FmaEngine>(out, p);
}

namespace {

// ---- backward -----------------------------------------------------------------------------

struct BackwardScratch {
  // (G, D, Bc), (G, Dv, Bc)  c·K_tileᵀ, V_tileᵀ; DotEngine: their dim pairs × keys
  hwy::AlignedFreeUniquePtr<float[]> kT, vT;
  hwy::AlignedFreeUniquePtr<float[]> S, dP, Pz;  // (BrBwd, Bc)
  hwy::AlignedFreeUniquePtr<float[]> cap;        // (BrBwd, Bc) 1 - tanh², with a softcap
  hwy::AlignedFreeUniquePtr<float[]> dK, dV;     // (G, Bc, Dp), (G, Bc, Dvp)
  hwy::AlignedFreeUniquePtr<float[]> dKh, dVh;   // the same: one query head's terms (GQA)
  hwy::AlignedFreeUniquePtr<float[]> z;          // (Bc) one row of dropout noise
  // bf16 only: the rows of a pair's Q, dO (BrBwd, Dp), (BrBwd, Dvp) and K (G, Bc, Dp) tiles,
  // widened (K: a slot per tile of a key group), and what each holds. DotEngine:
  // Q's and dO's rows as words, K's key pairs (G, Bc/2, Dp).
  hwy::AlignedFreeUniquePtr<float[]> q_wide, do_wide, k_wide;
  WideTag q_tag, do_tag, k_tag[kGroup];
  // DotEngine: Q's and dO's query pairs (BrBwd/2, Dp), (BrBwd/2, Dvp); P ⊙ Z and
  // dS rounded to bf16, query pairs × keys (BrBwd/2, Bc), and dS's rows as words (BrBwd, Bc/2)
  hwy::AlignedFreeUniquePtr<float[]> q_pairs, do_pairs, pz_words, ds_words, ds_rows;
  BackwardScratch(size_t D, size_t Dv, size_t Dp, size_t Dvp, bool widen, bool dot = false)
      : kT(hwy::AllocateAligned<float>(kGroup * D * kBc)),
        vT(hwy::AllocateAligned<float>(kGroup * Dv * kBc)),
        S(hwy::AllocateAligned<float>(kBrBwd * kBc)),
        dP(hwy::AllocateAligned<float>(kBrBwd * kBc)),
        Pz(hwy::AllocateAligned<float>(kBrBwd * kBc)),
        cap(hwy::AllocateAligned<float>(kBrBwd * kBc)),
        dK(hwy::AllocateAligned<float>(kGroup * kBc * Dp)),
        dV(hwy::AllocateAligned<float>(kGroup * kBc * Dvp)),
        dKh(hwy::AllocateAligned<float>(kGroup * kBc * Dp)),
        dVh(hwy::AllocateAligned<float>(kGroup * kBc * Dvp)),
        z(hwy::AllocateAligned<float>(kBc)),
        q_wide(hwy::AllocateAligned<float>(widen ? kBrBwd * Dp : 1)),
        do_wide(hwy::AllocateAligned<float>(widen ? kBrBwd * Dvp : 1)),
        k_wide(hwy::AllocateAligned<float>(kGroup * kBc * Dp)),
        q_pairs(hwy::AllocateAligned<float>(dot ? kBrBwd / 2 * Dp : 1)),
        do_pairs(hwy::AllocateAligned<float>(dot ? kBrBwd / 2 * Dvp : 1)),
        pz_words(hwy::AllocateAligned<float>(dot ? kBrBwd / 2 * kBc : 1)),
        ds_words(hwy::AllocateAligned<float>(dot ? kBrBwd / 2 * kBc : 1)),
        ds_rows(hwy::AllocateAligned<float>(dot ? kBrBwd * kBc / 2 : 1)) {}
};

// What backward reads, with q, k, dout (the B operands) and dq padded to whole
// vectors when D or Dv is not a multiple of N (fp32: padded copies; bf16: the
// caller's rows, padded as each tile is widened; dq is an fp32 accumulator).
template <class T>
struct BackwardProblem {
  const SdpaProblemT<T>* p;
  Band band;
  const T *q, *k, *dout;  // rows (fp32: padded), strides below
  SdpaStrides qs, ks, dos;
  float* dq;  // accumulated in place (zeroed by its owner)
  SdpaStrides dqs;
  const float* Drow;  // (B, Hq, Tq) rowsum(dO ⊙ O)
  const float* lse2;  // (B, Hq, Tq) lse in base 2; +inf for a row with no key
  SdpaStrides rows;   // Drow's and lse2's (b, h, t) strides (t = 1)
  const MaskBlocks* mask_blocks;  // the mask's classes (an empty MaskBlocks without a mask)
  size_t Dp, Dvp;
  int64_t h0 = 0;  // q, dout and dq hold heads from h0 (a thread's copies: HeadCopies)
};

// One query head (b, h) as the tile pairs read it.
template <class T>
struct HeadView {
  int64_t b, h;
  const T *q, *k, *v, *dout;  // q, dout of head h; k, v of its key/value head
  size_t qs, ks, vs, dos;     // row strides
  float* dQ;
  size_t dQs;
  const float* Drow;
  const float* lse2;
};

template <class T>
HeadView<T> MakeHeadView(const BackwardProblem<T>& bp, int64_t b, int64_t h) {
  const SdpaProblemT<T>& p = *bp.p;
  const int64_t hk = h / (p.Hq / p.Hkv);
  HeadView<T> hv{};
  hv.b = b, hv.h = h;
  hv.q = At(bp.q, bp.qs, b, h - bp.h0), hv.qs = size_t(bp.qs.t);
  hv.k = At(bp.k, bp.ks, b, hk), hv.ks = size_t(bp.ks.t);
  hv.v = At(p.v, p.v_strides, b, hk), hv.vs = size_t(p.v_strides.t);
  hv.dout = At(bp.dout, bp.dos, b, h - bp.h0), hv.dos = size_t(bp.dos.t);
  hv.dQ = bp.dq + b * bp.dqs.b + (h - bp.h0) * bp.dqs.h, hv.dQs = size_t(bp.dqs.t);
  const int64_t row0 = b * bp.rows.b + h * bp.rows.h;
  hv.Drow = bp.Drow + row0;
  hv.lse2 = bp.lse2 + row0;
  return hv;
}

// Head (b, h)'s dQ rows (Tq of them, Dp wide) set to 0: dQ accumulates in place.
template <class T>
void ZeroDq(const BackwardProblem<T>& bp, int64_t b, int64_t h) {
  const HeadView<T> hv = MakeHeadView(bp, b, h);
  for (size_t i = 0; i < size_t(bp.p->Tq); ++i)
    std::fill(hv.dQ + i * hv.dQs, hv.dQ + i * hv.dQs + bp.Dp, 0.0f);
}

// kT (D, Bc) = c · K_tileᵀ, vT (Dv, Bc) = V_tileᵀ for keys [j0, j0 + jn) of
// key/value head hk, zero columns past jn.
// DotEngine: kT (Pairs(D), Bc), vT (Pairs(Dv), Bc), their dim pairs × keys.
template <class E, class T>
void PackKeyTile(float* HWY_RESTRICT kT, float* HWY_RESTRICT vT, const BackwardProblem<T>& bp,
                 const HeadView<T>& hv, size_t j0, size_t jn) {
  const SdpaProblemT<T>& p = *bp.p;
  const size_t D = size_t(p.D), Dv = size_t(p.Dv);
  if constexpr (E::kDot) {
    bf16dot::pack_rows_t(reinterpret_cast<uint32_t*>(kT), Bits(hv.k + j0 * hv.ks), hv.ks, jn, kBc,
                         D);
    bf16dot::pack_rows_t(reinterpret_cast<uint32_t*>(vT), Bits(hv.v + j0 * hv.vs), hv.vs, jn, kBc,
                         Dv);
    return;
  }
  const float c = p.softcap > 0.0f ? p.scale / p.softcap : p.scale * kLog2e;
#ifdef ATTN_HAVE_TRANSPOSE_N
  // A whole tile: blocks of N rows x N dims transposed in registers (as
  // ForwardGroup's Q; the same products, so the same bits).
  if (jn == kBc && D % kN == 0 && Dv % kN == 0) {
    for (size_t jj = 0; jj < kBc; jj += kN) {
      for (size_t r = jj + 8; r < std::min(jn, jj + 8 + kN); ++r) {
        PrefetchRows(hv.k, hv.ks, j0 + r, j0 + r + 1, D);
        PrefetchRows(hv.v, hv.vs, j0 + r, j0 + r + 1, Dv);
      }
      for (size_t dd = 0; dd < D; dd += kN)
        ScaledTransposeN(hv.k + (j0 + jj) * hv.ks + dd, hv.ks, kT + dd * kBc + jj, kBc, c);
      for (size_t dd = 0; dd < Dv; dd += kN)
        ScaledTransposeN(hv.v + (j0 + jj) * hv.vs + dd, hv.vs, vT + dd * kBc + jj, kBc, 1.0f);
    }
    return;
  }
#endif
  for (size_t jj = 0; jj < kBc; ++jj) {
    if (jj + 8 < jn) {
      PrefetchRows(hv.k, hv.ks, j0 + jj + 8, j0 + jj + 9, D);
      PrefetchRows(hv.v, hv.vs, j0 + jj + 8, j0 + jj + 9, Dv);
    }
    const T* kj = jj < jn ? hv.k + (j0 + jj) * hv.ks : nullptr;
    const T* vj = jj < jn ? hv.v + (j0 + jj) * hv.vs : nullptr;
    for (size_t dd = 0; dd < D; ++dd) kT[dd * kBc + jj] = kj ? c * Widen(kj[dd]) : 0.0f;
    for (size_t dd = 0; dd < Dv; ++dd) vT[dd * kBc + jj] = vj ? Widen(vj[dd]) : 0.0f;
  }
}

// One pair (keys [j0, j0 + jn) packed in kT/vT, queries [i0, i0 + in) of head
// hv): recompute P and dS, then accumulate whichever of dK (Bc, Dp), dV (Bc,
// Dvp) and the head's dQ rows are given (nullptr skips). The products on E.
template <class E, class T>
void TilePair(const HeadView<T>& hv, const BackwardProblem<T>& bp, size_t j0, size_t jn, size_t i0,
              size_t in, const float* kT, const float* vT, BackwardScratch& s, float* dK, float* dV,
              float* dQ) {
  const DF d;
  const SdpaProblemT<T>& p = *bp.p;
  const Band& band = bp.band;
  const size_t D = size_t(p.D), Dv = size_t(p.Dv);
  const DropoutRule rule(p.dropout_p);
  const int64_t I0 = int64_t(i0), J0 = int64_t(j0);
  float* HWY_RESTRICT S = s.S.get();
  float* HWY_RESTRICT dP = s.dP.get();
  float* HWY_RESTRICT Pz = s.Pz.get();
  const bool edge = !band.covers(I0, I0 + int64_t(in), J0, J0 + int64_t(jn));
  const bool masked = edge || jn < kBc;
  const bool adds_mask = !bp.mask_blocks->AddsNothing(hv.b, hv.h, i0, in, j0, jn);
  // The rows of Q and dO (and of K, for dQ) the products read, in fp32: the
  // fp32 rows in place (already Dp, Dvp wide), bf16 rows widened and padded.
  // DotEngine: Q's and dO's rows as words (for S, dP) and their query pairs
  // (for dK, dV), packed once for the pairs that share them.
  constexpr bool kWide = !std::is_same_v<T, float>;
  const size_t Dw = kWide ? D : bp.Dp, Dvw = kWide ? Dv : bp.Dvp;
  using Op = typename E::Op;
  std::pair<const Op*, size_t> q_rows, do_rows, q_b, do_b;
  if constexpr (E::kDot) {
    if (s.q_tag.head != hv.q || s.q_tag.t0 != i0) {
      s.q_tag = {hv.q, i0};
      bf16dot::pack_rows(Ops<E>(s.q_wide), Bits(hv.q + i0 * hv.qs), hv.qs, in, in, D);
      bf16dot::pack_row_pairs(Ops<E>(s.q_pairs), Bits(hv.q + i0 * hv.qs), hv.qs, in, in, D, bp.Dp);
    }
    if (s.do_tag.head != hv.dout || s.do_tag.t0 != i0) {
      s.do_tag = {hv.dout, i0};
      bf16dot::pack_rows(Ops<E>(s.do_wide), Bits(hv.dout + i0 * hv.dos), hv.dos, in, in, Dv);
      bf16dot::pack_row_pairs(Ops<E>(s.do_pairs), Bits(hv.dout + i0 * hv.dos), hv.dos, in, in, Dv,
                              bp.Dvp);
    }
    q_rows = {Ops<E>(s.q_wide), E::Reduction(D)}, q_b = {Ops<E>(s.q_pairs), bp.Dp};
    do_rows = {Ops<E>(s.do_wide), E::Reduction(Dv)}, do_b = {Ops<E>(s.do_pairs), bp.Dvp};
  } else {
    q_rows = CachedTileRows(s.q_wide.get(), s.q_tag, hv.q, hv.qs, i0, in, Dw, bp.Dp);
    do_rows = CachedTileRows(s.do_wide.get(), s.do_tag, hv.dout, hv.dos, i0, in, Dvw, bp.Dvp);
    q_b = q_rows, do_b = do_rows;
  }
  const Op* kTo = reinterpret_cast<const Op*>(kT);
  const Op* vTo = reinterpret_cast<const Op*>(vT);
  // S (in, Bc) = Q kT (base-2 scores, or scale/softcap · Q Kᵀ);  dP (in, Bc) = dO Vᵀ.
  // At the band's edge a block of queries skips the key vectors wholly outside it.
  auto key_vectors = [&](size_t r0, size_t nr) {
    if (!edge) return Span{0, 0, 0, kNV};
    const int64_t first = band.first_key(I0 + int64_t(r0)) - J0;
    const int64_t last = band.last_key(I0 + int64_t(r0 + nr) - 1) - J0;
    const size_t v0 = first > 0 ? Clamp(first / int64_t(kN), kNV) : 0;
    const size_t v1 = last < 0 ? 0 : Clamp(last / int64_t(kN) + 1, kNV);
    return Span{0, 0, v0, v1};
  };
  Product<E, kOverwrite>(in, kBc, q_rows.first, q_rows.second, 1, kTo, kBc, S, kBc, nullptr,
                         [&](size_t r0, size_t nr) {
                           Span sp = key_vectors(r0, nr);
                           sp.k1 = D;
                           return sp;
                         });
  Product<E, kOverwrite>(in, kBc, do_rows.first, do_rows.second, 1, vTo, kBc, dP, kBc, nullptr,
                         [&](size_t r0, size_t nr) {
                           Span sp = key_vectors(r0, nr);
                           sp.k1 = Dv;
                           return sp;
                         });
  if constexpr (E::kDot)
    ScaleRows(S, in * kBc, p.softcap > 0.0f ? p.scale / p.softcap : p.scale * kLog2e);
  const VF scale_v = hn::Set(d, p.scale);
  const int64_t delta = Delta(p);
  for (size_t ii = 0; ii < in; ++ii) {
    const size_t i = i0 + ii;
    float* HWY_RESTRICT Si = S + ii * kBc;
    if (p.softcap > 0.0f) {  // s₂ = softcap · log2(e) · t, and 1 - t² for the chain rule
      const VF cap = hn::Set(d, p.softcap * kLog2e);
      for (size_t v0 = 0; v0 < kBc; v0 += kN) {
        const VF t = TanhScore(d, hn::Load(d, Si + v0));
        hn::Store(hn::NegMulAdd(t, t, hn::Set(d, 1.0f)), d, s.cap.get() + ii * kBc + v0);
        hn::Store(hn::Mul(cap, t), d, Si + v0);
      }
    }
    if (p.alibi_slopes) {
      const VF slope = hn::Set(d, -p.alibi_slopes[hv.b * p.alibi_b_stride + hv.h] * kLog2e);
      for (size_t v0 = 0; v0 < kBc; v0 += kN) {
        // |i + δ - j| for keys j0 + v0 + lane: the lanes count down.
        const VF dist = hn::Abs(
            hn::Sub(hn::Set(d, float(int64_t(i) + delta - J0 - int64_t(v0))), hn::Iota(d, 0.0f)));
        hn::Store(hn::MulAdd(slope, dist, hn::Load(d, Si + v0)), d, Si + v0);
      }
    }
    if (adds_mask && p.mask) {
      const SdpaStrides& ms = p.mask_strides;
      const float* mrow = p.mask + hv.b * ms.b + hv.h * ms.h + int64_t(i) * ms.t;
      size_t jj = 0;
      if (ms.d == 1) {  // whole vectors of contiguous keys
        const VF l2e = hn::Set(d, kLog2e);
        for (; jj + kN <= jn; jj += kN)
          hn::Store(hn::MulAdd(l2e, hn::LoadU(d, mrow + j0 + jj), hn::Load(d, Si + jj)), d,
                    Si + jj);
      }
      for (; jj < jn; ++jj) Si[jj] += kLog2e * mrow[int64_t(j0 + jj) * ms.d];
    } else if (adds_mask) {  // boolean: the closed keys' scores -> -inf
      const SdpaStrides& ms = p.mask_strides;
      const uint8_t* mrow = p.bool_mask + hv.b * ms.b + hv.h * ms.h + int64_t(i) * ms.t;
      size_t jj = 0;
      if (ms.d == 1) {
        const VF closed = hn::Set(d, kNegInf);
        bool adds;
        for (; jj + kN <= jn; jj += kN)
          hn::Store(hn::IfThenElse(ClosedLanes(mrow + j0 + jj, adds), closed, hn::Load(d, Si + jj)),
                    d, Si + jj);
      }
      for (; jj < jn; ++jj)
        if (mrow[int64_t(j0 + jj) * ms.d] == 0) Si[jj] = kNegInf;
    }
    const VF lse_i = hn::Set(d, hv.lse2[i]);
    const VF D_i = hn::Set(d, hv.Drow[i]);
    if (rule.active()) {  // z (Bc): Philox block m serves keys 4m .. 4m+3
      DropoutRowNoise<kBc>(rule, p.dropout_seed, hv.b, hv.h, i, j0, s.z.get());
    }
    // Keys valid for query i: the band, clipped to the tile's jn keys.
    const int64_t first = band.first_key(int64_t(i)) - J0;
    const int64_t last = std::min(band.last_key(int64_t(i)) - J0, int64_t(jn) - 1);
    for (size_t v0 = 0; v0 < kBc; v0 += kN) {
      const size_t at = ii * kBc + v0;
      VF pv = Exp2(d, hn::Sub(hn::Load(d, S + at), lse_i));
      VF dpv = hn::Load(d, dP + at);
      VF pz = pv;
      if (rule.active()) {
        const VF zv = hn::Load(d, s.z.get() + v0);
        dpv = hn::Mul(dpv, zv);
        pz = hn::Mul(pv, zv);
      }
      VF ds = hn::Mul(hn::Mul(pv, hn::Sub(dpv, D_i)), scale_v);
      if (p.softcap > 0.0f) ds = hn::Mul(ds, hn::Load(d, s.cap.get() + at));
      if (masked) {
        const VF lane = hn::Iota(d, float(v0));
        const auto valid = hn::And(
            hn::Ge(lane, hn::Set(d, float(std::clamp<int64_t>(first, -1, int64_t(kBc) + 1)))),
            hn::Le(lane, hn::Set(d, float(std::clamp<int64_t>(last, -1, int64_t(kBc) + 1)))));
        ds = hn::IfThenElseZero(valid, ds);
        pz = hn::IfThenElseZero(valid, pz);
      }
      hn::Store(pz, d, Pz + at);
      hn::Store(ds, d, dP + at);
    }
  }
  // dV (Bc, Dvp) += Pzᵀ dO;  dK (Bc, Dp) += dSᵀ Q;  dQ (in, Dp) += dS K.
  // At the band's edge a block of keys sums over the queries that see it, and
  // a block of queries over the keys it sees.
  auto from_query = [&](size_t r0, size_t nr) {
    if (!edge) return Span{0, in, 0, kNV};
    const int64_t first = band.first_query(J0 + int64_t(r0)) - I0;
    const int64_t last = band.last_query(J0 + int64_t(r0 + nr) - 1) - I0;
    const size_t k0 = Clamp(first, in), k1 = Clamp(last + 1, in);
    return Span{k0, std::max(k0, k1), 0, kNV};
  };
  auto to_key = [&](size_t r0, size_t nr) {
    if (!edge) return Span{0, jn, 0, kNV};
    const int64_t first = band.first_key(I0 + int64_t(r0)) - J0;
    const int64_t last = band.last_key(I0 + int64_t(r0 + nr) - 1) - J0;
    const size_t k0 = Clamp(first, jn), k1 = Clamp(last + 1, jn);
    return Span{k0, std::max(k0, k1), 0, kNV};
  };
  // DotEngine: Pz and dS rounded to bf16, query pairs interleaved (for dV,
  // dK; a missing odd row is zero), and dS's rows as words (for dQ).
  const Op* pz_a = nullptr;
  const Op* ds_a = nullptr;
  const Op* ds_rows = nullptr;
  size_t ds_rs = kBc, ds_ks = 1;
  if constexpr (E::kDot) {
    if (dV) bf16dot::round_row_pairs(Ops<E>(s.pz_words), Pz, kBc, in, in, kBc);
    if (dK) bf16dot::round_row_pairs(Ops<E>(s.ds_words), dP, kBc, in, in, kBc);
    if (dQ) bf16dot::round_rows(Ops<E>(s.ds_rows), dP, kBc, in, kBc);
    pz_a = Ops<E>(s.pz_words), ds_a = Ops<E>(s.ds_words), ds_rows = Ops<E>(s.ds_rows);
    ds_rs = kBc / 2;
  } else {
    pz_a = Pz, ds_a = dP, ds_rows = dP;
  }
  if (dV)
    Product<E, kAccumulate>(jn, bp.Dvp, pz_a, 1, kBc, do_b.first, do_b.second, dV, bp.Dvp, nullptr,
                            from_query);
  if (dK)
    Product<E, kAccumulate>(jn, bp.Dp, ds_a, 1, kBc, q_b.first, q_b.second, dK, bp.Dp, nullptr,
                            from_query);
  if (dQ) {
    const size_t slot = j0 / kBc % kGroup;  // the g of KeyGroupTask's tiles
    // Copied for fp32 too: K's rows in place lie a multiple of 1 KB apart and
    // crowd a few L1 sets (see PackRows). DotEngine: K's key pairs.
    WideTag& tag = s.k_tag[slot];
    float* k_rows = s.k_wide.get() + slot * kBc * bp.Dp;
    if (tag.head != hv.k || tag.t0 != j0) {
      tag = {hv.k, j0};
      if constexpr (E::kDot) {
        bf16dot::pack_row_pairs(reinterpret_cast<uint32_t*>(k_rows), Bits(hv.k + j0 * hv.ks), hv.ks,
                                jn, jn, D, bp.Dp);
      } else {
        PackRows(k_rows, hv.k, hv.ks, j0, jn, Dw, bp.Dp);
      }
    }
    const size_t ks = bp.Dp;
    Product<E, kAccumulate>(in, bp.Dp, ds_rows, ds_rs, ds_ks, reinterpret_cast<const Op*>(k_rows),
                            ks, dQ + i0 * hv.dQs, hv.dQs, nullptr, to_key);
  }
}

// The query tiles (on the grid of kBrBwd rows) that meet keys [j_begin, j_end).
struct TileRange {
  size_t begin, end;
};
template <class T>
TileRange QueryTiles(const BackwardProblem<T>& bp, int64_t j_begin, int64_t j_end) {
  const size_t Tq = size_t(bp.p->Tq);
  const size_t first = Clamp(bp.band.first_query(j_begin), Tq);
  const size_t end = Clamp(bp.band.last_query(j_end - 1) + 1, Tq);
  return {first / kBrBwd * kBrBwd, end};
}

// dst[0 .. n) += src[0 .. n) (n a multiple of N; any alignment).
HWY_INLINE void AddRow(float* HWY_RESTRICT dst, const float* HWY_RESTRICT src, size_t n) {
  const DF d;
  for (size_t i = 0; i < n; i += kN)
    hn::StoreU(hn::Add(hn::LoadU(d, dst + i), hn::LoadU(d, src + i)), d, dst + i);
}

// One query head's dK and dV terms, fp32 rows (Tk, Dp) and (Tk, Dvp), kept
// for the sum over its group (BatchedBackward's per-head schedule).
struct HeadTerms {
  float* dk = nullptr;
  float* dv = nullptr;
};

// dK, dV of key tiles j_first, j_first + Bc, ... (ng of them) of key/value
// head (b, hk): the query heads [h_begin, h_end) of the group (all of it by
// default), each one's query tiles in order; written out at the end, or,
// with `terms`, kept in fp32 as the one head's terms. dQ accumulated too
// when `with_dq`. With grouped-query heads, each query head's terms are
// summed alone (query tiles in order) and the heads' sums then added in
// order, h_begin's first: the association of the per-head schedule's sum
// over its kept terms, so that every schedule gives the same bits.
template <class E, class T>
void KeyGroupTask(const SdpaBackwardIOT<T>& io, const BackwardProblem<T>& bp, int64_t b, int64_t hk,
                  size_t j_first, size_t ng, bool with_dq, BackwardScratch& s, int64_t h_begin = -1,
                  int64_t h_end = -1, HeadTerms terms = {}) {
  const SdpaProblemT<T>& p = *bp.p;
  const size_t Tk = size_t(p.Tk), D = size_t(p.D), Dv = size_t(p.Dv);
  const int64_t group = p.Hq / p.Hkv;
  if (h_begin < 0) h_begin = hk * group, h_end = (hk + 1) * group;
  const bool per_head = group > 1 && h_end - h_begin > 1;
  auto tile_j0 = [&](size_t g) { return j_first + g * kBc; };
  auto tile_jn = [&](size_t g) { return std::min(kBc, Tk - tile_j0(g)); };
  const HeadView<T> first_view = MakeHeadView(bp, b, hk * group);
  for (size_t g = 0; g < ng; ++g)
    PackKeyTile<E>(s.kT.get() + g * D * kBc, s.vT.get() + g * Dv * kBc, bp, first_view, tile_j0(g),
                   tile_jn(g));
  std::fill(s.dK.get(), s.dK.get() + ng * kBc * bp.Dp, 0.0f);
  std::fill(s.dV.get(), s.dV.get() + ng * kBc * bp.Dvp, 0.0f);
  const TileRange qt = QueryTiles(bp, int64_t(j_first), int64_t(tile_j0(ng - 1) + tile_jn(ng - 1)));
  // While the pairs run, a few rows per query tile: the next group's K and V
  // rows (PackKeyTile reads them next) and this group's dK, dV rows (written
  // at the end), so neither waits on memory in a burst.
  const size_t group_end = tile_j0(ng - 1) + tile_jn(ng - 1);
  const size_t n_steps =
      std::max<size_t>(1, size_t(h_end - h_begin) * ((qt.end - qt.begin + kBrBwd - 1) / kBrBwd));
  auto per_step = [&](size_t rows) { return (rows + n_steps - 1) / n_steps; };
  PrefetchTrickle<T> next_kv{first_view.k,
                             first_view.v,
                             first_view.ks,
                             first_view.vs,
                             D,
                             Dv,
                             group_end,
                             std::min(Tk, group_end + kGroup * kBc),
                             1};
  next_kv.per_call = per_step(next_kv.end - next_kv.next);
  PrefetchTrickle<T> out_rows{io.dk + b * io.dk_strides.b + hk * io.dk_strides.h,
                              io.dv + b * io.dv_strides.b + hk * io.dv_strides.h,
                              size_t(io.dk_strides.t),
                              size_t(io.dv_strides.t),
                              D,
                              Dv,
                              j_first,
                              group_end,
                              1};
  out_rows.per_call = per_step(group_end - j_first);
  float* dK_acc = per_head ? s.dKh.get() : s.dK.get();
  float* dV_acc = per_head ? s.dVh.get() : s.dV.get();
  for (int64_t h = h_begin; h < h_end; ++h) {
    const HeadView<T> hv = MakeHeadView(bp, b, h);
    if (per_head) {
      std::fill(dK_acc, dK_acc + ng * kBc * bp.Dp, 0.0f);
      std::fill(dV_acc, dV_acc + ng * kBc * bp.Dvp, 0.0f);
    }
    for (size_t i0 = qt.begin; i0 < qt.end; i0 += kBrBwd) {
      next_kv();
      out_rows();
      const size_t in = std::min(kBrBwd, size_t(p.Tq) - i0);
      const size_t next_end = std::min(size_t(p.Tq), i0 + in + kBrBwd);
      PrefetchRows(hv.q, hv.qs, i0 + in, next_end, D);
      PrefetchRows(hv.dout, hv.dos, i0 + in, next_end, Dv);
      for (size_t g = 0; g < ng; ++g) {
        if (!bp.band.meets(int64_t(i0), int64_t(i0 + in), int64_t(tile_j0(g)),
                           int64_t(tile_j0(g) + tile_jn(g))) ||
            bp.mask_blocks->Hidden(b, h, i0, in, tile_j0(g), tile_jn(g)))
          continue;
        TilePair<E>(hv, bp, tile_j0(g), tile_jn(g), i0, in, s.kT.get() + g * D * kBc,
                    s.vT.get() + g * Dv * kBc, s, dK_acc + g * kBc * bp.Dp,
                    dV_acc + g * kBc * bp.Dvp, with_dq ? hv.dQ : nullptr);
      }
    }
    if (per_head) {  // the head's sums into the group's: the first copied, the others added
      if (h == h_begin) {
        std::copy(dK_acc, dK_acc + ng * kBc * bp.Dp, s.dK.get());
        std::copy(dV_acc, dV_acc + ng * kBc * bp.Dvp, s.dV.get());
      } else {
        AddRow(s.dK.get(), dK_acc, ng * kBc * bp.Dp);
        AddRow(s.dV.get(), dV_acc, ng * kBc * bp.Dvp);
      }
    }
  }
  next_kv.rest();
  out_rows.rest();
  if (terms.dk) {  // one head's terms, kept in fp32
    for (size_t g = 0; g < ng; ++g) {
      const size_t j0 = tile_j0(g);
      std::copy(s.dK.get() + g * kBc * bp.Dp, s.dK.get() + (g * kBc + tile_jn(g)) * bp.Dp,
                terms.dk + j0 * bp.Dp);
      std::copy(s.dV.get() + g * kBc * bp.Dvp, s.dV.get() + (g * kBc + tile_jn(g)) * bp.Dvp,
                terms.dv + j0 * bp.Dvp);
    }
    return;
  }
  for (size_t g = 0; g < ng; ++g)
    for (size_t jj = 0; jj < tile_jn(g); ++jj) {
      const int64_t t = int64_t(tile_j0(g) + jj);
      const float* dK = s.dK.get() + (g * kBc + jj) * bp.Dp;
      const float* dV = s.dV.get() + (g * kBc + jj) * bp.Dvp;
      std::transform(dK, dK + D,
                     io.dk + b * io.dk_strides.b + hk * io.dk_strides.h + t * io.dk_strides.t,
                     Narrow<T>);
      std::transform(dV, dV + Dv,
                     io.dv + b * io.dv_strides.b + hk * io.dv_strides.h + t * io.dv_strides.t,
                     Narrow<T>);
    }
}

// The key tiles (on the grid of kBc keys) that meet queries [i_begin, i_end).
template <class T>
TileRange KeyTiles(const BackwardProblem<T>& bp, int64_t i_begin, int64_t i_end) {
  const size_t Tk = size_t(bp.p->Tk);
  const size_t first = Clamp(bp.band.first_key(i_begin), Tk);
  const size_t end = Clamp(bp.band.last_key(i_end - 1) + 1, Tk);
  return {first / kBc * kBc, end};
}

// dQ of query tile i0 of head (b, h): its key tiles in order, the pairs KeyGroupTask visits.
template <class E, class T>
void QueryTileTask(const BackwardProblem<T>& bp, int64_t b, int64_t h, size_t i0,
                   BackwardScratch& s) {
  const SdpaProblemT<T>& p = *bp.p;
  const size_t in = std::min(kBrBwd, size_t(p.Tq) - i0);
  const HeadView<T> hv = MakeHeadView(bp, b, h);
  for (size_t i = i0; i < i0 + in; ++i)
    std::fill(hv.dQ + i * hv.dQs, hv.dQ + i * hv.dQs + bp.Dp, 0.0f);
  const TileRange kt = KeyTiles(bp, int64_t(i0), int64_t(i0 + in));
  for (size_t j0 = kt.begin; j0 < kt.end; j0 += kBc) {
    const size_t jn = std::min(kBc, size_t(p.Tk) - j0);
    if (!bp.band.meets(int64_t(i0), int64_t(i0 + in), int64_t(j0), int64_t(j0 + jn)) ||
        bp.mask_blocks->Hidden(b, h, i0, in, j0, jn))
      continue;
    PackKeyTile<E>(s.kT.get(), s.vT.get(), bp, hv, j0, jn);
    TilePair<E>(hv, bp, j0, jn, i0, in, s.kT.get(), s.vT.get(), s, nullptr, nullptr, hv.dQ);
  }
}

// (B, H, T, W) contiguous copy of a strided (b, h, t) buffer, each row zero-padded to Wp.
hwy::AlignedFreeUniquePtr<float[]> PadRows(const float* src, const SdpaStrides& s, int64_t B,
                                           int64_t H, int64_t T, size_t W, size_t Wp) {
  auto dst = hwy::AllocateAligned<float>(size_t(B * H * T) * Wp);
#pragma omp parallel for schedule(static)
  for (int64_t bht = 0; bht < B * H * T; ++bht) {
    const float* row = At(src, s, bht / (H * T), bht / T % H, bht % T);
    std::copy(row, row + W, dst.get() + size_t(bht) * Wp);
    std::fill(dst.get() + size_t(bht) * Wp + W, dst.get() + size_t(bht + 1) * Wp, 0.0f);
  }
  return dst;
}

SdpaStrides Packed(int64_t H, int64_t T, size_t Wp) {
  return {H * T * int64_t(Wp), T * int64_t(Wp), int64_t(Wp), 1};
}

// The tasks, after SdpaBackwardImpl: a batched problem's, a varlen problem's.
template <class E, class T>
void BatchedBackward(const SdpaBackwardIOT<T>& io, const BackwardProblem<T>& bp);
template <class E, class T>
void VarlenBackward(const SdpaBackwardIOT<T>& io, const BackwardProblem<T>& bp);

// The backward's row term D_i = dO_i · O_i for kN rows at once, the lanes
// being rows: each lane sums its row's products from 0, dimension after
// dimension (DotEngine: pair after pair), with the engine's own operation
// (hn::MulAdd, which is a fused multiply-add where the target has one;
// VDPBF16PS), the sum the micro-kernels form for dP_ij = dO_i · V_j in each
// lane. So where O_i is V_j (a softmax whose weight is all on key j), D_i is
// dP_ij exactly. O(Dv) per row, as the vector sum it replaces; the products
// the backward runs are O(Tk · D) per row.
struct RowTermScratch {
  hwy::AlignedFreeUniquePtr<float[]> doT, oT;  // (Dv, kN) each; DotEngine: (Pairs(Dv), kN) words
  explicit RowTermScratch(size_t Dv)
      : doT(hwy::AllocateAligned<float>(Dv * kN)), oT(hwy::AllocateAligned<float>(Dv * kN)) {}
};

// D[r] = dO[r] · O[r] for rows r < n (dO's rows do_stride apart, O's o_stride; Dv each).
template <class T>
void RowTerms(float* HWY_RESTRICT D, const T* dout, size_t do_stride, const T* out, size_t o_stride,
              size_t n, size_t Dv, bool dot, RowTermScratch& s) {
  if constexpr (std::is_same_v<T, BFloat16> && kDotTarget) {
    if (dot) {  // the words dP's product multiplies: (dO's pair, V's pair) in each lane
      auto* doW = reinterpret_cast<uint32_t*>(s.doT.get());
      auto* oW = reinterpret_cast<uint32_t*>(s.oT.get());
      bf16dot::pack_rows_t(doW, Bits(dout), do_stride, n, kN, Dv);
      bf16dot::pack_rows_t(oW, Bits(out), o_stride, n, kN, Dv);
      float sums[kN];
      bf16dot::lane_dots(sums, doW, oW, bf16dot::Pairs(Dv));
      std::copy(sums, sums + n, D);
      return;
    }
  }
  (void)dot;
  float* HWY_RESTRICT doT = s.doT.get();
  float* HWY_RESTRICT oT = s.oT.get();
  for (size_t r = 0; r < kN; ++r)
    for (size_t dd = 0; dd < Dv; ++dd) {
      doT[dd * kN + r] = r < n ? Widen(dout[r * do_stride + dd]) : 0.0f;
      oT[dd * kN + r] = r < n ? Widen(out[r * o_stride + dd]) : 0.0f;
    }
  const DF d;
  VF acc = hn::Zero(d);
  for (size_t dd = 0; dd < Dv; ++dd)
    acc = hn::MulAdd(hn::Load(d, doT + dd * kN), hn::Load(d, oT + dd * kN), acc);
  float sums[kN];
  hn::StoreU(acc, d, sums);
  std::copy(sums, sums + n, D);
}

}  // namespace

template <class T>
void SdpaBackwardImpl(const SdpaBackwardIOT<T>& io, const SdpaProblemT<T>& p) {
  constexpr bool kWide = !std::is_same_v<T, float>;
  const size_t Tq = size_t(p.Tq), D = size_t(p.D), Dv = size_t(p.Dv);
  const size_t Dp = RoundUp(D, kN), Dvp = RoundUp(Dv, kN);
  // What is computed row by row (D, lse2, the padded copies) sees a varlen
  // problem as one batch of total_q queries and total_k keys (its b strides unread).
  const bool varlen = p.cu_seqlens_q != nullptr;
  const int64_t B = varlen ? 1 : p.B;
  const int64_t BH = B * p.Hq;
  const SdpaStrides ls = sdpa_lse_strides(io.lse_strides, p);
  // D = rowsum(dO ⊙ O) and lse · log2(e), (B, Hq, Tq) each. D is summed by
  // the engine that forms dP = dO Vᵀ, in its order (RowTerms), so that a row
  // whose output is one value row (O = V_j: one visible key, or all the
  // probability on one) has D == dP_ij bit for bit and dS_ij = P (dP - D) = 0
  // exactly, as the softmax's gradient is.
  auto Drow = hwy::AllocateAligned<float>(size_t(BH) * Tq);
  auto lse2 = hwy::AllocateAligned<float>(size_t(BH) * Tq);
  const bool dot = DotEngineChosen<T>();
#pragma omp parallel
  {
    RowTermScratch scratch(Dv);
#pragma omp for schedule(static)
    for (int64_t bh = 0; bh < BH; ++bh) {
      const int64_t b = bh / p.Hq, h = bh % p.Hq;
      for (size_t i0 = 0; i0 < Tq; i0 += kN) {
        const size_t n = std::min(kN, Tq - i0);
        if (i0 + kRowsAhead < Tq) {  // rows a stride apart: each a miss without this
          const size_t t0 = i0 + kRowsAhead, t1 = std::min(Tq, t0 + kN);
          PrefetchRows(At(io.dout, io.dout_strides, b, h, 0), size_t(io.dout_strides.t), t0, t1,
                       Dv);
          PrefetchRows(At(io.out, io.out_strides, b, h, 0), size_t(io.out_strides.t), t0, t1, Dv);
        }
        float* D_rows = Drow.get() + size_t(bh) * Tq + i0;
        RowTerms(D_rows, At(io.dout, io.dout_strides, b, h, int64_t(i0)), size_t(io.dout_strides.t),
                 At(io.out, io.out_strides, b, h, int64_t(i0)), size_t(io.out_strides.t), n, Dv,
                 dot, scratch);
        for (size_t r = 0; r < n; ++r) {
          const int64_t i = int64_t(i0 + r);
          const float lse = io.lse[b * ls.b + h * ls.h + i * ls.t];
          if (lse == kNegInf) D_rows[r] = 0.0f;
          lse2[size_t(bh) * Tq + size_t(i)] = lse == kNegInf ? -kNegInf : lse * kLog2e;
        }
      }
    }
  }
  const MaskBlocks mask_blocks(p, /*with_bits=*/false);
  BackwardProblem<T> bp{};
  bp.p = &p;
  bp.band = MakeBand(p);
  bp.mask_blocks = &mask_blocks;
  bp.q = p.q, bp.k = p.k, bp.dout = io.dout;
  bp.qs = p.q_strides, bp.ks = p.k_strides, bp.dos = io.dout_strides;
  if constexpr (!kWide) bp.dq = io.dq, bp.dqs = io.dq_strides;  // else dq_pad, below
  bp.Drow = Drow.get(), bp.lse2 = lse2.get();
  bp.rows = {p.Hq * p.Tq, p.Tq, 1, 1};
  bp.Dp = Dp, bp.Dvp = Dvp;
  // B operands (rows of Q, K, dO) and the dQ accumulator need whole vectors
  // (bf16: each tile is padded as it is widened; dQ sums in fp32).
  hwy::AlignedFreeUniquePtr<float[]> q_pad, k_pad, do_pad, dq_pad;
  if constexpr (!kWide) {
    if (Dp != D) {
      q_pad = PadRows(p.q, p.q_strides, B, p.Hq, p.Tq, D, Dp);
      k_pad = PadRows(p.k, p.k_strides, B, p.Hkv, p.Tk, D, Dp);
      bp.q = q_pad.get(), bp.qs = Packed(p.Hq, p.Tq, Dp);
      bp.k = k_pad.get(), bp.ks = Packed(p.Hkv, p.Tk, Dp);
    }
    if (Dvp != Dv) {
      do_pad = PadRows(io.dout, io.dout_strides, B, p.Hq, p.Tq, Dv, Dvp);
      bp.dout = do_pad.get(), bp.dos = Packed(p.Hq, p.Tq, Dvp);
    }
  }
  const bool dq_padded = kWide || Dp != D;
  if (dq_padded) {
    dq_pad = hwy::AllocateAligned<float>(size_t(BH) * Tq * Dp);
    bp.dq = dq_pad.get(), bp.dqs = Packed(p.Hq, p.Tq, Dp);
  }
  auto run_on = [&](auto engine) {
    using E = decltype(engine);
    if (varlen)
      VarlenBackward<E>(io, bp);
    else
      BatchedBackward<E>(io, bp);
  };
  bool done = false;
  if constexpr (std::is_same_v<T, BFloat16> && kDotTarget) {
    if (DotEngineChosen<T>()) run_on(DotEngine()), done = true;
  }
  if (!done) run_on(FmaEngine());
  if (dq_padded) {
#pragma omp parallel for schedule(static)
    for (int64_t bht = 0; bht < BH * p.Tq; ++bht) {
      const int64_t b = bht / (p.Hq * p.Tq), h = bht / p.Tq % p.Hq, t = bht % p.Tq;
      const float* row = dq_pad.get() + size_t(bht) * Dp;
      std::transform(row, row + D,
                     io.dq + b * io.dq_strides.b + h * io.dq_strides.h + t * io.dq_strides.t,
                     Narrow<T>);
    }
  }
}

namespace {

// bp with the Q and dO rows of key/value head hk's query heads (b) copied
// into buf, contiguous ((group, Tq, Dp) and (group, Tq, Dvp)), and dQ
// pointed at buf's third part (group, Tq, Dp): heads from h0 = hk · group. fp32 only.
template <class T>
BackwardProblem<T> HeadCopies(const BackwardProblem<T>& bp, int64_t b, int64_t hk,
                              float* HWY_RESTRICT buf) {
  BackwardProblem<T> u = bp;
  if constexpr (std::is_same_v<T, float>) {
    const SdpaProblemT<T>& p = *bp.p;
    const int64_t group = p.Hq / p.Hkv, Tq = p.Tq;
    const int64_t Dp = int64_t(bp.Dp), Dvp = int64_t(bp.Dvp);
    float* q = buf;
    float* dout = q + group * Tq * Dp;
    float* dq = dout + group * Tq * Dvp;
    for (int64_t g = 0; g < group; ++g) {
      const float* q_head = At(bp.q, bp.qs, b, hk * group + g);
      const float* do_head = At(bp.dout, bp.dos, b, hk * group + g);
      for (int64_t t = 0; t < Tq; ++t) {
        const int64_t ahead = int64_t(kRowsAhead);
        if (t + ahead < Tq) {
          PrefetchRows(q_head, size_t(bp.qs.t), size_t(t + ahead), size_t(t + ahead + 1),
                       size_t(Dp));
          PrefetchRows(do_head, size_t(bp.dos.t), size_t(t + ahead), size_t(t + ahead + 1),
                       size_t(Dvp));
        }
        CopyRow(q + (g * Tq + t) * Dp, q_head + t * bp.qs.t, size_t(Dp));
        CopyRow(dout + (g * Tq + t) * Dvp, do_head + t * bp.dos.t, size_t(Dvp));
      }
    }
    u.q = q, u.qs = {0, Tq * Dp, Dp, 1};
    u.dout = dout, u.dos = {0, Tq * Dvp, Dvp, 1};
    u.dq = dq, u.dqs = {0, Tq * Dp, Dp, 1};
    u.h0 = hk * group;
  }
  return u;
}

// The batched problem's tasks.
template <class E, class T>
void BatchedBackward(const SdpaBackwardIOT<T>& io, const BackwardProblem<T>& bp) {
  constexpr bool kWide = !std::is_same_v<T, float>;
  const SdpaProblemT<T>& p = *bp.p;
  const size_t Tq = size_t(p.Tq), D = size_t(p.D), Dv = size_t(p.Dv), Dp = bp.Dp, Dvp = bp.Dvp;
  const int64_t BH = p.B * p.Hq;
  const int64_t BHkv = p.B * p.Hkv, group = p.Hq / p.Hkv;
  const int64_t n_kt = (p.Tk + int64_t(kBc) - 1) / int64_t(kBc);
  const int64_t n_kg = (n_kt + int64_t(kGroup) - 1) / int64_t(kGroup);
  auto key_group = [&](int64_t kg) {
    const int64_t first = kg * int64_t(kGroup);
    return std::pair<size_t, size_t>(size_t(first) * kBc,
                                     size_t(std::min(int64_t(kGroup), n_kt - first)));
  };
  // With at least two (b, key/value head) units per thread, a thread owns a
  // unit and accumulates its heads' dQ in the same pass. With fewer units but
  // grouped-query heads, two query heads or more per thread: a thread owns a
  // query head (b, h), all its key groups, its dQ summed in the same pass and
  // its dK, dV terms kept in fp32 (HeadTerms, within kTermsFloatsMax), then
  // each key/value head's terms summed over its group in order (the
  // association KeyGroupTask gives them elsewhere, so the same bits). Else
  // dK and dV over key groups, then dQ over query tiles (S and dP recomputed:
  // 7 products instead of 5).
  // fp32: the unit's heads of Q, dO and dQ are copied into one contiguous
  // block per thread (on huge pages), which every key group reads: a head of
  // a token-major tensor spans all its pages, and its rows crowd a few L1
  // sets; dQ is summed there and written back once.
  const int64_t threads = MaxThreads();
  if (!(threads > 1 && BHkv < 2 * threads)) {
    const size_t unit_floats = size_t(group) * Tq * (2 * Dp + Dvp);
    const bool copy = !kWide && unit_floats <= kHeadRowsMax;
#pragma omp parallel
    {
      BackwardScratch scratch(D, Dv, Dp, Dvp, kWide, E::kDot);
      HeadBuffer buf(copy ? unit_floats : 0);
#pragma omp for schedule(dynamic, 1)
      for (int64_t unit = 0; unit < BHkv; ++unit) {
        const int64_t b = unit / p.Hkv, hk = unit % p.Hkv;
        const bool copied = copy && buf.data != nullptr;
        const BackwardProblem<T> ub = copied ? HeadCopies(bp, b, hk, buf.data) : bp;
        for (int64_t h = hk * group; h < (hk + 1) * group; ++h) ZeroDq(ub, b, h);
        for (int64_t kg = 0; kg < n_kg; ++kg) {
          const auto [j_first, ng] = key_group(kg);
          KeyGroupTask<E>(io, ub, b, hk, j_first, ng, true, scratch);
        }
        if (copied) {  // dQ back where the caller (or the padded path) wants it
          for (int64_t h = hk * group; h < (hk + 1) * group; ++h)
            for (size_t i = 0; i < Tq; ++i) {
              const float* row = ub.dq + (h - ub.h0) * ub.dqs.h + int64_t(i) * ub.dqs.t;
              CopyRow(bp.dq + b * bp.dqs.b + h * bp.dqs.h + int64_t(i) * bp.dqs.t, row, size_t(Dp));
            }
        }
      }
    }
  } else if (group > 1 && BH >= 2 * threads &&
             size_t(BH) * size_t(p.Tk) * (Dp + Dvp) <= kTermsFloatsMax) {
    const size_t Tk = size_t(p.Tk);
    auto dk_terms = hwy::AllocateAligned<float>(size_t(BH) * Tk * Dp);
    auto dv_terms = hwy::AllocateAligned<float>(size_t(BH) * Tk * Dvp);
#pragma omp parallel
    {
      BackwardScratch scratch(D, Dv, Dp, Dvp, kWide, E::kDot);
#pragma omp for schedule(dynamic, 1)
      for (int64_t bh = 0; bh < BH; ++bh) {
        const int64_t b = bh / p.Hq, h = bh % p.Hq;
        ZeroDq(bp, b, h);
        const HeadTerms terms{dk_terms.get() + size_t(bh) * Tk * Dp,
                              dv_terms.get() + size_t(bh) * Tk * Dvp};
        for (int64_t kg = 0; kg < n_kg; ++kg) {
          const auto [j_first, ng] = key_group(kg);
          KeyGroupTask<E>(io, bp, b, h / group, j_first, ng, true, scratch, h, h + 1, terms);
        }
      }
      // dK, dV of each key/value head's key j: its group's terms in order.
      std::vector<float> sum(std::max(Dp, Dvp));
#pragma omp for schedule(static)
      for (int64_t row = 0; row < BHkv * p.Tk; ++row) {
        const int64_t b = row / (p.Hkv * p.Tk), hk = row / p.Tk % p.Hkv, j = row % p.Tk;
        auto reduce = [&](const float* terms, size_t Wp, size_t W, T* dst) {
          const size_t h0 = size_t(b * p.Hq + hk * group);
          std::copy(terms + (h0 * Tk + size_t(j)) * Wp, terms + (h0 * Tk + size_t(j)) * Wp + Wp,
                    sum.data());
          for (size_t u = 1; u < size_t(group); ++u)
            AddRow(sum.data(), terms + ((h0 + u) * Tk + size_t(j)) * Wp, Wp);
          std::transform(sum.data(), sum.data() + W, dst, Narrow<T>);
        };
        reduce(dk_terms.get(), Dp, D,
               io.dk + b * io.dk_strides.b + hk * io.dk_strides.h + j * io.dk_strides.t);
        reduce(dv_terms.get(), Dvp, Dv,
               io.dv + b * io.dv_strides.b + hk * io.dv_strides.h + j * io.dv_strides.t);
      }
    }
  } else {
    const int64_t n_qt = (p.Tq + int64_t(kBrBwd) - 1) / int64_t(kBrBwd);
#pragma omp parallel
    {
      BackwardScratch scratch(D, Dv, Dp, Dvp, kWide, E::kDot);
#pragma omp for schedule(dynamic, 1)
      for (int64_t item = 0; item < BHkv * n_kg; ++item) {
        const int64_t kg = item / BHkv, unit = item % BHkv;
        const auto [j_first, ng] = key_group(kg);
        KeyGroupTask<E>(io, bp, unit / p.Hkv, unit % p.Hkv, j_first, ng, false, scratch);
      }
#pragma omp for schedule(dynamic, 1)
      for (int64_t item = 0; item < BH * n_qt; ++item) {
        const int64_t qt = n_qt - 1 - item / BH, bh = item % BH;
        QueryTileTask<E>(bp, bh / p.Hq, bh % p.Hq, size_t(qt) * kBrBwd, scratch);
      }
    }
  }
}

// Sequence b of a varlen backward problem: ps its view (sdpa_sequence), the
// rows bp reads and writes moved to the sequence's first query and key, every b stride 0.
template <class T>
BackwardProblem<T> SequenceView(const BackwardProblem<T>& bp, const SdpaProblemT<T>& ps,
                                int64_t b) {
  const SdpaProblemT<T>& p = *bp.p;
  const int64_t q0 = p.cu_seqlens_q[b], k0 = p.cu_seqlens_k[b];
  BackwardProblem<T> s = bp;
  s.p = &ps;
  s.band = MakeBand(ps);
  s.q = bp.q + q0 * bp.qs.t, s.k = bp.k + k0 * bp.ks.t, s.dout = bp.dout + q0 * bp.dos.t;
  s.dq = bp.dq + q0 * bp.dqs.t;
  s.Drow = bp.Drow + q0 * bp.rows.t, s.lse2 = bp.lse2 + q0 * bp.rows.t;
  s.qs.b = s.ks.b = s.dos.b = s.dqs.b = s.rows.b = 0;
  return s;
}

// A varlen problem: BatchedBackward's two schedules over (sequence, key/value
// head) units, (sequence, key group) x key/value head and (sequence, query
// tile) x head tasks, each sequence through its views run as batch b. The
// tasks of one output are those of the sequence alone, so the bits are too.
template <class E, class T>
void VarlenBackward(const SdpaBackwardIOT<T>& io, const BackwardProblem<T>& bp) {
  constexpr bool kWide = !std::is_same_v<T, float>;
  const SdpaProblemT<T>& p = *bp.p;
  const size_t D = size_t(p.D), Dv = size_t(p.Dv), Dp = bp.Dp, Dvp = bp.Dvp;
  const int64_t group = p.Hq / p.Hkv;
  auto n_kt = [&](int64_t b) {
    return (p.cu_seqlens_k[b + 1] - p.cu_seqlens_k[b] + int64_t(kBc) - 1) / int64_t(kBc);
  };
  auto n_kg = [&](int64_t b) { return (n_kt(b) + int64_t(kGroup) - 1) / int64_t(kGroup); };
  auto n_qt = [&](int64_t b) {
    return (p.cu_seqlens_q[b + 1] - p.cu_seqlens_q[b] + int64_t(kBrBwd) - 1) / int64_t(kBrBwd);
  };
  // Key group kg of sequence b: its first key and its number of tiles.
  auto key_group = [&](int64_t b, int64_t kg) {
    const int64_t first = kg * int64_t(kGroup);
    return std::pair<size_t, size_t>(size_t(first) * kBc,
                                     size_t(std::min(int64_t(kGroup), n_kt(b) - first)));
  };
  const int64_t units = p.B * p.Hkv;
  const int64_t threads = MaxThreads();
  if (!(threads > 1 && units < 2 * threads)) {
#pragma omp parallel
    {
      BackwardScratch scratch(D, Dv, Dp, Dvp, kWide, E::kDot);
#pragma omp for schedule(dynamic, 1)
      for (int64_t unit = 0; unit < units; ++unit) {
        const int64_t b = unit / p.Hkv, hk = unit % p.Hkv;
        const SdpaProblemT<T> ps = sdpa_sequence(p, b);
        const SdpaBackwardIOT<T> ios = sdpa_sequence(io, p, b);
        const BackwardProblem<T> bps = SequenceView(bp, ps, b);
        for (int64_t h = hk * group; h < (hk + 1) * group; ++h) ZeroDq(bps, b, h);
        for (int64_t kg = 0; kg < n_kg(b); ++kg) {
          const auto [j_first, ng] = key_group(b, kg);
          KeyGroupTask<E>(ios, bps, b, hk, j_first, ng, true, scratch);
        }
      }
    }
    return;
  }
  // (sequence, key group): the first groups first; (sequence, query tile): the last tiles first.
  std::vector<std::pair<int64_t, int64_t>> key_items, query_items;
  int64_t most_kg = 0, most_qt = 0;
  for (int64_t b = 0; b < p.B; ++b)
    most_kg = std::max(most_kg, n_kg(b)), most_qt = std::max(most_qt, n_qt(b));
  for (int64_t kg = 0; kg < most_kg; ++kg)
    for (int64_t b = 0; b < p.B; ++b)
      if (kg < n_kg(b)) key_items.emplace_back(b, kg);
  for (int64_t qt = most_qt - 1; qt >= 0; --qt)
    for (int64_t b = 0; b < p.B; ++b)
      if (qt < n_qt(b)) query_items.emplace_back(b, qt);
  const int64_t n_key = int64_t(key_items.size()) * p.Hkv;
  const int64_t n_query = int64_t(query_items.size()) * p.Hq;
#pragma omp parallel
  {
    BackwardScratch scratch(D, Dv, Dp, Dvp, kWide, E::kDot);
#pragma omp for schedule(dynamic, 1)
    for (int64_t item = 0; item < n_key; ++item) {
      const auto [b, kg] = key_items[size_t(item / p.Hkv)];
      const SdpaProblemT<T> ps = sdpa_sequence(p, b);
      const auto [j_first, ng] = key_group(b, kg);
      KeyGroupTask<E>(sdpa_sequence(io, p, b), SequenceView(bp, ps, b), b, item % p.Hkv, j_first,
                      ng, false, scratch);
    }
#pragma omp for schedule(dynamic, 1)
    for (int64_t item = 0; item < n_query; ++item) {
      const auto [b, qt] = query_items[size_t(item / p.Hq)];
      const SdpaProblemT<T> ps = sdpa_sequence(p, b);
      QueryTileTask<E>(SequenceView(bp, ps, b), b, item % p.Hq, size_t(qt) * kBrBwd, scratch);
    }
  }
}

}  // namespace

// The entry points Highway dispatches (no templates there).
void SdpaForwardF32(const SdpaOutput& o, const SdpaProblem& p) { SdpaForwardImpl(o, p); }
void SdpaForwardBf16(const SdpaOutputBf16& o, const SdpaProblemBf16& p) { SdpaForwardImpl(o, p); }
void SdpaBackwardF32(const SdpaBackwardIO& io, const SdpaProblem& p) { SdpaBackwardImpl(io, p); }
void SdpaBackwardBf16(const SdpaBackwardIOBf16& io, const SdpaProblemBf16& p) {
  SdpaBackwardImpl(io, p);
}

const char* SdpaTargetName() { return hwy::TargetName(HWY_TARGET); }

void Exp2Rows(const float* HWY_RESTRICT x, float* HWY_RESTRICT y, size_t n) {
  const DF d;
  size_t i = 0;
  for (; i + kN <= n; i += kN) hn::StoreU(Exp2(d, hn::LoadU(d, x + i)), d, y + i);
  if (i == n) return;
  HWY_ALIGN float tail[kN] = {};
  std::copy(x + i, x + n, tail);
  hn::Store(Exp2(d, hn::Load(d, tail)), d, tail);
  std::copy(tail, tail + (n - i), y + i);
}

// NOLINTNEXTLINE(google-readability-namespace-comments)
}  // namespace HWY_NAMESPACE
}  // namespace attn::kernels
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace attn::kernels {

HWY_EXPORT(SdpaForwardF32);
HWY_EXPORT(SdpaForwardBf16);
HWY_EXPORT(SdpaBackwardF32);
HWY_EXPORT(SdpaBackwardBf16);
HWY_EXPORT(SdpaTargetName);
HWY_EXPORT(Exp2Rows);

namespace {

void check_rows(const char* name, int64_t width, const SdpaStrides& s) {
  if (width > 1 && s.d != 1)
    throw std::invalid_argument("sdpa kernel: " + std::string(name) +
                                " needs stride 1 along its last dim, got " + std::to_string(s.d));
}

template <class T>
void check_problem(const SdpaProblemT<T>& p) {
  const std::string where = "sdpa kernel: ";
  // A varlen problem's totals may be 0 (every sequence empty).
  const int64_t min_t = p.cu_seqlens_q ? 0 : 1;
  if (p.B < 1 || p.Hq < 1 || p.Hkv < 1 || p.Tq < min_t || p.Tk < min_t || p.D < 1 || p.Dv < 1)
    throw std::invalid_argument(where + "every size must be >= 1");
  if (bool(p.cu_seqlens_q) != bool(p.cu_seqlens_k) || (p.cu_seqlens_q && (p.mask || p.bool_mask)))
    throw std::invalid_argument(
        where + "a varlen problem needs cu_seqlens_q and cu_seqlens_k, and no mask");
  if (p.mask && p.bool_mask)
    throw std::invalid_argument(where + "an additive mask and a boolean mask are both given");
  if (p.Hq % p.Hkv != 0)
    throw std::invalid_argument(where + "Hq (" + std::to_string(p.Hq) +
                                ") must be a multiple of Hkv (" + std::to_string(p.Hkv) + ")");
  check_rows("q", p.D, p.q_strides);
  check_rows("k", p.D, p.k_strides);
  check_rows("v", p.Dv, p.v_strides);
}

template <class T>
void check_backward(const SdpaBackwardIOT<T>& io, const SdpaProblemT<T>& p) {
  check_problem(p);
  check_rows("dout", p.Dv, io.dout_strides);
  check_rows("out", p.Dv, io.out_strides);
  check_rows("dq", p.D, io.dq_strides);
  check_rows("dk", p.D, io.dk_strides);
  check_rows("dv", p.Dv, io.dv_strides);
}

}  // namespace

void sdpa_forward(const SdpaOutput& o, const SdpaProblem& p) {
  check_problem(p);
  check_rows("out", p.Dv, o.out_strides);
  HWY_DYNAMIC_DISPATCH(SdpaForwardF32)(o, p);
}

void sdpa_forward(const SdpaOutputBf16& o, const SdpaProblemBf16& p) {
  check_problem(p);
  check_rows("out", p.Dv, o.out_strides);
  HWY_DYNAMIC_DISPATCH(SdpaForwardBf16)(o, p);
}

void sdpa_backward(const SdpaBackwardIO& io, const SdpaProblem& p) {
  check_backward(io, p);
  HWY_DYNAMIC_DISPATCH(SdpaBackwardF32)(io, p);
}

void sdpa_backward(const SdpaBackwardIOBf16& io, const SdpaProblemBf16& p) {
  check_backward(io, p);
  HWY_DYNAMIC_DISPATCH(SdpaBackwardBf16)(io, p);
}

const char* sdpa_target() { return HWY_DYNAMIC_DISPATCH(SdpaTargetName)(); }

void kernel_exp2(const float* x, float* y, size_t n) { HWY_DYNAMIC_DISPATCH(Exp2Rows)(x, y, n); }

}  // namespace attn::kernels
#endif  // HWY_ONCE
