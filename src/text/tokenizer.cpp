// GPT-2's byte-level BPE tokenizer (attn/tokenizer.h).
#include "attn/tokenizer.h"

#include <fmt/format.h>
#include <omp.h>
#include <sys/stat.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <exception>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>
#include <thread>

#include "attn/atomic_file.h"
#include "attn/utf8.h"
#include "text/bpe.h"
#include "text/encoder.h"
#include "text/gpt2_data.h"
#include "text/pretokenize.h"

namespace attn::text {

// ---- UTF-8 validation --------------------------------------------------------

void validate_utf8(std::string_view text, const char* what) {
  const auto* s = reinterpret_cast<const unsigned char*>(text.data());
  const size_t n = text.size();
  size_t i = 0;
  while (i < n) {
    // Eight ASCII bytes at a time.
    if (i + 8 <= n) {
      uint64_t w;
      std::memcpy(&w, s + i, 8);
      if ((w & 0x8080808080808080ull) == 0) {
        i += 8;
        continue;
      }
    }
    char32_t cp = 0;
    const char* why = nullptr;
    const size_t len = utf8_sequence(text, i, cp, &why);
    if (len == 0) {
      throw std::invalid_argument(fmt::format("{}: invalid UTF-8 at byte offset {}: {} (byte 0x{:02X})",
                                              what, i, why, s[i]));
    }
    i += len;
  }
}

// ---- encoding ordinary text --------------------------------------------------

PieceEncoder::PieceEncoder(const Vocabulary& v) : v_(v), cache_(kCacheSlots) {}

void PieceEncoder::encode(std::string_view text, std::vector<int64_t>& out) {
  for_each_piece(text, [&](std::string_view piece) {
    if (piece.size() == 1) {
      out.push_back(v_.byte_token[static_cast<unsigned char>(piece[0])]);
      return;
    }
    // A piece that is a token is that token (tiktoken does the same, before any merging).
    const uint64_t h = hash_bytes(piece);
    const int32_t id = v_.find(piece, h);
    if (id >= 0) {
      out.push_back(id);
      return;
    }
    if (piece.size() > kMaxCachedBytes) {
      bpe_merge(v_, piece, out);
      return;
    }
    Slot& slot = cache_[h & (kCacheSlots - 1)];
    if (slot.piece != piece) {
      slot.piece.assign(piece);
      slot.ids.clear();
      bpe_merge(v_, piece, slot.ids);
    }
    out.insert(out.end(), slot.ids.begin(), slot.ids.end());
  });
}

// ---- where encode_parallel may cut -------------------------------------------

namespace {

// The start of the character that ends at byte p (exclusive) of valid UTF-8.
size_t char_start_before(std::string_view text, size_t p) {
  size_t q = p - 1;
  while (q > 0 && (static_cast<unsigned char>(text[q]) & 0xC0) == 0x80) --q;
  return q;
}

bool is_space_at(std::string_view text, size_t q) {
  return char_class(
             decode_valid_utf8(reinterpret_cast<const unsigned char*>(text.data()) + q).cp) ==
         CharClass::kSpace;
}

}  // namespace

bool is_safe_cut(std::string_view text, size_t p) {
  if (p == 0 || p >= text.size()) return false;
  const auto byte = [&](size_t q) { return static_cast<unsigned char>(text[q]); };
  if ((byte(p) & 0xC0) == 0x80) return false;  // inside a character
  if (byte(p) == ' ') {
    // " X..." after \S: the space starts the piece " ?X+" whatever class X is.
    return p + 1 < text.size() && !is_space_at(text, char_start_before(text, p)) &&
           !is_space_at(text, p + 1);
  }
  if (byte(p - 1) == '\n' && p >= 2) {
    // "\S\n|\S": the newline is a \s run of one followed by \S, so \s+(?!\S)
    // fails and \s+ takes it alone; at the end of text[0, p) \s+(?!\S) takes
    // it alone. Either way the piece is "\n" and the next starts at p.
    return !is_space_at(text, char_start_before(text, p - 1)) && !is_space_at(text, p);
  }
  return false;
}

std::vector<size_t> cut_points(std::string_view text, size_t parts) {
  std::vector<size_t> cuts;
  if (parts < 2) return cuts;
  const size_t share = text.size() / parts;
  size_t p = 0;
  for (size_t k = 1; k < parts; ++k) {
    p = std::max(p + 1, k * share);
    while (p < text.size() && !is_safe_cut(text, p)) ++p;
    if (p >= text.size()) break;
    cuts.push_back(p);
  }
  return cuts;
}

// ---- Tokenizer ----------------------------------------------------------------

namespace {

const std::string kEndOfText = "<|endoftext|>";

std::string read_file(const std::string& path, const char* what) {
  std::ifstream in(path, std::ios::binary);
  if (!in)
    throw std::runtime_error(
        fmt::format("cannot read the {} '{}': {}", what, printable(path), std::strerror(errno)));
  std::ostringstream s;
  s << in.rdbuf();
  if (in.bad())
    throw std::runtime_error(fmt::format("cannot read the {} '{}'", what, printable(path)));
  return s.str();
}

bool is_file(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

// A stretch of the text to encode: ordinary text, or one special token.
struct Segment {
  std::string_view text;
  int64_t special = -1;
};

std::vector<Segment> segments(std::string_view text, bool allow_special, int64_t eot) {
  std::vector<Segment> out;
  if (!allow_special || eot < 0) {
    out.push_back({text});
    return out;
  }
  size_t i = 0;
  for (;;) {
    const size_t at = text.find(kEndOfText, i);
    if (at == std::string_view::npos) break;
    if (at > i) out.push_back({text.substr(i, at - i)});
    out.push_back({{}, eot});
    i = at + kEndOfText.size();
  }
  if (i < text.size()) out.push_back({text.substr(i)});
  return out;
}

}  // namespace

Tokenizer::Tokenizer(std::shared_ptr<const Vocabulary> vocab) : vocab_(std::move(vocab)) {}

namespace {

const std::shared_ptr<const Vocabulary>& gpt2_shared() {
  static const auto v = std::make_shared<const Vocabulary>(
      parse_vocabulary(gpt2_encoder_json(), gpt2_vocab_bpe(), "gpt2/encoder.json (embedded)",
                       "gpt2/vocab.bpe (embedded)"));
  return v;
}

}  // namespace

const Vocabulary& gpt2_vocabulary() { return *gpt2_shared(); }

const Tokenizer& Tokenizer::gpt2() {
  static const Tokenizer tok(gpt2_shared());
  return tok;
}

Tokenizer Tokenizer::from_files(const std::string& vocab_json, const std::string& merges_txt) {
  const std::string vocab = read_file(vocab_json, "vocabulary file");
  const std::string merges = read_file(merges_txt, "merges file");
  return Tokenizer(
      std::make_shared<const Vocabulary>(parse_vocabulary(vocab, merges, vocab_json, merges_txt)));
}

Tokenizer Tokenizer::from_directory(const std::string& dir) {
  const std::string vocab = dir + "/vocab.json", merges = dir + "/merges.txt";
  if (is_file(vocab) && is_file(merges)) return from_files(vocab, merges);
  return gpt2();
}

namespace {

// encode on one thread, for text already checked to be valid UTF-8.
std::vector<int64_t> encode_valid(const Vocabulary& v, std::string_view text, bool allow_special) {
  std::vector<int64_t> ids;
  ids.reserve(text.size() / 4 + 16);
  PieceEncoder encoder(v);
  for (const Segment& s : segments(text, allow_special, v.eot)) {
    if (s.special >= 0)
      ids.push_back(s.special);
    else
      encoder.encode(s.text, ids);
  }
  return ids;
}

}  // namespace

std::vector<int64_t> Tokenizer::encode(std::string_view text, bool allow_special) const {
  validate_utf8(text, "Tokenizer::encode");
  return encode_valid(*vocab_, text, allow_special);
}

std::vector<int64_t> Tokenizer::encode_parallel(std::string_view text, bool allow_special,
                                                int threads) const {
  if (threads < 0)
    throw std::invalid_argument(
        fmt::format("Tokenizer::encode_parallel: threads must be >= 0, got {}", threads));
  validate_utf8(text, "Tokenizer::encode_parallel");
  const int nthreads = threads == 0 ? omp_get_max_threads() : threads;
  // Work items: each ordinary segment cut into pieces of about kChunkBytes at
  // safe cuts, and each special token on its own.
  constexpr size_t kChunkBytes = size_t{1} << 16;
  std::vector<Segment> work;
  for (const Segment& s : segments(text, allow_special, vocab_->eot)) {
    if (s.special >= 0 || s.text.size() < 2 * kChunkBytes) {
      work.push_back(s);
      continue;
    }
    size_t begin = 0;
    for (size_t cut : cut_points(s.text, s.text.size() / kChunkBytes)) {
      work.push_back({s.text.substr(begin, cut - begin)});
      begin = cut;
    }
    work.push_back({s.text.substr(begin)});
  }
  if (work.size() <= 1 || nthreads == 1)  // one item, or none (empty text with allow_special)
    return encode_valid(*vocab_, text, allow_special);  // nothing to share
  // Plain threads taking work items in order from a shared counter (the
  // calling thread is one of them); no OpenMP team, whose idle threads spin
  // after the region and take the cores from the serial work around it.
  std::vector<std::vector<int64_t>> parts(work.size());
  std::atomic<size_t> next{0};
  std::mutex failure_mutex;
  std::exception_ptr failure;  // the first exception of any thread (bad_alloc)
  auto worker = [&] {
    try {
      PieceEncoder encoder(*vocab_);  // one cache per thread
      for (size_t k = next.fetch_add(1); k < work.size(); k = next.fetch_add(1)) {
        const Segment& s = work[k];
        if (s.special >= 0) {
          parts[k].push_back(s.special);
        } else {
          parts[k].reserve(s.text.size() / 4 + 16);
          encoder.encode(s.text, parts[k]);
        }
      }
    } catch (...) {
      std::lock_guard lock(failure_mutex);
      if (!failure) failure = std::current_exception();
      next = work.size();  // the others stop too
    }
  };
  {
    std::vector<std::jthread> helpers;
    const size_t extra = std::min(work.size(), static_cast<size_t>(nthreads)) - 1;
    for (size_t t = 0; t < extra; ++t) helpers.emplace_back(worker);
    worker();
  }  // the helpers join here
  if (failure) std::rethrow_exception(failure);
  size_t total = 0;
  for (const auto& p : parts) total += p.size();
  std::vector<int64_t> ids;
  ids.reserve(total);
  for (const auto& p : parts) ids.insert(ids.end(), p.begin(), p.end());
  return ids;
}

const std::string& Tokenizer::token_bytes(int64_t id) const {
  if (id < 0 || id >= vocab_size())
    throw std::out_of_range(
        fmt::format("token id {} is out of range (vocabulary size {})", id, vocab_size()));
  return vocab_->tokens[static_cast<size_t>(id)];
}

std::string Tokenizer::decode(std::span<const int64_t> ids) const {
  std::string text;
  for (const int64_t id : ids) text += token_bytes(id);
  return text;
}

int64_t Tokenizer::vocab_size() const { return static_cast<int64_t>(vocab_->tokens.size()); }

int64_t Tokenizer::eot_token() const { return vocab_->eot; }

// ---- StreamDecoder ------------------------------------------------------------

StreamDecoder::StreamDecoder(const Tokenizer& tok) : tok_(&tok) {}

namespace {

// How many bytes at the end of s are the start of a UTF-8 character that the
// next bytes may still complete (0 if none): a lead byte followed by fewer
// continuation bytes than it announces, each still valid for that lead byte.
size_t incomplete_tail(std::string_view s) {
  const size_t n = s.size();
  for (size_t back = 1; back <= 3 && back <= n; ++back) {
    const auto b = static_cast<unsigned char>(s[n - back]);
    if ((b & 0xC0) == 0x80) continue;  // a continuation byte: look further back
    size_t len = 0;
    if (b >= 0xC2 && b <= 0xDF)
      len = 2;
    else if (b >= 0xE0 && b <= 0xEF)
      len = 3;
    else if (b >= 0xF0 && b <= 0xF4)
      len = 4;
    if (len <= back) return 0;  // ASCII, an invalid lead, or a complete character
    // The second byte's range depends on the lead (no overlongs, surrogates or > U+10FFFF).
    if (back >= 2) {
      const auto b1 = static_cast<unsigned char>(s[n - back + 1]);
      if ((b == 0xE0 && b1 < 0xA0) || (b == 0xED && b1 > 0x9F) || (b == 0xF0 && b1 < 0x90) ||
          (b == 0xF4 && b1 > 0x8F))
        return 0;
    }
    return back;
  }
  return 0;
}

}  // namespace

std::string StreamDecoder::push(int64_t id) {
  pending_ += tok_->token_bytes(id);
  const size_t hold = incomplete_tail(pending_);
  std::string ready = pending_.substr(0, pending_.size() - hold);
  pending_.erase(0, pending_.size() - hold);
  return ready;
}

std::string StreamDecoder::flush() {
  std::string rest;
  rest.swap(pending_);
  return rest;
}

void write_gpt2_vocabulary(const std::string& dir) {
  io::write_file_atomically(dir + "/vocab.json", gpt2_encoder_json());
  io::write_file_atomically(dir + "/merges.txt", gpt2_vocab_bpe());
}

std::string gpt2_tokenizer_json() {
  using Json = nlohmann::ordered_json;
  const Json vocab = Json::parse(gpt2_encoder_json());
  Json merges = Json::array();
  std::string_view bpe = gpt2_vocab_bpe();
  while (!bpe.empty()) {
    const size_t eol = bpe.find('\n');
    std::string_view line = bpe.substr(0, eol);
    bpe = eol == std::string_view::npos ? std::string_view{} : bpe.substr(eol + 1);
    if (line.empty() || line.starts_with("#version")) continue;
    const size_t space = line.find(' ');
    merges.push_back(
        Json::array({std::string(line.substr(0, space)), std::string(line.substr(space + 1))}));
  }
  const auto byte_level = [](bool prefix_space, bool trim_offsets) {
    return Json{{"type", "ByteLevel"},
                {"add_prefix_space", prefix_space},
                {"trim_offsets", trim_offsets},
                {"use_regex", true}};
  };
  Json j;
  j["version"] = "1.0";
  j["truncation"] = nullptr;
  j["padding"] = nullptr;
  j["added_tokens"] = Json::array({Json{{"id", 50256},
                                        {"content", "<|endoftext|>"},
                                        {"single_word", false},
                                        {"lstrip", false},
                                        {"rstrip", false},
                                        {"normalized", true},
                                        {"special", true}}});
  j["normalizer"] = nullptr;
  j["pre_tokenizer"] = byte_level(false, true);
  j["post_processor"] = byte_level(true, false);
  j["decoder"] = byte_level(true, true);
  j["model"] = Json{{"type", "BPE"},
                    {"dropout", nullptr},
                    {"unk_token", nullptr},
                    {"continuing_subword_prefix", ""},
                    {"end_of_word_suffix", ""},
                    {"fuse_unk", false},
                    {"byte_fallback", false},
                    {"ignore_merges", false},
                    {"vocab", vocab},
                    {"merges", merges}};
  return j.dump(2) + "\n";
}

}  // namespace attn::text
