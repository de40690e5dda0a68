// The GPT with rotary position embedding (GPTConfig::rope) and
// MultiHeadAttention with RoPE (MultiHeadAttentionOptions::rope): no pos_emb;
// MHA's gradients by finite differences on both paths and the paths agreeing;
// the KV cache (every forward_cached path: the GEMV step, the flash prefill,
// the generic one) equal to the uncached forward at the right positions, float32
// and bfloat16; generation with and without the cache giving the same tokens,
// past context_length; the checkpoint's config; `attn train --rope` /
// `attn generate`; errors.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "attn/checkpoint.h"
#include "attn/generate.h"
#include "attn/gpt.h"
#include "attn/hf_gpt2.h"
#include "attn/kv_cache.h"
#include "attn/model_config.h"
#include "attn/ops.h"
#include "attn/random.h"
#include "attn/safetensors.h"
#include "cli.h"
#include "gradcheck.h"

namespace attn {
namespace {

using nn::GPTConfig;
using nn::GPTModel;

const GPTConfig kRope{.vocab_size = 23,
                      .context_length = 10,
                      .emb_dim = 16,
                      .n_heads = 2,
                      .n_layers = 2,
                      .drop_rate = 0.0f,
                      .qkv_bias = true,
                      .rope = true,
                      .theta_base = 100.0f};

Tensor random_ids(int64_t B, int64_t T, int64_t V, uint64_t seed) {
  Generator gen(seed);
  std::vector<int64_t> ids(size_t(B * T));
  for (auto& id : ids) id = int64_t(gen.random64() % uint64_t(V));
  return Tensor::from_int64({B, T}, ids);
}

std::shared_ptr<const RopeParams> tables(int64_t hd, int64_t n) {
  return std::make_shared<const RopeParams>(compute_rope_params(hd, 10000.0f, n));
}

TEST(GptRope, NoPositionEmbeddingInTheStateDictOrTheParameters) {
  Generator g1(7), g2(7);
  GPTModel rope(kRope, {}, g1);
  GPTConfig plain_cfg = kRope;
  plain_cfg.rope = false;
  GPTModel plain(plain_cfg, {}, g2);
  for (auto& [name, t] : rope.state_dict())
    EXPECT_EQ(name.find("pos_emb"), std::string::npos) << name;
  EXPECT_EQ(rope.num_parameters(), plain.num_parameters() - 10 * 16);
  // The same draws up to pos_emb, then none for it: tok_emb equal, the next differ.
  EXPECT_EQ(max_abs_diff(rope.tok_emb.weight.value, plain.tok_emb.weight.value), 0.0f);
  EXPECT_GT(max_abs_diff(rope.trf_blocks[0].att.W_query.weight.value,
                         plain.trf_blocks[0].att.W_query.weight.value),
            0.0f);
}

TEST(GptRope, MultiHeadAttentionGradientsMatchFiniteDifferencesOnBothPaths) {
  for (auto backend : {nn::AttentionBackend::kReference, nn::AttentionBackend::kFused}) {
    Generator gen(3);
    nn::MultiHeadAttention m({.d_in = 6,
                              .d_out = 8,
                              .context_length = 8,
                              .num_heads = 2,
                              .qkv_bias = true,
                              .backend = backend,
                              .rope = tables(4, 8)},
                             gen);
    test::gradcheck_module(
        backend == nn::AttentionBackend::kFused ? "mha rope fused" : "mha rope ref", m,
        test::random_tensor({2, 5, 6}, 4));
  }
}

TEST(GptRope, FusedAndReferencePathsAgree) {
  const Tensor x = test::random_tensor({2, 7, 16}, 5), dy = test::random_tensor({2, 7, 16}, 6);
  Tensor y[2], dx[2], dw[2];
  int i = 0;
  for (auto backend : {nn::AttentionBackend::kReference, nn::AttentionBackend::kFused}) {
    Generator gen(8);
    nn::MultiHeadAttention m({.d_in = 16,
                              .d_out = 16,
                              .context_length = 7,
                              .num_heads = 4,
                              .backend = backend,
                              .rope = tables(4, 7)},
                             gen);
    y[i] = m.forward(x);
    dx[i] = m.backward(dy);
    dw[i] = m.W_key.weight.grad.clone();
    ++i;
  }
  EXPECT_LT(max_abs_diff(y[0], y[1]), 2e-6f);
  EXPECT_LT(max_abs_diff(dx[0], dx[1]), 5e-6f);
  EXPECT_LT(max_abs_diff(dw[0], dw[1]), 5e-6f);
  // And RoPE changes the result (the tables are read).
  Generator gen(8);
  nn::MultiHeadAttention plain({.d_in = 16, .d_out = 16, .context_length = 7, .num_heads = 4}, gen);
  EXPECT_GT(max_abs_diff(plain.forward(x), y[0]), 1e-3f);
}

// bf16 (mixed precision, the fused path): q and k rotated in the bf16 qkv
// buffer, dq and dk rotated back in bf16: within bf16 rounding of float32.
TEST(GptRope, Bf16ForwardAndBackwardFollowFloat32) {
  const Tensor x = test::random_tensor({2, 6, 16}, 30), dy = test::random_tensor({2, 6, 16}, 31);
  Tensor y[2], dx[2], dwq[2];
  int i = 0;
  for (DType dtype : {DType::kFloat32, DType::kBFloat16}) {
    Generator gen(32);
    nn::MultiHeadAttention m({.d_in = 16,
                              .d_out = 16,
                              .context_length = 6,
                              .num_heads = 2,
                              .dtype = dtype,
                              .rope = tables(8, 6)},
                             gen);
    y[i] = m.forward(x);
    dx[i] = m.backward(dy);
    dwq[i] = m.W_query.weight.grad.clone();
    ++i;
  }
  const auto rel = [](const Tensor& a, const Tensor& b) {
    float scale = 0.0f;
    for (float v : b.to_vector()) scale = std::max(scale, std::fabs(v));
    return max_abs_diff(a, b) / scale;
  };
  EXPECT_LT(rel(y[1], y[0]), 3e-2f);
  EXPECT_LT(rel(dx[1], dx[0]), 3e-2f);
  EXPECT_LT(rel(dwq[1], dwq[0]), 5e-2f);
  // Without the rotation's backward, dW_query would be far off: RoPE is in it.
  Generator gen(32);
  nn::MultiHeadAttention plain(
      {.d_in = 16, .d_out = 16, .context_length = 6, .num_heads = 2, .dtype = DType::kBFloat16},
      gen);
  plain.forward(x);
  plain.backward(dy);
  EXPECT_GT(rel(plain.W_query.weight.grad, dwq[0]), 0.1f);
}

TEST(GptRope, MultiHeadAttentionCacheRotatesEachTokenAtItsPosition) {
  Generator gen(9);
  nn::MultiHeadAttention m(
      {.d_in = 8, .d_out = 8, .context_length = 12, .num_heads = 2, .rope = tables(4, 12)}, gen);
  m.eval();
  const Tensor x = test::random_tensor({2, 9, 8}, 10);
  const Tensor want = m.forward(x);
  for (auto engine : {gemm::Engine::kBlas, gemm::Engine::kFast}) {
    // a prefill of 4 (flash with kFast), one token (GEMV with kFast), then 4 at once (generic)
    nn::KVCache cache = nn::make_kv_cache(m, 2);
    const Tensor a = nn::forward_cached(m, x.slice(1, 0, 4), cache, engine);
    const Tensor b = nn::forward_cached(m, x.slice(1, 4, 5), cache, engine);
    const Tensor c = nn::forward_cached(m, x.slice(1, 5, 9), cache, engine);
    EXPECT_LT(max_abs_diff(cat({a, b, c}, 1), want), 2e-6f) << int(engine);
  }
}

TEST(GptRope, CachedForwardEqualsTheFullForwardForEveryLayerKindAndDtype) {
  struct Case {
    nn::LayerImpl layers;
    DType dtype;
    float tol;
  };
  for (const Case& c : {Case{nn::LayerImpl::kKernel, DType::kFloat32, 2e-5f},
                        Case{nn::LayerImpl::kReference, DType::kFloat32, 2e-5f},
                        Case{nn::LayerImpl::kKernel, DType::kBFloat16, 0.15f}}) {
    Generator gen(11);
    GPTModel model(kRope, {.layers = c.layers, .dtype = c.dtype}, gen);
    model.eval();
    const Tensor ids = random_ids(2, 9, kRope.vocab_size, 12);
    const Tensor want = model.forward(ids);  // (2, 9, V)
    nn::GPTKVCache cache = nn::make_gpt_kv_cache(model, 2);
    const Tensor a = nn::forward_cached(model, ids.slice(1, 0, 5).contiguous(), cache);
    const Tensor b = nn::forward_cached(model, ids.slice(1, 5, 6).contiguous(), cache);
    const Tensor d = nn::forward_cached(model, ids.slice(1, 6, 9).contiguous(), cache);
    const float diff = max_abs_diff(cat({a, b, d}, 1), want);
    EXPECT_LT(diff, c.tol) << "layers " << int(c.layers) << " dtype " << dtype_name(c.dtype);
  }
}

TEST(GptRope, GenerationWithAndWithoutTheCacheGivesTheSameTokens) {
  for (DType dtype : {DType::kFloat32, DType::kBFloat16}) {
    Generator gen(13);
    GPTModel model(kRope, {.dtype = dtype}, gen);
    model.eval();
    const Tensor prompt = random_ids(2, 3, kRope.vocab_size, 14);
    std::vector<int64_t> out[2];
    for (bool use_cache : {true, false}) {
      Generator sample(15);
      out[use_cache] =
          nn::generate(model, prompt,
                       {.max_new_tokens = 14, .temperature = 0.8f, .use_cache = use_cache}, sample)
              .to_int64_vector();
    }
    EXPECT_EQ(out[0], out[1]) << dtype_name(dtype);  // 17 > context_length 10: the window slides
    EXPECT_EQ(out[0].size(), 2u * 17u);
  }
}

TEST(GptRope, ConfigRoundTripsThroughTheCheckpointJson) {
  const GPTConfig c = nn::config_from_json(nn::config_to_json(kRope), "config");
  EXPECT_TRUE(c.rope);
  EXPECT_EQ(c.theta_base, 100.0f);
  EXPECT_EQ(nn::config_to_json(GPTConfig{.vocab_size = 3, .context_length = 2, .emb_dim = 2})
                .find("rope"),
            std::string::npos);  // the other checkpoints keep their bytes
}

TEST(GptRope, ErrorsNameTheValues) {
  GPTConfig odd = kRope;
  odd.n_heads = 16;  // head_dim 1
  try {
    GPTModel m(odd);
    FAIL() << "no exception";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(
        std::string(e.what()).find("rope needs an even head_dim, got emb_dim 16 / n_heads 16 = 1"),
        std::string::npos)
        << e.what();
  }
  GPTConfig base = kRope;
  base.theta_base = 0.5f;
  EXPECT_THROW(GPTModel m(base), std::invalid_argument);
  GPTModel m(kRope);
  EXPECT_THROW(io::hf_gpt2_state_dict(m), std::invalid_argument);
}

// ---- the latent-attention GPT (GPTConfig::latent_dim) -----------------------------------

const GPTConfig kLatent{.vocab_size = 19,
                        .context_length = 9,
                        .emb_dim = 12,
                        .n_heads = 3,
                        .n_layers = 2,
                        .drop_rate = 0.0f,
                        .qkv_bias = false,
                        .latent_dim = 5};

TEST(GptLatent, BlocksHoldTheBooksLatentAttentionUnderAtt) {
  Generator gen(21);
  GPTModel model(kLatent, {}, gen);
  std::vector<std::string> names;
  for (auto& [name, t] : model.trf_blocks[0].state_dict()) names.push_back(name);
  EXPECT_EQ(names[0], "att.W_query.weight");
  EXPECT_EQ(names[1], "att.W_DKV.weight");
  EXPECT_EQ(model.trf_blocks[0].latent_att->latent_dim(), 5);
  // Gradients flow through the latent attention.
  model.zero_grad();
  nn::CrossEntropyLoss loss;
  const Tensor ids = random_ids(2, 6, kLatent.vocab_size, 22);
  loss.forward(model.forward(ids), random_ids(2, 6, kLatent.vocab_size, 23));
  model.backward(loss.backward());
  float g = 0.0f;
  for (float v : model.trf_blocks[1].latent_att->W_DKV.weight.grad.to_vector()) g += std::fabs(v);
  EXPECT_GT(g, 0.0f);
}

TEST(GptLatent, CachedForwardAndGenerationEqualTheUncachedOnes) {
  for (auto layers : {nn::LayerImpl::kKernel, nn::LayerImpl::kReference}) {
    Generator gen(24);
    GPTModel model(kLatent, {.layers = layers}, gen);
    model.eval();
    const Tensor ids = random_ids(2, 8, kLatent.vocab_size, 25);
    const Tensor want = model.forward(ids);
    nn::GPTKVCache cache = nn::make_gpt_kv_cache(model, 2);
    EXPECT_TRUE(cache.layers.empty());
    ASSERT_EQ(cache.latent_layers.size(), 2u);
    const Tensor a = nn::forward_cached(model, ids.slice(1, 0, 3).contiguous(), cache);
    const Tensor b = nn::forward_cached(model, ids.slice(1, 3, 4).contiguous(), cache);
    const Tensor c = nn::forward_cached(model, ids.slice(1, 4, 8).contiguous(), cache);
    EXPECT_LT(max_abs_diff(cat({a, b, c}, 1), want), 2e-5f) << int(layers);
    EXPECT_EQ(cache.length(), 8);
    std::vector<int64_t> out[2];
    for (bool use_cache : {true, false}) {
      Generator sample(26);
      out[use_cache] =
          nn::generate(model, ids.slice(1, 0, 2).contiguous(),
                       {.max_new_tokens = 12, .temperature = 0.9f, .use_cache = use_cache}, sample)
              .to_int64_vector();
    }
    EXPECT_EQ(out[0], out[1]);  // 14 > context_length 9: the window slides
  }
}

TEST(GptLatent, ErrorsNameTheValues) {
  GPTConfig both = kLatent;
  both.rope = true;
  both.n_heads = 2;
  EXPECT_THROW(GPTModel m(both), std::invalid_argument);
  try {
    GPTModel m(kLatent, {.dtype = DType::kBFloat16});
    FAIL() << "no exception";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("runs in float32 only, got dtype bfloat16"),
              std::string::npos)
        << e.what();
  }
  const GPTConfig c = nn::config_from_json(nn::config_to_json(kLatent), "config");
  EXPECT_EQ(c.latent_dim, 5);
}

TEST(GptRopeCli, TrainWithRopeThenGenerateFromItsCheckpoint) {
  ATTN_REQUIRE_CLI();
  const std::string text = test::temp_path("rope.txt"), dir = test::temp_path("roperun");
  {
    std::ofstream out(text, std::ios::binary);
    for (int i = 0; i < 60; ++i) out << "the cat sat on the mat. a dog ran to the log.\n";
  }
  const std::string model =
      " --n-layers 1 --n-heads 2 --emb-dim 16 --context-length 16 "
      "--batch-size 4 --warmup-iters 2 --eval-interval 10 --eval-iters 1 "
      "--max-iters 10 --threads 1";
  const auto r = test::run_cli("train --text '" + text + "' --out '" + dir + "'" + model +
                               " --rope --theta-base 500");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("batch 4, RoPE (theta_base 500); iterations 0 -> 10"), std::string::npos)
      << r.out;
  const auto file = io::read_safetensors(dir + "/checkpoint.safetensors");
  const auto cfg = nlohmann::json::parse(file.metadata.at("config"));
  EXPECT_EQ(cfg.at("rope"), true);
  EXPECT_EQ(cfg.at("theta_base"), 500.0);
  for (const auto& [name, t] : file.tensors) EXPECT_EQ(name.find("pos_emb"), std::string::npos);
  std::unique_ptr<GPTModel> loaded;
  (void)nn::load_checkpoint(dir, loaded);
  EXPECT_TRUE(loaded->config().rope);
  EXPECT_EQ(loaded->config().theta_base, 500.0f);
  std::string texts[2];
  for (int cache = 0; cache < 2; ++cache) {
    const auto g = test::run_cli("generate --checkpoint '" + dir +
                                 "' --prompt 'the cat' --max-new-tokens 20 --greedy" +
                                 (cache == 0 ? " --no-cache" : ""));
    ASSERT_EQ(g.exit_code, 0) << g.err;
    texts[cache] = g.out;
  }
  EXPECT_EQ(texts[0], texts[1]);
  EXPECT_EQ(texts[0].rfind("the cat", 0), 0u) << texts[0];
  // --rope with an odd head size: one line on stderr, exit 2.
  const auto bad = test::run_cli("train --text '" + text + "' --out '" + dir + "x'" +
                                 " --n-heads 16 --emb-dim 16 --rope");
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.err.find("--rope needs an even head size, got --emb-dim 16 / --n-heads 16 = 1"),
            std::string::npos)
      << bad.err;
  // --latent-dim: the book's MLA GPT, trained and generated from.
  const std::string mla_dir = dir + "mla";
  const auto m = test::run_cli("train --text '" + text + "' --out '" + mla_dir + "'" + model +
                               " --latent-dim 4");
  ASSERT_EQ(m.exit_code, 0) << m.err;
  EXPECT_NE(m.out.find(", latent attention (latent_dim 4); iterations"), std::string::npos)
      << m.out;
  const auto mla_cfg = nlohmann::json::parse(
      io::read_safetensors(mla_dir + "/checkpoint.safetensors").metadata.at("config"));
  EXPECT_EQ(mla_cfg.at("latent_dim"), 4);
  const auto mg = test::run_cli("generate --checkpoint '" + mla_dir +
                                "' --prompt 'the cat' --max-new-tokens 20 --greedy");
  ASSERT_EQ(mg.exit_code, 0) << mg.err;
  const auto mg2 = test::run_cli("generate --checkpoint '" + mla_dir +
                                 "' --prompt 'the cat' --max-new-tokens 20 --greedy --no-cache");
  EXPECT_EQ(mg.out, mg2.out);
  const auto both = test::run_cli("train --text '" + text + "' --out '" + dir + "y'" + model +
                                  " --latent-dim 4 --rope");
  EXPECT_NE(both.exit_code, 0);
  EXPECT_NE(both.err.find("without --rope, --exact or --dtype bfloat16; got --latent-dim 4 --rope"),
            std::string::npos)
      << both.err;
  std::filesystem::remove_all(mla_dir);
  // Resuming with another --rope setting is refused.
  const auto resume = test::run_cli("train --text '" + text + "' --out '" + dir + "' --resume " +
                                    "--theta-base 1000 --max-iters 12");
  EXPECT_NE(resume.exit_code, 0);
  EXPECT_NE(resume.err.find("theta_base"), std::string::npos) << resume.err;
  std::filesystem::remove_all(dir);
  std::filesystem::remove(text);
}

}  // namespace
}  // namespace attn
