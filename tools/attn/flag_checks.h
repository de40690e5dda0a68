// flag_checks.h - every integer flag read by flag_values.h before CLI11's own
// conversion, which would let values through changed (issue 46: a value past
// int64 became 9223372036854775807, "0x10" 16, "010" 8, an unsigned "-1"
// 2^64 - 1, and a seed of 2^64 or more was capped to 2^64 - 1).
//
// The subcommands add their options with attn::cli::add_option(cmd, ...)
// instead of cmd->add_option(...): for an integer variable (or an optional or
// a list of them) it puts whole_number() in front, which refuses what is not a
// whole number of the variable's type, naming the text as typed, and gives
// CLI11 the number in plain decimal. A flag with a narrower range says so with
// in_range(option, min, max), which replaces that check.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <limits>
#include <optional>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "flag_values.h"

namespace attn::cli {

// The name flag_checks gives its check, so that in_range finds it.
inline constexpr const char* kWholeNumberCheck = "whole number";

// The text read as a whole number in min..max and rewritten in plain decimal
// (what CLI11 then converts cannot differ from what was checked), or the
// message of flag_values.h.
template <typename T>
CLI::Validator whole_number(T min = std::numeric_limits<T>::min(),
                            T max = std::numeric_limits<T>::max()) {
  static_assert(std::is_integral_v<T>);
  return CLI::Validator(
      [min, max](std::string& s) -> std::string {
        try {
          if constexpr (std::is_signed_v<T>) {
            s = std::to_string(parse_whole_number(s, min, max));
          } else {
            s = std::to_string(parse_unsigned_number(s, min, max));
          }
        } catch (const std::invalid_argument& e) {
          return e.what();
        }
        return {};
      },
      "", kWholeNumberCheck);
}

// The integer type an option's variable holds, if any (int64_t for an
// int64_t, a std::optional<int64_t> or a std::vector<int64_t>; bool and char
// are not numbers here).
template <typename T>
struct flag_element {
  using type = T;
};
template <typename T>
struct flag_element<std::optional<T>> {
  using type = T;
};
template <typename T>
struct flag_element<std::vector<T>> {
  using type = T;
};
template <typename T>
inline constexpr bool is_whole_number_v =
    std::is_integral_v<T> && !std::is_same_v<T, bool> && !std::is_same_v<T, char>;

// cmd->add_option(name, variable, rest...), with whole_number() in front for
// an integer variable.
template <typename T, typename... Rest>
CLI::Option* add_option(CLI::App* cmd, std::string name, T& variable, Rest&&... rest) {
  CLI::Option* option = cmd->add_option(std::move(name), variable, std::forward<Rest>(rest)...);
  using E = typename flag_element<T>::type;
  if constexpr (is_whole_number_v<E>) option->transform(whole_number<E>(), kWholeNumberCheck);
  return option;
}

// The flag's own range in place of its type's, checked as the flag is parsed.
template <typename T>
CLI::Option* in_range(CLI::Option* option, T min, T max) {
  *option->get_validator(kWholeNumberCheck) = whole_number<T>(min, max);  // CLI11 throws if absent
  return option;
}

}  // namespace attn::cli
