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
      {"generate --model " + m + " --prompt-ids 1 --top-p 0.5", 2,
       "attn: generate: --top-p 0.5 samples, so it needs a --temperature > 0 (temperature 0 "
       "takes the argmax)"},
      {"generate --model " + m + " --prompt-ids 1 --top-p 1.5 --temperature 1", 2,
       "attn: generate: --top-p must be in (0, 1], got 1.5"},
      {"generate --model " + m + " --prompt-ids 1 --greedy --temperature 0.7", 2,
       "attn: generate: --greedy is --temperature 0; it cannot go with --temperature 0.7"},
      {"generate --model " + m + " --prompt-ids 1 --dtype float16", 2,
       "attn: generate: --dtype float16 is not a compute dtype of attn (a float16 file is read "
       "into float32 weights); use --dtype float32 or bfloat16"},
      {"generate --model " + m + " --prompt-ids 1 --dtype int8", 2,
       "attn: generate: --dtype must be float32 or bfloat16, got 'int8'"},
      {"generate --model " + m + " --prompt a --prompt-ids 1", 2,
       "attn: generate: give either --prompt or --prompt-ids, not both"},
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
