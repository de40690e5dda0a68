// attn/nn.h - thin modules mirroring the PyTorch classes of the chapter.
//
// A module owns its parameters, buffers and options and calls the maths in
// attn/functional.h (the reference path) or attn/kernels.h (the fused path).
// Every module is trainable by hand:
//   Tensor y  = m.forward(x);      // keeps what backward needs
//   Tensor dx = m.backward(dy);    // returns dL/dx, accumulates p.grad += dL/dp
// backward() uses the state of the most recent forward() and throws if there
// was none. Parameters are created in PyTorch's attribute order from a
// Generator (default: attn::default_generator()), so the same seed gives the
// same weights as PyTorch, and are reachable by PyTorch's names
// ("W_query.weight", "out_proj.bias", "heads.0.W_key.weight").
// Modules start in training mode (dropout active), as in PyTorch.
// Modules hold pointers to their own members, so they are neither copyable nor
// movable; keep them in place or in a std::unique_ptr.
//
// Layout: batched inputs are (B, T, d_in); per-head tensors (B, H, T, hd).
//
// Two paths compute CausalAttention, MultiHeadAttention and Head (and the
// heads of MultiHeadAttentionWrapper and MultiHead); the options' `backend`
// and `exact_dropout` choose. Each of these modules describes itself once
// (heads, scale, causal, its Linear layers, output projection or not, its
// weights layout) to one dispatcher, detail::AttentionCore
// (src/nn/attention_core.h), which picks the path per forward and keeps what
// that path saved for backward:
//
// - kReference: attn::ref (attn/functional.h), the plain maths. Keeps the
//   weights (B, H, T, T) for backward. Dropout masks are PyTorch's, bit for
//   bit (the MT19937 stream, RNG.md §5).
// - kFused: attn::fused (attn/fused.h), fast-GEMM projections into one qkv buffer
//   around the flash kernel. Keeps qkv, the context and the log-sum-exp
//   (B, H, T), never a (T, T) tensor. Dropout masks come from Philox keyed by
//   a seed drawn from the module's generator (RNG.md §6): not PyTorch's.
//   Head is the block with one head, no biases and no output projection,
//   its scale head_size^-0.5 and, for an encoder head, no causal mask.
//
// kAuto (the default) takes the fused path whenever its results may differ
// from the reference only by float rounding (about 1e-7 relative): in
// evaluation mode or with dropout p = 0, or when exact_dropout is false; it
// takes the reference path when training with dropout and exact_dropout is
// true (masks that follow PyTorch's stream), and for what the kernel does not
// do (head_dim or head_size > kernels::kMaxHeadDim = 256, p = 1,
// CausalAttention's softmax_dim = 1).
// last_backend() tells which path the last forward took. With dropout on the
// fused path each forward draws one random64() from the module's generator as
// the Philox seed, so a seeded run is reproducible; kernels::flash_dropout_noise
// gives its mask.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "attn/functional.h"
#include "attn/random.h"
#include "attn/rope.h"
#include "attn/tensor.h"

namespace attn::nn {

namespace detail {
class AttentionCore;  // src/nn/attention_core.h: the reference and fused paths behind one interface
class SdpaAttention;  // src/nn/sdpa_attention.h: the book's GQA and SWA variants on attn/sdpa.h
}  // namespace detail

// A trainable tensor and its gradient. Both are Tensor handles, so two
// modules can hold one parameter (weight tying, as GPT-2 ties tok_emb and
// out_head): tie(a, b) makes a share b's value and grad storage, and every
// backward accumulates into that one grad in place.
struct Parameter {
  Tensor value;
  Tensor grad;  // same shape as value, zero until backward accumulates into it
  // True when this and other are one parameter (tied, or the same object).
  bool is(const Parameter& other) const;
};
// Makes `param` the parameter `source` is: param.value and param.grad become
// handles on source's storage. Throws std::invalid_argument naming the shapes
// when they differ (GPT-2: out_head.weight (vocab, emb) and tok_emb.weight).
void tie(Parameter& param, Parameter& source);

// A buffer (PyTorch's register_buffer): module state that is not trained, such
// as the chapter's causal mask. Its value is made by `make` on the first read,
// so a (context_length, context_length) mask that the fused path never reads is
// never allocated. Persistent buffers appear in state_dict(), as in PyTorch.
class Buffer {
 public:
  explicit Buffer(std::function<Tensor()> make, bool persistent = true)
      : make_(std::move(make)), persistent_(persistent) {}
  const Tensor& get() const {
    if (!made_) {
      value_ = make_();
      made_ = true;
    }
    return value_;
  }
  // Whether the value has been made (read) yet.
  bool materialized() const { return made_; }
  bool persistent() const { return persistent_; }

 private:
  std::function<Tensor()> make_;
  bool persistent_;
  mutable Tensor value_;
  mutable bool made_ = false;
};

class Module {
 public:
  Module() = default;
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;
  virtual ~Module() = default;

  // Training mode (dropout active) or evaluation mode, for this module and all below it.
  void train(bool on = true);
  void eval() { train(false); }
  bool is_training() const { return training_; }

  // All parameters, depth first in registration order, with dotted PyTorch
  // names; a tied parameter appears once, under its first name (PyTorch's
  // remove_duplicate).
  std::vector<std::pair<std::string, Parameter*>> named_parameters();
  // One parameter by name (any of a tied parameter's names); throws
  // std::out_of_range naming it and listing the known names.
  Parameter& parameter(const std::string& name);
  // The number of trainable values, each tied parameter counted once.
  int64_t num_parameters();
  void zero_grad();
  // All buffers, depth first, with dotted names ("heads.0.mask"); reading
  // them here makes (materialises) the lazy ones.
  std::vector<std::pair<std::string, const Tensor*>> named_buffers();
  // Whether the buffer of that dotted name has been made (read) yet, without
  // making it; throws std::out_of_range for a name that is not a buffer.
  bool buffer_materialized(const std::string& name);
  // PyTorch's state_dict(): for each module, its own parameters, then its
  // persistent buffers, then each child's entries under "child." - the keys
  // and order torch.nn.Module.state_dict() gives (tied parameters under every
  // name). The tensors are handles on the module's storage, not copies.
  std::vector<std::pair<std::string, Tensor>> state_dict();

 protected:
  void register_parameter(std::string name, Parameter* p);
  void register_buffer(std::string name, const Buffer* b);
  void register_module(std::string name, Module* m);
  // Throws std::logic_error("<Module>: backward() called before forward()") when !ok.
  static void require_forward(bool ok, const char* module);

 private:
  bool training_ = true;
  // Every parameter with its name, tied ones under each of their names.
  std::vector<std::pair<std::string, Parameter*>> all_named_parameters();
  std::vector<std::pair<std::string, Parameter*>> parameters_;
  std::vector<std::pair<std::string, const Buffer*>> buffers_;
  std::vector<std::pair<std::string, Module*>> children_;
};

// ---- building blocks ---------------------------------------------------------------

// While one lives (on this thread), Linear and Embedding make their parameters
// without initialising them: uninitialised storage, no draws from the
// generator, and no gradient storage yet (transformers' no_init_weights, for a
// model whose every weight a file is about to overwrite; a loader makes one
// around the constructor). A module made so must make its gradients before a
// backward (DecoderLM does on its first forward in training mode).
class NoInitScope {
 public:
  NoInitScope();
  ~NoInitScope();
  NoInitScope(const NoInitScope&) = delete;
  NoInitScope& operator=(const NoInitScope&) = delete;
  static bool active();
};

struct LinearOptions {
  int64_t in_features = 0;
  int64_t out_features = 0;
  bool bias = true;
  // Not torch's: which GEMM the products run on (attn/gemm.h). kBlas gives
  // PyTorch's sums (the chapter's modules); the GPT's layers use kFast.
  gemm::Engine engine = gemm::Engine::kBlas;
  // Not torch's: the compute dtype. kBFloat16 is mixed precision as under
  // torch.autocast("cpu", dtype=torch.bfloat16): the weight and bias stay
  // float32 (the master copy; their gradients accumulate in float32), x, W
  // and dy are rounded to bf16 where they enter a product, each product sums
  // in float32 (gemm::gemm_bf16), and y and dx come out float32, the sums not
  // rounded (autocast rounds y to bf16). The bias is added, and its gradient
  // summed, in float32.
  DType dtype = DType::kFloat32;
};
// nn.Linear: y = x Wᵀ + b, weight (out, in), bias (out). Input (..., in):
// float32, or bfloat16 in bf16 mode (taken as already rounded).
class Linear : public Module {
 public:
  explicit Linear(const LinearOptions& options, Generator& gen = default_generator());
  Tensor forward(const Tensor& x);
  Tensor backward(const Tensor& dy);
  const LinearOptions& options() const { return options_; }
  // Switches the compute dtype (LinearOptions::dtype, float32 or bfloat16) of
  // a layer with float32 weights: mixed precision for a model built or loaded
  // in float32. Drops what the last forward saved. Throws std::invalid_argument
  // naming the dtypes.
  void set_compute_dtype(DType dtype);
  Parameter weight;  // (out, in)
  Parameter bias;    // (out), empty when options.bias is false
 private:
  Tensor forward_bf16(const Tensor& x);
  Tensor backward_bf16(const Tensor& dy);
  LinearOptions options_;
  Tensor x_;            // saved input (..., in); bf16 mode: bf16(x) (N, in)
  Tensor weight_bf16_;  // bf16 mode: bf16(W) (out, in) of the last forward
  Shape x_shape_;       // the input's shape
  bool has_forward_ = false;
};

struct DropoutOptions {
  float p = 0.5f;  // probability of zeroing; must be in [0, 1]
};
// nn.Dropout: in training mode keep each element with probability 1-p and scale
// kept ones by 1/(1-p); identity in evaluation mode or with p = 0.
class Dropout : public Module {
 public:
  explicit Dropout(const DropoutOptions& options = {}, Generator& gen = default_generator());
  Tensor forward(const Tensor& x);
  Tensor backward(const Tensor& dy);
  // True when forward applies noise: training mode and p > 0.
  bool is_active() const { return is_training() && options_.p > 0.0f; }
  // One random64() from the generator: the seed of the fused kernel's
  // counter-based noise, drawn once per forward of an attention module.
  uint64_t draw_seed() { return gen_->random64(); }
  // The noise forward(x) would multiply an x of this shape by, drawn now from
  // the generator (attn::dropout_noise); empty, with no draws, when dropout is
  // the identity (evaluation mode or p = 0). The attention modules use it to
  // drop attention weights inside ref::attention_forward.
  Tensor sample_noise(const Shape& shape);
  const DropoutOptions& options() const { return options_; }

 private:
  DropoutOptions options_;
  Generator* gen_;
  Tensor noise_;  // the mask of the last forward (empty when it was the identity)
  bool has_forward_ = false;
};

struct EmbeddingOptions {
  int64_t num_embeddings = 0;
  int64_t embedding_dim = 0;
};
// nn.Embedding: weight (num_embeddings, embedding_dim) ~ N(0, 1).
class Embedding : public Module {
 public:
  explicit Embedding(const EmbeddingOptions& options, Generator& gen = default_generator());
  // Row lookup: token ids, an int64 tensor of any shape (B, T) -> (B, T, dim).
  Tensor forward(const Tensor& indices);
  // The same from ids laid out row-major in `shape` -> shape + (dim).
  Tensor forward(const std::vector<int64_t>& indices);                      // (N) -> (N, dim)
  Tensor forward(const std::vector<int64_t>& indices, const Shape& shape);  // shape + (dim)
  // Accumulates weight.grad rows; there is no input gradient for indices.
  void backward(const Tensor& dy);
  Parameter weight;  // (num_embeddings, embedding_dim)
 private:
  EmbeddingOptions options_;
  std::vector<int64_t> indices_;
  bool has_forward_ = false;
};

// ---- 2. self-attention with trainable weights ----------------------------------------

struct SelfAttentionOptions {
  int64_t d_in = 0;
  int64_t d_out = 0;      // query/key width d_k (and value width unless d_v is set)
  int64_t d_v = 0;        // value width; 0 means d_out
  bool qkv_bias = false;  // v2 only
};
// SelfAttention_v1: W_query, W_key (d_in, d_out), W_value (d_in, d_v) plain
// parameters from torch.rand, drawn in that order; Q = X W_query etc.
// Input (T, d_in) or (B, T, d_in); output (..., T, d_v).
class SelfAttentionV1 : public Module {
 public:
  explicit SelfAttentionV1(const SelfAttentionOptions& options,
                           Generator& gen = default_generator());
  Tensor forward(const Tensor& x);
  Tensor backward(const Tensor& dy);
  Parameter W_query, W_key, W_value;
  // The softmax weights of the last forward, before dropout: (..., T, T).
  const Tensor& attention_weights() const { return saved_.weights; }

 private:
  SelfAttentionOptions options_;
  Tensor x_, q_, k_, v_;
  ref::AttentionSaved saved_;
  bool has_forward_ = false;
};

// SelfAttention_v2: nn.Linear layers W_query, W_key (d_in -> d_out), W_value
// (d_in -> d_v), optional bias, created in that order.
class SelfAttentionV2 : public Module {
 public:
  explicit SelfAttentionV2(const SelfAttentionOptions& options,
                           Generator& gen = default_generator());
  Tensor forward(const Tensor& x);
  Tensor backward(const Tensor& dy);
  Linear W_query, W_key, W_value;
  // The softmax weights of the last forward, before dropout: (..., T, T).
  const Tensor& attention_weights() const { return saved_.weights; }

 private:
  SelfAttentionOptions options_;
  Tensor q_, k_, v_;
  ref::AttentionSaved saved_;
  bool has_forward_ = false;
};

// ---- 3. causal attention with dropout --------------------------------------------------

// Which code computes the attention of a module (see the table at the top).
enum class AttentionBackend {
  kAuto,       // fused unless PyTorch-exact dropout masks are asked for (or it cannot)
  kReference,  // attn::ref: the plain maths, PyTorch's dropout masks, keeps the weights
  kFused,      // attn::fused: fast-GEMM projections + flash kernel, Philox dropout masks
};
// "auto", "reference", "fused".
const char* to_string(AttentionBackend backend);

struct CausalAttentionOptions {
  int64_t d_in = 0;
  int64_t d_out = 0;
  int64_t context_length = 0;
  float dropout = 0.0f;
  bool qkv_bias = false;
  int64_t softmax_dim = -1;  // 1 reproduces the early printing's softmax-over-queries bug
  AttentionBackend backend = AttentionBackend::kAuto;
  // Dropout masks follow PyTorch's MT19937 stream; only the reference path can
  // do that, so kAuto keeps the reference path while training with dropout.
  bool exact_dropout = true;
  // The compute dtype. kBFloat16 is mixed precision as under torch.autocast
  // (attn/fused.h): fp32 weights and gradients, bf16 products with fp32 sums,
  // on the fused path only (backend kAuto, which then always takes it, with
  // Philox dropout masks, or kFused).
  DType dtype = DType::kFloat32;
};
// CausalAttention: W_query, W_key, W_value linear (d_in -> d_out), a
// (context_length, context_length) future mask buffer, dropout on the weights.
// Input (B, T, d_in) with T <= context_length; output (B, T, d_out).
class CausalAttention : public Module {
 public:
  explicit CausalAttention(const CausalAttentionOptions& options,
                           Generator& gen = default_generator());
  Tensor forward(const Tensor& x);
  Tensor backward(const Tensor& dy);
  const CausalAttentionOptions& options() const { return options_; }
  Linear W_query, W_key, W_value;
  Dropout dropout;
  // The buffer "mask": (context_length, context_length), 1 above the diagonal.
  // Made on the first read (the fused path never reads it).
  const Tensor& mask() const { return mask_.get(); }
  // The softmax weights of the last forward, before dropout: (B, T, T). The
  // fused path keeps only the log-sum-exp, so after a fused forward they are
  // recomputed (reference maths) from the saved q and k on the first call.
  const Tensor& attention_weights() const;
  // The path the last forward took (kReference or kFused); kAuto before any forward.
  AttentionBackend last_backend() const;
  ~CausalAttention() override;

 private:
  CausalAttentionOptions options_;
  Buffer mask_;
  std::unique_ptr<detail::AttentionCore> core_;  // the paths and what the last forward saved
};

// ---- 4. multi-head attention, two ways -------------------------------------------------

// Which of the book's multi-head attention classes a MultiHeadAttention is.
// The variants differ from the chapter's in their parameters (names, shapes,
// creation order, as the book's state_dict has them) and in their maths:
//   kChapter        chapter 3's MultiHeadAttention: W_query, W_key, W_value (d_in -> d_out),
//                   out_proj (with bias), the buffer "mask"; the reference and fused paths
//                   of the table at the top.
//   kGroupedQuery   ch04/04_gqa's GroupedQueryAttention: W_key, W_value (d_in ->
//                   num_kv_groups · head_dim), W_query (d_in -> d_out), out_proj (no
//                   bias), created in that order; no buffer. Query head h reads the keys
//                   and values of group h / (num_heads / num_kv_groups), as the book's
//                   repeat_interleave lays them out (no copy is made here).
//   kSlidingWindow  ch04/06_swa's MultiHeadAttentionWithSWA: the chapter's parameters
//                   without the buffer; query i sees keys i - w + 1 .. i (w =
//                   sliding_window_size; 0: all keys up to i, the book's None).
// The variants compute with attn::scaled_dot_product_attention_forward/backward
// (attn/sdpa.h: causal, enable_gqa, window_left = w - 1), the fused kernel, or
// its plain reference with backend = kReference; dropout on the attention
// weights takes the kernel's Philox masks (a seed drawn from the module's
// generator per forward), never PyTorch's, so exact_dropout does not apply;
// float32 only. attention_weights() is recomputed from the saved q and k on
// the first call after a forward (B, H, T, T).
enum class AttentionVariant { kChapter, kGroupedQuery, kSlidingWindow };

struct MultiHeadAttentionOptions {
  int64_t d_in = 0;
  int64_t d_out = 0;  // wrapper: width of each head; module: total width (H * head_dim)
  int64_t context_length = 0;
  float dropout = 0.0f;
  int64_t num_heads = 1;
  bool qkv_bias = false;
  AttentionBackend backend = AttentionBackend::kAuto;  // as CausalAttentionOptions
  bool exact_dropout = true;                           // as CausalAttentionOptions
  DType dtype = DType::kFloat32;                       // as CausalAttentionOptions
  // Not the book's chapter-3 module: rotary position embedding (attn/rope.h,
  // the book's Llama chapter) of q and k in every head, token t at position t
  // (forward_cached: at its position in the cache); tables (>= T rows,
  // head_dim) shared by every layer of a model. MultiHeadAttention only (the
  // wrapper's heads take none). Null: no rotation.
  std::shared_ptr<const RopeParams> rope = nullptr;
  // Not in chapter 3's class: the book's bonus variants of it (ch04/04_gqa,
  // ch04/06_swa), which GroupedQueryAttention and MultiHeadAttentionWithSWA
  // below (and GPTModel, from its config) set. MultiHeadAttention only.
  AttentionVariant variant = AttentionVariant::kChapter;
  int64_t num_kv_groups = 0;        // kGroupedQuery: key/value heads, dividing num_heads
  int64_t sliding_window_size = 0;  // kGroupedQuery, kSlidingWindow: 0 none (the book's None), else w
};
// MultiHeadAttentionWrapper: num_heads CausalAttention heads ("heads.0" ...),
// outputs concatenated on the last axis: (B, T, num_heads * d_out).
class MultiHeadAttentionWrapper : public Module {
 public:
  explicit MultiHeadAttentionWrapper(const MultiHeadAttentionOptions& options,
                                     Generator& gen = default_generator());
  Tensor forward(const Tensor& x);
  Tensor backward(const Tensor& dy);
  std::vector<std::unique_ptr<CausalAttention>> heads;

 private:
  MultiHeadAttentionOptions options_;
  bool has_forward_ = false;
};

// MultiHeadAttention with weight splits: W_query, W_key, W_value (d_in -> d_out),
// views (B, T, H, hd) -> (B, H, T, hd), causal attention per head with scale
// 1/sqrt(hd), dropout on the weights, heads merged to (B, T, d_out), then
// out_proj (d_out -> d_out, with bias). d_out % num_heads must be 0.
class MultiHeadAttention : public Module {
 public:
  explicit MultiHeadAttention(const MultiHeadAttentionOptions& options,
                              Generator& gen = default_generator());
  Tensor forward(const Tensor& x);
  Tensor backward(const Tensor& dy);
  const MultiHeadAttentionOptions& options() const { return options_; }
  int64_t head_dim() const { return options_.d_out / options_.num_heads; }
  Linear W_query, W_key, W_value, out_proj;
  Dropout dropout;
  // The buffer "mask": (context_length, context_length), 1 above the diagonal.
  // Made on the first read (the fused path never reads it).
  const Tensor& mask() const { return mask_.get(); }
  // The softmax weights of the last forward, before dropout: (B, H, T, T). The
  // fused path keeps only the log-sum-exp, so after a fused forward they are
  // recomputed (reference maths) from the saved q and k on the first call.
  const Tensor& attention_weights() const;
  // The path the last forward took (kReference or kFused); kAuto before any forward.
  AttentionBackend last_backend() const;
  // The variant (kChapter unless options.variant says otherwise), its key/value
  // heads (num_heads, or num_kv_groups for kGroupedQuery) and window (0: none).
  AttentionVariant variant() const { return options_.variant; }
  int64_t num_kv_heads() const;
  int64_t sliding_window_size() const { return options_.sliding_window_size; }
  // The book's `blk.att.sliding_window_size = w` (its SWA GPT's per-layer
  // schedule): w >= 0, on a variant only (kChapter throws std::invalid_argument).
  void set_sliding_window_size(int64_t w);
  ~MultiHeadAttention() override;

 private:
  friend class detail::SdpaAttention;
  MultiHeadAttentionOptions options_;
  Buffer mask_;
  std::unique_ptr<detail::AttentionCore> core_;  // kChapter: the paths and what the last forward saved
  std::unique_ptr<detail::SdpaAttention> sdpa_;  // the variants: the sdpa path and its saved state
};

// ---- the book's bonus variants (ch04/04_gqa, ch04/06_swa) --------------------------------

struct GroupedQueryAttentionOptions {
  int64_t d_in = 0;
  int64_t d_out = 0;
  int64_t context_length = 0;  // not the book's: the most tokens (KV cache capacity)
  float dropout = 0.0f;
  int64_t num_heads = 1;
  int64_t num_kv_groups = 1;  // must divide num_heads
  bool qkv_bias = false;
  AttentionBackend backend = AttentionBackend::kAuto;  // kReference: sdpa's plain reference
};
// GroupedQueryAttention(d_in, d_out, dropout, num_heads, num_kv_groups, qkv_bias):
// a MultiHeadAttention of variant kGroupedQuery (see AttentionVariant).
// Input (B, T, d_in) -> (B, T, d_out); state_dict W_key.weight (G·hd, d_in),
// W_value.weight, W_query.weight (d_out, d_in), out_proj.weight (d_out, d_out).
class GroupedQueryAttention : public MultiHeadAttention {
 public:
  explicit GroupedQueryAttention(const GroupedQueryAttentionOptions& options,
                                 Generator& gen = default_generator());
  int64_t num_kv_groups() const { return options().num_kv_groups; }
  int64_t group_size() const { return options().num_heads / options().num_kv_groups; }
};

struct MultiHeadAttentionWithSWAOptions {
  int64_t d_in = 0;
  int64_t d_out = 0;
  int64_t context_length = 0;  // not the book's: the most tokens (KV cache capacity)
  float dropout = 0.0f;
  int64_t num_heads = 1;
  bool qkv_bias = false;
  int64_t sliding_window_size = 0;  // 0: None (full causal attention), else w >= 1
  AttentionBackend backend = AttentionBackend::kAuto;  // kReference: sdpa's plain reference
};
// MultiHeadAttentionWithSWA(d_in, d_out, dropout, num_heads, qkv_bias,
// sliding_window_size): a MultiHeadAttention of variant kSlidingWindow.
class MultiHeadAttentionWithSWA : public MultiHeadAttention {
 public:
  explicit MultiHeadAttentionWithSWA(const MultiHeadAttentionWithSWAOptions& options,
                                     Generator& gen = default_generator());
};

// ---- 5. the character-level GPT's head -----------------------------------------------

struct HeadOptions {
  int64_t n_embd = 0;  // C, the input width
  int64_t head_size = 0;
  int64_t block_size = 0;  // context_length
  float dropout = 0.0f;
  bool causal = true;  // decoder head (mask the future) or encoder head
  AttentionBackend backend = AttentionBackend::kAuto;  // as CausalAttentionOptions
  bool exact_dropout = true;                           // as CausalAttentionOptions
};
// Head: key, query, value = Linear(n_embd, head_size, bias=False) created in that
// order; weights = q kᵀ · head_size^-0.5, future masked when causal, softmax,
// dropout, times v. Input (B, T, n_embd) -> (B, T, head_size); a decoder head
// takes T <= block_size (its tril buffer), an encoder head any T. The fused
// path is the fused block with one head of width head_size, no biases and no
// output projection, causal or not as the head is.
class Head : public Module {
 public:
  explicit Head(const HeadOptions& options, Generator& gen = default_generator());
  Tensor forward(const Tensor& x);
  Tensor backward(const Tensor& dy);
  Linear key, query, value;
  Dropout dropout;
  // The buffer "tril": (block_size, block_size) lower-triangular ones, made on
  // the first read; a head with block_size 0 (an encoder head may have one)
  // has no buffer and throws here.
  const Tensor& tril() const;
  // The softmax weights of the last forward, before dropout: (B, T, T). The
  // fused path keeps only the log-sum-exp, so after a fused forward they are
  // recomputed (reference maths) from the saved q and k on the first call.
  const Tensor& attention_weights() const;
  // The path the last forward took (kReference or kFused); kAuto before any forward.
  AttentionBackend last_backend() const;
  ~Head() override;

 private:
  HeadOptions options_;
  Buffer tril_;
  std::unique_ptr<detail::AttentionCore> core_;  // the paths and what the last forward saved
};

struct MultiHeadOptions {
  int64_t n_embd = 0;
  int64_t num_heads = 1;
  int64_t head_size = 0;
  int64_t block_size = 0;
  float dropout = 0.0f;
  bool causal = true;
  AttentionBackend backend = AttentionBackend::kAuto;  // of every head, as CausalAttentionOptions
  bool exact_dropout = true;                           // as CausalAttentionOptions
};
// The lecture's multi-head form: num_heads Head modules ("heads.0" ...)
// concatenated to (B, T, num_heads * head_size), then proj Linear(num_heads *
// head_size -> n_embd, with bias) and dropout. Each head takes its own path
// (heads[h]->last_backend()); proj and the output dropout are the plain layers.
class MultiHead : public Module {
 public:
  explicit MultiHead(const MultiHeadOptions& options, Generator& gen = default_generator());
  Tensor forward(const Tensor& x);
  Tensor backward(const Tensor& dy);
  std::vector<std::unique_ptr<Head>> heads;
  Linear proj;
  Dropout dropout;

 private:
  MultiHeadOptions options_;
  bool has_forward_ = false;
};

}  // namespace attn::nn
