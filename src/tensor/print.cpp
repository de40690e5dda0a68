// PyTorch-exact printing: a port of torch/_tensor_str.py (PyTorch 1.13) for
// float32, bfloat16 and int64 tensors of any layout.
//
// How PyTorch prints a float tensor:
//  1. A _Formatter looks at the finite non-zero values (of the summarised
//     tensor when numel > threshold) and picks one style for the whole tensor:
//       - integer style "3." when every such value is an integer;
//       - scientific "1.2346e+05" when max/min > 1000 or max > 1e8 (both
//         styles) or min < 1e-4 (non-integers only);
//       - fixed "0.1235" (precision decimals) otherwise;
//     and a common width: the longest formatted finite non-zero value
//     (plus 1 for the "." of the integer style), at least 1.
//  2. Every value is formatted from its float64 copy, with Python's
//     '{:.4f}' / '{:.4e}' / '{:.0f}' (fmt's {:.4f} of the same double rounds
//     the same way: both are exact, round-half-even on the binary value), and
//     right-aligned to the common width. inf/nan are not counted in the width.
//  3. Rows are lists "[a, b, c]" wrapped after floor((linewidth - indent) /
//     (width + 2)) elements; an N-D tensor is the list of its (N-1)-D slices
//     joined by "," + (N-1) newlines + indent spaces. Over the threshold, each
//     dim longer than 2 * edgeitems shows its first and last edgeitems entries
//     around "..." (a " ..." element in a row).
//  4. "tensor(" + that + suffixes + ")", where empty tensors that are not 1-D
//     get "size=(0, 3)" and a suffix that would pass linewidth goes on a new
//     line.
// A bfloat16 tensor is printed as its float32 values (_tensor_str calls
// self.float()) with the suffix "dtype=torch.bfloat16". An int64 tensor is
// printed with str() of each value, right-aligned to the longest, and no dtype
// suffix unless it is empty (int64 is a default dtype, but an empty list
// shows no values to tell).
#include "attn/print.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

namespace attn {
namespace {

// Python's float formatting of a float32 value (via its float64 copy). NaN is
// "nan" whatever its sign bit, as Python writes it.
std::string format_fixed(float v, int precision) {
  if (std::isnan(v)) return "nan";
  return fmt::format("{:.{}f}", static_cast<double>(v), precision);
}
std::string format_sci(float v, int precision) {
  if (std::isnan(v)) return "nan";
  return fmt::format("{:.{}e}", static_cast<double>(v), precision);
}

// torch._tensor_str._Formatter for an integer tensor: '{}'.format(value),
// right-aligned to the widest value the formatter sees.
class IntFormatter {
 public:
  explicit IntFormatter(const std::vector<int64_t>& values) {
    for (int64_t v : values) max_width_ = std::max(max_width_, static_cast<int>(fmt::format("{}", v).size()));
  }
  int width() const { return max_width_; }
  std::string format(int64_t v) const {
    std::string s = fmt::format("{}", v);
    if (static_cast<int>(s.size()) < max_width_) s.insert(0, static_cast<size_t>(max_width_) - s.size(), ' ');
    return s;
  }

 private:
  int max_width_ = 1;
};

// torch._tensor_str._Formatter for a floating-point tensor.
class Formatter {
 public:
  Formatter(const std::vector<float>& values, int precision, std::optional<bool> sci_mode)
      : precision_(precision) {
    std::vector<float> nonzero_finite;
    for (float v : values)
      if (std::isfinite(v) && v != 0.0f) nonzero_finite.push_back(v);
    if (nonzero_finite.empty()) return;  // no valid number: integer style, width 1

    double abs_min = INFINITY, abs_max = 0.0;
    for (float v : nonzero_finite) {
      const double a = std::fabs(static_cast<double>(v));
      abs_min = std::min(abs_min, a);
      abs_max = std::max(abs_max, a);
    }
    for (float v : nonzero_finite) {
      if (v != std::ceil(v)) {
        int_mode_ = false;
        break;
      }
    }
    // The thresholds of _Formatter, compared in float64.
    const bool wide_range = abs_max / abs_min > 1000.0 || abs_max > 1.0e8;
    sci_mode_ = int_mode_ ? wide_range : wide_range || abs_min < 1.0e-4;
    for (float v : nonzero_finite) {
      int width;
      if (sci_mode_) {
        width = static_cast<int>(format_sci(v, precision_).size());
      } else if (int_mode_) {
        width = static_cast<int>(format_fixed(v, 0).size()) + 1;  // the "." after it
      } else {
        width = static_cast<int>(format_fixed(v, precision_).size());
      }
      max_width_ = std::max(max_width_, width);
    }
    // torch.set_printoptions(sci_mode=...) replaces the choice after the width is
    // taken (PyTorch 1.13: a fixed value keeps the scientific width it padded to).
    if (sci_mode) sci_mode_ = *sci_mode;
  }

  int width() const { return max_width_; }

  std::string format(float v) const {
    std::string s;
    if (sci_mode_) {
      s = format_sci(v, precision_);
    } else if (int_mode_) {
      s = format_fixed(v, 0);
      if (std::isfinite(v)) s += ".";
    } else {
      s = format_fixed(v, precision_);
    }
    if (static_cast<int>(s.size()) < max_width_)
      s.insert(0, static_cast<size_t>(max_width_) - s.size(), ' ');
    return s;
  }

 private:
  int precision_;
  bool int_mode_ = true;
  bool sci_mode_ = false;
  int max_width_ = 1;
};

// The printer walks the row-major values (T is float or int64_t); a
// sub-tensor is (offset, first dim).
template <class T>
class Printer {
 public:
  Printer(const Shape& shape, std::vector<T> values, const PrintOptions& options)
      : shape_(shape),
        values_(std::move(values)),
        opts_(options),
        summarize_(static_cast<int64_t>(values_.size()) > options.threshold),
        strides_(shape.size(), 1) {
    for (size_t d = shape_.size(); d-- > 1;) strides_[d - 1] = strides_[d] * shape_[d];
  }

  // get_summarized_data: the values the formatter sees.
  std::vector<T> formatter_values() const {
    if (!summarize_) return values_;
    std::vector<T> out;
    collect(0, 0, out);
    return out;
  }

  // _tensor_str_with_formatter for the sub-tensor at `offset` from dim d.
  template <class F>
  std::string str(const F& f, size_t d, int64_t offset, int indent) const {
    const Shape& s = shape_;
    if (s.empty()) return f.format(values_[0]);
    const int64_t n = s[d];
    const int64_t edge = opts_.edgeitems;
    const bool cut = summarize_ && n > 2 * edge;
    if (d + 1 == s.size()) return vector_str(f, offset, n, cut, indent);

    std::vector<std::string> slices;
    for (int64_t i = 0; i < n; ++i) {
      if (cut && i == edge) {
        slices.emplace_back("...");
        i = n - edge;
      }
      slices.push_back(str(f, d + 1, offset + i * strides_[d], indent + 1));
    }
    // "," then one newline per dim below this one, then the indent.
    std::string sep(",");
    sep.append(s.size() - d - 1, '\n');
    sep.append(static_cast<size_t>(indent) + 1, ' ');
    return bracketed(slices, sep);
  }

 private:
  void collect(size_t d, int64_t offset, std::vector<T>& out) const {
    const Shape& s = shape_;
    if (s.empty()) {
      out.push_back(values_[0]);
      return;
    }
    const int64_t n = s[d];
    const int64_t edge = opts_.edgeitems;
    for (int64_t i = 0; i < n; ++i) {
      if (n > 2 * edge && i == edge) i = n - edge;
      if (d + 1 == s.size()) {
        out.push_back(values_[static_cast<size_t>(offset + i)]);
      } else {
        collect(d + 1, offset + i * strides_[d], out);
      }
    }
  }

  // _vector_str: one row, wrapped at linewidth.
  template <class F>
  std::string vector_str(const F& f, int64_t offset, int64_t n, bool cut,
                         int indent) const {
    const int element_length = f.width() + 2;  // ", " between elements
    const int per_line =
        std::max(1, static_cast<int>(std::floor(static_cast<double>(opts_.linewidth - indent) /
                                                element_length)));
    std::vector<std::string> data;
    const int64_t edge = opts_.edgeitems;
    for (int64_t i = 0; i < n; ++i) {
      if (cut && i == edge) {
        data.emplace_back(" ...");
        i = n - edge;
      }
      data.push_back(f.format(values_[static_cast<size_t>(offset + i)]));
    }
    // Elements on one line are separated by ", ", lines by ",\n" + indent.
    std::string line_break(",\n");
    line_break.append(static_cast<size_t>(indent) + 1, ' ');
    std::string out("[");
    for (size_t i = 0; i < data.size(); ++i) {
      if (i > 0) out += i % static_cast<size_t>(per_line) == 0 ? line_break : std::string(", ");
      out += data[i];
    }
    out += ']';
    return out;
  }

  // "[" + parts joined by sep + "]".
  static std::string bracketed(const std::vector<std::string>& parts, const std::string& sep) {
    std::string out("[");
    for (size_t i = 0; i < parts.size(); ++i) {
      if (i > 0) out += sep;
      out += parts[i];
    }
    out += ']';
    return out;
  }

  const Shape& shape_;
  std::vector<T> values_;  // row-major
  const PrintOptions& opts_;
  bool summarize_;
  std::vector<int64_t> strides_;  // row-major element strides of shape_
};

// _add_suffixes: ", suffix" on the last line, or on a new line indented under
// the first "[" when it would pass linewidth.
std::string add_suffixes(std::string text, const std::vector<std::string>& suffixes, int indent,
                         int linewidth) {
  const auto newline = text.rfind('\n');
  // Python: len(s) - s.rfind("\n") + 1, where rfind gives -1 when there is none.
  int64_t last_line_len = static_cast<int64_t>(text.size()) -
                          (newline == std::string::npos ? -1 : static_cast<int64_t>(newline)) + 1;
  for (const std::string& suffix : suffixes) {
    const auto suffix_len = static_cast<int64_t>(suffix.size());
    if (last_line_len + suffix_len + 2 > linewidth) {
      text += ",\n";
      text.append(static_cast<size_t>(indent), ' ');
      text += suffix;
      last_line_len = indent + suffix_len;
    } else {
      text += ", ";
      text += suffix;
      last_line_len += suffix_len + 2;
    }
  }
  text += ')';
  return text;
}

}  // namespace

std::string to_string(const Tensor& t, const PrintOptions& options) {
  const std::string prefix = "tensor(";
  const int indent = static_cast<int>(prefix.size());
  std::vector<std::string> suffixes;
  std::string body;
  const std::string dtype_suffix = fmt::format("dtype=torch.{}", dtype_name(t.dtype()));
  if (t.numel() == 0) {
    // NumPy's habit: the shape is shown unless it is (0,).
    if (t.dim() != 1) suffixes.push_back("size=" + shape_str(t.shape()));
    if (t.dtype() != DType::kFloat32) suffixes.push_back(dtype_suffix);
    body = "[]";
  } else if (t.dtype() == DType::kInt64) {
    const Printer<int64_t> printer(t.shape(), t.to_int64_vector(), options);
    const IntFormatter formatter(printer.formatter_values());
    body = printer.str(formatter, 0, 0, indent);
  } else {
    const Printer<float> printer(t.shape(), t.to_vector(), options);  // bfloat16 as float32
    const Formatter formatter(printer.formatter_values(), options.precision, options.sci_mode);
    body = printer.str(formatter, 0, 0, indent);
    if (t.dtype() == DType::kBFloat16) suffixes.push_back(dtype_suffix);
  }
  if (!options.suffix.empty()) suffixes.push_back(options.suffix);
  return add_suffixes(prefix + body, suffixes, indent, options.linewidth);
}

std::ostream& operator<<(std::ostream& os, const Tensor& t) { return os << to_string(t); }

}  // namespace attn
