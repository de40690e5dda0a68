// src/nn/sdpa_attention.h - the book's bonus variants of MultiHeadAttention
// (GroupedQueryAttention, ch04/04_gqa; MultiHeadAttentionWithSWA, ch04/06_swa)
// computed with attn::scaled_dot_product_attention_forward/backward
// (attn/sdpa.h), training and with a key/value cache.
//
//   x (B, T, d_in) ─ W_query ─> q (B, T, H·hd)   viewed (B, H, T, hd), token-major, in place
//                  ─ W_key   ─> k (B, T, G·hd)   viewed (B, G, T, hd)   G = num_kv_heads()
//                  ─ W_value ─> v (B, T, G·hd)   viewed (B, G, T, hd)
//   sdpa(q, k, v; is_causal, enable_gqa, window_left = w - 1) -> context (B, H, T, hd)
//   context -> (B, T, H·hd) -> out_proj -> y (B, T, d_out)
// Query head h reads key/value head h / (H / G): the book's repeat_interleave,
// without its copy. The window (w >= 1) keeps keys i - w + 1 .. i, the book's
// mask (q_pos - k_pos >= w masked); w = 0 is no window.
#pragma once

#include "attn/gemm.h"
#include "attn/kv_cache.h"
#include "attn/nn.h"
#include "attn/sdpa.h"
#include "attn/tensor.h"

namespace attn::nn::detail {

class SdpaAttention {
 public:
  explicit SdpaAttention(MultiHeadAttention& module) : m_(module) {}
  Tensor forward(const Tensor& x);    // (B, T, d_in) -> (B, T, d_out)
  Tensor backward(const Tensor& dy);  // (B, T, d_out) -> (B, T, d_in), accumulates grads
  bool has_forward() const { return has_forward_; }
  AttentionBackend last_backend() const { return last_; }
  // The softmax weights of the last forward, before dropout: (B, H, T, T),
  // recomputed from the saved q and k (0 outside the causal band and window).
  const Tensor& attention_weights();

 private:
  MultiHeadAttention& m_;
  SdpaOptions opts_;     // of the last forward (its dropout seed included)
  Tensor q_, k_, v_;     // (B, H, T, hd), (B, G, T, hd), (B, G, T, hd) views of the projections
  SdpaForward fwd_;      // out (B, H, T, hd), lse (B, H, T)
  Tensor weights_;       // attention_weights(), made on the first call after a forward
  bool has_forward_ = false;
  AttentionBackend last_ = AttentionBackend::kAuto;
};

// The SdpaOptions of a variant for queries at the end of Tk keys: causal,
// bottom-right aligned (the last query sees the last key; for Tq = Tk it is
// PyTorch's top-left), enable_gqa, window_left = w - 1.
SdpaOptions variant_sdpa_options(const MultiHeadAttention& m);

// forward_cached (attn/kv_cache.h) for a variant: the cache holds G = num_kv_heads()
// heads; the new queries attend, causally and within the window, to the cached
// keys and their own.
Tensor forward_cached_sdpa(const MultiHeadAttention& m, const Tensor& x_new, KVCache& cache,
                           gemm::Engine engine);

}  // namespace attn::nn::detail
