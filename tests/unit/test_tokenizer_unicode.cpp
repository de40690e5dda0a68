// The pre-tokenizer's Unicode classes against tiktoken's, for every scalar
// value 0..0x10FFFF (tests/fixtures/tokenizer/unicode_classes.json, written by
// tests/fixtures/make_tokenizer_fixtures.py from tiktoken's own regex engine).
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "text/unicode_classes.h"
#include "oracle.h"

namespace {

using attn::text::CharClass;

std::vector<uint8_t> tiktoken_classes() {
  const nlohmann::json j = attn::test::read_fixture_json("tokenizer/unicode_classes.json");
  std::vector<uint8_t> cls(0x110000, static_cast<uint8_t>(CharClass::kOther));
  const std::pair<const char*, CharClass> names[] = {
      {"L", CharClass::kLetter}, {"N", CharClass::kNumber}, {"s", CharClass::kSpace}};
  for (const auto& [name, c] : names) {
    for (const auto& range : j.at("classes").at(name)) {
      for (uint32_t cp = range[0].get<uint32_t>(); cp <= range[1].get<uint32_t>(); ++cp) {
        EXPECT_EQ(cls[cp], static_cast<uint8_t>(CharClass::kOther))
            << "U+" << std::hex << cp << " in two classes";
        cls[cp] = static_cast<uint8_t>(c);
      }
    }
  }
  return cls;
}

const char* name_of(int c) {
  static const char* const names[] = {"other", "L", "N", "s"};
  return names[c];
}

TEST(TokenizerUnicode, EveryScalarValueHasTiktokensClass) {
  const std::vector<uint8_t> expected = tiktoken_classes();
  int differences = 0;
  for (char32_t cp = 0; cp <= 0x10FFFF; ++cp) {
    if (cp >= 0xD800 && cp <= 0xDFFF) continue;
    const int got = static_cast<int>(attn::text::char_class(cp));
    if (got != expected[cp] && ++differences <= 20) {
      ADD_FAILURE() << fmt::format("U+{:04X}: attn says {}, tiktoken {} (PCRE2 alone: {})",
                                   static_cast<uint32_t>(cp), name_of(got), name_of(expected[cp]),
                                   name_of(static_cast<int>(attn::text::pcre2_char_class(cp))));
    }
  }
  EXPECT_EQ(differences, 0);
}

// Every code point where PCRE2 alone differs from tiktoken is covered by one
// of the corrections in unicode_classes.cpp, and every correction is needed
// (a PCRE2 with newer Unicode data, which needs fewer, is noticed). The
// differences are printed as ranges.
TEST(TokenizerUnicode, PcreDiffersFromTiktokenOnlyWhereCorrected) {
  const std::vector<uint8_t> expected = tiktoken_classes();
  const auto corrections = attn::text::class_corrections();
  std::vector<bool> used(corrections.size(), false);
  std::string report;
  char32_t run_first = 0;
  std::string run_desc;
  for (char32_t cp = 0; cp <= 0x110000; ++cp) {
    std::string desc;
    if (cp <= 0x10FFFF && !(cp >= 0xD800 && cp <= 0xDFFF)) {
      const int p = static_cast<int>(attn::text::pcre2_char_class(cp));
      if (p != expected[cp]) {
        desc = fmt::format("{}->{}", name_of(p), name_of(expected[cp]));
        bool covered = false;
        for (size_t k = 0; k < corrections.size(); ++k) {
          if (cp >= corrections[k].first && cp <= corrections[k].last &&
              static_cast<int>(corrections[k].cls) == expected[cp]) {
            covered = true;
            used[k] = true;
          }
        }
        EXPECT_TRUE(covered) << fmt::format("U+{:04X} ({}) has no correction",
                                            static_cast<uint32_t>(cp), desc);
      }
    }
    if (desc != run_desc) {
      if (!run_desc.empty())
        report += fmt::format("U+{:04X}..U+{:04X} {}\n", static_cast<uint32_t>(run_first),
                              static_cast<uint32_t>(cp - 1), run_desc);
      run_first = cp;
      run_desc = desc;
    }
  }
  for (size_t k = 0; k < corrections.size(); ++k) {
    EXPECT_TRUE(used[k]) << fmt::format(
        "the correction U+{:04X}..U+{:04X} is not needed by this PCRE2",
        static_cast<uint32_t>(corrections[k].first), static_cast<uint32_t>(corrections[k].last));
  }
  std::cout << "PCRE2 -> tiktoken differences:\n" << report;
}

// U+180E is the one white-space difference: PCRE2's \s has it, tiktoken's not.
TEST(TokenizerUnicode, MongolianVowelSeparatorIsNotWhiteSpace) {
  EXPECT_EQ(attn::text::pcre2_char_class(0x180E), CharClass::kSpace);
  EXPECT_EQ(attn::text::char_class(0x180E), CharClass::kOther);
  EXPECT_EQ(attn::text::char_class(0x3000), CharClass::kSpace);
  EXPECT_EQ(attn::text::char_class(0x00A0), CharClass::kSpace);
  EXPECT_EQ(attn::text::char_class(0x200B), CharClass::kOther);
  EXPECT_EQ(attn::text::char_class('a'), CharClass::kLetter);
  EXPECT_EQ(attn::text::char_class('7'), CharClass::kNumber);
}

}  // namespace
