// attn/train.h - training a GPT on a UTF-8 text (`attn train`), on characters
// or on GPT-2's byte-level BPE; and the same loop for the decoders of today's
// open models (TrainOptions::arch: Llama 3, Qwen3, Gemma 3 from scratch;
// init_from: fine-tuning a Hugging Face directory with its tokenizer.json).
//
//   CharTokenizer  the text's distinct code points, sorted, are the vocabulary;
//                  encode / decode between text and token ids
//                  (attn/char_tokenizer.h, text::CharTokenizer)
//   Batcher        (B, T) inputs and (B, T) next-token targets cut from random
//                  windows of T + 1 tokens, offsets drawn from a Generator
//                  (nanoGPT's get_batch; the character-level runs)
//   WindowLoader   the book's chapter-2/5 data loader (create_dataloader_v1):
//                  windows every `stride` tokens, in batches, shuffled per pass
//                  as torch's DataLoader shuffles them (the GPT-2 BPE runs)
//   TrainOptions   the flags of `attn train` (nanoGPT's Shakespeare-character
//                  CPU recipe by default)
//   Trainer        the model, AdamW and the data: step(), evaluate(), save(),
//                  resume()
//
// Randomness: one Generator, seeded with TrainOptions::seed, initialises the
// model's weights, then draws every batch offset (training and evaluation, in
// the order nanoGPT draws them) and every dropout mask. Its state is part of
// the checkpoint, so a run resumed at iteration k draws what the uninterrupted
// run draws from k on, and computes the same losses bit for bit (on the same
// machine and thread count).
//
// Global batches (--grad-accum-steps K, data parallelism over N ranks): a step
// is one global batch of M = N x K micro-batches of batch_size windows each,
// numbered m = 0 .. M-1; rank r computes micro-batches r·K .. r·K + K-1. The
// unit of randomness is the micro-batch, never the rank or the thread count:
//   - windows: every rank advances the one shared Generator identically,
//     drawing the offsets (char runs) or taking the loader's next batches
//     (gpt2 runs) of all M micro-batches in micro-batch order, and keeps its
//     own. With M = 1 that is exactly the draws of a plain run, so the default
//     run (1 rank, K = 1) draws what it always drew.
//   - dropout (M > 1 only): micro-batch m's masks come from a Generator seeded
//     with splitmix64(seed, step, m) (micro_batch_seed); the shared Generator
//     is put back after the step, so its stream holds the windows only. (M = 1
//     keeps the plain run's order: the masks follow the offsets in the shared
//     stream.)
//   - gradients: each micro-batch's loss is the mean over its tokens; the
//     step's gradient is the sum of the M micro-batch gradients times 1/M (the
//     loss of each micro-batch scaled by 1/(K·N), as nanoGPT does), then one
//     clip and one AdamW step. A rank sums its K micro-batches in order
//     ((g0 + g1) + g2) ..., each computed from zero gradients; the ranks' sums
//     are then summed by the Collective (attn/dist.h: MPI). With K = 1 on N
//     ranks in rank order that is the same sum, add for add, as one rank with
//     K = N, so with a rank-ordered reduction (--deterministic; any reduction
//     for N = 2, as a + b = b + a) the weights are bit-identical for the same
//     threads per rank.
//   - the reported loss is the mean of the M micro-batch losses, summed in
//     micro-batch order.
// The checkpoint's "global_batch" ({"ranks", "grad_accum_steps",
// "micro_batches"}, written when M > 1) lets a resumed run check its M: a run
// may resume at any N and K with the same N x K (the same windows, masks and
// sums but for the reduction order), and is refused otherwise.
//
// The checkpoint (checkpoint.safetensors, the format `attn generate` reads):
// tensors: the model's state_dict() (F32) and "optim.<param>.exp_avg",
// "optim.<param>.exp_avg_sq"; __metadata__: "format" = "attn-checkpoint-1",
// "config" (the GPTConfig as JSON, attn/model_config.h), "tokenizer" ("char"
// or "gpt2"), "vocab" (character runs only: JSON array of one-character
// strings in id order), "iter", "optim_step", "train_args" (TrainOptions as
// JSON), "generator" (the Generator's state as JSON), "last_eval_iter", and
// for GPT-2 BPE runs "loader" (the training pass in progress: {"epoch",
// "seed", "position"}).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "attn/char_tokenizer.h"
#include "attn/checkpoint.h"
#include "attn/decoder.h"
#include "attn/gpt.h"
#include "attn/hf_decoder.h"
#include "attn/hf_tokenizer.h"
#include "attn/optim.h"
#include "attn/random.h"
#include "attn/tensor.h"
#include "attn/token_shards.h"
#include "attn/utf8.h"

namespace attn::train {

using nn::kCheckpointFormat;  // "attn-checkpoint-1" (attn/checkpoint.h)
using text::CharTokenizer;     // attn/char_tokenizer.h

// UTF-8 as attn/utf8.h decodes it (kept here under the names it had first).
using attn::decode_utf8;
using attn::encode_utf8;

// Batches of random windows of a token sequence: for each of the B rows an
// offset i = gen.random() % (n - T) (torch.randint(n - T, (B,)) for n - T <
// 2^32), x = data[i, i + T) and y = data[i + 1, i + T + 1).
class Batcher {
 public:
  // Throws std::invalid_argument when batch_size or context_length < 1 or the
  // data has fewer than context_length + 1 tokens.
  Batcher(std::vector<int64_t> data, int64_t batch_size, int64_t context_length);
  // x (B, T) int64, y (B, T) int64.
  std::pair<Tensor, Tensor> next(Generator& gen) const;
  int64_t tokens() const { return static_cast<int64_t>(data_.size()); }

 private:
  std::vector<int64_t> data_;
  int64_t batch_size_, context_length_;
};

// The book's data loader over one token sequence (chapter 2's GPTDatasetV1 in
// a torch DataLoader, as create_dataloader_v1 builds it): window k is
// x = ids[k·stride, k·stride + max_length), y = the same shifted by one, for
// every k·stride < n - max_length; a pass yields them batch_size at a time, in
// order or (shuffle) in a permutation, with a short last batch unless
// drop_last. Every pass draws what torch's DataLoader draws from the run's
// generator (docs/rng.md, section 7): random_int64 for the iterator's base
// seed, then with shuffle a second random_int64 that seeds the generator of
// randperm(windows). So the order of the windows, and every later draw, is
// the book's for the same seed.
class WindowLoader {
 public:
  // Throws std::invalid_argument when batch_size, max_length or stride < 1, or
  // the sequence holds no window (n <= max_length) or, with drop_last, fewer
  // windows than one batch; the message names the values.
  WindowLoader(std::vector<int64_t> ids, int64_t batch_size, int64_t max_length, int64_t stride,
               bool shuffle, bool drop_last, std::string name = "data");
  // The same over tokens read by position (a memory-mapped corpus,
  // attn/token_shards.h): a batch reads only its windows.
  WindowLoader(std::shared_ptr<const data::TokenSource> tokens, int64_t batch_size, int64_t max_length,
               int64_t stride, bool shuffle, bool drop_last, std::string name = "data");
  int64_t windows() const { return windows_; }
  int64_t batches() const;  // per pass (len(loader))
  int64_t tokens() const { return tokens_->size(); }

  // Begins a pass, drawing from gen as a DataLoader's iterator does.
  void start_pass(Generator& gen);
  // True until the pass in progress (if any) has yielded every batch.
  bool in_pass() const { return in_pass_; }
  // The pass's next batch: x (B', T) and y (B', T) int64, B' = batch_size but
  // for a short last batch. Ends the pass after its last batch. Throws
  // std::logic_error outside a pass.
  std::pair<Tensor, Tensor> next();

  // The pass in progress, to resume it: the sampler's seed (0 without
  // shuffle) and how many batches it has yielded.
  int64_t pass_seed() const { return seed_; }
  int64_t position() const { return position_; }
  // Restores a pass in progress (no draws); throws std::invalid_argument for a
  // position beyond the pass.
  void restore_pass(int64_t seed, int64_t position);

 private:
  void set_order(int64_t seed);
  std::shared_ptr<const data::TokenSource> tokens_;  // shared by copies (evaluation passes)
  int64_t batch_size_, max_length_, stride_;
  bool shuffle_, drop_last_;
  std::string name_;
  int64_t windows_ = 0;
  std::vector<int64_t> order_;  // window indices of the pass
  int64_t seed_ = 0, position_ = 0;
  bool in_pass_ = false;
};

// The flags of `attn train`. Defaults: nanoGPT's shakespeare_char recipe for a
// CPU (4 layers, 4 heads, emb 128, context 64, batch 12, 2000 iterations, lr
// 1e-3 with 100 warm-up iterations and cosine decay to 1e-4 at max_iters,
// AdamW betas (0.9, 0.99), weight decay 0.1, clipping at 1.0, no dropout,
// evaluation every 250 iterations on 20 batches).
struct TrainOptions {
  int64_t n_layers = 4;
  int64_t n_heads = 4;
  int64_t emb_dim = 128;
  int64_t context_length = 64;
  int64_t batch_size = 12;
  int64_t max_iters = 2000;
  double lr = 1e-3;
  double min_lr = 1e-4;
  int64_t warmup_iters = 100;
  double weight_decay = 0.1;
  double grad_clip = 1.0;  // 0: no clipping
  double drop_rate = 0.0;
  int64_t eval_interval = 250;
  int64_t eval_iters = 20;
  uint64_t seed = 1337;
  double beta1 = 0.9;
  double beta2 = 0.99;
  // The compute dtype: "float32", or "bfloat16" for mixed precision as under
  // torch.autocast (nn::GPTOptions::dtype: float32 weights, gradients and
  // optimizer; bf16 products summed in float32).
  std::string dtype = "float32";
  // The output head and the loss fused, chunk by chunk (nn::GPTOptions::
  // fused_loss, attn/linear_cross_entropy.h): the (B·T, vocab) logits are never
  // held whole, in training and evaluation. false: the plain path (the logits,
  // then the cross-entropy), the specification.
  bool fused_loss = true;
  // "char": the text's characters are the vocabulary, batches of random
  // windows (nanoGPT). "gpt2": GPT-2's byte-level BPE (attn/tokenizer.h), a
  // vocabulary of 50,257, and the book's chapter-5 data: the text split 90/10
  // by characters, each part tokenized (<|endoftext|> allowed), and a
  // WindowLoader over each (train: shuffled, drop_last; validation: in order,
  // short last batch kept) with windows of context_length every `stride`.
  std::string tokenizer = "char";
  int64_t stride = 0;  // gpt2: tokens between windows (0: context_length)
  // gpt2: when > 0, max_iters becomes epochs x the training batches of a pass.
  int64_t epochs = 0;
  // "cosine": nanoGPT's warm-up and cosine decay (optim::get_lr); "constant":
  // lr at every step (the book's chapter 5).
  std::string lr_schedule = "cosine";
  // "matrices": weight decay on parameters of dim >= 2 only (nanoGPT's
  // optim::decay_groups); "all": on every parameter, as
  // AdamW(model.parameters(), weight_decay=...) in the book.
  std::string decay = "matrices";
  // The model on the reference paths (attention, LayerNorm and GELU in
  // PyTorch's float order, dropout with PyTorch's own masks from the run's
  // generator): the book's numbers, slower. false: the fused kernels.
  bool exact = false;
  // Rotary position embedding instead of the position embedding
  // (nn::GPTConfig::rope, attn/rope.h) with this theta_base.
  bool rope = false;
  double theta_base = 10000.0;
  // > 0: multi-head latent attention with this latent width in every block
  // (nn::GPTConfig::latent_dim, attn/mla.h).
  int64_t latent_dim = 0;
  // The book's bonus attention (nn::GPTConfig's keys of the same names): key/value
  // heads of grouped-query attention (0: off; must divide n_heads), the sliding
  // window (0: off) and its K:1 layer schedule (-1: every layer).
  int64_t n_kv_groups = 0;
  int64_t sliding_window_size = 0;
  int64_t sliding_window_stride = -1;
  // Micro-batches of batch_size each rank accumulates per step (nanoGPT's
  // gradient_accumulation_steps); the global batch is ranks x K x batch_size.
  int64_t grad_accum_steps = 1;
  // The model: "gpt" (nn::GPTModel, the options above), or a decoder of
  // today's open models (nn::DecoderLM, attn/decoder.h) built from these
  // options: "llama3" (SwiGLU, RMSNorm), "qwen3" (and QK-norm), "gemma3" (GeGLU,
  // Gemma's four norms, embeddings x sqrt(E), local RoPE base 10000 on its
  // sliding layers); n_heads heads of head_dim (0: emb_dim / n_heads),
  // n_kv_groups key/value heads (0: n_heads), a feed-forward of ffn_dim (0:
  // 3 x emb_dim), RoPE base theta_base, the sliding window and its K:1 layer
  // schedule from sliding_window_size / _stride, tied embeddings; float32, no
  // dropout.
  std::string arch = "gpt";
  int64_t head_dim = 0;
  int64_t ffn_dim = 0;
  // A Hugging Face directory (attn/hf_decoder.h: Llama 3, Qwen2/3, Gemma 2/3)
  // to fine-tune: its config and weights replace the size options (arch stays
  // "gpt", the directory's family is used); its tokenizer.json is the
  // default tokenizer ("hf").
  std::string init_from;
  // tokenizer "hf": this tokenizer.json (a file or a directory holding one;
  // "" with init_from: the directory's). Text is encoded without the
  // post-processor's BOS, as the book's chapter 5 encodes.
  std::string tokenizer_file;

  // Throws std::invalid_argument naming the first bad value: a count or size
  // < 1 (warmup_iters, max_iters < 0), n_heads not dividing emb_dim, lr <= 0,
  // min_lr outside [0, lr], weight_decay or grad_clip < 0, drop_rate outside
  // [0, 1), betas outside [0, 1), a dtype other than float32 or bfloat16, a
  // tokenizer other than char or gpt2, stride or epochs < 0, an lr_schedule
  // other than cosine or constant, a decay other than matrices or all, exact
  // with dtype bfloat16, rope with an odd head size or theta_base <= 1,
  // latent_dim < 0 or with rope, exact or dtype bfloat16; n_kv_groups < 0 or
  // not dividing n_heads, sliding_window_size < 0, either of them with dtype
  // bfloat16 (the sdpa path is float32), with exact and drop_rate > 0 (its
  // dropout masks are not PyTorch's), with rope or with latent_dim.
  void validate() const;
  std::string to_json() const;
  // Reads the fields present in a JSON object string (others keep their values).
  static TrainOptions from_json(const std::string& json, TrainOptions base);
  static TrainOptions from_json(const std::string& json);  // base: the defaults
};

// The vocabulary's train/validation split: the first 90% of the tokens
// (rounded down) train, the rest validate.
struct Split {
  std::vector<int64_t> train, val;
};
Split split_90_10(const std::vector<int64_t>& tokens);

// Data parallelism: the collectives a Trainer on one of size() ranks needs
// (attn/dist.h implements them over MPI). Per step the Trainer calls
// start_bucket(b) for b = 0, 1, ... in order, as each bucket's gradients are
// final on this rank (during the last micro-batch's backward), then
// finish_buckets(), then allgather once for the losses.
class Collective {
 public:
  virtual ~Collective() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Once, before the first step: the parameters in buckets, in the order their
  // gradients become ready (the last block and the head first, the
  // embeddings last).
  virtual void set_buckets(const std::vector<std::vector<nn::Parameter*>>& buckets) = 0;
  // Bucket b's gradients are final on this rank: start summing them over the
  // ranks (non-blocking).
  virtual void start_bucket(size_t b) = 0;
  // Waits for every bucket: each parameter's grad is then the sum over ranks.
  virtual void finish_buckets() = 0;
  // Every rank's values, rank after rank (size() x values.size()).
  virtual std::vector<double> allgather(const std::vector<double>& values) = 0;
  // data[0, n) of rank `root` onto every rank (MPI_Bcast).
  virtual void broadcast(float* data, int64_t n, int root) = 0;
};

// The seed of micro-batch m's dropout masks at step `step` of a run seeded
// with `seed` (splitmix64 of the three; used when a step has > 1 micro-batch).
uint64_t micro_batch_seed(uint64_t seed, int64_t step, int64_t micro_batch);

// The model a Trainer trains, as its loop sees it: GPT-2's nn::GPTModel
// (arch "gpt") or a Llama / Qwen / Gemma nn::DecoderLM.
class LanguageModel {
 public:
  virtual ~LanguageModel() = default;
  virtual nn::Module& module() = 0;
  // ids (B, T) int64 -> logits (B, T, V).
  virtual Tensor forward(const Tensor& ids) = 0;
  // The mean cross-entropy of y (B, T) given x (B, T); keeps what backward_loss needs.
  virtual float forward_loss(const Tensor& x, const Tensor& y) = 0;
  virtual void backward_loss() = 0;
  // hook(i) once block i's backward is done (last to first); nullptr: none.
  virtual void set_backward_hook(std::function<void(int64_t block)> hook) = 0;
  virtual int64_t num_blocks() const = 0;
  // The block of a parameter (by its name in named_parameters()), -1 for none;
  // and whether it is the final norm or an untied output head (their
  // gradients are ready first).
  virtual int64_t block_of(const std::string& name) const = 0;
  virtual bool in_head(const std::string& name) const = 0;
  virtual int64_t vocab_size() const = 0;
  virtual int64_t context_length() const = 0;  // the most positions the model takes
  virtual int64_t num_parameters() = 0;
  // The checkpoint's "config": the GPTConfig's JSON (attn/model_config.h), or
  // the decoder's config.json (attn/hf_decoder.h).
  virtual std::string config_json() const = 0;
};

struct EvalResult {
  int64_t iter = 0;
  double train_loss = 0.0;  // mean of eval_iters batch losses
  double val_loss = 0.0;
};

class Trainer {
 public:
  // Tokenizes text (options.tokenizer: CharTokenizer::from_text, or GPT-2's
  // BPE), splits it 90/10 and builds a fresh model from seed. Throws
  // std::invalid_argument for invalid options, text or a split too short for a
  // window (char: context_length + 1 tokens; gpt2: a batch of training windows
  // and one validation window).
  Trainer(std::string_view text, const TrainOptions& options);
  // A gpt2 run on tokens already made (attn train --data-shards: a
  // memory-mapped ShardedTokens): the first 90% of the positions (rounded
  // down) train, the rest validate, each through a WindowLoader as above; no
  // token is read before its window is. Throws std::invalid_argument unless
  // options.tokenizer is gpt2, or as the text constructor does.
  Trainer(std::shared_ptr<const data::TokenSource> tokens, int64_t vocab_size, const TrainOptions& options);
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  // One iteration: learning rate for iteration iter(), a training batch,
  // forward, backward, clipping, AdamW. Returns the batch's loss. (gpt2: the
  // next batch of the training pass in progress, a new pass when it is done.)
  // It leaves every gradient zero: AdamW's pass zeroes each once read, in
  // place of the next step's zero_grad.
  float step();
  // The mean loss of eval_iters training batches, then of eval_iters
  // validation batches (in that order, from the run's generator), in eval()
  // mode; training mode is restored after. (gpt2: as the book's
  // calc_loss_loader, the first min(eval_iters, batches) batches of a fresh
  // pass over each loader, the mean of their losses.)
  // With compute = false (ranks other than 0 of a data-parallel run) only the
  // draws are made, so the generator stays in step; the losses are 0.
  EvalResult evaluate(bool compute = true);
  // Data parallelism: this trainer is rank collective->rank() of
  // collective->size() (nullptr: one process). Call before step() and
  // resume(); the collective must outlive the trainer's steps.
  void set_collective(Collective* collective);
  int ranks() const { return collective_ ? collective_->size() : 1; }
  // ZeRO stage 1 (after set_collective, before step() and resume()): each
  // parameter gets an owner rank (whole parameters, the largest first to the
  // least loaded rank); a rank keeps AdamW's moments for its own parameters
  // only and updates only those, then every parameter is broadcast from its
  // owner. The gradients are still allreduced whole (the clip needs their
  // global norm, computed as without sharding), so the weights are
  // bit-identical to the unsharded run. save() becomes collective: every rank
  // must call it (the moments are gathered; rank 0 writes the same file as
  // unsharded), and resume() reads a rank's own moments from it.
  void shard_optimizer();
  bool sharded() const { return !owner_.empty(); }
  // Bytes of AdamW moments this rank holds.
  int64_t optimizer_bytes() const;
  // Micro-batches per step over all ranks: ranks() x grad_accum_steps.
  int64_t micro_batches() const { return ranks() * options_.grad_accum_steps; }
  // Writes the checkpoint atomically (temporary file, fsync, rename). In a
  // data-parallel run only rank 0 writes (call it on every rank: with
  // shard_optimizer() it gathers the moments).
  void save(const std::string& path) const;
  // Loads a checkpoint written by save(): weights, optimizer moments and step,
  // iteration, generator state and last_eval_iter. Throws std::invalid_argument
  // naming the difference when its format, vocabulary or model configuration
  // differs from this trainer's (std::runtime_error for an unreadable file).
  void resume(const std::string& path);

  int64_t iter() const { return iter_; }  // completed iterations
  // The iteration of the last evaluation (-1: none yet); saved and restored,
  // so that a resumed run does not evaluate twice at one iteration.
  int64_t last_eval_iter() const { return last_eval_iter_; }
  void set_last_eval_iter(int64_t it) { last_eval_iter_ = it; }
  double lr() const { return optimizer_->lr(); }
  // The options, with max_iters resolved from epochs for gpt2 runs.
  const TrainOptions& options() const { return options_; }
  const std::string& tokenizer_name() const { return options_.tokenizer; }
  // The character vocabulary (char runs; std::logic_error for gpt2 runs).
  const CharTokenizer& tokenizer() const;
  // The run's tokenizer.json (hf runs; std::logic_error otherwise), and the
  // text of the file it was read from.
  const text::HfTokenizer& hf_tokenizer() const;
  const std::string& hf_tokenizer_json() const { return hf_tokenizer_json_; }
  // A token run's text <-> ids (gpt2: GPT-2's BPE with <|endoftext|>; hf: the
  // tokenizer.json without the post-processor). std::logic_error for char runs.
  std::vector<int64_t> encode(std::string_view text) const;
  std::string decode(const std::vector<int64_t>& ids) const;
  int64_t vocab_size() const { return lm_->vocab_size(); }
  LanguageModel& lm() { return *lm_; }
  // The GPT of an arch "gpt" run, the decoder of the others (std::logic_error
  // when asked for the other kind).
  bool is_decoder() const { return decoder_ != nullptr; }
  nn::GPTModel& model();
  nn::DecoderLM& decoder();
  // A decoder run's config.json side (model_type, bos and eos ids), for the
  // Hub layout (io::save_hf_decoder).
  const io::HfDecoderConfig& hub_config() const { return hub_; }
  int64_t train_tokens() const;
  int64_t val_tokens() const;
  // gpt2 runs: the pass over the training windows in progress (0-based
  // epoch), and the windows of each split.
  int64_t epoch() const { return passes_ > 0 ? passes_ - 1 : 0; }
  const WindowLoader* train_loader() const { return train_loader_.get(); }
  const WindowLoader* val_loader() const { return val_loader_.get(); }
  // Tokens one step processes over all ranks: micro_batches() x batch_size x
  // context_length.
  int64_t tokens_per_step() const {
    return micro_batches() * options_.batch_size * options_.context_length;
  }

  // The metadata a checkpoint of this trainer carries (see the file comment).
  std::map<std::string, std::string> metadata() const;

 private:
  void build(int64_t vocab_size);
  void build_gpt(int64_t vocab_size);
  void load_hf_tokenizer();
  void check_gpt_config(const std::map<std::string, std::string>& m, const std::string& path) const;
  std::pair<Tensor, Tensor> next_train_batch();
  float step_global();            // micro_batches() > 1 or a collective
  void bucket_ready(size_t b);    // the last micro-batch's bucket b is done on this rank

  TrainOptions options_;
  std::optional<CharTokenizer> chars_;     // char runs
  std::unique_ptr<Batcher> train_, val_;    // char runs
  std::unique_ptr<WindowLoader> train_loader_, val_loader_;  // gpt2 runs
  // --data-shards runs: {"dir", "manifest_fnv1a64", "tokens"} of the shards,
  // written to the checkpoint's metadata and checked on resume.
  std::string data_shards_;
  int64_t passes_ = 0;  // gpt2: training passes begun
  std::unique_ptr<Generator> gen_;  // before model_: the model's dropouts hold a pointer to it
  std::unique_ptr<nn::GPTModel> model_;     // arch gpt
  std::unique_ptr<nn::DecoderLM> decoder_;  // the others
  std::unique_ptr<LanguageModel> lm_;       // either, as the loop sees it
  io::HfDecoderConfig hub_;
  std::optional<text::HfTokenizer> hf_;  // hf runs
  std::string hf_tokenizer_json_;
  std::unique_ptr<optim::AdamW> optimizer_;
  std::vector<std::pair<std::string, nn::Parameter*>> params_;  // named_parameters()
  int64_t iter_ = 0;
  int64_t last_eval_iter_ = -1;
  bool grads_zero_ = false;  // the last step() left every gradient zero
  Collective* collective_ = nullptr;
  std::vector<std::vector<size_t>> buckets_;  // indices into params_, in ready order
  std::vector<Tensor> accum_;
  std::vector<int> owner_;  // shard_optimizer: the rank that updates params_[i]
  std::vector<optim::ParamGroup> full_groups_;  // shard_optimizer: the unsharded groups  // K > 1: the sum of the earlier micro-batches' gradients (params_ order)
};

}  // namespace attn::train
