// attn/train.h - training a character-level GPT on a UTF-8 text (`attn train`).
//
//   CharTokenizer  the text's distinct code points, sorted, are the vocabulary;
//                  encode / decode between text and token ids
//   Batcher        (B, T) inputs and (B, T) next-token targets cut from random
//                  windows of T + 1 tokens, offsets drawn from a Generator
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
// The checkpoint (checkpoint.safetensors, the format `attn generate` reads):
// tensors: the model's state_dict() (F32) and "optim.<param>.exp_avg",
// "optim.<param>.exp_avg_sq"; __metadata__: "format" = "attn-checkpoint-1",
// "config" (the GPTConfig as JSON), "vocab" (JSON array of one-character
// strings in id order), "iter", "optim_step", "train_args" (TrainOptions as
// JSON), "generator" (the Generator's state as JSON) and "last_eval_iter".
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "attn/gpt.h"
#include "attn/optim.h"
#include "attn/random.h"
#include "attn/tensor.h"
#include "attn/utf8.h"

namespace attn::train {

inline constexpr const char* kCheckpointFormat = "attn-checkpoint-1";

// UTF-8 as attn/utf8.h decodes it (kept here under the names it had first).
using attn::decode_utf8;
using attn::encode_utf8;

class CharTokenizer {
 public:
  // The distinct code points of text, sorted; throws std::invalid_argument
  // for invalid UTF-8 (naming the byte offset) or an empty text.
  static CharTokenizer from_text(std::string_view text);
  // A vocabulary in id order, each entry one character as UTF-8 (a
  // checkpoint's "vocab"); throws std::invalid_argument for an entry that is
  // not exactly one character, or a repeated one.
  explicit CharTokenizer(std::vector<std::string> vocab);

  // Token ids of text; throws std::invalid_argument naming the byte offset of
  // invalid UTF-8 or of a character outside the vocabulary.
  std::vector<int64_t> encode(std::string_view text) const;
  // Text of token ids; throws std::out_of_range naming an id outside [0, size()).
  std::string decode(const std::vector<int64_t>& ids) const;
  int64_t size() const { return static_cast<int64_t>(vocab_.size()); }
  const std::vector<std::string>& vocab() const { return vocab_; }
  // The vocabulary as a JSON array string, and back.
  std::string to_json() const;
  static CharTokenizer from_json(const std::string& json);

 private:
  std::vector<std::string> vocab_;      // id -> character (UTF-8)
  std::map<char32_t, int64_t> ids_;     // code point -> id
};

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

  // Throws std::invalid_argument naming the first bad value: a count or size
  // < 1 (warmup_iters, max_iters < 0), n_heads not dividing emb_dim, lr <= 0,
  // min_lr outside [0, lr], weight_decay or grad_clip < 0, drop_rate outside
  // [0, 1), betas outside [0, 1), a dtype other than float32 or bfloat16.
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

struct EvalResult {
  int64_t iter = 0;
  double train_loss = 0.0;  // mean of eval_iters batch losses
  double val_loss = 0.0;
};

class Trainer {
 public:
  // Tokenizes text (CharTokenizer::from_text), splits it 90/10 and builds a
  // fresh model from seed. Throws std::invalid_argument for invalid options,
  // text or a split shorter than context_length + 1 tokens.
  Trainer(std::string_view text, const TrainOptions& options);
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  // One iteration: learning rate for iteration iter(), a training batch,
  // forward, backward, clipping, AdamW. Returns the batch's loss.
  float step();
  // The mean loss of eval_iters training batches, then of eval_iters
  // validation batches (in that order, from the run's generator), in eval()
  // mode; training mode is restored after.
  EvalResult evaluate();
  // Writes the checkpoint atomically (temporary file, fsync, rename).
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
  const TrainOptions& options() const { return options_; }
  const CharTokenizer& tokenizer() const { return tokenizer_; }
  nn::GPTModel& model() { return *model_; }
  int64_t train_tokens() const { return train_.tokens(); }
  int64_t val_tokens() const { return val_.tokens(); }
  // Tokens one step processes: batch_size x context_length.
  int64_t tokens_per_step() const { return options_.batch_size * options_.context_length; }

  // The metadata a checkpoint of this trainer carries (see the file comment).
  std::map<std::string, std::string> metadata() const;

 private:
  Trainer(const TrainOptions& options, CharTokenizer tokenizer, Split split);

  TrainOptions options_;
  CharTokenizer tokenizer_;
  Batcher train_, val_;
  std::unique_ptr<Generator> gen_;  // before model_: the model's dropouts hold a pointer to it
  std::unique_ptr<nn::GPTModel> model_;
  std::unique_ptr<optim::AdamW> optimizer_;
  std::vector<std::pair<std::string, nn::Parameter*>> params_;  // named_parameters()
  int64_t iter_ = 0;
  int64_t last_eval_iter_ = -1;
};

// The GPTConfig of a checkpoint's "config" JSON, and back.
std::string config_to_json(const nn::GPTConfig& cfg);
nn::GPTConfig config_from_json(const std::string& json);

}  // namespace attn::train
