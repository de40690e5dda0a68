// flag_checks.h - CLI11 validators for values CLI11's own parsing would let
// through changed (issue 46: a seed of 2^64 or more was capped to 2^64 - 1).
#pragma once

#include <CLI/CLI.hpp>
#include <string>

#include "attn/utf8.h"

namespace attn::cli {

// A whole number from 0 to 2^64 - 1 written in decimal digits; anything
// else (a sign, a fraction, 2^64 and more) is refused, naming the value.
inline CLI::Validator uint64_value() {
  return CLI::Validator(
      [](std::string& s) -> std::string {
        constexpr const char* kMax = "18446744073709551615";
        if (s.empty() || s.find_first_not_of("0123456789") != std::string::npos)
          return "must be a whole number from 0 to " + std::string(kMax) + ", got '" +
                 printable(s) + "'";
        const size_t first = s.find_first_not_of('0');
        const std::string digits = first == std::string::npos ? "0" : s.substr(first);
        if (digits.size() > 20 || (digits.size() == 20 && digits > kMax))
          return "must be at most " + std::string(kMax) + " (2^64 - 1), got " + printable(s);
        return {};
      },
      "UINT64", "uint64");
}

}  // namespace attn::cli
