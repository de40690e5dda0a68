// attn/layer_kernels.h - SIMD kernels for the GPT's layers around the
// attention: layer normalisation, GELU (tanh form) and the gated feed-forward's
// activation (SwiGLU, GeGLU), forward and backward;
// the AdamW update that trains them; and the rounding to bf16 of the bf16 path.
//
// They compute the maths of attn::ref::layer_norm_* and ref::gelu_* (attn/functional_gpt.h,
// the specification) on raw contiguous buffers, vectorised with Highway's dynamic
// dispatch (the best of AVX-512, AVX2, SSE4 and scalar for the running CPU) and
// split over OpenMP threads by rows (or by chunks of elements). They are what
// nn::LayerNorm and nn::GELU run with LayerImpl::kKernel (attn/gpt.h), the default.
// The sources, one file per layer in src/kernels: layer_kernels.cpp (layer norm,
// the bf16 rounding), gelu_kernels.cpp (GELU, bias + GELU), adamw_kernels.cpp
// (AdamW, sum_of_squares), bias_kernels.cpp (fill_rows, column sums).
//
// How they differ from the reference loops (tests/unit/test_layer_kernels.cpp
// states the bounds they meet):
//   - layer norm sums in float vector lanes with a corrected two-pass mean and
//     variance (the reference takes PyTorch's float mean and sums the variance
//     in double); y agrees to a few float ulps when |mean| is not far above the
//     row's std. When it is (x = 100 + 0.01·noise), PyTorch's own float mean is
//     off by about |mean|·2⁻²⁴·log C, which moves (x − mean)/std by that over
//     std: LayerImpl::kReference repeats PyTorch's rounding, the kernel does not;
//   - tanh is Highway's vector Tanh (at most a few ulps from std::tanh).
// Determinism: every output element, and every partial sum of dscale/dshift
// (fixed chunks of kLayerNormChunkRows rows, added in chunk order), is computed
// in one fixed order, so the bits do not depend on the thread count.
#pragma once

#include <cstdint>

namespace attn {
struct BFloat16;  // attn/bfloat16.h
}  // namespace attn

namespace attn::kernels {

// Rows per partial sum of layer_norm_backward's dscale/dshift.
inline constexpr int64_t kLayerNormChunkRows = 64;

// x, y (N, C) rows; scale, shift (C); mean, std (N) are written:
//   mean[n] = Σ_c x[n, c] / C,  std[n] = sqrt(Σ_c (x[n, c] − mean[n])² / C + eps)
//   y[n, c] = scale[c] · (x[n, c] − mean[n]) / std[n] + shift[c]
void layer_norm_forward(float* y, float* mean, float* std, const float* x, const float* scale,
                        const float* shift, int64_t N, int64_t C, float eps);

// The same with y rounded to bf16 as it is stored (the bf16 path's operand of
// the next product): y[n, c] = to_bfloat16(layer_norm_forward's y[n, c]).
void layer_norm_forward_bf16(BFloat16* y, float* mean, float* std, const float* x,
                             const float* scale, const float* shift, int64_t N, int64_t C,
                             float eps);

// dy, x, dx (N, C); mean, std (N) from the forward. dx is written; dscale and
// dshift (C) are accumulated (+=):
//   x̂ = (x − mean) / std,  g = dy ⊙ scale
//   dx = (g − mean_c(g) − x̂ · mean_c(g ⊙ x̂)) / std
//   dscale += Σ_n dy ⊙ x̂,  dshift += Σ_n dy
void layer_norm_backward(float* dx, float* dscale, float* dshift, const float* dy, const float* x,
                         const float* scale, const float* mean, const float* std, int64_t N,
                         int64_t C);

// ---- the residual add fused with the layer norm that follows it ----
// x1 = a + r (N, C) is written (the residual stream, one float add per
// element), then layer_norm_forward of x1: the bits of add() then
// layer_norm_forward (or _bf16), in one pass over the rows.
void add_layer_norm_forward(float* x1, float* y, float* mean, float* std, const float* a,
                            const float* r, const float* scale, const float* shift, int64_t N,
                            int64_t C, float eps);
void add_layer_norm_forward_bf16(float* x1, BFloat16* y, float* mean, float* std, const float* a,
                                 const float* r, const float* scale, const float* shift,
                                 int64_t N, int64_t C, float eps);
// layer_norm_backward with the residual's gradient added: dx = dresidual +
// layer_norm_backward's dx (dresidual (N, C)), the bits of the two steps.
void layer_norm_backward_add(float* dx, float* dscale, float* dshift, const float* dy,
                             const float* dresidual, const float* x, const float* scale,
                             const float* mean, const float* std, int64_t N, int64_t C);

// y[i] = 0.5 · x · (1 + tanh(√(2/π) · (x + 0.044715 · x³))), n elements.
void gelu_forward(float* y, const float* x, int64_t n);

// dx[i] = dy · (0.5 · (1 + t) + 0.5 · x · (1 − t²) · √(2/π) · (1 + 3 · 0.044715 · x²)), t =
// tanh(u).
void gelu_backward(float* dx, const float* dy, const float* x, int64_t n);

// ---- RMSNorm (nn::RMSNorm: Llama, Qwen, Gemma) ----
// x, y (N, C); weight (C); inv_rms (N) is written:
//   inv_rms[n] = 1 / sqrt(Σ_c x[n, c]² / C + eps),  y = x · inv_rms · (weight + weight_offset)
// The squares summed in float vector lanes (ref::rms_norm_forward sums them in
// double: a few float ulps apart); rows in parallel, each row's bits the same
// for any thread count.
void rms_norm_forward(float* y, float* inv_rms, const float* x, const float* weight, int64_t N,
                      int64_t C, float eps, float weight_offset);

// ---- the gated feed-forward's activation (nn::GatedFeedForward) ----
// z = act(g) ⊙ u, n elements, act the tanh GELU (gelu: Gemma's GeGLU) or SiLU
// g · σ(g) (SwiGLU, σ(g) = 1 / (1 + e^-g) with a vector exp: a few ulps from
// std::exp); a, unless null, gets act(g). The reference is nn::gate_activation
// (attn/gpt.h), then the product.
void gated_activation_forward(float* z, float* a, const float* g, const float* u, int64_t n,
                              bool gelu);
// dg = dz ⊙ u ⊙ act'(g), du = dz ⊙ act(g) (act recomputed from g), n elements;
// silu'(g) = σ (1 + g (1 − σ)), gelu' as gelu_backward's factor.
void gated_activation_backward(float* dg, float* du, const float* dz, const float* g,
                               const float* u, int64_t n, bool gelu);

// ---- bias + GELU, FeedForward's fc and its activation (nn::FeedForward) ----
// Rows per partial sum of gelu_backward_bias's db.
inline constexpr int64_t kGeluChunkRows = 64;
// h (M, N) holds x Wᵀ (a beta = 0 product); h += b (N) on every row, then
// y = gelu(h) (gelu_forward's values; _bf16: rounded as stored), one pass.
void bias_gelu_forward(float* h, float* y, const float* b, int64_t M, int64_t N);
void bias_gelu_forward_bf16(float* h, BFloat16* y, const float* b, int64_t M, int64_t N);
// dh = gelu_backward(dy, h) (M, N), and db (N) += Σ_rows dh (the float dh;
// one partial sum per kGeluChunkRows rows, added in chunk order: the same bits
// for any thread count), one pass. _bf16: dh rounded to bf16 as stored.
void gelu_backward_bias(float* dh, float* db, const float* dy, const float* h, int64_t M,
                        int64_t N);
void gelu_backward_bias_bf16(BFloat16* dh, float* db, const float* dy, const float* h, int64_t M,
                             int64_t N);
// The same pair with the slope kept for the backward (nn::FeedForward's
// training path: one tanh per element, in the forward, instead of two):
// bias_gelu_forward_slope writes y as bias_gelu_forward does, but h = s =
// gelu'(h + b) (the factor gelu_backward multiplies dy by, its bits) instead
// of h + b; slope_backward_bias then writes dh = dy ⊙ s and db += Σ_rows dh,
// the bits of gelu_backward_bias(dh, db, dy, h + b) (_bf16 as above).
void bias_gelu_forward_slope(float* h, float* y, const float* b, int64_t M, int64_t N);
void bias_gelu_forward_slope_bf16(float* h, BFloat16* y, const float* b, int64_t M, int64_t N);
void slope_backward_bias(float* dh, float* db, const float* dy, const float* slope, int64_t M,
                         int64_t N);
void slope_backward_bias_bf16(BFloat16* dh, float* db, const float* dy, const float* slope,
                              int64_t M, int64_t N);
// The _bf16 pair with the bf16 output kept in float32 (y[i], dh[i] =
// to_float(_bf16's element), as round_to_bf16_values): the operands of a bf16
// product on gemm_bf16's widened route (attn/bf16_operand.h), without a bf16
// copy to widen. dh may be dy (each element is read before it is written).
void bias_gelu_forward_slope_bf16_values(float* h, float* y, const float* b, int64_t M, int64_t N);
void slope_backward_bias_bf16_values(float* dh, float* db, const float* dy, const float* slope,
                                     int64_t M, int64_t N);

// ---- AdamW's element update (attn/optim.h's AdamW::step) ----------------------------
// The scalars of one step, as AdamW::step derives them (PyTorch 1.13's
// _single_tensor_adamw): decay = 1 − lr·weight_decay, neg_step_size =
// −lr / (1 − beta1^t), bias_correction2_sqrt = sqrt(1 − beta2^t).
struct AdamWScalars {
  float decay, beta1, beta2, one_minus_beta1, one_minus_beta2, eps, neg_step_size,
      bias_correction2_sqrt;
  float grad_scale = 1.0f;  // the gradient used is g·grad_scale (clip_grad_norm's coefficient)
};
// Per element, in PyTorch's order and float rounding:
//   w = w·decay;  m = fma(g, 1 − beta1, m·beta1);  v = v·beta2 + (1 − beta2)·g·g
//   w = w + neg_step_size·m / (sqrt(v) / bias_correction2_sqrt + eps)
// Element by element, so SIMD lanes and threads give the scalar loop's bits
// (on targets with FMA; without it, Highway's MulAdd rounds the product first).
void adamw_update(float* w, float* m, float* v, const float* g, int64_t n, const AdamWScalars& c);
// The same update, then g = 0 (the next step's zero_grad, in the same pass).
void adamw_update_zero_grad(float* w, float* m, float* v, float* g, int64_t n,
                            const AdamWScalars& c);
// Σ x[i]² summed in double (clip_grad_norm's squared norm of one gradient):
// fixed chunks in double vector lanes, added in chunk order (any thread count).
double sum_of_squares(const float* x, int64_t n);

// ---- every parameter in one parallel region (AdamW::step) ----
// At a small model's sizes one fork and join per parameter costs more than
// the update; these split the chunks of all the tensors over the threads at
// once, each element computed as the one-tensor kernel computes it.
struct AdamWTensor {
  float *w, *m, *v, *g;
  int64_t n;
  const AdamWScalars* scalars;  // its group's
};
// adamw_update_zero_grad on each of tensors[0, count): the same bits.
void adamw_update_zero_grad(const AdamWTensor* tensors, int64_t count);
// sums[t] = sum_of_squares(xs[t], ns[t]) for t in [0, count): the same bits.
void sum_of_squares(double* sums, const float* const* xs, const int64_t* ns, int64_t count);

// ---- bf16 rounding (the bf16 path's operands) -----------------------------------------
// dst[i] = to_bfloat16(src[i]) (attn/tensor.h: round to nearest even, every
// NaN to 0xFFFF), bit for bit, n elements, on the OpenMP threads when n is large.
void round_to_bf16(BFloat16* dst, const float* src, int64_t n);
// dst[i] = to_float(to_bfloat16(src[i])): the same rounding, kept in float32
// (a bf16 product's operand on a CPU that widens bf16 to fp32 anyway:
// attn/bf16_operand.h). dst may be src.
void round_to_bf16_values(float* dst, const float* src, int64_t n);
// y[i] = to_bfloat16(gelu(x[i])): gelu_forward's values rounded as they are
// stored (the bf16 path's input of the next product, in one pass).
void gelu_forward_bf16(BFloat16* y, const float* x, int64_t n);

// ---- a Linear layer's bias (forward: every row; backward: column sums) ----
// C (M, N; ldc): every row set to b (N), for a product that then adds onto it
// (beta = 1). Rows split over the OpenMP threads.
void fill_rows(float* C, int64_t ldc, const float* b, int64_t M, int64_t N);
// C (M, N; ldc): every row set to R's row (ldr) + b, for a product that then
// adds onto it: the residual add and the bias in the product's C.
void fill_rows_add(float* C, int64_t ldc, const float* b, const float* R, int64_t ldr, int64_t M,
                   int64_t N);
// db (N) += Σ_rows A (M, N; lda), rows in order for every column, the
// columns split over the OpenMP threads: the serial loop's bits for any
// thread count. A in float32, or bf16 summed in float32.
void column_sums_accumulate(float* db, const float* A, int64_t lda, int64_t M, int64_t N);
void column_sums_accumulate(float* db, const BFloat16* A, int64_t lda, int64_t M, int64_t N);

// The SIMD target the kernels run on ("AVX3", "AVX2", ...).
const char* layer_kernels_target();

}  // namespace attn::kernels
