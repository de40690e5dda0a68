// src/nn/backend.h - what the attention modules with two paths share: the
// choice between the reference and the fused path (the table at the top of
// attn/nn.h), the fused block's options, weights and gradient slots taken from
// the modules' Linear layers, and the weights recomputed after a fused forward.
// Used by CausalAttention, MultiHeadAttention (attention.cpp) and Head (head.cpp).
#pragma once

#include <cstdint>

#include "attn/functional.h"
#include "attn/fused.h"
#include "attn/nn.h"
#include "attn/tensor.h"

namespace attn::nn::detail {

constexpr int64_t kFusedMaxHeadDim = 256;  // the flash kernel's limit

// backend = kFused asked for what the kernel cannot do: an error at
// construction naming the values (head_dim > 256, dropout >= 1, a softmax over
// the queries: softmax_dim other than -1 or 2).
void check_fused_request(const char* module, AttentionBackend backend, int64_t head_dim,
                         float dropout, int64_t softmax_dim = -1);

// kAuto: fused whenever the results may differ from the reference only by
// rounding, or the caller allows other dropout masks; reference otherwise.
// kernel_can: the module's configuration is one the kernel computes.
AttentionBackend choose(AttentionBackend requested, const Dropout& dropout, bool exact_dropout,
                        bool kernel_can);

// The fused block's options for this forward: num_heads, the causal mask and
// the scale of the reference options `attention` (scale < 0: 1/sqrt(head_dim)
// on both paths), and dropout: one seed drawn from the module's generator when
// dropout is active, nothing drawn otherwise.
fused::AttentionBlockOptions fused_options(int64_t num_heads, Dropout& dropout,
                                           const ref::AttentionOptions& attention);

// The block's weights and gradient slots from the modules' Linear layers
// (weight (d_out, d_in), bias (d_out) when the layer has one); out_proj may be
// nullptr (y = context).
fused::ProjectionWeights projection_weights(const Linear& W_query, const Linear& W_key,
                                            const Linear& W_value, const Linear* out_proj);
fused::ProjectionGrads projection_grads(Linear& W_query, Linear& W_key, Linear& W_value,
                                        Linear* out_proj);

// The backward of a fused forward: dy must be (B, T, width) for the B and T of
// the saved x (the module's gradient-shape error otherwise); accumulates the
// parameter gradients and returns dx (B, T, d_in).
Tensor fused_backward(const char* module, const Tensor& dy, int64_t width,
                      const fused::ProjectionWeights& w, fused::AttentionBlockSaved& saved,
                      const fused::ProjectionGrads& grads);

// The reference path's dropout noise as ref::attention_forward takes it:
// nullptr when dropout is off (Dropout::sample_noise gave an empty tensor).
inline const Tensor* noise_or_null(const Tensor& noise) { return noise.empty() ? nullptr : &noise; }

// The softmax weights (B, H, T, T) of a fused forward, recomputed with the
// reference maths (the saved causal flag and scale) from the q and k it saved
// in qkv (B, T, 3·d_out).
Tensor recomputed_weights(const fused::AttentionBlockSaved& s);
// The same for a one-head module (CausalAttention, Head): (B, T, T).
Tensor recomputed_head_weights(const fused::AttentionBlockSaved& s);

}  // namespace attn::nn::detail
