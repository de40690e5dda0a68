// walkthrough.h - `attn walkthrough`: the SPEC's eight worked examples on
// "Your journey starts with one step", every intermediate tensor printed the way
// PyTorch 1.13 prints it, each under a one-line explanation that names the
// PyTorch line it mirrors.
//
// The computation (run_walkthrough) is separate from the printing (text or JSON)
// so the same list of tensors feeds both. tests/torch/oracle_walkthrough.py is the
// same walkthrough written in PyTorch; the tests compare the two tensor by tensor.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "attn/tensor.h"
#include "command.h"

namespace attn::cli {

struct WalkthroughSection {
  std::string name;   // what --section takes, e.g. "causal"
  std::string title;  // one line for the header
  std::string intro;  // one line: the idea of the step
};
// The eight sections in the SPEC's order.
const std::vector<WalkthroughSection>& walkthrough_sections();

// One printed tensor.
struct Shown {
  std::string section;
  std::string name;         // the PyTorch expression or variable, e.g. "sa_v1(inputs)"
  std::string explanation;  // "<what it is>: <PyTorch line>   shape (6, 2)"
  Tensor value;
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

// Registers the `walkthrough` subcommand on the app.
Command add_walkthrough_command(CLI::App& app);

}  // namespace attn::cli
