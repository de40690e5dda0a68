// attn/functional.h - the plain fp32 maths of every mechanism, forward and backward.
//
// This is the specification in code (src/reference/): short, obvious loops and
// matrix products that the modules (attn/nn.h) call and that every fast kernel
// (attn/kernels.h) is tested against. Forward functions return what the caller
// needs and fill a small "saved" struct with exactly what backward reads;
// backward functions take the output gradient and return input gradients,
// accumulating (+=) parameter gradients into the tensors they are given.
//
// Shapes: x (..., d_in); q, k (..., T, d_k); v (..., T, d_v); attention weights
// (..., T_q, T_k); "..." is any number of leading dims (B, or B and H).
#pragma once

#include <cstdint>

#include "attn/gemm.h"
#include "attn/random.h"
#include "attn/tensor.h"

namespace attn::kernels {
struct FlashAttentionParams;  // attn/kernels.h
}  // namespace attn::kernels

namespace attn::ref {

// ---- linear maps ----------------------------------------------------------------
// y = x Wᵀ + b: x (..., in), weight (out, in), bias (out) or nullptr -> (..., out).
// engine (attn/gemm.h): kBlas sums as PyTorch does (its BLAS, its bias add and
// column sums); kFast multiplies on the fast GEMM and sums dbias in plain row order.
Tensor linear_forward(const Tensor& x, const Tensor& weight, const Tensor* bias,
                      gemm::Engine engine = gemm::Engine::kBlas);
// Returns dx (..., in); dweight (out, in) += dyᵀ x; dbias (out) += Σ dy.
Tensor linear_backward(const Tensor& dy, const Tensor& x, const Tensor& weight, Tensor& dweight,
                       Tensor* dbias, gemm::Engine engine = gemm::Engine::kBlas);
// y = x W for a plain parameter W (in, out) (SelfAttention_v1):
// returns dx = dy Wᵀ; dweight (in, out) += xᵀ dy.
Tensor matmul_param_backward(const Tensor& dy, const Tensor& x, const Tensor& weight,
                             Tensor& dweight);

// ---- softmax and dropout ----------------------------------------------------------
// With y = softmax(x, dim): dx = y ⊙ (dy − Σ_dim dy ⊙ y).
Tensor softmax_backward(const Tensor& dy, const Tensor& y, int64_t dim);
// y = x ⊙ noise, noise from attn::dropout_noise (0 or 1/(1-p)); dx = dy ⊙ noise.
Tensor dropout_forward(const Tensor& x, const Tensor& noise);
Tensor dropout_backward(const Tensor& dy, const Tensor& noise);

// ---- 1. simplified self-attention (no weights) ---------------------------------------
enum class Normalization {
  kSum,           // a = w / Σ w
  kSoftmaxNaive,  // a = exp(w) / Σ exp(w)   (overflows for large w)
  kSoftmax,       // a = exp(w - max) / Σ exp(w - max)
};
struct SimplifiedAttention {
  Tensor scores;   // (T, T)  W = X Xᵀ   (or (T) for one query)
  Tensor weights;  // (T, T)  normalised rows
  Tensor context;  // (T, d)  Z = A X    (or (d) for one query)
};
// All rows: inputs (T, d).
SimplifiedAttention simplified_attention(const Tensor& inputs, Normalization norm);
// One query: scores w_i = x_i · x_query (T), weights, context (d).
SimplifiedAttention simplified_attention_query(const Tensor& inputs, const Tensor& x_query,
                                               Normalization norm);
// The score matrix with explicit loops, the teaching form of inputs @ inputsᵀ.
Tensor attention_scores_loops(const Tensor& inputs);

// ---- 2./3. scaled dot-product attention, causal masking and dropout -------------------
struct AttentionOptions {
  bool causal = false;       // mask keys j > i with -inf before the softmax
  float scale = -1.0f;       // multiplies the scores; < 0 means 1/sqrt(d_k), applied as the
                             // chapter writes it, scores / sqrt(d_k) (same bits as PyTorch)
  int64_t softmax_dim = -1;  // -1 (keys) is right; 1 reproduces an early printing's bug
};
struct AttentionSaved {
  Tensor weights;  // (..., T_q, T_k) softmax output, before dropout
  Tensor noise;    // (..., T_q, T_k) dropout noise, or empty when dropout is off
};
// out = dropout(softmax(scale · q kᵀ [+ causal -inf mask])) v.
// q (..., T_q, d_k), k (..., T_k, d_k), v (..., T_k, d_v) -> (..., T_q, d_v).
// dropout_noise: nullptr for no dropout, else a (..., T_q, T_k) noise tensor.
Tensor attention_forward(const Tensor& q, const Tensor& k, const Tensor& v,
                         const AttentionOptions& options, const Tensor* dropout_noise,
                         AttentionSaved* saved);
struct AttentionGrads {
  Tensor dq, dk, dv;
};
AttentionGrads attention_backward(const Tensor& dout, const Tensor& q, const Tensor& k,
                                  const Tensor& v, const AttentionSaved& saved,
                                  const AttentionOptions& options);

// The same maths in the fused kernels' layout and parameters (attn/kernels.h):
// token t of batch b at ptr + (b·T + t)·stride, head h at columns h·hd ..
// h·hd + hd - 1, lse (B, H, T); loops one (b, h, i) at a time with fp64 sums.
// noise is nullptr (no dropout) or a (B, H, T, T) array from
// kernels::flash_dropout_noise. kernels::flash_attention_forward / _backward
// are tested against these (src/reference/strided_attention.cpp).
void strided_attention_forward(float* out, float* lse, const float* q, const float* k,
                               const float* v, const float* noise,
                               const kernels::FlashAttentionParams& params);
// dq, dk, dv are written (not accumulated) with the strides of q, k, v.
void strided_attention_backward(float* dq, float* dk, float* dv, const float* dout, const float* q,
                                const float* k, const float* v, const float* noise,
                                const kernels::FlashAttentionParams& params);

// Cached causal attention, the maths of incremental decoding (attn/kv_cache.h;
// src/reference/cached_attention.cpp). T_new queries at absolute positions
// offset .. offset + T_new - 1 attend over the first offset + T_new rows of the
// key and value buffers, query i seeing rows 0 .. offset + i:
//   out[b, h, i] = Σ_{j <= offset+i} softmax_j(q[b, h, i] · keys[b, h, j] / sqrt(hd))
//                  values[b, h, j]
// q (B, H, T_new, hd); keys, values (B, H, capacity, hd) with capacity >= offset + T_new
// -> (B, H, T_new, hd). Scores are divided by sqrt(hd) in float, as the chapter's
// `attn_scores / keys.shape[-1]**0.5`; dot products and softmax sums in double.
Tensor cached_attention_forward(const Tensor& q, const Tensor& keys, const Tensor& values,
                                int64_t offset);

// The two routes to causal weights, equal up to rounding:
// softmax first, then zero j > i and renormalise each row to sum 1 ...
Tensor causal_weights_renormalized(const Tensor& scores, float scale);
// ... or fill j > i with -inf, then softmax.
Tensor causal_weights_masked(const Tensor& scores, float scale);
// The (n, n) causal masks: lower-triangular ones, and the upper "future" mask
// (1 where j > i) that CausalAttention keeps as its buffer.
Tensor tril_ones(int64_t n);
Tensor future_mask(int64_t n);

// ---- 5. averaging the past: xbow[b, t] = mean(x[b, 0..t]) ------------------------------
Tensor xbow_loops(const Tensor& x);    // (B, T, C) explicit loops
Tensor xbow_matmul(const Tensor& x);   // row-normalised tril (T, T) @ x
Tensor xbow_softmax(const Tensor& x);  // softmax(zeros masked with -inf) @ x

}  // namespace attn::ref
