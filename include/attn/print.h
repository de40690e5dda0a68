// attn/print.h - PyTorch-style printing of tensors.
//
// to_string(t) gives exactly what print(t) gives in PyTorch 1.13 with default
// print options (precision 4, linewidth 80, threshold 1000, edgeitems 3):
//   tensor([[0.4300, 0.1500, 0.8900],
//           [0.5500, 0.8700, 0.6600]])
// including PyTorch's choice between fixed and scientific notation, integer
// style ("tensor([1., 2.])"), common column width, line wrapping at linewidth,
// and summarisation with "..." for tensors over the threshold. Any layout;
// bfloat16 prints as PyTorch prints it (its float values, then
// "dtype=torch.bfloat16"), int64 as integers ("tensor([ 40, 367])").
#pragma once

#include <optional>
#include <ostream>
#include <string>

#include "attn/tensor.h"

namespace attn {

struct PrintOptions {
  int precision = 4;
  int linewidth = 80;
  int64_t threshold = 1000;  // more elements than this are summarised
  int64_t edgeitems = 3;
  // Appended inside the parentheses, e.g. "grad_fn=<MmBackward0>" gives
  // "tensor([...], grad_fn=<MmBackward0>)".
  std::string suffix;
  // torch.set_printoptions(sci_mode=...): nullopt chooses as PyTorch does;
  // true/false force scientific/fixed notation for a floating-point tensor
  // with a nonzero finite value, keeping the width the choice would have had
  // (PyTorch 1.13's _Formatter: sci_mode=False prints 1e-9 and 1000 as
  // "    0.0000,  1000.0000").
  std::optional<bool> sci_mode;
};

std::string to_string(const Tensor& t, const PrintOptions& options = {});
std::ostream& operator<<(std::ostream& os, const Tensor& t);

}  // namespace attn
