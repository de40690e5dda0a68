// `attn generate` (tools/attn/generate_command.cpp) on checkpoints written here
// in the shared format: the text equals the library's generate() on the same model,
// with and without the cache; a training checkpoint's optim.* tensors are
// ignored; --benchmark prints its figures; every bad input is one stderr line
// and a non-zero exit.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "attn/decode_kernels.h"
#include "attn/generate.h"
#include "attn/gpt.h"
#include "attn/random.h"
#include "attn/safetensors.h"
#include "cli.h"

namespace attn::test {
namespace {

using namespace attn::nn;

const std::vector<std::string> kVocab{"\n", " ", "a", "b", "c", "d", "e", "r", "t", "é"};
const char* kVocabJson = R"(["\n", " ", "a", "b", "c", "d", "e", "r", "t", "é"])";
const char* kConfigJson =
    R"({"vocab_size": 10, "context_length": 12, "emb_dim": 16, "n_heads": 4, "n_layers": 2, "drop_rate": 0.1, "qkv_bias": false})";
const GPTConfig kConfig{.vocab_size = 10,
                        .context_length = 12,
                        .emb_dim = 16,
                        .n_heads = 4,
                        .n_layers = 2,
                        .drop_rate = 0.1f,
                        .qkv_bias = false};

std::map<std::string, std::string> good_metadata() {
  return {{"format", "attn-checkpoint-1"}, {"config", kConfigJson}, {"vocab", kVocabJson}};
}

// DIR/checkpoint.safetensors with the model's state_dict (plus `extra`
// tensors) and the given metadata; returns DIR.
std::string write_checkpoint(GPTModel& model, const std::map<std::string, std::string>& metadata,
                             const std::vector<std::pair<std::string, Tensor>>& extra = {}) {
  const std::string dir = temp_path("ckpt");
  std::filesystem::create_directories(dir);
  std::vector<std::pair<std::string, Tensor>> tensors;
  for (const auto& [name, t] : model.state_dict()) tensors.emplace_back(name, t.contiguous());
  tensors.insert(tensors.end(), extra.begin(), extra.end());
  io::write_safetensors(dir + "/checkpoint.safetensors", tensors, metadata);
  return dir;
}

std::unique_ptr<GPTModel> seeded_model() {
  manual_seed(5);
  auto model = std::make_unique<GPTModel>(kConfig);
  model->eval();
  return model;
}

// What the library generates for the prompt (the CLI's expected stdout).
std::string library_text(GPTModel& model, const std::string& prompt, int64_t n, float temperature,
                         int64_t top_k, uint64_t seed) {
  const std::vector<int64_t> ids = encode_text(kVocab, prompt);
  Generator gen(seed);
  const Tensor out =
      generate(model, Tensor::from_int64({1, static_cast<int64_t>(ids.size())}, ids),
               {.max_new_tokens = n, .temperature = temperature, .top_k = top_k}, gen);
  return decode_ids(kVocab, out.to_int64_vector()) + "\n";
}

TEST(GenerateCli, TextMatchesLibraryWithAndWithoutCache) {
  ATTN_REQUIRE_CLI();
  auto model = seeded_model();
  const std::string dir = write_checkpoint(*model, good_metadata());
  // 20 new tokens after 3: past context_length 12 (the sliding window).
  const std::string greedy = library_text(*model, "bé ", 20, 0.0f, 0, 1);
  for (const char* cache_flag : {"", " --no-cache"}) {
    const CliResult r = run_cli("generate --checkpoint '" + dir +
                                "' --prompt 'bé ' --max-new-tokens 20" + cache_flag);
    EXPECT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(r.out, greedy);
    EXPECT_EQ(r.err, "");
  }
  const std::string sampled = library_text(*model, "tea", 30, 0.8f, 4, 77);
  EXPECT_NE(sampled, greedy);
  for (const char* cache_flag : {"", " --no-cache"}) {
    const CliResult r = run_cli("generate --checkpoint '" + dir +
                                "' --prompt tea --max-new-tokens 30 --temperature 0.8 --top-k 4 "
                                "--seed 77" +
                                cache_flag);
    EXPECT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(r.out, sampled);
  }
  // --max-new-tokens 0 prints the prompt.
  EXPECT_EQ(run_cli("generate --checkpoint '" + dir + "' --prompt abc --max-new-tokens 0").out,
            "abc\n");
  std::filesystem::remove_all(dir);
}

// The sampling flags as transformers and llama.cpp read them: --top-k or
// --top-p alone samples at temperature 1 (it was silently greedy: seeds 1 and
// 7 gave the same ids); --top-k 0 and --top-p 1 are off; --temperature 0 or
// --greedy is the argmax whatever filters are given; no flag is the argmax.
// Each CLI run equals the library's generate with the options it stands for.
TEST(GenerateCli, SamplingFlagsReadAsTransformersDoes) {
  ATTN_REQUIRE_CLI();
  auto model = seeded_model();
  const std::string dir = write_checkpoint(*model, good_metadata());
  const auto library = [&](GenerateOptions o, uint64_t seed) {
    const std::vector<int64_t> ids = encode_text(kVocab, "tea");
    Generator gen(seed);
    o.max_new_tokens = 30;
    const Tensor out =
        generate(*model, Tensor::from_int64({1, static_cast<int64_t>(ids.size())}, ids), o, gen);
    return decode_ids(kVocab, out.to_int64_vector()) + "\n";
  };
  const auto cli = [&](const std::string& flags) {
    const CliResult r =
        run_cli("generate --model '" + dir + "' --prompt tea --max-new-tokens 30 " + flags);
    EXPECT_EQ(r.exit_code, 0) << flags << ": " << r.err;
    return r.out;
  };
  const std::string greedy = library({.temperature = 0.0f}, 1);
  // --top-k alone: temperature 1, and the seed matters.
  const std::string top_k_1 = library({.temperature = 1.0f, .top_k = 4}, 1);
  const std::string top_k_7 = library({.temperature = 1.0f, .top_k = 4}, 7);
  EXPECT_NE(top_k_1, top_k_7);
  EXPECT_NE(top_k_1, greedy);
  EXPECT_EQ(cli("--top-k 4 --seed 1"), top_k_1);
  EXPECT_EQ(cli("--top-k 4 --seed 7"), top_k_7);
  // --top-p alone: temperature 1.
  EXPECT_EQ(cli("--top-p 0.9 --seed 3"), library({.temperature = 1.0f, .top_p = 0.9f}, 3));
  // --top-k 0 is off.
  EXPECT_EQ(cli("--top-k 0 --temperature 0.8 --seed 5"), library({.temperature = 0.8f}, 5));
  // The argmax, whatever the filters.
  EXPECT_EQ(cli(""), greedy);
  EXPECT_EQ(cli("--greedy --top-k 4 --top-p 0.5"), greedy);
  EXPECT_EQ(cli("--temperature 0 --top-p 0.5 --seed 9"), greedy);
  // The llama.cpp spellings and --prompt-file.
  const std::string prompt_file = temp_path("prompt.txt");
  { std::ofstream(prompt_file) << "tea"; }
  const CliResult short_flags = run_cli("generate -m '" + dir + "' --prompt-file '" + prompt_file +
                                        "' -n 30 --top-k 4 --seed 1");
  EXPECT_EQ(short_flags.exit_code, 0) << short_flags.err;
  EXPECT_EQ(short_flags.out, top_k_1);
  const CliResult p_flag = run_cli("generate -m '" + dir + "' -p tea -n 30");
  EXPECT_EQ(p_flag.out, greedy) << p_flag.err;
  std::filesystem::remove(prompt_file);
  std::filesystem::remove_all(dir);
}

TEST(GenerateCli, TrainingCheckpointOptimizerStateIsIgnored) {
  ATTN_REQUIRE_CLI();
  auto model = seeded_model();
  std::map<std::string, std::string> meta = good_metadata();
  meta["iter"] = "10";
  meta["optim_step"] = "10";
  const std::string dir =
      write_checkpoint(*model, meta,
                       {{"optim.tok_emb.weight.exp_avg", Tensor::zeros({10, 16})},
                        {"optim.tok_emb.weight.exp_avg_sq", Tensor::zeros({10, 16})}});
  const CliResult r =
      run_cli("generate --checkpoint '" + dir + "' --prompt abc --max-new-tokens 5");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, library_text(*model, "abc", 5, 0.0f, 0, 123));
  std::filesystem::remove_all(dir);
}

TEST(GenerateCli, Benchmark) {
  ATTN_REQUIRE_CLI();
  auto model = seeded_model();
  const std::string dir = write_checkpoint(*model, good_metadata());
  const CliResult r =
      run_cli("generate --checkpoint '" + dir + "' --benchmark --prompt 'abc' --max-new-tokens 6");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  const auto lines = lines_of(r.out);
  ASSERT_EQ(lines.size(), 5u) << r.out;
  EXPECT_EQ(lines[1], "prompt: 3 tokens, then 6 generated tokens (greedy), batch 1");
  EXPECT_EQ(lines[2].rfind("cache:    prompt processing", 0), 0u) << lines[2];
  EXPECT_NE(lines[2].find("(5 tokens in"), std::string::npos) << lines[2];
  EXPECT_EQ(lines[3].rfind("no cache: prompt processing", 0), 0u) << lines[3];
  EXPECT_EQ(lines[4], "same tokens with and without the cache: yes");
  // --json: the cached path, --repeats times, one object.
  const CliResult js =
      run_cli("generate --checkpoint '" + dir +
              "' --benchmark --json --repeats 2 --prompt 'abc' --max-new-tokens 6");
  EXPECT_EQ(js.exit_code, 0) << js.err;
  const auto j = nlohmann::json::parse(js.out);
  EXPECT_EQ(j.at("prompt_tokens"), 3);
  EXPECT_EQ(j.at("decode_steps"), 5);
  EXPECT_EQ(j.at("runs").size(), 2u);
  EXPECT_GT(j.at("decode_tok_s_median").get<double>(), 0.0);
  const CliResult too_long =
      run_cli("generate --checkpoint '" + dir + "' --benchmark --prompt 'abc' --max-new-tokens 10");
  EXPECT_EQ(too_long.exit_code, 2);
  EXPECT_EQ(too_long.err,
            "attn: generate: --benchmark: the prompt (3 tokens) plus --max-new-tokens 10 exceed "
            "context_length 12\n");
  std::filesystem::remove_all(dir);
}

// ATTN_GEMV_BF16_PATH picks the bf16 decode GEMV's path (docs/gemm.md), and
// --benchmark --json says which ran.
TEST(GenerateCli, Bf16DecodeGemvPathIsForcedByTheEnvironment) {
  ATTN_REQUIRE_CLI();
  auto model = seeded_model();
  const std::string dir = write_checkpoint(*model, good_metadata());
  for (const std::string& path : kernels::gemv_bf16_paths()) {
    const ScopedEnv env("ATTN_GEMV_BF16_PATH", path.c_str());
    const CliResult r = run_cli("generate --checkpoint '" + dir +
                                "' --benchmark --json --dtype bfloat16 --prompt 'abc' "
                                "--max-new-tokens 6");
    ASSERT_EQ(r.exit_code, 0) << path << ": " << r.err;
    EXPECT_EQ(nlohmann::json::parse(r.out).at("gemv_bf16_path"), path);
  }
  const ScopedEnv bad("ATTN_GEMV_BF16_PATH", "fp8");
  const CliResult r = run_cli("generate --checkpoint '" + dir + "' --prompt 'abc'");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(lines_of(r.err).size(), 1u) << r.err;
  EXPECT_NE(r.err.find("ATTN_GEMV_BF16_PATH='fp8' is not a path this CPU can run; valid: '"),
            std::string::npos)
      << r.err;
  std::filesystem::remove_all(dir);
}

struct BadCase {
  std::string args;  // after "generate"; DIR is replaced by a good checkpoint
  int exit_code;
  std::string err;
};

TEST(GenerateCli, BadInputIsOneLine) {
  ATTN_REQUIRE_CLI();
  auto model = seeded_model();
  const std::string dir = write_checkpoint(*model, good_metadata());
  std::map<std::string, std::string> bad_json = good_metadata();
  bad_json["config"] = "{\"vocab_size\": 10,";
  const std::string bad_json_dir = write_checkpoint(*model, bad_json);
  std::map<std::string, std::string> no_config = good_metadata();
  no_config.erase("config");
  const std::string no_config_dir = write_checkpoint(*model, no_config);
  std::map<std::string, std::string> small_vocab = good_metadata();
  small_vocab["vocab"] = R"(["a", "b"])";
  const std::string small_vocab_dir = write_checkpoint(*model, small_vocab);
  const std::string empty_dir = temp_path("empty");
  std::filesystem::create_directories(empty_dir);
  const std::string garbage_dir = temp_path("garbage");
  std::filesystem::create_directories(garbage_dir);
  { std::ofstream(garbage_dir + "/checkpoint.safetensors") << "not a safetensors file"; }
  const std::string f = "/checkpoint.safetensors";
  const std::vector<BadCase> cases{
      {"--checkpoint /nonexistent/x --prompt a", 1,
       "attn: generate: model directory '/nonexistent/x' does not exist. Models come from the "
       "Hugging Face Hub (GPT-2 is openai-community/gpt2: git clone "
       "https://huggingface.co/openai-community/gpt2, or any tool that downloads a model "
       "repository; Llama 3, Qwen3 and Gemma 3 the same way) or from attn train --out; "
       "tests/fixtures/hf_gpt2/fp32 in attn's checkout is a tiny GPT-2 for trying every command "
       "offline (README.md, \"Where models come from\")"},
      {"--checkpoint '" + empty_dir + "' --prompt a", 1,
       "attn: generate: '" + empty_dir + f +
           "' does not exist (a checkpoint directory holds checkpoint.safetensors)"},
      {"--checkpoint '" + no_config_dir + "' --prompt a", 1,
       "attn: generate: '" + no_config_dir + f + "': metadata has no \"config\""},
      {"--checkpoint '" + small_vocab_dir + "' --prompt a", 1,
       "attn: generate: '" + small_vocab_dir + f +
           "': vocab has 2 tokens but config vocab_size is 10"},
      {"--checkpoint DIR --prompt 'abz'", 1,
       "attn: generate: the character 'z' (U+007A) at position 2 is not in the vocabulary (10 "
       "characters)"},
      {"--checkpoint DIR --prompt a --max-new-tokens -1", 2,
       "attn: generate: --max-new-tokens: must be a whole number in 0..1048576, got '-1'"},
      {"--checkpoint DIR --prompt a --top-k -1", 2,
       "attn: generate: --top-k: must be a whole number in 0..9223372036854775807, got '-1'"},
      {"--checkpoint DIR --prompt a --top-p 0", 2,
       "attn: generate: --top-p must be in (0, 1] (1: off), got 0"},
      {"--checkpoint DIR --prompt a --prompt-file DIR", 2,
       "attn: generate: give either --prompt or --prompt-file, not both"},
      {"--checkpoint DIR --prompt a --top-k 11", 2,
       "attn: generate: --top-k must be at most the vocabulary size 10, got 11"},
      {"--checkpoint DIR --prompt a --temperature -0.5", 2,
       "attn: generate: --temperature must be a finite number >= 0, got -0.5"},
      {"--checkpoint DIR", 2, "attn: generate: --prompt must have at least one character"},
      {"--prompt a", 2, "attn: generate: give --model DIR (or --config 124m with --benchmark)"},
      {"--config 124m --prompt a", 2,
       "attn: generate: --config 124m makes a random-weight model without a vocabulary; use it "
       "with --benchmark"},
      {"--config 350m --benchmark", 2, "attn: generate: --config must be 124m, got '350m'"},
      {"--checkpoint DIR --prompt a --json", 2, "attn: generate: --json goes with --benchmark"},
      {"--checkpoint DIR --benchmark --json --repeats 0", 2,
       "attn: generate: --repeats: must be a whole number in 1..1000000, got '0'"},
  };
  for (BadCase c : cases) {
    if (const auto pos = c.args.find("DIR"); pos != std::string::npos) {
      c.args.replace(pos, 3, "'" + dir + "'");
    }
    const CliResult r = run_cli("generate " + c.args);
    EXPECT_EQ(r.exit_code, c.exit_code) << c.args;
    EXPECT_EQ(r.err, c.err + "\n") << c.args;
    EXPECT_EQ(r.out, "") << c.args;
  }
  // Messages that quote a parser: one line naming the file and the key.
  const CliResult json = run_cli("generate --checkpoint '" + bad_json_dir + "' --prompt a");
  EXPECT_EQ(json.exit_code, 1);
  EXPECT_EQ(lines_of(json.err).size(), 1u) << json.err;
  EXPECT_EQ(
      json.err.rfind(
          "attn: generate: '" + bad_json_dir + f + "': metadata \"config\" is not valid JSON: ", 0),
      0u)
      << json.err;
  const CliResult garbage = run_cli("generate --checkpoint '" + garbage_dir + "' --prompt a");
  EXPECT_EQ(garbage.exit_code, 1);
  EXPECT_EQ(lines_of(garbage.err).size(), 1u) << garbage.err;
  EXPECT_NE(garbage.err.find(garbage_dir + f), std::string::npos) << garbage.err;
  for (const std::string& d :
       {dir, bad_json_dir, no_config_dir, small_vocab_dir, empty_dir, garbage_dir}) {
    std::filesystem::remove_all(d);
  }
}

}  // namespace
}  // namespace attn::test
