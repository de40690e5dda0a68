// attn/decoder.h - one configurable decoder for today's open models: Llama 3,
// Qwen2, Qwen3 and Gemma 3, as transformers computes them (LlamaForCausalLM,
// Qwen2ForCausalLM, Qwen3ForCausalLM, Gemma3ForCausalLM) and as the book's
// bonus chapters rebuild them (ch05/07_gpt_to_llama, 11_qwen3, 12_gemma3),
// with forward, backward and a key/value cache. (The files: attn/hf_decoder.h.)
//
//   DecoderLM                 model, lm_head
//     model                   embed_tokens, layers, norm
//       embed_tokens          Embedding (V, E); Gemma: its rows × sqrt(E)
//       layers.i              DecoderLayer (below)
//       norm                  RMSNorm(E)
//     lm_head                 Linear(E -> V, no bias); tied: embed_tokens.weight
//
//   DecoderLayer (x (B, T, E)):
//     Llama, Qwen   h = x + self_attn(input_layernorm(x))
//                   y = h + mlp(post_attention_layernorm(h))
//     Gemma 3       h = x + post_attention_layernorm(self_attn(input_layernorm(x)))
//                   y = h + post_feedforward_layernorm(mlp(pre_feedforward_layernorm(h)))
//   self_attn       q = q_proj(x) (B, T, H, hd), k, v = k_proj(x), v_proj(x) (B, T, Hkv, hd)
//                   (biases: qkv_bias; o_proj's: o_bias); q, k = q_norm(q), k_norm(k)
//                   over hd (QK-norm: Qwen3, Gemma 3); q, k rotated (attn/rope.h, the
//                   half-split form) by the layer's tables; out = SDPA(q, k, v,
//                   causal, scale, GQA, the layer's window, softcap); o_proj(out).
//   mlp             GatedFeedForward: down_proj(act(gate_proj(x)) ⊙ up_proj(x)), act
//                   SiLU (Llama, Qwen) or GELU tanh (Gemma); its modules are the
//                   book's fc1, fc2, fc3 (gate_proj, up_proj, down_proj).
//   logits          lm_head(norm(h)), then c · tanh(logits / c) with c = final_softcap.
//
// Every parameter is float32 (or, for inference, the matrices bf16:
// use_bf16_weights) and every product sums in float32; head_dim is
// independent of E / H. A sliding-window layer lets the query at position p
// see keys p - W + 1 .. p (transformers' sliding_window W; SdpaOptions
// window_left W - 1). Gemma 3's layers use two RoPE tables: `rope` on full
// layers, `rope_local` on sliding ones.
//
// Layout: token ids (B, T) int64, activations (B, T, E), logits (B, T, V).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "attn/generate.h"
#include "attn/gpt.h"
#include "attn/paged_kv_cache.h"
#include "attn/random.h"
#include "attn/rope.h"
#include "attn/sdpa.h"
#include "attn/tensor.h"

namespace attn::nn {

// One set of RoPE frequencies, transformers' rope_parameters entry:
//   kDefault   θ_i = theta^(-2i/hd)
//   kLinear    θ_i / factor (Gemma 3's global layers)
//   kLlama3    Llama 3's three bands (attn/rope.h RopeFreqConfig)
struct RopeScaling {
  enum class Type { kDefault, kLinear, kLlama3 };
  Type type = Type::kDefault;
  float theta = 10000.0f;                  // rope_theta
  float factor = 1.0f;                     // kLinear, kLlama3
  float low_freq_factor = 1.0f;            // kLlama3
  float high_freq_factor = 4.0f;           // kLlama3
  int64_t original_context_length = 8192;  // kLlama3: original_max_position_embeddings
};
// "default" | "linear" | "llama3".
const char* rope_type_name(RopeScaling::Type type);
// The inverse frequencies (hd / 2) of these parameters, float32 as transformers
// computes them (attn::rope_inverse_frequencies, then / factor for kLinear).
Tensor rope_frequencies(int64_t head_dim, const RopeScaling& rope);

struct DecoderConfig {
  std::string family;  // "llama", "qwen2", "qwen3", "gemma3_text": what the file said (labels only)
  int64_t vocab_size = 0;         // V
  int64_t hidden_size = 0;        // E
  int64_t intermediate_size = 0;  // the feed-forward's width
  int64_t num_layers = 0;
  int64_t num_heads = 0;          // H
  int64_t num_kv_heads = 0;       // Hkv, dividing H
  int64_t head_dim = 0;           // hd (even)
  int64_t context_length = 0;     // max_position_embeddings: the most positions a sequence has
  float norm_eps = 1e-6f;         // every RMSNorm's eps
  float norm_weight_offset = 0;   // Gemma: 1, its norms scale by 1 + weight
  bool qk_norm = false;           // q_norm, k_norm (RMSNorm(hd)): Qwen3, Gemma 3
  bool qkv_bias = false;          // q_proj, k_proj, v_proj biases: Qwen2, Llama's attention_bias
  bool o_bias = false;            // o_proj's bias: Llama's attention_bias
  bool sandwich_norms = false;    // Gemma's four norms per layer
  bool scale_embeddings = false;  // Gemma: embeddings × float(sqrt(E))
  GateActivation activation = GateActivation::kSiLU;
  float attention_scale =
      0.0f;                // the scores' scale; 0: 1 / sqrt(hd) (Gemma: query_pre_attn_scalar^-0.5)
  RopeScaling rope;        // full-attention layers
  RopeScaling rope_local;  // sliding-window layers
  int64_t sliding_window = 0;       // W of the sliding layers
  std::vector<bool> layer_sliding;  // per layer: a sliding-window layer (size num_layers, or empty)
  float attn_softcap = 0.0f;        // 0: off; else the scores' c · tanh(s / c)
  float final_softcap = 0.0f;       // 0: off; else the logits'
  bool tie_embeddings = true;       // lm_head.weight is embed_tokens.weight
  // >= 0: embed_tokens' row of this id gets no gradient from the embedding
  // lookup (torch's padding_idx; a tied lm_head still updates it).
  int64_t pad_token_id = -1;

  // The window of layer i: 0 for full attention, else sliding_window.
  int64_t layer_window(int64_t layer) const;
  // Throws std::invalid_argument naming the first value that makes no model.
  void check() const;
};

class DecoderAttention : public Module {
 public:
  DecoderAttention(const DecoderConfig& cfg, Generator& gen);
  // x (B, T, E); rope: the layer's tables with at least T rows; window 0 or W.
  Tensor forward(const Tensor& x, const RopeParams& rope, int64_t window);
  Tensor backward(const Tensor& dy);
  // Evaluation with a cache: q, k, v of x_new at positions offset .. offset +
  // T - 1 (rotated there); `attend(q, k, v)` (q (B, H, T, hd), k, v (B, Hkv, T,
  // hd)) returns the attention (B, H, T, hd). Nothing is saved.
  Tensor forward_with(
      const Tensor& x_new, const RopeParams& rope, int64_t offset,
      const std::function<Tensor(const Tensor&, const Tensor&, const Tensor&)>& attend);
  // Evaluation over a paged step (attn/paged_kv_cache.h): x_new (1, N, E), the
  // step's token rows, sequence after sequence; each sequence's rows rotated at
  // its own positions table->length ..; `attend(q, k, v)` (q (N, H, hd), k, v
  // (N, Hkv, hd), contiguous) returns the attention (N, H, hd). Nothing is saved.
  Tensor forward_paged(
      const Tensor& x_new, const RopeParams& rope, std::span<const PagedSequence> seqs,
      const std::function<Tensor(const Tensor&, const Tensor&, const Tensor&)>& attend);
  SdpaOptions sdpa_options(int64_t window) const;
  // Training's attention on bf16 q, k, v (DecoderLM::set_compute_dtype).
  void set_bf16_attention(bool on) { bf16_attention_ = on; }
  Linear q_proj, k_proj, v_proj, o_proj;
  std::unique_ptr<RMSNorm> q_norm, k_norm;  // cfg.qk_norm

 private:
  struct Qkv {
    Tensor q, k, v;  // (B, H, T, hd), (B, Hkv, T, hd) x2: rotated, head-major views
  };
  // eval: evaluation's products (GEMV for a few rows), nothing kept for backward.
  Qkv project(const Tensor& x, const RopeParams& rope, int64_t offset, bool eval);
  DecoderConfig cfg_;
  Tensor q_, k_, v_, out_, lse_, cos_, sin_;  // saved by forward
  int64_t window_ = 0;
  bool has_forward_ = false;
  bool bf16_attention_ = false;
};

class DecoderLayer : public Module {
 public:
  DecoderLayer(const DecoderConfig& cfg, int64_t index, Generator& gen);
  Tensor forward(const Tensor& x, const RopeParams& rope);
  Tensor backward(const Tensor& dy);
  // The layer with self_attn's attention given; eval: the feed-forward on
  // evaluation's products, nothing kept for backward (forward_cached).
  Tensor forward_with(const Tensor& x, const std::function<Tensor(const Tensor&)>& attention,
                      bool eval);
  int64_t window() const { return window_; }
  RMSNorm input_layernorm;
  DecoderAttention self_attn;
  RMSNorm post_attention_layernorm;  // Llama, Qwen: before mlp; Gemma: after self_attn
  std::unique_ptr<RMSNorm> pre_feedforward_layernorm, post_feedforward_layernorm;  // Gemma
  GatedFeedForward mlp;

 private:
  int64_t window_;
  bool sandwich_;
};

// model: embed_tokens, layers, norm (transformers' LlamaModel and kin).
class DecoderBody : public Module {
 public:
  DecoderBody(const DecoderConfig& cfg, Generator& gen);
  Embedding embed_tokens;
  Sequential layers_list;  // registered as "layers"
  std::vector<std::unique_ptr<DecoderLayer>> layers;
  RMSNorm norm;
};

class DecoderLM : public Module {
 public:
  explicit DecoderLM(const DecoderConfig& cfg, Generator& gen = default_generator());
  // ids (B, T) int64 in [0, V), 1 <= T <= context_length -> logits (B, T, V).
  Tensor forward(const Tensor& ids);
  // dlogits (B, T, V): accumulates every parameter's gradient.
  void backward(const Tensor& dlogits);
  // The mean cross-entropy of ids[:, 1:] predicted from ids[:, :-1]: what
  // transformers' model(ids, labels=ids).loss is. Keeps what backward_loss needs.
  float forward_loss(const Tensor& ids);
  // The mean cross-entropy of targets (B, T) int64 given ids (B, T) (a target
  // of -100 is skipped): a training window and its next tokens (attn train).
  float forward_loss(const Tensor& ids, const Tensor& targets);
  void backward_loss(float dloss = 1.0f);
  // hook(i) once layer i's backward is done (layers last to first), as
  // data-parallel training hands each layer's gradients on; nullptr: none.
  void set_backward_hook(std::function<void(int64_t layer)> hook) {
    backward_hook_ = std::move(hook);
  }
  const DecoderConfig& config() const { return cfg_; }
  // transformers' _init_weights for a model trained from scratch: every
  // matrix (the Linears' weights, the embedding) drawn from N(0, std) by gen
  // in named_parameters() order (initializer_range: 0.02), the pad row zero,
  // biases zero, the norms' scales 1. (The constructor's own draws are torch's
  // module defaults, the book's classes' init.)
  void init_weights(Generator& gen, float std = 0.02f);
  // Inference with bf16 weights: every matrix (the Linears' weights and the
  // embedding, tied or not) becomes bf16, rounded to nearest even, in place
  // of its float32 value (half the memory, half the bytes each decoded token
  // reads); each product then takes bf16 operands (the activations rounded as
  // they enter it) and sums in float32; norms, RoPE, attention, the residual
  // stream and the logits stay float32. forward() then runs the cached path
  // (evaluation only; in training mode it throws std::logic_error).
  void use_bf16_weights();
  DType weights_dtype() const;  // kFloat32, or kBFloat16 after use_bf16_weights
  // Mixed precision for training, as torch.autocast("cpu", dtype=torch.bfloat16)
  // (kBFloat16; kFloat32 turns it off): the weights, their gradients and the
  // optimizer stay float32; every Linear rounds its operands to bf16 where they
  // enter a product and sums in float32 (nn::Linear's bf16 mode), and the
  // attention runs on bf16 q, k, v (the native bf16 kernels, forward and
  // backward); norms, RoPE, activations, the residual stream, the logits and
  // the loss stay float32. Needs float32 weights (not use_bf16_weights).
  void set_compute_dtype(DType dtype);
  DType compute_dtype() const { return compute_dtype_; }
  // The tables of full and sliding layers, with at least `positions` rows
  // (made on first use, up to context_length).
  const RopeParams& rope_tables(bool sliding, int64_t positions);
  DecoderBody model;
  Linear lm_head;

  // Internal steps shared with forward_cached: embedding (B, T, E) and logits.
  Tensor embed(const Tensor& ids);
  Tensor head(const Tensor& h, bool save);
  // Gradients not made yet (a model built under NoInitScope): zeros of each
  // parameter's shape, the tied head sharing the embedding's. (The first
  // training forward makes them; an optimizer built before it calls this.)
  void make_grads();

 private:
  DecoderConfig cfg_;
  RopeParams rope_full_, rope_sliding_;
  Tensor softcap_tanh_;  // final_softcap: tanh(logits / c) of the last forward
  Tensor ids_;           // the last forward's ids (B, T)
  CrossEntropyLoss loss_;
  bool has_forward_ = false, has_loss_ = false;
  std::function<void(int64_t)> backward_hook_;
  DType compute_dtype_ = DType::kFloat32;
};

// ---- generation: a key/value cache ---------------------------------------------------------

// Keys and values of the tokens seen, per layer, for B sequences advancing
// together. A full layer keeps `capacity` rows; a sliding-window layer only
// the last min(W, capacity) (a ring: row p % rows holds position p), so its
// memory is bounded by the window, not by the sequence. float32 or bfloat16
// (keys and values rounded to bf16 as they are stored; the attention reads
// them widened, exactly).
struct DecoderKVCache {
  struct Layer {
    int64_t window = 0;  // 0: full
    Tensor keys;         // (B, Hkv, rows, hd), rotated; float32 or bfloat16
    Tensor values;       // (B, Hkv, rows, hd)
  };
  int64_t batch = 0;
  int64_t capacity = 0;  // the most tokens a sequence may reach
  int64_t length = 0;    // tokens so far: the next token's position
  std::vector<Layer> layers;
  void reset() { length = 0; }
  int64_t remaining() const { return capacity - length; }
  int64_t bytes() const;  // what the keys and values hold
};

// capacity 1 .. context_length; dtype float32 or bfloat16. Throws
// std::invalid_argument naming the values.
DecoderKVCache make_kv_cache(const DecoderLM& model, int64_t batch, int64_t capacity,
                             DType dtype = DType::kFloat32);

// ids_new (B, T_new) at positions length .. length + T_new - 1 -> logits (B, T_new, V),
// equal to forward()'s rows for them; then length += T_new. Evaluation only:
// with at most 16 rows (B · T_new) every product streams its weights once
// (GEMV, attn/decode_kernels.h). last_only: the logits of the last position
// alone (B, 1, V), what generation samples from (the head is skipped for the
// prompt's other rows).
Tensor forward_cached(DecoderLM& model, const Tensor& ids_new, DecoderKVCache& cache,
                      bool last_only = false);

// Generation as attn/generate.h's generate with the cache: prompt (B, T) ->
// (B, T + n); stops early when every row's token is options.eos_id or one of
// stop_ids (not appended). Throws std::invalid_argument when the prompt and
// max_new_tokens pass context_length.
Tensor generate(DecoderLM& model, const Tensor& prompt, const GenerateOptions& options,
                Generator& gen, const std::vector<int64_t>& stop_ids = {});

// ---- continuous batching: a paged cache (attn/paged_kv_cache.h) -----------------------------

// A pool of num_blocks blocks of block_size positions for this model's layers,
// key/value heads and head_dim. Throws std::invalid_argument naming a size < 1.
PagedKVCache make_paged_kv_cache(const DecoderLM& model, int64_t block_size, int64_t num_blocks,
                                 DType dtype = DType::kFloat32);

// One batched step of sequences at their own positions: ids (N), the new
// tokens of seqs[0], then seqs[1], ... -> logits (S, V), row s the logits of
// seqs[s]'s last new token; then every table's length += its count. Every
// product runs once over the N rows (one read of each weight for the whole
// batch); each sequence's queries attend over its own blocks
// (paged_attention_forward, the layer's window and softcap). A row equals
// forward_cached's logits for that sequence run alone, up to the products'
// rounding (GEMV for at most 16 rows, GEMM above). Throws std::invalid_argument
// (nothing changed) when the step fails check_paged_step, ids has not N
// entries or an id is outside [0, V), a sequence would pass context_length,
// or the cache was made for another shape.
Tensor forward_paged(DecoderLM& model, std::span<const int64_t> ids,
                     std::span<const PagedSequence> seqs, PagedKVCache& cache);

}  // namespace attn::nn
