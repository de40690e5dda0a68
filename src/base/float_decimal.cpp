// A float as its shortest round-trip decimal (attn/float_decimal.h).
#include "attn/float_decimal.h"

#include <fmt/format.h>

#include <cmath>
#include <cstdlib>

namespace attn {

double shortest_decimal(float f) {
  if (!std::isfinite(f)) return static_cast<double>(f);
  return std::strtod(fmt::format("{}", f).c_str(), nullptr);  // fmt's shortest round trip
}

}  // namespace attn
