// src/text/vocabulary.h - a byte-level BPE vocabulary: every token's bytes, the
// merge rank of each mergeable token, and a hash table from bytes to id.
//
// Ranks follow tiktoken's data_gym loader: a token made by merge line k
// (0-based, after the "#version" line) has rank 256 + k; the 256 single bytes
// rank below every merge. For GPT-2 every token's rank equals its id.
// A token that is neither a single byte nor a merge result is never produced by
// encode (it can still be decoded); "<|endoftext|>" is the one special token.
#pragma once

#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

namespace attn::text {

inline uint64_t hash_bytes(std::string_view s) {
  // 8 bytes at a time, multiply-xorshift mixing; good enough for a table
  // that compares the bytes on every hit.
  uint64_t h = 0x9E3779B97F4A7C15ull ^ (s.size() * 0xff51afd7ed558ccdull);
  const char* p = s.data();
  size_t n = s.size();
  while (n >= 8) {
    uint64_t w;
    std::memcpy(&w, p, 8);
    h = (h ^ w) * 0xc4ceb9fe1a85ec53ull;
    h ^= h >> 29;
    p += 8;
    n -= 8;
  }
  uint64_t w = 0;
  std::memcpy(&w, p, n);
  h = (h ^ w) * 0xc4ceb9fe1a85ec53ull;
  h ^= h >> 32;
  return h;
}

constexpr uint32_t kNoRank = std::numeric_limits<uint32_t>::max();

// A pair of adjacent mergeable tokens (left, right) whose joined bytes are a
// mergeable token: that token's id and rank.
struct PairSlot {
  uint64_t key = kNoPair;  // left << 32 | right
  uint32_t rank = kNoRank;
  int32_t id = -1;
  static constexpr uint64_t kNoPair = ~uint64_t{0};
};

struct Vocabulary {
  std::vector<std::string> tokens;  // id -> bytes
  std::vector<uint32_t> rank;       // id -> merge rank; kNoRank: never produced by encode
  std::vector<int32_t> slots;       // open addressing over mergeable ids; -1 empty
  uint64_t mask = 0;                // slots.size() - 1
  int32_t byte_token[256] = {};     // the id of each single byte
  int64_t eot = -1;                 // "<|endoftext|>", or -1
  // Every split of every mergeable token into two mergeable tokens, so that
  // the rank of two adjacent parts joined is one probe by their ids (the same
  // answer as rank_of(their joined bytes), since parts are always mergeable).
  std::vector<PairSlot> pairs;  // open addressing; key kNoPair: empty
  uint64_t pair_mask = 0;

  static uint64_t pair_key(int32_t left, int32_t right) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) |
           static_cast<uint32_t>(right);
  }
  static uint64_t pair_hash(uint64_t key) {
    key ^= key >> 29;  // both ids reach the high bits of the product
    return (key * 0x9E3779B97F4A7C15ull) >> 40;
  }
  // The join of two adjacent parts, or nullptr when their bytes are no token.
  const PairSlot* find_pair(int32_t left, int32_t right) const {
    const uint64_t key = pair_key(left, right);
    for (uint64_t i = pair_hash(key) & pair_mask;; i = (i + 1) & pair_mask) {
      const PairSlot& p = pairs[i];
      if (p.key == key) return &p;
      if (p.key == PairSlot::kNoPair) return nullptr;
    }
  }

  // The id of a mergeable token with these bytes, or -1.
  int32_t find(std::string_view bytes, uint64_t hash) const {
    for (uint64_t i = hash & mask;; i = (i + 1) & mask) {
      const int32_t id = slots[i];
      if (id < 0) return -1;
      const std::string& t = tokens[static_cast<size_t>(id)];
      if (t.size() == bytes.size() && std::memcmp(t.data(), bytes.data(), t.size()) == 0) return id;
    }
  }
  int32_t find(std::string_view bytes) const { return find(bytes, hash_bytes(bytes)); }
  // The merge rank of these bytes as one token, or kNoRank.
  uint32_t rank_of(std::string_view bytes) const {
    const int32_t id = find(bytes);
    return id < 0 ? kNoRank : rank[static_cast<size_t>(id)];
  }
};

// Builds a vocabulary from the text of vocab.json and merges.txt; the names
// are for messages. Throws std::runtime_error naming the file and the key or
// line (through attn::printable) for anything malformed.
Vocabulary parse_vocabulary(std::string_view vocab_json, std::string_view merges_txt,
                            const std::string& vocab_name, const std::string& merges_name);

// GPT-2's vocabulary, the one Tokenizer::gpt2() uses (built on first use).
const Vocabulary& gpt2_vocabulary();

// GPT-2's byte-to-unicode map (a space is "Ġ" U+0120): the printable bytes
// '!'..'~', '¡'..'¬', '®'..'ÿ' stand for themselves, the other 68 for
// U+0100 onward in byte order.
char32_t byte_to_unicode(unsigned char b);
// A token's bytes in that form, as UTF-8 ("Ġworld").
std::string token_to_unicode_form(std::string_view bytes);

}  // namespace attn::text
