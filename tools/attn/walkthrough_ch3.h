// walkthrough_ch3.h - `attn walkthrough` (chapter 3, the default): the SPEC's
// eight worked examples on "Your journey starts with one step", every
// intermediate tensor printed the way PyTorch 1.13 prints it, each under a
// one-line explanation that names the PyTorch line it mirrors.
//
// The computation (run_walkthrough_ch3) is separate from the printing (text or
// JSON, or the pictures of walkthrough_pictures.h) so the same list of tensors
// feeds all of them. tests/torch/oracle_walkthrough.py is the same walkthrough
// written in PyTorch; the tests compare the two tensor by tensor.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "attn/tensor.h"
#include "walkthrough_sections.h"

namespace attn::cli {

// The eight sections in the SPEC's order.
const std::vector<WalkthroughSection>& walkthrough_ch3_sections();

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

// Runs the chosen sections (each recomputes what it needs from earlier ones, so any
// subset works). Throws std::invalid_argument for an unknown section name.
std::vector<Shown> run_walkthrough_ch3(const WalkthroughOptions& options);

// Throws std::invalid_argument when `name` is not a chapter-3 section.
void check_ch3_section(const std::string& name);

// The tokens of the example sentence, in order.
const std::vector<std::string>& walkthrough_tokens();

// The text form (a header naming the seeds, then each section's title and intro
// and each tensor under its "# " explanation) and the JSON form (an array, one
// tensor per line: section, name, explanation, shape, values with inf, -inf and
// nan as strings, text).
std::string ch3_to_text(const std::vector<Shown>& shown, const std::optional<uint64_t>& seed);
std::string ch3_to_json(const std::vector<Shown>& shown);

}  // namespace attn::cli
