// `attn train --recipe book-ch5` on a tiny GPT against the book's
// train_model_simple under PyTorch 1.13 (tests/torch/oracle_train_book.py):
// the same recipe (seed 123 before the model, AdamW lr 4e-4 with weight decay
// 0.1 on every parameter, constant lr, dropout 0.1 with PyTorch's masks, the
// book's loaders and their draws, evaluation after every 5th step, a greedy
// sample per epoch) with a 1-layer, emb-16 model on The Verdict's first 3,000
// characters, 2 epochs: every printed line equal (the sample texts with
// tiktoken's U+FFFD for split characters), epochs, steps and tokens seen
// equal, the losses within 1e-5, the samples' ids equal. Seconds, so it runs
// in every suite; the 124M run is test_ch5_training_torch.cpp's.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli.h"
#include "oracle.h"

namespace {

using nlohmann::json;

constexpr double kLossTol = 1e-5;  // float32 sums in two orders; seen 1.1e-6

TEST(TrainBookVsTorch, TinyRecipeRunPrintsTorchsLines) {
  ATTN_REQUIRE_CLI();
  const json torch = attn::test::read_oracle_json("train_book.json", "oracle_train_book.py");
  const int64_t chars = torch.at("text_chars").get<int64_t>();
  const std::string verdict =
      attn::test::read_text(std::string(ATTN_DATA_DIR) + "/the-verdict.txt");
  const std::string text = attn::test::temp_path("train_book_text.txt");
  { std::ofstream(text, std::ios::binary) << verdict.substr(0, static_cast<size_t>(chars)); }
  const std::string out = attn::test::temp_path("train_book_run");
  std::filesystem::remove_all(out);
  const json& cfg = torch.at("config");
  const auto r = attn::test::run_cli(
      "train --recipe book-ch5 --text '" + text + "' --out '" + out + "' --n-layers " +
      cfg.at("n_layers").dump() + " --n-heads " + cfg.at("n_heads").dump() + " --emb-dim " +
      cfg.at("emb_dim").dump() + " --context-length " + cfg.at("context_length").dump() +
      " --stride " + cfg.at("context_length").dump() + " --epochs 2 --eval-iters 2 --threads 1");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::vector<std::string> lines = attn::test::lines_of(r.out);
  ASSERT_GE(lines.size(), 2u) << r.out;
  lines = std::vector<std::string>(lines.begin() + 1, lines.end() - 1);  // the header and "done"
  std::vector<std::string> want;
  for (const auto& p : torch.at("printed")) want.push_back(p.get<std::string>());
  EXPECT_EQ(lines, want);

  const auto metrics = attn::test::lines_of(attn::test::read_text(out + "/metrics.jsonl"));
  const json& evals = torch.at("evaluations");
  ASSERT_EQ(metrics.size(), evals.size());
  for (size_t k = 0; k < metrics.size(); ++k) {
    const json m = json::parse(metrics[k]);
    const json& t = evals[k];
    EXPECT_EQ(m.at("epoch"), t.at("epoch")) << k;
    EXPECT_EQ(m.at("global_step"), t.at("step")) << k;
    EXPECT_EQ(m.at("tokens_seen"), t.at("tokens_seen")) << k;
    for (const char* key : {"train_loss", "val_loss"}) {
      EXPECT_NEAR(m.at(key).get<double>(), t.at(key).get<double>(), kLossTol) << k << " " << key;
    }
  }
  const auto samples = attn::test::lines_of(attn::test::read_text(out + "/samples.jsonl"));
  ASSERT_EQ(samples.size(), torch.at("samples").size());
  for (size_t k = 0; k < samples.size(); ++k)
    EXPECT_EQ(json::parse(samples[k]).at("ids"), torch.at("samples")[k].at("ids")) << k;
  std::filesystem::remove_all(out);
  std::remove(text.c_str());
}

}  // namespace
