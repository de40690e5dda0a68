// The bf16 attention kernels on AMX tiles (the "AMX" path of
// flash_attention_forward_bf16 / flash_attention_backward_bf16, attn/kernels.h):
// the maths and the numerics of the sdpa kernel's DotEngine (sdpa_kernel.cpp: fp32 scores,
// softmax statistics, lse and accumulators; P and dS rounded to bf16 where
// they enter a product; results rounded once), with every matrix product
// one call of amx::tile_gemm (amx_tiles.h): C (fp32) (+)= A (bf16 rows) · B
// (bf16, VNNI packed), on 16 × 16 tiles.
//
// Layouts. hdp = hd rounded up to 32 (a tile's reduction depth), hdw = hdp/2
// words; Tp = T rounded up to the tile of 64 (Tq's for Q and dO, Tk's for K
// and V: the sdpa routes' queries and keys may differ in number, Dims). Each
// head's inputs are first packed once (in parallel over heads, O(T · hd)
// work) into zero-padded copies, so that every operand of every product is a
// plain tile load:
//   QR, dOR (Tp, hdw)     rows of words (Q, dO as A operands)
//   KT, VT  (Tp/64, hdw, 64)    dim pairs × tokens (Kᵀ, Vᵀ as B operands)
//   VP, KP  (Tp/2, hdp)         token pairs × dims (V, K as B operands)
//   QtP, dOtP (Tp/64, hdp, 32)  dims × token pairs (Qᵀ, dOᵀ as A operands)
// (the transposed ones in tiles of 64 tokens: rows a few hundred bytes apart,
// not Tp words, which at T = 4096 put every row of a tile in one cache set)
// The weights are rounded to bf16 straight into the layout their product
// wants: P and dS rows (A operands) and P ⊙ Z, dS with query pairs
// interleaved (B operands).
//
// Forward, per (b, h, query tile of 64), heaviest first; keys in blocks of 128:
//   S (64, 128)   = Q_tile Kᵀ_block                A: QR, B: KT (two tiles of 64)
//   online softmax along each row, in base 2 (the row's max, α, l)
//   O (64, hdp)   = α ⊙ O + P V_block              A: P rows, B: VP
// Backward, per pair (key tile, query tile):
//   S = Q Kᵀ, dP = dO Vᵀ                           A: QR, dOR; B: KT, VT
//   P = 2^(c·S − lse2), dS = scale · P ⊙ (dP ⊙ Z − D)          (fp32)
//   dVᵀ (hdp, 64) += dOᵀ (P ⊙ Z)                    A: dOtP, B: P ⊙ Z query pairs
//   dKᵀ (hdp, 64) += Qᵀ dS                          A: QtP,  B: dS query pairs
//   dQ  (64, hdp) += dS K                           A: dS rows, B: KP
// (dK and dV accumulate transposed, so that P and dS never need a
// transpose; they are transposed once when rounded into dk and dv.)
// An additive mask (sdpa's attn_mask, AdditiveMask): its 64 x 64 tiles are
// classified once a call (TileMask: any open value? any not 0?). A tile with
// no open key is skipped, forward and backward (its weights are exactly 0); a
// forward block with a mask value to add takes its scores to base 2 in place
// (c·S + log2(e)·mask) before the softmax, and the backward adds the same to
// recompute P. A row whose keys are all closed ends with l = 0: output 0, lse
// -inf, and adds nothing to the gradients.
// Threads and orders are the sdpa kernel's backward's: whole heads per thread
// when there are at least two per thread, else key-tile tasks (dK, dV) and
// query-tile tasks (dQ) that recompute S and dP; every accumulator sees its
// products in one order either way, so the bits do not depend on the
// thread count. Causal tiles on the diagonal are computed whole and masked.
// The vector helpers (exp2, masks, rounding into words, widening loads,
// horizontal reductions) are shared with the DotEngine's packing: avx512_bf16-inl.h.
// Grouped-query heads (SdpaExtras::Hkv): K and V are packed once per
// key/value head and read by each query head of its group; backward's units
// are key/value heads, whose dK and dV sum over the group's query heads in
// order (heads outer, query tiles inner), in either schedule.
// Memory: the packed copies (3 · Tp · hdp bf16 per head forward, 7 backward;
// K and V ones per key/value head) and O(tile) per thread, plus the
// whole-head dQ (G · Tp · hdp fp32 per thread, G query heads per key/value head).
#include "kernels/flash_attention_amx.h"

#include <hwy/aligned_allocator.h>
#include <immintrin.h>
#include <sys/mman.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <mutex>
#include <new>
#include <vector>

#include "attn/cpu.h"
#include "attn/tensor.h"
#include "cpu/amx_tiles.h"
#include "kernels/avx512_bf16-inl.h"
#include "kernels/philox.h"
#include "kernels/tile_mask-inl.h"

#ifdef _OPENMP
#include <omp.h>
#endif

namespace attn::kernels::amx {

// The CPU, the OS (XCR0) and Linux's tile permission: cpu::has_amx_bf16()
// (attn/cpu.h, one request per process); the kernels' element-wise work
// also uses AVX512-BF16.
bool amx_usable() {
  static const bool usable = cpu::has_amx_bf16() && cpu::has_avx512_bf16();
  return usable;
}

namespace {

using Words = hwy::AlignedFreeUniquePtr<uint32_t[]>;
using Floats = hwy::AlignedFreeUniquePtr<float[]>;
Words words(size_t n) { return hwy::AllocateAligned<uint32_t>(std::max<size_t>(n, 1)); }
Floats floats(size_t n) { return hwy::AllocateAligned<float>(std::max<size_t>(n, 1)); }

constexpr size_t kN = 16;    // fp32 lanes of a 512-bit vector
constexpr size_t kB = 64;    // query and key tile (rows of S)
constexpr size_t kBw = 32;   // words of a row of 64 bf16
constexpr size_t kBc = 128;  // the forward's key block: two tiles of 64 between rescales of O
constexpr size_t kBcw = 64;  // words of a row of 128 bf16
constexpr float kLog2e = 1.44269504088896340736f;
constexpr float kLn2 = 0.69314718055994530942f;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

size_t RoundUp(size_t x, size_t m) { return (x + m - 1) / m * m; }

int MaxThreads() {
#ifdef _OPENMP
  return omp_get_max_threads();
#else
  return 1;
#endif
}

// The sizes of one problem's packed operands: Tq queries (p.T), Tk keys
// (SdpaExtras::Tk, or p.T), each rounded up to the tile (Tqp, Tkp); which
// keys a query sees: causal, key j <= i + delta (delta = Tk - Tq when the
// causal pattern is aligned bottom-right, else 0); and the heads: H query
// heads reading Hkv key/value heads (SdpaExtras::Hkv, or H), G = H / Hkv per
// group. Packed query-side operands (Q, dO, D, lse) are per query head q(b,
// h), those of K and V per key/value head kv(b, h).
struct Dims {
  size_t Tq, Tk, Tqp, Tkp, hd, hdp, hdw;
  bool causal;
  int64_t delta;
  int64_t H, Hkv, G;
  Dims(const FlashAttentionParams& p, const SdpaExtras& x)
      : Tq(size_t(p.T)),
        Tk(size_t(x.Tk > 0 ? x.Tk : p.T)),
        Tqp(RoundUp(Tq, kB)),
        Tkp(RoundUp(Tk, kB)),
        hd(size_t(p.hd)),
        hdp(RoundUp(size_t(p.hd), 32)),
        hdw(RoundUp(size_t(p.hd), 32) / 2),
        causal(p.causal),
        delta(x.bottom_right ? int64_t(Tk) - int64_t(Tq) : 0),
        H(p.H),
        Hkv(x.Hkv > 0 ? x.Hkv : p.H),
        G(H / Hkv) {}
  size_t q(int64_t b, int64_t h) const { return size_t(b * H + h); }
  size_t kv(int64_t b, int64_t h) const { return size_t(b * Hkv + h / G); }
  // Words of a head's packed query-side and key-side operands ((Tp, hdw), (hdw, Tp), (Tp/2, hdp),
  // ...).
  size_t q_rows() const { return Tqp * hdw; }
  size_t k_rows() const { return Tkp * hdw; }
  // The keys [0, end) that query i sees.
  size_t KeyEnd(size_t i) const {
    if (!causal) return Tk;
    return size_t(std::clamp<int64_t>(int64_t(i) + delta + 1, 0, int64_t(Tk)));
  }
  // The first query tile that sees key j0 (queries i >= j0 - delta, causal).
  size_t FirstQueryTile(size_t j0) const {
    if (!causal) return 0;
    return size_t(std::max<int64_t>(0, int64_t(j0) - delta)) / kB * kB;
  }
};

}  // namespace

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,fma,amx-tile,amx-bf16")
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

// ---- the product ------------------------------------------------------------------------------

// Tiles: C 0 1 / 2 3, A 4 5, B 6 7.
#define ATTN_AMX_C_IN(t, ptr)                         \
  do {                                                \
    if constexpr (kAccumulate) {                      \
      _tile_loadd(t, ptr, long(ldc * sizeof(float))); \
    } else {                                          \
      _tile_zero(t);                                  \
    }                                                 \
  } while (0)

template <bool kAccumulate>
__attribute__((noinline)) void tile_gemm(size_t M, size_t N, size_t K, const uint32_t* A,
                                         size_t lda, const uint32_t* B, size_t ldb, float* C,
                                         size_t ldc) {
  asm volatile("" ::: "memory");  // tile loads are not known to the compiler to read memory
  const long sa = long(lda * 4), sb = long(ldb * 4), sc = long(ldc * 4);
  size_t m0 = 0;
  for (; m0 + 32 <= M; m0 += 32) {
    float* c0 = C + m0 * ldc;
    float* c1 = c0 + 16 * ldc;
    const uint32_t* a0 = A + m0 * lda;
    const uint32_t* a1 = a0 + 16 * lda;
    size_t n0 = 0;
    for (; n0 + 32 <= N; n0 += 32) {
      ATTN_AMX_C_IN(0, c0 + n0);
      ATTN_AMX_C_IN(1, c0 + n0 + 16);
      ATTN_AMX_C_IN(2, c1 + n0);
      ATTN_AMX_C_IN(3, c1 + n0 + 16);
      for (size_t k0 = 0; k0 < K; k0 += 16) {
        _tile_loadd(4, a0 + k0, sa);
        _tile_loadd(5, a1 + k0, sa);
        _tile_loadd(6, B + k0 * ldb + n0, sb);
        _tile_loadd(7, B + k0 * ldb + n0 + 16, sb);
        _tile_dpbf16ps(0, 4, 6);
        _tile_dpbf16ps(1, 4, 7);
        _tile_dpbf16ps(2, 5, 6);
        _tile_dpbf16ps(3, 5, 7);
      }
      _tile_stored(0, c0 + n0, sc);
      _tile_stored(1, c0 + n0 + 16, sc);
      _tile_stored(2, c1 + n0, sc);
      _tile_stored(3, c1 + n0 + 16, sc);
    }
    if (n0 < N) {
      ATTN_AMX_C_IN(0, c0 + n0);
      ATTN_AMX_C_IN(2, c1 + n0);
      for (size_t k0 = 0; k0 < K; k0 += 16) {
        _tile_loadd(4, a0 + k0, sa);
        _tile_loadd(5, a1 + k0, sa);
        _tile_loadd(6, B + k0 * ldb + n0, sb);
        _tile_dpbf16ps(0, 4, 6);
        _tile_dpbf16ps(2, 5, 6);
      }
      _tile_stored(0, c0 + n0, sc);
      _tile_stored(2, c1 + n0, sc);
    }
  }
  if (m0 < M) {  // 16 rows left
    float* c0 = C + m0 * ldc;
    const uint32_t* a0 = A + m0 * lda;
    size_t n0 = 0;
    for (; n0 + 32 <= N; n0 += 32) {
      ATTN_AMX_C_IN(0, c0 + n0);
      ATTN_AMX_C_IN(1, c0 + n0 + 16);
      for (size_t k0 = 0; k0 < K; k0 += 16) {
        _tile_loadd(4, a0 + k0, sa);
        _tile_loadd(6, B + k0 * ldb + n0, sb);
        _tile_loadd(7, B + k0 * ldb + n0 + 16, sb);
        _tile_dpbf16ps(0, 4, 6);
        _tile_dpbf16ps(1, 4, 7);
      }
      _tile_stored(0, c0 + n0, sc);
      _tile_stored(1, c0 + n0 + 16, sc);
    }
    if (n0 < N) {
      ATTN_AMX_C_IN(0, c0 + n0);
      for (size_t k0 = 0; k0 < K; k0 += 16) {
        _tile_loadd(4, a0 + k0, sa);
        _tile_loadd(6, B + k0 * ldb + n0, sb);
        _tile_dpbf16ps(0, 4, 6);
      }
      _tile_stored(0, c0 + n0, sc);
    }
  }
}
#undef ATTN_AMX_C_IN

template void tile_gemm<false>(size_t, size_t, size_t, const uint32_t*, size_t, const uint32_t*,
                               size_t, float*, size_t);
template void tile_gemm<true>(size_t, size_t, size_t, const uint32_t*, size_t, const uint32_t*,
                              size_t, float*, size_t);

namespace {

// The vector helpers of both bf16 kernels (avx512_bf16-inl.h).
using avx512::Elements32;
using avx512::Exp2;
using avx512::HMax;
using avx512::HSum;
using avx512::InterleaveIndex;
using avx512::InterleaveToWords;
using avx512::LanesBelow;
using avx512::LoadWidened;
using avx512::RowToWords;

// ---- packing: once per head, O(T · hd)
// -----------------------------------------------------------

// dst (Tp, hdw), Tp = n rounded up to the tile: row r < n is x's row r (hd
// bf16) zero-padded to hdp; rows >= n are zero.
void PackRows(uint32_t* dst, const uint16_t* x, size_t stride, size_t n, const Dims& d) {
  auto* out = reinterpret_cast<uint16_t*>(dst);
  for (size_t r = 0; r < RoundUp(n, kB); ++r)
    for (size_t c0 = 0; c0 < d.hdp; c0 += 32) {
      const __m512i v = r < n ? _mm512_maskz_loadu_epi16(Elements32(c0, d.hd), x + r * stride + c0)
                              : _mm512_setzero_si512();
      _mm512_storeu_si512(out + r * d.hdp + c0, v);
    }
}

// dst (Tp/2, hdp): dst[p · hdp + c] = (x[2p][c], x[2p+1][c]); zero past hd and past n.
void PackPairs(uint32_t* dst, const uint16_t* x, size_t stride, size_t n, const Dims& d) {
  const __m512i idx = InterleaveIndex();
  for (size_t pr = 0; pr < RoundUp(n, kB) / 2; ++pr) {
    const uint16_t* a = x + 2 * pr * stride;
    for (size_t c0 = 0; c0 < d.hdp; c0 += kN) {
      const __mmask16 dims = LanesBelow(c0, d.hd);
      const __m256i va =
          2 * pr < n ? _mm256_maskz_loadu_epi16(dims, a + c0) : _mm256_setzero_si256();
      const __m256i vb =
          2 * pr + 1 < n ? _mm256_maskz_loadu_epi16(dims, a + stride + c0) : _mm256_setzero_si256();
      const __m512i both = _mm512_inserti64x4(_mm512_castsi256_si512(va), vb, 1);
      _mm512_storeu_si512(dst + pr * d.hdp + c0, _mm512_permutexvar_epi16(idx, both));
    }
  }
}

// dst[c · ldd + r] = src[r · lds + c] for r < rows (a multiple of 16), c < cols.
void TransposeWords(uint32_t* dst, size_t ldd, const uint32_t* src, size_t lds, size_t rows,
                    size_t cols) {
  const __m512i offsets =
      _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                         _mm512_set1_epi32(int(lds)));
  for (size_t r0 = 0; r0 < rows; r0 += kN)
    for (size_t c = 0; c < cols; ++c)
      _mm512_storeu_si512(dst + c * ldd + r0,
                          _mm512_i32gather_epi32(offsets, src + r0 * lds + c, 4));
}

// Rows (Tp, hdw) into tiles of 64 tokens transposed: tile t at t · 64 · hdw is (hdw, 64).
void TransposeTiles(uint32_t* dst, const uint32_t* rows, size_t Tp, const Dims& d) {
  for (size_t t0 = 0; t0 < Tp; t0 += kB)
    TransposeWords(dst + t0 * d.hdw, kB, rows + t0 * d.hdw, d.hdw, kB, d.hdw);
}
// Token pairs (Tp/2, hdp) into tiles of 32 pairs transposed: tile t at t · 64 · hdw is (hdp, 32).
void TransposePairTiles(uint32_t* dst, const uint32_t* pairs, size_t Tp, const Dims& d) {
  for (size_t t0 = 0; t0 < Tp; t0 += kB)
    TransposeWords(dst + t0 * d.hdw, kBw, pairs + t0 * d.hdw, d.hdp, kBw, d.hdp);
}

// Philox noise of query i for keys j0 .. j0 + 63: block m serves keys j0 + 4m .. j0 + 4m + 3.
void NoiseRow(float* z, const DropoutRule& rule, uint64_t seed, int64_t b, int64_t h, size_t i,
              size_t j0) {
  constexpr size_t kBlocks = kB / 4;
  alignas(64) uint32_t x[4][kBlocks];
  for (size_t m = 0; m < kBlocks; ++m) {
    x[0][m] = uint32_t(j0 / 4 + m), x[1][m] = uint32_t(i);
    x[2][m] = uint32_t(h), x[3][m] = uint32_t(b);
  }
  uint32_t k0, k1;
  philox_key(seed, k0, k1);
  for (int round = 0; round < kPhiloxRounds; ++round) {
    for (size_t m = 0; m < kBlocks; ++m) philox_round(x[0][m], x[1][m], x[2][m], x[3][m], k0, k1);
    philox_bump_key(k0, k1);
  }
  for (size_t m = 0; m < kBlocks; ++m)
    for (size_t u = 0; u < 4; ++u) z[4 * m + u] = rule.noise(x[u][m]);
}

// Keys j0 .. j0 + width - 1 that query i sees: those below Tk and (causal) up to i + delta.
size_t KeysSeen(const Dims& d, size_t i, size_t j0, size_t width = kB) {
  const size_t end = d.KeyEnd(i);
  return end > j0 ? std::min(width, end - j0) : 0;
}

// ---- the mask -----------------------------------------------------------------------------------

// Its 64 x 64 tiles, the kernels' query and key tiles (tile_mask-inl.h).
using avx512::TileMask;

// The mask's tile classes, or nullptr without a mask.
std::unique_ptr<const TileMask> TilesOf(const AdditiveMask& m, const FlashAttentionParams& p,
                                        const Dims& d) {
  return m.data ? std::make_unique<const TileMask>(m, p.B, p.H, d.Tq, d.Tk) : nullptr;
}

// ---- forward ------------------------------------------------------------------------------------

// A block of words for a call's packed operands, on 2 MB pages where Linux
// grants them (madvise) when it fills at least half of one.
struct Block {
  uint32_t* data = nullptr;
  size_t bytes = 0;
  explicit Block(size_t n) {
    constexpr size_t kHuge = size_t{2} << 20;
    bytes = std::max<size_t>(n, 1) * sizeof(uint32_t);
    if (bytes >= kHuge / 2) {
      bytes = RoundUp(bytes, kHuge);
      data = static_cast<uint32_t*>(std::aligned_alloc(kHuge, bytes));
#ifdef MADV_HUGEPAGE
      if (data) madvise(data, bytes, MADV_HUGEPAGE);
#endif
    } else {
      bytes = RoundUp(bytes, 64);
      data = static_cast<uint32_t*>(std::aligned_alloc(64, bytes));
    }
    if (!data) throw std::bad_alloc();
  }
  Block(const Block&) = delete;
  Block& operator=(const Block&) = delete;
  ~Block() { std::free(data); }
};

// The most bytes of packed operands kept from one call for the next.
constexpr size_t kKeptBytesMax = size_t{32} << 20;

std::mutex& KeptMutex() {
  static std::mutex mu;
  return mu;
}
std::unique_ptr<Block>& Kept() {
  static std::unique_ptr<Block> kept;
  return kept;
}

// n words that every thread reads, written once a call. Fresh pages cost a
// fault each (~1 us a 4 KB page: locks, LRU, memcg, beyond the clearing; a
// call's buffer was fresh memory every time, glibc handing it back at the
// end: ~20% of the forward at B = 1, 12 heads of 64, T = 1024; 2 MB pages
// still clear 2 MB, ~7% at T = 256). So the block of the last call, up to
// kKeptBytesMax, is kept for the next: a call that fits takes it (one at a
// time; a concurrent call allocates its own) and the larger of the two is kept after.
class PackedWords {
 public:
  explicit PackedWords(size_t n) {
    {
      const std::lock_guard<std::mutex> lock(KeptMutex());
      std::unique_ptr<Block>& kept = Kept();
      if (kept && kept->bytes >= n * sizeof(uint32_t)) block_ = std::move(kept);
    }
    if (!block_) block_ = std::make_unique<Block>(n);
  }
  PackedWords(const PackedWords&) = delete;
  PackedWords& operator=(const PackedWords&) = delete;
  ~PackedWords() {
    if (block_->bytes > kKeptBytesMax) return;
    const std::lock_guard<std::mutex> lock(KeptMutex());
    std::unique_ptr<Block>& kept = Kept();
    if (!kept || kept->bytes < block_->bytes) kept = std::move(block_);
  }
  uint32_t* get() const { return block_->data; }

 private:
  std::unique_ptr<Block> block_;
};

struct ForwardPacked {
  PackedWords all;           // QR, KT, VP one after the other
  uint32_t *QR, *KT, *VP;    // QR (B·H, q_rows), KT and VP (B·Hkv, k_rows)
  ForwardPacked(size_t BH, size_t BHkv, const Dims& d)
      : all(BH * d.q_rows() + 2 * BHkv * d.k_rows()),
        QR(all.get()),
        KT(QR + BH * d.q_rows()),
        VP(KT + BHkv * d.k_rows()) {}
};

void ForwardTile(uint16_t* out, float* lse, const ForwardStrides& st, const ForwardPacked& pk,
                 const FlashAttentionParams& p, const Dims& d, const TileMask* mask, int64_t b,
                 int64_t h, size_t i0, float* S, uint32_t* Pw, float* O, float* m, float* l,
                 float* z) {
  alignas(64) float row_max[kB], alpha[kB];
  const size_t in = std::min(kB, d.Tq - i0);
  const uint32_t* QR = pk.QR + d.q(b, h) * d.q_rows();
  const uint32_t* KT = pk.KT + d.kv(b, h) * d.k_rows();
  const uint32_t* VP = pk.VP + d.kv(b, h) * d.k_rows();
  const DropoutRule rule(p.dropout_p);
  std::fill(O, O + kB * d.hdp, 0.0f);
  std::fill(m, m + kB, kNegInf);  // rows past Tq too: their α is 0 (2^(-inf − 0))
  std::fill(l, l + kB, 0.0f);
  std::memset(Pw, 0, kB * kBcw * sizeof(uint32_t));  // rows >= in stay zero
  const float c = p.scale * kLog2e;
  const __m512 cv = _mm512_set1_ps(c);
  const size_t key_end = d.KeyEnd(i0 + in - 1);  // the tile's last query sees the most
  for (size_t j0 = 0; j0 < key_end; j0 += kBc) {
    // S (64, 128) = Q_tile Kᵀ_tile, by halves of 64 keys (the second one only
    // if it has a key). With a mask: a half it hides wholly is -inf without a
    // product (a block of two such halves is skipped: it changes nothing), a
    // hidden second half is dropped, and the block's scores are taken to base 2
    // with the mask added in place (c·S + log2(e)·mask), so c becomes 1 below.
    size_t halves = j0 + kB < key_end ? 2 : 1;
    bool hidden[2] = {false, false}, base2 = false;
    if (mask) {
      for (size_t half = 0; half < halves; ++half) {
        hidden[half] = mask->Hidden(b, h, i0, j0 + half * kB);
        base2 = base2 || hidden[half] || mask->Adds(b, h, i0, j0 + half * kB);
      }
      if (hidden[0] && (halves == 1 || hidden[1])) continue;
      if (halves == 2 && hidden[1]) halves = 1;
    }
    const size_t nv = 4 * halves;
    for (size_t half = 0; half < halves; ++half) {
      if (hidden[half]) {
        for (size_t ii = 0; ii < kB; ++ii) std::fill_n(S + ii * kBc + half * kB, kB, kNegInf);
        continue;
      }
      tile_gemm<false>(kB, kB, d.hdw, QR + i0 * d.hdw, d.hdw, KT + (j0 + half * kB) * d.hdw, kB,
                       S + half * kB, kBc);
    }
    if (base2) {
      const __m512 l2e = _mm512_set1_ps(kLog2e);
      for (size_t ii = 0; ii < in; ++ii) {
        const size_t seen = std::min(KeysSeen(d, i0 + ii, j0, kBc), kB * halves);
        const float* row = mask->Row(b, h, i0 + ii);
        float* s = S + ii * kBc;
        for (size_t v = 0; v * kN < seen; ++v) {
          if (hidden[v / 4]) continue;
          const __m512 add =
              _mm512_mul_ps(l2e, mask->Load(row, j0 + v * kN, LanesBelow(v * kN, seen)));
          _mm512_storeu_ps(s + v * kN, _mm512_fmadd_ps(_mm512_loadu_ps(s + v * kN), cv, add));
        }
      }
    }
    const float cb = base2 ? 1.0f : c;  // S's multiplier into base 2
    const __m512 cbv = _mm512_set1_ps(cb);
    // Each row's max over the keys it sees (>= 1 without a mask: key j0 <= i),
    // in base 2; then the new running max and α = 2^(m_old − m_new) for 16 rows
    // at once. A row whose keys so far are all closed keeps m = -inf: its α and
    // weights are 2^NaN and 2^-inf, both exactly 0 (Exp2), and so are its l and O.
    for (size_t ii = 0; ii < kB; ++ii) {
      if (ii >= in) {
        row_max[ii] = 0.0f;  // rows past T: anything finite
        continue;
      }
      const size_t seen = std::min(KeysSeen(d, i0 + ii, j0, kBc), kB * halves);
      const float* s = S + ii * kBc;
      __m512 mx = _mm512_set1_ps(kNegInf);
      for (size_t v = 0; v * kN < seen; ++v)  // seen <= 16 · nv
        mx = _mm512_mask_max_ps(mx, LanesBelow(v * kN, seen), mx, _mm512_loadu_ps(s + v * kN));
      row_max[ii] = seen ? HMax(mx) * cb : kNegInf;  // no key yet (bottom-right): as all closed
    }
    for (size_t v0 = 0; v0 < kB; v0 += kN) {
      const __m512 m_old = _mm512_loadu_ps(m + v0);
      const __m512 m_new = _mm512_max_ps(m_old, _mm512_loadu_ps(row_max + v0));
      _mm512_storeu_ps(alpha + v0, Exp2(_mm512_sub_ps(m_old, m_new)));  // 0 on the first tile
      _mm512_storeu_ps(m + v0, m_new);
    }
    // P = 2^(c·S − m) on the keys each row sees: summed into l (before
    // dropout: l is the softmax denominator), times Z, rounded to bf16 rows.
    for (size_t ii = 0; ii < in; ++ii) {
      const size_t i = i0 + ii, seen = std::min(KeysSeen(d, i, j0, kBc), kB * halves);
      const float* s = S + ii * kBc;
      const __m512 mv = _mm512_set1_ps(m[ii]);
      __m512 pv[8], sum = _mm512_setzero_ps();
      for (size_t v = 0; v < nv; ++v) {
        if (v * kN >= seen) {  // past the diagonal or T: no exponentials to take
          pv[v] = _mm512_setzero_ps();
          continue;
        }
        pv[v] = _mm512_maskz_mov_ps(LanesBelow(v * kN, seen),
                                    Exp2(_mm512_fmsub_ps(_mm512_loadu_ps(s + v * kN), cbv, mv)));
        sum = _mm512_add_ps(sum, pv[v]);
      }
      l[ii] = alpha[ii] * l[ii] + HSum(sum);
      if (rule.active()) {
        for (size_t half = 0; half < halves; ++half)
          NoiseRow(z + half * kB, rule, p.dropout_seed, b, h, i, j0 + half * kB);
        for (size_t v = 0; v < nv; ++v) pv[v] = _mm512_mul_ps(pv[v], _mm512_loadu_ps(z + v * kN));
      }
      for (size_t v = 0; v < nv; v += 2)
        _mm512_storeu_si512(Pw + ii * kBcw + v / 2 * kN, RowToWords(pv[v], pv[v + 1]));
      if (alpha[ii] != 1.0f) {
        const __m512 av = _mm512_set1_ps(alpha[ii]);
        float* o = O + ii * d.hdp;
        for (size_t c0 = 0; c0 < d.hdp; c0 += kN)
          _mm512_storeu_ps(o + c0, _mm512_mul_ps(av, _mm512_loadu_ps(o + c0)));
      }
    }
    // O (64, hdp) += P (64, 64 · halves) V_tile
    tile_gemm<true>(kB, d.hdp, kBw * halves, Pw, kBcw, VP + j0 / 2 * d.hdp, d.hdp, O, d.hdp);
  }
  // O /= l, rounded to bf16; lse = (m + log2 l) · ln 2. A row that saw only
  // closed keys, or none (l = 0, m = -inf), gets 0 and -inf.
  uint16_t* o_head = out + b * st.out.b + h * st.out.h;
  float* lse_head = lse + b * st.lse.b + h * st.lse.h;
  for (size_t ii = 0; ii < in; ++ii) {
    const size_t t = i0 + ii;
    const float inv_l = l[ii] > 0.0f ? 1.0f / l[ii] : 0.0f;
    uint16_t* oi = o_head + int64_t(t) * st.out.t;
    const float* o = O + ii * d.hdp;
    for (size_t c0 = 0; c0 < d.hd; c0 += kN) {
      const __m512 x = _mm512_mul_ps(_mm512_loadu_ps(o + c0), _mm512_set1_ps(inv_l));
      const __m256i y = (__m256i)_mm512_cvtneps_pbh(x);
      _mm256_mask_storeu_epi16(oi + c0, LanesBelow(c0, d.hd), y);
    }
    lse_head[int64_t(t) * st.lse.t] = (m[ii] + std::log2(l[ii])) * kLn2;
  }
}

// ---- backward -----------------------------------------------------------------------------------

struct BackwardPacked {
  PackedWords all;                  // all of the below, one after the other
  uint32_t *QR, *dOR, *QtP, *dOtP;  // (B·H, q_rows) each
  uint32_t *KT, *VT, *KP;           // (B·Hkv, k_rows) each
  float *D, *lse2;                  // (B·H, Tq) each (Tq rounded up to 16 apart)
  BackwardPacked(size_t BH, size_t BHkv, const Dims& d)
      : all(4 * BH * d.q_rows() + 3 * BHkv * d.k_rows() + 2 * BH * RoundUp(d.Tq, kN)),
        QR(all.get()),
        dOR(QR + BH * d.q_rows()),
        QtP(dOR + BH * d.q_rows()),
        dOtP(QtP + BH * d.q_rows()),
        KT(dOtP + BH * d.q_rows()),
        VT(KT + BHkv * d.k_rows()),
        KP(VT + BHkv * d.k_rows()),
        D(reinterpret_cast<float*>(KP + BHkv * d.k_rows())),
        lse2(D + BH * RoundUp(d.Tq, kN)) {}
};

struct BackwardScratch {
  Floats S, dP;     // (64, 64)
  Words dSR;        // (64, 32)   dS rows in bf16
  Words PzV, dSV;   // (32, 64)   P ⊙ Z, dS: query pairs × keys
  Floats dKt, dVt;  // (hdp, 64)  transposed accumulators
  Floats dQ;        // (G, Tp, hdp) a group's whole-head dQ, or (64, hdp)
  Floats z;         // (2, 64)    two rows of noise
  BackwardScratch(size_t q_rows, const Dims& d)
      : S(floats(kB * kB)),
        dP(floats(kB * kB)),
        dSR(words(kB * kBw)),
        PzV(words(kB / 2 * kB)),
        dSV(words(kB / 2 * kB)),
        dKt(floats(d.hdp * kB)),
        dVt(floats(d.hdp * kB)),
        dQ(floats(q_rows * d.hdp)),
        z(floats(2 * kB)) {}
};

// One (key tile j0, query tile i0): recompute P and dS, accumulate whichever of
// dKt, dVt (hdp, 64) and dQ (64, hdp) are given.
void TilePair(const BackwardPacked& pk, const FlashAttentionParams& p, const Dims& d,
              const TileMask* mask, int64_t b, int64_t h, size_t j0, size_t i0, BackwardScratch& s,
              float* dKt, float* dVt, float* dQ) {
  if (mask && mask->Hidden(b, h, i0, j0)) return;  // every weight exactly 0: nothing to add
  const bool adds = mask && mask->Adds(b, h, i0, j0);
  const size_t bh = d.q(b, h), in = std::min(kB, d.Tq - i0);
  const size_t off = bh * d.q_rows(), off_kv = d.kv(b, h) * d.k_rows();
  const float* D = pk.D + bh * RoundUp(d.Tq, kN);
  const float* lse2 = pk.lse2 + bh * RoundUp(d.Tq, kN);
  const DropoutRule rule(p.dropout_p);
  float* S = s.S.get();
  float* dP = s.dP.get();
  tile_gemm<false>(kB, kB, d.hdw, pk.QR + off + i0 * d.hdw, d.hdw, pk.KT + off_kv + j0 * d.hdw, kB,
                   S, kB);
  tile_gemm<false>(kB, kB, d.hdw, pk.dOR + off + i0 * d.hdw, d.hdw, pk.VT + off_kv + j0 * d.hdw, kB,
                   dP, kB);
  const __m512 cv = _mm512_set1_ps(p.scale * kLog2e), l2e = _mm512_set1_ps(kLog2e);
  const __m512 scale_v = _mm512_set1_ps(p.scale);
  const size_t pairs = (in + 1) / 2;
  for (size_t pr = 0; pr < pairs; ++pr) {
    __m512 pz[2][4], ds[2][4];
    for (size_t t = 0; t < 2; ++t) {
      const size_t ii = 2 * pr + t, i = i0 + ii;
      if (ii >= in) {
        for (size_t v = 0; v < 4; ++v) pz[t][v] = ds[t][v] = _mm512_setzero_ps();
        continue;
      }
      const size_t seen = KeysSeen(d, i, j0);
      const __m512 li = _mm512_set1_ps(lse2[i]), Di = _mm512_set1_ps(D[i]);
      if (rule.active()) NoiseRow(s.z.get() + t * kB, rule, p.dropout_seed, b, h, i, j0);
      for (size_t v = 0; v < 4; ++v) {
        if (v * kN >= seen) {  // past the diagonal or T
          pz[t][v] = ds[t][v] = _mm512_setzero_ps();
          continue;
        }
        const size_t at = ii * kB + v * kN;
        const __mmask16 valid = LanesBelow(v * kN, seen);
        // P = 2^(c·S − lse2), or with the mask 2^((c·S + log2(e)·mask) − lse2),
        // the forward's base-2 score (a closed key's is -inf: P = 0).
        const __m512 pv =
            adds ? Exp2(_mm512_sub_ps(
                       _mm512_fmadd_ps(
                           _mm512_loadu_ps(S + at), cv,
                           _mm512_mul_ps(l2e, mask->Load(mask->Row(b, h, i), j0 + v * kN, valid))),
                       li))
                 : Exp2(_mm512_fmsub_ps(_mm512_loadu_ps(S + at), cv, li));
        __m512 dpv = _mm512_loadu_ps(dP + at), pzv = pv;
        if (rule.active()) {
          const __m512 zv = _mm512_loadu_ps(s.z.get() + t * kB + v * kN);
          dpv = _mm512_mul_ps(dpv, zv);
          pzv = _mm512_mul_ps(pv, zv);
        }
        const __m512 dsv = _mm512_mul_ps(_mm512_mul_ps(pv, _mm512_sub_ps(dpv, Di)), scale_v);
        pz[t][v] = _mm512_maskz_mov_ps(valid, pzv);
        ds[t][v] = _mm512_maskz_mov_ps(valid, dsv);
      }
    }
    for (size_t v = 0; v < 4; ++v) {
      _mm512_storeu_si512(s.PzV.get() + pr * kB + v * kN, InterleaveToWords(pz[0][v], pz[1][v]));
      _mm512_storeu_si512(s.dSV.get() + pr * kB + v * kN, InterleaveToWords(ds[0][v], ds[1][v]));
    }
    for (size_t t = 0; t < 2; ++t) {
      uint32_t* row = s.dSR.get() + (2 * pr + t) * kBw;
      _mm512_storeu_si512(row, RowToWords(ds[t][0], ds[t][1]));
      _mm512_storeu_si512(row + kN, RowToWords(ds[t][2], ds[t][3]));
    }
  }
  if (pairs < kB / 2) {  // query rows past T weigh nothing
    std::memset(s.PzV.get() + pairs * kB, 0, (kB / 2 - pairs) * kB * sizeof(uint32_t));
    std::memset(s.dSV.get() + pairs * kB, 0, (kB / 2 - pairs) * kB * sizeof(uint32_t));
    std::memset(s.dSR.get() + 2 * pairs * kBw, 0, (kB - 2 * pairs) * kBw * sizeof(uint32_t));
  }
  if (dVt)  // dVᵀ (hdp, 64) += dOᵀ (P ⊙ Z)
    tile_gemm<true>(d.hdp, kB, kBw, pk.dOtP + off + i0 * d.hdw, kBw, s.PzV.get(), kB, dVt,
                    kB);
  if (dKt)  // dKᵀ (hdp, 64) += Qᵀ dS
    tile_gemm<true>(d.hdp, kB, kBw, pk.QtP + off + i0 * d.hdw, kBw, s.dSV.get(), kB, dKt, kB);
  if (dQ)  // dQ (64, hdp) += dS K
    tile_gemm<true>(kB, d.hdp, kBw, s.dSR.get(), kBw, pk.KP + off_kv + j0 / 2 * d.hdp, d.hdp, dQ,
                    d.hdp);
}

// Rows [t0, t0 + n) of one head of a token-major bf16 buffer from an fp32
// accumulator: acc (n, hdp) rows, or with transposed = true acc (hdp, 64) columns.
void StoreRows(uint16_t* dst, size_t stride, const float* acc, size_t n, const Dims& d,
               bool transposed) {
  const __m512i column = _mm512_mullo_epi32(  // acc[c · 64 + r] for c = c0 .. c0 + 15
      _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
      _mm512_set1_epi32(int(kB)));
  for (size_t r = 0; r < n; ++r)
    for (size_t c0 = 0; c0 < d.hd; c0 += kN) {  // acc is hdp >= hd wide: whole vectors
      const __m512 x = transposed ? _mm512_i32gather_ps(column, acc + c0 * kB + r, 4)
                                  : _mm512_loadu_ps(acc + r * d.hdp + c0);
      _mm256_mask_storeu_epi16(dst + r * stride + c0, LanesBelow(c0, d.hd),
                               (__m256i)_mm512_cvtneps_pbh(x));
    }
}

// Σ_c x[c] · y[c] over hd bf16 each, 16 products a step in fp32.
float DotBf16(const uint16_t* x, const uint16_t* y, size_t hd) {
  __m512 sum = _mm512_setzero_ps();
  for (size_t c0 = 0; c0 < hd; c0 += kN) {
    const __mmask16 in = LanesBelow(c0, hd);
    sum = _mm512_fmadd_ps(LoadWidened(in, x + c0), LoadWidened(in, y + c0), sum);
  }
  return HSum(sum);
}

// dK, dV of key tile j0 (with dQ (Tp, hdp) given, the head's dQ accumulates too).
// dK, dV of key tile j0 of key/value head (b, hk): the group's query heads in
// order, each over its query tiles (with dQ given, (G, Tp, hdp): the group's
// whole-head dQ accumulates too).
void KeyTileTask(uint16_t* dk, uint16_t* dv, float* dQ, const BackwardStrides& st,
                 const BackwardPacked& pk, const FlashAttentionParams& p, const Dims& d,
                 const TileMask* mask, int64_t b, int64_t hk, size_t j0, BackwardScratch& s) {
  std::fill(s.dKt.get(), s.dKt.get() + d.hdp * kB, 0.0f);
  std::fill(s.dVt.get(), s.dVt.get() + d.hdp * kB, 0.0f);
  for (int64_t g = 0; g < d.G; ++g) {
    float* dQ_head = dQ ? dQ + size_t(g) * d.Tqp * d.hdp : nullptr;
    for (size_t i0 = d.FirstQueryTile(j0); i0 < d.Tq; i0 += kB)
      TilePair(pk, p, d, mask, b, hk * d.G + g, j0, i0, s, s.dKt.get(), s.dVt.get(),
               dQ_head ? dQ_head + i0 * d.hdp : nullptr);
  }
  const size_t jn = std::min(kB, d.Tk - j0);
  const int64_t t = int64_t(j0);
  StoreRows(dk + b * st.dk.b + hk * st.dk.h + t * st.dk.t, size_t(st.dk.t), s.dKt.get(), jn, d,
            true);
  StoreRows(dv + b * st.dv.b + hk * st.dv.h + t * st.dv.t, size_t(st.dv.t), s.dVt.get(), jn, d,
            true);
}

// dQ of query tile i0: its key tiles in order, the same pairs as KeyTileTask's.
void QueryTileTask(uint16_t* dq, const BackwardStrides& st, const BackwardPacked& pk,
                   const FlashAttentionParams& p, const Dims& d, const TileMask* mask, int64_t b,
                   int64_t h, size_t i0, BackwardScratch& s) {
  float* dQ = s.dQ.get();  // (64, hdp)
  std::fill(dQ, dQ + kB * d.hdp, 0.0f);
  for (size_t j0 = 0; j0 < d.Tk && d.FirstQueryTile(j0) <= i0; j0 += kB)
    TilePair(pk, p, d, mask, b, h, j0, i0, s, nullptr, nullptr, dQ);
  StoreRows(dq + b * st.dq.b + h * st.dq.h + int64_t(i0) * st.dq.t, size_t(st.dq.t), dQ,
            std::min(kB, d.Tq - i0), d, false);
}

}  // namespace

void forward(uint16_t* out, float* lse, const uint16_t* q, const uint16_t* k, const uint16_t* v,
             const FlashAttentionParams& p) {
  forward(out, lse, q, k, v, p, token_major_strides(p));
}

void forward(uint16_t* out, float* lse, const uint16_t* q, const uint16_t* k, const uint16_t* v,
             const FlashAttentionParams& p, const ForwardStrides& st, const SdpaExtras& x) {
  const Dims d(p, x);
  const std::unique_ptr<const TileMask> tiles_of_mask = TilesOf(x.mask, p, d);
  const int64_t BH = p.B * d.H, BHkv = p.B * d.Hkv;
  const ForwardPacked pk(size_t(BH), size_t(BHkv), d);
#pragma omp parallel
  {
    auto rows = words(d.k_rows());
#pragma omp for schedule(static) nowait
    for (int64_t bh = 0; bh < BH; ++bh) {
      const int64_t b = bh / p.H, h = bh % p.H;
      PackRows(pk.QR + size_t(bh) * d.q_rows(), q + b * st.q.b + h * st.q.h, size_t(st.q.t), d.Tq,
               d);
    }
#pragma omp for schedule(static)
    for (int64_t bhk = 0; bhk < BHkv; ++bhk) {
      const int64_t b = bhk / d.Hkv, hk = bhk % d.Hkv;
      const size_t off = size_t(bhk) * d.k_rows();
      PackRows(rows.get(), k + b * st.k.b + hk * st.k.h, size_t(st.k.t), d.Tk, d);
      TransposeTiles(pk.KT + off, rows.get(), d.Tkp, d);
      PackPairs(pk.VP + off, v + b * st.v.b + hk * st.v.h, size_t(st.v.t), d.Tk, d);
    }
  }
  const int64_t n_qt = int64_t(d.Tqp / kB);
#pragma omp parallel
  {
    const cpu::amx::TileScope tiles;
    auto S = floats(kB * kBc), O = floats(kB * d.hdp), m = floats(kB), l = floats(kB),
         z = floats(kBc);
    auto Pw = words(kB * kBcw);
#pragma omp for schedule(dynamic, 1)
    for (int64_t item = 0; item < BH * n_qt; ++item) {
      const int64_t qt = p.causal ? n_qt - 1 - item / BH : item / BH, bh = item % BH;
      ForwardTile(out, lse, st, pk, p, d, tiles_of_mask.get(), bh / p.H, bh % p.H, size_t(qt) * kB,
                  S.get(), Pw.get(), O.get(), m.get(), l.get(), z.get());
    }
  }
}

void backward(uint16_t* dq, uint16_t* dk, uint16_t* dv, const uint16_t* dout, const uint16_t* q,
              const uint16_t* k, const uint16_t* v, const uint16_t* out, const float* lse,
              const FlashAttentionParams& p) {
  backward(dq, dk, dv, dout, q, k, v, out, lse, p, token_major_backward_strides(p));
}

void backward(uint16_t* dq, uint16_t* dk, uint16_t* dv, const uint16_t* dout, const uint16_t* q,
              const uint16_t* k, const uint16_t* v, const uint16_t* out, const float* lse,
              const FlashAttentionParams& p, const BackwardStrides& st, const SdpaExtras& x) {
  const Dims d(p, x);
  const std::unique_ptr<const TileMask> tiles_of_mask = TilesOf(x.mask, p, d);
  const int64_t BH = p.B * d.H, BHkv = p.B * d.Hkv;
  const BackwardPacked pk(size_t(BH), size_t(BHkv), d);
#pragma omp parallel
  {
    auto tmp = words(std::max(d.q_rows(), d.k_rows()));
#pragma omp for schedule(static) nowait
    for (int64_t bh = 0; bh < BH; ++bh) {  // the query side
      const int64_t b = bh / p.H, h = bh % p.H;
      const size_t off = size_t(bh) * d.q_rows();
      const uint16_t* qh = q + b * st.q.b + h * st.q.h;
      const uint16_t* doh = dout + b * st.dout.b + h * st.dout.h;
      const uint16_t* oh = out + b * st.out.b + h * st.out.h;
      const float* lse_h = lse + b * st.lse.b + h * st.lse.h;
      const size_t qs = size_t(st.q.t), dos = size_t(st.dout.t), os = size_t(st.out.t);
      PackRows(pk.QR + off, qh, qs, d.Tq, d);
      PackRows(pk.dOR + off, doh, dos, d.Tq, d);
      PackPairs(tmp.get(), qh, qs, d.Tq, d);
      TransposePairTiles(pk.QtP + off, tmp.get(), d.Tqp, d);
      PackPairs(tmp.get(), doh, dos, d.Tq, d);
      TransposePairTiles(pk.dOtP + off, tmp.get(), d.Tqp, d);
      // D = rowsum(dO ⊙ O) from the bf16 values, and lse · log2(e). (A row
      // whose keys the mask all closes has lse -inf and scores -inf: its
      // weights are 2^NaN, exactly 0 in Exp2.)
      const size_t at = size_t(bh) * RoundUp(d.Tq, kN);
      for (size_t i = 0; i < d.Tq; ++i) {
        pk.D[at + i] = DotBf16(doh + i * dos, oh + i * os, d.hd);
        pk.lse2[at + i] = lse_h[int64_t(i) * st.lse.t] * kLog2e;
      }
    }
#pragma omp for schedule(static)
    for (int64_t bhk = 0; bhk < BHkv; ++bhk) {  // the key/value side
      const int64_t b = bhk / d.Hkv, hk = bhk % d.Hkv;
      const size_t off = size_t(bhk) * d.k_rows();
      const uint16_t* kh = k + b * st.k.b + hk * st.k.h;
      const uint16_t* vh = v + b * st.v.b + hk * st.v.h;
      const size_t ks = size_t(st.k.t), vs = size_t(st.v.t);
      PackRows(tmp.get(), kh, ks, d.Tk, d);
      TransposeTiles(pk.KT + off, tmp.get(), d.Tkp, d);
      PackRows(tmp.get(), vh, vs, d.Tk, d);
      TransposeTiles(pk.VT + off, tmp.get(), d.Tkp, d);
      PackPairs(pk.KP + off, kh, ks, d.Tk, d);
    }
  }
  const int64_t threads = MaxThreads(), n_qt = int64_t(d.Tqp / kB), n_kt = int64_t(d.Tkp / kB);
  if (!(threads > 1 && BHkv < 2 * threads)) {  // a whole key/value head (and its group) per thread
#pragma omp parallel
    {
      const cpu::amx::TileScope tiles;
      BackwardScratch s(size_t(d.G) * d.Tqp, d);
#pragma omp for schedule(dynamic, 1)
      for (int64_t bhk = 0; bhk < BHkv; ++bhk) {
        const int64_t b = bhk / d.Hkv, hk = bhk % d.Hkv;
        std::fill(s.dQ.get(), s.dQ.get() + size_t(d.G) * d.Tqp * d.hdp, 0.0f);
        for (size_t j0 = 0; j0 < d.Tk; j0 += kB)
          KeyTileTask(dk, dv, s.dQ.get(), st, pk, p, d, tiles_of_mask.get(), b, hk, j0, s);
        for (int64_t g = 0; g < d.G; ++g) {
          const int64_t h = hk * d.G + g;
          StoreRows(dq + b * st.dq.b + h * st.dq.h, size_t(st.dq.t),
                    s.dQ.get() + size_t(g) * d.Tqp * d.hdp, d.Tq, d, false);
        }
      }
    }
    return;
  }
  // Few heads: dK, dV over key tiles, then dQ over query tiles (S and dP recomputed).
#pragma omp parallel
  {
    const cpu::amx::TileScope tiles;
    BackwardScratch s(kB, d);
#pragma omp for schedule(dynamic, 1)
    for (int64_t item = 0; item < BHkv * n_kt; ++item) {
      const int64_t kt = item / BHkv, bhk = item % BHkv;
      KeyTileTask(dk, dv, nullptr, st, pk, p, d, tiles_of_mask.get(), bhk / d.Hkv, bhk % d.Hkv,
                  size_t(kt) * kB, s);
    }
#pragma omp for schedule(dynamic, 1)
    for (int64_t item = 0; item < BH * n_qt; ++item) {
      const int64_t qt = n_qt - 1 - item / BH, bh = item % BH;
      QueryTileTask(dq, st, pk, p, d, tiles_of_mask.get(), bh / p.H, bh % p.H, size_t(qt) * kB, s);
    }
  }
}

#pragma GCC diagnostic pop
#pragma GCC pop_options

}  // namespace attn::kernels::amx
