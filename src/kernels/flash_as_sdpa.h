// src/kernels/flash_as_sdpa.h - the core's problem (attn/kernels.h: token-major
// q, k, v, out of B·T rows, H heads of hd, square causal or full attention) as
// the sdpa kernel's (attn/sdpa.h), which covers it exactly: is_causal
// top-left, Tq = Tk, one key/value head per query head, the same Philox
// counters, lse (B, H, T). The fp32 entry points (flash_attention.cpp) and the
// bf16 ones off AMX (flash_attention_bf16.cpp: the sdpa kernel's bf16 tiles on
// the path's engine, VDPBF16PS or widened as each tile is packed) run it.
#pragma once

#include <cstdint>

#include "attn/kernels.h"
#include "attn/sdpa_problem.h"

namespace attn::kernels {

// Token t of batch b, head h of a token-major buffer: ptr + (b·T + t)·stride + h·hd.
inline SdpaStrides TokenMajor(const FlashAttentionParams& p, int64_t stride) {
  return {p.T * stride, p.hd, stride, 1};
}

// The sdpa kernel's problem for validated params p.
template <class T>
SdpaProblemT<T> AsSdpa(const FlashAttentionParams& p, const T* q, const T* k, const T* v) {
  SdpaProblemT<T> s;
  s.B = p.B, s.Hq = s.Hkv = p.H, s.Tq = s.Tk = p.T, s.D = s.Dv = p.hd;
  s.q = q, s.k = k, s.v = v;
  s.q_strides = TokenMajor(p, p.q_stride);
  s.k_strides = TokenMajor(p, p.k_stride);
  s.v_strides = TokenMajor(p, p.v_stride);
  s.is_causal = p.causal;  // top-left: key j <= query i
  s.scale = p.scale;
  s.dropout_p = p.dropout_p;
  s.dropout_seed = p.dropout_seed;
  return s;
}

// flash_attention_forward's contract (validated p) on the sdpa kernel.
template <class T>
void ForwardAsSdpa(T* out, float* lse, const T* q, const T* k, const T* v,
                   const FlashAttentionParams& p) {
  SdpaOutputT<T> o;
  o.out = out, o.out_strides = TokenMajor(p, p.o_stride);
  o.lse = lse;  // (B, H, T)
  sdpa_forward(o, AsSdpa(p, q, k, v));
}

// flash_attention_backward's contract (validated p) on the sdpa kernel.
template <class T>
void BackwardAsSdpa(T* dq, T* dk, T* dv, const T* dout, const T* q, const T* k, const T* v,
                    const T* out, const float* lse, const FlashAttentionParams& p) {
  SdpaBackwardIOT<T> io;
  io.dout = dout, io.dout_strides = TokenMajor(p, p.o_stride);
  io.out = out, io.out_strides = TokenMajor(p, p.o_stride);
  io.lse = lse;
  io.dq = dq, io.dq_strides = TokenMajor(p, p.q_stride);
  io.dk = dk, io.dk_strides = TokenMajor(p, p.k_stride);
  io.dv = dv, io.dv_strides = TokenMajor(p, p.v_stride);
  sdpa_backward(io, AsSdpa(p, q, k, v));
}

}  // namespace attn::kernels
