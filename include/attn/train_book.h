// attn/train_book.h - the book's chapter-5 pretraining recipe and loop
// (`attn train --recipe book-ch5`, `attn walkthrough --chapter 5`).
//
//   book_ch5_options()    GPT_CONFIG_124M with context_length 256, GPT-2's BPE,
//                         windows of 256 every 256 tokens, batch 2, the text
//                         split 90/10 by characters, AdamW(lr 4e-4, weight
//                         decay 0.1 on every parameter, betas (0.9, 0.999),
//                         eps 1e-8), constant learning rate, no clipping,
//                         dropout 0.1 with PyTorch's masks (the reference path),
//                         10 epochs, evaluation every 5 steps on 5 batches,
//                         seed 123
//   train_model_simple()  the notebook's train_model_simple around a Trainer:
//                         each epoch one pass over the training loader, one
//                         AdamW step per batch; after global step s (0-based)
//                         with s % eval_freq == 0 the evaluation (the book's
//                         evaluate_model: calc_loss_loader on the first
//                         eval_iter batches of a fresh pass over each loader,
//                         in eval mode); after each epoch a greedy 50-token
//                         sample from the start context
//   generate_text_simple  the book's greedy generation (chapter 4)
//
// With the same seed the run draws what the book's draws under PyTorch, in the
// same order, from one Generator (torch.manual_seed(123) before GPTModel): the
// weights, each training pass's loader seeds and permutation, each dropout
// mask, each evaluation pass's loader seeds (docs/rng.md).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "attn/gpt.h"
#include "attn/tensor.h"
#include "attn/train.h"

namespace attn::train {

// The book-ch5 recipe's options (see the file comment); tokenizer "gpt2",
// lr_schedule "constant", decay "all", exact true.
TrainOptions book_ch5_options();

// The notebook's start_context for the per-epoch samples.
inline constexpr const char* kBookStartContext = "Every effort moves you";

// The book's generate_text_simple: for max_new_tokens steps, the logits of the
// last position of the last context_size tokens, softmax, argmax (the first
// maximum, as torch.argmax over the probabilities), appended. idx (B, T) int64
// -> (B, T + max_new_tokens). on_token, when given, sees each step's new ids
// (B). Throws std::invalid_argument for idx not (B, T) int64 with B, T >= 1,
// or max_new_tokens < 0 or context_size < 1.
Tensor generate_text_simple(
    nn::GPTModel& model, const Tensor& idx, int64_t max_new_tokens, int64_t context_size,
    const std::function<void(int64_t step, const std::vector<int64_t>& next)>& on_token = nullptr);
// The same loop over any model: logits_of(ids (B, T)) -> logits (B, T, V).
Tensor generate_text_simple(
    const std::function<Tensor(const Tensor&)>& logits_of, const Tensor& idx,
    int64_t max_new_tokens, int64_t context_size,
    const std::function<void(int64_t step, const std::vector<int64_t>& next)>& on_token = nullptr);

// One evaluation of train_model_simple, as its print shows it.
struct BookEvaluation {
  int64_t epoch = 0;        // 1-based, as printed ("Ep 1")
  int64_t global_step = 0;  // 0-based ("Step 000000")
  double train_loss = 0.0;  // calc_loss_loader(train_loader, num_batches=eval_iter)
  double val_loss = 0.0;    // calc_loss_loader(val_loader, num_batches=eval_iter)
  int64_t tokens_seen = 0;  // input tokens of the steps so far
};

// The sample generate_and_print_sample prints after an epoch.
struct BookSample {
  int64_t epoch = 0;          // 1-based
  std::vector<int64_t> ids;   // the start context's ids and the 50 new ones
  std::string text;           // decoded as tiktoken decodes (invalid UTF-8 -> U+FFFD), each
                              // "\n" replaced by " " (the print)
};

// "Ep 1 (Step 000000): Train loss 9.781, Val loss 9.933": the f-string of
// train_model_simple (3 decimals, correctly rounded as Python rounds).
std::string format_evaluation(const BookEvaluation& e);

struct BookCallbacks {
  // After each step: the 0-based global step, the batch's loss, the step's
  // wall time in milliseconds.
  std::function<void(int64_t global_step, float loss, double ms)> on_step;
  std::function<void(const BookEvaluation&)> on_evaluation;
  std::function<void(const BookSample&)> on_sample;
  // Asked after each step; true stops the loop there (history.stopped).
  std::function<bool()> should_stop;
};

struct BookHistory {
  std::vector<BookEvaluation> evaluations;
  std::vector<BookSample> samples;
  bool stopped = false;  // should_stop() ended it before the last epoch
};

// Runs train_model_simple on a fresh Trainer: options().epochs epochs,
// eval_freq = options().eval_interval, eval_iter = options().eval_iters, a
// greedy sample of sample_tokens tokens from start_context after each epoch
// (the model in eval mode, then back in train mode). Throws
// std::invalid_argument when the trainer is not a gpt2 run with epochs >= 1,
// or has already trained (iter() > 0).
BookHistory train_model_simple(Trainer& trainer, const BookCallbacks& callbacks = {},
                               const std::string& start_context = kBookStartContext,
                               int64_t sample_tokens = 50);

}  // namespace attn::train
