// Reading a BPE vocabulary (vocabulary.h).
#include "text/vocabulary.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <bit>
#include <limits>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "attn/utf8.h"

namespace attn::text {

namespace {

struct ByteMaps {
  std::array<char32_t, 256> to_unicode{};
  std::array<int, 512> to_byte{};  // code point -> byte, -1 if none (all are < 0x144)
  ByteMaps() {
    to_byte.fill(-1);
    char32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
      to_unicode[static_cast<size_t>(b)] = printable ? static_cast<char32_t>(b) : next++;
      to_byte[to_unicode[static_cast<size_t>(b)]] = b;
    }
  }
};

const ByteMaps& byte_maps() {
  static const ByteMaps maps;
  return maps;
}

// A vocabulary string in byte-to-unicode form -> its bytes; false if it is not
// valid UTF-8 or holds a character outside the map.
bool unicode_form_to_bytes(std::string_view s, std::string& out) {
  out.clear();
  std::vector<char32_t> cps;
  try {
    cps = decode_utf8(s);
  } catch (const std::invalid_argument&) {
    return false;
  }
  for (char32_t cp : cps) {
    if (cp >= 512 || byte_maps().to_byte[cp] < 0) return false;
    out += static_cast<char>(byte_maps().to_byte[cp]);
  }
  return true;
}

size_t line_of(std::string_view text, size_t offset) {
  offset = std::min(offset, text.size());
  return 1 + static_cast<size_t>(
                 std::count(text.begin(), text.begin() + static_cast<ptrdiff_t>(offset), '\n'));
}

// vocab.json read as a stream of JSON events (no DOM: a std::map of 50,257
// keys was most of the start-up time): the top value's type, and for an
// object each key with its id, or the type of a value that is not an integer.
struct VocabJson : nlohmann::json_sax<nlohmann::json> {
  struct Entry {
    std::string key;
    int64_t id = -1;
    const char* type = nullptr;  // null: an integer id
  };
  std::string top;  // "object", "array", "string", ...
  std::vector<Entry> entries;
  std::string error;
  size_t error_byte = 0;
  int depth = 0;
  std::string key_now;

  bool value(const char* type) {
    if (depth == 0) top = type;
    if (depth == 1) entries.push_back({key_now, -1, type});
    return true;
  }
  bool null() override { return value("null"); }
  bool boolean(bool) override { return value("boolean"); }
  bool number_integer(number_integer_t x) override {
    if (depth == 1) {
      entries.push_back({key_now, x, nullptr});
      return true;
    }
    return value("number");
  }
  bool number_unsigned(number_unsigned_t x) override {
    if (depth == 1 && x <= static_cast<number_unsigned_t>(kMaxId)) {
      entries.push_back({key_now, static_cast<int64_t>(x), nullptr});
      return true;
    }
    if (depth == 1) {
      entries.push_back({key_now, kMaxId, nullptr});  // out of range either way
      return true;
    }
    return value("number");
  }
  bool number_float(number_float_t, const string_t&) override { return value("number"); }
  bool string(string_t&) override { return value("string"); }
  bool binary(binary_t&) override { return value("binary"); }
  bool start_object(std::size_t) override {
    value("object");
    ++depth;
    return true;
  }
  bool key(string_t& k) override {
    if (depth == 1) key_now = k;
    return true;
  }
  bool end_object() override {
    --depth;
    return true;
  }
  bool start_array(std::size_t) override {
    value("array");
    ++depth;
    return true;
  }
  bool end_array() override {
    --depth;
    return true;
  }
  bool parse_error(std::size_t position, const std::string&,
                   const nlohmann::detail::exception& e) override {
    error_byte = position;
    error = e.what();
    return false;
  }
  static constexpr int64_t kMaxId = std::numeric_limits<int64_t>::max();
};

constexpr int64_t kMaxVocabulary = int64_t{1} << 24;
const std::string kEndOfText = "<|endoftext|>";

}  // namespace

char32_t byte_to_unicode(unsigned char b) { return byte_maps().to_unicode[b]; }

std::string token_to_unicode_form(std::string_view bytes) {
  std::string s;
  for (char c : bytes) s += encode_utf8(byte_to_unicode(static_cast<unsigned char>(c)));
  return s;
}

Vocabulary parse_vocabulary(std::string_view vocab_json, std::string_view merges_txt,
                            const std::string& vocab_name, const std::string& merges_name) {
  const std::string vname = printable(vocab_name), mname = printable(merges_name);
  // ---- vocab.json: {"token": id, ...} with ids 0..N-1, each once.
  VocabJson j;
  if (!nlohmann::json::sax_parse(vocab_json.begin(), vocab_json.end(), &j))
    throw std::runtime_error(fmt::format(
        "vocabulary file '{}': line {}: not valid JSON ({})", vname,
        line_of(vocab_json, j.error_byte == 0 ? 0 : j.error_byte - 1), printable(j.error)));
  if (j.top != "object")
    throw std::runtime_error(fmt::format(
        "vocabulary file '{}': expected a JSON object of token -> id, got {}", vname, j.top));
  if (j.entries.empty())
    throw std::runtime_error(fmt::format("vocabulary file '{}': no tokens", vname));
  if (static_cast<int64_t>(j.entries.size()) > kMaxVocabulary)
    throw std::runtime_error(fmt::format("vocabulary file '{}': {} tokens, more than the limit {}",
                                         vname, j.entries.size(), kMaxVocabulary));
  const size_t n = j.entries.size();
  Vocabulary v;
  v.tokens.assign(n, std::string());
  std::vector<std::string> keys(n);
  std::vector<bool> seen(n, false);
  std::string bytes;
  for (const VocabJson::Entry& e : j.entries) {
    const std::string& key = e.key;
    if (e.type != nullptr)
      throw std::runtime_error(
          fmt::format("vocabulary file '{}': key '{}': the id must be an integer, got {}", vname,
                      printable(key), e.type));
    const int64_t id = e.id;
    if (id < 0 || id >= static_cast<int64_t>(n))
      throw std::runtime_error(
          fmt::format("vocabulary file '{}': key '{}': id {} is outside 0..{} (the ids must be "
                      "0..N-1 for N = {} tokens)",
                      vname, printable(key), id, n - 1, n));
    const auto i = static_cast<size_t>(id);
    if (seen[i])
      throw std::runtime_error(
          fmt::format("vocabulary file '{}': keys '{}' and '{}' both have id {}", vname,
                      printable(keys[i]), printable(key), id));
    seen[i] = true;
    keys[i] = key;
    if (key == kEndOfText) {
      v.tokens[i] = key;
      v.eot = id;
    } else if (unicode_form_to_bytes(key, bytes) && !bytes.empty()) {
      v.tokens[i] = bytes;
    } else {
      throw std::runtime_error(fmt::format(
          "vocabulary file '{}': key '{}' is not a token in GPT-2's byte-to-unicode form", vname,
          printable(key)));
    }
  }
  // Every id is seen once: n distinct ids in 0..n-1.

  // ---- the mergeable tokens: the 256 bytes, then one per merge line.
  v.rank.assign(n, kNoRank);
  v.slots.assign(std::bit_ceil(2 * n + 2), -1);
  v.mask = v.slots.size() - 1;
  auto insert = [&v](int32_t id) {
    const std::string& t = v.tokens[static_cast<size_t>(id)];
    uint64_t i = hash_bytes(t) & v.mask;
    while (v.slots[i] >= 0) i = (i + 1) & v.mask;
    v.slots[i] = id;
  };
  // Index of every token by its bytes (the special token too, kept apart below).
  std::vector<int32_t> by_bytes_slots(v.slots.size(), -1);
  auto find_any = [&](std::string_view b) -> int32_t {
    for (uint64_t i = hash_bytes(b) & v.mask;; i = (i + 1) & v.mask) {
      const int32_t id = by_bytes_slots[i];
      if (id < 0) return -1;
      if (v.tokens[static_cast<size_t>(id)] == b && id != v.eot) return id;
    }
  };
  for (size_t id = 0; id < n; ++id) {
    if (static_cast<int64_t>(id) == v.eot) continue;
    const std::string& t = v.tokens[id];
    if (find_any(t) >= 0)
      throw std::runtime_error(
          fmt::format("vocabulary file '{}': keys '{}' and '{}' are the same bytes", vname,
                      printable(keys[static_cast<size_t>(find_any(t))]), printable(keys[id])));
    uint64_t i = hash_bytes(t) & v.mask;
    while (by_bytes_slots[i] >= 0) i = (i + 1) & v.mask;
    by_bytes_slots[i] = static_cast<int32_t>(id);
  }
  for (int b = 0; b < 256; ++b) {
    const std::string one(1, static_cast<char>(b));
    const int32_t id = find_any(one);
    if (id < 0)
      throw std::runtime_error(
          fmt::format("vocabulary file '{}': no token for the byte 0x{:02X} (key '{}')", vname, b,
                      printable(token_to_unicode_form(one))));
    v.byte_token[b] = id;
    v.rank[static_cast<size_t>(id)] = 0;  // single bytes are never looked up by rank
    insert(id);
  }

  // ---- merges.txt: "A B" per line, in rank order.
  size_t line_no = 0, pos = 0;
  uint32_t next_rank = 256;
  std::string left, right;
  while (pos < merges_txt.size()) {
    size_t end = merges_txt.find('\n', pos);
    if (end == std::string_view::npos) end = merges_txt.size();
    std::string_view line = merges_txt.substr(pos, end - pos);
    pos = end + 1;
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line_no == 1 && line.starts_with("#version")) continue;
    if (line.empty()) continue;
    const size_t space = line.find(' ');
    auto bad = [&](const std::string& why) {
      return std::runtime_error(fmt::format("merges file '{}': line {} ('{}'): {}", mname, line_no,
                                            printable(line, 80), why));
    };
    if (space == std::string_view::npos || space == 0 || space + 1 == line.size() ||
        line.find(' ', space + 1) != std::string_view::npos)
      throw bad("expected two tokens separated by one space");
    if (!unicode_form_to_bytes(line.substr(0, space), left) ||
        !unicode_form_to_bytes(line.substr(space + 1), right))
      throw bad("a token is not in GPT-2's byte-to-unicode form");
    for (const std::string* part : {&left, &right}) {
      const int32_t id = v.find(*part);
      if (id < 0)
        throw bad(fmt::format("'{}' is not a token made by an earlier line or a single byte",
                              printable(token_to_unicode_form(*part))));
    }
    const std::string joined = left + right;
    const int32_t id = find_any(joined);
    if (id < 0)
      throw bad(fmt::format("the merged token '{}' is not in the vocabulary file '{}'",
                            printable(token_to_unicode_form(joined)), vname));
    if (v.rank[static_cast<size_t>(id)] != kNoRank)
      throw bad(fmt::format("the merged token '{}' was already made by an earlier line",
                            printable(token_to_unicode_form(joined))));
    v.rank[static_cast<size_t>(id)] = next_rank++;
    insert(id);
  }

  // ---- the pair table: each way to split a mergeable token into two.
  std::vector<PairSlot> found;
  for (size_t id = 0; id < n; ++id) {
    const std::string& t = v.tokens[id];
    if (v.rank[id] == kNoRank || t.size() < 2) continue;
    for (size_t cut = 1; cut < t.size(); ++cut) {
      const int32_t head = v.find(std::string_view(t).substr(0, cut));
      const int32_t tail = head < 0 ? -1 : v.find(std::string_view(t).substr(cut));
      if (tail >= 0)
        found.push_back({Vocabulary::pair_key(head, tail), v.rank[id], static_cast<int32_t>(id)});
    }
  }
  v.pairs.assign(std::bit_ceil(2 * found.size() + 2), PairSlot{});
  v.pair_mask = v.pairs.size() - 1;
  for (const PairSlot& p : found) {
    uint64_t i = Vocabulary::pair_hash(p.key) & v.pair_mask;
    while (v.pairs[i].key != PairSlot::kNoPair) i = (i + 1) & v.pair_mask;
    v.pairs[i] = p;
  }
  return v;
}

}  // namespace attn::text
