// The bf16 paths of the fused attention and the choice between them; the
// core's bf16 entry points (attn/kernels.h: flash_attention_forward_bf16,
// flash_attention_backward_bf16) on the chosen one:
// - "AMX": the AMX tile kernel (flash_attention_amx.cpp), token-major or
//   strided (kernels/flash_bf16_strided.h, the sdpa routes' plain calls);
// - "AVX512-BF16": the sdpa kernel (sdpa_kernel.cpp) on its DotEngine, every
//   product on VDPBF16PS (kernels/bf16_dot.h): P and dS rounded to bf16 where
//   they enter a product, fp32 scores, softmax and accumulators, as PyTorch's
//   bf16 flash attention keeps them;
// - "widened to fp32": the sdpa kernel on its FmaEngine, each bf16 tile
//   widened exactly as it is packed, so the bits are the fp32 kernel's on
//   the widened values.
// The last two reach the sdpa kernel through kernels/flash_as_sdpa.h (the
// core's token-major problem described to it); the kernel reads the path
// (bf16_dot_engine_chosen) for every bf16 problem, so the sdpa entry points,
// the varlen ones and the core's take the same engine.
#include <fmt/format.h>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "attn/cpu.h"
#include "attn/kernels.h"
#include "attn/tensor.h"
#include "kernels/flash_as_sdpa.h"
#include "kernels/flash_attention_amx.h"
#include "kernels/flash_bf16_strided.h"

namespace attn::kernels {
namespace {

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
// use AVX-512 registers, after it. Forcing AMX still runs it; AVX512-BF16 is
// the sdpa kernel's engine on that target's tiles, so under a target below
// AVX-512 its calls run widened (bf16_dot_engine_chosen() says false).
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

// The strided form is the AMX kernel's (the other paths are the sdpa kernel's own calls).
void CheckStridedServes(Path path) {
  if (path != Path::kAmx)
    throw std::invalid_argument(
        "flash attention bf16: the strided form needs the AMX path, the chosen path is " +
        std::string(PathName(path)));
}

}  // namespace

void flash_attention_forward_bf16(BFloat16* out, float* lse, const BFloat16* q, const BFloat16* k,
                                  const BFloat16* v, const FlashAttentionParams& params) {
  const FlashAttentionParams p = validated(params);
  if (ChosenPath() == Path::kAmx) {
    amx::forward(bits(out), lse, bits(q), bits(k), bits(v), p);
    return;
  }
  ForwardAsSdpa(out, lse, q, k, v, p);  // DotEngine or FmaEngine, as the path says
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
  BackwardAsSdpa(dq, dk, dv, dout, q, k, v, out, lse, p);
}

void flash_attention_forward_bf16(uint16_t* out, float* lse, const uint16_t* q, const uint16_t* k,
                                  const uint16_t* v, const FlashAttentionParams& params,
                                  const ForwardStrides& st, const SdpaExtras& x) {
  const FlashAttentionParams p = validated(params);
  CheckStridedServes(ChosenPath());
  amx::forward(out, lse, q, k, v, p, st, x);
}

void flash_attention_backward_bf16(uint16_t* dq, uint16_t* dk, uint16_t* dv, const uint16_t* dout,
                                   const uint16_t* q, const uint16_t* k, const uint16_t* v,
                                   const uint16_t* out, const float* lse,
                                   const FlashAttentionParams& params, const BackwardStrides& st,
                                   const SdpaExtras& x) {
  const FlashAttentionParams p = validated(params);
  CheckStridedServes(ChosenPath());
  amx::backward(dq, dk, dv, dout, q, k, v, out, lse, p, st, x);
}

const char* flash_attention_bf16_path() { return PathName(ChosenPath()); }

bool bf16_dot_engine_chosen() {
  if (!simd_target_has_avx512()) return false;  // the sdpa kernel's tiles are the target's
  const Path path = ChosenPath();
  return path == Path::kAvx512Bf16 || (path == Path::kAmx && Avx512Bf16BeatsWidened());
}

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
