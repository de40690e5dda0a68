// `attn generate --chat` and `attn tokenize --chat` on the fixtures' Qwen3 and
// Llama 3 directories (tokenizer_config.json with the published templates):
// the prompt ids equal transformers' apply_chat_template(tokenize=True) ids
// (tests/fixtures/make_chat_template_fixtures.py), the reply stops at the
// template's eos_token, and what cannot chat is refused with one line.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "attn/hf_tokenizer.h"
#include "cli.h"

namespace {

using attn::test::CliResult;
using attn::test::run_cli;
using Json = nlohmann::json;
namespace fs = std::filesystem;

const std::string kFixtures = std::string(ATTN_TESTS_DIR) + "/fixtures";

std::vector<int64_t> ids_of(const std::string& line) {
  std::vector<int64_t> ids;
  std::istringstream in(line);
  for (int64_t id = 0; in >> id;) ids.push_back(id);
  return ids;
}

std::string shell_quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

// --system and --chat-template-kwargs of a case.
std::string chat_options(const Json& m) {
  std::string args;
  if (!m["system"].is_null()) args += " --system " + shell_quote(m["system"]);
  if (!m["kwargs"].empty()) args += " --chat-template-kwargs " + shell_quote(m["kwargs"].dump());
  return args;
}

TEST(ChatCli, PromptIdsMatchTransformers) {
  const Json expected =
      Json::parse(attn::test::read_text(kFixtures + "/chat_templates/expected.json"));
  ASSERT_GE(expected["model_dirs"].size(), 6u);
  for (const Json& m : expected["model_dirs"]) {
    const std::string dir = kFixtures + "/" + m["dir"].get<std::string>();
    const auto want = m["ids"].get<std::vector<int64_t>>();
    SCOPED_TRACE(dir + chat_options(m));
    const Json config = Json::parse(attn::test::read_text(dir + "/config.json"));
    const bool fits = want.size() + 2 <= config["max_position_embeddings"].get<size_t>();
    const CliResult g = run_cli("generate --model '" + dir + "' --chat --prompt " +
                                shell_quote(m["prompt"]) + chat_options(m) +
                                " --print-ids --greedy --max-new-tokens 2");
    if (fits) {
      ASSERT_EQ(g.exit_code, 0) << g.err;
      const std::vector<int64_t> got = ids_of(g.out);
      ASSERT_GE(got.size(), want.size());
      EXPECT_EQ(std::vector<int64_t>(got.begin(), got.begin() + static_cast<long>(want.size())),
                want);
      EXPECT_LE(got.size(), want.size() + 2);
    } else {  // the tiny Llama's 64 positions: the prompt was measured and refused
      EXPECT_NE(g.err.find("a prompt of " + std::to_string(want.size()) + " tokens"), std::string::npos)
          << g.err;
    }

    const CliResult t = run_cli("tokenize --tokenizer '" + dir + "' --json --chat" +
                                chat_options(m) + " " + shell_quote(m["prompt"]));
    ASSERT_EQ(t.exit_code, 0) << t.err;
    const Json j = Json::parse(t.out);
    EXPECT_EQ(j["text"], m["text"]);
    EXPECT_EQ(j["ids"].get<std::vector<int64_t>>(), want);
  }
}

// The reply stops at tokenizer_config.json's eos_token: a directory whose
// eos_token is the token the model picks first generates nothing.
TEST(ChatCli, ReplyStopsAtTheTemplatesEosToken) {
  const std::string qwen = kFixtures + "/open_models/qwen3";
  const CliResult first = run_cli("generate --model '" + qwen +
                                  "' --chat --prompt hi --print-ids --greedy --max-new-tokens 1");
  ASSERT_EQ(first.exit_code, 0) << first.err;
  const std::vector<int64_t> ids = ids_of(first.out);
  ASSERT_FALSE(ids.empty());
  const auto tok = attn::text::HfTokenizer::from_file(qwen + "/tokenizer.json");
  const std::string picked = tok.id_to_token(ids.back());

  const fs::path dir = attn::test::temp_path("chat_eos");
  fs::create_directories(dir);
  for (const char* f : {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json"})
    fs::create_symlink(fs::absolute(fs::path(qwen) / f), dir / f);
  Json config = Json::parse(attn::test::read_text(qwen + "/tokenizer_config.json"));
  config["eos_token"] = picked;
  std::ofstream(dir / "tokenizer_config.json") << config.dump();
  const CliResult stopped = run_cli("generate --model '" + dir.string() +
                                    "' --chat --prompt hi --print-ids --greedy --max-new-tokens 5");
  ASSERT_EQ(stopped.exit_code, 0) << stopped.err;
  EXPECT_EQ(ids_of(stopped.out), std::vector<int64_t>(ids.begin(), ids.end() - 1));
  // Text output: the reply only (nothing here), not the prompt.
  const CliResult text = run_cli("generate --model '" + dir.string() +
                                 "' --chat --prompt hi --greedy --max-new-tokens 5");
  ASSERT_EQ(text.exit_code, 0) << text.err;
  EXPECT_EQ(text.out, "\n");

  // Without a template: one line naming the directory.
  fs::remove(dir / "tokenizer_config.json");
  const CliResult none = run_cli("generate --model '" + dir.string() + "' --chat --prompt hi");
  EXPECT_NE(none.exit_code, 0);
  EXPECT_NE(none.err.find("has no chat template"), std::string::npos) << none.err;
  EXPECT_EQ(std::count(none.err.begin(), none.err.end(), '\n'), 1) << none.err;
  // --chat-template FILE gives one.
  std::ofstream(dir / "t.jinja") << "{{ messages[0]['content'] }} =";
  const CliResult file = run_cli("tokenize --tokenizer '" + dir.string() + "' --chat --chat-template '" +
                                 (dir / "t.jinja").string() + "' --json hi");
  ASSERT_EQ(file.exit_code, 0) << file.err;
  EXPECT_EQ(Json::parse(file.out)["text"], "hi =");
  fs::remove_all(dir);
}

TEST(ChatCli, RefusedWithOneLine) {
  const std::string qwen = "'" + kFixtures + "/open_models/qwen3'";
  const std::string gpt2 = "'" + kFixtures + "/hf_gpt2'";
  struct Case {
    std::string args, message;
  };
  const std::vector<Case> cases = {
      {"generate --model " + gpt2 + " --chat --prompt hi", "GPT-2 model, which has none"},
      {"generate --model " + qwen + " --chat --prompt-ids 1", "--chat needs --prompt"},
      {"generate --model " + qwen + " --chat", "--chat needs --prompt"},
      {"generate --model " + qwen + " --prompt hi --system x", "go with --chat"},
      {"generate --model " + qwen + " --chat --prompt hi --chat-template-kwargs '[1]'",
       "must be a JSON object"},
      {"generate --model " + qwen + " --chat --prompt hi --chat-template /no/such.jinja",
       "is not a file"},
      {"tokenize --tokenizer " + qwen + " --chat --decode 1", "--chat goes with --tokenizer DIR"},
      {"tokenize --chat hi", "--chat goes with --tokenizer DIR"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.args);
    const CliResult r = run_cli(c.args);
    EXPECT_NE(r.exit_code, 0);
    EXPECT_NE(r.err.find(c.message), std::string::npos) << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  }
}

}  // namespace
