// walkthrough_ch5.h - `attn walkthrough --chapter 5`: what the book's chapter-5
// notebook prints, without its training (train_model_simple), each line as
// PyTorch 1.13 prints it, under a one-line explanation naming the notebook's code:
// GPTModel(GPT_CONFIG_124M with context_length 256) under torch.manual_seed(123)
// generating from "Every effort moves you"; the loss example (probabilities,
// log probabilities, cross entropy, perplexity); The Verdict's characters and
// tokens; the train/validation loaders (create_dataloader_v1); and the untrained
// model's calc_loss_loader on both; and, after the training in the notebook, the
// decoding strategies on the 9-word vocabulary (argmax, torch.multinomial, 1,000
// draws at temperatures 1, 0.1 and 5, top-k).
//
// The training and what needs the trained model (its samples, generate with
// top_k and temperature, saving it, loading GPT-2's weights) are not here: --section names only
// the sections below. tests/torch/oracle_walkthrough_ch5.py is the same notebook
// in PyTorch; tests/torch/test_walkthrough_ch5_torch.cpp compares the two.
#pragma once

#include <string>
#include <vector>

#include "walkthrough.h"
#include "walkthrough_ch4.h"

namespace attn::cli {

// The sections in the notebook's order: generate, loss, data, loaders, loader_loss,
// decoding.
const std::vector<WalkthroughSection>& walkthrough_ch5_sections();

// Runs the chosen sections (empty: all) in the notebook's order; each rebuilds
// what it needs from torch.manual_seed(123). `text_path` is the notebook's
// "the-verdict.txt" (read by data, loaders and loader_loss; std::runtime_error
// naming the path when it cannot be read). Throws std::invalid_argument naming
// an unknown section and the known ones.
std::vector<Printed> run_walkthrough_ch5(const std::vector<std::string>& sections,
                                         const std::string& text_path,
                                         const ProgressFn& progress = nullptr);

// Throws std::invalid_argument when `name` is not a chapter-5 section.
void check_ch5_section(const std::string& name);

// The text form (headers, explanations, then each print's text); the JSON form
// is ch4_to_json's.
std::string ch5_to_text(const std::vector<Printed>& printed);

}  // namespace attn::cli
