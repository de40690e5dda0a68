// `attn tokenize` through the built executable (tests/cli.h).
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>

#include "attn/atomic_file.h"
#include "attn/tokenizer.h"
#include "cli.h"

namespace {

using attn::test::run_cli;
using attn::test::temp_path;

std::string write_temp(const std::string& stem, const std::string& bytes) {
  const std::string path = temp_path(stem);
  attn::io::write_file_atomically(path, bytes);
  return path;
}

TEST(TokenizerCli, EncodesAnArgumentAFileAndStdin) {
  ATTN_REQUIRE_CLI();
  auto r = run_cli("tokenize 'Hello, I am'");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "15496 11 314 716\n");
  EXPECT_EQ(r.err, "");
  const std::string file = write_temp(
      "verdict.txt", attn::test::read_text(std::string(ATTN_DATA_DIR) + "/the-verdict.txt"));
  r = run_cli("tokenize --file '" + file + "'");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  const auto words = attn::test::lines_of(r.out);
  ASSERT_EQ(words.size(), 1u);
  EXPECT_EQ(std::count(r.out.begin(), r.out.end(), ' ') + 1, 5145);
  r = run_cli("tokenize < '" + write_temp("in.txt", "Hello, I am") + "'");
  EXPECT_EQ(r.out, "15496 11 314 716\n");
  r = run_cli("tokenize ''");
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_EQ(r.out, "\n");
}

// "<|endoftext|>" by tiktoken's rule, in every command that encodes with
// GPT-2's BPE: refused unless --allow-special, which makes it 50256 (it was
// ordinary text here, and 50256 in train and prepare, before issue 45).
TEST(TokenizerCli, SpecialTokenOnlyWithAllowSpecial) {
  ATTN_REQUIRE_CLI();
  EXPECT_EQ(run_cli("tokenize --allow-special 'a<|endoftext|>b'").out, "64 50256 65\n");
  const auto plain = run_cli("tokenize 'a<|endoftext|>b'");
  EXPECT_EQ(plain.exit_code, 1);
  EXPECT_EQ(plain.out, "");
  EXPECT_EQ(plain.err,
            "attn: tokenize: the text holds \"<|endoftext|>\" at byte 1: GPT-2's special token is "
            "refused unless --allow-special (then it is the token 50256), as tiktoken's encode "
            "refuses it\n");
  const std::string file = write_temp("eot.txt", "one<|endoftext|>two");
  EXPECT_NE(run_cli("tokenize --file '" + file + "'").err.find("--file '" + file + "' holds"),
            std::string::npos);
  EXPECT_EQ(run_cli("tokenize --allow-special --file '" + file + "'").out, "505 50256 11545\n");

  // prepare: refused before anything is written; allowed, the same ids, with
  // 50256 between files as the document separator.
  const std::string out = attn::test::temp_path("eot_shards");
  const auto refused = run_cli("prepare --tokenizer gpt2 '" + file + "' --out '" + out + "'");
  EXPECT_EQ(refused.exit_code, 1);
  EXPECT_NE(refused.err.find("attn: prepare: '" + file + "' holds \"<|endoftext|>\" at byte 3"),
            std::string::npos)
      << refused.err;
  EXPECT_FALSE(std::filesystem::exists(out));
  const auto allowed =
      run_cli("prepare --tokenizer gpt2 --allow-special '" + file + "' --out '" + out + "'");
  EXPECT_EQ(allowed.exit_code, 0) << allowed.err;
  std::filesystem::remove_all(out);

  // train --tokenizer gpt2: refused unless allowed.
  const auto train = run_cli("train --text '" + file + "' --tokenizer gpt2 --out '" + out + "'");
  EXPECT_EQ(train.exit_code, 1);
  EXPECT_NE(train.err.find("attn: train: --text '" + file + "' holds \"<|endoftext|>\" at byte 3"),
            std::string::npos)
      << train.err;
  EXPECT_FALSE(std::filesystem::exists(out));
}

TEST(TokenizerCli, JsonShowsTheVocabularySpellingAndTheText) {
  ATTN_REQUIRE_CLI();
  const auto r = run_cli("tokenize --json 'Hi 😀'");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["ids"], nlohmann::json::parse("[17250, 30325, 222]"));
  ASSERT_EQ(j["tokens"].size(), 3u);
  EXPECT_EQ(j["tokens"][0]["token"], "Hi");
  EXPECT_EQ(j["tokens"][0]["text"], "Hi");
  // " \xF0\x9F\x98" and "\x80": halves of the emoji, not UTF-8 on their own.
  EXPECT_EQ(j["tokens"][1]["token"], "ĠðŁĺ");
  EXPECT_TRUE(j["tokens"][1]["text"].is_null());
  EXPECT_EQ(j["tokens"][2]["token"], "Ģ");
  EXPECT_TRUE(j["tokens"][2]["text"].is_null());
}

TEST(TokenizerCli, DecodesArgumentsAFileAndStdin) {
  ATTN_REQUIRE_CLI();
  auto r = run_cli("tokenize --decode 15496 11 314 716");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "Hello, I am");
  r = run_cli("tokenize --decode --file '" + write_temp("ids.txt", "[15496, 11,\n314 716]\n") +
              "'");
  EXPECT_EQ(r.out, "Hello, I am");
  r = run_cli("tokenize --decode < '" + write_temp("ids.txt", "17250 30325 222") + "'");
  EXPECT_EQ(r.out, "Hi 😀");
  // A character split at the end is written as its bytes.
  r = run_cli("tokenize --decode 30325");
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_EQ(r.out, " \xF0\x9F\x98");
}

TEST(TokenizerCli, BadInputIsOneLineAndAnExitCode) {
  ATTN_REQUIRE_CLI();
  auto r = run_cli("tokenize < '" + write_temp("bad.txt", "ab\xFF\x1B[31m") + "'");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(r.out, "");
  EXPECT_EQ(r.err,
            "attn: tokenize: invalid UTF-8 at byte offset 2: invalid "
            "lead byte "
            "(byte 0xFF)\n");
  r = run_cli("tokenize --decode 15496 50257");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(r.out, "");
  EXPECT_EQ(r.err, "attn: tokenize: token id 50257 is out of range (vocabulary size 50257)\n");
  r = run_cli("tokenize --decode 12 \"$(printf 'x\\377\\033')\"");  // raw 0xFF and ESC
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(r.err, "attn: tokenize: 'x\\xFF\\x1B' is not a token id (an integer)\n");
  r = run_cli("tokenize --decode --file '" + write_temp("ids.txt", "1 2 three") + "'");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(r.err, "attn: tokenize: 'three' is not a token id (an integer)\n");
  r = run_cli("tokenize two words");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(r.err, "attn: tokenize: give the text as one argument (quote it); got 2 arguments\n");
  r = run_cli("tokenize --file /nonexistent/x.txt");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(r.err, "attn: tokenize: --file '/nonexistent/x.txt': no such file\n");
  r = run_cli("tokenize --decode --json 1");
  EXPECT_EQ(r.exit_code, 2);
  r = run_cli("tokenize text --file /dev/null");
  EXPECT_EQ(r.exit_code, 2);
}

TEST(TokenizerCli, RoundTripsTinyShakespeare) {
  ATTN_REQUIRE_CLI();
  const std::string path = std::string(ATTN_DATA_DIR) + "/tinyshakespeare.txt";
  const auto ids = run_cli("tokenize --file '" + path + "'");
  ASSERT_EQ(ids.exit_code, 0) << ids.err;
  const auto text = run_cli("tokenize --decode --file '" + write_temp("ids.txt", ids.out) + "'");
  ASSERT_EQ(text.exit_code, 0) << text.err;
  EXPECT_EQ(text.out, attn::test::read_text(path));
}

}  // namespace
