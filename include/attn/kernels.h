// attn/kernels.h - fused scaled-dot-product attention for the CPU (FlashAttention-2 style).
//
// What it computes, per batch b and head h (the same maths as
// attn::ref::attention_forward, and as ref::strided_attention_* in attn/functional.h):
//   S = scale · Q Kᵀ                        (T, T)   never stored whole
//   S[i, j] = -inf for j > i                (causal only)
//   P = softmax(S) row-wise, lse[i] = log Σ_j exp(S[i, j])
//   O = (P ⊙ Z) V                           Z = dropout noise, 0 or 1/(1-p); Z = 1 without dropout
// Forward walks tiles of queries against tiles of keys with an online softmax,
// normalises O once at the end and keeps only lse (B, H, T) for backward: the
// extra memory is O(tile) per thread, never T x T. Backward recomputes P from
// lse, uses D[i] = Σ_d dO[i, d] O[i, d], and produces
//   dV = (P ⊙ Z)ᵀ dO,  dP = (dO Vᵀ) ⊙ Z,  dS = P ⊙ (dP − D),  dQ = scale · dS K,  dK = scale · dSᵀ
//   Q.
//
// Layout: q, k, v, out (and dq, dk, dv, dout) are token-major, as a projection
// writes them and as the output projection reads them: token t of batch b
// starts at  ptr + (b · T + t) · stride  and head h occupies the hd floats
// starting at column h · hd. With stride = H · hd that is (B, T, H, hd) =
// (B, T, d_out); a fused QKV projection output (B, T, 3 · d_out) is read in
// place with q = qkv, k = qkv + d_out, v = qkv + 2 · d_out and strides 3 · d_out.
// No transposes are made. lse is (B, H, T), natural log.
//
// Determinism: every output element is produced by one thread in a fixed
// order, so results are bit-identical for any OpenMP thread count.
//
// Dropout: the kernel cannot follow PyTorch's sequential MT19937 stream (tiles
// run in parallel), so it draws its own noise from a counter-based generator,
// Philox4x32-10 keyed by dropout_seed with counter (j / 4, i, h, b); the four
// 32-bit outputs serve keys 4·(j/4) .. 4·(j/4)+3 of query i. A weight is kept
// when its 32-bit draw is >= p · 2^32 and kept weights are scaled by
// 1/(1-p). The masks therefore differ from torch.nn.Dropout's (RNG.md §6);
// flash_dropout_noise materialises exactly the mask the kernels apply.
//
// SIMD: one source compiled for AVX-512, AVX2, SSE4 and a scalar fallback
// (Highway dynamic dispatch); the best one for the running CPU is chosen on
// first use (flash_attention_target() names it). The kernel is the sdpa
// kernel's (attn/sdpa.h: these calls are its is_causal, Tq = Tk, one key/value
// head per query head case, same bits). Threads: OpenMP. Forward: with B·H a
// multiple of the threads (or at least 4 per thread) a thread takes whole
// heads and copies the head's K and V once into a contiguous block; else
// (batch, head, group of query tiles) items, heaviest first. Backward gives
// each thread whole heads when there are at least two per thread (copying Q,
// dO and summing dQ in a contiguous block); with fewer it splits every head
// into key-tile tasks (dK, dV) and query-tile tasks (dQ), recomputing the
// scores (seven T×T×hd products instead of five). Every way visits every sum
// in the same order, so they give the same bits.
//
// Memory: forward keeps O(tile) per thread (about 160 KB at hd = 64), plus,
// with whole heads, the head's K and V (2·T·hd floats per thread); backward
// adds two (B, H, T) arrays (D and lse in base 2), about 310 KB per thread
// and, with whole heads, 3·T·hd floats per thread (Q, dO, dQ; each copy at
// most 64 MB, else the tiles are read in place), plus, only when hd is not a
// multiple of the vector width, zero-padded (B, H, T, hd) copies of q, k, dout
// and dq.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace attn {
struct BFloat16;  // attn/bfloat16.h
}

namespace attn::kernels {

// The widest head the kernels take: validated() rejects a wider one, the
// fused block and backend = kFused refuse it, and kAuto takes the reference
// path above it (attn/nn.h).
inline constexpr int64_t kMaxHeadDim = 256;

struct FlashAttentionParams {
  int64_t B = 1;    // batch
  int64_t T = 1;    // tokens (queries = keys = T)
  int64_t H = 1;    // heads
  int64_t hd = 64;  // head_dim, 1 .. kMaxHeadDim
  bool causal = true;
  float scale = -1.0f;     // multiplies Q Kᵀ; < 0 means 1/sqrt(hd)
  float dropout_p = 0.0f;  // in [0, 1); 0 turns dropout off
  uint64_t dropout_seed = 0;
  // Floats between consecutive tokens of each buffer; 0 means H · hd (packed).
  int64_t q_stride = 0, k_stride = 0, v_stride = 0, o_stride = 0;
};

// out (B, T, ·) with o_stride, lse (B, H, T). Throws std::invalid_argument on bad params.
void flash_attention_forward(float* out, float* lse, const float* q, const float* k, const float* v,
                             const FlashAttentionParams& params);

// dq, dk, dv are written (not accumulated) with the strides of q, k, v;
// dout has the stride of out. out and lse are the forward's outputs.
void flash_attention_backward(float* dq, float* dk, float* dv, const float* dout, const float* q,
                              const float* k, const float* v, const float* out, const float* lse,
                              const FlashAttentionParams& params);

// bfloat16: the same maths on bf16 q, k, v (and dout), with bf16 out (and
// dq, dk, dv), as PyTorch's SDPA on bf16 tensors: the products take bf16
// operands and sum in fp32, the scores, the softmax statistics (lse stays
// fp32) and every accumulator are fp32, and the weights P and dS are rounded
// to bf16 where they enter a product. Results are rounded to bf16 once, at
// the end. Params, layouts, strides, dropout noise and determinism are those
// of the fp32 kernels; so is the memory (the dQ accumulator of a whole head,
// T · hd floats per thread, is the one addition).
// Paths, chosen at run time, best first:
//  - "AMX": every product on AMX tiles (TDPBF16PS, 16 × 16 fp32 tiles;
//    src/kernels/flash_attention_amx.cpp), where CPUID reports AMX-BF16 and
//    AMX-TILE and Linux grants the process the tile state (arch_prctl
//    ARCH_REQ_XCOMP_PERM, asked once): Intel Sapphire Rapids and later. Any
//    T and hd (hd padded to 32 and T to 64 inside; causal diagonal tiles are
//    computed whole and masked). Its memory: zero-padded packed copies of
//    the inputs, 3 · B·H·Tp·hdp bf16 forward and 7 · B·H·Tp·hdp backward
//    (Tp = T rounded up to 64, hdp = hd rounded up to 32), instead of O(tile).
//  - "AVX512-BF16": the sdpa kernel's schedule with every product on
//    VDPBF16PS dot products (src/kernels/bf16_dot.h), where the CPU has them
//    (AMD Zen 4 and later, Intel Cooper Lake and Sapphire Rapids and later)
//    and the SIMD target is an AVX-512 one;
//  - "widened to fp32": the sdpa kernel's schedule on fp32 products, each bf16
//    tile widened exactly as it is packed, the results rounded to bf16 once:
//    the fp32 kernel's bits on the widened values; every CPU.
// Without AMX, AVX512-BF16 is put before "widened to fp32" only when the
// measured bf16 dot-product peak is about the fp32 FMA peak
// (bf16 dot >= 0.75 · fp32 FMA, probed once on short runs): Intel cores run
// VDPBF16PS at half the FMA rate, so there the widened path is chosen.
void flash_attention_forward_bf16(BFloat16* out, float* lse, const BFloat16* q, const BFloat16* k,
                                  const BFloat16* v, const FlashAttentionParams& params);
void flash_attention_backward_bf16(BFloat16* dq, BFloat16* dk, BFloat16* dv, const BFloat16* dout,
                                   const BFloat16* q, const BFloat16* k, const BFloat16* v,
                                   const BFloat16* out, const float* lse,
                                   const FlashAttentionParams& params);
// The bf16 path that runs; the paths this CPU can run, best first; and, for
// tests and benchmarks, a way to force one (false for a name not in the list;
// nullptr restores the automatic choice; not for use while kernels run).
const char* flash_attention_bf16_path();
std::vector<std::string> flash_attention_bf16_paths();
bool flash_attention_bf16_use_path(const char* name);
// Whether the sdpa kernel (attn/sdpa_problem.h's kernels::sdpa_forward and
// sdpa_backward, which every bf16 call but the AMX kernel's reaches) runs
// bf16 problems on VDPBF16PS: the path is "AVX512-BF16", or "AMX" where
// VDPBF16PS measured as fast as the fp32 FMA (for the calls the AMX kernel
// does not take), and the SIMD target is an AVX-512 one. Else on fp32
// products of the widened tiles.
bool bf16_dot_engine_chosen();

// The dropout noise the kernels apply, materialised: noise (B, H, T, T), each
// 0 or 1/(1-p) (all ones when p = 0). Causal entries j > i are filled too.
void flash_dropout_noise(float* noise, const FlashAttentionParams& params);

// Philox4x32-10: the four 32-bit outputs for a 128-bit counter and 64-bit key.
void philox4x32(uint32_t out[4], const uint32_t counter[4], uint64_t key);

// The SIMD target chosen at run time, e.g. "AVX3" or "AVX2".
const char* flash_attention_target();
// Whether that target is an AVX-512 one ("AVX3", "AVX3_DL", ...). The automatic
// bf16 paths outside Highway (AMX, AVX512-BF16: the attention kernels here and
// decode's gemv) need it too, so a forced AVX2 target (ATTN_SIMD_TARGET=AVX2)
// also chooses their widened paths: the whole library runs as on a CPU without
// AVX-512. A forced path (ATTN_BF16_PATH, *_use_path) still runs as asked,
// but for AVX512-BF16, which needs an AVX-512 target (bf16_dot_engine_chosen()).
bool simd_target_has_avx512();
// For tests: the fp32 kernels' 2^x (Exp2 in kernels/flash_tiles-inl.h, the
// softmax's exponent) on that target, y[i] = 2^x[i]: for -125 <= x <= 0 within
// 2.2e-7 of it (relative) and never subnormal; exactly 0 below -125, for -inf
// and for NaN.
void kernel_exp2(const float* x, float* y, size_t n);
// The CPU's features (AVX512-BF16, AMX) and the machine's peak rates, which
// the automatic bf16 path choices ask, are attn/cpu.h's.
// For tests and benchmarks: the targets compiled in that this CPU can run,
// best first (e.g. {"AVX3", "AVX2", "SSE4", "EMU128"}), and a way to run the
// kernels with one of them. Returns false for a name not in that list, and
// nullptr, like an unknown name, restores the automatic choice. This changes
// Highway's process-wide target choice: not for use while kernels run.
std::vector<std::string> flash_attention_targets();
bool flash_attention_use_target(const char* name);

// The paths forced by the environment (read once, by the first call; the attn
// CLI and the benchmarks call it at start-up, a program may call it too):
//   ATTN_SIMD_TARGET  a name of flash_attention_targets(): flash_attention_use_target
//   ATTN_BF16_PATH    a name of flash_attention_bf16_paths(): flash_attention_bf16_use_path
//   ATTN_GEMV_BF16_PATH  a name of gemv_bf16_paths() (attn/decode_kernels.h): gemv_bf16_use_path
// (ATTN_GEMM_ENGINE is read by attn/gemm.h's fast engine.) Unset or empty:
// the automatic choice. An unknown name throws std::invalid_argument naming
// the variable, the value and the valid names, on this and every later call.
void apply_path_environment();

// Throws std::invalid_argument naming the offending value; fills the
// defaulted strides and scale. Called by every function above.
FlashAttentionParams validated(const FlashAttentionParams& params);

}  // namespace attn::kernels
