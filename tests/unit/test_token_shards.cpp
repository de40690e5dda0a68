// Token shards (attn/token_shards.h): the format round trip, memory-mapped
// windows, every bad file, prepare_token_shards against serial tokenization,
// the window loader over shards, and `attn prepare` / `attn train
// --data-shards` through the built executable.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "attn/atomic_file.h"
#include "attn/fnv1a.h"
#include "attn/safetensors.h"
#include "attn/token_shards.h"
#include "attn/tokenizer.h"
#include "attn/train.h"
#include "cli.h"

namespace {

namespace fs = std::filesystem;
using attn::data::ShardedTokens;
using attn::data::TokenShard;
using attn::test::run_cli;
using attn::test::temp_path;

std::string read_data(const std::string& name) {
  return attn::test::read_text(std::string(ATTN_DATA_DIR) + "/" + name);
}

std::string write_temp(const std::string& stem, const std::string& bytes) {
  const std::string path = temp_path(stem);
  attn::io::write_file_atomically(path, bytes);
  return path;
}

std::vector<uint16_t> random_tokens(size_t n, uint16_t vocab, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<uint16_t> t(n);
  for (auto& x : t) x = static_cast<uint16_t>(rng() % vocab);
  return t;
}

// The file's bytes with `patch` written at `offset` (or cut to `offset` bytes
// when patch is empty).
std::string patched(const std::string& path, size_t offset, const std::string& patch) {
  std::string bytes = attn::test::read_text(path);
  if (patch.empty())
    bytes.resize(offset);
  else
    bytes.replace(offset, patch.size(), patch);
  return write_temp("patched.tok", bytes);
}

std::string fmt_hex(uint64_t v) {
  char s[17];
  std::snprintf(s, sizeof s, "%016llx", static_cast<unsigned long long>(v));
  return s;
}

template <typename T>
std::string le_bytes(T v) {
  std::string s(sizeof v, '\0');
  std::memcpy(s.data(), &v, sizeof v);
  return s;
}

// The message of the std::invalid_argument that f throws ("" if none).
template <typename F>
std::string invalid_argument_of(F&& f) {
  try {
    f();
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "";
}

TEST(TokenShards, Fnv1a64KnownValues) {
  // The published FNV-1a 64 test vectors.
  EXPECT_EQ(attn::fnv1a64("", 0), 0xcbf29ce484222325ULL);
  EXPECT_EQ(attn::fnv1a64("a", 1), 0xaf63dc4c8601ec8cULL);
  EXPECT_EQ(attn::fnv1a64("foobar", 6), 0x85944171f73967e8ULL);
  // In pieces, continued from the previous result.
  EXPECT_EQ(attn::fnv1a64("bar", 3, attn::fnv1a64("foo", 3)), 0x85944171f73967e8ULL);
}

TEST(TokenShards, RoundTripHeaderTokensAndWindows) {
  const auto tokens = random_tokens(100000, 50257, 1);
  const std::string path = temp_path("a.tok");
  const uint64_t sum = attn::data::write_token_shard(path, tokens, 50257);
  EXPECT_EQ(sum, attn::fnv1a64(tokens.data(), tokens.size() * 2));
  EXPECT_EQ(fs::file_size(path), 64 + 2 * tokens.size());
  const std::string bytes = attn::test::read_text(path);
  EXPECT_EQ(bytes.substr(0, 8), "ATTNTOK1");

  TokenShard shard(path, /*verify=*/true);
  EXPECT_EQ(shard.header().version, 1u);
  EXPECT_EQ(shard.header().token_bytes, 2u);
  EXPECT_EQ(shard.vocab_size(), 50257);
  EXPECT_EQ(shard.size(), 100000);
  EXPECT_EQ(shard.header().checksum, sum);
  ASSERT_EQ(shard.tokens().size(), tokens.size());
  EXPECT_TRUE(std::equal(tokens.begin(), tokens.end(), shard.tokens().begin()));
  std::mt19937_64 rng(2);
  for (int k = 0; k < 100; ++k) {
    const int64_t n = static_cast<int64_t>(rng() % 1000), pos = static_cast<int64_t>(rng() % (100000 - n));
    std::vector<int64_t> out(static_cast<size_t>(n));
    shard.read(pos, n, out.data());
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(out[static_cast<size_t>(i)], tokens[static_cast<size_t>(pos + i)]);
  }
  std::vector<int64_t> one(1);
  EXPECT_THROW(shard.read(100000, 1, one.data()), std::out_of_range);
  EXPECT_THROW(shard.read(-1, 1, one.data()), std::out_of_range);
  shard.read(100000, 0, one.data());  // an empty window at the end is fine

  // An empty shard and the largest vocabulary uint16 holds.
  const std::string empty = temp_path("empty.tok");
  attn::data::write_token_shard(empty, {}, 65536);
  EXPECT_EQ(TokenShard(empty, true).size(), 0);
  const std::vector<uint16_t> top{65535, 0};
  attn::data::write_token_shard(empty, top, 65536);
  EXPECT_EQ(TokenShard(empty, true).tokens()[0], 65535);
}

// Reading a window maps in only the pages around it: the mapping's pages
// present in this process's page table (/proc/self/pagemap) before and after.
TEST(TokenShards, AWindowTouchesOnlyItsPages) {
  const size_t n = 8u << 20;  // 16 MiB of tokens: 4096 pages
  const std::string path = temp_path("big.tok");
  attn::data::write_token_shard(path, random_tokens(n, 50257, 3), 50257);
  TokenShard shard(path);
  const long page = ::sysconf(_SC_PAGESIZE);
  const auto base = reinterpret_cast<uintptr_t>(shard.tokens().data()) - 64;  // the mapping's start
  const size_t pages = (64 + 2 * n + static_cast<size_t>(page) - 1) / static_cast<size_t>(page);
  const int fd = ::open("/proc/self/pagemap", O_RDONLY);
  if (fd < 0) GTEST_SKIP() << "no /proc/self/pagemap";
  auto present = [&] {
    std::vector<uint64_t> entries(pages);
    const ssize_t got = ::pread(fd, entries.data(), pages * 8, static_cast<off_t>(base / static_cast<uintptr_t>(page) * 8));
    EXPECT_EQ(got, static_cast<ssize_t>(pages * 8));
    std::vector<size_t> p;
    for (size_t i = 0; i < pages; ++i)
      if (entries[i] >> 63) p.push_back(i);
    return p;
  };
  const auto before = present();
  EXPECT_LE(before.size(), 32u) << "opening touched " << before.size() << " pages";
  const int64_t pos = 5'000'000, len = 4096;  // 8 KiB of tokens in the middle
  std::vector<int64_t> out(len);
  shard.read(pos, len, out.data());
  const auto after = present();
  ::close(fd);
  const size_t first = (64 + 2 * static_cast<size_t>(pos)) / static_cast<size_t>(page);
  const size_t last = (64 + 2 * static_cast<size_t>(pos + len) - 1) / static_cast<size_t>(page);
  // The kernel maps pages already cached around a fault: fault-around (64 KiB
  // by default), and with large page-cache folios the whole folio (up to 2
  // MiB). Allow the 2 MiB-aligned stretch around the window and its 64 KiB
  // either side, and nothing else: at most a quarter of this 16 MiB file.
  const size_t folio = (size_t{2} << 20) / static_cast<size_t>(page), around = (size_t{64} << 10) / static_cast<size_t>(page);
  const size_t lo = (first - around) / folio * folio, hi = ((last + around) / folio + 1) * folio;
  size_t new_pages = 0;
  for (size_t i : after) {
    if (std::find(before.begin(), before.end(), i) != before.end()) continue;
    ++new_pages;
    EXPECT_GE(i, lo) << "page " << i;
    EXPECT_LT(i, hi) << "page " << i;
  }
  EXPECT_GE(new_pages, last - first + 1);
  EXPECT_LE(new_pages, hi - lo);
  EXPECT_LE(hi - lo, pages / 4);
}

TEST(TokenShards, EveryBadFileIsAnInvalidArgumentNamingTheValues) {
  const auto tokens = random_tokens(1000, 50257, 4);
  const std::string good = temp_path("good.tok");
  attn::data::write_token_shard(good, tokens, 50257);
  auto open_error = [](const std::string& path, bool verify = false) {
    return invalid_argument_of([&] { TokenShard s(path, verify); });
  };
  EXPECT_EQ(open_error(good, true), "");

  // Bad magic: printed in hex, never as the file's bytes.
  std::string m = open_error(patched(good, 0, "\xff\x01GARBAG"));
  EXPECT_NE(m.find("not an attn token shard: magic ff0147415242414"), std::string::npos) << m;
  EXPECT_EQ(m.find('\xff'), std::string::npos);
  // Truncated: shorter than the header, or fewer token bytes than counted.
  m = open_error(patched(good, 10, ""));
  EXPECT_NE(m.find("truncated: 10 bytes, the header alone is 64"), std::string::npos) << m;
  m = open_error(patched(good, 64 + 1999, ""));
  EXPECT_NE(m.find("counts 1000 tokens (2000 bytes) but the file holds 1999 bytes of tokens (truncated)"),
            std::string::npos)
      << m;
  // A count that disagrees with the file's size.
  m = open_error(patched(good, 24, le_bytes<uint64_t>(999)));
  EXPECT_NE(m.find("counts 999 tokens (1998 bytes) but the file holds 2000"), std::string::npos) << m;
  m = open_error(patched(good, 24, le_bytes<uint64_t>(UINT64_MAX)));
  EXPECT_NE(m.find("counts 18446744073709551615 tokens"), std::string::npos) << m;
  // Version, token size, vocabulary, reserved bytes.
  m = open_error(patched(good, 8, le_bytes<uint32_t>(2)));
  EXPECT_NE(m.find("format version 2, this attn reads version 1"), std::string::npos) << m;
  m = open_error(patched(good, 12, le_bytes<uint32_t>(4)));
  EXPECT_NE(m.find("4 bytes per token"), std::string::npos) << m;
  m = open_error(patched(good, 16, le_bytes<uint64_t>(0)));
  EXPECT_NE(m.find("vocab_size 0 is outside 1 .. 65536"), std::string::npos) << m;
  m = open_error(patched(good, 16, le_bytes<uint64_t>(70000)));
  EXPECT_NE(m.find("vocab_size 70000"), std::string::npos) << m;
  m = open_error(patched(good, 50, "\x07"));
  EXPECT_NE(m.find("reserved header byte 50 is 0x07"), std::string::npos) << m;

  // A flipped token: found by the checksum when verifying, not on a plain open.
  std::string flipped = attn::test::read_text(good);
  flipped[64 + 2 * 500] ^= 1;
  const std::string bad_sum = write_temp("flipped.tok", flipped);
  EXPECT_EQ(open_error(bad_sum), "");
  m = open_error(bad_sum, true);
  EXPECT_NE(m.find("checksum mismatch: the header says " + fmt_hex(attn::fnv1a64(tokens.data(), 2000))),
            std::string::npos)
      << m;

  // A token outside the vocabulary (with a matching checksum): verify names
  // it, and so does a read of a window holding it; a window beside it reads.
  std::vector<uint16_t> big = tokens;
  big[700] = 60000;
  const std::string out_of_vocab = temp_path("oov.tok");
  attn::data::write_token_shard(out_of_vocab, big, 65536);
  const std::string narrowed = patched(out_of_vocab, 16, le_bytes<uint64_t>(50257));
  m = open_error(narrowed, true);
  EXPECT_NE(m.find("token 60000 at position 700 is >= vocab_size 50257"), std::string::npos) << m;
  TokenShard lazy(narrowed);
  std::vector<int64_t> out(100);
  EXPECT_NO_THROW(lazy.read(600, 100, out.data()));
  m = invalid_argument_of([&] { lazy.read(650, 100, out.data()); });
  EXPECT_NE(m.find("token 60000 at position 700 is >= vocab_size 50257"), std::string::npos) << m;

  // Writing refuses what reading would.
  m = invalid_argument_of([&] { attn::data::write_token_shard(temp_path("w.tok"), big, 50257); });
  EXPECT_NE(m.find("token 60000 at position 700 is >= vocab_size 50257"), std::string::npos) << m;
  EXPECT_THROW(attn::data::write_token_shard(temp_path("w.tok"), tokens, 65537), std::invalid_argument);
  // A missing file is a runtime_error naming it.
  EXPECT_THROW(TokenShard(temp_path("missing.tok")), std::runtime_error);
}

// A dataset folder of shards holding `tokens` split every `per_shard`.
std::string make_dataset(const std::vector<uint16_t>& tokens, size_t per_shard) {
  const std::string dir = temp_path("ds");
  fs::create_directories(dir);
  attn::data::Manifest m;
  m.tokenizer = "gpt2";
  m.vocab_size = 50257;
  m.eot_token = 50256;
  m.documents = 1;
  for (size_t at = 0; at < tokens.size(); at += per_shard) {
    attn::data::ShardEntry e;
    e.file = "shard-" + std::to_string(m.shards.size()) + ".tok";
    const size_t n = std::min(per_shard, tokens.size() - at);
    e.checksum = attn::data::write_token_shard(dir + "/" + e.file, {tokens.data() + at, n}, 50257);
    e.tokens = static_cast<int64_t>(n);
    m.tokens += e.tokens;
    m.shards.push_back(e);
  }
  attn::io::write_file_atomically(dir + "/manifest.json", m.to_json());
  return dir;
}

TEST(TokenShards, ShardedTokensReadsAcrossShards) {
  const auto tokens = random_tokens(10000, 50257, 5);
  const ShardedTokens data(make_dataset(tokens, 777), /*verify=*/true);
  EXPECT_EQ(data.size(), 10000);
  EXPECT_EQ(data.shards().size(), 13u);
  std::mt19937_64 rng(6);
  for (int k = 0; k < 200; ++k) {
    const int64_t n = static_cast<int64_t>(rng() % 2000), pos = static_cast<int64_t>(rng() % (10000 - n + 1));
    std::vector<int64_t> out(static_cast<size_t>(n));
    data.read(pos, n, out.data());
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(out[static_cast<size_t>(i)], tokens[static_cast<size_t>(pos + i)]);
  }
  std::vector<int64_t> all(10000);
  data.read(0, 10000, all.data());
  EXPECT_TRUE(std::equal(all.begin(), all.end(), tokens.begin()));
  EXPECT_THROW(data.read(9999, 2, all.data()), std::out_of_range);
}

TEST(TokenShards, ManifestDisagreementsAreInvalidArguments) {
  const auto tokens = random_tokens(3000, 50257, 7);
  const std::string dir = make_dataset(tokens, 1000);
  const std::string manifest = attn::test::read_text(dir + "/manifest.json");
  auto with_manifest = [&](const std::string& text) {
    const std::string d = temp_path("ds2");
    fs::create_directories(d);
    for (const auto& e : fs::directory_iterator(dir))
      if (e.path().extension() == ".tok") fs::copy_file(e.path(), d + "/" + e.path().filename().string());
    attn::io::write_file_atomically(d + "/manifest.json", text);
    return invalid_argument_of([&] { ShardedTokens s(d); });
  };
  EXPECT_EQ(with_manifest(manifest), "");
  auto edited = [&](auto edit) {
    auto j = nlohmann::ordered_json::parse(manifest);
    edit(j);
    return j.dump();
  };
  std::string m = with_manifest(edited([](auto& j) { j["shards"][1]["tokens"] = 999; j["tokens"] = 2999; }));
  EXPECT_NE(m.find("holds 1000 tokens, the manifest says 999"), std::string::npos) << m;
  m = with_manifest(edited([](auto& j) { j["shards"][2]["checksum"] = "0123456789abcdef"; }));
  EXPECT_NE(m.find("the manifest says 0123456789abcdef"), std::string::npos) << m;
  m = with_manifest(edited([](auto& j) { j["tokens"] = 5; }));
  EXPECT_NE(m.find("\"tokens\" is 5 but its shards hold 3000"), std::string::npos) << m;
  m = with_manifest(edited([](auto& j) { j["shards"][0]["file"] = "../x.tok"; }));
  EXPECT_NE(m.find("is not a name in the manifest's folder"), std::string::npos) << m;
  // Issue 46: a NUL byte would cut the name the system call sees, so the real
  // shard's name followed by "\0x" opened that shard.
  m = with_manifest(edited([](auto& j) {
    j["shards"][0]["file"] =
        j["shards"][0]["file"].template get<std::string>() + std::string("\0x", 2);
  }));
  EXPECT_NE(m.find("\\x00x\" is not a name in the manifest's folder"), std::string::npos) << m;
  // A float where a count goes (converting 9.2e25 to int64 was undefined
  // behaviour, found by fuzz_token_manifest), and counts that overflow.
  m = with_manifest(edited([](auto& j) { j["vocab_size"] = 9.2e25; }));
  EXPECT_NE(m.find("\"vocab_size\" must be an integer, got 9.2e+25"), std::string::npos) << m;
  m = with_manifest(edited([](auto& j) {
    j["shards"][0]["tokens"] = INT64_MAX;
    j["shards"][1]["tokens"] = INT64_MAX;
  }));
  EXPECT_NE(m.find("its shards hold more tokens than int64 can count"), std::string::npos) << m;
  m = with_manifest(edited([](auto& j) { j["vocab_size"] = 50000; j["eot_token"] = 1; }));
  EXPECT_NE(m.find("vocab_size 50257, the manifest says 50000"), std::string::npos) << m;
  m = with_manifest(edited([](auto& j) { j["format"] = "other"; }));
  EXPECT_NE(m.find("format \"other\""), std::string::npos) << m;
  m = with_manifest(edited([](auto& j) { j.erase("shards"); }));
  EXPECT_NE(m.find("manifest '"), std::string::npos) << m;
  m = with_manifest("{\"format\": \xff");
  EXPECT_NE(m.find("manifest '"), std::string::npos) << m;
  EXPECT_EQ(m.find('\xff'), std::string::npos) << m;
  m = invalid_argument_of([&] { ShardedTokens s(temp_path("nothing")); });
  EXPECT_NE(m.find("no manifest.json"), std::string::npos) << m;
}

// What prepare_token_shards must give: each file tokenized whole, serially,
// with <|endoftext|> allowed, and the end-of-text token between files.
std::vector<int64_t> serial_ids(const std::vector<std::string>& texts) {
  const auto& tok = attn::text::Tokenizer::gpt2();
  std::vector<int64_t> ids;
  for (size_t d = 0; d < texts.size(); ++d) {
    if (d > 0) ids.push_back(tok.eot_token());
    const auto part = tok.encode(texts[d], /*allow_special=*/true);
    ids.insert(ids.end(), part.begin(), part.end());
  }
  return ids;
}

std::vector<int64_t> all_tokens(const std::string& dir) {
  const ShardedTokens data(dir, /*verify=*/true);
  std::vector<int64_t> ids(static_cast<size_t>(data.size()));
  data.read(0, data.size(), ids.data());
  return ids;
}

// Multilingual text with runs of spaces and newlines, contractions, digits and
// the special token: every kind of place a block may be cut near.
std::string mixed_text(size_t bytes, uint64_t seed) {
  static const char* const words[] = {"héllo", " wörld", "  ", "\n", "\n\n", " 日本語", "x", "'s", " 's",
                                      "123", " 4.5", "\t", " \n ", "😀", " ", "<|endoftext|>", "don't",
                                      "  \n\n  ", ",", " Ωμέγα", "\r\n"};
  std::mt19937_64 rng(seed);
  std::string s;
  while (s.size() < bytes) s += words[rng() % (sizeof words / sizeof *words)];
  return s;
}

TEST(TokenShards, PrepareEqualsSerialTokenization) {
  const std::string verdict = read_data("the-verdict.txt");
  const std::string shakespeare = read_data("tinyshakespeare.txt").substr(0, 300000);
  const std::string mixed = mixed_text(50000, 8);
  const std::vector<std::string> texts{verdict, shakespeare, mixed, ""};
  std::vector<std::string> files;
  for (const auto& t : texts) files.push_back(write_temp("in.txt", t));
  const auto expected = serial_ids(texts);
  ASSERT_GT(expected.size(), 70000u);
  // Blocks far smaller than the files (many cuts), and the default; several
  // thread counts; shards that end mid-file.
  for (int64_t block : {int64_t{64}, int64_t{1000}, int64_t{70000}, int64_t{64} << 20}) {
    for (int threads : {1, 2, 4}) {
      const std::string dir = temp_path("prep");
      attn::data::PrepareOptions o;
      o.shard_tokens = 9973;
      o.threads = threads;
      o.block_bytes = block;
      const auto m = attn::data::prepare_token_shards(files, dir, o);
      EXPECT_EQ(m.tokens, static_cast<int64_t>(expected.size()));
      EXPECT_EQ(m.documents, 4);
      EXPECT_EQ(m.shards.size(), (expected.size() + 9972) / 9973);
      EXPECT_EQ(all_tokens(dir), expected) << "block " << block << ", threads " << threads;
    }
  }
  // The verdict alone: its 5145 tokens, one shard.
  const std::string dir = temp_path("prep");
  const auto m = attn::data::prepare_token_shards({files[0]}, dir, {});
  EXPECT_EQ(m.tokens, 5145);
  EXPECT_EQ(m.shards.size(), 1u);
  EXPECT_EQ(all_tokens(dir), serial_ids({verdict}));
  const auto j = nlohmann::json::parse(attn::test::read_text(dir + "/manifest.json"));
  EXPECT_EQ(j["format"], "attn-token-shards-1");
  EXPECT_EQ(j["tokenizer"], "gpt2");
  EXPECT_EQ(j["vocab_size"], 50257);
  EXPECT_EQ(j["eot_token"], 50256);
  EXPECT_EQ(j["shards"][0]["file"], "shard-00000.tok");
  EXPECT_EQ(j["shards"][0]["checksum"], fmt_hex(TokenShard(dir + "/shard-00000.tok").header().checksum));
  // An existing manifest is not overwritten.
  EXPECT_THROW(attn::data::prepare_token_shards({files[0]}, dir, {}), std::runtime_error);
}

TEST(TokenShards, EmptyTextEncodesInParallelToNothing) {
  // encode_parallel once computed its helper count as (items - 1) with no
  // item for an empty text with allow_special, and spawned threads until the
  // system refused; prepare_token_shards meets empty files and blocks.
  for (bool special : {false, true})
    EXPECT_TRUE(attn::text::Tokenizer::gpt2().encode_parallel("", special, 4).empty()) << special;
}

TEST(TokenShards, PrepareRefusesBadInput) {
  const std::string good = write_temp("ok.txt", "hello");
  // Invalid UTF-8 far into a file: the file, the block's offset and the byte's
  // offset in it, never the byte itself.
  const std::string bad = write_temp("bad.txt", std::string(5000, 'a') + " b\n" + "x\xff" + "y z");
  attn::data::PrepareOptions o;
  o.block_bytes = 1000;
  std::string m = invalid_argument_of([&] { attn::data::prepare_token_shards({good, bad}, temp_path("p"), o); });
  EXPECT_NE(m.find("bad.txt', in the text from byte "), std::string::npos) << m;
  EXPECT_NE(m.find("invalid UTF-8 at byte offset"), std::string::npos) << m;
  EXPECT_EQ(m.find('\xff'), std::string::npos) << m;
  EXPECT_THROW(attn::data::prepare_token_shards({temp_path("none.txt")}, temp_path("p"), {}), std::runtime_error);
  EXPECT_THROW(attn::data::prepare_token_shards({}, temp_path("p"), {}), std::invalid_argument);
  EXPECT_THROW(attn::data::prepare_token_shards({write_temp("e.txt", "")}, temp_path("p"), {}),
               std::invalid_argument);
  attn::data::PrepareOptions bad_options;
  bad_options.shard_tokens = 0;
  EXPECT_THROW(attn::data::prepare_token_shards({good}, temp_path("p"), bad_options), std::invalid_argument);
  bad_options = {};
  bad_options.tokenizer = "char";
  EXPECT_THROW(attn::data::prepare_token_shards({good}, temp_path("p"), bad_options), std::invalid_argument);
}

// The book's window loader reads the same batches from shards as from the
// tokens in memory, and a Trainer trains on shards.
TEST(TokenShards, WindowLoaderOverShardsEqualsInMemory) {
  const auto small = random_tokens(5000, 50257, 9);
  const std::vector<int64_t> ids(small.begin(), small.end());
  auto shards = std::make_shared<const ShardedTokens>(make_dataset(small, 1234));
  attn::train::WindowLoader memory(ids, 4, 32, 17, /*shuffle=*/true, /*drop_last=*/true);
  attn::train::WindowLoader mapped(shards, 4, 32, 17, /*shuffle=*/true, /*drop_last=*/true);
  EXPECT_EQ(memory.batches(), mapped.batches());
  attn::Generator g1(5), g2(5);
  memory.start_pass(g1);
  mapped.start_pass(g2);
  while (memory.in_pass()) {
    ASSERT_TRUE(mapped.in_pass());
    const auto [x1, y1] = memory.next();
    const auto [x2, y2] = mapped.next();
    ASSERT_EQ(x1.to_int64_vector(), x2.to_int64_vector());
    ASSERT_EQ(y1.to_int64_vector(), y2.to_int64_vector());
  }
  EXPECT_FALSE(mapped.in_pass());

  attn::train::TrainOptions o;
  o.tokenizer = "gpt2";
  o.n_layers = 1;
  o.n_heads = 2;
  o.emb_dim = 16;
  o.context_length = 16;
  o.batch_size = 2;
  o.max_iters = 2;
  attn::train::Trainer trainer(shards, shards->vocab_size(), o);
  EXPECT_EQ(trainer.train_tokens(), 4500);
  EXPECT_EQ(trainer.val_tokens(), 500);
  EXPECT_TRUE(std::isfinite(trainer.step()));
  o.tokenizer = "char";
  EXPECT_THROW(attn::train::Trainer(shards, 50257, o), std::invalid_argument);
}

TEST(PrepareCli, WritesShardsThatTrainReads) {
  ATTN_REQUIRE_CLI();
  const std::string verdict = std::string(ATTN_DATA_DIR) + "/the-verdict.txt";
  const std::string dir = temp_path("cli-prep");
  auto r = run_cli("prepare --tokenizer gpt2 '" + verdict + "' '" + verdict + "' --out '" + dir +
                   "' --shard-tokens 4000 --threads 2 --verify");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("2 files -> 10291 tokens (gpt2) in 3 shards"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("verified"), std::string::npos) << r.out;
  EXPECT_EQ(all_tokens(dir), serial_ids({read_data("the-verdict.txt"), read_data("the-verdict.txt")}));

  const std::string run = temp_path("cli-run");
  r = run_cli("train --data-shards '" + dir + "' --out '" + run +
              "' --n-layers 1 --n-heads 2 --emb-dim 16 --context-length 16 --batch-size 2 --max-iters 2 "
              "--eval-interval 2 --eval-iters 1 --threads 1");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("10291 tokens (GPT-2 BPE), vocabulary 50257, 9261 train / 1030 val tokens"),
            std::string::npos)
      << r.out;
  EXPECT_TRUE(fs::exists(run + "/checkpoint.safetensors"));
  // The shards' tokenizer is the run's: another one asked for is a usage error.
  r = run_cli("train --data-shards '" + dir + "' --out '" + temp_path("cli-run") + "' --tokenizer char");
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("--tokenizer char: the shards in"), std::string::npos) << r.err;
  // --resume continues on the same shards.
  r = run_cli("train --data-shards '" + dir + "' --out '" + run + "' --resume --max-iters 3 --threads 1");
  EXPECT_EQ(r.exit_code, 0) << r.err;
}

// A checkpoint names the shards it trained on (dir, the manifest's FNV-1a 64,
// the token count): --resume on another folder's tokens, or on a text, is
// refused with one line naming both; the same shards resume.
TEST(PrepareCli, ResumeRefusesOtherShards) {
  ATTN_REQUIRE_CLI();
  const std::string verdict = std::string(ATTN_DATA_DIR) + "/the-verdict.txt";
  const std::string twice = temp_path("cli-prep-twice"), once = temp_path("cli-prep-once");
  auto r = run_cli("prepare --tokenizer gpt2 '" + verdict + "' '" + verdict + "' --out '" + twice + "'");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  r = run_cli("prepare --tokenizer gpt2 '" + verdict + "' --out '" + once + "'");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::string run = temp_path("cli-run-shards");
  const std::string model =
      " --n-layers 1 --n-heads 2 --emb-dim 16 --context-length 16 --batch-size 2 --eval-interval 2"
      " --eval-iters 1 --threads 1";
  r = run_cli("train --data-shards '" + twice + "' --out '" + run + "' --max-iters 2" + model);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto meta = attn::io::read_safetensors(run + "/checkpoint.safetensors").metadata;
  ASSERT_EQ(meta.count("data_shards"), 1u);
  EXPECT_NE(meta.at("data_shards").find("\"tokens\":10291"), std::string::npos) << meta.at("data_shards");

  r = run_cli("train --data-shards '" + once + "' --out '" + run + "' --resume --max-iters 3" + model);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  EXPECT_NE(r.err.find("was trained on the token shards in"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("10291 tokens); this run reads"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("5145 tokens"), std::string::npos) << r.err;

  r = run_cli("train --text '" + verdict + "' --tokenizer gpt2 --out '" + run + "' --resume --max-iters 3" +
              model);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("this run reads a text"), std::string::npos) << r.err;

  r = run_cli("train --data-shards '" + twice + "' --out '" + run + "' --resume --max-iters 3" + model);
  EXPECT_EQ(r.exit_code, 0) << r.err;
}

TEST(PrepareCli, BadInputIsOneLineAndANonZeroExit) {
  ATTN_REQUIRE_CLI();
  auto one_line = [](const attn::test::CliResult& r) {
    return std::count(r.err.begin(), r.err.end(), '\n') == 1 && r.err.rfind("attn: ", 0) == 0;
  };
  auto r = run_cli("prepare --help");
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_NE(r.out.find("--shard-tokens"), std::string::npos);
  EXPECT_NE(r.out.find("--data-shards"), std::string::npos);
  r = run_cli("prepare --tokenizer gpt2 '" + temp_path("none.txt") + "' --out '" + temp_path("o") + "'");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_TRUE(one_line(r)) << r.err;
  EXPECT_NE(r.err.find("no such file"), std::string::npos) << r.err;
  r = run_cli("prepare --tokenizer gpt2 '" + write_temp("bad.txt", "a\xff\xfe") + "' --out '" + temp_path("o") + "'");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_TRUE(one_line(r)) << r.err;
  EXPECT_EQ(r.err.find('\xff'), std::string::npos) << r.err;
  r = run_cli("prepare --tokenizer bpe x --out y");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_TRUE(one_line(r)) << r.err;
  r = run_cli("prepare --tokenizer gpt2 x --out y --shard-tokens 0");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_TRUE(one_line(r)) << r.err;
  r = run_cli("prepare --tokenizer gpt2 --out y");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_TRUE(one_line(r)) << r.err;
  // train: exactly one of --text and --data-shards; a folder without a manifest.
  r = run_cli("train --out '" + temp_path("t") + "'");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_TRUE(one_line(r)) << r.err;
  r = run_cli("train --data-shards '" + temp_path("nothing") + "' --out '" + temp_path("t") + "'");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_TRUE(one_line(r)) << r.err;
  EXPECT_NE(r.err.find("no manifest.json"), std::string::npos) << r.err;
}

}  // namespace
