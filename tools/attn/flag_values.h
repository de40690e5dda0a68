// flag_values.h - the text of an integer flag read as a whole number within the
// flag's range (issue 46, numbers at the edges).
//
// CLI11 2.1 reads an integer flag with strtoll(text, 0, 0) and keeps what it
// gets: a value past int64 becomes 9223372036854775807 (the error is not
// looked at), "0x10" is 16 and "010" is 8 (C's prefixes), " 5" and "+5" pass,
// and an unsigned flag takes "-1" as 2^64 - 1. attn reads every integer flag
// here first: decimal digits with a '-' before them for a negative number
// (leading zeros mean nothing), and the value within MIN..MAX. Anything else
// is refused with one message naming the text as it was typed (escaped by
// attn::printable, so no raw byte reaches the terminal) and the range:
//
//   must be a whole number in 0..1048576, got '9223372036854775808'
//
// The functions are plain (no CLI11), so tests/fuzz/fuzz_cli_values.cpp can
// reach them; flag_checks.h puts them in front of CLI11's conversion.
#pragma once

#include <cstdint>
#include <string_view>

namespace attn::cli {

// TEXT's value when TEXT is a whole number in MIN..MAX (MIN <= MAX);
// otherwise std::invalid_argument "must be a whole number in MIN..MAX, got
// 'TEXT'".
int64_t parse_whole_number(std::string_view text, int64_t min, int64_t max);

// The same for a flag whose values reach past int64 (a seed: 0..2^64 - 1).
uint64_t parse_unsigned_number(std::string_view text, uint64_t min, uint64_t max);

}  // namespace attn::cli
