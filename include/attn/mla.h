// attn/mla.h - multi-head latent attention (MLA, DeepSeek-V2's) as the book's
// bonus chapter defines it (ch04/05_mla/gpt_with_kv_mla.py,
// MultiHeadLatentAttention), forward and backward, with its cache of latents.
//
// Keys and values are not projected from x directly but through a narrow
// latent c of latent_dim values per token; the cache stores c, not k and v:
//
//   q = x W_queryᵀ                  (B, T, d_out)   -> heads (B, H, T, hd)
//   c = x W_DKVᵀ                    (B, T, latent_dim)      the latent ("down")
//   k = c W_UKᵀ,  v = c W_UVᵀ       (B, Tk, d_out)  -> heads (B, H, Tk, hd) ("up")
//   context = softmax(q kᵀ / sqrt(hd), causal) v    attn::scaled_dot_product_attention
//   y = context W_outᵀ + b_out      (B, T, d_out)
//
// Parameters in the book's attribute order and state_dict names:
//   W_query  Linear(d_in, d_out, bias = qkv_bias)
//   W_DKV    Linear(d_in, latent_dim, bias = qkv_bias)
//   W_UK     Linear(latent_dim, d_out, bias = qkv_bias)
//   W_UV     Linear(latent_dim, d_out, bias = qkv_bias)
//   out_proj Linear(d_out, d_out) (with bias)
// latent_dim 0 takes the book's default max(16, d_out / 8). The products use
// the BLAS engine (PyTorch's sums), so manual_seed(s) and the same options give
// the book's module's weights bit for bit and its outputs to float rounding.
//
// The attention runs on attn's fused kernel (attn/sdpa.h,
// scaled_dot_product_attention_forward / _backward, is_causal): q, k and v are
// read in place as token-major views of the projections, no (T, T) matrix is
// formed. Dropout on the attention weights (training mode, dropout > 0) uses the
// kernel's Philox noise, its seed one random64() from the module's generator
// per forward: not PyTorch's masks.
//
// The latent cache (the book's cache_c_kv and ptr_current_pos): forward_cached
// appends the new tokens' latents and up-projects the whole cached latent to
// keys and values on every call, as the book does; the T_new queries sit at
// positions length .. length + T_new - 1 and see the keys up to their own
// position (the causal mask aligned bottom-right), so the outputs equal the
// uncached forward's rows at those positions. A cache holds latent_dim values
// per token instead of 2 · d_out.
#pragma once

#include <cstdint>

#include "attn/nn.h"
#include "attn/random.h"
#include "attn/sdpa.h"
#include "attn/tensor.h"

namespace attn::nn {

struct MultiHeadLatentAttentionOptions {
  int64_t d_in = 0;
  int64_t d_out = 0;  // H · hd
  float dropout = 0.0f;
  int64_t num_heads = 1;
  bool qkv_bias = false;
  int64_t latent_dim = 0;  // 0: max(16, d_out / 8), the book's latent_dim=None
};

// MultiHeadLatentAttention(d_in, d_out, dropout, num_heads, qkv_bias, latent_dim).
// Input (B, T, d_in) -> (B, T, d_out). Throws std::invalid_argument naming the
// values for d_out % num_heads != 0, sizes < 1, dropout outside [0, 1).
class MultiHeadLatentAttention : public Module {
 public:
  explicit MultiHeadLatentAttention(const MultiHeadLatentAttentionOptions& options,
                                    Generator& gen = default_generator());
  Tensor forward(const Tensor& x);
  // dy (B, T, d_out) -> dx (B, T, d_in); accumulates every parameter's gradient.
  Tensor backward(const Tensor& dy);
  const MultiHeadLatentAttentionOptions& options() const { return options_; }
  int64_t head_dim() const { return options_.d_out / options_.num_heads; }
  int64_t latent_dim() const { return options_.latent_dim; }  // resolved (never 0)
  Linear W_query, W_DKV, W_UK, W_UV, out_proj;
  Dropout dropout;

 private:
  SdpaOptions sdpa_options() const;
  MultiHeadLatentAttentionOptions options_;
  uint64_t dropout_seed_ = 0;
  float dropout_p_ = 0.0f;
  int64_t B_ = 0, T_ = 0;
  Tensor q_, k_, v_;  // (B, T, d_out) projections, read as (B, H, T, hd) views
  Tensor out_, lse_;  // the kernel's (B, H, T, hd) and (B, H, T)
  bool has_forward_ = false;
};

// The book's latent cache for B sequences that advance together.
struct LatentKVCache {
  int64_t batch = 0;           // B
  int64_t latent_dim = 0;      // the module's
  int64_t context_length = 0;  // capacity: the most tokens one sequence can hold
  Tensor c_kv;                 // (B, context_length, latent_dim), rows [0, length) valid
  int64_t length = 0;          // tokens cached: the next token's position (ptr_current_pos)

  void reset();  // a new sequence (reset_cache)
  int64_t remaining() const { return context_length - length; }
};

// An empty cache of `context_length` tokens for `batch` sequences through `mla`.
// Throws std::invalid_argument when batch or context_length < 1.
LatentKVCache make_latent_kv_cache(const MultiHeadLatentAttention& mla, int64_t batch,
                                   int64_t context_length);

// The book's forward(x_new, use_cache=True): x_new (B, T_new, d_in) -> (B,
// T_new, d_out); then cache.length += T_new. Evaluation only (no dropout, no
// saved state: the module's last forward() stays usable for backward()).
// Throws std::invalid_argument, the cache unchanged, for a wrong shape, a cache
// of another batch or latent_dim, tokens that do not fit, or training mode with
// dropout > 0.
Tensor forward_cached(const MultiHeadLatentAttention& mla, const Tensor& x_new,
                      LatentKVCache& cache);

}  // namespace attn::nn
