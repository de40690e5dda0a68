// Messages built from outside bytes never carry them raw: attn::printable
// itself, and the library's and the CLI's messages for a file name, a tensor
// name, a header, a section name and a command-line value that hold bytes
// which are not valid UTF-8 or are control characters.
#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>
#include <cstdio>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <span>
#include <stdexcept>
#include <string>

#include "attn/float_decimal.h"
#include "attn/nn.h"
#include "attn/safetensors.h"
#include "attn/state_dict.h"
#include "attn/tensor.h"
#include "attn/utf8.h"
#include "cli.h"

namespace {

using attn::printable;

// True when every byte is printable ASCII: what the messages below must be,
// since everything in them that is not attn's own ASCII text is escaped.
bool ascii_only(const std::string& s) {
  for (const char c : s) {
    const auto b = static_cast<unsigned char>(c);
    if (b < 0x20 || b > 0x7E) return false;
  }
  return true;
}

std::string hex_of(const std::string& s) {
  std::string out;
  for (const char c : s) {
    char buf[4];
    std::snprintf(buf, sizeof buf, "%02X ", static_cast<unsigned char>(c));
    out += buf;
  }
  return out;
}

TEST(Printable, PassesPrintableTextAndValidUtf8) {
  EXPECT_EQ(printable("model.safetensors"), "model.safetensors");
  EXPECT_EQ(printable(""), "");
  EXPECT_EQ(printable("Gr\xC3\xB6\xC3\x9F" "e \xE6\x97\xA5\xE6\x9C\xAC \xF0\x9F\x98\x80"),
            "Gr\xC3\xB6\xC3\x9F" "e \xE6\x97\xA5\xE6\x9C\xAC \xF0\x9F\x98\x80");  // Größe 日本 😀
  EXPECT_EQ(printable("a\\b"), "a\\b");  // a backslash stays one backslash
}

TEST(Printable, EscapesInvalidUtf8AndControls) {
  EXPECT_EQ(printable("\xFF"), "\\xFF");
  EXPECT_EQ(printable("a\xC3"), "a\\xC3");                  // cut short
  EXPECT_EQ(printable("\xC0\xAF"), "\\xC0\\xAF");           // overlong '/'
  EXPECT_EQ(printable("\xED\xA0\x80"), "\\xED\\xA0\\x80");  // a surrogate
  EXPECT_EQ(printable("\xF4\x90\x80\x80"), "\\xF4\\x90\\x80\\x80");  // above U+10FFFF
  EXPECT_EQ(printable("\x80x"), "\\x80x");                  // a stray continuation byte
  EXPECT_EQ(printable(std::string("a\0b", 3)), "a\\x00b");
  EXPECT_EQ(printable("\n\r\t\x1B[31m\x7F"), "\\n\\r\\t\\x1B[31m\\x7F");
  // Invisible and reordering code points: C1 NEL, zero-width space, RLO, BOM.
  EXPECT_EQ(printable("\xC2\x85|\xE2\x80\x8B|\xE2\x80\xAE|\xEF\xBB\xBF"),
            "\\u{0085}|\\u{200B}|\\u{202E}|\\u{FEFF}");
}

TEST(Printable, LongInputIsCutWithoutSplittingACharacter) {
  EXPECT_EQ(printable(std::string(300, 'x')), std::string(256, 'x') + "...");
  EXPECT_EQ(printable("abcd", 4), "abcd");
  EXPECT_EQ(printable("abcde", 4), "abcd...");
  // "é" (C3 A9) straddles the cut at 4: the half character is dropped, not escaped.
  EXPECT_EQ(printable("abc\xC3\xA9", 4), "abc...");
}

TEST(Printable, EveryByteValueGivesAsciiOrValidUtf8) {
  // Every single byte and every pair: the result decodes as UTF-8 and has no
  // control character.
  for (int a = 0; a < 256; ++a) {
    for (int b = 0; b < 256; b += 3) {
      const std::string in{static_cast<char>(a), static_cast<char>(b)};
      const std::string out = printable(in);
      EXPECT_NO_THROW((void)attn::decode_utf8(out)) << hex_of(in);
      for (const char32_t cp : attn::decode_utf8(out)) {
        ASSERT_FALSE(cp < 0x20 || cp == 0x7F || (cp >= 0x80 && cp <= 0x9F)) << hex_of(in);
      }
    }
  }
}

// ---- the library's messages ----------------------------------------------------------

std::string write_bytes(const std::string& stem, const std::string& bytes) {
  const std::string path = attn::test::temp_path(stem);
  std::ofstream(path, std::ios::binary) << bytes;
  return path;
}

// A safetensors file whose header is `header`.
std::string safetensors_bytes(const std::string& header) {
  std::string out(8, '\0');
  const uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out[static_cast<size_t>(i)] = static_cast<char>((n >> (8 * i)) & 0xFF);
  return out + header;
}

std::string read_error(const std::string& path) {
  try {
    (void)attn::io::read_safetensors(path);
  } catch (const std::exception& e) {
    return e.what();
  }
  return "(read)";
}

TEST(PrintableMessages, SafetensorsHeaderThatIsNotUtf8) {
  // The JSON parser's own message quotes the bad byte; it reaches the caller escaped.
  const std::string path = write_bytes("bad.safetensors", safetensors_bytes("{\"\xFF\x1B\": 1}"));
  const std::string m = read_error(path);
  EXPECT_NE(m.find("not valid JSON"), std::string::npos) << m;
  EXPECT_NE(m.find("\\xFF"), std::string::npos) << m;
  EXPECT_TRUE(ascii_only(m)) << hex_of(m);
  std::remove(path.c_str());
}

TEST(PrintableMessages, SafetensorsTensorNameWithControlBytes) {
  const std::string path = write_bytes(
      "names.safetensors",
      safetensors_bytes(R"({"w\u001b[2J\u0085": {"dtype": "F64", "shape": [1], "data_offsets": [0, 8]}})") +
          std::string(8, '\0'));
  const std::string m = read_error(path);
  EXPECT_NE(m.find("w\\x1B[2J\\u{0085}"), std::string::npos) << m;
  EXPECT_NE(m.find("which attn does not read"), std::string::npos) << m;
  EXPECT_TRUE(ascii_only(m)) << hex_of(m);
  std::remove(path.c_str());
}

TEST(PrintableMessages, FileNameWithBadBytes) {
  const std::string m = read_error(attn::test::temp_path("no\xFF\x1B[31m.safetensors"));
  EXPECT_NE(m.find("no\\xFF\\x1B[31m.safetensors"), std::string::npos) << m;
  EXPECT_TRUE(ascii_only(m)) << hex_of(m);
}

TEST(PrintableMessages, StateDictNamesTheModuleDoesNotHave) {
  attn::nn::Linear linear({.in_features = 2, .out_features = 2});
  attn::io::SafetensorsFile file;
  file.path = "in\xFFmemory";
  file.tensors.emplace_back("weight", attn::Tensor::zeros({2, 2}));
  file.tensors.emplace_back("bias", attn::Tensor::zeros({2}));
  file.tensors.emplace_back("extra\xC3\x28\n", attn::Tensor::zeros({1}));
  try {
    (void)attn::io::load_state_dict(linear, file);
    FAIL() << "expected std::invalid_argument";
  } catch (const std::invalid_argument& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("in\\xFFmemory"), std::string::npos) << m;
    EXPECT_NE(m.find("extra\\xC3(\\n"), std::string::npos) << m;
    EXPECT_TRUE(ascii_only(m)) << hex_of(m);
  }
}

// ---- the CLI's messages --------------------------------------------------------------

// A shell word that expands to exactly these bytes (/bin/sh is dash: no $'...').
std::string shell_bytes(const std::string& bytes) {
  std::string word = "\"$(printf '";
  for (const char c : bytes) {
    char buf[8];
    std::snprintf(buf, sizeof buf, "\\%03o", static_cast<unsigned char>(c));
    word += buf;
  }
  return word + "')\"";
}

// stderr of a failing command: one line, escaped.
void expect_one_clean_line(const attn::test::CliResult& r, int exit_code, const std::string& needle) {
  EXPECT_EQ(r.exit_code, exit_code) << r.err;
  ASSERT_FALSE(r.err.empty());
  EXPECT_EQ(r.err.back(), '\n');
  const std::string line = r.err.substr(0, r.err.size() - 1);
  EXPECT_EQ(line.find('\n'), std::string::npos) << r.err;
  EXPECT_TRUE(ascii_only(line)) << hex_of(line);
  EXPECT_NE(line.find(needle), std::string::npos) << line;
}

TEST(PrintableCli, AValueCli11Quotes) {
  // CLI11 quotes the value in its own message (an integer option given bytes).
  expect_one_clean_line(attn::test::run_cli("walkthrough --seed " + shell_bytes("1\xff\x1b")), 2, "\\xFF\\x1B");
}

TEST(PrintableCli, AnUnknownSectionAndCommand) {
  expect_one_clean_line(attn::test::run_cli("walkthrough --section " + shell_bytes("x\xfe\x07")), 2,
                        "x\\xFE\\x07");
  expect_one_clean_line(attn::test::run_cli(shell_bytes("walk\xff")), 2, "walk\\xFF");
}

TEST(PrintableCli, AFileWhoseHeaderIsNotUtf8) {
  const std::string path = write_bytes("cli.safetensors", safetensors_bytes("{\"\xFF\": 1}"));
  expect_one_clean_line(attn::test::run_cli("inspect '" + path + "'"), 1, "\\xFF");
  std::remove(path.c_str());
}

TEST(PrintableCli, AFileNameWithBadBytes) {
  expect_one_clean_line(attn::test::run_cli("inspect " + shell_bytes("/nonexistent/\xff\x1b[31m.safetensors")),
                        1, "/nonexistent/\\xFF\\x1B[31m.safetensors");
  expect_one_clean_line(
      attn::test::run_cli("train --text " + shell_bytes("/nonexistent/t\xc3.txt") + " --out " +
                          attn::test::temp_path("out")),
      1, "/nonexistent/t\\xC3.txt");
}

// Issue 46: attn inspect's listing (tensor names, metadata such as a
// checkpoint's "tokenizer", the file's path) carried ESC, BEL, U+202E and
// U+009B raw, and --json of a path that is not UTF-8 failed with nlohmann's
// type_error.316. Each line of the listing is now escaped (names with
// anything unusual quoted), and the JSON is ASCII with \uXXXX escapes.
TEST(PrintableCli, InspectListingAndJsonCarryNoRawBytes) {
  const std::string data(8, 'x');
  // ESC, BEL, U+202E (right-to-left override) and U+009B (CSI) in a name and in metadata.
  const std::string header =
      R"({"w\u001b[2J\u202e\u009b": {"dtype": "U8", "shape": [8], "data_offsets": [0, 8]}, )"
      R"("__metadata__": {"tokenizer": "char\u0007\u202e", "k\u009b": "v"}})";
  const std::string path =
      write_bytes("listing\xff\x1b.safetensors", safetensors_bytes(header) + data);
  const auto r = attn::test::run_cli("inspect " + shell_bytes(path));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  for (const std::string& line : attn::test::lines_of(r.out))
    EXPECT_TRUE(ascii_only(line)) << hex_of(line);
  EXPECT_NE(r.out.find("listing\\xFF\\x1B.safetensors: 1 tensors"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("\"w\\x1B[2J\\u{202E}\\u{009B}\"  U8"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("  tokenizer: \"char\\x07\\u{202E}\"\n"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("  \"k\\u{009B}\": v\n"), std::string::npos) << r.out;

  const auto j = attn::test::run_cli("inspect --json " + shell_bytes(path));
  ASSERT_EQ(j.exit_code, 0) << j.err;
  for (const std::string& line : attn::test::lines_of(j.out))
    EXPECT_TRUE(ascii_only(line)) << hex_of(line);
  const auto parsed = nlohmann::json::parse(j.out);
  EXPECT_EQ(parsed.at("tensors")[0].at("name"),
            "w\x1b[2J\u202e\u009b");  // exact, through \u escapes
  EXPECT_EQ(parsed.at("metadata").at("tokenizer"), "char\a\u202e");
  EXPECT_NE(parsed.at("file").get<std::string>().find("listing\xEF\xBF\xBD\x1B.safetensors"),
            std::string::npos)  // the byte 0xFF as U+FFFD
      << parsed.at("file");
  // and losslessly: file_hex holds the path's bytes (attn/utf8.h, "Bytes in JSON").
  EXPECT_EQ(attn::bytes_of_hex(parsed.at("file_hex").get<std::string>()), path);
  std::remove(path.c_str());
}

// attn::shortest_decimal, the one float-to-JSON step (hf_decoder_config.cpp,
// hf_gpt2.cpp, inspect): the double printing as the float's shortest decimal.
TEST(ShortestDecimal, IsTheFloatsShortestRoundTrip) {
  EXPECT_EQ(attn::shortest_decimal(1e-6f), 1e-6);  // not 9.99999997e-07
  EXPECT_EQ(attn::shortest_decimal(0.1f), 0.1);
  EXPECT_EQ(attn::shortest_decimal(500000.0f), 500000.0);
  EXPECT_EQ(attn::shortest_decimal(3.4028235e38f), 3.4028235e38);
  EXPECT_EQ(static_cast<float>(attn::shortest_decimal(1.17549435e-38f)), 1.17549435e-38f);
  EXPECT_TRUE(std::isinf(attn::shortest_decimal(std::numeric_limits<float>::infinity())));
  EXPECT_TRUE(std::isnan(attn::shortest_decimal(std::numeric_limits<float>::quiet_NaN())));
  // The bytes/hex pair of "Bytes in JSON" (attn/utf8.h).
  EXPECT_EQ(attn::hex_of("/t\xC3\xA9\xFF"), "2f74c3a9ff");
  EXPECT_EQ(attn::bytes_of_hex("2f74C3A9ff"), "/t\xC3\xA9\xFF");
  EXPECT_THROW(attn::bytes_of_hex("2f7"), std::invalid_argument);
  EXPECT_THROW(attn::bytes_of_hex("zz"), std::invalid_argument);
  EXPECT_TRUE(attn::is_utf8("caf\xC3\xA9"));
  EXPECT_FALSE(attn::is_utf8("caf\xE9"));
}

}  // namespace
