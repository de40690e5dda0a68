// `attn walkthrough --chapter N`: chapter 3 stays the default, chapter 4's flags and
// errors (one line naming the value), and its cheap "batch" section in text and JSON.
// The GPT-124M sections are compared with PyTorch in
// tests/torch/test_walkthrough_ch4_torch.cpp.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli.h"

using attn::test::lines_of;
using attn::test::run_cli;

namespace {

const std::vector<std::string> kCh4Sections = {"batch",    "dummy", "layernorm", "feedforward",
                                               "shortcut", "block", "gpt",       "generate"};

// Non-zero exit, nothing on stdout, one line on stderr starting "attn: ".
void expect_one_line_error(const attn::test::CliResult& r) {
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.exit_code, -1) << "crashed";
  EXPECT_EQ(r.out, "");
  const auto lines = lines_of(r.err);
  ASSERT_EQ(lines.size(), 1u) << "stderr:\n" << r.err;
  EXPECT_EQ(lines[0].rfind("attn: ", 0), 0u) << lines[0];
}

TEST(WalkthroughCh4Cli, UnknownChapterNamesItAndTheKnownOnes) {
  ATTN_REQUIRE_CLI();
  for (const char* chapter : {"6", "2", "0", "-4"}) {
    const auto r = run_cli(std::string("walkthrough --chapter ") + chapter);
    expect_one_line_error(r);
    EXPECT_NE(r.err.find(std::string("--chapter ") + chapter + ":"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("chapters 3 (attention), 4 (the GPT model) and 5 (pretraining"),
              std::string::npos)
        << r.err;
  }
  expect_one_line_error(run_cli("walkthrough --chapter four"));
  expect_one_line_error(run_cli("walkthrough --chapter"));
}

TEST(WalkthroughCh4Cli, UnknownSectionNamesChapterFoursSections) {
  ATTN_REQUIRE_CLI();
  // "causal" is a chapter-3 section, not a chapter-4 one.
  const auto r = run_cli("walkthrough --chapter 4 --section batch,causal");
  expect_one_line_error(r);
  EXPECT_NE(r.err.find("unknown section 'causal' for chapter 4 (known: batch, dummy, layernorm, "
                       "feedforward, shortcut, block, gpt, generate)"),
            std::string::npos)
      << r.err;
  // And the other way round: chapter 3 (the default) does not know "gpt".
  const auto r3 = run_cli("walkthrough --section gpt");
  expect_one_line_error(r3);
  EXPECT_NE(r3.err.find("unknown section 'gpt'"), std::string::npos) << r3.err;
  EXPECT_NE(r3.err.find("causal"), std::string::npos) << r3.err;
}

TEST(WalkthroughCh4Cli, ChapterThreeFlagsAreRefusedNamingTheFlag) {
  ATTN_REQUIRE_CLI();
  const std::string dir = attn::test::temp_path("plots");
  for (const std::string& flag :
       {std::string("--seed 7"), "--plot '" + dir + "'", "--html '" + dir + ".html'"}) {
    const auto r = run_cli("walkthrough --chapter 4 --section batch " + flag);
    expect_one_line_error(r);
    const std::string name = flag.substr(0, flag.find(' '));
    EXPECT_NE(r.err.find(name + " is chapter 3's"), std::string::npos) << r.err;
  }
  const auto r = run_cli("walkthrough --chapter 4 --section batch --heatmap");
  expect_one_line_error(r);
  EXPECT_NE(r.err.find("--heatmap is chapter 3's"), std::string::npos) << r.err;
}

TEST(WalkthroughCh4Cli, BatchSectionAsJson) {
  ATTN_REQUIRE_CLI();
  const auto r = run_cli("walkthrough --chapter 4 --section batch --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.err, "");  // nothing long to report on
  const auto j = nlohmann::json::parse(r.out);
  ASSERT_EQ(j.size(), 1u);
  EXPECT_EQ(j[0].at("section"), "batch");
  EXPECT_EQ(j[0].at("name"), "batch");
  EXPECT_NE(j[0].at("explanation").get<std::string>().find("torch.stack"), std::string::npos);
  EXPECT_EQ(j[0].at("text"),
            "tensor([[6109, 3626, 6100,  345],\n        [6109, 1110, 6622,  257]])");
  EXPECT_EQ(j[0].at("value").at("shape"), nlohmann::json({2, 4}));
  EXPECT_EQ(j[0].at("value").at("values"),
            nlohmann::json({6109, 3626, 6100, 345, 6109, 1110, 6622, 257}));
}

TEST(WalkthroughCh4Cli, BatchSectionAsTextHasHeaderAndExplanation) {
  ATTN_REQUIRE_CLI();
  const auto r = run_cli("walkthrough --chapter 4 --section batch");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto lines = lines_of(r.out);
  ASSERT_GE(lines.size(), 4u) << r.out;
  EXPECT_EQ(lines[0].rfind("attn walkthrough --chapter 4:", 0), 0u) << lines[0];
  EXPECT_NE(r.out.find("\n== 1. A batch of token ids ==\n"), std::string::npos) << r.out;
  const std::string tensor = "tensor([[6109, 3626, 6100,  345],";
  const size_t at = r.out.find("\n" + tensor + "\n");
  ASSERT_NE(at, std::string::npos) << r.out;
  // The line above the tensor is its explanation.
  const size_t line_start = r.out.rfind('\n', at - 1);
  EXPECT_EQ(r.out.compare(line_start + 1, 2, "# "), 0) << r.out.substr(line_start, at - line_start);
}

TEST(WalkthroughCh4Cli, ChapterThreeIsTheDefault) {
  ATTN_REQUIRE_CLI();
  const auto plain = run_cli("walkthrough --section trainable --json");
  const auto three = run_cli("walkthrough --chapter 3 --section trainable --json");
  ASSERT_EQ(plain.exit_code, 0) << plain.err;
  EXPECT_EQ(plain.out, three.out);
  EXPECT_NE(plain.out.find("W_query"), std::string::npos);
}

TEST(WalkthroughCh4Cli, HelpListsBothChaptersSections) {
  ATTN_REQUIRE_CLI();
  const auto r = run_cli("walkthrough --help");
  ASSERT_EQ(r.exit_code, 0);
  EXPECT_NE(r.out.find("--chapter"), std::string::npos) << r.out;
  for (const auto& s : kCh4Sections) EXPECT_NE(r.out.find("  " + s + " "), std::string::npos) << s;
}

}  // namespace
