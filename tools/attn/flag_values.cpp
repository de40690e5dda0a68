// The text of an integer flag read as a whole number within its range
// (flag_values.h).
#include "flag_values.h"

#include <fmt/format.h>

#include <stdexcept>
#include <string>

#include "attn/utf8.h"

namespace attn::cli {

namespace {

// TEXT as a sign and a magnitude: '-'? digits, nothing else. The magnitude
// saturates at 2^64 - 1 (too_large set): such a text is beyond every range.
struct Decimal {
  bool negative = false;
  bool too_large = false;
  uint64_t magnitude = 0;
};

bool read_decimal(std::string_view text, Decimal& d) {
  if (!text.empty() && text.front() == '-') {
    d.negative = true;
    text.remove_prefix(1);
  }
  if (text.empty()) return false;
  for (const char c : text) {
    if (c < '0' || c > '9') return false;
    const auto digit = static_cast<uint64_t>(c - '0');
    if (d.magnitude > (UINT64_MAX - digit) / 10) {
      d.too_large = true;
    } else if (!d.too_large) {
      d.magnitude = d.magnitude * 10 + digit;
    }
  }
  return true;
}

template <typename T>
[[noreturn]] void refuse(std::string_view text, T min, T max) {
  throw std::invalid_argument(
      fmt::format("must be a whole number in {}..{}, got '{}'", min, max, printable(text, 64)));
}

}  // namespace

int64_t parse_whole_number(std::string_view text, int64_t min, int64_t max) {
  Decimal d;
  if (!read_decimal(text, d) || d.too_large) refuse(text, min, max);
  // int64's range: magnitudes up to 2^63 - 1, and 2^63 for a negative number.
  constexpr uint64_t kLimit = uint64_t{1} << 63;
  if (d.magnitude > (d.negative ? kLimit : kLimit - 1)) refuse(text, min, max);
  const int64_t v = d.negative ? static_cast<int64_t>(0 - d.magnitude)  // two's complement
                               : static_cast<int64_t>(d.magnitude);
  if (v < min || v > max) refuse(text, min, max);
  return v;
}

uint64_t parse_unsigned_number(std::string_view text, uint64_t min, uint64_t max) {
  Decimal d;
  if (!read_decimal(text, d) || d.too_large) refuse(text, min, max);
  // "-0" is 0; any other negative number is below every unsigned range.
  if (d.negative && d.magnitude != 0) refuse(text, min, max);
  if (d.magnitude < min || d.magnitude > max) refuse(text, min, max);
  return d.magnitude;
}

}  // namespace attn::cli
