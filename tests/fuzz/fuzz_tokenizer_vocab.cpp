// libFuzzer target for the tokenizer's vocabulary reader (src/text/vocabulary.cpp:
// Hugging Face's vocab.json + merges.txt, the formats of GPT-2's encoder.json
// and vocab.bpe), built with clang -fsanitize=fuzzer,address,undefined by
// tests/fuzz/CMakeLists.txt.
//
// Input: VOCAB_JSON \0 MERGES_TXT [\0 SAMPLE]. Any input must end in one of two
// ways: a std::runtime_error (a malformed file), or a vocabulary in which
//   - every id has bytes, and every one of the 256 bytes is a token;
//   - merging SAMPLE (or a fixed text) gives the same ids by tiktoken's loop on
//     joined bytes, the loop on ids and the heap, and those ids' bytes joined
//     are SAMPLE again.
// A crash, a sanitizer report, another exception or a difference is a finding.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "fuzz_common.h"
#include "text/bpe.h"
#include "text/vocabulary.h"

namespace {

using attn::fuzz::finding;

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  const size_t first = input.find('\0');
  if (first == std::string_view::npos) return 0;
  const std::string_view vocab = input.substr(0, first);
  std::string_view merges = input.substr(first + 1);
  std::string_view sample = "hello world, it's 2024!\n\xE6\xBC\xA2\xE5\xAD\x97";
  if (const size_t second = merges.find('\0'); second != std::string_view::npos) {
    if (second + 1 < merges.size()) sample = merges.substr(second + 1);
    merges = merges.substr(0, second);
  }
  attn::text::Vocabulary v;
  try {
    v = attn::text::parse_vocabulary(vocab, merges, "vocab.json", "merges.txt");
  } catch (const std::runtime_error&) {
    return 0;  // refused: the expected outcome for almost every input
  }
  if (v.tokens.empty()) finding("an empty vocabulary was accepted");
  for (int b = 0; b < 256; ++b) {
    const int32_t id = v.byte_token[b];
    if (id < 0 || static_cast<size_t>(id) >= v.tokens.size() ||
        v.tokens[static_cast<size_t>(id)] != std::string(1, static_cast<char>(b)))
      finding("a byte has no token of its own");
  }
  // Pieces of at most 256 bytes (the merge loops are quadratic).
  for (size_t at = 0; at < sample.size(); at += 256) {
    const std::string_view piece = sample.substr(at, 256);
    std::vector<int64_t> reference, scan, heap;
    attn::text::bpe_merge_reference(v, piece, reference);
    attn::text::bpe_merge_heap(v, piece, heap);
    if (heap != reference) finding("the heap and the reference merge differ");
    if (piece.size() < attn::text::kHeapFromBytes) {
      attn::text::bpe_merge_scan(v, piece, scan);
      if (scan != reference) finding("the scan and the reference merge differ");
    }
    std::string joined;
    for (int64_t id : reference) {
      if (id < 0 || static_cast<size_t>(id) >= v.tokens.size())
        finding("a merge gave an id out of range");
      joined += v.tokens[static_cast<size_t>(id)];
    }
    if (joined != piece) finding("the tokens' bytes are not the piece");
  }
  return 0;
}
