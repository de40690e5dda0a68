// The fused output head + cross-entropy (GPTModel::forward_loss with
// GPTOptions::fused_loss, attn/linear_cross_entropy.h) against PyTorch 1.13's
// F.cross_entropy on the book's GPTModel: the loss and every parameter's
// gradient. fused_ce.json (tests/torch/oracle_fused_ce.py): 39 rows in attn's
// chunks of 8 (the last has 7), untied, with ignore_index targets, and tied
// (out_head.weight = tok_emb.weight); gpt.json's forward cases (drop_rate 0
// and 0.1, the latter with PyTorch's dropout masks on the reference attention).
// Tolerances, max|attn − torch| <= tol · max(floor, max|torch|): the loss
// 2e-6 (floor 1), every gradient 1e-5 (floor 0: relative to the tensor's
// largest gradient); the figures are printed ("[ fused-ce ] ...").
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "attn/gpt.h"
#include "attn/random.h"
#include "attn/tensor.h"
#include "gpt_config_json.h"
#include "oracle.h"

namespace {

using attn::Tensor;
using attn::nn::GPTConfig;
using attn::nn::GPTModel;
using attn::nn::GPTOptions;
using Json = nlohmann::ordered_json;

const Json& fused_oracle() {
  static const Json j = attn::test::read_oracle_json<Json>("fused_ce.json", "oracle_fused_ce.py");
  return j;
}

const Json& gpt_oracle() {
  static const Json j = attn::test::read_oracle_json<Json>("gpt.json", "oracle_gpt.py");
  return j;
}

GPTConfig config_from(const Json& c, bool tied) {
  GPTConfig g = attn::test::gpt_config_from_json(c);
  g.tie_embeddings = tied;
  return g;
}

// The fused loss and every gradient against torch's; returns the worst gradient error.
void check_case(const Json& ref, const std::string& what, bool tied, int64_t chunk_rows) {
  const GPTConfig cfg = config_from(ref.at("config"), tied);
  const int64_t B = ref.at("B").get<int64_t>(), T = ref.at("T").get<int64_t>();
  attn::manual_seed(ref.at("seed").get<uint64_t>());
  GPTModel model(cfg, GPTOptions{.loss_chunk_rows = chunk_rows});
  ASSERT_TRUE(model.fused_loss());
  const auto ids = ref.at("ids").get<std::vector<int64_t>>();
  const auto targets = ref.at("targets").get<std::vector<int64_t>>();
  const float loss =
      model.forward_loss(Tensor::from_int64({B, T}, ids), Tensor::from_int64({B, T}, targets));
  model.backward_loss();
  const double ref_loss = ref.at("loss").get<double>();
  const double loss_err = std::fabs(loss - ref_loss) / std::max(1.0, std::fabs(ref_loss));
  EXPECT_LE(loss_err, 2e-6) << what << ": " << loss << " vs " << ref_loss;
  double worst = 0.0;
  size_t n = 0;
  for (const auto& [name, g] : ref.at("grads").items()) {
    const Tensor mine = model.parameter(name).grad, theirs = attn::test::tensor_from_json(g);
    ASSERT_EQ(mine.shape(), theirs.shape()) << what << " " << name;
    const std::vector<float> a = mine.to_vector(), b = theirs.to_vector();
    double diff = 0.0, scale = 0.0;
    for (size_t i = 0; i < a.size(); ++i) {
      diff = std::max(diff, static_cast<double>(std::fabs(a[i] - b[i])));
      scale = std::max(scale, static_cast<double>(std::fabs(b[i])));
    }
    if (name.find("W_key.bias") != std::string::npos) continue;  // zero in exact maths
    const double err = scale > 0.0 ? diff / scale : diff;
    EXPECT_LE(err, 1e-5) << what << " d" << name << ": max diff " << diff << ", max |torch| "
                         << scale;
    worst = std::max(worst, err);
    ++n;
  }
  EXPECT_EQ(n + (cfg.qkv_bias ? 2 * static_cast<size_t>(cfg.n_layers) : 0), ref.at("grads").size());
  std::printf("[ fused-ce ] %s: loss %.2e, worst of %zu gradients %.2e (relative)\n", what.c_str(),
              loss_err, n, worst);
}

TEST(FusedCeTorch, UntiedLossAndEveryGradientAgree) {
  check_case(fused_oracle().at("cases").at("untied"), "untied, chunks of 8", false, 8);
}

TEST(FusedCeTorch, IgnoreIndexAsTorch) {
  check_case(fused_oracle().at("cases").at("untied_ignore"), "untied, ignore_index, chunks of 8",
             false, 8);
}

TEST(FusedCeTorch, TiedHeadAgrees) {
  check_case(fused_oracle().at("cases").at("tied"), "tied, ignore_index, chunks of 8", true, 8);
}

TEST(FusedCeTorch, TheGptForwardCasesWithTheDefaultChunk) {
  check_case(gpt_oracle().at("forward").at(0), "gpt.json drop_rate 0", false, 0);
  check_case(gpt_oracle().at("forward").at(1), "gpt.json drop_rate 0.1 (torch's masks)", false, 0);
}

}  // namespace
