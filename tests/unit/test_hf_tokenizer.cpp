// tokenizer.json tokenizers (attn/hf_tokenizer.h) against Hugging Face
// tokenizers 0.23.3 (tests/fixtures/make_hf_tokenizer_fixtures.py): for Llama
// 3's, Qwen's and Gemma's pipelines, trained on the repository's texts, the
// ids of 17 texts (multilingual, emoji, numbers, whitespace runs, decomposed
// accents, special tokens and their look-alikes) with and without the
// post-processor's special tokens, and the decoded text with and without the
// specials.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "attn/hf_tokenizer.h"
#include "cli.h"

namespace attn::test {
namespace {

const std::string kFixtures = std::string(ATTN_TESTS_DIR) + "/fixtures/hf_tokenizers";

nlohmann::json expected(const std::string& name) {
  return nlohmann::json::parse(read_text(kFixtures + "/" + name + "/expected.json"));
}

class HfTokenizerCase : public ::testing::TestWithParam<const char*> {};

TEST_P(HfTokenizerCase, IdsAndTextEqualTokenizers) {
  const text::HfTokenizer tok =
      text::HfTokenizer::from_file(kFixtures + "/" + GetParam() + "/tokenizer.json");
  const nlohmann::json want = expected(GetParam());
  EXPECT_EQ(tok.vocab_size(), want["vocab_size"].get<int64_t>());
  int index = 0;
  for (const auto& c : want["cases"]) {
    const std::string text = c["text"].get<std::string>();
    const auto ids = c["ids"].get<std::vector<int64_t>>();
    EXPECT_EQ(tok.encode(text), ids) << GetParam() << " case " << index;
    EXPECT_EQ(tok.encode(text, false), c["ids_no_special"].get<std::vector<int64_t>>())
        << GetParam() << " case " << index;
    EXPECT_EQ(tok.decode(ids), c["decoded"].get<std::string>()) << GetParam() << " case " << index;
    EXPECT_EQ(tok.decode(ids, true), c["decoded_skip_special"].get<std::string>())
        << GetParam() << " case " << index;
    ++index;
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, HfTokenizerCase, ::testing::Values("llama3", "qwen", "gemma"));

TEST(HfTokenizer, SpecialTokensAndLookups) {
  const text::HfTokenizer q = text::HfTokenizer::from_file(kFixtures + "/qwen/tokenizer.json");
  const auto im_start = q.token_to_id("<|im_start|>");
  ASSERT_TRUE(im_start.has_value());
  EXPECT_TRUE(q.is_special(*im_start));
  EXPECT_FALSE(q.is_special(*q.token_to_id("<think>")));
  EXPECT_EQ(q.encode("<|im_start|>"), (std::vector<int64_t>{*im_start}));
  EXPECT_EQ(q.id_to_token(*im_start), "<|im_start|>");
  EXPECT_THROW(q.id_to_token(q.vocab_size()), std::out_of_range);
  EXPECT_THROW(q.encode("bad \xff byte"), std::invalid_argument);
}

void expect_refused(const std::string& json, const std::string& needle) {
  try {
    text::HfTokenizer::from_json(json, "tokenizer.json");
    ADD_FAILURE() << "accepted; wanted " << needle;
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(HfTokenizer, RefusesWhatItDoesNotRead) {
  const std::string model =
      R"("model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2}, "merges": ["a b"]})";
  EXPECT_EQ(text::HfTokenizer::from_json("{" + model + "}").encode("abba", false),
            (std::vector<int64_t>{2, 1, 0}));
  expect_refused(R"({"model": {"type": "WordPiece", "vocab": {}}})",
                 "model 'WordPiece'; attn reads BPE");
  expect_refused("{" + model + R"(, "normalizer": {"type": "Lowercase"}})",
                 "normalizer 'Lowercase'; attn reads");
  expect_refused("{" + model + R"(, "pre_tokenizer": {"type": "Whitespace"}})",
                 "pre_tokenizer 'Whitespace'");
  expect_refused("{" + model + R"(, "decoder": {"type": "WordPiece"}})", "decoder 'WordPiece'");
  expect_refused("{" + model + R"(, "post_processor": {"type": "BertProcessing"}})",
                 "post_processor 'BertProcessing'");
  expect_refused(R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": ["a c"]}})",
                 "names a token the vocabulary lacks");
  expect_refused(R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": [], "dropout": 0.1}})",
                 "dropout");
  expect_refused(
      "{" + model +
          R"(, "pre_tokenizer": {"type": "Split", "pattern": {"Regex": "(["}, "behavior": "Isolated"}})",
      "does not compile");
  expect_refused("[]", "not a JSON object");
}

}  // namespace
}  // namespace attn::test
