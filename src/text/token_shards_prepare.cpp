// attn prepare's library half (attn/token_shards.h, prepare_token_shards): a
// corpus of text files tokenized once into token shards and a manifest.
// It lives in src/text, above src/io: the tokenizing half is text's; the shard
// file format (header, checksum, atomic write, manifest, reader) stays in
// src/io (token_shards.cpp), which knows nothing of tokenizers.
//
// Each file is read a block at a time; a block is tokenized up to the last
// place where GPT-2's pattern cannot join pieces across a cut
// (text::is_safe_cut), and the rest carried into the next block, so the ids
// are those of the whole file tokenized at once. Each block is tokenized on
// `threads` threads (Tokenizer::encode_parallel, which cuts the same way).
#include <fmt/format.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <stdexcept>

#include "attn/atomic_file.h"
#include "attn/token_shards.h"
#include "attn/tokenizer.h"
#include "attn/utf8.h"
#include "text/encoder.h"

namespace attn::data {

namespace {

class ShardWriter {
 public:
  ShardWriter(std::string dir, int64_t shard_tokens, int64_t vocab_size)
      : dir_(std::move(dir)), shard_tokens_(shard_tokens), vocab_size_(vocab_size) {
    tokens_.reserve(static_cast<size_t>(std::min<int64_t>(shard_tokens_, int64_t{1} << 24)));
  }
  void push(const std::vector<int64_t>& ids) {
    for (int64_t id : ids) {
      tokens_.push_back(static_cast<uint16_t>(id));  // ids < vocab_size <= 65536
      if (static_cast<int64_t>(tokens_.size()) == shard_tokens_) flush();
    }
  }
  void flush() {
    if (tokens_.empty()) return;
    ShardEntry e;
    e.file = fmt::format("shard-{:05}.tok", entries_.size());
    e.tokens = static_cast<int64_t>(tokens_.size());
    e.checksum = write_token_shard((std::filesystem::path(dir_) / e.file).string(), tokens_, vocab_size_);
    entries_.push_back(e);
    tokens_.clear();
  }
  std::vector<ShardEntry>& entries() { return entries_; }

 private:
  std::string dir_;
  int64_t shard_tokens_, vocab_size_;
  std::vector<uint16_t> tokens_;
  std::vector<ShardEntry> entries_;
};

// The last p in [size/2, size - 8] where the text may be cut (0: none). The
// margin keeps is_safe_cut's look at the character after p inside the block.
size_t last_safe_cut(std::string_view text) {
  if (text.size() < 16) return 0;
  for (size_t p = text.size() - 8; p >= text.size() / 2 && p > 0; --p) {
    if (text::is_safe_cut(text, p)) return p;
  }
  return 0;
}

}  // namespace

Manifest prepare_token_shards(const std::vector<std::string>& inputs, const std::string& out_dir,
                              const PrepareOptions& options) {
  namespace fs = std::filesystem;
  if (options.tokenizer != "gpt2")
    throw std::invalid_argument(
        fmt::format("--tokenizer must be gpt2, got '{}'", printable(options.tokenizer, 64)));
  if (options.shard_tokens < 1 || options.shard_tokens > kMaxShardTokens)
    throw std::invalid_argument(fmt::format("--shard-tokens must be in 1..{}, got {}",
                                            kMaxShardTokens, options.shard_tokens));
  if (options.threads < 0 || options.threads > 4096)
    throw std::invalid_argument(
        fmt::format("--threads must be in 0..4096, got {}", options.threads));
  if (options.block_bytes < 64)
    throw std::invalid_argument(fmt::format("block_bytes must be >= 64, got {}", options.block_bytes));
  if (inputs.empty()) throw std::invalid_argument("no input files");
  std::error_code ec;
  for (const std::string& f : inputs) {
    // Each kind its own message; a FIFO or a device is refused before it is
    // opened (a FIFO would wait for a writer, /dev/zero never ends).
    const fs::file_status st = fs::status(f, ec);
    if (st.type() == fs::file_type::regular) continue;
    const char* kind = st.type() == fs::file_type::not_found   ? nullptr
                       : st.type() == fs::file_type::directory ? "a directory"
                       : st.type() == fs::file_type::fifo      ? "a FIFO (named pipe)"
                       : st.type() == fs::file_type::character ? "a character device"
                       : st.type() == fs::file_type::block     ? "a block device"
                       : st.type() == fs::file_type::socket    ? "a socket"
                                                               : "not a regular file";
    if (kind == nullptr)
      throw std::runtime_error(fmt::format("input '{}': no such file", printable(f)));
    throw std::runtime_error(
        fmt::format("input '{}' is {}, not a regular file", printable(f), kind));
  }
  fs::create_directories(out_dir, ec);
  if (ec || !fs::is_directory(out_dir))
    throw std::runtime_error(fmt::format("--out '{}': cannot create the folder{}", printable(out_dir),
                                         ec ? ": " + ec.message() : ""));
  const std::string manifest_path = (fs::path(out_dir) / kManifestName).string();
  if (fs::exists(manifest_path, ec))
    throw std::runtime_error(fmt::format("--out '{}' already holds a {}; choose another folder",
                                         printable(out_dir), kManifestName));

  const text::Tokenizer& tok = text::Tokenizer::gpt2();
  Manifest m;
  m.tokenizer = options.tokenizer;
  m.vocab_size = tok.vocab_size();
  m.eot_token = tok.eot_token();
  m.documents = static_cast<int64_t>(inputs.size());
  ShardWriter writer(out_dir, options.shard_tokens, m.vocab_size);
  const auto block = static_cast<size_t>(options.block_bytes);
  int64_t bytes_done = 0;  // over all files, for options.on_progress

  for (size_t d = 0; d < inputs.size(); ++d) {
    const std::string& file = inputs[d];
    if (d > 0) writer.push({m.eot_token});
    std::ifstream in(file, std::ios::binary);
    if (!in)
      throw std::runtime_error(fmt::format("input '{}': cannot read: {}", printable(file), std::strerror(errno)));
    std::string buf;
    uint64_t buf_offset = 0;  // the file offset of buf[0]
    auto encode = [&](std::string_view text) {
      try {
        writer.push(tok.encode_parallel(text, /*allow_special=*/true, options.threads));
      } catch (const std::invalid_argument& e) {
        throw std::invalid_argument(
            fmt::format("input '{}', in the text from byte {}: {}", printable(file), buf_offset, e.what()));
      }
      bytes_done += static_cast<int64_t>(text.size());
      if (options.on_progress) options.on_progress(bytes_done);
    };
    while (true) {
      const size_t had = buf.size();
      buf.resize(had + block);
      in.read(buf.data() + had, static_cast<std::streamsize>(block));
      buf.resize(had + static_cast<size_t>(in.gcount()));
      if (in.bad()) throw std::runtime_error(fmt::format("input '{}': read error", printable(file)));
      if (in.eof()) {
        encode(buf);
        break;
      }
      const size_t cut = last_safe_cut(buf);
      if (cut == 0) continue;  // no place to cut yet: read on
      encode(std::string_view(buf).substr(0, cut));
      buf.erase(0, cut);
      buf_offset += cut;
    }
  }
  writer.flush();
  m.shards = std::move(writer.entries());
  for (const ShardEntry& e : m.shards) m.tokens += e.tokens;
  if (m.tokens == 0) throw std::invalid_argument("the inputs hold no text (every file is empty)");
  io::write_file_atomically(manifest_path, m.to_json());
  return m;
}

}  // namespace attn::data
