// walkthrough_ch5.h - `attn walkthrough --chapter 5`: what the book's chapter-5
// notebook prints, each line as PyTorch 1.13 prints it, under a one-line
// explanation naming the notebook's code: GPTModel(GPT_CONFIG_124M with
// context_length 256) under torch.manual_seed(123) generating from "Every
// effort moves you"; the loss example (probabilities, log probabilities, cross
// entropy, perplexity); The Verdict's characters and tokens; the
// train/validation loaders (create_dataloader_v1); the untrained model's
// calc_loss_loader on both; the training (train_model_simple, 10 epochs:
// attn/train_book.h on the reference path, minutes); the trained model's
// 25-token greedy text; the decoding strategies on the 9-word vocabulary
// (argmax, torch.multinomial, 1,000 draws at temperatures 1, 0.1 and 5,
// top-k); and the chapter's generate with top_k=25, temperature=1.4.
//
// Saving the model and loading GPT-2's weights are not here.
// tests/torch/oracle_walkthrough_ch5.py is the notebook up to the training in
// PyTorch, tests/torch/record_ch5_training.py its training and what follows
// (recorded once to tests/fixtures/ch5_training/); tests/torch/
// test_walkthrough_ch5_torch.cpp and test_ch5_training_torch.cpp compare.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "walkthrough_sections.h"

namespace attn::cli {

// The sections in the notebook's order: generate, loss, data, loaders, loader_loss,
// train, trained_generate, decoding, top_k_generate.
const std::vector<WalkthroughSection>& walkthrough_ch5_sections();

struct Ch5Options {
  // The notebook's "the-verdict.txt" (read by data, loaders, loader_loss and
  // the training; std::runtime_error naming the path when it cannot be read).
  std::string text_path;
  // The training cell's num_epochs (the notebook's 10; fewer for a quick look:
  // the first epochs' prints are the same).
  int64_t num_epochs = 10;
  // Each training step (done of total, its loss), for the progress display
  // (progress.h); empty: a progress line per step instead.
  std::function<void(int64_t done, int64_t total, float loss)> on_train_step;
};

// Runs the chosen sections (empty: all) in the notebook's order; each rebuilds
// what it needs from torch.manual_seed(123) (trained_generate and
// top_k_generate train the model first, without printing the training, when
// train is not chosen). Throws std::invalid_argument naming an unknown section
// and the known ones, or num_epochs < 1.
std::vector<Printed> run_walkthrough_ch5(const std::vector<std::string>& sections,
                                         const Ch5Options& options,
                                         const ProgressFn& progress = nullptr);

// Throws std::invalid_argument when `name` is not a chapter-5 section.
void check_ch5_section(const std::string& name);

// The text form (headers, explanations, then each print's text); the JSON form
// is printed_to_json's (walkthrough_sections.h).
std::string ch5_to_text(const std::vector<Printed>& printed);

}  // namespace attn::cli
