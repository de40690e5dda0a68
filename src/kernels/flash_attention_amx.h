// The AMX path of the bf16 attention kernels (flash_attention_amx.cpp), for
// flash_attention_bf16.cpp's public entry points (same arguments, validated
// params: strides and scale filled in) and for the bf16 sdpa routes
// (nn/sdpa.cpp: any row strides, and SdpaExtras: a mask, grouped-query heads,
// Tq != Tk); bf16 as raw bits. Call only when amx::amx_usable().
#pragma once

#include <cstdint>

#include "attn/kernels.h"
#include "kernels/flash_bf16_strided.h"

namespace attn::kernels::amx {

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
