// The AMX kernel's strided form, for the bf16 sdpa routes (attention/sdpa.cpp):
// operands of any row strides (head-major (B, H, T, hd) tensors read and
// written in place, token-major views, slices) and what sdpa adds to the
// core's problem (SdpaExtras); flash_attention_amx.cpp implements it, every
// extra, the mask's tiles as tile_mask-inl.h classifies them. (The other bf16
// paths are the sdpa kernel's own: it reads any strides and serves every case.)
// bf16 as raw bits; the params validated (scale filled in; their x_stride
// are ignored).
#pragma once

#include <cstdint>

#include "attn/kernels.h"

namespace attn::kernels {

// An additive float32 mask (sdpa's attn_mask, a boolean one already turned
// into 0 / -inf), added to the scores: element (b, h, query i, key j) at data +
// b·b + h·h + i·t + j·d, a stride of 0 broadcasting. The values are finite or
// -inf (the caller checks); the ones that kernels/sdpa_mask.h says close a key
// weigh exactly 0. A row whose keys are all closed gets output 0 and lse -inf,
// as in the sdpa kernel. data nullptr: no mask.
struct AdditiveMask {
  const float* data = nullptr;
  int64_t b = 0, h = 0, t = 0, d = 1;
};

// What the sdpa routes add to the core's problem: a mask; grouped-query
// heads: Hkv key/value heads (dividing p.H; 0 means p.H), query head h
// reading key/value head h / (p.H / Hkv), the strides of k, v (dk, dv) then
// the key/value heads', dK and dV summed over each group's query heads in one
// fixed order; and Tk keys for the p.T queries (0 means p.T), the causal
// pattern aligned top-left (key j <= query i) or bottom-right (j <= i + Tk -
// Tq; a query that sees no key gets output 0 and lse -inf).
struct SdpaExtras {
  AdditiveMask mask;
  int64_t Hkv = 0;
  int64_t Tk = 0;
  bool bottom_right = false;
};

// Where row t of head (b, h) of one operand starts: base + b·b + h·h + t·t
// (elements; the row's hd elements are contiguous).
struct RowStrides {
  int64_t b = 0, h = 0, t = 0;
};
// Every operand of a forward (lse: where its (b, h, t) entry is).
struct ForwardStrides {
  RowStrides q, k, v, out, lse;
};
// Every operand of a backward.
struct BackwardStrides {
  RowStrides dout, q, k, v, out, lse, dq, dk, dv;
};

// The layout the params describe: token-major (B, T, H, hd) rows x_stride
// apart (x_stride filled in), lse (B, H, T) contiguous.
inline ForwardStrides token_major_strides(const FlashAttentionParams& p) {
  auto rows = [&](int64_t stride) { return RowStrides{p.T * stride, p.hd, stride}; };
  return {rows(p.q_stride), rows(p.k_stride), rows(p.v_stride), rows(p.o_stride),
          RowStrides{p.H * p.T, p.T, 1}};
}
inline BackwardStrides token_major_backward_strides(const FlashAttentionParams& p) {
  const ForwardStrides f = token_major_strides(p);
  return {f.out, f.q, f.k, f.v, f.out, f.lse, f.q, f.k, f.v};
}

// The AMX path (flash_attention_bf16_path() "AMX") on strided operands: the
// same bits as the packed layout's (only the addresses differ), every extra
// (grouped-query heads: the same fixed order of the group's sums). On another
// path it throws std::invalid_argument (the sdpa kernel serves those calls itself).
void flash_attention_forward_bf16(uint16_t* out, float* lse, const uint16_t* q, const uint16_t* k,
                                  const uint16_t* v, const FlashAttentionParams& p,
                                  const ForwardStrides& s, const SdpaExtras& x = {});
void flash_attention_backward_bf16(uint16_t* dq, uint16_t* dk, uint16_t* dv, const uint16_t* dout,
                                   const uint16_t* q, const uint16_t* k, const uint16_t* v,
                                   const uint16_t* out, const float* lse,
                                   const FlashAttentionParams& p, const BackwardStrides& s,
                                   const SdpaExtras& x = {});

}  // namespace attn::kernels
