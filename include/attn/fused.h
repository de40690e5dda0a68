// attn/fused.h - the fast path of the attention modules: projections on the
// fast GEMM (gemm::Engine::kFast, attn/gemm.h) around the fused
// flash-attention kernel (attn/kernels.h).
//
// The same maths as MultiHeadAttention's reference path (and, with one head
// and no output projection, CausalAttention's), computed without a (T, T)
// tensor and without transposes:
//   qkv     = x [W_query; W_key; W_value]ᵀ + [b_query; b_key; b_value]   (B·T, 3·d_out)
//   q, k    = RoPE(q), RoPE(k) in place      (only with options.rope_cos/rope_sin)
//   context = softmax(scale · q kᵀ, causal) v  per head (flash kernel)    (B·T, d_out)
//   y       = context W_outᵀ + b_out     (or y = context without W_out)   (B·T, d_out)
// q, k and v are read in place from the one qkv buffer (columns [0, d_out),
// [d_out, 2·d_out), [2·d_out, 3·d_out), token stride 3·d_out); head h is
// columns h·hd .. h·hd + hd - 1 of each, i.e. the (B, T, H, hd) view the
// reference path transposes to (B, H, T, hd). The kernel writes context in
// that same (B, T, H, hd) = (B, T, d_out) layout, which is what out_proj reads.
//
// Backward keeps what the flash kernel needs: x, qkv, context and the
// log-sum-exp (B, H, T); no attention weights. It runs
//   dcontext = dy W_out,  dW_out += dyᵀ context,  db_out += Σ_rows dy
//   dqkv     = flash backward (same layout and strides as qkv)           (B·T, 3·d_out)
//   dx       = Σ_j dqkv_j W_j,  dW_j += dqkv_jᵀ x,  db_j += Σ_rows dqkv_j   (j = q, k, v)
// Each projection is one sgemm (attn/gemm.h) on a column block of qkv / dqkv
// (leading dimension 3·d_out), so the three weights never need to be copied
// into one concatenated matrix. The products run on the OpenMP threads that
// run the kernel, each a single-threaded sgemm on its own block of rows
// (gemm::sgemm_rows_parallel); the BLAS's thread count is set to 1 for the
// duration and restored after (a process-wide setting: BLAS calls made
// concurrently from other threads run single-threaded meanwhile).
//
// bf16 (options.dtype = DType::kBFloat16), mixed precision as under
// torch.autocast("cpu", dtype=torch.bfloat16): the weights stay fp32 (the
// master copy; gradients accumulate into fp32), x, the weights and dy are
// rounded to bf16 where they enter a product, every product sums in fp32
// (gemm::gemm_bf16, the bf16 flash kernels), qkv, the context and the
// kernel's gradients are kept in bf16, biases are added and summed in fp32,
// and y and dx come out fp32 (the products' fp32 sums, not rounded).
//
// Dropout uses the kernel's counter-based Philox noise (attn/kernels.h): the
// masks are a function of dropout_seed and the coordinates (b, h, i, j), not
// PyTorch's MT19937 stream; kernels::flash_dropout_noise gives the same mask
// as a tensor.
#pragma once

#include <array>
#include <cstdint>

#include "attn/bf16_operand.h"
#include "attn/kernels.h"
#include "attn/tensor.h"

namespace attn::fused {

// The projection weights in nn.Linear's layout: weight (out, in), bias (out).
// A bias or the output projection may be absent (nullptr).
struct ProjectionWeights {
  const Tensor* W_query = nullptr;  // (d_out, d_in)
  const Tensor* W_key = nullptr;    // (d_out, d_in)
  const Tensor* W_value = nullptr;  // (d_out, d_in)
  const Tensor* b_query = nullptr;  // (d_out) or nullptr
  const Tensor* b_key = nullptr;    // (d_out) or nullptr
  const Tensor* b_value = nullptr;  // (d_out) or nullptr
  const Tensor* W_out = nullptr;    // (d_out, d_out) or nullptr: y = context
  const Tensor* b_out = nullptr;    // (d_out) or nullptr
};

// Where backward accumulates (+=) the parameter gradients: the same fields,
// the same shapes; nullptr exactly where the weight is nullptr.
struct ProjectionGrads {
  Tensor* W_query = nullptr;
  Tensor* W_key = nullptr;
  Tensor* W_value = nullptr;
  Tensor* b_query = nullptr;
  Tensor* b_key = nullptr;
  Tensor* b_value = nullptr;
  Tensor* W_out = nullptr;
  Tensor* b_out = nullptr;
};

struct AttentionBlockOptions {
  int64_t num_heads = 1;   // H; head_dim = d_out / H must be in 1 .. kernels::kMaxHeadDim
  bool causal = true;      // mask keys j > i
  float scale = -1.0f;     // < 0 means 1/sqrt(head_dim)
  float dropout_p = 0.0f;  // in [0, 1); 0 is no dropout
  uint64_t dropout_seed = 0;
  DType dtype = DType::kFloat32;  // the compute dtype: kFloat32, or kBFloat16 (mixed precision)
  // Rotary position embedding (attn/rope.h) of q and k, token t at position t:
  // the tables (L >= T, head_dim) float32, both or neither. q and k are rotated
  // in the qkv buffer after the projections (in bf16 mode after rounding, then
  // rounded again), and dq, dk rotated back before the projections' backward.
  const Tensor* rope_cos = nullptr;
  const Tensor* rope_sin = nullptr;
};

// What the forward keeps for the backward, and the backward's own buffers.
// Both calls write into these tensors, reusing their storage when the shapes
// match the previous step's (a training loop allocates nothing after its
// first step: fresh buffers of tens of MB cost a page fault per 4 KB);
// assigning {} releases everything.
struct AttentionBlockSaved {
  Tensor x;        // (B, T, d_in)     fp32 mode: x (bf16 mode: empty, x_bf16)
  Tensor qkv;      // (B, T, 3·d_out)  q | k | v, in the compute dtype
  Tensor context;  // (B, T, d_out)    the kernel's output, out_proj's input, in the compute dtype
  // bf16 mode: the products' operands, each made once for the forward's and
  // the backward's products in the form gemm_bf16's route takes
  // (attn/bf16_operand.h): x rounded (B, T, d_in), the context, and W_query,
  // W_key, W_value, W_out rounded.
  kernels::Bf16Operand x_bf16, context_bf16;
  std::array<kernels::Bf16Operand, 4> weights_bf16;
  Tensor lse;                          // (B, H, T)        natural-log log-sum-exp of each score row
  kernels::FlashAttentionParams params;
  Tensor dcontext;  // (B, T, d_out)    backward: dy W_out (empty without W_out)
  Tensor dqkv;      // (B, T, 3·d_out)  backward: dq | dk | dv from the kernel (compute dtype)
  // bf16 mode: the fp32 sums of qkv and dcontext before they are rounded,
  // and the operands dy rounded and dqkv; scratch, kept only to be reused.
  Tensor qkv_f32, dcontext_f32;
  kernels::Bf16Operand dy_bf16, dqkv_bf16;
  Tensor rope_cos, rope_sin;  // the forward's RoPE tables (empty without)
};

// x (B, T, d_in) -> y (B, T, d_out). x is float32, or in bf16 mode also bf16
// (taken as the rounded x, e.g. a bf16 LayerNorm's output). Throws
// std::invalid_argument naming the values when shapes, dtypes or options do
// not fit. saved may be nullptr (inference).
Tensor attention_block_forward(const Tensor& x, const ProjectionWeights& w,
                               const AttentionBlockOptions& options, AttentionBlockSaved* saved);

// dy (B, T, d_out) -> dx (B, T, d_in); accumulates the parameter gradients.
// Writes its scratch into saved.dcontext and saved.dqkv.
Tensor attention_block_backward(const Tensor& dy, const ProjectionWeights& w,
                                AttentionBlockSaved& saved, const ProjectionGrads& grads);

// The useful floating-point operations of one forward, for benchmarks: the
// four projections 2·B·T·d_in·d_out each (out_proj: d_out·d_out), plus the core
// 4·B·H·T²·hd, halved when causal. Backward is 2x the projections and 2.5x the
// core.
double attention_block_forward_flops(int64_t B, int64_t T, int64_t d_in, int64_t d_out, bool causal,
                                     bool out_proj);
double attention_block_backward_flops(int64_t B, int64_t T, int64_t d_in, int64_t d_out,
                                      bool causal, bool out_proj);

}  // namespace attn::fused
