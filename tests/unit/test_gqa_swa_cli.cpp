// `attn train` and `attn generate` with the book's grouped-query and
// sliding-window attention (--n-kv-groups, --sliding-window-size,
// --sliding-window-stride): a run trains (the loss falls), its checkpoint
// stores the options in its config and reloads as the same model, `attn
// generate` on it gives the library's tokens with and without the cache,
// --resume keeps them (and refuses others), and bad values are one stderr line.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "attn/checkpoint.h"
#include "attn/generate.h"
#include "attn/gpt.h"
#include "attn/safetensors.h"
#include "cli.h"

namespace attn::test {
namespace {

std::string text_file() {
  const std::string path = temp_path("text.txt");
  std::ofstream out(path);
  const char* lines[] = {"to be or not to be, that is the question\n",
                         "whether tis nobler in the mind to suffer\n",
                         "the slings and arrows of outrageous fortune\n"};
  for (int i = 0; i < 60; ++i) out << lines[i % 3];
  return path;
}

const std::string kModel =
    " --n-layers 3 --n-heads 4 --emb-dim 16 --context-length 16 --batch-size 4 --warmup-iters 2 "
    "--eval-interval 20 --eval-iters 2 --seed 3 --threads 1 ";

TEST(GqaSwaCli, TrainSaveReloadGenerate) {
  ATTN_REQUIRE_CLI();
  const std::string text = text_file(), dir = temp_path("run");
  auto r = run_cli("train --text '" + text + "' --out '" + dir + "'" + kModel +
                   "--max-iters 40 --n-kv-groups 2 --sliding-window-size 5 "
                   "--sliding-window-stride 2");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto lines = lines_of(read_text(dir + "/metrics.jsonl"));
  ASSERT_EQ(lines.size(), 3u);  // iterations 0, 20, 40
  EXPECT_LT(nlohmann::json::parse(lines.back()).at("train_loss").get<double>(),
            nlohmann::json::parse(lines.front()).at("train_loss").get<double>());
  // The config keeps the options; the weights are GQA's (W_key (2·4, 16), no out_proj bias).
  const auto file = io::read_safetensors(dir + "/checkpoint.safetensors");
  const auto cfg = nlohmann::json::parse(file.metadata.at("config"));
  EXPECT_EQ(cfg.at("n_kv_groups"), 2);
  EXPECT_EQ(cfg.at("sliding_window_size"), 5);
  EXPECT_EQ(cfg.at("sliding_window_stride"), 2);
  bool has_key = false, has_out_bias = false;
  for (const auto& [name, t] : file.tensors) {
    if (name == "trf_blocks.0.att.W_key.weight") {
      has_key = true;
      EXPECT_EQ(t.shape(), (Shape{8, 16}));
    }
    has_out_bias |= name == "trf_blocks.0.att.out_proj.bias";
  }
  EXPECT_TRUE(has_key);
  EXPECT_FALSE(has_out_bias);
  std::unique_ptr<nn::GPTModel> model;
  const nn::Checkpoint ck = nn::load_checkpoint(dir, model);
  EXPECT_EQ(model->config().n_kv_groups, 2);
  EXPECT_EQ(model->trf_blocks[0].att.sliding_window_size(), 5);  // K = 2: window, window, full
  EXPECT_EQ(model->trf_blocks[1].att.sliding_window_size(), 5);
  EXPECT_EQ(model->trf_blocks[2].att.sliding_window_size(), 0);
  EXPECT_EQ(model->trf_blocks[0].att.num_kv_heads(), 2);
  // generate: the library's greedy text, with the cache and without (past the
  // 16-token context, so the cache is also re-filled).
  const std::vector<int64_t> prompt = nn::encode_text(ck.vocab, "to be");
  Generator gen(1);
  const Tensor out = nn::generate(*model, Tensor::from_int64({1, 5}, prompt),
                                  {.max_new_tokens = 20}, gen);
  const std::string want = nn::decode_ids(ck.vocab, out.to_int64_vector()) + "\n";
  for (const std::string cache : {"", " --no-cache"}) {
    r = run_cli("generate --model '" + dir + "' --prompt 'to be' --max-new-tokens 20 --greedy" +
                cache);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(r.out, want) << cache;
  }
  // --resume keeps the options; changing them is a config mismatch.
  r = run_cli("train --text '" + text + "' --out '" + dir + "' --resume --max-iters 60");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  r = run_cli("train --text '" + text + "' --out '" + dir + "' --resume --max-iters 80 "
              "--n-kv-groups 4");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("config mismatch"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("n_kv_groups = 2, this run 4"), std::string::npos) << r.err;
  EXPECT_EQ(lines_of(r.err).size(), 1u) << r.err;
  std::filesystem::remove_all(dir);
}

TEST(GqaSwaCli, BenchmarkConfigWithGqaAndWindow) {
  ATTN_REQUIRE_CLI();
  const auto r = run_cli(
      "generate --config 124m --benchmark --prompt-tokens 4 --max-new-tokens 2 --n-kv-groups 3 "
      "--sliding-window-size 3 --sliding-window-stride 5");
  ASSERT_EQ(r.exit_code, 0) << r.err;
}

TEST(GqaSwaCli, BadFlagsAreOneLine) {
  ATTN_REQUIRE_CLI();
  const std::string text = text_file(), dir = temp_path("bad");
  struct Case {
    std::string args;
    int code;
    std::string err;
  };
  const std::string train = "train --text '" + text + "' --out '" + dir + "'" + kModel;
  const std::vector<Case> cases{
      {train + "--n-kv-groups 3", 2, "attn: train: --n-kv-groups 3 must divide --n-heads 4"},
      {train + "--n-kv-groups -1", 2,
       "attn: train: --n-kv-groups: must be a whole number in 0..4096, got '-1'"},
      {train + "--sliding-window-size -2", 2,
       "attn: train: --sliding-window-size: must be a whole number in 0..1048576, got '-2'"},
      {train + "--n-kv-groups 2 --dtype bfloat16", 2,
       "attn: train: --n-kv-groups and --sliding-window-size run in float32 only, got --dtype "
       "bfloat16"},
      {train + "--sliding-window-size 4 --exact --drop-rate 0.1", 2,
       "attn: train: --exact with --n-kv-groups or --sliding-window-size needs --drop-rate 0 "
       "(their attention dropout masks are not PyTorch's), got --drop-rate 0.1"},
      {"generate --config 124m --benchmark --n-kv-groups 5", 2,
       "attn: generate: --n-kv-groups must divide n_heads 12, got 5"},
      {"generate --config 124m --benchmark --sliding-window-size 0", 2,
       "attn: generate: --sliding-window-size: must be a whole number in 1..1048576, got '0'"},
      {"generate --config 124m --benchmark --sliding-window-stride 2", 2,
       "attn: generate: --sliding-window-stride needs --sliding-window-size"},
      {"generate --config 124m --benchmark --n-kv-groups 4 --dtype bfloat16", 2,
       "attn: generate: --n-kv-groups and --sliding-window-size run in float32 only, got --dtype "
       "bfloat16"},
      {"generate --model '" + dir + "' --prompt a --n-kv-groups 2", 2,
       "attn: generate: --n-kv-groups, --sliding-window-size and --sliding-window-stride go with "
       "--config 124m (a checkpoint stores its own in its config)"},
  };
  for (const Case& c : cases) {
    const auto r = run_cli(c.args);
    EXPECT_EQ(r.exit_code, c.code) << c.args << "\n" << r.err;
    EXPECT_EQ(r.err, c.err + "\n") << c.args;
  }
  EXPECT_FALSE(std::filesystem::exists(dir));
}

}  // namespace
}  // namespace attn::test
