// libFuzzer target for the tokenizer.json reader and the pipeline it builds
// (src/text/hf_tokenizer.cpp, text::HfTokenizer::from_json, encode, decode),
// built with clang -fsanitize=fuzzer,address,undefined by
// tests/fuzz/CMakeLists.txt (issue 46).
//
// Input: the text of a tokenizer.json. Reading it must end in a
// std::invalid_argument whose message holds no control byte and no byte that
// is not valid UTF-8 (outside bytes reach it only through attn::printable), or
// a tokenizer. A tokenizer then encodes a fixed set of texts (ASCII, accents
// both composed and decomposed, CJK, an emoji sequence, whitespace runs, the
// look of special tokens): each must give ids in [0, vocab_size) or a
// std::runtime_error with a clean message (PCRE2 refusing a pattern's
// backtracking); those ids must decode, with and without the specials, to
// valid UTF-8. A crash, a sanitizer report, a hang (-timeout), another
// exception or a result breaking these is a finding.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "attn/hf_tokenizer.h"
#include "attn/utf8.h"
#include "fuzz_common.h"

namespace {

using attn::fuzz::clean_message;
using attn::fuzz::finding;
using attn::fuzz::valid_utf8;

constexpr const char* kTexts[] = {
    "Hello world! It's 2026: 12345 tokens, isn't it?",
    "  leading spaces\n\n\ttabs and\r\nnewlines   ",
    "caf\xC3\xA9 cafe\xCC\x81 na\xC3\xAFve \xC3\x85ngstr\xC3\xB6m",
    "\xE6\x97\xA5\xE6\x9C\xAC\xE8\xAA\x9E\xE3\x81\xAE\xE3\x83\x86\xE3\x82\xAD\xE3\x82\xB9\xE3\x83"
    "\x88",
    "\xF0\x9F\x91\xA9\xE2\x80\x8D\xF0\x9F\x92\xBB \xF0\x9F\x99\x82",
    "<|endoftext|><s></s><bos><|im_start|>user<think>",
    "",
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  std::vector<attn::text::HfTokenizer> made;
  try {
    made.push_back(attn::text::HfTokenizer::from_json(text, "fuzz/tokenizer.json"));
  } catch (const std::invalid_argument& e) {
    if (!clean_message(e.what())) finding("a message with raw bytes");
    return 0;
  } catch (...) {
    finding("an exception other than std::invalid_argument");
  }
  const attn::text::HfTokenizer& tok = made.front();
  if (tok.vocab_size() < 0) finding("a negative vocab_size");
  if (!clean_message(tok.describe())) finding("a description with raw bytes");
  for (const char* t : kTexts) {
    for (const bool specials : {true, false}) {
      std::vector<int64_t> ids;
      try {
        ids = tok.encode(t, specials);
      } catch (const std::runtime_error& e) {
        if (!clean_message(e.what())) finding("an encode message with raw bytes");
        continue;
      } catch (...) {
        finding("encode threw other than std::runtime_error");
      }
      for (const int64_t id : ids) {
        if (id < 0 || id >= tok.vocab_size()) finding("an id outside [0, vocab_size)");
      }
      for (const bool skip : {false, true}) {
        std::string back;
        try {
          back = tok.decode(ids, skip);
        } catch (...) {
          finding("the ids encode gave do not decode");
        }
        if (!valid_utf8(back)) finding("decode gave bytes that are not UTF-8");
      }
    }
  }
  return 0;
}
