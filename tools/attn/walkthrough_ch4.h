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

#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "attn/gpt.h"
#include "attn/tensor.h"
#include "walkthrough.h"

namespace attn::cli {

// The sections in the notebook's order: batch, dummy, layernorm, feedforward, shortcut, block,
// gpt, generate.
const std::vector<WalkthroughSection>& walkthrough_ch4_sections();

// One print() of the notebook.
struct Printed {
  std::string section;
  std::string name;         // the notebook's expression, e.g. "model.tok_emb.weight.shape"
  std::string explanation;  // "<what it is>: <the notebook's code>"
  std::string text;         // what print() writes, without its final newline
  nlohmann::json value;     // a tensor's {"shape", "values"}, a list, a number or a string
};

// Receives one line of progress (the GPT-124M parts take seconds).
using ProgressFn = std::function<void(const std::string&)>;

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

// The text form (headers, explanations, then each print's text) and the JSON
// form (an array, one object per print: section, name, explanation, text, value).
// The prints as text: `header`, then each section's title and intro (from
// `sections`, by name) before its first print, and each print under its "# "
// explanation. Chapters 4 and 5 share it.
std::string printed_to_text(const std::string& header, const std::vector<Printed>& printed,
                            const std::vector<WalkthroughSection>& sections);
std::string ch4_to_text(const std::vector<Printed>& printed);
std::string ch4_to_json(const std::vector<Printed>& printed);

}  // namespace attn::cli
