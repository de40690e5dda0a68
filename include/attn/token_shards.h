// attn/token_shards.h - a tokenized corpus on disk: token shards that every
// training process memory-maps and reads by position, never loading the whole.
//
// A shard file (".tok"), little-endian, a 64-byte header and then the tokens:
//
//   offset size  field
//        0    8  magic "ATTNTOK1"
//        8    4  format version (uint32, 1)
//       12    4  bytes per token (uint32, 2: the tokens are uint16)
//       16    8  vocab_size (uint64, 1 .. 65536): every token is < vocab_size
//       24    8  token_count (uint64)
//       32    8  checksum (uint64): FNV-1a 64 of the token bytes as stored
//       40   24  reserved, zero
//       64  2n   the tokens, uint16 each
//
// A dataset is a folder: shard-00000.tok, shard-00001.tok, ... and
// manifest.json (kManifestFormat) naming them in order with their token counts
// and checksums, the tokenizer, the vocabulary size and the end-of-text token.
// Its tokens are the shards' tokens one after the other: global position p is
// in the shard whose range holds it. `attn prepare` writes one
// (prepare_token_shards, below; docs/distributed.md).
//
// Every file is written atomically (attn/atomic_file.h). Reading checks the
// header (magic, version, token size, vocabulary, the file's size against the
// count) on open, and with verify also the checksum and every token against
// the vocabulary, which reads the whole file; without verify, only the tokens
// a read returns are checked against the vocabulary, and a read touches only
// the pages of its window. Bad files throw std::invalid_argument naming the
// file and the values (never raw bytes from the file: the magic is printed
// in hex); an unreadable file throws std::runtime_error.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "attn/mapped_file.h"

namespace attn::data {

inline constexpr char kShardMagic[8] = {'A', 'T', 'T', 'N', 'T', 'O', 'K', '1'};
inline constexpr uint32_t kShardVersion = 1;
inline constexpr uint64_t kShardHeaderBytes = 64;
inline constexpr const char* kManifestFormat = "attn-token-shards-1";
inline constexpr const char* kManifestName = "manifest.json";

// Tokens read by global position: what a training loader asks of a corpus.
class TokenSource {
 public:
  virtual ~TokenSource() = default;
  virtual int64_t size() const = 0;
  // out[0, n) = tokens [pos, pos + n). Throws std::out_of_range unless
  // 0 <= pos and pos + n <= size(), std::invalid_argument for a stored token
  // outside the vocabulary.
  virtual void read(int64_t pos, int64_t n, int64_t* out) const = 0;
};

// Tokens held in memory (the text a trainer tokenized itself).
class TokenVector final : public TokenSource {
 public:
  explicit TokenVector(std::vector<int64_t> tokens) : tokens_(std::move(tokens)) {}
  int64_t size() const override { return static_cast<int64_t>(tokens_.size()); }
  void read(int64_t pos, int64_t n, int64_t* out) const override;

 private:
  std::vector<int64_t> tokens_;
};

// tokens [begin, end) of another source, as positions [0, end - begin).
// Throws std::out_of_range unless 0 <= begin <= end <= source->size().
std::shared_ptr<const TokenSource> slice(std::shared_ptr<const TokenSource> source, int64_t begin,
                                         int64_t end);

// Writes a shard atomically. Throws std::invalid_argument for vocab_size
// outside [1, 65536] or a token >= vocab_size (naming it and its position);
// std::runtime_error when the file cannot be written. Returns the checksum.
uint64_t write_token_shard(const std::string& path, std::span<const uint16_t> tokens,
                           int64_t vocab_size);

struct ShardHeader {
  uint32_t version = 0;
  uint32_t token_bytes = 0;
  int64_t vocab_size = 0;
  int64_t tokens = 0;
  uint64_t checksum = 0;
};

// One shard, memory-mapped read-only (madvise random: windows are drawn at
// random, so the kernel reads no more than the pages a window touches).
class TokenShard final : public TokenSource {
 public:
  // Maps and checks the header (see the file comment); verify: also the
  // checksum and every token. Throws as the file comment says.
  explicit TokenShard(const std::string& path, bool verify = false);

  const ShardHeader& header() const { return header_; }
  const std::string& path() const { return path_; }
  int64_t size() const override { return header_.tokens; }
  int64_t vocab_size() const { return header_.vocab_size; }
  // The stored tokens (unchecked against the vocabulary unless verified).
  std::span<const uint16_t> tokens() const { return {tokens_, static_cast<size_t>(header_.tokens)}; }
  void read(int64_t pos, int64_t n, int64_t* out) const override;
  // Recomputes the checksum and checks every token; throws std::invalid_argument
  // naming the difference.
  void verify() const;

 private:
  std::string path_;
  io::MappedFile map_;
  ShardHeader header_;
  const uint16_t* tokens_ = nullptr;
};

// The shard files of a dataset folder as its manifest lists them.
struct ShardEntry {
  std::string file;  // a name in the folder (no '/')
  int64_t tokens = 0;
  uint64_t checksum = 0;
};

struct Manifest {
  std::string tokenizer;  // "gpt2"
  int64_t vocab_size = 0;
  int64_t eot_token = -1;  // the token between documents (-1: none)
  int64_t tokens = 0;      // the sum over the shards
  int64_t documents = 0;   // input files
  std::vector<ShardEntry> shards;
  std::string to_json() const;
  // Throws std::invalid_argument naming the key for a malformed manifest.
  static Manifest from_json(const std::string& json, const std::string& where);
};

// A dataset folder: the manifest and every shard mapped, the shards checked
// against the manifest (count, checksum, vocabulary). Windows may cross shards.
class ShardedTokens final : public TokenSource {
 public:
  // Throws std::invalid_argument for a missing or malformed manifest or shard,
  // or one that disagrees with the manifest.
  explicit ShardedTokens(const std::string& dir, bool verify = false);
  const Manifest& manifest() const { return manifest_; }
  const std::string& dir() const { return dir_; }  // as given
  int64_t size() const override { return manifest_.tokens; }
  int64_t vocab_size() const { return manifest_.vocab_size; }
  const std::vector<std::unique_ptr<TokenShard>>& shards() const { return shards_; }
  void read(int64_t pos, int64_t n, int64_t* out) const override;

 private:
  std::string dir_;
  Manifest manifest_;
  std::vector<std::unique_ptr<TokenShard>> shards_;
  std::vector<int64_t> starts_;  // global position of each shard's first token
};

// ---- attn prepare ----------------------------------------------------------

// The most tokens one shard may hold: prepare keeps a shard in memory until
// it is written, 2 bytes a token (2 GiB).
inline constexpr int64_t kMaxShardTokens = int64_t{1} << 30;

struct PrepareOptions {
  std::string tokenizer = "gpt2";   // the only one for now
  int64_t shard_tokens =
      100'000'000;  // tokens per shard (the last one may hold fewer), <= kMaxShardTokens
  int threads = 0;                  // 0: OpenMP's maximum
  // Text read and tokenized at a time (cut at a place where GPT-2's pattern
  // cannot join pieces, so the ids equal those of the whole file).
  int64_t block_bytes = int64_t{64} << 20;
  // Called after each block is tokenized with the bytes of input tokenized so
  // far, over all files (a progress display's hook: attn prepare's). Empty: none.
  std::function<void(int64_t bytes)> on_progress;
};

// Tokenizes the files in order with GPT-2's BPE ("<|endoftext|>" in a file is
// the special token, as attn train --text reads it), with the end-of-text
// token 50256 between files (not after the last), into out_dir/shard-NNNNN.tok
// and out_dir/manifest.json. out_dir is created; an existing manifest there is
// an error (std::runtime_error). Throws std::invalid_argument for invalid
// options or text that is not UTF-8 (naming the file and the byte offset),
// std::runtime_error for an unreadable file. Returns the manifest written.
Manifest prepare_token_shards(const std::vector<std::string>& inputs, const std::string& out_dir,
                              const PrepareOptions& options);

}  // namespace attn::data
