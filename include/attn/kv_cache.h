// attn/kv_cache.h - generating one token at a time with MultiHeadAttention:
// a key/value cache for incremental (autoregressive) decoding.
//
// A causal attention layer's output at position p depends only on tokens
// 0..p, and the keys and values of those tokens never change once computed.
// So instead of running forward() on the whole, growing sequence for every new
// token (O(T^2) attention work per token, O(T^3) for a sequence), a decoder
// keeps the keys and values of the tokens it has seen and, for each new token,
// projects only that token, appends its key and value, and lets its query
// attend over the cache: O(T) per token.
//
//   nn::MultiHeadAttention mha({.d_in = 768, .d_out = 768, .context_length = 1024,
//                               .num_heads = 12});
//   mha.eval();
//   nn::KVCache cache = nn::make_kv_cache(mha, /*batch=*/1);
//   Tensor y = nn::forward_cached(mha, prompt, cache);   // prefill: (1, T0, 768)
//   Tensor y1 = nn::forward_cached(mha, x_next, cache);  // one token: (1, 1, 768)
//   cache.reset();                                       // a new sequence
//
// Layout: the cache preallocates keys and values as (B, H, context_length, hd),
// the same per-head layout as MultiHeadAttention's (B, H, T, hd), with rows
// [0, length) of every (b, h) filled; token t of the sequence lives in row t.
// forward_cached(x_new) with x_new (B, T_new, d_in) treats its tokens as absolute
// positions length .. length + T_new - 1: the query at position p sees the keys
// 0..p (the earlier cached ones and the new ones up to itself), exactly the rows
// MultiHeadAttention::forward's causal mask lets it see on the full sequence, so
// the outputs equal forward()'s rows for those positions (up to rounding).
//
// With RoPE (MultiHeadAttentionOptions::rope) the new queries and keys are
// rotated at their positions length .. length + T_new - 1 before the keys are
// cached, so the cache holds rotated keys, as the uncached forward computes them.
//
// The book's variants (GroupedQueryAttention, MultiHeadAttentionWithSWA,
// attn/nn.h) cache their num_kv_heads() heads and attend with
// attn::scaled_dot_product_attention (bottom-right causal alignment, the
// window's keys only); their outputs equal forward()'s rows the same way.
//
// Evaluation only: no dropout is applied and nothing is kept for backward. The
// module's own state (what its last forward() saved for backward()) is not
// touched, so generation can be interleaved with training steps.
#pragma once

#include <cstdint>

#include "attn/functional.h"
#include "attn/nn.h"
#include "attn/tensor.h"

namespace attn::nn {

// The keys and values of the tokens a MultiHeadAttention has seen, for one
// batch of B sequences that advance together. Made by make_kv_cache for one
// module shape (num_heads, head_dim, context_length).
struct KVCache {
  int64_t batch = 0;           // B
  int64_t num_heads = 0;       // H: the key/value heads (GroupedQueryAttention: num_kv_groups)
  int64_t head_dim = 0;        // hd
  int64_t context_length = 0;  // capacity: the most tokens one sequence can hold
  Tensor keys;                 // (B, H, context_length, hd), rows [0, length) valid
  Tensor values;               // (B, H, context_length, hd), rows [0, length) valid
  int64_t length = 0;          // tokens cached so far: the next token's position

  // Empties the cache for a new sequence (and clears the buffers).
  void reset();
  // How many more tokens fit: context_length - length.
  int64_t remaining() const { return context_length - length; }
};

// An empty cache for `batch` sequences through `mha`: keys and values of shape
// (batch, num_heads, context_length, head_dim), zero-filled, length 0.
// Throws std::invalid_argument when batch < 1.
KVCache make_kv_cache(const MultiHeadAttention& mha, int64_t batch);

// The next tokens x_new (B, T_new, d_in), T_new >= 1 (a prompt to prefill, or one
// token): projects them with W_query, W_key, W_value, writes their keys and
// values into rows [length, length + T_new) of the cache, attends causally over
// all cached positions (ref::cached_attention_forward), merges the heads and
// applies out_proj -> (B, T_new, d_out); then length += T_new.
// Throws std::invalid_argument, leaving the cache unchanged, when x_new is not
// (B, T_new, d_in) for the cache's B and the module's d_in, when the tokens would
// not fit (length + T_new > context_length), when the cache was made for
// another module shape or its buffers were changed, or when the module is in
// training mode with dropout p > 0 (call eval(): generation applies no dropout).
// engine: the GEMM of the four projections (attn/gemm.h); kBlas sums as PyTorch.
// With kFast, a prefill of an empty cache (length 0, T_new > 1) computes the
// attention with the flash kernel (attn/kernels.h), reading the projections
// token-major in place; later tokens attend with the flash-decoding kernel
// (attn/decode_attention.h, blocks of up to kMaxDecodeQueries new tokens; one
// token's projections are GEMVs). kBlas: ref::cached_attention_forward.
Tensor forward_cached(const MultiHeadAttention& mha, const Tensor& x_new, KVCache& cache,
                      gemm::Engine engine = gemm::Engine::kBlas);

}  // namespace attn::nn
