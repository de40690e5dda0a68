// walkthrough_ch4.h - `attn walkthrough --chapter 4`: what the book's chapter-4
// notebook prints (the tokenized batch, DummyGPTModel, GPTModel with
// GPT_CONFIG_124M under torch.manual_seed(123), its parameter counts, greedy
// generate_text_simple from "Hello, I am"), each line as PyTorch 1.13 prints it,
// under a one-line explanation naming the notebook's code.
//
// Chapter 4 prints more than tensors (shapes, counts, id lists, text), so each
// printed item is the exact text of the notebook's print() plus its value for
// --json. tests/torch/oracle_walkthrough_ch4.py is the same notebook in PyTorch;
// tests/torch/test_walkthrough_ch4_torch.cpp compares the two line by line.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "attn/gpt.h"
#include "attn/tensor.h"
#include "walkthrough_sections.h"

namespace attn::cli {

// The sections in the notebook's order: batch, dummy, layernorm, feedforward, shortcut, block,
// gpt, generate.
const std::vector<WalkthroughSection>& walkthrough_ch4_sections();

// Runs the chosen sections (empty: all) in the notebook's order, whatever
// order they are named in; each rebuilds what it needs from manual_seed(123).
// Throws std::invalid_argument naming an unknown section and the known ones.
std::vector<Printed> run_walkthrough_ch4(const std::vector<std::string>& sections,
                                         const ProgressFn& progress = nullptr);

// The book's generate_text_simple (greedy: softmax of the last position's
// logits, the first maximum), idx (B, T) int64 -> (B, T + max_new_tokens);
// progress gets one line per token. Chapter 5 generates with it too.
Tensor generate_text_simple(nn::GPTModel& model, const Tensor& idx, int64_t max_new_tokens,
                            int64_t context_size, const ProgressFn& progress);

// Throws std::invalid_argument when `name` is not a chapter-4 section.
void check_ch4_section(const std::string& name);

// The text form (headers, explanations, then each print's text); the JSON form
// is printed_to_json's (walkthrough_sections.h).
std::string ch4_to_text(const std::vector<Printed>& printed);

}  // namespace attn::cli
