// AMX (Advanced Matrix Extensions): the one tile configuration that the AMX
// peak probe (amx_peak.cpp) and the AMX attention kernels
// (src/kernels/flash_attention_amx.cpp, whose one product is tile_gemm there)
// run with, and the scope that loads it on a thread.
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
// has_amx_bf16() (attn/cpu.h) said yes.
#pragma once

#include <immintrin.h>

#include <cstddef>
#include <cstdint>

namespace attn::cpu::amx {

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

}  // namespace attn::cpu::amx
