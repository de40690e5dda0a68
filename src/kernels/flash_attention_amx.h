// The AMX path of the bf16 attention (flash_attention_amx.cpp), for
// flash_attention_bf16.cpp's public entry points (same arguments, validated
// params: strides and scale filled in) and for the bf16 sdpa routes
// (attention/sdpa.cpp: any row strides, and SdpaExtras: a mask, grouped-query heads,
// Tq != Tk); bf16 as raw bits. Call only when amx::amx_usable().
#pragma once

#include <cstddef>
#include <cstdint>

#include "attn/kernels.h"
#include "kernels/flash_bf16_strided.h"

namespace attn::kernels::amx {

// has_amx_bf16() and has_avx512_bf16() (attn/cpu.h): the tiles are granted and
// the kernels' own vector code (exp2, rounding into words) can run. Asked once.
bool amx_usable();

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

void forward(uint16_t* out, float* lse, const uint16_t* q, const uint16_t* k, const uint16_t* v,
             const FlashAttentionParams& p);

// The strided form (any row strides) and the extras (a mask, grouped-query
// heads, Tq != Tk), all of them; kernels/flash_bf16_strided.h says what they
// mean. The same bits as the packed layout's (only the addresses differ).
void forward(uint16_t* out, float* lse, const uint16_t* q, const uint16_t* k, const uint16_t* v,
             const FlashAttentionParams& p, const ForwardStrides& s, const SdpaExtras& x = {});

void backward(uint16_t* dq, uint16_t* dk, uint16_t* dv, const uint16_t* dout, const uint16_t* q,
              const uint16_t* k, const uint16_t* v, const uint16_t* out, const float* lse,
              const FlashAttentionParams& p, const BackwardStrides& s, const SdpaExtras& x = {});
void backward(uint16_t* dq, uint16_t* dk, uint16_t* dv, const uint16_t* dout, const uint16_t* q,
              const uint16_t* k, const uint16_t* v, const uint16_t* out, const float* lse,
              const FlashAttentionParams& p);

}  // namespace attn::kernels::amx
