// The CPU's AMX bf16 peak (TDPBF16PS): the ceiling of a bf16 product on the
// tile units of Intel's Sapphire Rapids and later, beside bf16_peak.cpp's
// VDPBF16PS ceiling. Written in inline assembly (the assembler knows the AMX
// instructions; the compiler is not asked to), run only where has_amx_bf16()
// says the CPU, the OS and Linux's permission allow it; the build stays
// portable.
//
// One TDPBF16PS adds A (16 rows x 32 bf16) times B (16 rows x 16 pairs of
// bf16) into C (16 x 16 fp32): 16·16·32 products, 16384 FLOPs. Each OpenMP
// thread configures eight 16 x 64-byte tiles, keeps four accumulators C0..C3
// (tmm0..3) and two A (tmm4, 5) and two B (tmm6, 7) tiles, and runs the 2 x 2
// block C[i][j] += A[i] · B[j] for `iters` steps: four independent chains,
// which cover the instruction's throughput (one per 16 cycles on Sapphire
// Rapids) many times over its latency. Linux hands out the tile state only to
// a process that asked for it (arch_prctl ARCH_REQ_XCOMP_PERM = 0x1023,
// XFEATURE_XTILEDATA = 18); without it the first tile instruction kills the
// process, hence the check.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>

#include "attn/cpu.h"
#include "cpu/amx_tiles.h"
#include "cpu/peak_rate.h"

namespace attn::cpu {
namespace {

#if defined(__x86_64__)
float amx_chains(size_t iters, double* flops) {
  const amx::TileConfig cfg;  // tiles 0..7 of 16 rows x 64 bytes
  // A: bf16 1.0 (0x3F80); B: 2^-20 (0x3580): C grows by 2^-15 a step, stays finite.
  alignas(64) uint16_t a[16 * 32], b[16 * 32];
  for (auto& x : a) x = 0x3F80;
  for (auto& x : b) x = 0x3580;
  alignas(64) float c[4][16 * 16];
  const uint64_t stride = 64;
  asm volatile(
      "ldtilecfg (%0)\n\t"
      "tilezero %%tmm0\n\t"
      "tilezero %%tmm1\n\t"
      "tilezero %%tmm2\n\t"
      "tilezero %%tmm3\n\t"
      "tileloadd (%1,%3,1), %%tmm4\n\t"
      "tileloadd (%1,%3,1), %%tmm5\n\t"
      "tileloadd (%2,%3,1), %%tmm6\n\t"
      "tileloadd (%2,%3,1), %%tmm7\n\t"
      :
      : "r"(&cfg), "r"(a), "r"(b), "r"(stride)
      : "memory");
  for (size_t it = 0; it < iters; ++it) {
    asm volatile(
        "tdpbf16ps %%tmm6, %%tmm4, %%tmm0\n\t"
        "tdpbf16ps %%tmm7, %%tmm4, %%tmm1\n\t"
        "tdpbf16ps %%tmm6, %%tmm5, %%tmm2\n\t"
        "tdpbf16ps %%tmm7, %%tmm5, %%tmm3\n\t" ::
            : "memory");
  }
  asm volatile(
      "tilestored %%tmm0, (%0,%4,1)\n\t"
      "tilestored %%tmm1, (%1,%4,1)\n\t"
      "tilestored %%tmm2, (%2,%4,1)\n\t"
      "tilestored %%tmm3, (%3,%4,1)\n\t"
      "tilerelease\n\t"
      :
      : "r"(c[0]), "r"(c[1]), "r"(c[2]), "r"(c[3]), "r"(stride)
      : "memory");
  *flops = 4.0 * 16.0 * 16.0 * 32.0 * 2.0 * double(iters);
  float total = 0.0f;
  for (const auto& tile : c)
    for (const float x : tile) total += x;
  return total;
}
#endif

}  // namespace

PeakProbe amx_bf16_peak_probe(int repeats) {
  if (repeats < 1) {
    throw std::invalid_argument("amx_bf16_peak_gflops: repeats must be >= 1, got " +
                                std::to_string(repeats));
  }
  PeakProbe p;
  p.verdict = "no AMX bf16 (CPU, OS or Linux's tile permission)";
  if (!has_amx_bf16()) return p;
#if defined(__x86_64__)
  p = sweep_peak(
      "amx_bf16_peak_gflops", repeats, 1,
      [](size_t, size_t iters, double* flops) { return amx_chains(iters, flops); },
      [](size_t) { return 4; });
  p.lanes = 256;  // fp32 results of one tile
  // One TDPBF16PS: 16384 FLOPs; Sapphire Rapids runs one per 16 cycles (1024
  // FLOP/cycle); half that allowed for other tile units.
  judge_peak(p, 1024.0, {0.5, 1.0}, "AMX unit");
#endif
  return p;
}

double amx_bf16_peak_gflops(int repeats) { return amx_bf16_peak_probe(repeats).gflops; }

}  // namespace attn::cpu
