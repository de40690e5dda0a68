// tokenizer.json tokenizers (attn/hf_tokenizer.h): the components of Hugging
// Face's `tokenizers` that today's open models use, read from the file and
// run in its order.
#define PCRE2_CODE_UNIT_WIDTH 8
#include "attn/hf_tokenizer.h"

#include <fmt/format.h>
#include <pcre2.h>
#include <sentencepiece_processor.h>
#include <utf8proc.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <queue>
#include <stdexcept>
#include <tuple>
#include <unordered_map>

#include "attn/read_file.h"
#include "attn/utf8.h"
#include "text/sentencepiece_proto.h"
#include "text/vocabulary.h"

namespace attn::text {
namespace {

using Json = nlohmann::json;

std::string named(std::string_view s) {
  std::string out = "'";
  out += printable(s);
  out += "'";
  return out;
}

// ---- regular expressions (PCRE2, JIT) ----------------------------------------------------------

// A compiled pattern: a tokenizer.json {"Regex": ...} or {"String": ...} (literal).
class Pattern {
 public:
  Pattern(const std::string& source, bool literal, const std::string& where) : source_(source) {
    int error = 0;
    PCRE2_SIZE offset = 0;
    const uint32_t flags =
        PCRE2_UTF | (literal ? PCRE2_LITERAL : PCRE2_UCP);  // (UCP: Unicode \s, \d, \w)
    code_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(source.data()), source.size(), flags, &error,
                          &offset, nullptr);
    if (code_ == nullptr) {
      PCRE2_UCHAR message[256];
      pcre2_get_error_message(error, message, sizeof message);
      throw std::invalid_argument(
          fmt::format("{}: the pattern {} does not compile at offset {}: {}", where, named(source),
                      offset, reinterpret_cast<char*>(message)));
    }
    pcre2_jit_compile(code_, PCRE2_JIT_COMPLETE);  // the interpreter where JIT is unavailable
  }
  Pattern(const Pattern&) = delete;
  Pattern& operator=(const Pattern&) = delete;
  ~Pattern() { pcre2_code_free(code_); }

  // The non-empty, non-overlapping matches [begin, end) of valid UTF-8 s, left to right.
  std::vector<std::pair<size_t, size_t>> find_all(std::string_view s) const {
    std::vector<std::pair<size_t, size_t>> out;
    pcre2_match_data* md = pcre2_match_data_create_from_pattern(code_, nullptr);
    size_t start = 0;
    while (start <= s.size()) {
      const int rc = pcre2_match(code_, reinterpret_cast<PCRE2_SPTR>(s.data()), s.size(), start,
                                 PCRE2_NO_UTF_CHECK, md, nullptr);
      if (rc == PCRE2_ERROR_NOMATCH) break;
      if (rc < 0) {
        pcre2_match_data_free(md);
        throw std::runtime_error(fmt::format(
            "tokenizer: the pattern {} failed on the text (PCRE2 error {})", named(source_), rc));
      }
      const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
      const size_t b = ov[0], e = ov[1];
      if (e > b) {
        out.emplace_back(b, e);
        start = e;
      } else {  // an empty match: nothing to keep; try again one character on
        if (b >= s.size()) break;
        char32_t cp = 0;
        start = b + std::max<size_t>(1, utf8_sequence(s, b, cp));
      }
    }
    pcre2_match_data_free(md);
    return out;
  }
  const std::string& source() const { return source_; }

 private:
  std::string source_;
  pcre2_code* code_ = nullptr;
};

// {"String": s} or {"Regex": r}.
std::shared_ptr<const Pattern> pattern_of(const Json& j, const std::string& where) {
  if (j.is_object() && j.size() == 1 && j.begin().value().is_string()) {
    const std::string kind = j.begin().key();
    if (kind == "String" || kind == "Regex") {
      return std::make_shared<const Pattern>(j.begin().value().get<std::string>(), kind == "String",
                                             where);
    }
  }
  throw std::invalid_argument(
      fmt::format("{}: a pattern must be {{\"String\": ...}} or {{\"Regex\": ...}}, got {}", where,
                  printable(j.dump(), 200)));
}

std::string replace_all(const Pattern& p, std::string_view s, std::string_view content) {
  std::string out;
  size_t at = 0;
  for (const auto& [b, e] : p.find_all(s)) {
    out.append(s.substr(at, b - at));
    out.append(content);
    at = e;
  }
  out.append(s.substr(at));
  return out;
}

// ---- pieces of json ---------------------------------------------------------------------------

struct Ctx {
  const std::string& file;
  std::string where(const std::string& what) const {
    return fmt::format("{}: {}", named(file), what);
  }
};

const Json& field(const Json& j, const char* key, const Ctx& c, const char* component) {
  if (!j.is_object() || !j.contains(key)) {
    throw std::invalid_argument(c.where(fmt::format("{} has no \"{}\"", component, key)));
  }
  return j.at(key);
}

std::string string_field(const Json& j, const char* key, const Ctx& c, const char* component) {
  const Json& v = field(j, key, c, component);
  if (!v.is_string()) {
    throw std::invalid_argument(c.where(
        fmt::format("{}.{} must be a string, got {}", component, key, printable(v.dump(), 100))));
  }
  return v.get<std::string>();
}

bool bool_field(const Json& j, const char* key, bool fallback, const Ctx& c,
                const char* component) {
  if (!j.contains(key) || j.at(key).is_null()) return fallback;
  if (!j.at(key).is_boolean()) {
    throw std::invalid_argument(c.where(fmt::format(
        "{}.{} must be true or false, got {}", component, key, printable(j.at(key).dump(), 100))));
  }
  return j.at(key).get<bool>();
}

std::string type_of(const Json& j, const Ctx& c, const char* component) {
  return string_field(j, "type", c, component);
}

// ---- normalizers ------------------------------------------------------------------------------

struct Normalizer {
  enum class Kind { kUnicode, kReplace, kPrepend, kSequence } kind = Kind::kSequence;
  std::string type;
  int utf8proc_options = 0;                // kUnicode
  std::shared_ptr<const Pattern> pattern;  // kReplace
  std::string content;                     // kReplace, kPrepend
  std::vector<Normalizer> children;        // kSequence

  std::string apply(std::string s) const {
    switch (kind) {
      case Kind::kUnicode: {
        utf8proc_uint8_t* out = nullptr;
        const utf8proc_ssize_t n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(s.data()),
                                                static_cast<utf8proc_ssize_t>(s.size()), &out,
                                                static_cast<utf8proc_option_t>(utf8proc_options));
        if (n < 0) {
          throw std::invalid_argument(
              fmt::format("tokenizer: {} failed: {}", type, utf8proc_errmsg(n)));
        }
        std::string r(reinterpret_cast<char*>(out), static_cast<size_t>(n));
        std::free(out);
        return r;
      }
      case Kind::kReplace:
        return replace_all(*pattern, s, content);
      case Kind::kPrepend:
        return s.empty() ? s : content + s;
      case Kind::kSequence:
        for (const Normalizer& n : children) s = n.apply(std::move(s));
        return s;
    }
    return s;
  }
};

Normalizer normalizer_of(const Json& j, const Ctx& c) {
  Normalizer n;
  n.type = type_of(j, c, "normalizer");
  const std::string& t = n.type;
  if (t == "NFC" || t == "NFD" || t == "NFKC" || t == "NFKD") {
    n.kind = Normalizer::Kind::kUnicode;
    n.utf8proc_options = UTF8PROC_STABLE | (t[2] == 'K' ? UTF8PROC_COMPAT : 0) |
                         (t.back() == 'C' ? UTF8PROC_COMPOSE : UTF8PROC_DECOMPOSE);
  } else if (t == "Replace") {
    n.kind = Normalizer::Kind::kReplace;
    n.pattern = pattern_of(field(j, "pattern", c, "Replace"), c.where("normalizer Replace"));
    n.content = string_field(j, "content", c, "Replace");
  } else if (t == "Prepend") {
    n.kind = Normalizer::Kind::kPrepend;
    n.content = string_field(j, "prepend", c, "Prepend");
  } else if (t == "Sequence") {
    n.kind = Normalizer::Kind::kSequence;
    const Json& list = field(j, "normalizers", c, "Sequence");
    if (!list.is_array())
      throw std::invalid_argument(c.where("normalizer Sequence.normalizers must be a list"));
    for (const Json& x : list) n.children.push_back(normalizer_of(x, c));
  } else {
    throw std::invalid_argument(c.where(
        fmt::format("normalizer {}; attn reads NFC, NFD, NFKC, NFKD, Replace, Prepend and Sequence",
                    named(t))));
  }
  return n;
}

// ---- pre-tokenizers ---------------------------------------------------------------------------

enum class Behavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

// The pieces of s by a pattern's matches, as tokenizers' NormalizedString::split.
std::vector<std::string> split(std::string_view s, const Pattern& p, Behavior behavior,
                               bool invert) {
  // (begin, end, is_match) covering s.
  std::vector<std::tuple<size_t, size_t, bool>> parts;
  size_t prev = 0;
  for (const auto& [b, e] : p.find_all(s)) {
    if (b > prev) parts.emplace_back(prev, b, false);
    parts.emplace_back(b, e, true);
    prev = e;
  }
  if (prev < s.size()) parts.emplace_back(prev, s.size(), false);
  if (invert) {
    for (auto& part : parts) std::get<2>(part) = !std::get<2>(part);
  }
  std::vector<std::pair<size_t, size_t>> spans;
  switch (behavior) {
    case Behavior::kIsolated:
      for (const auto& [b, e, m] : parts) spans.emplace_back(b, e);
      break;
    case Behavior::kRemoved:
      for (const auto& [b, e, m] : parts) {
        if (!m) spans.emplace_back(b, e);
      }
      break;
    case Behavior::kMergedWithPrevious: {
      bool previous_match = false;
      for (const auto& [b, e, m] : parts) {
        if (m && !previous_match && !spans.empty()) {
          spans.back().second = e;
        } else {
          spans.emplace_back(b, e);
        }
        previous_match = m;
      }
      break;
    }
    case Behavior::kMergedWithNext: {
      bool previous_match = false;
      for (auto it = parts.rbegin(); it != parts.rend(); ++it) {
        const auto& [b, e, m] = *it;
        if (m && !previous_match && !spans.empty()) {
          spans.back().first = b;
        } else {
          spans.emplace_back(b, e);
        }
        previous_match = m;
      }
      std::reverse(spans.begin(), spans.end());
      break;
    }
    case Behavior::kContiguous: {
      bool previous_match = false;
      bool first = true;
      for (const auto& [b, e, m] : parts) {
        if (!first && m == previous_match) {
          spans.back().second = e;
        } else {
          spans.emplace_back(b, e);
        }
        previous_match = m;
        first = false;
      }
      break;
    }
  }
  std::vector<std::string> out;
  for (const auto& [b, e] : spans) {
    if (e > b) out.emplace_back(s.substr(b, e - b));
  }
  return out;
}

// GPT-2's pattern, what ByteLevel's use_regex splits by.
constexpr const char* kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
constexpr const char* kSpaceMark = "\u2581";  // ▁

// Metaspace's prepend_scheme (or the older add_prefix_space), for its
// pre-tokenizer and its decoder alike.
enum class PrependScheme { kAlways, kFirst, kNever };
PrependScheme prepend_scheme_of(const Json& j, const Ctx& c) {
  const std::string scheme = j.contains("prepend_scheme")
                                 ? string_field(j, "prepend_scheme", c, "Metaspace")
                             : bool_field(j, "add_prefix_space", true, c, "Metaspace") ? "always"
                                                                                       : "never";
  if (scheme == "always") return PrependScheme::kAlways;
  if (scheme == "first") return PrependScheme::kFirst;
  if (scheme == "never") return PrependScheme::kNever;
  throw std::invalid_argument(c.where(fmt::format("Metaspace.prepend_scheme {}", named(scheme))));
}

struct PreTokenizer {
  enum class Kind { kSplit, kByteLevel, kMetaspace, kSequence } kind = Kind::kSequence;
  std::string type;
  std::shared_ptr<const Pattern> pattern;  // kSplit; kByteLevel with use_regex
  Behavior behavior = Behavior::kIsolated;
  bool invert = false;
  bool add_prefix_space = false;         // kByteLevel
  std::string replacement = kSpaceMark;  // kMetaspace
  PrependScheme prepend = PrependScheme::kAlways;  // kMetaspace
  bool split_pieces = true;            // kMetaspace
  std::vector<PreTokenizer> children;  // kSequence

  // first: the pieces come from the start of the text (Metaspace's "first").
  void apply(std::vector<std::string>& pieces, bool first) const {
    std::vector<std::string> out;
    switch (kind) {
      case Kind::kSplit:
        for (const std::string& p : pieces) {
          for (std::string& q : split(p, *pattern, behavior, invert)) out.push_back(std::move(q));
        }
        break;
      case Kind::kByteLevel:
        for (std::string p : pieces) {
          if (add_prefix_space && !p.starts_with(' ')) p.insert(p.begin(), ' ');
          std::vector<std::string> parts;
          if (pattern) {
            parts = split(p, *pattern, Behavior::kIsolated, false);
          } else {
            parts.push_back(std::move(p));
          }
          for (const std::string& q : parts) out.push_back(token_to_unicode_form(q));
        }
        break;
      case Kind::kMetaspace: {
        const Pattern space(" ", true, "Metaspace");
        const Pattern rep(replacement, true, "Metaspace");
        for (size_t i = 0; i < pieces.size(); ++i) {
          std::string p = replace_all(space, pieces[i], replacement);
          const bool add = prepend == PrependScheme::kAlways ||
                           (prepend == PrependScheme::kFirst && first && i == 0);
          if (add && !p.starts_with(replacement)) p = replacement + p;
          if (split_pieces) {
            for (std::string& q : split(p, rep, Behavior::kMergedWithNext, false))
              out.push_back(std::move(q));
          } else if (!p.empty()) {
            out.push_back(std::move(p));
          }
        }
        break;
      }
      case Kind::kSequence:
        for (const PreTokenizer& t : children) t.apply(pieces, first);
        return;
    }
    pieces = std::move(out);
  }
};

Behavior behavior_of(const std::string& name, const Ctx& c) {
  if (name == "Removed") return Behavior::kRemoved;
  if (name == "Isolated") return Behavior::kIsolated;
  if (name == "MergedWithPrevious") return Behavior::kMergedWithPrevious;
  if (name == "MergedWithNext") return Behavior::kMergedWithNext;
  if (name == "Contiguous") return Behavior::kContiguous;
  throw std::invalid_argument(
      c.where(fmt::format("Split.behavior {} is not a tokenizers behaviour", named(name))));
}

PreTokenizer pre_tokenizer_of(const Json& j, const Ctx& c) {
  PreTokenizer p;
  p.type = type_of(j, c, "pre_tokenizer");
  const std::string& t = p.type;
  if (t == "Split") {
    p.kind = PreTokenizer::Kind::kSplit;
    p.pattern = pattern_of(field(j, "pattern", c, "Split"), c.where("pre_tokenizer Split"));
    p.behavior = behavior_of(string_field(j, "behavior", c, "Split"), c);
    p.invert = bool_field(j, "invert", false, c, "Split");
  } else if (t == "ByteLevel") {
    p.kind = PreTokenizer::Kind::kByteLevel;
    p.add_prefix_space = bool_field(j, "add_prefix_space", false, c, "ByteLevel");
    if (bool_field(j, "use_regex", true, c, "ByteLevel")) {
      p.pattern = std::make_shared<const Pattern>(kGpt2Pattern, false, "ByteLevel");
    }
  } else if (t == "Metaspace") {
    p.kind = PreTokenizer::Kind::kMetaspace;
    p.replacement = string_field(j, "replacement", c, "Metaspace");
    p.prepend = prepend_scheme_of(j, c);
    p.split_pieces = bool_field(j, "split", true, c, "Metaspace");
  } else if (t == "Sequence") {
    p.kind = PreTokenizer::Kind::kSequence;
    const Json& list = field(j, "pretokenizers", c, "Sequence");
    if (!list.is_array())
      throw std::invalid_argument(c.where("pre_tokenizer Sequence.pretokenizers must be a list"));
    for (const Json& x : list) p.children.push_back(pre_tokenizer_of(x, c));
  } else {
    throw std::invalid_argument(c.where(fmt::format(
        "pre_tokenizer {}; attn reads Split, ByteLevel, Metaspace and Sequence", named(t))));
  }
  return p;
}

// ---- decoders ---------------------------------------------------------------------------------

// GPT-2's unicode form back to bytes: the code point's byte, or -1.
int unicode_to_byte(char32_t cp) {
  static const std::unordered_map<char32_t, int> table = [] {
    std::unordered_map<char32_t, int> t;
    for (int b = 0; b < 256; ++b) t[byte_to_unicode(static_cast<unsigned char>(b))] = b;
    return t;
  }();
  const auto it = table.find(cp);
  return it == table.end() ? -1 : it->second;
}

// "<0x41>" -> 0x41; -1 for anything else.
int byte_token_value(std::string_view t) {
  if (t.size() != 6 || !t.starts_with("<0x") || t[5] != '>') return -1;
  int v = 0;
  for (size_t i = 3; i < 5; ++i) {
    const char ch = t[i];
    const int d = ch >= '0' && ch <= '9' ? ch - '0' : ch >= 'A' && ch <= 'F' ? ch - 'A' + 10 : -1;
    if (d < 0) return -1;
    v = v * 16 + d;
  }
  return v;
}

struct Decoder {
  enum class Kind {
    kByteLevel,
    kReplace,
    kByteFallback,
    kFuse,
    kStrip,
    kMetaspace,
    kSequence
  } kind = Kind::kSequence;
  std::string type;
  std::shared_ptr<const Pattern> pattern;  // kReplace
  std::string content;                     // kReplace; kStrip: one character
  char32_t strip_char = 0;
  int64_t start = 0, stop = 0;  // kStrip
  std::string replacement = kSpaceMark;
  bool prepend = true;  // kMetaspace: prepend_scheme != never
  std::vector<Decoder> children;

  void apply(std::vector<std::string>& tokens) const {
    switch (kind) {
      case Kind::kByteLevel: {
        std::string bytes;
        for (const std::string& t : tokens) {
          std::string mine;
          bool all = true;
          for (size_t i = 0; i < t.size();) {
            char32_t cp = 0;
            const size_t n = std::max<size_t>(1, utf8_sequence(t, i, cp));
            const int b = unicode_to_byte(cp);
            if (b < 0) {
              all = false;
              break;
            }
            mine.push_back(static_cast<char>(b));
            i += n;
          }
          bytes += all ? mine : t;
        }
        tokens.assign(1, utf8_replacing_invalid(bytes));
        return;
      }
      case Kind::kReplace:
        for (std::string& t : tokens) t = replace_all(*pattern, t, content);
        return;
      case Kind::kByteFallback: {
        std::vector<std::string> out;
        std::string pending;  // consecutive byte tokens
        size_t count = 0;
        const auto flush = [&] {
          if (count == 0) return;
          if (utf8_replacing_invalid(pending) == pending) {
            out.push_back(pending);
          } else {
            for (size_t i = 0; i < count; ++i) out.emplace_back("\uFFFD");
          }
          pending.clear();
          count = 0;
        };
        for (std::string& t : tokens) {
          const int b = byte_token_value(t);
          if (b >= 0) {
            pending.push_back(static_cast<char>(b));
            ++count;
          } else {
            flush();
            out.push_back(std::move(t));
          }
        }
        flush();
        tokens = std::move(out);
        return;
      }
      case Kind::kFuse: {
        std::string all;
        for (const std::string& t : tokens) all += t;
        tokens.assign(1, all);
        return;
      }
      case Kind::kStrip:
        for (std::string& t : tokens) {
          const std::vector<char32_t> cps = decode_utf8(t);
          size_t b = 0, e = cps.size();
          for (int64_t i = 0; i < start && b < e && cps[b] == strip_char; ++i) ++b;
          for (int64_t i = 0; i < stop && e > b && cps[e - 1] == strip_char; ++i) --e;
          std::string r;
          for (size_t k = b; k < e; ++k) r += encode_utf8(cps[k]);
          t = r;
        }
        return;
      case Kind::kMetaspace:
        for (size_t i = 0; i < tokens.size(); ++i) {
          std::string r;
          const std::string& t = tokens[i];
          for (size_t at = 0; at < t.size();) {
            if (t.compare(at, replacement.size(), replacement) == 0) {
              if (!(i == 0 && prepend)) r.push_back(' ');
              at += replacement.size();
            } else {
              r.push_back(t[at++]);
            }
          }
          tokens[i] = r;
        }
        return;
      case Kind::kSequence:
        for (const Decoder& d : children) d.apply(tokens);
        return;
    }
  }
};

Decoder decoder_of(const Json& j, const Ctx& c) {
  Decoder d;
  d.type = type_of(j, c, "decoder");
  const std::string& t = d.type;
  if (t == "ByteLevel") {
    d.kind = Decoder::Kind::kByteLevel;
  } else if (t == "Replace") {
    d.kind = Decoder::Kind::kReplace;
    d.pattern = pattern_of(field(j, "pattern", c, "Replace"), c.where("decoder Replace"));
    d.content = string_field(j, "content", c, "Replace");
  } else if (t == "ByteFallback") {
    d.kind = Decoder::Kind::kByteFallback;
  } else if (t == "Fuse") {
    d.kind = Decoder::Kind::kFuse;
  } else if (t == "Strip") {
    d.kind = Decoder::Kind::kStrip;
    const std::vector<char32_t> cps = decode_utf8(string_field(j, "content", c, "Strip"));
    if (cps.size() != 1)
      throw std::invalid_argument(c.where("decoder Strip.content must be one character"));
    d.strip_char = cps[0];
    const auto count = [&](const char* key) {
      const Json& v = field(j, key, c, "Strip");
      if (!v.is_number_integer() || v.get<int64_t>() < 0) {
        throw std::invalid_argument(c.where(fmt::format("decoder Strip.{} must be a count, got {}",
                                                        key, printable(v.dump(), 100))));
      }
      return v.get<int64_t>();
    };
    d.start = count("start");
    d.stop = count("stop");
  } else if (t == "Metaspace") {
    d.kind = Decoder::Kind::kMetaspace;
    d.replacement = string_field(j, "replacement", c, "Metaspace");
    d.prepend = prepend_scheme_of(j, c) != PrependScheme::kNever;
  } else if (t == "Sequence") {
    d.kind = Decoder::Kind::kSequence;
    const Json& list = field(j, "decoders", c, "Sequence");
    if (!list.is_array())
      throw std::invalid_argument(c.where("decoder Sequence.decoders must be a list"));
    for (const Json& x : list) d.children.push_back(decoder_of(x, c));
  } else {
    throw std::invalid_argument(
        c.where(fmt::format("decoder {}; attn reads ByteLevel, Replace, ByteFallback, Fuse, Strip, "
                            "Metaspace and Sequence",
                            named(t))));
  }
  return d;
}

// ---- the BPE model ----------------------------------------------------------------------------

struct Bpe {
  std::unordered_map<std::string, int32_t> vocab;
  std::vector<std::string> tokens;  // id -> token ("" where the vocabulary has a hole)
  // (left id, right id) -> (rank, merged id)
  std::unordered_map<uint64_t, std::pair<uint32_t, int32_t>> merges;
  int32_t unk = -1;
  bool fuse_unk = false, byte_fallback = false, ignore_merges = false;
  int32_t byte_ids[256];

  static uint64_t key(int32_t a, int32_t b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  }

  void tokenize(std::string_view word, std::vector<int64_t>& out) const {
    if (word.empty()) return;
    if (ignore_merges) {
      const auto it = vocab.find(std::string(word));
      if (it != vocab.end()) {
        out.push_back(it->second);
        return;
      }
    }
    // The initial symbols: one per character (byte fallback, or unk).
    std::vector<int32_t> id;
    bool last_unk = false;
    for (size_t i = 0; i < word.size();) {
      char32_t cp = 0;
      const size_t n = std::max<size_t>(1, utf8_sequence(word, i, cp));
      const auto it = vocab.find(std::string(word.substr(i, n)));
      if (it != vocab.end()) {
        id.push_back(it->second);
        last_unk = false;
      } else {
        bool done = false;
        if (byte_fallback) {
          bool all = true;
          for (size_t k = 0; k < n; ++k)
            all = all && byte_ids[static_cast<unsigned char>(word[i + k])] >= 0;
          if (all) {
            for (size_t k = 0; k < n; ++k)
              id.push_back(byte_ids[static_cast<unsigned char>(word[i + k])]);
            done = true;
            last_unk = false;
          }
        }
        if (!done && unk >= 0) {
          if (!(fuse_unk && last_unk)) id.push_back(unk);
          last_unk = true;
        }
      }
      i += n;
    }
    // Merges, lowest rank first, leftmost on a tie: a heap of (rank, left) over a linked list.
    const size_t m = id.size();
    if (m < 2) {
      out.insert(out.end(), id.begin(), id.end());
      return;
    }
    std::vector<int64_t> next(m), prev(m);
    std::vector<bool> alive(m, true);
    for (size_t s = 0; s < m; ++s) {
      next[s] = static_cast<int64_t>(s) + 1;
      prev[s] = static_cast<int64_t>(s) - 1;
    }
    using Entry =
        std::tuple<uint32_t, int64_t, int32_t, int32_t, int32_t>;  // rank, left, lid, rid, new
    std::priority_queue<Entry, std::vector<Entry>, std::greater<>> heap;
    const auto push = [&](int64_t left) {
      if (left < 0 || next[left] >= static_cast<int64_t>(m)) return;
      const int64_t right = next[left];
      const auto it = merges.find(key(id[left], id[right]));
      if (it != merges.end())
        heap.emplace(it->second.first, left, id[left], id[right], it->second.second);
    };
    for (size_t s = 0; s + 1 < m; ++s) push(static_cast<int64_t>(s));
    while (!heap.empty()) {
      const auto [rank, left, lid, rid, merged] = heap.top();
      heap.pop();
      if (!alive[left] || id[left] != lid) continue;
      const int64_t right = next[left];
      if (right >= static_cast<int64_t>(m) || id[right] != rid) continue;
      id[left] = merged;
      alive[right] = false;
      next[left] = next[right];
      if (next[right] < static_cast<int64_t>(m)) prev[next[right]] = left;
      push(prev[left]);
      push(left);
    }
    for (int64_t s = 0; s < static_cast<int64_t>(m); s = next[s]) out.push_back(id[s]);
  }
};

Bpe bpe_of(const Json& j, const Ctx& c) {
  Bpe m;
  const std::string type = type_of(j, c, "model");
  if (type != "BPE") {
    throw std::invalid_argument(c.where(fmt::format("model {}; attn reads BPE", named(type))));
  }
  if (j.contains("dropout") && !j.at("dropout").is_null() &&
      !(j.at("dropout").is_number() && j.at("dropout").get<double>() == 0.0)) {
    throw std::invalid_argument(c.where("model BPE with dropout: attn encodes deterministically"));
  }
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    if (j.contains(key) && !j.at(key).is_null() && j.at(key) != "") {
      throw std::invalid_argument(
          c.where(fmt::format("model BPE with {}: attn reads neither prefix nor suffix", key)));
    }
  }
  m.fuse_unk = bool_field(j, "fuse_unk", false, c, "model");
  m.byte_fallback = bool_field(j, "byte_fallback", false, c, "model");
  m.ignore_merges = bool_field(j, "ignore_merges", false, c, "model");
  const Json& vocab = field(j, "vocab", c, "model");
  if (!vocab.is_object()) throw std::invalid_argument(c.where("model.vocab must be an object"));
  for (const auto& [token, v] : vocab.items()) {
    if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() >= (int64_t{1} << 30)) {
      throw std::invalid_argument(c.where(fmt::format("model.vocab[{}] must be an id, got {}",
                                                      named(token), printable(v.dump(), 100))));
    }
    const auto id = static_cast<int32_t>(v.get<int64_t>());
    if (!m.vocab.emplace(token, id).second) {
      throw std::invalid_argument(c.where(fmt::format("model.vocab has {} twice", named(token))));
    }
    if (static_cast<size_t>(id) >= m.tokens.size()) m.tokens.resize(static_cast<size_t>(id) + 1);
    if (!m.tokens[id].empty()) {
      throw std::invalid_argument(c.where(fmt::format("model.vocab gives id {} to {} and {}", id,
                                                      named(m.tokens[id]), named(token))));
    }
    m.tokens[id] = token;
  }
  const Json& merges = field(j, "merges", c, "model");
  if (!merges.is_array()) throw std::invalid_argument(c.where("model.merges must be a list"));
  uint32_t rank = 0;
  for (const Json& mj : merges) {
    std::string a, b;
    if (mj.is_string()) {  // the older "a b" form
      const std::string s = mj.get<std::string>();
      const size_t sp = s.find(' ');
      if (sp == std::string::npos || sp == 0 || sp + 1 == s.size() ||
          s.find(' ', sp + 1) != std::string::npos) {
        throw std::invalid_argument(c.where(fmt::format("merge {} is not two tokens", named(s))));
      }
      a = s.substr(0, sp);
      b = s.substr(sp + 1);
    } else if (mj.is_array() && mj.size() == 2 && mj[0].is_string() && mj[1].is_string()) {
      a = mj[0].get<std::string>();
      b = mj[1].get<std::string>();
    } else {
      throw std::invalid_argument(
          c.where(fmt::format("merge {} is not two tokens", printable(mj.dump(), 100))));
    }
    const auto ia = m.vocab.find(a), ib = m.vocab.find(b), iab = m.vocab.find(a + b);
    if (ia == m.vocab.end() || ib == m.vocab.end() || iab == m.vocab.end()) {
      throw std::invalid_argument(c.where(
          fmt::format("merge {} {} names a token the vocabulary lacks", named(a), named(b))));
    }
    m.merges.emplace(Bpe::key(ia->second, ib->second), std::make_pair(rank++, iab->second));
  }
  if (j.contains("unk_token") && !j.at("unk_token").is_null()) {
    const std::string unk = string_field(j, "unk_token", c, "model");
    const auto it = m.vocab.find(unk);
    if (it == m.vocab.end()) {
      throw std::invalid_argument(
          c.where(fmt::format("model.unk_token {} is not in the vocabulary", named(unk))));
    }
    m.unk = it->second;
  }
  for (int b = 0; b < 256; ++b) {
    const auto it = m.vocab.find(fmt::format("<0x{:02X}>", b));
    m.byte_ids[b] = it == m.vocab.end() ? -1 : it->second;
  }
  return m;
}

// ---- added tokens and the post-processor ------------------------------------------------------

struct AddedToken {
  std::string content;
  int64_t id = 0;
  bool special = false, lstrip = false, rstrip = false, normalized = false, single_word = false;
};

bool is_space(char32_t cp) {
  if (cp == ' ' || (cp >= 0x09 && cp <= 0x0D) || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
      (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F ||
      cp == 0x205F || cp == 0x3000) {
    return true;
  }
  return false;
}

bool is_word_char(char32_t cp) {
  const utf8proc_category_t cat = utf8proc_category(static_cast<utf8proc_int32_t>(cp));
  return (cat >= UTF8PROC_CATEGORY_LU && cat <= UTF8PROC_CATEGORY_LO) ||
         (cat >= UTF8PROC_CATEGORY_ND && cat <= UTF8PROC_CATEGORY_NO);
}

// The code point that ends just before byte i of valid UTF-8 s, and where it starts.
char32_t char_before(std::string_view s, size_t i, size_t* start = nullptr) {
  size_t b = i - 1;
  while (b > 0 && (static_cast<unsigned char>(s[b]) & 0xC0) == 0x80) --b;
  char32_t cp = 0;
  utf8_sequence(s, b, cp);
  if (start) *start = b;
  return cp;
}

struct Segment {
  std::string text;    // when id < 0
  int64_t id = -1;     // an added token
  bool first = false;  // the text starts the input
};

struct TemplatePiece {
  bool sequence = false;     // $A
  std::vector<int64_t> ids;  // a special token's ids
};

struct PostProcessor {
  enum class Kind { kNone, kTemplate, kByteLevel, kSequence } kind = Kind::kNone;
  std::string type;
  std::vector<TemplatePiece> single;
  std::vector<PostProcessor> children;

  void apply(std::vector<int64_t>& ids) const {
    switch (kind) {
      case Kind::kNone:
      case Kind::kByteLevel:
        return;
      case Kind::kTemplate: {
        std::vector<int64_t> out;
        for (const TemplatePiece& p : single) {
          if (p.sequence) {
            out.insert(out.end(), ids.begin(), ids.end());
          } else {
            out.insert(out.end(), p.ids.begin(), p.ids.end());
          }
        }
        ids = std::move(out);
        return;
      }
      case Kind::kSequence:
        for (const PostProcessor& p : children) p.apply(ids);
        return;
    }
  }
  // Every id a template puts in (checked against the vocabulary once it is known).
  void inserted_ids(std::vector<int64_t>& out) const {
    for (const TemplatePiece& p : single) out.insert(out.end(), p.ids.begin(), p.ids.end());
    for (const PostProcessor& child : children) child.inserted_ids(out);
  }
};

PostProcessor post_processor_of(const Json& j, const Ctx& c) {
  PostProcessor p;
  p.type = type_of(j, c, "post_processor");
  if (p.type == "ByteLevel") {
    p.kind = PostProcessor::Kind::kByteLevel;
  } else if (p.type == "Sequence") {
    p.kind = PostProcessor::Kind::kSequence;
    const Json& list = field(j, "processors", c, "Sequence");
    if (!list.is_array())
      throw std::invalid_argument(c.where("post_processor Sequence.processors must be a list"));
    for (const Json& x : list) p.children.push_back(post_processor_of(x, c));
  } else if (p.type == "TemplateProcessing") {
    p.kind = PostProcessor::Kind::kTemplate;
    const Json& specials = field(j, "special_tokens", c, "TemplateProcessing");
    const Json& single = field(j, "single", c, "TemplateProcessing");
    if (!single.is_array())
      throw std::invalid_argument(c.where("TemplateProcessing.single must be a list"));
    for (const Json& item : single) {
      TemplatePiece piece;
      if (item.contains("Sequence")) {
        if (string_field(item.at("Sequence"), "id", c, "TemplateProcessing.single") != "A") {
          throw std::invalid_argument(
              c.where("TemplateProcessing.single may hold only the sequence $A"));
        }
        piece.sequence = true;
      } else if (item.contains("SpecialToken")) {
        const std::string name =
            string_field(item.at("SpecialToken"), "id", c, "TemplateProcessing.single");
        if (!specials.is_object() || !specials.contains(name)) {
          throw std::invalid_argument(c.where(fmt::format(
              "TemplateProcessing names {}, which its special_tokens lack", named(name))));
        }
        const Json& ids = field(specials.at(name), "ids", c, "TemplateProcessing.special_tokens");
        if (!ids.is_array())
          throw std::invalid_argument(
              c.where("TemplateProcessing special_tokens ids must be a list"));
        for (const Json& id : ids) {
          if (!id.is_number_integer() || id.get<int64_t>() < 0) {
            throw std::invalid_argument(c.where(fmt::format(
                "TemplateProcessing: {} has id {}", named(name), printable(id.dump(), 100))));
          }
          piece.ids.push_back(id.get<int64_t>());
        }
      } else {
        throw std::invalid_argument(
            c.where(fmt::format("TemplateProcessing item {}", printable(item.dump(), 100))));
      }
      p.single.push_back(std::move(piece));
    }
  } else {
    throw std::invalid_argument(c.where(
        fmt::format("post_processor {}; attn reads TemplateProcessing, ByteLevel and Sequence",
                    named(p.type))));
  }
  return p;
}

std::string component_types(const Json& j) {
  if (j.is_null()) return "none";
  std::string t = j.value("type", std::string("?"));
  for (const char* key : {"normalizers", "pretokenizers", "decoders", "processors"}) {
    if (j.contains(key) && j.at(key).is_array()) {
      std::string inner;
      for (const Json& x : j.at(key)) inner += (inner.empty() ? "" : ", ") + component_types(x);
      t += "[" + inner + "]";
    }
  }
  return t;
}

}  // namespace

struct HfTokenizer::Impl {
  std::string name;
  // A SentencePiece model (from_sentencepiece): text between the added tokens
  // is its to encode and decode; normalizer, pre_tokenizer, model and decoder
  // are unused then (model.tokens and model.vocab hold its pieces for lookups).
  std::shared_ptr<const sentencepiece::SentencePieceProcessor> sp;
  // transformers' rule (from_sentencepiece) for a model that folds whitespace
  // or has a dummy prefix: the same model with neither, which encodes and
  // decodes every piece of text; sp_dummy_prefix: whether text gets the "▁"
  // (the model's add_dummy_prefix): every piece of text between specials
  // (legacy), or only the one at the very start (sp_prefix_first_only).
  std::shared_ptr<const sentencepiece::SentencePieceProcessor> sp_plain;
  bool sp_dummy_prefix = false, sp_prefix_first_only = false;
  int64_t sp_bos = -1;
  std::optional<Normalizer> normalizer;
  std::optional<PreTokenizer> pre_tokenizer;
  Bpe model;
  PostProcessor post;
  std::optional<Decoder> decoder;
  std::vector<AddedToken> added;  // longest first within each first byte
  std::unordered_map<int64_t, size_t> added_by_id;
  std::unordered_map<std::string, int64_t> added_by_content;
  int64_t vocab_size = 0;
  std::string description;
  bool first_byte[2][256] = {};  // [normalized][b]: some added token starts with byte b

  // Splits each text segment on the added tokens with this `normalized` flag.
  void split_added(std::vector<Segment>& segments, bool normalized) const {
    std::vector<Segment> out;
    for (Segment& seg : segments) {
      if (seg.id >= 0) {
        out.push_back(std::move(seg));
        continue;
      }
      const std::string& s = seg.text;
      size_t text_from = 0;  // where the pending text begins
      bool first = seg.first;
      const bool* starts = first_byte[normalized ? 1 : 0];
      for (size_t i = 0; i < s.size();) {
        if (!starts[static_cast<unsigned char>(s[i])]) {
          ++i;  // (a token's first byte is never a continuation byte, so i stays on a character)
          while (i < s.size() && (static_cast<unsigned char>(s[i]) & 0xC0) == 0x80) ++i;
          continue;
        }
        const AddedToken* best = nullptr;
        for (const AddedToken& t : added) {
          if (t.normalized != normalized || t.content.empty()) continue;
          if (s.compare(i, t.content.size(), t.content) != 0) continue;
          if (best != nullptr && best->content.size() >= t.content.size()) continue;
          if (t.single_word) {
            if (i > 0 && is_word_char(char_before(s, i))) continue;
            const size_t e = i + t.content.size();
            char32_t cp = 0;
            if (e < s.size() && utf8_sequence(s, e, cp) > 0 && is_word_char(cp)) continue;
          }
          best = &t;
        }
        if (best == nullptr) {
          char32_t cp = 0;
          i += std::max<size_t>(1, utf8_sequence(s, i, cp));
          continue;
        }
        size_t b = i, e = i + best->content.size();
        if (best->lstrip) {
          size_t at = b;
          while (at > text_from) {
            size_t start = 0;
            if (!is_space(char_before(s, at, &start))) break;
            at = start;
          }
          b = at;
        }
        if (best->rstrip) {
          char32_t cp = 0;
          size_t n = 0;
          while (e < s.size() && (n = utf8_sequence(s, e, cp)) > 0 && is_space(cp)) e += n;
        }
        if (b > text_from) out.push_back(Segment{s.substr(text_from, b - text_from), -1, first});
        out.push_back(Segment{std::string(), best->id, false});
        first = false;
        text_from = e;
        i = e;
      }
      if (text_from < s.size()) out.push_back(Segment{s.substr(text_from), -1, first});
    }
    segments = std::move(out);
  }
};

namespace {
HfTokenizer load_tokenizer_file(const std::string& path, const SentencePieceOptions& options);
}  // namespace

HfTokenizer HfTokenizer::from_file(const std::string& path) {
  return load_tokenizer_file(path, {});
}

namespace {
HfTokenizer load_tokenizer_file(const std::string& path, const SentencePieceOptions& options) {
  const std::string bytes = read_file(path);  // a regular file, at most 4 GiB
  // By the contents: JSON starts with '{'; a rank file is lines of base64, a
  // space and a number; anything else must be a SentencePiece ModelProto.
  const size_t first = bytes.find_first_not_of(" \t\r\n");
  if (first != std::string::npos && bytes[first] == '{') return HfTokenizer::from_json(bytes, path);
  const size_t eol = std::min(bytes.find('\n'), bytes.size());
  const std::string_view line(bytes.data(), eol);
  const size_t space = line.find(' ');
  const auto is_b64 = [](char ch) {
    return std::isalnum(static_cast<unsigned char>(ch)) || ch == '+' || ch == '/' || ch == '=';
  };
  if (space != std::string_view::npos && space > 0 && space + 1 < line.size() &&
      std::all_of(line.begin(), line.begin() + static_cast<std::ptrdiff_t>(space), is_b64) &&
      std::all_of(line.begin() + static_cast<std::ptrdiff_t>(space) + 1, line.end(), [](char ch) {
        return std::isdigit(static_cast<unsigned char>(ch)) || ch == '\r';
      })) {
    return HfTokenizer::from_tiktoken(bytes, path);
  }
  return HfTokenizer::from_sentencepiece(bytes, path, options);
}
}  // namespace

namespace {
// A model directory's tokenizer_config.json, as a SentencePiece model reads
// it: "legacy" (a Llama tokenizer's; false when absent) and "add_bos_token"
// (true when absent); defaults when the directory has none.
SentencePieceOptions sentencepiece_options(const std::string& dir) {
  SentencePieceOptions options;
  const std::string config = dir + "/tokenizer_config.json";
  if (!std::ifstream(config, std::ios::binary)) return options;
  Json j;
  try {
    j = Json::parse(read_file(config));
  } catch (const Json::exception& e) {
    throw std::invalid_argument(
        fmt::format("{}: not JSON ({})", named(config), printable(e.what(), 200)));
  }
  for (auto [key, flag] :
       {std::pair{"legacy", &options.legacy}, std::pair{"add_bos_token", &options.add_bos_token}}) {
    if (!j.is_object() || !j.contains(key) || j[key].is_null()) continue;
    if (!j[key].is_boolean())
      throw std::invalid_argument(
          fmt::format("{}: \"{}\" must be true or false", named(config), key));
    *flag = j[key].get<bool>();
  }
  return options;
}
}  // namespace

HfTokenizer HfTokenizer::from_directory(const std::string& dir) {
  // (tokenizer_config.json is read for a tokenizer.model only: a tokenizer.json
  // holds its whole pipeline.)
  for (const char* name : {"tokenizer.json", "tokenizer.model", "original/tokenizer.model"}) {
    const std::string path = dir + "/" + name;
    std::ifstream probe(path, std::ios::binary);
    if (!probe) continue;
    if (name == std::string_view("tokenizer.json")) return from_file(path);
    return load_tokenizer_file(path, sentencepiece_options(dir));
  }
  throw std::invalid_argument(fmt::format(
      "{} has no tokenizer.json, tokenizer.model or original/tokenizer.model", named(dir)));
}

HfTokenizer HfTokenizer::from_tiktoken(std::string_view ranks, const std::string& name) {
  return from_json(tiktoken_to_json(ranks, name), name);
}

HfTokenizer HfTokenizer::from_sentencepiece(std::string_view model, const std::string& name,
                                            const SentencePieceOptions& options) {
  auto load = [&](std::string_view proto) {
    auto sp = std::make_shared<sentencepiece::SentencePieceProcessor>();
    const auto status = sp->LoadFromSerializedProto(proto);
    if (!status.ok()) {
      throw std::invalid_argument(fmt::format(
          "tokenizer {}: not a tokenizer.json, a tiktoken rank file or a SentencePiece model "
          "(libsentencepiece: {})",
          named(name), printable(status.ToString(), 200)));
    }
    return sp;
  };
  const auto sp = load(model);  // (a model libsentencepiece reads is a well-formed message)
  auto impl = std::make_shared<Impl>();
  impl->name = name;
  impl->sp = sp;
  const SentencePieceNormalizerFlags flags = sentencepiece_normalizer_flags(model, named(name));
  if (flags.add_dummy_prefix || flags.remove_extra_whitespaces) {
    impl->sp_plain = load(sentencepiece_without_dummy_prefix(model, named(name)));
    impl->sp_dummy_prefix = flags.add_dummy_prefix;
    impl->sp_prefix_first_only = !options.legacy;
  }
  impl->sp_bos = options.add_bos_token ? sp->bos_id() : -1;
  const int n = sp->GetPieceSize();
  impl->vocab_size = n;
  impl->model.tokens.resize(static_cast<size_t>(n));
  int64_t bytes = 0, control = 0;
  for (int id = 0; id < n; ++id) {
    const std::string& piece = sp->IdToPiece(id);
    impl->model.tokens[static_cast<size_t>(id)] = piece;
    impl->model.vocab.emplace(piece, id);
    bytes += sp->IsByte(id) ? 1 : 0;
    // Control pieces and <unk>: special tokens, matched in the text before
    // sentencepiece sees it (transformers' converted tokenizers match them so).
    if (sp->IsControl(id) || sp->IsUnknown(id)) {
      AddedToken t;
      t.content = piece;
      t.id = id;
      t.special = true;
      char32_t cp = 0;
      if (t.content.empty() || utf8_sequence(t.content, 0, cp) == 0)
        continue;  // an empty or non-text control piece cannot occur in text
      impl->added_by_id[id] = impl->added.size();
      impl->added_by_content[t.content] = id;
      impl->added.push_back(std::move(t));
      ++control;
    }
  }
  for (const AddedToken& t : impl->added)
    impl->first_byte[0][static_cast<unsigned char>(t.content[0])] = true;
  impl->description =
      fmt::format("SentencePiece ({} pieces{}), {} special; BOS {}", n,
                  bytes > 0 ? fmt::format(", {} byte fallback", bytes) : std::string(), control,
                  impl->sp_bos >= 0 ? named(sp->IdToPiece(static_cast<int>(impl->sp_bos)))
                                    : std::string("none"));
  return HfTokenizer(std::move(impl));
}

HfTokenizer HfTokenizer::from_json(std::string_view text, const std::string& name) {
  const Ctx c{name};
  Json j;
  try {
    j = Json::parse(text);
  } catch (const Json::exception& e) {
    throw std::invalid_argument(
        c.where(fmt::format("not valid JSON: {}", printable(e.what(), 4096))));
  }
  if (!j.is_object()) throw std::invalid_argument(c.where("not a JSON object"));
  auto impl = std::make_shared<Impl>();
  impl->name = name;
  if (j.contains("truncation") && !j.at("truncation").is_null()) {
    throw std::invalid_argument(c.where("truncation is set: attn encodes whole texts"));
  }
  if (j.contains("normalizer") && !j.at("normalizer").is_null())
    impl->normalizer = normalizer_of(j.at("normalizer"), c);
  if (j.contains("pre_tokenizer") && !j.at("pre_tokenizer").is_null()) {
    impl->pre_tokenizer = pre_tokenizer_of(j.at("pre_tokenizer"), c);
  }
  impl->model = bpe_of(field(j, "model", c, "tokenizer.json"), c);
  if (j.contains("post_processor") && !j.at("post_processor").is_null()) {
    impl->post = post_processor_of(j.at("post_processor"), c);
  }
  if (j.contains("decoder") && !j.at("decoder").is_null())
    impl->decoder = decoder_of(j.at("decoder"), c);
  impl->vocab_size = static_cast<int64_t>(impl->model.tokens.size());
  if (j.contains("added_tokens")) {
    const Json& list = j.at("added_tokens");
    if (!list.is_array()) throw std::invalid_argument(c.where("added_tokens must be a list"));
    for (const Json& a : list) {
      AddedToken t;
      t.content = string_field(a, "content", c, "added_tokens");
      const Json& id = field(a, "id", c, "added_tokens");
      if (!id.is_number_integer() || id.get<int64_t>() < 0 ||
          id.get<int64_t>() >= (int64_t{1} << 30)) {
        throw std::invalid_argument(c.where(
            fmt::format("added token {} has id {}", named(t.content), printable(id.dump(), 100))));
      }
      t.id = id.get<int64_t>();
      t.special = bool_field(a, "special", false, c, "added_tokens");
      t.lstrip = bool_field(a, "lstrip", false, c, "added_tokens");
      t.rstrip = bool_field(a, "rstrip", false, c, "added_tokens");
      t.normalized = bool_field(a, "normalized", !t.special, c, "added_tokens");
      t.single_word = bool_field(a, "single_word", false, c, "added_tokens");
      if (t.content.empty()) throw std::invalid_argument(c.where("an added token is empty"));
      decode_utf8(t.content);  // throws for invalid UTF-8
      impl->added_by_id[t.id] = impl->added.size();
      impl->added_by_content[t.content] = t.id;
      impl->vocab_size = std::max(impl->vocab_size, t.id + 1);
      impl->added.push_back(std::move(t));
    }
  }
  for (const AddedToken& t : impl->added) {
    impl->first_byte[t.normalized ? 1 : 0][static_cast<unsigned char>(t.content[0])] = true;
  }
  // A template's ids must name tokens: a model has no embedding row for any other.
  std::vector<int64_t> inserted;
  impl->post.inserted_ids(inserted);
  for (const int64_t id : inserted) {
    const bool added = impl->added_by_id.count(id) != 0;
    const bool model = id < static_cast<int64_t>(impl->model.tokens.size()) &&
                       !impl->model.tokens[static_cast<size_t>(id)].empty();
    if (!added && !model) {
      throw std::invalid_argument(c.where(
          fmt::format("TemplateProcessing puts in id {}, which no token has (vocab_size {})", id,
                      impl->vocab_size)));
    }
  }
  impl->description = fmt::format(
      "BPE ({} tokens, {} merges{}{}{}), {} added; normalizer {}; pre_tokenizer {}; post_processor "
      "{}; decoder {}",
      impl->model.vocab.size(), impl->model.merges.size(),
      impl->model.byte_fallback ? ", byte_fallback" : "",
      impl->model.ignore_merges ? ", ignore_merges" : "", impl->model.unk >= 0 ? ", unk" : "",
      impl->added.size(), component_types(j.value("normalizer", Json())),
      component_types(j.value("pre_tokenizer", Json())),
      component_types(j.value("post_processor", Json())),
      component_types(j.value("decoder", Json())));
  return HfTokenizer(std::move(impl));
}

std::vector<int64_t> HfTokenizer::encode(std::string_view text, bool add_special_tokens) const {
  const Impl& m = *impl_;
  for (size_t i = 0; i < text.size();) {
    char32_t cp = 0;
    const char* why = nullptr;
    const size_t n = utf8_sequence(text, i, cp, &why);
    if (n == 0)
      throw std::invalid_argument(
          fmt::format("tokenizer: invalid UTF-8 at byte offset {}: {}", i, why));
    i += n;
  }
  std::vector<Segment> segments{Segment{std::string(text), -1, true}};
  m.split_added(segments, false);
  if (m.sp) {  // a SentencePiece model: the text between the specials is its
    std::vector<int64_t> ids;
    if (add_special_tokens && m.sp_bos >= 0) ids.push_back(m.sp_bos);
    std::vector<int> piece_ids;
    for (const Segment& s : segments) {
      if (s.id >= 0) {
        ids.push_back(s.id);
        continue;
      }
      const bool prefix = m.sp_plain && m.sp_dummy_prefix && s.text[0] != ' ' &&
                          (s.first || !m.sp_prefix_first_only);
      const auto status = m.sp_plain
                              ? m.sp_plain->Encode(prefix ? " " + s.text : s.text, &piece_ids)
                              : m.sp->Encode(s.text, &piece_ids);
      if (!status.ok()) {
        throw std::runtime_error(fmt::format("tokenizer {}: sentencepiece: {}", named(m.name),
                                             printable(status.ToString(), 200)));
      }
      ids.insert(ids.end(), piece_ids.begin(), piece_ids.end());
    }
    return ids;
  }
  if (m.normalizer) {
    for (Segment& s : segments) {
      if (s.id < 0) s.text = m.normalizer->apply(std::move(s.text));
    }
  }
  m.split_added(segments, true);
  std::vector<int64_t> ids;
  for (const Segment& s : segments) {
    if (s.id >= 0) {
      ids.push_back(s.id);
      continue;
    }
    std::vector<std::string> pieces{s.text};
    if (m.pre_tokenizer) m.pre_tokenizer->apply(pieces, s.first);
    for (const std::string& p : pieces) m.model.tokenize(p, ids);
  }
  if (add_special_tokens) m.post.apply(ids);
  return ids;
}

std::string HfTokenizer::decode(std::span<const int64_t> ids, bool skip_special_tokens) const {
  const Impl& m = *impl_;
  if (m.sp) {  // runs of pieces decoded by sentencepiece, the specials' text between them
    // (A model with a dummy prefix: the runs on either side of a skipped
    // special are one run, and only the output's start loses a space, as
    // transformers' decoder (Replace "▁", ByteFallback, Fuse, Strip) does.)
    std::string out;
    std::vector<int> run;
    bool at_start = true;
    auto flush = [&] {
      if (run.empty()) return;
      std::string text;
      const auto status = m.sp_plain ? m.sp_plain->Decode(run, &text) : m.sp->Decode(run, &text);
      if (!status.ok()) {
        throw std::runtime_error(fmt::format("tokenizer {}: sentencepiece: {}", named(m.name),
                                             printable(status.ToString(), 200)));
      }
      if (m.sp_plain && m.sp_dummy_prefix && at_start && !text.empty() && text[0] == ' ')
        text.erase(0, 1);
      out += text;
      run.clear();
      at_start = false;
    };
    for (const int64_t id : ids) {
      (void)id_to_token(id);  // std::out_of_range for an id outside the model
      const auto it = m.added_by_id.find(id);
      if (it != m.added_by_id.end()) {
        if (skip_special_tokens && m.sp_plain) continue;
        flush();
        if (!skip_special_tokens) out += m.added[it->second].content, at_start = false;
        continue;
      }
      run.push_back(static_cast<int>(id));
    }
    flush();
    return out;
  }
  std::vector<std::string> tokens;
  for (const int64_t id : ids) {
    const auto it = m.added_by_id.find(id);
    if (it != m.added_by_id.end()) {
      if (!(skip_special_tokens && m.added[it->second].special))
        tokens.push_back(m.added[it->second].content);
      continue;
    }
    tokens.push_back(id_to_token(id));
  }
  if (!m.decoder) {
    std::string out;
    for (size_t i = 0; i < tokens.size(); ++i) out += (i ? " " : "") + tokens[i];
    return out;
  }
  m.decoder->apply(tokens);
  std::string out;
  for (const std::string& t : tokens) out += t;
  return out;
}

int64_t HfTokenizer::vocab_size() const { return impl_->vocab_size; }

std::optional<int64_t> HfTokenizer::token_to_id(std::string_view token) const {
  const std::string t(token);
  const auto a = impl_->added_by_content.find(t);
  if (a != impl_->added_by_content.end()) return a->second;
  const auto it = impl_->model.vocab.find(t);
  if (it != impl_->model.vocab.end()) return it->second;
  return std::nullopt;
}

const std::string& HfTokenizer::id_to_token(int64_t id) const {
  const auto a = impl_->added_by_id.find(id);
  if (a != impl_->added_by_id.end()) return impl_->added[a->second].content;
  if (id < 0 || id >= static_cast<int64_t>(impl_->model.tokens.size()) ||
      impl_->model.tokens[static_cast<size_t>(id)].empty()) {
    throw std::out_of_range(fmt::format("tokenizer {}: no token has id {} (vocab_size {})",
                                        named(impl_->name), id, impl_->vocab_size));
  }
  return impl_->model.tokens[static_cast<size_t>(id)];
}

bool HfTokenizer::is_special(int64_t id) const {
  const auto a = impl_->added_by_id.find(id);
  return a != impl_->added_by_id.end() && impl_->added[a->second].special;
}

std::string HfTokenizer::describe() const { return impl_->description; }

}  // namespace attn::text
