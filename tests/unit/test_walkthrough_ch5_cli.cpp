// `attn walkthrough --chapter 5`: its flags and errors (one line naming the
// value), the sections it has and says it has, and its cheap sections (The
// Verdict's counts and the loaders, no model) against the book's numbers. The
// model's sections are compared with PyTorch in
// tests/torch/test_walkthrough_ch5_torch.cpp.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli.h"

using attn::test::lines_of;
using attn::test::run_cli;

namespace {

const std::vector<std::string> kCh5Sections = {
    "generate", "loss",     "data", "loaders", "loader_loss", "train", "trained_generate",
    "decoding", "top_k_generate"};
const std::string kText = std::string("--text '") + ATTN_DATA_DIR + "/the-verdict.txt'";

void expect_one_line_error(const attn::test::CliResult& r) {
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.exit_code, -1) << "crashed";
  EXPECT_EQ(r.out, "");
  const auto lines = lines_of(r.err);
  ASSERT_EQ(lines.size(), 1u) << "stderr:\n" << r.err;
  EXPECT_EQ(lines[0].rfind("attn: ", 0), 0u) << lines[0];
}

TEST(WalkthroughCh5Cli, UnknownSectionListsTheAvailableOnes) {
  ATTN_REQUIRE_CLI();
  // "training" is not a section's name (the section is "train"); "gpt" is chapter 4's.
  for (const char* name : {"training", "gpt", "samples"}) {
    const auto r = run_cli(std::string("walkthrough --chapter 5 --section data,") + name);
    expect_one_line_error(r);
    EXPECT_NE(r.err.find(std::string("unknown section '") + name +
                         "' for chapter 5 (known: generate, loss, data, loaders, loader_loss, "
                         "train, trained_generate, decoding, top_k_generate)"),
              std::string::npos)
        << r.err;
  }
}

// --epochs is the training cell's num_epochs: chapter 5's, 1..1000 (issue 46:
// bounded). Nothing is trained before the flags are checked.
TEST(WalkthroughCh5Cli, EpochsIsChapterFivesAndAtLeastOne) {
  ATTN_REQUIRE_CLI();
  for (const char* bad : {"0", "-3", "1001", "9223372036854775807"}) {
    const auto r = run_cli(std::string("walkthrough --chapter 5 --section train --epochs ") + bad);
    expect_one_line_error(r);
    EXPECT_NE(
        r.err.find(std::string("--epochs must be in 1..1000 (the notebook trains 10), got ") + bad),
        std::string::npos)
        << r.err;
  }
  const auto r = run_cli("walkthrough --chapter 4 --section batch --epochs 2");
  expect_one_line_error(r);
  EXPECT_NE(r.err.find("--epochs is chapter 5's"), std::string::npos) << r.err;
}

TEST(WalkthroughCh5Cli, ChapterThreeFlagsAreRefusedNamingTheFlag) {
  ATTN_REQUIRE_CLI();
  const std::string dir = attn::test::temp_path("plots5");
  for (const std::string& flag : {std::string("--seed 7"), "--plot '" + dir + "'",
                                  "--html '" + dir + ".html'", std::string("--heatmap")}) {
    const auto r = run_cli("walkthrough --chapter 5 --section data " + flag);
    expect_one_line_error(r);
    const std::string name = flag.substr(0, flag.find(' '));
    EXPECT_NE(r.err.find(name + " is chapter 3's"), std::string::npos) << r.err;
  }
}

TEST(WalkthroughCh5Cli, TextIsChapterFivesAndAMissingFileIsNamed) {
  ATTN_REQUIRE_CLI();
  const auto r = run_cli("walkthrough --chapter 4 --section batch " + kText);
  expect_one_line_error(r);
  EXPECT_NE(r.err.find("--text is chapter 5's"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("this is chapter 4"), std::string::npos) << r.err;

  const std::string missing = attn::test::temp_path("no-such-verdict.txt");
  const auto m = run_cli("walkthrough --chapter 5 --section data --text '" + missing + "'");
  expect_one_line_error(m);
  EXPECT_NE(m.err.find("cannot read '" + missing + "'"), std::string::npos) << m.err;
}

// The book's numbers: 20479 characters, 5145 tokens; 9 training batches of
// (2, 256) and 1 validation batch; 4608 + 512 = 5120 tokens. No model is built.
TEST(WalkthroughCh5Cli, DataAndLoadersAreTheBooks) {
  ATTN_REQUIRE_CLI();
  const auto r = run_cli("walkthrough --chapter 5 --json --section loaders,data " + kText);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.err.find("GPTModel"), std::string::npos) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  ASSERT_EQ(j.size(), 19u) << r.out;  // data 4, then loaders 15 (the notebook's order)
  EXPECT_EQ(j[0].at("section"), "data");
  EXPECT_EQ(j[0].at("text").get<std::string>().rfind("I HAD always thought Jack Gisburn", 0), 0u);
  EXPECT_EQ(j[0].at("text").get<std::string>().size(), 99u);
  EXPECT_EQ(j[2].at("text"), "Characters: 20479");
  EXPECT_EQ(j[3].at("text"), "Tokens: 5145");
  EXPECT_EQ(j[3].at("value"), 5145);
  EXPECT_EQ(j[4].at("text"), "Train loader:");
  for (int k = 5; k < 14; ++k) {
    EXPECT_EQ(j[k].at("text"), "torch.Size([2, 256]) torch.Size([2, 256])") << k;
  }
  EXPECT_EQ(j[14].at("text"), "\nValidation loader:");
  EXPECT_EQ(j[15].at("text"), "torch.Size([2, 256]) torch.Size([2, 256])");
  EXPECT_EQ(j[16].at("text"), "Training tokens: 4608");
  EXPECT_EQ(j[17].at("text"), "Validation tokens: 512");
  EXPECT_EQ(j[18].at("text"), "All tokens: 5120");
  for (const auto& p : j) EXPECT_FALSE(p.at("explanation").get<std::string>().empty());
}

TEST(WalkthroughCh5Cli, TextFormHasHeadersAndExplanations) {
  ATTN_REQUIRE_CLI();
  const auto r = run_cli("walkthrough --chapter 5 --section data " + kText);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto lines = lines_of(r.out);
  ASSERT_GE(lines.size(), 4u) << r.out;
  EXPECT_EQ(lines[0].rfind("attn walkthrough --chapter 5:", 0), 0u) << lines[0];
  EXPECT_NE(r.out.find("\n== 3. The Verdict: the training text ==\n"), std::string::npos) << r.out;
  const size_t at = r.out.find("\nCharacters: 20479\n");
  ASSERT_NE(at, std::string::npos) << r.out;
  const size_t line_start = r.out.rfind('\n', at - 1);
  EXPECT_EQ(r.out.compare(line_start + 1, 2, "# "), 0) << r.out;
}

TEST(WalkthroughCh5Cli, HelpListsChapterFivesSectionsAndWhatIsMissing) {
  ATTN_REQUIRE_CLI();
  const auto r = run_cli("walkthrough --help");
  ASSERT_EQ(r.exit_code, 0);
  EXPECT_NE(r.out.find("Chapter 5's sections (--chapter 5)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("the notebook with its training"), std::string::npos) << r.out;
  for (const auto& s : kCh5Sections) EXPECT_NE(r.out.find("  " + s + " "), std::string::npos) << s;
}

}  // namespace
