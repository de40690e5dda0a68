// libFuzzer target for a token shard's reader (src/io/token_shards.cpp,
// data::TokenShard: the 64-byte header, the file's size against the count,
// verify() and read()), built with clang -fsanitize=fuzzer,address,undefined
// by tests/fuzz/CMakeLists.txt.
//
// Input: the bytes of a shard file, written to a file of this process's own
// and opened twice, without and with verify. The target judges each input
// by attn/token_shards.h's layout on its own (magic "ATTNTOK1", version 1, 2
// bytes a token, vocab_size in 1 .. 65536, reserved bytes zero, 2 x count
// bytes of tokens after the header; verify: the FNV-1a 64 of the token bytes
// equals the header's and every token is < vocab_size). A finding is a crash,
// a sanitizer report, another exception than std::invalid_argument, a message
// with raw bytes, a shard opened that the layout refuses or refused that it
// allows, a header read differently from the bytes, or a read() returning a
// token outside the vocabulary.
#include <unistd.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "attn/token_shards.h"
#include "fuzz_common.h"

namespace {

using attn::fuzz::clean_message;
using attn::fuzz::finding;

uint64_t le(const uint8_t* p, int bytes) {
  uint64_t v = 0;
  for (int i = bytes - 1; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

// The layout's verdict, without attn's reader.
struct Expected {
  bool header_ok = false, verify_ok = false;
  uint64_t vocab = 0, count = 0, checksum = 0;
};

Expected judge(const uint8_t* data, size_t size) {
  Expected e;
  if (size < 64 || std::memcmp(data, "ATTNTOK1", 8) != 0 || le(data + 8, 4) != 1 ||
      le(data + 12, 4) != 2)
    return e;
  e.vocab = le(data + 16, 8), e.count = le(data + 24, 8), e.checksum = le(data + 32, 8);
  if (e.vocab < 1 || e.vocab > 65536) return e;
  for (size_t i = 40; i < 64; ++i)
    if (data[i] != 0) return e;
  if ((size - 64) % 2 != 0 || (size - 64) / 2 != e.count) return e;
  e.header_ok = true;
  uint64_t h = 0xcbf29ce484222325ULL;  // FNV-1a 64
  for (size_t i = 64; i < size; ++i) h = (h ^ data[i]) * 0x100000001b3ULL;
  bool in_vocab = true;
  for (size_t i = 64; i + 1 < size; i += 2) in_vocab = in_vocab && le(data + i, 2) < e.vocab;
  e.verify_ok = h == e.checksum && in_vocab;
  return e;
}

const std::string& shard_path() {
  static const std::string path = "/tmp/fuzz_token_shard." + std::to_string(::getpid()) + ".tok";
  return path;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  {
    std::ofstream f(shard_path(), std::ios::binary | std::ios::trunc);
    f.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
    if (!f) finding("could not write the shard file");
  }
  const Expected e = judge(data, size);
  for (const bool verify : {false, true}) {
    const bool ok = verify ? e.header_ok && e.verify_ok : e.header_ok;
    try {
      const attn::data::TokenShard shard(shard_path(), verify);
      if (!ok)
        finding(verify ? "a shard the layout refuses opened with verify"
                       : "a shard the layout refuses opened");
      const auto& h = shard.header();
      if (static_cast<uint64_t>(h.vocab_size) != e.vocab ||
          static_cast<uint64_t>(h.tokens) != e.count || h.checksum != e.checksum ||
          shard.size() != h.tokens)
        finding("a header read differently from its bytes");
      // Every token through read(), in windows of up to 4096.
      std::vector<int64_t> window(4096);
      for (int64_t pos = 0; pos < shard.size(); pos += 4096) {
        const int64_t n = std::min<int64_t>(4096, shard.size() - pos);
        try {
          shard.read(pos, n, window.data());
          for (int64_t i = 0; i < n; ++i)
            if (window[i] < 0 || window[i] >= h.vocab_size)
              finding("read() returned a token outside the vocabulary");
        } catch (const std::invalid_argument& x) {
          if (e.verify_ok && verify) finding("read() refused a verified shard");
          if (!clean_message(x.what())) finding("a message with raw bytes");
        }
      }
    } catch (const std::invalid_argument& x) {
      if (ok) finding("a shard the layout allows refused");
      if (!clean_message(x.what())) finding("a message with raw bytes");
    } catch (...) {
      finding("an exception other than std::invalid_argument");
    }
  }
  return 0;
}
