// attn/linear_cross_entropy.h - a GPT's output head and its mean cross-entropy
// in one pass, chunk by chunk over the rows, so that the (N, V) logits and
// their gradient are never held whole (Liger-Kernel's
// FusedLinearCrossEntropy, on a CPU).
//
// The specification is the plain path it replaces (GPTModel's out_head, a
// Linear without bias, then ref::cross_entropy_forward / _backward):
//   logits = h Wᵀ                                   (N, V)
//   loss   = (1/n) Σ_{r counted} lse(logits[r]) − logits[r, t_r]
//   dlogits[r] = (softmax(logits[r]) − onehot(t_r)) / n, 0 for ignored rows
//   dh = dlogits W        (N, E)      dW = dlogitsᵀ h   (V, E)
// with n the rows whose target is not ignore_index. The fused form computes,
// for each chunk of C rows in turn, the chunk's logits (one GEMM), each row's
// log-sum-exp and loss, overwrites the logits with dlogits, then the chunk's
// dh (one GEMM) and adds its share of dW (one GEMM): the gradients come out of
// the forward pass (as Liger's forward computes them), so a trainer's backward
// only scales them by dL/dloss and hands them on. The memory of the loss is one
// chunk, C·V floats (C = 512, V = 50,257: 103 MB), against three (N, V) float
// tensors on the plain path (logits, softmax, dlogits: 4.9 GB at N = 8192).
//
// Numerics: the products run on gemm::Engine::kFast (fp32), or on
// gemm::gemm_bf16 in bf16 mode (h, W and dlogits rounded to bf16 as the plain
// bf16 Linear rounds them; sums in float32); the log-sum-exp is a SIMD float
// sum of exp(x − max) per row (Highway's Exp; kernels::cross_entropy_rows,
// attn/cross_entropy_rows.h), the loss summed over rows in double. The values
// match the plain path within float rounding (the tests state the
// tolerances), not bit for bit.
#pragma once

#include <cstdint>

#include "attn/functional_gpt.h"
#include "attn/tensor.h"

namespace attn::nn {

// Rows per chunk when LinearCrossEntropyOptions::chunk_rows is 0: 512. Large
// enough for the GEMMs to run at full speed (each chunk's products have
// M = 512 or K = 512), small enough that the chunk's logits (512 × V floats,
// 103 MB for GPT-2's vocabulary) are a small part of a 124M model's training
// memory.
inline constexpr int64_t kDefaultChunkRows = 512;

struct LinearCrossEntropyOptions {
  int64_t ignore_index = ref::kIgnoreIndex;  // F.cross_entropy's, -100
  int64_t chunk_rows = 0;                    // 0: kDefaultChunkRows
  // The products' dtype: kFloat32, or kBFloat16 (mixed precision as
  // GPTOptions::dtype: bf16 operands, float32 sums; logits, loss, dh and dW
  // float32).
  DType dtype = DType::kFloat32;
};

// h (N, E) float32 (bf16 also accepted in bf16 mode, taken as rounded
// already), W (V, E) float32, targets (N) int64 with values in [0, V) or
// ignore_index. Returns the mean loss (NaN when no row is counted, as PyTorch).
// With dh: dh is set to dloss/dh (N, E) float32 for dL/dloss = 1. With dW:
// dW (V, E) float32 += dloss/dW. Throws std::invalid_argument naming the
// shapes or dtypes that do not fit, and a target out of range by its value and
// row ("target 70000 at position 13 is out of range for 50257 classes").
float linear_cross_entropy(const Tensor& h, const Tensor& W, const Tensor& targets,
                           const LinearCrossEntropyOptions& options = {}, Tensor* dh = nullptr,
                           Tensor* dW = nullptr);

}  // namespace attn::nn
