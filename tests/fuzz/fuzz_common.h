// What every fuzz target shares: how a finding is reported, and what a clean
// error message is (no control characters, valid UTF-8: attn::printable's
// promise for bytes from the input).
#pragma once

#include <cerrno>  // program_invocation_short_name (glibc): the target's name
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>

#include "attn/utf8.h"

namespace attn::fuzz {

// Reports a finding on stderr ("fuzz_jinja: WHAT") and aborts, which libFuzzer
// records as a crash with its input.
[[noreturn]] inline void finding(const char* what) {
  std::fprintf(stderr, "%s: %s\n", program_invocation_short_name, what);
  std::abort();
}

// True when s is valid UTF-8.
inline bool valid_utf8(const std::string& s) {
  try {
    attn::decode_utf8(s);
  } catch (const std::invalid_argument&) {
    return false;
  }
  return true;
}

// True when m is valid UTF-8 without C0 or C1 control characters.
inline bool clean_message(const std::string& m) {
  try {
    for (const char32_t cp : attn::decode_utf8(m)) {
      if (cp < 0x20 || cp == 0x7F || (cp >= 0x80 && cp <= 0x9F)) return false;
    }
  } catch (const std::invalid_argument&) {
    return false;
  }
  return true;
}

}  // namespace attn::fuzz
