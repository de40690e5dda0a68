// libFuzzer target for the token shards' manifest reader (src/io/token_shards.cpp,
// data::Manifest::from_json), built with clang -fsanitize=fuzzer,address,undefined
// by tests/fuzz/CMakeLists.txt.
//
// Input: the text of a manifest.json. Any input must end in one of two ways: a
// std::invalid_argument whose message holds no control byte and no byte that
// is not valid UTF-8 (outside bytes reach it only through attn::printable), or
// a manifest attn can use: the format and dtype its own, vocab_size in
// 1 .. 65536, eot_token -1 or an id, every shard a plain name in the folder
// (not empty, no '/', no NUL, not "." or "..") with a count >= 0, the counts
// summing to "tokens"; and written again by to_json it reads back equal. A
// crash, a sanitizer report (a signed overflow among them), another exception
// or a manifest breaking these is a finding.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>

#include "attn/token_shards.h"
#include "attn/utf8.h"
#include "fuzz_common.h"

namespace {

using attn::fuzz::clean_message;
using attn::fuzz::finding;

bool same(const attn::data::Manifest& a, const attn::data::Manifest& b) {
  if (a.tokenizer != b.tokenizer || a.vocab_size != b.vocab_size || a.eot_token != b.eot_token ||
      a.tokens != b.tokens || a.documents != b.documents || a.shards.size() != b.shards.size())
    return false;
  for (size_t i = 0; i < a.shards.size(); ++i) {
    const auto &x = a.shards[i], &y = b.shards[i];
    if (x.file != y.file || x.tokens != y.tokens || x.checksum != y.checksum) return false;
  }
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  attn::data::Manifest m;
  try {
    m = attn::data::Manifest::from_json(text, "fuzz/manifest.json");
  } catch (const std::invalid_argument& e) {
    if (!clean_message(e.what())) finding("a message with raw bytes");
    return 0;
  } catch (...) {
    finding("an exception other than std::invalid_argument");
  }
  if (m.vocab_size < 1 || m.vocab_size > 65536) finding("a vocab_size outside 1 .. 65536");
  if (m.eot_token < -1 || m.eot_token >= m.vocab_size)
    finding("an eot_token outside the vocabulary");
  int64_t sum = 0;
  for (const auto& s : m.shards) {
    if (s.file.empty() || s.file == "." || s.file == ".." ||
        s.file.find_first_of(std::string("/\0", 2)) != std::string::npos)
      finding("a shard name that is not a plain name in the folder");
    if (s.tokens < 0) finding("a negative shard count");
    sum += s.tokens;
  }
  if (sum != m.tokens) finding("shard counts that do not sum to \"tokens\"");
  attn::data::Manifest again;
  try {
    again = attn::data::Manifest::from_json(m.to_json(), "fuzz/again.json");
  } catch (...) {
    finding("to_json's text does not read back");
  }
  if (!same(m, again)) finding("to_json's text reads back different");
  return 0;
}
