// AMX (Advanced Matrix Extensions) for the bf16 kernels: whether this process
// may use the tiles, the one tile configuration they use, and the one product
// they run, C (fp32) (+)= A (bf16) · B (bf16), on 16 × 16 fp32 tiles.
//
// The tiles. Eight registers tmm0..tmm7, each configured here as 16 rows of
// 64 bytes: a C tile is 16 × 16 fp32, an A tile 16 rows × 32 bf16 (16
// "words" of two bf16 along the reduction axis), a B tile 16 word-rows × 16
// columns, "VNNI packed": word-row p, column n holds (B[2p, n], B[2p+1, n]),
// the even index in the low half. TDPBF16PS C, A, B adds
//   C[m, n] += Σ_p A[m, 2p] · B[2p, n] + A[m, 2p+1] · B[2p+1, n]
// with bf16 products summed in fp32 (inputs and results that are denormal
// count as zero, as in the AVX512-BF16 instructions).
//
// Permission: Linux keeps the 8 KB tile state out of a process until the
// process asks for it (arch_prctl ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA);
// the grant covers the whole process and the threads it starts. Each thread
// loads the configuration (_tile_loadconfig) before its first tile
// instruction and releases the tiles (_tile_release) when done.
//
// Every function with a tile instruction is compiled under a target
// attribute, so the build stays portable; callers run them only after
// amx_usable() said yes.
#pragma once

#include <immintrin.h>

#include <cstddef>
#include <cstdint>

namespace attn::kernels::amx {

// CPUID reports AMX-TILE and AMX-BF16 and the kernel granted this process the
// tile state. Asked once per process (the first call makes the request).
bool amx_usable();

// The 64-byte configuration (palette 1): tiles 0..7 all 16 rows × 64 bytes.
struct alignas(64) TileConfig {
  uint8_t palette_id = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
  TileConfig() {
    for (int t = 0; t < 8; ++t) colsb[t] = 64, rows[t] = 16;
  }
};

// Loads the configuration on this thread for its lifetime and releases the
// tiles at the end of the scope: one per thread, inside the parallel region.
class TileScope {
 public:
  __attribute__((target("amx-tile"))) TileScope() {
    static const TileConfig config;
    asm volatile("" ::: "memory");  // the configuration is written before it is read
    _tile_loadconfig(&config);
  }
  __attribute__((target("amx-tile"))) ~TileScope() { _tile_release(); }
  TileScope(const TileScope&) = delete;
  TileScope& operator=(const TileScope&) = delete;
};

// C (M, N) = [C +] A (M, 2K) · B (2K, N) with M and N multiples of 16 and K
// (the words of the reduction) a multiple of 16: A rows of K words, lda
// words apart; B VNNI packed, K word-rows of N words, ldb words apart; C
// fp32, ldc floats apart. Blocks of 2 × 2 tiles (4 accumulators, 2 A and 2 B
// tiles), the k steps in order: the same inputs give the same bits.
template <bool kAccumulate>
void tile_gemm(size_t M, size_t N, size_t K, const uint32_t* A, size_t lda, const uint32_t* B,
               size_t ldb, float* C, size_t ldc);

extern template void tile_gemm<false>(size_t, size_t, size_t, const uint32_t*, size_t,
                                      const uint32_t*, size_t, float*, size_t);
extern template void tile_gemm<true>(size_t, size_t, size_t, const uint32_t*, size_t,
                                     const uint32_t*, size_t, float*, size_t);

}  // namespace attn::kernels::amx
