// The `attn` command line as a user meets it: exit codes, one-line errors that name
// the bad value, help on stdout, and the walkthrough's text and JSON forms.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli.h"

using attn::test::lines_of;
using attn::test::run_cli;

namespace {

const std::vector<std::string> kSections = {"simplified", "trainable", "self-attention",
                                            "causal",     "dropout",   "multihead",
                                            "averaging",  "embedding"};

// The error contract: non-zero exit, nothing on stdout, exactly one line on stderr
// that starts with "attn: ".
void expect_one_line_error(const attn::test::CliResult& r) {
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.exit_code, -1) << "crashed";
  EXPECT_EQ(r.out, "");
  const auto lines = lines_of(r.err);
  ASSERT_EQ(lines.size(), 1u) << "stderr:\n" << r.err;
  EXPECT_EQ(lines[0].rfind("attn: ", 0), 0u) << lines[0];
}

TEST(Cli, WalkthroughPrintsEverySection) {
  ATTN_REQUIRE_CLI();
  const auto r = run_cli("walkthrough");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.err, "");
  // Eight section headers, in order, and tensors under them.
  size_t at = 0;
  for (int i = 1; i <= 8; ++i) {
    const std::string header = "== " + std::to_string(i) + ". ";
    const size_t found = r.out.find(header, at);
    ASSERT_NE(found, std::string::npos) << "no header " << header;
    at = found;
  }
  EXPECT_NE(r.out.find("tensor([[0.4300, 0.1500, 0.8900],"), std::string::npos);
  EXPECT_NE(r.out.find("# "), std::string::npos);
}

// The text form shows every tensor of the JSON form, each under its explanation line,
// with a blank line before each step.
TEST(Cli, TextShowsEveryTensorUnderItsExplanation) {
  ATTN_REQUIRE_CLI();
  const auto text = run_cli("walkthrough --section causal --section averaging");
  const auto json = run_cli("walkthrough --section causal --section averaging --json");
  ASSERT_EQ(text.exit_code, 0) << text.err;
  ASSERT_EQ(json.exit_code, 0) << json.err;
  for (const auto& t : nlohmann::json::parse(json.out)) {
    const std::string block = "\n\n# " + t.at("explanation").get<std::string>() + "\n" +
                              t.at("text").get<std::string>() + "\n";
    EXPECT_NE(text.out.find(block), std::string::npos) << block;
  }
  EXPECT_NE(text.out.find("== 4. "), std::string::npos);
  EXPECT_NE(text.out.find("== 7. "), std::string::npos);
  EXPECT_EQ(text.out.find("== 1. "), std::string::npos);
}

TEST(Cli, HelpGoesToStdoutAndListsCommandsAndSections) {
  ATTN_REQUIRE_CLI();
  const auto top = run_cli("--help");
  EXPECT_EQ(top.exit_code, 0);
  EXPECT_EQ(top.err, "");
  EXPECT_NE(top.out.find("walkthrough"), std::string::npos) << top.out;

  const auto sub = run_cli("walkthrough --help");
  EXPECT_EQ(sub.exit_code, 0);
  EXPECT_EQ(sub.err, "");
  for (const auto& s : kSections) EXPECT_NE(sub.out.find(s), std::string::npos) << s;
  EXPECT_NE(sub.out.find("--seed"), std::string::npos);
  EXPECT_NE(sub.out.find("--json"), std::string::npos);
}

// attn --version: the version of the file VERSION and the commit first (the
// line help2man and scripts read), then what the build has.
TEST(Cli, VersionGoesToStdoutWithTheBuild) {
  ATTN_REQUIRE_CLI();
  const auto r = run_cli("--version");
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_EQ(r.err, "");
  const auto lines = lines_of(r.out);
  ASSERT_EQ(lines.size(), 5u) << r.out;
  std::string version = attn::test::read_text(std::string(ATTN_TESTS_DIR) + "/../VERSION");
  while (!version.empty() && version.back() == '\n') version.pop_back();
  EXPECT_EQ(lines[0].rfind("attn " + version + " (commit ", 0), 0u) << lines[0];
  EXPECT_EQ(lines[0].back(), ')') << lines[0];
  EXPECT_EQ(lines[0].find("(commit )"), std::string::npos) << lines[0];
  EXPECT_EQ(lines[1].rfind("SIMD target: ", 0), 0u) << lines[1];
  EXPECT_EQ(lines[2].rfind("GEMM: ", 0), 0u) << lines[2];
  EXPECT_NE(lines[2].find("BLAS "), std::string::npos) << lines[2];
  EXPECT_EQ(lines[3].rfind("MPI: ", 0), 0u) << lines[3];
  EXPECT_EQ(lines[4].rfind("Python module: ", 0), 0u) << lines[4];
  // An unknown ATTN_GEMM_ENGINE still lets --version print, naming the value.
  attn::test::ScopedEnv engine("ATTN_GEMM_ENGINE", "nosuch");
  const auto bad = run_cli("--version");
  EXPECT_EQ(bad.exit_code, 0) << bad.err;
  EXPECT_NE(bad.out.find("nosuch"), std::string::npos) << bad.out;
}

// attn --completion bash: a script that bash runs, whose _attn completes the
// commands, a command's options, a nested command, and leaves a value after an
// option to bash's file names.
TEST(Cli, BashCompletionCompletesCommandsAndOptions) {
  ATTN_REQUIRE_CLI();
  const auto r = run_cli("--completion bash");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.err, "");
  const std::string script = attn::test::temp_path("attn.bash");
  {
    std::ofstream out(script);
    out << r.out;
  }
  // complete(words...): COMPREPLY for the last word being typed.
  const auto complete = [&](const std::string& words) {
    const std::string out = attn::test::temp_path("reply");
    const std::string command = "bash -c 'source \"" + script + "\"; COMP_WORDS=(" + words +
                                "); COMP_CWORD=$((${#COMP_WORDS[@]} - 1)); _attn; "
                                "printf \"%s\\n\" \"${COMPREPLY[@]}\"' >'" +
                                out + "' 2>&1";
    EXPECT_EQ(std::system(command.c_str()), 0) << command;
    const std::string reply = attn::test::read_text(out);
    std::remove(out.c_str());
    return lines_of(reply);
  };
  using V = std::vector<std::string>;
  EXPECT_EQ(complete("attn gen"), V{"generate"});
  EXPECT_EQ(complete("attn tok"), V{"tokenize"});
  const auto top = complete("attn generate --top");
  EXPECT_EQ(top, (V{"--top-k", "--top-p"}));
  EXPECT_EQ(complete("attn plot lo"), V{"loss"});
  // After a valued option, its value is skipped: still generate's options.
  EXPECT_EQ(complete("attn generate --seed 1 --top-"), (V{"--top-k", "--top-p"}));
  // A value after an option that takes one: no words of attn's (bash's files).
  EXPECT_EQ(complete("attn generate --seed \"\""), V{""});
  EXPECT_EQ(complete("attn --vers"), V{"--version"});
  std::remove(script.c_str());

  const auto zsh = run_cli("--completion zsh");
  expect_one_line_error(zsh);
  EXPECT_NE(zsh.err.find("zsh"), std::string::npos) << zsh.err;
}

TEST(Cli, UnknownSectionNamesTheValueAndTheKnownOnes) {
  ATTN_REQUIRE_CLI();
  const auto r = run_cli("walkthrough --section nosuch");
  expect_one_line_error(r);
  EXPECT_NE(r.err.find("unknown section 'nosuch'"), std::string::npos) << r.err;
  for (const auto& s : kSections) EXPECT_NE(r.err.find(s), std::string::npos) << s;
}

TEST(Cli, MissingSeedValueIsOneLine) {
  ATTN_REQUIRE_CLI();
  const auto r = run_cli("walkthrough --seed");
  expect_one_line_error(r);
  EXPECT_NE(r.err.find("--seed"), std::string::npos) << r.err;
}

TEST(Cli, NonNumberSeedIsOneLine) {
  ATTN_REQUIRE_CLI();
  const auto r = run_cli("walkthrough --seed abc");
  expect_one_line_error(r);
  EXPECT_NE(r.err.find("abc"), std::string::npos) << r.err;
}

TEST(Cli, OutOfRangeSeedIsOneLine) {
  ATTN_REQUIRE_CLI();
  // torch.manual_seed takes [-2^63, 2^64 - 1]; one more is "Overflow when unpacking long".
  const auto r = run_cli("walkthrough --seed 18446744073709551616");
  expect_one_line_error(r);
  EXPECT_NE(r.err.find("'18446744073709551616'"), std::string::npos) << r.err;
  expect_one_line_error(run_cli("walkthrough --seed 0x10"));
  expect_one_line_error(run_cli("walkthrough --seed 7.5"));
}

TEST(Cli, NegativeSeedWrapsLikeTorch) {
  ATTN_REQUIRE_CLI();
  const auto minus_one = run_cli("walkthrough --json --section trainable --seed -1");
  const auto max = run_cli("walkthrough --json --section trainable --seed 18446744073709551615");
  ASSERT_EQ(minus_one.exit_code, 0) << minus_one.err;
  ASSERT_EQ(max.exit_code, 0) << max.err;
  EXPECT_EQ(minus_one.out, max.out);
}

// Only the low 32 bits of a seed reach MT19937 (RNG.md): 2^32 draws what 0 draws.
TEST(Cli, SeedUsesItsLow32BitsLikeTorch) {
  ATTN_REQUIRE_CLI();
  const auto zero = run_cli("walkthrough --json --seed 0");
  const auto two_to_32 = run_cli("walkthrough --json --seed 4294967296");
  ASSERT_EQ(zero.exit_code, 0) << zero.err;
  ASSERT_EQ(two_to_32.exit_code, 0) << two_to_32.err;
  const auto a = nlohmann::json::parse(zero.out);
  const auto b = nlohmann::json::parse(two_to_32.out);
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].at("text"), b[i].at("text")) << a[i].at("name");
  }
}

TEST(Cli, UnknownCommandIsOneLine) {
  ATTN_REQUIRE_CLI();
  const auto r = run_cli("frobnicate");
  expect_one_line_error(r);
  EXPECT_NE(r.err.find("'frobnicate'"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("walkthrough"), std::string::npos) << r.err;
}

// `attn` alone prints the help, as git and cargo do, and succeeds.
TEST(Cli, NoCommandPrintsTheHelp) {
  ATTN_REQUIRE_CLI();
  const auto r = run_cli("");
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_EQ(r.err, "");
  EXPECT_EQ(r.out, run_cli("--help").out);
  EXPECT_NE(r.out.find("walkthrough"), std::string::npos) << r.out;
}

// Every error names the command ("attn: export: --out is required"), CLI11's
// parse errors included, and never a library function's qualified name
// ("Tokenizer::encode_parallel:", "gemm::set_blas_threads:").
TEST(Cli, ErrorsNameTheCommandAndNoLibraryFunction) {
  ATTN_REQUIRE_CLI();
  const auto missing = run_cli("export --model x --format hf");
  expect_one_line_error(missing);
  EXPECT_EQ(missing.err, "attn: export: --out is required\n");
  const auto bad_seed = run_cli("walkthrough --seed abc");
  expect_one_line_error(bad_seed);
  EXPECT_EQ(bad_seed.err.rfind("attn: walkthrough: ", 0), 0u) << bad_seed.err;
  const auto nested = run_cli("plot mask --no-such-option");
  expect_one_line_error(nested);
  EXPECT_EQ(nested.err.rfind("attn: plot: ", 0), 0u) << nested.err;
  const auto threads = run_cli("generate --config 124m --benchmark -t 0");
  expect_one_line_error(threads);
  EXPECT_EQ(threads.err, "attn: generate: --threads: must be a whole number in 1..4096, got '0'\n");
  for (const auto* r : {&missing, &bad_seed, &nested, &threads}) {
    EXPECT_EQ(r->err.find("::"), std::string::npos) << r->err;
  }
}

// -t/--threads on every command that computes.
TEST(Cli, EveryComputingCommandTakesThreads) {
  ATTN_REQUIRE_CLI();
  for (const char* command : {"walkthrough", "generate", "eval", "serve", "plot attention", "train",
                              "prepare", "bench"}) {
    const auto r = run_cli(std::string(command) + " --help");
    EXPECT_EQ(r.exit_code, 0) << command;
    EXPECT_NE(r.out.find("-t,--threads"), std::string::npos) << command << ":\n" << r.out;
  }
  // The walkthrough's numbers do not depend on the thread count.
  const auto one = run_cli("walkthrough --json --section multihead -t 1");
  const auto two = run_cli("walkthrough --json --section multihead --threads 2");
  ASSERT_EQ(one.exit_code, 0) << one.err;
  EXPECT_EQ(one.out, two.out);
}

TEST(Cli, UnknownOptionIsOneLine) {
  ATTN_REQUIRE_CLI();
  const auto r = run_cli("walkthrough --no-such-option");
  expect_one_line_error(r);
  EXPECT_NE(r.err.find("--no-such-option"), std::string::npos) << r.err;
}

TEST(Cli, JsonIsAnArrayOfPrintedTensors) {
  ATTN_REQUIRE_CLI();
  const auto r = run_cli("walkthrough --json --section trainable");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  ASSERT_TRUE(j.is_array());
  ASSERT_FALSE(j.empty());
  for (const auto& t : j) {
    EXPECT_EQ(t.at("section"), "trainable");
    for (const char* key : {"name", "explanation", "shape", "values", "text"}) {
      EXPECT_TRUE(t.contains(key)) << key;
    }
    int64_t numel = 1;
    for (const auto& d : t.at("shape")) numel *= d.get<int64_t>();
    EXPECT_EQ(static_cast<int64_t>(t.at("values").size()), numel) << t.at("name");
    EXPECT_EQ(t.at("text").get<std::string>().rfind("tensor(", 0), 0u) << t.at("name");
  }
  // The single score prints as a 0-d tensor, like PyTorch.
  bool found = false;
  for (const auto& t : j) {
    if (t.at("name") == "attn_score_22") {
      found = true;
      EXPECT_TRUE(t.at("shape").empty());
      EXPECT_EQ(t.at("text").get<std::string>().find('['), std::string::npos) << t.at("text");
    }
  }
  EXPECT_TRUE(found);
}

TEST(Cli, SectionsRunInTheOrderGiven) {
  ATTN_REQUIRE_CLI();
  const auto r = run_cli("walkthrough --json --section dropout --section causal");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  ASSERT_FALSE(j.empty());
  EXPECT_EQ(j.front().at("section"), "dropout");
  EXPECT_EQ(j.back().at("section"), "causal");
  for (const auto& t : j) {
    EXPECT_TRUE(t.at("section") == "dropout" || t.at("section") == "causal") << t.at("section");
  }
  // A comma-separated list means the same.
  const auto r2 = run_cli("walkthrough --json --section dropout,causal");
  ASSERT_EQ(r2.exit_code, 0) << r2.err;
  EXPECT_EQ(r2.out, r.out);
}

TEST(Cli, SeedReplacesEverySeedAndIsDeterministic) {
  ATTN_REQUIRE_CLI();
  const auto book = run_cli("walkthrough --json --section trainable");
  const auto seven = run_cli("walkthrough --json --section trainable --seed 7");
  const auto seven_again = run_cli("walkthrough --json --section trainable --seed 7");
  ASSERT_EQ(book.exit_code, 0) << book.err;
  ASSERT_EQ(seven.exit_code, 0) << seven.err;
  EXPECT_EQ(seven.out, seven_again.out);
  const auto a = nlohmann::json::parse(book.out);
  const auto b = nlohmann::json::parse(seven.out);
  ASSERT_EQ(a.size(), b.size());
  EXPECT_EQ(a.front().at("name"), "W_query");
  EXPECT_NE(a.front().at("values"), b.front().at("values"));
  EXPECT_NE(b.front().at("explanation").get<std::string>().find("torch.manual_seed(7)"),
            std::string::npos);
}

TEST(Cli, JsonOutWritesTheFileWhole) {
  ATTN_REQUIRE_CLI();
  const std::string dir = attn::test::temp_path("jsonout");
  std::filesystem::create_directories(dir);
  const std::string file = dir + "/walk.json";
  const auto r = run_cli("walkthrough --section simplified --json --json-out '" + file + "'");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(attn::test::read_text(file), r.out);
  // Nothing but the file itself is left in the folder.
  int entries = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    (void)e;
    ++entries;
  }
  EXPECT_EQ(entries, 1);
  std::filesystem::remove_all(dir);

  const auto bad =
      run_cli("walkthrough --section simplified --json-out '" + dir + "/no/such/folder/walk.json'");
  expect_one_line_error(bad);
  EXPECT_NE(bad.err.find("no/such/folder/walk.json"), std::string::npos) << bad.err;
}

}  // namespace
