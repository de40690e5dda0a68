// attn/gpt.h - the book's GPT model (Raschka, "Build a Large Language Model
// from Scratch", chapter 4) as modules with forward and backward, and its loss.
//
//   GPTModel            tok_emb, pos_emb, drop_emb, trf_blocks, final_norm, out_head
//     TransformerBlock  x + drop_shortcut(att(norm1(x))), then x + drop_shortcut(ff(norm2(x)))
//       att             nn::MultiHeadAttention (d_in = d_out = emb_dim, causal); with
//                       cfg.n_kv_groups or cfg.sliding_window_size the book's
//                       GroupedQueryAttention or MultiHeadAttentionWithSWA variant of it
//       ff              FeedForward: layers.0 Linear(E, 4E), layers.1 GELU, layers.2 Linear(4E, E)
//       norm1, norm2    LayerNorm: scale, shift, eps 1e-5, biased variance
//
// Parameters are created in the book's (PyTorch's) order with PyTorch's default
// initialisation, so manual_seed(123) and GPTModel(cfg) give the book's
// model's weights bit for bit, under the book's state_dict names
// ("tok_emb.weight", "trf_blocks.0.att.W_query.weight",
// "trf_blocks.0.ff.layers.0.weight", "trf_blocks.0.norm1.scale",
// "final_norm.shift", "out_head.weight"). out_head is not tied to tok_emb (the
// book counts 163,009,536 parameters for GPT_CONFIG_124M) unless
// cfg.tie_embeddings (GPT-2's checkpoints: 124,439,808 with qkv_bias), when
// out_head.weight is tok_emb.weight and state_dict() has it once, as
// "tok_emb.weight".
//
// Dropout: in training mode with drop_rate > 0 every dropout draws from the
// model's generator in the book's order (drop_emb; per block the attention
// weights, then drop_shortcut twice), so with the attention on its reference
// path the masks are PyTorch's. The attention picks its path by itself
// (GPTOptions::attention_backend, kAuto by default): the fused kernel whenever
// the result can differ from the reference only by rounding (evaluation mode,
// drop_rate 0) and, in training with dropout, the reference path unless
// exact_dropout is false (then the fused kernel with its Philox masks: fast,
// not PyTorch's masks).
//
// Layout: token ids (B, T) int64, activations (B, T, E) with E = emb_dim,
// logits (B, T, V) with V = vocab_size.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "attn/bf16_operand.h"
#include "attn/functional_gpt.h"
#include "attn/mla.h"
#include "attn/nn.h"
#include "attn/random.h"
#include "attn/tensor.h"

namespace attn::nn {

// The book's configuration dictionary, same names.
struct GPTConfig {
  int64_t vocab_size = 0;
  int64_t context_length = 0;
  int64_t emb_dim = 0;
  int64_t n_heads = 1;
  int64_t n_layers = 1;
  float drop_rate = 0.0f;
  bool qkv_bias = false;
  // Not in the book's dictionary; the defaults are the book's model. GPT-2 as
  // Hugging Face stores it (attn/hf_gpt2.h) reads both from its config.json.
  float layer_norm_eps = 1e-5f;  // every LayerNorm's eps (layer_norm_epsilon)
  bool tie_embeddings = false;   // out_head.weight is tok_emb.weight (nn::tie)
  // Rotary position embedding instead of pos_emb, as the book's Llama
  // conversion does (ch05/07_gpt_to_llama): no pos_emb parameter (not in
  // state_dict, no draws from the generator), and q and k of every attention
  // layer rotated (attn/rope.h) by compute_rope_params(emb_dim / n_heads,
  // theta_base, context_length); generation rotates each new token at its
  // position in the cache. head_dim must be even.
  bool rope = false;
  float theta_base = 10000.0f;  // the book's rope_base (Llama 2: 10000, Llama 3: 500000)
  // > 0: every block's att is MultiHeadLatentAttention(emb_dim, emb_dim,
  // drop_rate, n_heads, qkv_bias, latent_dim) (attn/mla.h), the book's
  // ch04/05_mla GPT (its cfg["latent_dim"]; give the value, not None), with a
  // latent KV cache when generating. float32 only; not with rope; dropout on
  // its attention weights is the kernel's Philox noise (no PyTorch masks).
  int64_t latent_dim = 0;
  // The book's bonus GPTs, same keys (ch04/04_gqa/gpt_with_kv_gqa.py,
  // ch04/06_swa/gpt_with_kv_swa.py); 0 is off, the chapter-4 model.
  //   n_kv_groups > 0: every block's att is a GroupedQueryAttention (attn/nn.h)
  //     with that many key/value heads (dividing n_heads); out_proj has no bias.
  //   sliding_window_size > 0: blocks of MultiHeadAttentionWithSWA (with
  //     n_kv_groups: GroupedQueryAttention with the window), the window on the
  //     layers sliding_window_stride picks (layer_sliding_window below).
  int64_t n_kv_groups = 0;
  int64_t sliding_window_size = 0;
  // The book's K:1 schedule: K > 0 gives K window layers, then one full layer,
  // repeated (layer i windowed when i % (K + 1) < K; Gemma 3 is 5); 0 makes every
  // layer full, < 0 every layer windowed. Not the book's default (its script's
  // is 2): -1, so that sliding_window_size alone windows every layer.
  int64_t sliding_window_stride = -1;
};
// The window of block `layer` (0: full causal attention) by the book's schedule.
int64_t layer_sliding_window(const GPTConfig& cfg, int64_t layer);
// GPT-2 small as the book configures it (50257, 1024, 768, 12, 12, 0.1, false).
inline constexpr GPTConfig GPT_CONFIG_124M{.vocab_size = 50257, .context_length = 1024,
                                           .emb_dim = 768, .n_heads = 12, .n_layers = 12,
                                           .drop_rate = 0.1f, .qkv_bias = false};

// Which code computes LayerNorm and GELU: the SIMD kernels of
// attn/layer_kernels.h (fast; within a few float ulps of the reference), or
// attn::ref's plain loops, the specification, which follow PyTorch's float
// order (the layer norm's mean is torch's float mean, its variance is summed in
// double as torch's Welford reduction does).
enum class LayerImpl { kKernel, kReference };

// How the model computes (not part of the book's config).
struct GPTOptions {
  AttentionBackend attention_backend = AttentionBackend::kAuto;
  // Training with dropout: PyTorch's masks (the reference path) when true, the
  // fused kernel with Philox masks when false.
  bool exact_dropout = true;
  LayerImpl layers = LayerImpl::kKernel;  // every LayerNorm and GELU
  // The compute dtype of every Linear and attention (kFloat32 or kBFloat16).
  // kBFloat16 is mixed precision as torch.autocast("cpu", dtype=torch.bfloat16)
  // runs the book's model: the weights (and their gradients, and the
  // optimizer) stay float32, each product takes bf16 operands and sums in
  // float32 (Linear, and the fused attention block, attn/fused.h), and
  // LayerNorm, GELU, the residual stream, the logits and the loss stay
  // float32. The attention then always runs on the fused path (dropout with
  // its Philox masks; exact_dropout is not possible there).
  DType dtype = DType::kFloat32;
  // GPTModel::forward_loss: out_head and the cross-entropy fused, chunk by
  // chunk (attn/linear_cross_entropy.h), so the (B·T, V) logits are never held
  // whole. Only with layers = kKernel: the reference layers (PyTorch's sums)
  // always take the plain path, out_head then ref::cross_entropy_forward.
  bool fused_loss = true;
  // Rows per chunk of the fused loss (0: kDefaultChunkRows, 512).
  int64_t loss_chunk_rows = 0;
};

// A container whose children are named "0", "1", ... as in nn.Sequential; it
// only names them (the owner runs them).
class Sequential : public Module {
 public:
  void append(Module* m) { register_module(std::to_string(size_++), m); }
  int64_t size() const { return size_; }

 private:
  int64_t size_ = 0;
};

// LayerNorm(emb_dim): scale (E) = 1, shift (E) = 0. Input (..., E) float32;
// the output is float32, or bf16 (rounded as it is stored) with out_dtype =
// kBFloat16, for the bf16 path's products that read it. dx is float32.
class LayerNorm : public Module {
 public:
  explicit LayerNorm(int64_t emb_dim, float eps = 1e-5f, LayerImpl impl = LayerImpl::kKernel,
                     DType out_dtype = DType::kFloat32);
  Tensor forward(const Tensor& x);
  Tensor backward(const Tensor& dy);
  // The residual add before the norm in the same pass: *x1 = a + r (float32,
  // a's shape; the residual stream), then forward(*x1). The bits of add(a, r)
  // then forward.
  Tensor forward_add(const Tensor& a, const Tensor& r, Tensor* x1);
  // backward(dy) + dresidual (the residual stream's gradient), in one pass
  // with the kernels: the bits of add(dresidual, backward(dy)).
  Tensor backward_add(const Tensor& dy, const Tensor& dresidual);
  Parameter scale;  // (E)
  Parameter shift;  // (E)
 private:
  int64_t emb_dim_;
  float eps_;
  LayerImpl impl_;
  DType out_dtype_;
  Tensor x_;  // saved input (..., E)
  ref::LayerNormSaved saved_;
  bool has_forward_ = false;
};

// RMSNorm(dim, eps, weight_offset): the normalisation of Llama 3 and Qwen3
// (weight_offset 0, weight (E) = 1) and of Gemma 3 (weight_offset 1, weight
// (E) = 0, the row scaled by 1 + weight), transformers' LlamaRMSNorm,
// Qwen3RMSNorm and Gemma3RMSNorm on float32 (attn/functional_gpt.h's
// rms_norm_*: the plain loops; no SIMD kernel yet). Input (..., E) float32;
// output float32; dx float32, weight.grad accumulated.
class RMSNorm : public Module {
 public:
  explicit RMSNorm(int64_t dim, float eps = 1e-6f, float weight_offset = 0.0f);
  Tensor forward(const Tensor& x);
  Tensor backward(const Tensor& dy);
  Parameter weight;  // (E)
 private:
  int64_t dim_;
  float eps_, weight_offset_;
  Tensor x_;  // saved input (..., E)
  ref::RmsNormSaved saved_;
  bool has_forward_ = false;
};

// The gated feed-forward of today's open models, the book's Llama FeedForward
// (ch05/07_gpt_to_llama; names fc1, fc2, fc3, no biases):
//   y = fc3(act(fc1(x)) ⊙ fc2(x))      fc1, fc2: (E -> H), fc3: (H -> E)
// act = SiLU, x·σ(x) (SwiGLU: Llama 3, Qwen3), or GELU's tanh form (GeGLU:
// Gemma 3's gelu_pytorch_tanh). transformers' gate_proj, up_proj, down_proj are
// fc1, fc2, fc3. Input (..., E) float32; output float32; the products on
// LinearOptions' default engine (the BLAS: PyTorch's sums) unless another is
// given; the gating in plain loops for now (no fused kernel yet).
enum class GateActivation { kSiLU, kGeluTanh };
// act(h) elementwise, float32: what GatedFeedForward applies to fc1's output
// (the plain loops: the specification of gated_activation).
Tensor gate_activation(const Tensor& h, GateActivation act);
// act(g) ⊙ u in one pass (kernels::gated_activation_forward, SIMD and
// threaded): what GatedFeedForward hands fc3. g, u of one shape (float32 or
// bf16, read as float32) -> float32.
Tensor gated_activation(const Tensor& g, const Tensor& u, GateActivation act);
class GatedFeedForward : public Module {
 public:
  // engine: the products' GEMM (kBlas: PyTorch's sums; the decoder's layers use kFast).
  GatedFeedForward(int64_t emb_dim, int64_t hidden_dim, GateActivation act,
                   Generator& gen = default_generator(), gemm::Engine engine = gemm::Engine::kBlas);
  Tensor forward(const Tensor& x);
  Tensor backward(const Tensor& dy);
  GateActivation activation() const { return act_; }
  Linear fc1, fc2, fc3;

 private:
  GateActivation act_;
  Tensor h1_, h2_;  // saved: fc1(x), fc2(x) (..., H)
  bool has_forward_ = false;
};

// GELU, the tanh approximation. Any shape. Input float32; the output is
// float32, or bf16 (rounded as it is stored) with out_dtype = kBFloat16: the
// bf16 path's FeedForward hands it straight to its bf16 Linear. dx is float32.
class GELU : public Module {
 public:
  explicit GELU(LayerImpl impl = LayerImpl::kKernel, DType out_dtype = DType::kFloat32);
  Tensor forward(const Tensor& x);
  Tensor backward(const Tensor& dy);

 private:
  LayerImpl impl_;
  DType out_dtype_;
  Tensor x_;
  bool has_forward_ = false;
};

// FeedForward(cfg): layers = Sequential(Linear(E, 4E), GELU(), Linear(4E, E)).
// Input (..., E) -> (..., E).
class FeedForward : public Module {
 public:
  explicit FeedForward(const GPTConfig& cfg, Generator& gen = default_generator(),
                       LayerImpl impl = LayerImpl::kKernel, DType dtype = DType::kFloat32);
  Tensor forward(const Tensor& x);
  // forward(x) + residual (x's shape, float32). With LayerImpl::kKernel the
  // add is the product's C (proj's bias and the residual written first).
  Tensor forward_add(const Tensor& x, const Tensor& residual);
  Tensor backward(const Tensor& dy);
  Sequential layers;  // "layers.0", "layers.1", "layers.2"
  Linear fc;          // layers.0: (E -> 4E)
  GELU gelu;          // layers.1
  Linear proj;        // layers.2: (4E -> E)

 private:
  // LayerImpl::kKernel: fc's product (beta = 0), then its bias and the GELU in
  // one pass, which keeps GELU's slope for the backward
  // (kernels::bias_gelu_forward_slope), proj's product onto its bias (and the
  // residual); backward: GELU's gradient and fc's bias gradient in one pass
  // (kernels::slope_backward_bias). The maths of the three modules, which
  // LayerImpl::kReference runs one after the other.
  Tensor forward_fused(const Tensor& x, const Tensor* residual);
  Tensor backward_fused(const Tensor& dy);
  LayerImpl impl_;
  DType dtype_;
  bool fused_forward_ = false;  // the last forward was forward_fused
  Shape x_shape_;
  Tensor x_;  // (N, E) the input (float32 mode)
  Tensor h_;  // (N, 4E) gelu'(fc's output), float32: the slope of the GELU
  Tensor g_;  // (N, 4E) GELU's output (float32 mode; bf16 mode: bf16, on the matmul route only)
  // bf16 mode, of the last forward: the products' operands bf16(x), bf16(g),
  // bf16(fc.weight), bf16(proj.weight), each made once for its two products
  // (the forward's and the backward's) in the form gemm_bf16's route takes.
  kernels::Bf16Operand x_b_, g_b_, w_fc_b_, w_proj_b_;
};

// TransformerBlock(cfg): att, ff, norm1, norm2, drop_shortcut, created in that
// order. Input (B, T, E) with T <= context_length -> (B, T, E).
class TransformerBlock : public Module {
 public:
  // rope: the model's shared RoPE tables when cfg.rope (null: made here).
  explicit TransformerBlock(const GPTConfig& cfg, const GPTOptions& options = {},
                            Generator& gen = default_generator(),
                            std::shared_ptr<const RopeParams> rope = nullptr);
  Tensor forward(const Tensor& x);
  Tensor backward(const Tensor& dy);
  // cfg.latent_dim > 0: the block's "att" (made first: the book's draw order);
  // att is then an unused one-wide placeholder drawn from a private generator.
  std::unique_ptr<MultiHeadLatentAttention> latent_att;
  MultiHeadAttention att;
  FeedForward ff;
  LayerNorm norm1, norm2;
  Dropout drop_shortcut;  // used twice per forward, each with its own mask

 private:
  Tensor noise_att_, noise_ff_;  // (B, T, E) the two masks of drop_shortcut, empty when off
  bool has_forward_ = false;
};

// The n_layers blocks, named "0", "1", ... (the book's nn.Sequential trf_blocks).
class TransformerBlocks : public Module {
 public:
  TransformerBlocks(const GPTConfig& cfg, const GPTOptions& options, Generator& gen);
  Tensor forward(const Tensor& x);
  Tensor backward(const Tensor& dy);
  int64_t size() const { return static_cast<int64_t>(blocks_.size()); }
  TransformerBlock& operator[](int64_t i) { return *blocks_.at(static_cast<size_t>(i)); }
  // Called by backward() with block i as soon as block i's parameter gradients
  // are complete (n_layers - 1 first): data parallelism starts summing them
  // over ranks while the blocks below compute (attn/train.h). Empty: none.
  void set_backward_hook(std::function<void(int64_t)> hook) { backward_hook_ = std::move(hook); }

 private:
  std::vector<std::unique_ptr<TransformerBlock>> blocks_;
  std::function<void(int64_t)> backward_hook_;
};

// F.cross_entropy(logits.flatten(0, 1), targets.flatten()): the mean over the
// tokens whose target is not ignore_index (-100, PyTorch's default).
// logits (B, T, V) float32, targets (B, T) int64.
class CrossEntropyLoss {
 public:
  explicit CrossEntropyLoss(int64_t ignore_index = ref::kIgnoreIndex) : ignore_index_(ignore_index) {}
  float forward(const Tensor& logits, const Tensor& targets);
  // dL/dlogits (B, T, V) for dL/dloss = dloss.
  Tensor backward(float dloss = 1.0f);

 private:
  int64_t ignore_index_;
  ref::CrossEntropySaved saved_;
  bool has_forward_ = false;
};

// GPTModel(cfg): token ids (B, T) int64 with T <= context_length -> logits (B, T, V).
class GPTModel : public Module {
 public:
  explicit GPTModel(const GPTConfig& cfg, const GPTOptions& options = {},
                    Generator& gen = default_generator());
  Tensor forward(const Tensor& in_idx);
  // dlogits (B, T, V); accumulates every parameter's gradient (token ids have none).
  void backward(const Tensor& dlogits);
  // F.cross_entropy(model(in_idx).flatten(0, 1), targets.flatten()) without
  // handing out the logits: targets (B, T) int64 in [0, V) or -100 (ignored).
  // With fused_loss() the head and the loss run fused, and in training mode the
  // loss's gradients (out_head's weight, and the final norm's output) are
  // computed in this same pass, as Liger-Kernel's fused linear cross-entropy
  // does; otherwise the plain path: forward(), then CrossEntropyLoss.
  float forward_loss(const Tensor& in_idx, const Tensor& targets);
  // Accumulates every parameter's gradient of dloss · loss, for the last
  // forward_loss. Throws std::logic_error before a forward_loss, or after a
  // fused one that ran in evaluation mode (which computes no gradients).
  void backward_loss(float dloss = 1.0f);
  // Whether forward_loss takes the fused head: options().fused_loss with the
  // kernel layers.
  bool fused_loss() const;
  const GPTConfig& config() const { return cfg_; }
  const GPTOptions& options() const { return options_; }
  Embedding tok_emb;           // (V, E)
  // (context_length, E); with cfg.rope an unused (1, E) placeholder, not
  // registered (its draws come from a private generator, not the model's).
  Embedding pos_emb;
  Dropout drop_emb;
  TransformerBlocks trf_blocks;
  LayerNorm final_norm;
  Linear out_head;             // (V, E), no bias

 private:
  Tensor forward_hidden(const Tensor& in_idx);  // through final_norm: (B, T, E)
  void backward_hidden(const Tensor& dx);         // from final_norm's output down
  GPTConfig cfg_;
  GPTOptions options_;
  int64_t B_ = 0, T_ = 0;
  bool has_forward_ = false;
  // The last forward_loss: the plain path's loss, or the fused one's gradients
  // for dloss = 1 (dh (B, T, E), dW (V, E)), empty when it ran in evaluation mode.
  CrossEntropyLoss plain_loss_;
  Tensor loss_dh_, loss_dW_;
  enum class LossState { kNone, kPlain, kFused, kFusedNoGrad } loss_state_ = LossState::kNone;
};


}  // namespace attn::nn
