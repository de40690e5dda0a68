// attn::text::Tokenizer against tiktoken's gpt2 encoding (the ids in
// tests/fixtures/tokenizer/cases.json, written once by
// tests/fixtures/make_tokenizer_fixtures.py), and its properties: decode
// inverts encode, encode_parallel equals encode, the two merge loops agree,
// and bad input gives the stated errors with no raw byte in the message.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "attn/atomic_file.h"
#include "attn/tokenizer.h"
#include "attn/utf8.h"
#include "cli.h"
#include "oracle.h"
#include "text/bpe.h"
#include "text/encoder.h"
#include "text/pretokenize.h"

namespace {

using attn::text::StreamDecoder;
using attn::text::Tokenizer;

const Tokenizer& gpt2() { return Tokenizer::gpt2(); }

std::string read_data(const std::string& name) {
  return attn::test::read_text(std::string(ATTN_DATA_DIR) + "/" + name);
}

const nlohmann::json& cases() {
  static const nlohmann::json j = attn::test::read_fixture_json("tokenizer/cases.json");
  return j.at("cases");
}

// A case's text: as written, repeated, or the first bytes of a file in data/.
std::string text_of(const nlohmann::json& c) {
  if (c.contains("text")) return c["text"].get<std::string>();
  if (c.contains("repeat")) {
    std::string s;
    for (int k = 0; k < c["times"].get<int>(); ++k) s += c["repeat"].get<std::string>();
    return s;
  }
  return read_data(c["file"].get<std::string>()).substr(0, c["bytes"].get<size_t>());
}

// FNV-1a (64-bit) over the ids as 8-byte little-endian integers, as the script.
std::string fnv1a(const std::vector<int64_t>& ids) {
  uint64_t h = 0xCBF29CE484222325ull;
  for (int64_t id : ids) {
    auto u = static_cast<uint64_t>(id);
    for (int b = 0; b < 8; ++b, u >>= 8) h = (h ^ (u & 0xFF)) * 0x100000001B3ull;
  }
  return fmt::format("{:016x}", h);
}

void expect_case(const nlohmann::json& c, const std::vector<int64_t>& ids, const char* how) {
  const std::string name = c["name"].get<std::string>();
  if (c.contains("ids")) {
    EXPECT_EQ(ids, c["ids"].get<std::vector<int64_t>>()) << how << ": " << name;
  } else {
    EXPECT_EQ(static_cast<int64_t>(ids.size()), c["count"].get<int64_t>()) << how << ": " << name;
    const auto head = c["head"].get<std::vector<int64_t>>();
    EXPECT_EQ(std::vector<int64_t>(ids.begin(), ids.begin() + std::min(ids.size(), head.size())),
              head)
        << how << ": " << name;
    EXPECT_EQ(fnv1a(ids), c["fnv1a"].get<std::string>()) << how << ": " << name;
  }
}

TEST(Tokenizer, BookExample) {
  EXPECT_EQ(gpt2().encode("Hello, I am"), (std::vector<int64_t>{15496, 11, 314, 716}));
  EXPECT_EQ(gpt2().vocab_size(), 50257);
  EXPECT_EQ(gpt2().eot_token(), 50256);
  EXPECT_EQ(gpt2().token_bytes(50256), "<|endoftext|>");
  EXPECT_EQ(gpt2().token_bytes(220), " ");
  EXPECT_EQ(gpt2().token_bytes(15496), "Hello");
  EXPECT_TRUE(gpt2().encode("").empty());
}

TEST(Tokenizer, TheVerdictIs5145Tokens) {
  const std::string text = read_data("the-verdict.txt");
  const auto ids = gpt2().encode(text);
  EXPECT_EQ(ids.size(), 5145u);
  EXPECT_EQ(gpt2().decode(ids), text);
}

TEST(Tokenizer, EveryFixtureCaseMatchesTiktoken) {
  ASSERT_GE(cases().size(), 100u);
  for (const auto& c : cases()) {
    const std::string text = text_of(c);
    const bool special = c["allow_special"].get<bool>();
    const auto ids = gpt2().encode(text, special);
    expect_case(c, ids, "encode");
    expect_case(c, gpt2().encode_parallel(text, special, 3), "encode_parallel");
    EXPECT_EQ(gpt2().decode(ids), text) << c["name"];
  }
}

TEST(Tokenizer, SpecialTokenOnlyWhenAllowed) {
  const auto plain = gpt2().encode("a<|endoftext|>b");
  EXPECT_EQ(std::count(plain.begin(), plain.end(), 50256), 0);
  EXPECT_EQ(gpt2().decode(plain), "a<|endoftext|>b");
  const auto special = gpt2().encode("a<|endoftext|>b", true);
  EXPECT_EQ(special, (std::vector<int64_t>{64, 50256, 65}));
  EXPECT_EQ(gpt2().encode("<|endoftext|>", true), (std::vector<int64_t>{50256}));
}

TEST(Tokenizer, ContractionsAreLowerCaseOnly) {
  // 's is a piece of its own; 'S is "'" then "S".
  EXPECT_EQ(gpt2().encode("it's"), (std::vector<int64_t>{270, 338}));
  const auto upper = gpt2().encode("IT'S");
  EXPECT_EQ(gpt2().decode(std::vector<int64_t>{upper.back()}), "S");
}

// Random valid UTF-8 from a mix of ASCII, every plane and the classes' edges.
std::string random_utf8(std::mt19937_64& rng, size_t chars) {
  std::string s;
  const char32_t picks[] = {' ', '\n', '\t', '\'',   's',    'l',    'd',   'A',
                            '0', ',',  0xA0, 0x3000, 0x180E, 0x2028, 0x301, 0x1F600};
  for (size_t k = 0; k < chars; ++k) {
    char32_t cp = 0;
    switch (rng() % 4) {
      case 0:
        cp = static_cast<char32_t>(0x20 + rng() % 0x5F);
        break;
      case 1:
        cp = picks[rng() % std::size(picks)];
        break;
      case 2:
        cp = static_cast<char32_t>(rng() % 0x3000);
        break;
      default:
        cp = static_cast<char32_t>(rng() % 0x110000);
        break;
    }
    if (cp >= 0xD800 && cp <= 0xDFFF) cp = 'x';
    s += attn::encode_utf8(cp);
  }
  return s;
}

TEST(Tokenizer, DecodeInvertsEncodeOnRandomText) {
  std::mt19937_64 rng(20240611);
  for (int k = 0; k < 300; ++k) {
    const std::string text = random_utf8(rng, rng() % 200);
    const auto ids = gpt2().encode(text);
    ASSERT_EQ(gpt2().decode(ids), text) << "case " << k;
    for (int64_t id : ids) ASSERT_TRUE(id >= 0 && id < 50256) << "case " << k;
  }
}

TEST(Tokenizer, MergeLoopsAgreeWithTheReference) {
  // tiktoken's loop on joined bytes, the loop on ids and the heap give the
  // same tokens for any piece.
  const attn::text::Vocabulary& v = attn::text::gpt2_vocabulary();
  std::mt19937_64 rng(7);
  const std::string alphabet[] = {
      "a", "b", "e", " ", "th", "in", "\xE6\xBC\xA2", "\xF0\x9F\x98\x80", "1", "\xC3\xA9"};
  for (int k = 0; k < 400; ++k) {
    std::string piece;
    const size_t n = 1 + rng() % 150;
    for (size_t i = 0; i < n; ++i) piece += alphabet[rng() % std::size(alphabet)];
    std::vector<int64_t> reference, scan, heap;
    attn::text::bpe_merge_reference(v, piece, reference);
    if (piece.size() < attn::text::kHeapFromBytes) {
      attn::text::bpe_merge_scan(v, piece, scan);
      ASSERT_EQ(scan, reference) << "piece " << k;
    }
    attn::text::bpe_merge_heap(v, piece, heap);
    ASSERT_EQ(heap, reference) << "piece " << k;
  }
}

TEST(Tokenizer, ParallelEqualsSerialOnLargeInputs) {
  const std::string shakespeare = read_data("tinyshakespeare.txt");
  const auto serial = gpt2().encode(shakespeare);
  for (int threads : {1, 2, 3, 8})
    EXPECT_EQ(gpt2().encode_parallel(shakespeare, false, threads), serial) << threads;
  EXPECT_EQ(gpt2().encode_parallel(shakespeare), serial);
  // Random multilingual text with newlines and spaces everywhere, and the
  // special token now and then.
  std::mt19937_64 rng(99);
  std::string mixed;
  while (mixed.size() < 600000) {
    mixed += random_utf8(rng, 50);
    mixed += (rng() % 3 == 0) ? "\n" : (rng() % 2 ? " x" : "  \n\n");
    if (rng() % 500 == 0) mixed += "<|endoftext|>";
  }
  for (bool special : {false, true})
    EXPECT_EQ(gpt2().encode_parallel(mixed, special, 4), gpt2().encode(mixed, special)) << special;
}

TEST(Tokenizer, SafeCutsSplitNoPiece) {
  // At every safe cut of random text, the pieces of the two halves are the
  // pieces of the whole.
  std::mt19937_64 rng(5);
  for (int k = 0; k < 200; ++k) {
    const std::string text = random_utf8(rng, 1 + rng() % 60);
    std::vector<size_t> ends;
    attn::text::for_each_piece(text, [&](std::string_view p) {
      ends.push_back(static_cast<size_t>(p.data() + p.size() - text.data()));
    });
    for (size_t p = 1; p < text.size(); ++p) {
      if (!attn::text::is_safe_cut(text, p)) continue;
      ASSERT_NE(std::find(ends.begin(), ends.end(), p), ends.end())
          << "cut " << p << " of case " << k;
      auto left = gpt2().encode(text.substr(0, p)), right = gpt2().encode(text.substr(p));
      left.insert(left.end(), right.begin(), right.end());
      ASSERT_EQ(left, gpt2().encode(text)) << "cut " << p << " of case " << k;
    }
  }
  // A whitespace run before a letter is not a safe cut; a newline between two letters is.
  EXPECT_FALSE(attn::text::is_safe_cut("a  \nb", 4));
  EXPECT_TRUE(attn::text::is_safe_cut("a\nb", 2));
  EXPECT_TRUE(attn::text::is_safe_cut("a b", 1));
  EXPECT_FALSE(attn::text::is_safe_cut("a  b", 2));
}

// A message carries no control byte and no byte that is not part of valid
// UTF-8 (attn::printable lets whole UTF-8 characters through, escapes the rest).
void expect_clean(const std::string& message) {
  for (unsigned char c : message) {
    EXPECT_FALSE(c < 0x20 || c == 0x7F) << "control byte in: " << attn::printable(message);
  }
  EXPECT_NO_THROW(attn::decode_utf8(message)) << "raw bytes in: " << attn::printable(message);
}

// A message built from bytes that are not UTF-8 carries none of them: only
// ASCII (the bytes shown as \xHH).
void expect_ascii(const std::string& message) {
  expect_clean(message);
  for (unsigned char c : message) EXPECT_LT(c, 0x80) << "raw byte in: " << attn::printable(message);
}

template <typename E, typename F>
std::string message_of(F&& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  }
  ADD_FAILURE() << "no exception";
  return "";
}

TEST(Tokenizer, InvalidUtf8NamesTheByteOffset) {
  const std::string cases[][2] = {
      {"ab\xFF", "invalid UTF-8 at byte offset 2: invalid lead byte (byte 0xFF)"},
      {"abc\x80", "invalid UTF-8 at byte offset 3: unexpected continuation byte (byte 0x80)"},
      {"\xC3",
       "invalid UTF-8 at byte offset 0: sequence cut short by the end of the text (byte 0xC3)"},
      {"x\xC3(", "invalid UTF-8 at byte offset 1: missing continuation byte (byte 0xC3)"},
      {"\xC0\xAF", "invalid UTF-8 at byte offset 0: overlong encoding (byte 0xC0)"},
      {"01234567\xED\xA0\x80", "invalid UTF-8 at byte offset 8: surrogate code point (byte 0xED)"},
      {"\xF4\x90\x80\x80", "invalid UTF-8 at byte offset 0: code point above U+10FFFF (byte 0xF4)"},
  };
  for (const auto& [text, expected] : cases) {
    const std::string m = message_of<std::invalid_argument>([&] { gpt2().encode(text); });
    EXPECT_EQ(m, "Tokenizer::encode: " + expected);
    expect_ascii(m);
    const std::string mp = message_of<std::invalid_argument>([&] { gpt2().encode_parallel(text); });
    EXPECT_EQ(mp, "Tokenizer::encode_parallel: " + expected);
  }
}

TEST(Tokenizer, NegativeThreadCountIsRefused) {
  EXPECT_EQ(message_of<std::invalid_argument>([] { gpt2().encode_parallel("x", false, -1); }),
            "Tokenizer::encode_parallel: threads must be >= 0, got -1");
  EXPECT_EQ(gpt2().encode_parallel("Hello, I am", false, 1),
            (std::vector<int64_t>{15496, 11, 314, 716}));
}

TEST(Tokenizer, OutOfRangeIdsNameTheIdAndTheVocabularySize) {
  EXPECT_EQ(message_of<std::out_of_range>([] {
              gpt2().decode(std::vector<int64_t>{15496, 50257});
            }),
            "token id 50257 is out of range (vocabulary size 50257)");
  EXPECT_EQ(message_of<std::out_of_range>([] { gpt2().token_bytes(-1); }),
            "token id -1 is out of range (vocabulary size 50257)");
  StreamDecoder d(gpt2());
  EXPECT_EQ(message_of<std::out_of_range>([&] { d.push(1 << 20); }),
            "token id 1048576 is out of range (vocabulary size 50257)");
}

TEST(Tokenizer, StreamDecoderHoldsBackSplitCharacters) {
  // "日本語 😀" and an emoji family: their characters split across tokens.
  for (const std::string text :
       {"日本語 😀 ok", "👨‍👩‍👧‍👦 é", "plain ascii", "\xE6\xBC\xA2"}) {
    const auto ids = gpt2().encode(text);
    StreamDecoder d(gpt2());
    std::string out;
    for (int64_t id : ids) {
      const std::string piece = d.push(id);
      EXPECT_NO_THROW(attn::decode_utf8(piece)) << "a pushed piece is not whole UTF-8: " << text;
      out += piece;
    }
    out += d.flush();
    EXPECT_EQ(out, text);
  }
  // Byte tokens that can never complete a character pass through; an
  // incomplete character at the end comes out of flush as it is.
  StreamDecoder d(gpt2());
  const int64_t lead_e6 = gpt2().encode("\xE6\xBC\xA2")[0];  // starts with 0xE6
  EXPECT_EQ(gpt2().token_bytes(lead_e6).substr(0, 1), "\xE6");
  std::string got = d.push(lead_e6);
  EXPECT_TRUE(got.size() < gpt2().token_bytes(lead_e6).size());
  got += d.flush();
  EXPECT_EQ(got, gpt2().token_bytes(lead_e6));
  int64_t ff = -1;
  for (int64_t id = 0; id < 256; ++id)
    if (gpt2().token_bytes(id) == "\xFF") ff = id;
  ASSERT_GE(ff, 0);
  StreamDecoder e(gpt2());
  EXPECT_EQ(e.push(ff), "\xFF");
  EXPECT_EQ(e.flush(), "");
}

// ---- reading vocab.json + merges.txt ------------------------------------------

struct Files {
  std::string dir, vocab, merges;
};

Files write_files(const std::string& vocab, const std::string& merges) {
  Files f;
  f.dir = attn::test::temp_path("tok");
  std::filesystem::create_directories(f.dir);
  f.vocab = f.dir + "/vocab.json";
  f.merges = f.dir + "/merges.txt";
  attn::io::write_file_atomically(f.vocab, vocab);
  attn::io::write_file_atomically(f.merges, merges);
  return f;
}

TEST(Tokenizer, FromFilesReadsGpt2sFilesAsHuggingFaceNamesThem) {
  const Files f = write_files(read_data("gpt2/encoder.json"), read_data("gpt2/vocab.bpe"));
  const Tokenizer t = Tokenizer::from_directory(f.dir);
  const std::string text = read_data("the-verdict.txt");
  EXPECT_EQ(t.encode(text), gpt2().encode(text));
  EXPECT_EQ(t.vocab_size(), 50257);
  EXPECT_EQ(t.eot_token(), 50256);
  // A folder without the two files gives GPT-2's.
  const Tokenizer fallback = Tokenizer::from_directory(attn::test::temp_path("empty"));
  EXPECT_EQ(fallback.encode("Hello, I am"), (std::vector<int64_t>{15496, 11, 314, 716}));
}

// A small vocabulary: the 256 bytes (in GPT-2's byte-to-unicode form), then "ab", "abc".
std::string small_vocab(const std::string& extra) {
  nlohmann::ordered_json j;
  // GPT-2's own first 256 ids are exactly the bytes in that form.
  const nlohmann::json g = nlohmann::json::parse(read_data("gpt2/encoder.json"));
  for (const auto& [k, v] : g.items())
    if (v.get<int>() < 256) j[k] = v;
  j["ab"] = 256;
  j["abc"] = 257;
  std::string s = j.dump();
  if (!extra.empty()) s = s.substr(0, s.size() - 1) + "," + extra + "}";
  return s;
}

TEST(Tokenizer, FromFilesSmallVocabulary) {
  const Files f = write_files(small_vocab(""), "#version: 0.2\na b\nab c\n");
  const Tokenizer t = Tokenizer::from_files(f.vocab, f.merges);
  EXPECT_EQ(t.vocab_size(), 258);
  EXPECT_EQ(t.eot_token(), -1);
  EXPECT_EQ(t.encode("abc abd"), (std::vector<int64_t>{257, 220, 256, 67}));
  EXPECT_EQ(t.encode("abc<|endoftext|>", true).size(),
            1u + 13u);  // no special token: ordinary text
}

TEST(Tokenizer, MalformedFilesNameTheFileAndLineOrKey) {
  struct Bad {
    std::string vocab, merges, expected;
  };
  const std::vector<Bad> bad = {
      {"{\"a\": 0,", "", "vocab.json': line 1: not valid JSON"},
      {"[1, 2]", "", "expected a JSON object of token -> id, got array"},
      {small_vocab("\"x\\u00ffy\": \"7\""), "",
       "key 'x\u00ffy': the id must be an integer, got string"},
      {small_vocab("\"zz\": 300"), "", "key 'zz': id 300 is outside 0..258"},
      {small_vocab("\"zz\": 5"), "", "both have id 5"},
      {small_vocab("\"a b\": 258"), "", "key 'a b' is not a token in GPT-2's byte-to-unicode form"},
      {small_vocab(""), "a b\nab\n",
       "merges.txt': line 2 ('ab'): expected two tokens separated by one space"},
      {small_vocab(""), "a b\nab c\nq \xFFz\n",
       "merges.txt': line 3 ('q \\xFFz'): a token is not in GPT-2's byte-to-unicode form"},
      {small_vocab(""), "ab c\n",
       "line 1 ('ab c'): 'ab' is not a token made by an earlier line or a single byte"},
      {small_vocab(""), "a b\nab d\n",
       "line 2 ('ab d'): the merged token 'abd' is not in the vocabulary file"},
      {small_vocab(""), "a b\na b\n",
       "line 2 ('a b'): the merged token 'ab' was already made by an earlier line"},
  };
  for (const auto& b : bad) {
    const Files f = write_files(b.vocab, b.merges);
    const std::string m =
        message_of<std::runtime_error>([&] { Tokenizer::from_files(f.vocab, f.merges); });
    EXPECT_NE(m.find(b.expected), std::string::npos)
        << "got: " << m << "\nexpected: " << b.expected;
    expect_clean(m);
    if (b.merges.find('\xFF') != std::string::npos)
      expect_ascii(m);  // the raw byte is shown as \xFF
  }
  const std::string missing = message_of<std::runtime_error>(
      [] { Tokenizer::from_files("/nonexistent/v\xFF.json", "/nonexistent/m.txt"); });
  EXPECT_NE(missing.find("cannot read the vocabulary file '/nonexistent/v\\xFF.json'"),
            std::string::npos)
      << missing;
  expect_ascii(missing);
}

}  // namespace

// ---- bulk: every code point, and thousands of random texts ---------------------

namespace {

const nlohmann::json& bulk() {
  static const nlohmann::json j = attn::test::read_fixture_json("tokenizer/bulk.json");
  return j;
}

// CODE_POINT_CONTEXT of the script with every "{c}" replaced by the character.
std::string in_context(const std::string& context, const std::string& c) {
  std::string s;
  for (size_t i = 0; i < context.size();) {
    if (context.compare(i, 3, "{c}") == 0) {
      s += c;
      i += 3;
    } else {
      s += context[i++];
    }
  }
  return s;
}

}  // namespace

TEST(Tokenizer, EveryCodePointInContextMatchesTiktoken) {
  // 0..0x10FFFF in blocks of 4096, each character in several contexts
  // (after and before letters, digits, spaces, tabs, newlines, a contraction).
  const std::string context = bulk()["code_point_context"].get<std::string>();
  const auto& blocks = bulk()["code_point_blocks"];
  ASSERT_EQ(blocks.size(), 0x110u);
  for (const auto& b : blocks) {
    const auto first = b["first"].get<uint32_t>();
    std::string text;
    for (char32_t cp = first; cp < first + 0x1000; ++cp) {
      if (cp >= 0xD800 && cp <= 0xDFFF) continue;
      text += in_context(context, attn::encode_utf8(cp));
    }
    const auto ids = gpt2().encode_parallel(text);
    EXPECT_EQ(static_cast<int64_t>(ids.size()), b["count"].get<int64_t>())
        << fmt::format("block U+{:04X}", first);
    EXPECT_EQ(fnv1a(ids), b["fnv1a"].get<std::string>()) << fmt::format("block U+{:04X}", first);
  }
}

TEST(Tokenizer, ThousandsOfRandomTextsMatchTiktoken) {
  // The script's LCG (Knuth's MMIX constants, high 32 bits) over its pool.
  const auto pool = bulk()["random_pool"].get<std::vector<std::string>>();
  uint64_t x = bulk()["lcg_seed"].get<uint64_t>();
  auto next = [&x] {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    return x >> 32;
  };
  const auto& groups = bulk()["random_groups"];
  const int count = bulk()["random_count"].get<int>();
  ASSERT_EQ(static_cast<int>(groups.size()) * 100, count);
  for (size_t g = 0; g < groups.size(); ++g) {
    std::vector<int64_t> ids;
    for (int k = 0; k < 100; ++k) {
      const uint64_t n = 1 + next() % 40;
      std::string text;
      for (uint64_t i = 0; i < n; ++i) text += pool[next() % pool.size()];
      const auto t = gpt2().encode(text);
      ids.insert(ids.end(), t.begin(), t.end());
      ids.push_back(-1);
      ASSERT_EQ(gpt2().decode(t), text);
    }
    EXPECT_EQ(static_cast<int64_t>(ids.size()), groups[g]["count"].get<int64_t>()) << "group " << g;
    EXPECT_EQ(fnv1a(ids), groups[g]["fnv1a"].get<std::string>()) << "group " << g;
  }
}
