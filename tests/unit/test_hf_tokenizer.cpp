// tokenizer.json tokenizers (attn/hf_tokenizer.h) against Hugging Face
// tokenizers 0.23.3 (tests/fixtures/make_hf_tokenizer_fixtures.py): for Llama
// 3's, Qwen's and Gemma's pipelines, trained on the repository's texts, the
// ids of 17 texts (multilingual, emoji, numbers, whitespace runs, decomposed
// accents, special tokens and their look-alikes) with and without the
// post-processor's special tokens, and the decoded text with and without the
// specials. The same for the tokenizer.model files a directory may carry
// instead (tests/fixtures/make_tokenizer_model_fixtures.py): a SentencePiece
// model (Gemma's kind) against transformers 5.24's converted tokenizer and
// sentencepiece 0.2.1, and Llama 3's tiktoken rank file against tiktoken 0.14.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "attn/hf_tokenizer.h"
#include "cli.h"

namespace attn::test {
namespace {

const std::string kFixtures = std::string(ATTN_TESTS_DIR) + "/fixtures/hf_tokenizers";
const std::string kModelFixtures = std::string(ATTN_TESTS_DIR) + "/fixtures/tokenizer_models";

// "llama3" -> hf_tokenizers/llama3/tokenizer.json; "models/gemma_spm" ->
// tokenizer_models/gemma_spm/tokenizer.model.
std::string fixture_dir(const std::string& name) {
  return name.rfind("models/", 0) == 0 ? kModelFixtures + "/" + name.substr(7)
                                       : kFixtures + "/" + name;
}
std::string fixture_file(const std::string& name) {
  return fixture_dir(name) +
         (name.rfind("models/", 0) == 0 ? "/tokenizer.model" : "/tokenizer.json");
}

nlohmann::json expected(const std::string& name) {
  return nlohmann::json::parse(read_text(fixture_dir(name) + "/expected.json"));
}

class HfTokenizerCase : public ::testing::TestWithParam<const char*> {};

// A tokenizer.json by itself; a tokenizer.model as its directory gives it
// (tokenizer_config.json's "legacy" with it).
TEST_P(HfTokenizerCase, IdsAndTextEqualTokenizers) {
  const std::string name = GetParam();
  const text::HfTokenizer tok = name.rfind("models/", 0) == 0
                                    ? text::HfTokenizer::from_directory(fixture_dir(name))
                                    : text::HfTokenizer::from_file(fixture_file(name));
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

INSTANTIATE_TEST_SUITE_P(Fixtures, HfTokenizerCase,
                         ::testing::Values("llama3", "qwen", "gemma", "models/gemma_spm",
                                           "models/llama2_spm", "models/llama2_spm_legacy",
                                           "models/llama3_tiktoken"));

// A model with a dummy prefix (Llama 2's kind): transformers 5's non-legacy
// rule by default, sentencepiece's own with legacy (each piece of text between
// specials prefixed), from the file and from the directory alike.
TEST(TokenizerModel, DummyPrefixFollowsTheLegacyFlag) {
  const std::string file = kModelFixtures + "/llama2_spm/tokenizer.model";
  const std::string model = read_text(file);
  const text::HfTokenizer plain = text::HfTokenizer::from_file(file);
  const text::HfTokenizer legacy =
      text::HfTokenizer::from_sentencepiece(model, file, {.legacy = true});
  const text::HfTokenizer legacy_dir =
      text::HfTokenizer::from_directory(kModelFixtures + "/llama2_spm_legacy");
  // "▁Jack" after <s> only with legacy; at the start both prefix (the fixtures
  // hold transformers' ids for 26 texts each way).
  const auto a = plain.encode("<s>Jack", false), b = legacy.encode("<s>Jack", false);
  EXPECT_NE(a, b);
  EXPECT_EQ(b, legacy_dir.encode("<s>Jack", false));
  EXPECT_EQ(plain.encode("Jack", false), legacy.encode("Jack", false));
  EXPECT_EQ(plain.id_to_token(a[1]).rfind("\u2581", 0), std::string::npos);
  EXPECT_EQ(legacy.id_to_token(b[1]).rfind("\u2581", 0), 0u);
  EXPECT_EQ(plain.decode(a), "<s>Jack");
  EXPECT_EQ(legacy.decode(b), "<s> Jack");  // transformers keeps the "▁" after a special
  // add_bos_token false: no <s> in front (transformers' LlamaTokenizer so).
  const text::HfTokenizer no_bos =
      text::HfTokenizer::from_sentencepiece(model, file, {.add_bos_token = false});
  EXPECT_EQ(no_bos.encode("Jack"), plain.encode("Jack", false));
  EXPECT_EQ(plain.encode("Jack").front(), 1);
  // The same from a directory's tokenizer_config.json; a value that is not a
  // boolean is refused naming the key.
  const std::string dir = temp_path("sp_config");
  std::filesystem::create_directories(dir);
  std::filesystem::copy_file(file, dir + "/tokenizer.model");
  auto config = [&](const std::string& text) {
    std::ofstream(dir + "/tokenizer_config.json") << text;
  };
  config(R"({"add_bos_token": false, "legacy": true})");
  const text::HfTokenizer from_dir = text::HfTokenizer::from_directory(dir);
  EXPECT_EQ(from_dir.encode("<s>Jack"), legacy.encode("<s>Jack", false));
  config(R"({"add_bos_token": "yes"})");
  try {
    text::HfTokenizer::from_directory(dir);
    ADD_FAILURE() << "no throw";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("\"add_bos_token\" must be true or false"),
              std::string::npos)
        << e.what();
  }
  std::filesystem::remove_all(dir);
  // A tokenizer.json holds its whole pipeline: the config beside it is not read.
  const std::string json_dir = temp_path("json_config");
  std::filesystem::create_directories(json_dir);
  std::filesystem::copy_file(fixture_file("llama3"), json_dir + "/tokenizer.json");
  std::ofstream(json_dir + "/tokenizer_config.json") << "{not json";
  EXPECT_EQ(text::HfTokenizer::from_directory(json_dir).encode("Hello", false),
            text::HfTokenizer::from_file(fixture_file("llama3")).encode("Hello", false));
  std::filesystem::remove_all(json_dir);
}

TEST(TokenizerModel, TiktokenRanksAreLlama3sTokenizerJson) {
  // The rank file holds the llama3 fixture's byte-level vocabulary: the
  // tokenizer.json converted from it encodes as that tokenizer.json does.
  const text::HfTokenizer from_ranks =
      text::HfTokenizer::from_file(kModelFixtures + "/llama3_tiktoken/tokenizer.model");
  const text::HfTokenizer from_json =
      text::HfTokenizer::from_file(kFixtures + "/llama3/tokenizer.json");
  for (const auto& c : expected("llama3")["cases"]) {
    const std::string text = c["text"].get<std::string>();
    if (text.find("<|") != std::string::npos) continue;  // the specials are numbered differently
    EXPECT_EQ(from_ranks.encode(text, false), from_json.encode(text, false)) << text.substr(0, 40);
  }
  EXPECT_EQ(from_ranks.vocab_size(), 1200 + 256);
  EXPECT_EQ(from_ranks.token_to_id("<|eot_id|>"), 1200 + 9);
  EXPECT_TRUE(from_ranks.is_special(1200 + 255));
  EXPECT_EQ(from_ranks.id_to_token(1200 + 255), "<|reserved_special_token_246|>");
}

TEST(TokenizerModel, SentencePieceLookupsAndSpecials) {
  const text::HfTokenizer sp =
      text::HfTokenizer::from_file(kModelFixtures + "/gemma_spm/tokenizer.model");
  EXPECT_EQ(sp.vocab_size(), 1000);
  EXPECT_EQ(sp.token_to_id("<bos>"), 2);
  EXPECT_TRUE(sp.is_special(2));
  EXPECT_FALSE(sp.is_special(*sp.token_to_id("<start_of_turn>")));  // user-defined: kept by decode
  EXPECT_EQ(sp.id_to_token(*sp.token_to_id("<0x41>")), "<0x41>");
  EXPECT_EQ(sp.encode("<bos>", false), (std::vector<int64_t>{2}));
  EXPECT_EQ(sp.encode("", true), (std::vector<int64_t>{2}));
  EXPECT_THROW(sp.decode(std::vector<int64_t>{1000}), std::out_of_range);
  EXPECT_THROW(sp.encode("bad \xff byte"), std::invalid_argument);
  EXPECT_NE(sp.describe().find("SentencePiece (1000 pieces, 256 byte fallback)"), std::string::npos)
      << sp.describe();
}

TEST(TokenizerModel, TheCliReadsADirectorysTokenizerModel) {
  ATTN_REQUIRE_CLI();
  for (const char* name : {"gemma_spm", "llama3_tiktoken"}) {
    const nlohmann::json c =
        expected(std::string("models/") + name)["cases"][1];  // "Hello, world!"
    const CliResult r = run_cli("tokenize --tokenizer '" + kModelFixtures + "/" + name +
                                "' --json '" + c["text"].get<std::string>() + "'");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(nlohmann::json::parse(r.out)["ids"].get<std::vector<int64_t>>(),
              c["ids"].get<std::vector<int64_t>>())
        << name;
  }
  const CliResult none =
      run_cli("tokenize --tokenizer '" + std::string(ATTN_TESTS_DIR) + "/fixtures' x");
  EXPECT_NE(none.exit_code, 0);
  EXPECT_NE(none.err.find("has no tokenizer.json, tokenizer.model or original/tokenizer.model"),
            std::string::npos)
      << none.err;
}

TEST(TokenizerModel, RefusesWhatIsNeitherFormat) {
  const auto refused = [](const std::string& bytes, const std::string& needle) {
    const std::string path = temp_path("bad_tokenizer.model");
    { std::ofstream(path, std::ios::binary) << bytes; }
    try {
      text::HfTokenizer::from_file(path);
      ADD_FAILURE() << "accepted; wanted " << needle;
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
      EXPECT_EQ(std::string(e.what()).find('\xff'), std::string::npos);  // no raw bytes
    }
  };
  refused(std::string("\x0a\xff\xfe garbage \x01\x02", 15),
          "not a tokenizer.json, a tiktoken rank file or a SentencePiece model");
  refused("IQ== 0\nIg== 5\n", "rank 5 where 1 comes next");
  refused("IQ== 0\nIQ== 1\n", "a token ranked twice");
  refused("IQ== 0\n", "byte 0x00 has no rank");
  refused("IQ== 0\n%%%% 1\n", "expected \"base64 rank\"");
}

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

// fuzz_hf_tokenizer's finding (issue 46): a TemplateProcessing whose special
// token has an id no token has was read, and encode() put that id (past
// vocab_size) in front of every text, for a model to look up out of its
// embedding's rows. Now refused when the file is read.
TEST(HfTokenizer, FuzzFindingTemplateIdThatNoTokenHasIsRefused) {
  const std::string model =
      R"("model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2}, "merges": ["a b"]})";
  const auto post = [](const std::string& ids) {
    return R"(, "post_processor": {"type": "Sequence", "processors": [{"type": "TemplateProcessing",
      "single": [{"SpecialToken": {"id": "<bos>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
      "special_tokens": {"<bos>": {"id": "<bos>", "ids": )" +
           ids + R"(, "tokens": ["<bos>"]}}}]})";
  };
  expect_refused("{" + model + post("[332]") + "}",
                 "TemplateProcessing puts in id 332, which no token has (vocab_size 3)");
  // An id of the vocabulary, or of an added token, is what a template may put in.
  EXPECT_EQ(text::HfTokenizer::from_json("{" + model + post("[2]") + "}").encode("ba"),
            (std::vector<int64_t>{2, 1, 0}));
  const std::string added = R"(, "added_tokens": [{"id": 7, "content": "<bos>", "special": true}])";
  EXPECT_EQ(text::HfTokenizer::from_json("{" + model + added + post("[7]") + "}").encode("a"),
            (std::vector<int64_t>{7, 0}));
}

}  // namespace
}  // namespace attn::test
