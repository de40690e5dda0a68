// walkthrough.h - `attn walkthrough`: the SPEC's eight worked examples on
// "Your journey starts with one step", every intermediate tensor printed the way
// PyTorch 1.13 prints it, each under a one-line explanation that names the
// PyTorch line it mirrors.
//
// The computation (run_walkthrough) is separate from the printing (text or JSON)
// so the same list of tensors feeds both. tests/torch/oracle_walkthrough.py is the
// same walkthrough written in PyTorch; the tests compare the two tensor by tensor.
//
// `attn walkthrough --chapter 4` (the GPT chapter's notebook) is walkthrough_ch4.h;
// the subcommand registered here dispatches to it.
#pragma once

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "attn/tensor.h"
#include "attn/utf8.h"
#include "command.h"

namespace attn::cli {

struct WalkthroughSection {
  std::string name;   // what --section takes, e.g. "causal"
  std::string title;  // one line for the header
  std::string intro;  // one line: the idea of the step
};
// The eight sections in the SPEC's order.
const std::vector<WalkthroughSection>& walkthrough_sections();

// What each chapter's file needs of its section table (entries with an `.info`
// WalkthroughSection, in the notebook's order): the names joined by ", ", the
// infos alone, and the entry called `name` (std::invalid_argument otherwise:
// "unknown section 'NAME'<which> (known: ...)", e.g. which = " for chapter 4").
template <class Entry>
std::string section_names(const std::vector<Entry>& table) {
  std::vector<std::string> names;
  for (const auto& e : table) names.push_back(e.info.name);
  return fmt::format("{}", fmt::join(names, ", "));
}
template <class Entry>
std::vector<WalkthroughSection> section_infos(const std::vector<Entry>& table) {
  std::vector<WalkthroughSection> infos;
  for (const auto& e : table) infos.push_back(e.info);
  return infos;
}
template <class Entry>
const Entry& find_section_entry(const std::vector<Entry>& table, const std::string& name,
                                const char* which) {
  for (const auto& e : table) {
    if (e.info.name == name) return e;
  }
  throw std::invalid_argument(fmt::format("unknown section '{}'{} (known: {})", printable(name),
                                          which, section_names(table)));
}

// The attention matrix a shown tensor is, or comes with (a module's weights):
// what the pictures (--plot, --html, --heatmap) draw. Set only on query-by-key
// matrices: scores and weights, masked or not, and the heads of the modules.
struct AttentionMatrix {
  Tensor weights;                    // (T_q, T_k), or (H, T_q, T_k): one panel per head
  std::vector<std::string> queries;  // T_q labels: the query tokens
  std::vector<std::string> keys;     // T_k labels
  bool causal = false;  // key j after query i (j > i) is masked; -inf cells are masked anyway
  bool scores = false;  // raw scores: the scale spans their range (weights: [0, max(1, max)])
  std::string note;     // what the picture shows when it is not the tensor itself
};

// One printed tensor.
struct Shown {
  std::string section;
  std::string name;         // the PyTorch expression or variable, e.g. "sa_v1(inputs)"
  std::string explanation;  // "<what it is>: <PyTorch line>   shape (6, 2)"
  Tensor value;
  std::string what;        // the explanation's two parts
  std::string torch_line;  //
  std::optional<AttentionMatrix> attention;
};

struct WalkthroughOptions {
  std::vector<std::string> sections;  // names in the order to run them; empty: all
  std::optional<uint64_t> seed;       // replaces every torch.manual_seed of the examples
};

// Parses a seed as torch.manual_seed takes it: a decimal integer in
// [-2^63, 2^64 - 1], negative values wrapping to uint64 as in PyTorch.
// Throws UsageError naming the text otherwise.
uint64_t parse_seed(const std::string& text);

// Runs the chosen sections (each recomputes what it needs from earlier ones, so any
// subset works). Throws std::invalid_argument for an unknown section name.
std::vector<Shown> run_walkthrough(const WalkthroughOptions& options);

// The tokens of the example sentence, in order.
const std::vector<std::string>& walkthrough_tokens();

// Registers the `walkthrough` subcommand on the app.
Command add_walkthrough_command(CLI::App& app);

}  // namespace attn::cli
