// attn/generate.h - text generation with the chapter-4 GPT: a key/value cache
// for the whole model, the book's sampler (chapter 5 `generate`) and a
// character vocabulary's encode and decode. (Reading a checkpoint directory:
// attn/checkpoint.h.)
//
//   nn::GPTModel model(cfg);
//   model.eval();
//   nn::GPTKVCache cache = nn::make_gpt_kv_cache(model, /*batch=*/1);
//   Tensor logits = nn::forward_cached(model, prompt_ids, cache);  // (1, T0, V): prefill
//   Tensor next = nn::forward_cached(model, one_id, cache);        // (1, 1, V)
//
//   Generator gen(123);
//   Tensor out = nn::generate(model, prompt_ids, {.max_new_tokens = 20,
//                                                 .temperature = 1.0f, .top_k = 5}, gen);
//
// forward_cached(ids) treats the T_new new tokens as absolute positions
// cache.length() .. cache.length() + T_new - 1 (they index pos_emb) and returns
// the same logits GPTModel::forward gives for those rows of the whole sequence
// (up to rounding). Evaluation only: no dropout, nothing saved for backward,
// the modules' own state untouched.
//
// Beyond context_length: the cache holds at most context_length tokens. The
// book's generate crops its input to the last context_length tokens
// (idx[:, -context_size:]), so once a sequence is longer than that the model
// sees a sliding window whose positions restart at 0. generate() does exactly
// that: when the next token no longer fits, the cache is emptied and re-filled
// from the last context_length tokens (a full prefill per generated token from
// then on), so its tokens and logits are the book's. forward_cached itself
// never slides: tokens that would not fit are an std::invalid_argument naming
// the positions and context_length.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "attn/gpt.h"
#include "attn/kv_cache.h"
#include "attn/mla.h"
#include "attn/paged_kv_cache.h"
#include "attn/random.h"
#include "attn/tensor.h"

namespace attn::nn {

// bf16 generation (GPTOptions::dtype = kBFloat16): the model's matrices
// rounded to bf16 once, when the cache is made, so that each token reads half
// the bytes of fp32 (the model itself keeps its fp32 weights, as autocast does).
// The matrices are views into one bf16 allocation, in the order a token reads them.
struct GPTWeightsBf16 {
  struct Block {
    Tensor qkv;       // (3E, E) bf16: W_query, W_key, W_value's rows stacked
    Tensor qkv_bias;  // (3E) float32, or empty without qkv_bias
    Tensor out_proj;  // (E, E) bf16
    Tensor fc;        // (4E, E) bf16
    Tensor proj;      // (E, 4E) bf16
  };
  std::vector<Block> blocks;
  Tensor out_head;  // (V, E) bf16
};
// The model's weights rounded to bf16 (round to nearest even, as .to(torch.bfloat16)).
GPTWeightsBf16 round_weights_bf16(GPTModel& model);

// One KVCache per transformer block, for `batch` sequences that advance together.
// A bf16 model's cache (GPTOptions::dtype = kBFloat16) holds its keys and
// values in bf16 and the model's weights rounded to bf16 (`bf16_weights`,
// taken when the cache is made: after the weights change, make a new cache).
struct GPTKVCache {
  std::vector<KVCache> layers;  // layers[i]: trf_blocks.i.att
  // A latent-attention model's (GPTConfig::latent_dim > 0) instead of layers:
  // latent_layers[i] caches trf_blocks.i.att's latents (attn/mla.h).
  std::vector<LatentKVCache> latent_layers;
  int64_t batch = 0;
  int64_t context_length = 0;
  DType dtype = DType::kFloat32;  // of the keys and values, and of the products
  std::shared_ptr<const GPTWeightsBf16> bf16_weights;  // bf16 only
  // Tokens cached so far: the next token's position.
  int64_t length() const {
    if (!layers.empty()) return layers.front().length;
    return latent_layers.empty() ? 0 : latent_layers.front().length;
  }
  int64_t remaining() const { return context_length - length(); }
  void reset();
};

// An empty cache for `batch` sequences through `model`, of the model's dtype
// (a bf16 model's rounds its weights to bf16 here). Throws
// std::invalid_argument when batch < 1.
GPTKVCache make_gpt_kv_cache(GPTModel& model, int64_t batch);

// New token ids (B, T_new) int64, T_new >= 1 -> logits (B, T_new, V) at
// positions cache.length() ..; appends their keys and values to every layer.
// all_logits = false: only the last position's logits, (B, 1, V) (what
// generation samples from; the output head is then one row per sequence).
// Paths: with LayerImpl::kKernel one new token runs the decode kernels
// (attn/decode_kernels.h: GEMV products that read each weight once), and new
// tokens after a filled cache attend with the flash-decoding kernel
// (attn/decode_attention.h, fp32 or bf16 cache); a bf16 cache computes as the bf16 model's forward does
// (bf16 operands, fp32 sums, LayerNorm and GELU outputs and the attention's
// q, k, v and context rounded to bf16, the residual stream and logits fp32)
// on the cache's bf16 weights. RoPE models (GPTConfig::rope) rotate the new
// queries and keys at their positions; latent-attention models
// (GPTConfig::latent_dim) run each block's forward_cached of attn/mla.h on
// latent_layers.
// Throws std::invalid_argument (cache unchanged) when the ids are not (B, T_new)
// int64 with the cache's B, an id is outside [0, vocab_size), the tokens would
// not fit in context_length, the cache was made for another model shape, or
// the model is in training mode with drop_rate > 0.
Tensor forward_cached(GPTModel& model, const Tensor& ids, GPTKVCache& cache,
                      bool all_logits = true);

// Continuous batching (attn/paged_kv_cache.h) with the GPT: a pool of
// num_blocks blocks of block_size positions for the model's layers and heads.
// float32 models with the chapter's multi-head attention and learned
// positions (GPT-2) only: a bf16, RoPE, latent, grouped-query or windowed
// model is an std::invalid_argument naming what it has.
PagedKVCache make_paged_kv_cache(const GPTModel& model, int64_t block_size, int64_t num_blocks,
                                 DType dtype = DType::kFloat32);
// One batched step of sequences at their own positions, as the decoder's
// forward_paged (attn/decoder.h): ids (N), the new tokens of seqs[0], then
// seqs[1], ... -> logits (S, V) of each sequence's last new token; every
// product runs once over the N rows, each token's position embedding is its
// own sequence's position, each query attends over its own blocks. A row
// equals forward_cached's for that sequence alone, up to the products'
// rounding. Throws std::invalid_argument (nothing changed) as the decoder's
// does.
Tensor forward_paged(GPTModel& model, std::span<const int64_t> ids,
                     std::span<const PagedSequence> seqs, PagedKVCache& cache);

// The book's sampling of one next token per row, from logits (B, V) float32:
//   top_k > 0:        logits below the k-th largest of the row become -inf;
//   temperature > 0:  probs = softmax(logits / temperature),
//                     torch.multinomial(probs, 1): PyTorch 1.13's CPU draw
//                     (argmax of probs / q, q ~ Exp(1), one double uniform per
//                     element, row-major), so a seeded Generator gives torch's
//                     tokens for torch.manual_seed with the same seed;
//   temperature == 0: argmax (the first maximum), no draw.
// -> (B) token ids. Throws std::invalid_argument for temperature < 0 (or not
// finite), top_k < 0 or top_k > V.
std::vector<int64_t> sample_next(const Tensor& logits, float temperature, int64_t top_k,
                                 Generator& gen);
// The same with nucleus sampling after the temperature: of the softmax's
// probabilities, sorted largest first (ties by id), the tokens whose preceding
// cumulative probability is below top_p are kept (always the first), the rest
// get probability 0, and the draw is as above (torch.multinomial is
// indifferent to the kept probabilities' scale). top_p must be in (0, 1];
// top_p < 1 needs temperature > 0 (std::invalid_argument otherwise).
std::vector<int64_t> sample_next(const Tensor& logits, float temperature, int64_t top_k,
                                 float top_p, Generator& gen);

struct GenerateOptions {
  int64_t max_new_tokens = 0;
  float temperature = 0.0f;  // 0: greedy (argmax)
  int64_t top_k = 0;         // 0: no top-k filtering
  bool use_cache = true;     // false: a full forward over the (cropped) prefix every step
  // The book's eos_id: stop, without appending it, when the sampled token is
  // eos_id (for B > 1: when every row's token is).
  std::optional<int64_t> eos_id = std::nullopt;
  // Nucleus sampling (after top-k and temperature; needs temperature > 0):
  // keep the most probable tokens whose probabilities, largest first, reach
  // top_p (at least one), as transformers' TopPLogitsWarper. 1: off.
  float top_p = 1.0f;
  // Called with each step's sampled ids (B) once they are appended (not for
  // the eos_id that stops it): a streaming printer's hook.
  std::function<void(const std::vector<int64_t>&)> on_token = nullptr;
  // The element type of a decoder's key/value cache (attn/decoder.h): float32,
  // or bfloat16 (half the memory and the bytes each step reads; keys and
  // values rounded as they are stored, as transformers' bf16 cache holds them).
  DType kv_dtype = DType::kFloat32;
};

// The book's generate: for max_new_tokens steps, the logits of the last
// position of the last context_length tokens, sample_next, append.
// idx (B, T) int64 -> (B, T + max_new_tokens), fewer when eos_id stopped it. With use_cache the
// prompt is prefilled once and each step feeds one token (sliding window beyond context_length as
// described above). `on_step(step, logits)`, when given, sees each step's last-position logits (B,
// V) before sampling.
Tensor generate(GPTModel& model, const Tensor& idx, const GenerateOptions& options, Generator& gen,
                const std::function<void(int64_t, const Tensor&)>& on_step = nullptr);

// The mean cross-entropy of a token sequence under the model, by the sliding
// window of transformers' perplexity guide: windows [begin, end) with begin =
// 0, stride, 2 stride, ..., end = min(begin + context, n), stopping at the
// first that reaches n; each window scores only the tokens after the previous
// window's end (the first window all but its first token), each predicted from
// the tokens before it inside the window. mean_loss is the mean over all
// scored tokens (`tokens` of them: n - 1 when windows overlap, fewer when
// stride = context leaves each window's first token unscored), perplexity =
// exp(mean_loss).
// The model runs in evaluation mode. Throws std::invalid_argument when n < 2,
// context < 2 or > context_length, stride < 1 or > context, or an id is out
// of range.
struct PerplexityResult {
  int64_t tokens = 0;      // tokens scored
  double mean_loss = 0.0;  // nats per token
  double perplexity = 0.0;
};
PerplexityResult sliding_window_perplexity(GPTModel& model, const std::vector<int64_t>& ids,
                                           int64_t context, int64_t stride);
// The same for any model: logits_of(window (1, T) int64) -> (1, T, vocab_size)
// (the model in evaluation mode); context_length bounds `context`.
PerplexityResult sliding_window_perplexity(const std::function<Tensor(const Tensor&)>& logits_of,
                                           int64_t vocab_size, int64_t context_length,
                                           const std::vector<int64_t>& ids, int64_t context,
                                           int64_t stride);

// UTF-8 text -> ids with the vocabulary; throws std::invalid_argument naming the
// first character that is not in it (and its code point).
std::vector<int64_t> encode_text(const std::vector<std::string>& vocab, const std::string& text);
std::string decode_ids(const std::vector<std::string>& vocab, const std::vector<int64_t>& ids);

}  // namespace attn::nn
