// `attn export`, `attn generate --model`, `attn eval` and `attn inspect DIR`
// on the Hugging Face GPT-2 fixtures (tests/fixtures/hf_gpt2): the CLI's ids
// equal the library's generate() on the same model, exports round-trip, and
// bad input is one stderr line.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "attn/generate.h"
#include "attn/hf_gpt2.h"
#include "attn/safetensors.h"
#include "attn/state_dict.h"
#include "attn/utf8.h"
#include "cli.h"

namespace attn::test {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

const std::string kFixtures = std::string(ATTN_TESTS_DIR) + "/fixtures/hf_gpt2";

// (std::string("'") + ...: "'" + std::string trips GCC 12's false -Wrestrict at -O3.)
std::string q(const std::string& s) { return std::string("'") + s + "'"; }

std::string ids_line(const std::vector<int64_t>& ids) {
  std::string out;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i > 0) out += ' ';
    out += std::to_string(ids[i]);
  }
  return out + "\n";
}

// What the library generates from the fixture directory.
std::vector<int64_t> library_ids(const std::string& dir, const std::vector<int64_t>& prompt,
                                 const nn::GenerateOptions& options, uint64_t seed) {
  std::unique_ptr<nn::GPTModel> model;
  io::load_model_dir(dir, model);
  Generator gen(seed);
  return nn::generate(*model, Tensor::from_int64({1, static_cast<int64_t>(prompt.size())}, prompt),
                      options, gen)
      .to_int64_vector();
}

TEST(HfGpt2Cli, GenerateIdsMatchTheLibrary) {
  ATTN_REQUIRE_CLI();
  const std::vector<int64_t> prompt{262, 339, 432};
  for (const char* variant : {"fp32", "bf16", "untied"}) {
    SCOPED_TRACE(variant);
    const std::string dir = kFixtures + "/" + variant;
    const CliResult greedy = run_cli("generate --model " + q(dir) +
                                     " --prompt-ids 262,339,432 --print-ids --greedy "
                                     "--max-new-tokens 12");
    EXPECT_EQ(greedy.exit_code, 0) << greedy.err;
    EXPECT_EQ(greedy.err, "");
    EXPECT_EQ(greedy.out, ids_line(library_ids(dir, prompt, {.max_new_tokens = 12}, 123)));
    const CliResult sampled = run_cli("generate --checkpoint " + q(dir) +
                                      " --prompt-ids '262 339 432' --print-ids --temperature 0.9 "
                                      "--top-k 40 --top-p 0.9 --seed 7 --max-new-tokens 12");
    EXPECT_EQ(sampled.exit_code, 0) << sampled.err;
    EXPECT_EQ(sampled.out,
              ids_line(library_ids(dir, prompt,
                                   {.max_new_tokens = 12, .temperature = 0.9f, .top_k = 40,
                                    .top_p = 0.9f},
                                   7)));
    EXPECT_NE(sampled.out, greedy.out);
  }
  // bf16 compute: the model's own forward, as GPTOptions::dtype runs it.
  const CliResult bf16 = run_cli("generate --model " + q(kFixtures + "/fp32") +
                                 " --prompt-ids 262,339,432 --print-ids --max-new-tokens 6 "
                                 "--dtype bfloat16");
  EXPECT_EQ(bf16.exit_code, 0) << bf16.err;
  std::unique_ptr<nn::GPTModel> model;
  io::load_model_dir(kFixtures + "/fp32", model, {.dtype = DType::kBFloat16});
  Generator gen(123);
  const Tensor out = nn::generate(*model, Tensor::from_int64({1, 3}, prompt),
                                  {.max_new_tokens = 6, .use_cache = false}, gen);
  EXPECT_EQ(bf16.out, ids_line(out.to_int64_vector()));
}

TEST(HfGpt2Cli, ExportRoundTripsAndLoadsEverywhere) {
  ATTN_REQUIRE_CLI();
  const std::string src = kFixtures + "/fp32";
  // hf -> book (attn checkpoint, GPT-2 tokenizer) -> generate gives the same ids.
  const std::string book = temp_path("book");
  CliResult r = run_cli("export --model " + q(src) + " --format book --out " + q(book));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "wrote " + book + " (book format, 43904 parameters)\n");
  const io::SafetensorsHeader h = io::read_safetensors_header(book + "/checkpoint.safetensors");
  EXPECT_EQ(h.metadata.at("tokenizer"), "gpt2");
  EXPECT_EQ(h.metadata.at("format"), "attn-checkpoint-1");
  bool has_query = false;
  for (const auto& e : h.entries) has_query |= e.name == "trf_blocks.1.att.W_query.weight";
  EXPECT_TRUE(has_query);
  const std::string args = " --prompt-ids 262,339,432 --print-ids --max-new-tokens 8";
  const std::string from_hf = run_cli("generate --model " + q(src) + args).out;
  EXPECT_EQ(run_cli("generate --model " + q(book) + args).out, from_hf);
  // hf -> hf in each dtype, with the source's tokenizer files.
  for (const char* dtype : {"float32", "bfloat16", "float16"}) {
    const std::string out = temp_path(std::string("hf_") + dtype);
    r = run_cli("export --model " + q(src) + " --format hf --dtype " + dtype + " --out " + q(out));
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_TRUE(fs::exists(out + "/vocab.json"));
    EXPECT_TRUE(fs::exists(out + "/merges.txt"));
    std::unique_ptr<nn::GPTModel> model;
    const io::HfGpt2Info info = io::load_hf_gpt2(out, model);
    EXPECT_EQ(info.file_dtype, std::string(dtype) == "float32"    ? "F32"
                               : std::string(dtype) == "bfloat16" ? "BF16"
                                                                  : "F16");
    if (std::string(dtype) == "float32") {
      EXPECT_EQ(run_cli("generate --model " + q(out) + args).out, from_hf);
    }
  }
}

// Issue 46: export --format hf copied a source's vocab.json and merges.txt
// whatever they held; they are read as a tokenizer first, and a malformed
// one stops the export before anything is written.
TEST(HfGpt2Cli, ExportRefusesAMalformedVocabulary) {
  ATTN_REQUIRE_CLI();
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"vocab.json", R"({"a": "x"})"},
      {"vocab.json", "not json"},
      {"merges.txt", "#version: 0.2\nonlyonetoken\n"},
  };
  for (const auto& [name, bytes] : cases) {
    const std::string src = temp_path("bad_vocab_src"), out = temp_path("bad_vocab_out");
    fs::copy(kFixtures + "/fp32", src, fs::copy_options::recursive);
    { std::ofstream(src + "/" + name, std::ios::binary) << bytes; }
    const CliResult r = run_cli("export --model " + q(src) + " --format hf --out " + q(out));
    EXPECT_EQ(r.exit_code, 1) << name << ": " << bytes;
    EXPECT_EQ(lines_of(r.err).size(), 1u) << r.err;
    EXPECT_NE(r.err.find(name), std::string::npos) << r.err;
    EXPECT_FALSE(fs::exists(out)) << "written despite a malformed " << name;
    fs::remove_all(src);
  }
}

// The same for a Llama / Qwen / Gemma directory's tokenizer.json.
TEST(HfGpt2Cli, ExportRefusesAMalformedTokenizerJson) {
  ATTN_REQUIRE_CLI();
  const std::string src = temp_path("bad_tokjson_src"), out = temp_path("bad_tokjson_out");
  fs::copy(std::string(ATTN_TESTS_DIR) + "/fixtures/open_models/llama3", src,
           fs::copy_options::recursive);
  { std::ofstream(src + "/tokenizer.json", std::ios::binary) << R"({"model": {"type": "BPE"}})"; }
  const CliResult r = run_cli("export --model " + q(src) + " --format hf --out " + q(out));
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_EQ(lines_of(r.err).size(), 1u) << r.err;
  EXPECT_NE(r.err.find("tokenizer.json"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(out)) << "written despite a malformed tokenizer.json";
  fs::remove_all(src);
}

// A config.json that is a directory is named as such (it used to send the
// folder on as an attn checkpoint "missing checkpoint.safetensors").
TEST(HfGpt2Cli, AConfigJsonThatIsADirectoryIsNamed) {
  ATTN_REQUIRE_CLI();
  const std::string dir = temp_path("config_dir");
  fs::create_directories(dir + "/config.json");
  const CliResult r = run_cli("generate --model " + q(dir) + " --prompt a --max-new-tokens 1");
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_EQ(lines_of(r.err).size(), 1u) << r.err;
  EXPECT_NE(r.err.find("config.json' is not a regular file"), std::string::npos) << r.err;
  fs::remove_all(dir);
}

TEST(HfGpt2Cli, CharacterCheckpointIsNotExportedToHf) {
  ATTN_REQUIRE_CLI();
  Generator gen(2);
  nn::GPTModel model({.vocab_size = 3, .context_length = 8, .emb_dim = 8, .n_heads = 2,
                      .n_layers = 1},
                     {}, gen);
  const std::string dir = temp_path("char_ckpt");
  fs::create_directories(dir);
  io::save_state_dict(model, dir + "/checkpoint.safetensors",
                      {{"format", "attn-checkpoint-1"},
                       {"config", R"({"vocab_size": 3, "context_length": 8, "emb_dim": 8, )"
                                  R"("n_heads": 2, "n_layers": 1, "drop_rate": 0.0, "qkv_bias": false})"},
                       {"vocab", R"(["a", "b", "c"])"}});
  const std::string out = temp_path("never");
  CliResult r = run_cli("export --model " + q(dir) + " --format hf --out " + q(out));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(r.err, "attn: export: '" + dir +
                       "' has a character-level vocabulary of 3 tokens; a Hugging Face GPT-2 "
                       "directory needs GPT-2's (the byte-level BPE, 50257 tokens): export a model "
                       "trained with the gpt2 tokenizer (checkpoint metadata \"tokenizer\": "
                       "\"gpt2\"), or use --format book\n");
  EXPECT_FALSE(fs::exists(out));
  // --format book keeps the character vocabulary; generate still reads it as text.
  const std::string book = temp_path("char_book");
  r = run_cli("export --model " + q(dir) + " --format book --out " + q(book));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  r = run_cli("generate --model " + q(book) + " --prompt ab --max-new-tokens 3");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, run_cli("generate --model " + q(dir) + " --prompt ab --max-new-tokens 3").out);
  EXPECT_EQ(r.out.substr(0, 2), "ab");
  EXPECT_EQ(r.out.size(), 6u);  // 5 characters and a newline
  // attn eval on a character-level checkpoint: its vocabulary tokenizes.
  const std::string text = temp_path("chars.txt");
  { std::ofstream(text) << "abcabcabcc"; }
  r = run_cli("eval --model " + q(dir) + " --file " + q(text) + " --context 8 --stride 4 --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  model.eval();
  const nn::PerplexityResult want =
      nn::sliding_window_perplexity(model, {0, 1, 2, 0, 1, 2, 0, 1, 2, 2}, 8, 4);
  const json got = json::parse(r.out);
  EXPECT_EQ(got.at("tokens"), 9);
  EXPECT_EQ(got.at("tokens"), want.tokens);
  EXPECT_NEAR(got.at("mean_loss").get<double>(), want.mean_loss, 1e-6);
}

TEST(HfGpt2Cli, InspectSummarisesDirectories) {
  ATTN_REQUIRE_CLI();
  CliResult r = run_cli("inspect " + q(kFixtures + "/buffers"));
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, kFixtures + "/buffers: Hugging Face GPT-2 (config.json + model.safetensors)\n"
                   "  config: n_embd 32, n_layer 2, n_head 4, n_positions 64, vocab_size 512, "
                   "layer_norm_epsilon 1e-05, activation_function gelu_new, "
                   "tie_word_embeddings true\n"
                   "  parameters: 43,904 (output head tied to the token embedding)\n"
                   "  dtype: F16\n"
                   "  tensors: 28, names with \"transformer.\"; 4 buffer(s) ignored\n"
                   "  tokenizer: gpt2 (GPT-2's)\n");
  r = run_cli("inspect --json " + q(kFixtures + "/untied"));
  EXPECT_EQ(r.exit_code, 0) << r.err;
  const json j = json::parse(r.out);
  EXPECT_EQ(j.at("parameters"), 43904 + 512 * 32);
  EXPECT_EQ(j.at("tied"), false);
  EXPECT_EQ(j.at("dtype"), "F32");
  const std::string empty = temp_path("empty_model");
  fs::create_directories(empty);
  r = run_cli("inspect " + q(empty));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(r.err, "attn: inspect: '" + empty +
                       "' is neither a Hugging Face model directory (config.json) nor an attn "
                       "checkpoint directory (checkpoint.safetensors)\n");
}

// ---- text: the directory's own tokenizer (vocab.json + merges.txt), or GPT-2's ----------------

TEST(HfGpt2Cli, TextGoesThroughTheDirectorysTokenizerAndStreams) {
  ATTN_REQUIRE_CLI();
  const std::string dir = kFixtures + "/fp32";
  const json expected = json::parse(read_text(kFixtures + "/expected.json"));
  // transformers' GPT2Tokenizer (the fixture's files) gave these 8 ids for " the height of his
  // glor" (the first 8 of " the height of his glory").
  const std::vector<int64_t> prompt = expected.at("ids").get<std::vector<int64_t>>();
  CliResult r = run_cli("generate --model " + q(dir) +
                        " --prompt ' the height of his glor' --print-ids --max-new-tokens 0");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, ids_line(prompt));
  // Text out: the prompt as given, then each new token's bytes as they complete.
  const std::vector<int64_t> ids =
      library_ids(dir, prompt, {.max_new_tokens = 10, .temperature = 0.8f, .top_k = 40}, 5);
  r = run_cli("generate --model " + q(dir) +
              " --prompt ' the height of his glor' --max-new-tokens 10 --temperature 0.8 "
              "--top-k 40 --seed 5");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  std::string text = " the height of his glor";
  // Token bytes straight from vocab.json: GPT-2's byte <-> unicode table undone.
  const json vocab = json::parse(read_text(dir + "/vocab.json"));
  std::map<int64_t, std::string> token;
  for (const auto& [t, id] : vocab.items()) token[id.get<int64_t>()] = t;
  std::map<std::string, unsigned char> byte_of;  // GPT-2's bytes_to_unicode, inverted
  int extra = 0;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
    const char32_t cp = printable ? static_cast<char32_t>(b) : static_cast<char32_t>(256 + extra++);
    byte_of[encode_utf8(cp)] = static_cast<unsigned char>(b);
  }
  for (size_t i = prompt.size(); i < ids.size(); ++i) {
    for (const std::string& ch : utf8_characters(token.at(ids[i])))
      text += static_cast<char>(byte_of.at(ch));
  }
  EXPECT_EQ(r.out, text + "\n");
}

TEST(HfGpt2Cli, EvalMatchesTransformersPerplexity) {
  ATTN_REQUIRE_CLI();
  const json expected = json::parse(read_text(kFixtures + "/expected.json"));
  for (const json& want : expected.at("eval")) {
    const int64_t context = want.at("context"), stride = want.at("stride");
    const CliResult r = run_cli("eval --model " + q(kFixtures + "/fp32") + " --file " +
                                q(kFixtures + "/eval.txt") + " --context " +
                                std::to_string(context) + " --stride " + std::to_string(stride) +
                                " --json");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const json got = json::parse(r.out);
    EXPECT_EQ(got.at("tokens"), want.at("tokens"));
    EXPECT_NEAR(got.at("mean_loss").get<double>(), want.at("mean_loss").get<double>(), 1e-5);
    EXPECT_NEAR(got.at("perplexity").get<double>() / want.at("perplexity").get<double>(), 1.0,
                1e-5);
  }
  const CliResult text = run_cli("eval --model " + q(kFixtures + "/fp32") + " --file " +
                                 q(kFixtures + "/eval.txt") + " --context 32 --stride 16");
  EXPECT_EQ(text.exit_code, 0) << text.err;
  EXPECT_EQ(text.out, kFixtures + "/eval.txt: 200 tokens scored (context 32, stride 16): mean "
                                  "loss 6.433062 nats/token, perplexity 622.0761\n");
}

TEST(HfGpt2Cli, GenerationStopsAtEndOfText) {
  ATTN_REQUIRE_CLI();
  // A 50257-token model whose every next token is <|endoftext|> (50256): the
  // final norm outputs its shift (scale 0), and only out_head's row 50256 reads it.
  Generator gen(3);
  nn::GPTModel model({.vocab_size = 50257, .context_length = 8, .emb_dim = 8, .n_heads = 2,
                      .n_layers = 1},
                     {}, gen);
  model.final_norm.scale.value.fill_(0.0f);
  model.final_norm.shift.value.fill_(1.0f);
  model.out_head.weight.value.fill_(0.0f);
  for (int64_t e = 0; e < 8; ++e) model.out_head.weight.value.data()[50256 * 8 + e] = 1.0f;
  const std::string dir = temp_path("eot_model");
  io::save_hf_gpt2(model, dir);
  CliResult r = run_cli("generate --model " + q(dir) + " --prompt 'Hello' --max-new-tokens 5");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "Hello\n");
  r = run_cli("generate --model " + q(dir) + " --prompt-ids 15496 --print-ids --max-new-tokens 5");
  EXPECT_EQ(r.out, "15496\n");
  // "<|endoftext|>" in a prompt by tiktoken's rule: refused, or with
  // --allow-special the token 50256 (ids as the prompt's: 15496 50256).
  r = run_cli("generate --model " + q(dir) + " --prompt 'Hello<|endoftext|>' --print-ids");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(r.err.rfind("attn: generate: the prompt holds \"<|endoftext|>\" at byte 5: ", 0), 0u)
      << r.err;
  r = run_cli("generate --model " + q(dir) +
              " --prompt 'Hello<|endoftext|>' --allow-special --print-ids --max-new-tokens 1");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "15496 50256\n");
  // Without the stop the same model repeats it.
  std::unique_ptr<nn::GPTModel> loaded;
  io::load_model_dir(dir, loaded);
  Generator g(1);
  EXPECT_EQ(nn::generate(*loaded, Tensor::from_int64({1, 1}, {15496}), {.max_new_tokens = 2}, g)
                .to_int64_vector(),
            (std::vector<int64_t>{15496, 50256, 50256}));
}

struct BadCase {
  std::string args;
  int exit_code;
  std::string err;
};

TEST(HfGpt2Cli, BadInputIsOneLine) {
  ATTN_REQUIRE_CLI();
  const std::string m = q(kFixtures + "/fp32");
  const std::vector<BadCase> cases{
      {"generate --model " + m + " --prompt-ids 1,x", 2,
       "attn: generate: --prompt-ids must be token ids separated by commas or spaces, got '1,x'"},
      {"generate --model " + m + " --prompt-ids 1,512 --print-ids", 2,
       "attn: generate: --prompt-ids: token id 512 is out of range for vocab_size 512"},
      {"generate --model " + m + " --prompt-ids 1 --top-p 1.5 --temperature 1", 2,
       "attn: generate: --top-p must be in (0, 1] (1: off), got 1.5"},
      {"generate --model " + m + " --prompt-ids 1 --greedy --temperature 0.7", 2,
       "attn: generate: --greedy is --temperature 0; it cannot go with --temperature 0.7"},
      {"generate --model " + m + " --prompt-ids 1 --dtype float16", 2,
       "attn: generate: --dtype float16 is not a compute dtype of attn (a float16 file is read "
       "into float32 weights); use --dtype float32 or bfloat16"},
      {"generate --model " + m + " --prompt-ids 1 --dtype int8", 2,
       "attn: generate: --dtype must be float32 or bfloat16, got 'int8'"},
      {"generate --model " + m + " --prompt a --prompt-ids 1", 2,
       "attn: generate: give either --prompt or --prompt-ids, not both"},
      {"generate --model " + q(kFixtures + "/bf16") + " --prompt ' glory'", 1,
       "attn: generate: token 0 of the text, id 13476 (' glory'), is outside the model's "
       "vocabulary of 512 tokens"},
      {"generate --model " + m + " --prompt \"$(printf '\\377')\"", 1,
       "attn: generate: invalid UTF-8 at byte offset 0: invalid lead byte "
       "(byte 0xFF)"},
      {"export --model " + m + " --format onnx --out /tmp/x", 2,
       "attn: export: --format must be hf or book, got 'onnx'"},
      {"export --model " + m + " --format hf --dtype fp8 --out /tmp/x", 2,
       "attn: export: --dtype must be float32, bfloat16 or float16, got 'fp8'"},
      {"export --model " + m + " --format book --dtype bfloat16 --out /tmp/x", 2,
       "attn: export: --format book writes float32 (attn's checkpoints hold float32 weights), "
       "got --dtype bfloat16"},
      {"eval --model " + m + " --file /nonexistent/t.txt --context 65", 2,
       "attn: eval: --context must be in 2..64 (the model's context_length), got 65"},
      {"eval --model " + m + " --file /nonexistent/t.txt --context 32 --stride 33", 2,
       "attn: eval: --stride must be in 1..32 (the context), got 33"},
  };
  for (const BadCase& c : cases) {
    const CliResult r = run_cli(c.args);
    EXPECT_EQ(r.exit_code, c.exit_code) << c.args;
    EXPECT_EQ(r.err, c.err + "\n") << c.args;
    EXPECT_EQ(r.out, "") << c.args;
  }
}

}  // namespace
}  // namespace attn::test
