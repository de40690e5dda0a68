// The book's chapter-5 recipe and train_model_simple (attn/train_book.h).
#include "attn/train_book.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <stdexcept>

#include "attn/ops.h"
#include "attn/tokenizer.h"
#include "attn/utf8.h"

namespace attn::train {

TrainOptions book_ch5_options() {
  TrainOptions o;
  // GPT_CONFIG_124M with context_length 256
  o.n_layers = 12;
  o.n_heads = 12;
  o.emb_dim = 768;
  o.context_length = 256;
  o.drop_rate = 0.1;
  // create_dataloader_v1(batch_size=2, max_length=256, stride=256)
  o.tokenizer = "gpt2";
  o.batch_size = 2;
  o.stride = 256;
  // AdamW(model.parameters(), lr=0.0004, weight_decay=0.1), torch's defaults otherwise
  o.lr = 4e-4;
  o.min_lr = 4e-4;
  o.warmup_iters = 0;
  o.lr_schedule = "constant";
  o.weight_decay = 0.1;
  o.decay = "all";
  o.beta1 = 0.9;
  o.beta2 = 0.999;
  o.grad_clip = 0.0;
  // train_model_simple(num_epochs=10, eval_freq=5, eval_iter=5)
  o.epochs = 10;
  o.eval_interval = 5;
  o.eval_iters = 5;
  o.seed = 123;
  o.exact = true;
  return o;
}

Tensor generate_text_simple(
    nn::GPTModel& model, const Tensor& idx, int64_t max_new_tokens, int64_t context_size,
    const std::function<void(int64_t step, const std::vector<int64_t>& next)>& on_token) {
  return generate_text_simple([&](const Tensor& ids) { return model.forward(ids); }, idx,
                              max_new_tokens, context_size, on_token);
}

Tensor generate_text_simple(
    const std::function<Tensor(const Tensor&)>& logits_of, const Tensor& idx,
    int64_t max_new_tokens, int64_t context_size,
    const std::function<void(int64_t step, const std::vector<int64_t>& next)>& on_token) {
  if (idx.dtype() != DType::kInt64 || idx.dim() != 2 || idx.size(0) < 1 || idx.size(1) < 1)
    throw std::invalid_argument(fmt::format(
        "generate_text_simple: expected token ids (B, T) int64 with B, T >= 1, got {} {}",
        dtype_name(idx.dtype()), shape_str(idx.shape())));
  if (max_new_tokens < 0 || context_size < 1)
    throw std::invalid_argument(
        fmt::format("generate_text_simple: max_new_tokens must be >= 0 and context_size >= 1, "
                    "got {} and {}",
                    max_new_tokens, context_size));
  const int64_t B = idx.size(0);
  const int64_t T0 = idx.size(1);
  const std::vector<int64_t> flat = idx.to_int64_vector();
  std::vector<std::vector<int64_t>> rows(static_cast<size_t>(B));
  for (int64_t b = 0; b < B; ++b)
    rows[static_cast<size_t>(b)].assign(flat.begin() + b * T0, flat.begin() + (b + 1) * T0);
  for (int64_t step = 0; step < max_new_tokens; ++step) {
    const int64_t T = static_cast<int64_t>(rows[0].size());
    const int64_t T_cond = std::min(T, context_size);  // idx[:, -context_size:]
    std::vector<int64_t> cond;
    for (const auto& row : rows) cond.insert(cond.end(), row.end() - T_cond, row.end());
    const Tensor logits = logits_of(Tensor::from_int64({B, T_cond}, cond));      // (B, T, V)
    const Tensor probas = softmax(select(logits, 1, T_cond - 1), -1);            // (B, V)
    const int64_t V = probas.size(1);
    const std::vector<float> p = probas.to_vector();
    std::vector<int64_t> next(static_cast<size_t>(B));
    for (int64_t b = 0; b < B; ++b) {
      const auto first = p.begin() + b * V;
      next[static_cast<size_t>(b)] = std::max_element(first, first + V) - first;
      rows[static_cast<size_t>(b)].push_back(next[static_cast<size_t>(b)]);
    }
    if (on_token) on_token(step, next);
  }
  std::vector<int64_t> out;
  for (const auto& row : rows) out.insert(out.end(), row.begin(), row.end());
  return Tensor::from_int64({B, static_cast<int64_t>(rows[0].size())}, out);
}

std::string format_evaluation(const BookEvaluation& e) {
  return fmt::format("Ep {} (Step {:06d}): Train loss {:.3f}, Val loss {:.3f}", e.epoch,
                     e.global_step, e.train_loss, e.val_loss);
}

namespace {

// generate_and_print_sample: eval mode, greedy tokens from the start context
// (context size: the model's positional embeddings), decoded with each newline
// a space, train mode again.
BookSample epoch_sample(Trainer& trainer, const std::string& start_context, int64_t sample_tokens,
                        int64_t epoch) {
  LanguageModel& model = trainer.lm();
  const std::vector<int64_t> encoded = trainer.encode(start_context);
  model.module().eval();
  const Tensor ids =
      generate_text_simple([&](const Tensor& x) { return model.forward(x); },
                           Tensor::from_int64({1, static_cast<int64_t>(encoded.size())}, encoded),
                           sample_tokens, model.context_length());
  model.module().train();
  BookSample s;
  s.epoch = epoch;
  s.ids = ids.to_int64_vector();
  s.text = utf8_replacing_invalid(trainer.decode(s.ids));  // tiktoken's errors="replace"
  std::replace(s.text.begin(), s.text.end(), '\n', ' ');
  return s;
}

}  // namespace

BookHistory train_model_simple(Trainer& trainer, const BookCallbacks& cb,
                               const std::string& start_context, int64_t sample_tokens) {
  const TrainOptions& o = trainer.options();
  if (o.tokenizer == "char" || o.epochs < 1 || trainer.train_loader() == nullptr)
    throw std::invalid_argument(
        fmt::format("train_model_simple: needs a gpt2 or hf run with epochs >= 1 (the book's data "
                    "loaders), got "
                    "tokenizer {} and epochs {}",
                    o.tokenizer, o.epochs));
  if (trainer.iter() != 0)
    throw std::invalid_argument(fmt::format(
        "train_model_simple: the trainer has already run {} steps; the book's loop starts from "
        "the fresh model",
        trainer.iter()));
  BookHistory history;
  int64_t tokens_seen = 0, global_step = -1;
  for (int64_t epoch = 0; epoch < o.epochs; ++epoch) {
    // model.train(); for input_batch, target_batch in train_loader: the first
    // step begins the epoch's pass (its draws), the last ends it.
    do {
      const auto start = std::chrono::steady_clock::now();
      const float loss = trainer.step();  // zero_grad, loss, backward, AdamW
      const double ms =
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
      tokens_seen += trainer.tokens_per_step();  // input_batch.numel() (drop_last: full batches)
      ++global_step;
      if (cb.on_step) cb.on_step(global_step, loss, ms);
      if (global_step % o.eval_interval == 0) {
        const EvalResult r = trainer.evaluate();  // evaluate_model(..., eval_iter)
        const BookEvaluation e{epoch + 1, global_step, r.train_loss, r.val_loss, tokens_seen};
        history.evaluations.push_back(e);
        if (cb.on_evaluation) cb.on_evaluation(e);
      }
      if (cb.should_stop && cb.should_stop()) {
        history.stopped = true;
        return history;
      }
    } while (trainer.train_loader()->in_pass());
    history.samples.push_back(epoch_sample(trainer, start_context, sample_tokens, epoch + 1));
    if (cb.on_sample) cb.on_sample(history.samples.back());
  }
  return history;
}

}  // namespace attn::train
