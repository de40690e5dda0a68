// Token shards (attn/token_shards.h): the format, the memory-mapped reader and
// the dataset folder.
#include "attn/token_shards.h"

#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>

#include "attn/atomic_file.h"
#include "attn/fnv1a.h"
#include "attn/utf8.h"

static_assert(std::endian::native == std::endian::little, "token shards are little-endian");

namespace attn::data {

namespace {

void put_u32(unsigned char* p, uint32_t v) { std::memcpy(p, &v, 4); }
void put_u64(unsigned char* p, uint64_t v) { std::memcpy(p, &v, 8); }
uint32_t get_u32(const unsigned char* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}
uint64_t get_u64(const unsigned char* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}

void check_range(int64_t pos, int64_t n, int64_t size, const char* what) {
  if (pos < 0 || n < 0 || pos > size || n > size - pos)
    throw std::out_of_range(
        fmt::format("{}: tokens [{}, {}) are outside [0, {})", what, pos, pos + n, size));
}

std::string hex_bytes(const unsigned char* p, size_t n) {
  std::string s;
  for (size_t i = 0; i < n; ++i) s += fmt::format("{:02x}", p[i]);
  return s;
}

}  // namespace

// ---- sources ----------------------------------------------------------------------

void TokenVector::read(int64_t pos, int64_t n, int64_t* out) const {
  check_range(pos, n, size(), "TokenVector::read");
  std::copy_n(tokens_.begin() + pos, n, out);
}

namespace {

class Slice final : public TokenSource {
 public:
  Slice(std::shared_ptr<const TokenSource> source, int64_t begin, int64_t end)
      : source_(std::move(source)), begin_(begin), end_(end) {}
  int64_t size() const override { return end_ - begin_; }
  void read(int64_t pos, int64_t n, int64_t* out) const override {
    check_range(pos, n, size(), "slice read");
    source_->read(begin_ + pos, n, out);
  }

 private:
  std::shared_ptr<const TokenSource> source_;
  int64_t begin_, end_;
};

}  // namespace

std::shared_ptr<const TokenSource> slice(std::shared_ptr<const TokenSource> source, int64_t begin,
                                         int64_t end) {
  if (!source) throw std::invalid_argument("slice: no source");
  if (begin < 0 || begin > end || end > source->size())
    throw std::out_of_range(
        fmt::format("slice [{}, {}) of a source of {} tokens", begin, end, source->size()));
  return std::make_shared<Slice>(std::move(source), begin, end);
}

// ---- one shard ----------------------------------------------------------------------

uint64_t write_token_shard(const std::string& path, std::span<const uint16_t> tokens,
                           int64_t vocab_size) {
  if (vocab_size < 1 || vocab_size > 65536)
    throw std::invalid_argument(fmt::format(
        "token shard '{}': vocab_size {} does not fit uint16 tokens (1 .. 65536)", printable(path),
        vocab_size));
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] >= vocab_size)
      throw std::invalid_argument(fmt::format("token shard '{}': token {} at position {} is >= vocab_size {}",
                                              printable(path), tokens[i], i, vocab_size));
  }
  const uint64_t checksum = fnv1a64(tokens.data(), tokens.size_bytes());
  unsigned char header[kShardHeaderBytes] = {};
  std::memcpy(header, kShardMagic, 8);
  put_u32(header + 8, kShardVersion);
  put_u32(header + 12, 2);
  put_u64(header + 16, static_cast<uint64_t>(vocab_size));
  put_u64(header + 24, tokens.size());
  put_u64(header + 32, checksum);
  io::write_file_atomically(path, [&](const io::ByteSink& sink) {
    sink(header, sizeof header);
    if (!tokens.empty()) sink(tokens.data(), tokens.size_bytes());
  });
  return checksum;
}

TokenShard::TokenShard(const std::string& path, bool verify_now)
    : path_(path), map_(path, fmt::format("token shard '{}'", printable(path))) {
  const std::string name = printable(path);
  const auto file_bytes = static_cast<uint64_t>(map_.size());
  if (file_bytes < kShardHeaderBytes)
    throw std::invalid_argument(fmt::format(
        "token shard '{}' is truncated: {} bytes, the header alone is {}", name, file_bytes, kShardHeaderBytes));
  const auto* h = reinterpret_cast<const unsigned char*>(map_.data());
  if (std::memcmp(h, kShardMagic, 8) != 0)
    throw std::invalid_argument(fmt::format(
        "token shard '{}' is not an attn token shard: magic {} (hex), expected {} (\"ATTNTOK1\")", name,
        hex_bytes(h, 8), hex_bytes(reinterpret_cast<const unsigned char*>(kShardMagic), 8)));
  header_.version = get_u32(h + 8);
  header_.token_bytes = get_u32(h + 12);
  const uint64_t vocab = get_u64(h + 16), count = get_u64(h + 24);
  header_.checksum = get_u64(h + 32);
  if (header_.version != kShardVersion)
    throw std::invalid_argument(fmt::format("token shard '{}': format version {}, this attn reads version {}",
                                            name, header_.version, kShardVersion));
  if (header_.token_bytes != 2)
    throw std::invalid_argument(fmt::format(
        "token shard '{}': {} bytes per token, this attn reads 2 (uint16)", name, header_.token_bytes));
  if (vocab < 1 || vocab > 65536)
    throw std::invalid_argument(
        fmt::format("token shard '{}': vocab_size {} is outside 1 .. 65536", name, vocab));
  for (size_t i = 40; i < kShardHeaderBytes; ++i) {
    if (h[i] != 0)
      throw std::invalid_argument(fmt::format(
          "token shard '{}': reserved header byte {} is 0x{:02x}, not zero", name, i, h[i]));
  }
  const uint64_t payload = file_bytes - kShardHeaderBytes;
  if (count > payload / 2 || payload != 2 * count)
    throw std::invalid_argument(fmt::format(
        "token shard '{}': the header counts {} tokens ({} bytes) but the file holds {} bytes of tokens{}",
        name, count, count > (UINT64_MAX / 2) ? UINT64_MAX : 2 * count, payload,
        payload < 2 * count ? " (truncated)" : ""));
  header_.vocab_size = static_cast<int64_t>(vocab);
  header_.tokens = static_cast<int64_t>(count);
  tokens_ = reinterpret_cast<const uint16_t*>(h + kShardHeaderBytes);
  if (verify_now) verify();
  map_.advise_random();
}

void TokenShard::verify() const {
  const uint64_t sum = fnv1a64(tokens_, static_cast<size_t>(header_.tokens) * 2);
  if (sum != header_.checksum)
    throw std::invalid_argument(fmt::format(
        "token shard '{}': checksum mismatch: the header says {:016x}, the tokens hash to {:016x}",
        printable(path_), header_.checksum, sum));
  for (int64_t i = 0; i < header_.tokens; ++i) {
    if (tokens_[i] >= header_.vocab_size)
      throw std::invalid_argument(fmt::format("token shard '{}': token {} at position {} is >= vocab_size {}",
                                              printable(path_), tokens_[i], i, header_.vocab_size));
  }
}

void TokenShard::read(int64_t pos, int64_t n, int64_t* out) const {
  check_range(pos, n, header_.tokens, "TokenShard::read");
  for (int64_t i = 0; i < n; ++i) {
    const uint16_t t = tokens_[pos + i];
    if (t >= header_.vocab_size)
      throw std::invalid_argument(fmt::format("token shard '{}': token {} at position {} is >= vocab_size {}",
                                              printable(path_), t, pos + i, header_.vocab_size));
    out[i] = t;
  }
}

// ---- the manifest ---------------------------------------------------------------------

std::string Manifest::to_json() const {
  nlohmann::ordered_json j;
  j["format"] = kManifestFormat;
  j["tokenizer"] = tokenizer;
  j["vocab_size"] = vocab_size;
  j["eot_token"] = eot_token;
  j["dtype"] = "uint16";
  j["tokens"] = tokens;
  j["documents"] = documents;
  j["shards"] = nlohmann::ordered_json::array();
  for (const ShardEntry& s : shards) {
    nlohmann::ordered_json e;
    e["file"] = s.file;
    e["tokens"] = s.tokens;
    e["checksum"] = fmt::format("{:016x}", s.checksum);  // hex: JSON numbers are doubles to many readers
    j["shards"].push_back(e);
  }
  return j.dump(1) + "\n";
}

namespace {

// An integer of the manifest: a JSON integer within int64 (a float such as
// 9.2e25 converted to int64 is undefined behaviour, found by fuzz_token_manifest).
int64_t manifest_int(const nlohmann::json& v, const char* key, const std::string& name) {
  if (!v.is_number_integer() ||
      (v.is_number_unsigned() &&
       v.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())))
    throw std::invalid_argument(fmt::format("manifest '{}': \"{}\" must be an integer, got {}",
                                            name, key, printable(v.dump(), 64)));
  return v.get<int64_t>();
}

}  // namespace

Manifest Manifest::from_json(const std::string& text, const std::string& where) {
  const std::string name = printable(where);
  Manifest m;
  try {
    const auto j = nlohmann::json::parse(text);
    const auto format = j.at("format").get<std::string>();
    if (format != kManifestFormat)
      throw std::invalid_argument(fmt::format("manifest '{}': format \"{}\", this attn reads \"{}\"", name,
                                              printable(format, 64), kManifestFormat));
    m.tokenizer = j.at("tokenizer").get<std::string>();
    m.vocab_size = manifest_int(j.at("vocab_size"), "vocab_size", name);
    m.eot_token = manifest_int(j.at("eot_token"), "eot_token", name);
    m.tokens = manifest_int(j.at("tokens"), "tokens", name);
    m.documents = manifest_int(j.at("documents"), "documents", name);
    if (j.at("dtype").get<std::string>() != "uint16")
      throw std::invalid_argument(fmt::format("manifest '{}': dtype \"{}\", expected \"uint16\"", name,
                                              printable(j.at("dtype").get<std::string>(), 64)));
    int64_t sum = 0;
    for (const auto& e : j.at("shards")) {
      ShardEntry s;
      s.file = e.at("file").get<std::string>();
      s.tokens = manifest_int(e.at("tokens"), "tokens", name);
      const auto hex = e.at("checksum").get<std::string>();
      size_t used = 0;
      try {
        s.checksum = std::stoull(hex, &used, 16);
      } catch (const std::exception&) {
        used = 0;
      }
      if (hex.size() != 16 || used != 16)
        throw std::invalid_argument(fmt::format("manifest '{}': shard checksum \"{}\" is not 16 hex digits",
                                                name, printable(hex, 64)));
      // A NUL would cut the name the system call sees: "a\0/../../x" is "a".
      if (s.file.empty() || s.file.find('/') != std::string::npos ||
          s.file.find('\0') != std::string::npos || s.file == "." || s.file == "..")
        throw std::invalid_argument(fmt::format(
            "manifest '{}': shard file \"{}\" is not a name in the manifest's folder", name, printable(s.file, 64)));
      if (s.tokens < 0)
        throw std::invalid_argument(fmt::format("manifest '{}': shard '{}' has {} tokens", name,
                                                printable(s.file, 64), s.tokens));
      if (s.tokens > std::numeric_limits<int64_t>::max() - sum)
        throw std::invalid_argument(
            fmt::format("manifest '{}': its shards hold more tokens than int64 can count", name));
      sum += s.tokens;
      m.shards.push_back(std::move(s));
    }
    if (m.vocab_size < 1 || m.vocab_size > 65536)
      throw std::invalid_argument(
          fmt::format("manifest '{}': vocab_size {} is outside 1 .. 65536", name, m.vocab_size));
    if (m.eot_token < -1 || m.eot_token >= m.vocab_size)
      throw std::invalid_argument(fmt::format("manifest '{}': eot_token {} is outside the vocabulary of {}",
                                              name, m.eot_token, m.vocab_size));
    if (sum != m.tokens)
      throw std::invalid_argument(
          fmt::format("manifest '{}': \"tokens\" is {} but its shards hold {}", name, m.tokens, sum));
  } catch (const nlohmann::json::exception& e) {
    throw std::invalid_argument(fmt::format("manifest '{}': {}", name, printable(e.what())));
  }
  return m;
}

// ---- the dataset folder -----------------------------------------------------------------

ShardedTokens::ShardedTokens(const std::string& dir, bool verify) : dir_(dir) {
  namespace fs = std::filesystem;
  const std::string path = (fs::path(dir) / kManifestName).string();
  std::error_code ec;
  if (!fs::is_regular_file(path, ec))
    throw std::invalid_argument(
        fmt::format("'{}' is not a token-shard folder: no {} (attn prepare writes one)", printable(dir), kManifestName));
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  if (!in && !in.eof()) throw std::runtime_error(fmt::format("cannot read '{}'", printable(path)));
  manifest_ = Manifest::from_json(s.str(), path);
  int64_t start = 0;
  for (const ShardEntry& e : manifest_.shards) {
    auto shard = std::make_unique<TokenShard>((fs::path(dir) / e.file).string(), verify);
    const std::string name = printable(shard->path());
    if (shard->size() != e.tokens)
      throw std::invalid_argument(fmt::format("token shard '{}' holds {} tokens, the manifest says {}", name,
                                              shard->size(), e.tokens));
    if (shard->header().checksum != e.checksum)
      throw std::invalid_argument(fmt::format(
          "token shard '{}': checksum {:016x} in its header, the manifest says {:016x}", name,
          shard->header().checksum, e.checksum));
    if (shard->vocab_size() != manifest_.vocab_size)
      throw std::invalid_argument(fmt::format("token shard '{}': vocab_size {}, the manifest says {}", name,
                                              shard->vocab_size(), manifest_.vocab_size));
    starts_.push_back(start);
    start += shard->size();
    shards_.push_back(std::move(shard));
  }
}

void ShardedTokens::read(int64_t pos, int64_t n, int64_t* out) const {
  check_range(pos, n, size(), "ShardedTokens::read");
  // The last shard starting at or before pos (empty shards are passed over).
  size_t k = static_cast<size_t>(std::upper_bound(starts_.begin(), starts_.end(), pos) - starts_.begin());
  k = k == 0 ? 0 : k - 1;
  while (n > 0) {
    const TokenShard& shard = *shards_[k];
    const int64_t local = pos - starts_[k];
    const int64_t take = std::min(n, shard.size() - local);
    if (take > 0) {
      shard.read(local, take, out);
      out += take;
      pos += take;
      n -= take;
    }
    ++k;
  }
}

}  // namespace attn::data
