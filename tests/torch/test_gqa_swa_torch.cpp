// The book's grouped-query and sliding-window attention (ch04/04_gqa,
// ch04/06_swa) against PyTorch 1.13: tests/torch/oracle_gqa_swa.py writes the
// maths in its own words; here attn repeats each case from the seed.
//
// Modules (GroupedQueryAttention, MultiHeadAttentionWithSWA, and the GQA layout
// with a window): the parameters' float32 bits (CRC-32, PyTorch's names and
// order), then on torch's x and dy, on both sdpa paths (the fused kernel and
// its plain reference), the output, the input gradient and every parameter
// gradient; and the key/value cache: a prefill of half the sequence then one
// token at a time (and token by token from the start), every position against
// torch's whole-sequence y, with either GEMM engine. Tolerance, per tensor:
//   max|attn - torch| <= 2e-5 · max(1, max|torch|) + 4 · err64
// (err64: torch's own float32-vs-float64 difference on that tensor).
//
// GPT: GPTModel with n_kv_groups / sliding_window_size / sliding_window_stride
// from the same seed has torch's parameters, its 5 SGD losses match torch's
// within 1e-4 (and fall), and greedy generation gives torch's tokens with the
// key/value cache and without.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "attn/generate.h"
#include "attn/gpt.h"
#include "attn/kv_cache.h"
#include "attn/nn.h"
#include "attn/ops.h"
#include "attn/random.h"
#include "oracle.h"

namespace attn::test {
namespace {

using Json = nlohmann::json;
using namespace attn::nn;

float max_abs(const Tensor& t) {
  float m = 0.0f;
  for (const float v : t.contiguous().values()) m = std::max(m, std::fabs(v));
  return m;
}

const Json& oracle() {
  static const Json file = read_oracle_json<Json>("gqa_swa.json", "oracle_gqa_swa.py");
  return file;
}

// The module of a case, drawn from its seed.
std::unique_ptr<MultiHeadAttention> make_module(const Json& cfg, AttentionBackend backend) {
  manual_seed(cfg.at("seed").get<uint64_t>());
  const std::string kind = cfg.at("kind");
  const int64_t d_in = cfg.at("d_in"), d_out = cfg.at("d_out"), H = cfg.at("num_heads"),
                G = cfg.at("num_kv_groups"), w = cfg.at("window"), C = cfg.at("context_length");
  const bool bias = cfg.at("qkv_bias");
  if (kind == "gqa") {
    return std::make_unique<GroupedQueryAttention>(GroupedQueryAttentionOptions{
        .d_in = d_in, .d_out = d_out, .context_length = C, .num_heads = H, .num_kv_groups = G,
        .qkv_bias = bias, .backend = backend});
  }
  if (kind == "swa") {
    return std::make_unique<MultiHeadAttentionWithSWA>(MultiHeadAttentionWithSWAOptions{
        .d_in = d_in, .d_out = d_out, .context_length = C, .num_heads = H, .qkv_bias = bias,
        .sliding_window_size = w, .backend = backend});
  }
  return std::make_unique<MultiHeadAttention>(MultiHeadAttentionOptions{
      .d_in = d_in, .d_out = d_out, .context_length = C, .num_heads = H, .qkv_bias = bias,
      .backend = backend, .variant = AttentionVariant::kGroupedQuery, .num_kv_groups = G,
      .sliding_window_size = w});
}

struct Worst {
  double ratio = 0.0, diff = 0.0;
  int checks = 0;
};

void expect_close(const Tensor& got, const Json& want_json, double err64, const std::string& what,
                  Worst& worst) {
  const Tensor want = tensor_from_json(want_json);
  ASSERT_EQ(got.shape(), want.shape()) << what;
  const double tol = 2e-5 * std::max(1.0, double(max_abs(want))) + 4.0 * err64;
  const double diff = max_abs_diff(got, want);
  EXPECT_LE(diff, tol) << what << " (torch float32 vs float64: " << err64 << ")";
  worst.ratio = std::max(worst.ratio, diff / tol);
  worst.diff = std::max(worst.diff, diff);
  ++worst.checks;
}

TEST(GqaSwaTorch, ModulesMatchTorchForwardBackwardAndCache) {
  const Json& file = oracle();
  const bool avx2 = file.at("cpu_capability").get<std::string>() == "AVX2";
  const Json& cases = file.at("modules");
  ASSERT_GE(cases.size(), 40u);
  Worst worst;
  for (const Json& c : cases) {
    const Json& cfg = c.at("config");
    SCOPED_TRACE(cfg.dump());
    const Tensor x = tensor_from_bits_json(c.at("x")), dy = tensor_from_bits_json(c.at("dy"));
    const Json& err64 = c.at("err64");
    for (const AttentionBackend backend : {AttentionBackend::kAuto, AttentionBackend::kReference}) {
      SCOPED_TRACE(to_string(backend));
      auto m = make_module(cfg, backend);
      // 1. torch's parameters, bit for bit, under torch's names and in its order.
      const auto params = m->named_parameters();
      const Json& crcs = c.at("param_crc32");
      ASSERT_EQ(params.size(), crcs.size());
      for (size_t i = 0; i < params.size(); ++i) {
        ASSERT_EQ(params[i].first, crcs[i][0].get<std::string>());
        EXPECT_EQ(crc32(params[i].second->value), crcs[i][1].get<uint32_t>())
            << "random-number mismatch in " << params[i].first;
      }
      if (avx2 && backend == AttentionBackend::kAuto) {
        EXPECT_EQ(max_abs_diff(randn(x.shape()), x), 0.0f) << "random-number mismatch in x";
      }
      EXPECT_TRUE(m->state_dict().size() == params.size()) << "the variants have no buffer";
      m->eval();
      // 2. Forward and backward.
      const Tensor y = m->forward(x);
      EXPECT_EQ(m->last_backend(), backend == AttentionBackend::kReference
                                       ? AttentionBackend::kReference
                                       : AttentionBackend::kFused);
      expect_close(y, c.at("y"), err64.at("y"), "y", worst);
      expect_close(m->backward(dy), c.at("dx"), err64.at("dx"), "dx", worst);
      for (const auto& [name, p] : params)
        expect_close(p->grad, c.at("grads").at(name), err64.at(name), name + ".grad", worst);
      // 3. The key/value cache against the whole-sequence y.
      const int64_t T = x.size(1);
      for (const gemm::Engine engine : {gemm::Engine::kBlas, gemm::Engine::kFast}) {
        for (const int64_t prefill : {int64_t{1}, std::max<int64_t>(1, T / 2)}) {
          SCOPED_TRACE("prefill " + std::to_string(prefill));
          KVCache cache = make_kv_cache(*m, x.size(0));
          EXPECT_EQ(cache.num_heads, m->num_kv_heads());
          std::vector<Tensor> parts;
          for (int64_t t = 0; t < T;) {
            const int64_t n = t == 0 ? prefill : 1;
            parts.push_back(forward_cached(*m, slice(x, 1, t, t + n), cache, engine));
            t += n;
          }
          EXPECT_EQ(cache.length, T);
          expect_close(cat(parts, 1), c.at("y"), err64.at("y"), "cached y", worst);
        }
      }
    }
  }
  std::printf("[  TORCH   ] gqa_swa modules: %zu cases x 2 paths, %d tensors: max |attn - torch| "
              "%.3g, worst diff/tolerance %.3g\n",
              cases.size(), worst.checks, worst.diff, worst.ratio);
}

GPTConfig gpt_config(const Json& j) {
  return GPTConfig{.vocab_size = j.at("vocab_size"),
                   .context_length = j.at("context_length"),
                   .emb_dim = j.at("emb_dim"),
                   .n_heads = j.at("n_heads"),
                   .n_layers = j.at("n_layers"),
                   .drop_rate = j.at("drop_rate").get<float>(),
                   .qkv_bias = j.at("qkv_bias"),
                   .n_kv_groups = j.at("n_kv_groups"),
                   .sliding_window_size = j.at("sliding_window_size"),
                   .sliding_window_stride = j.at("sliding_window_stride")};
}

TEST(GqaSwaTorch, GptTrainsAndGeneratesAsTorch) {
  const Json& cases = oracle().at("gpt");
  ASSERT_GE(cases.size(), 4u);
  double worst_loss = 0.0;
  for (const Json& c : cases) {
    SCOPED_TRACE(c.at("config").dump());
    const GPTConfig cfg = gpt_config(c.at("config"));
    manual_seed(c.at("seed").get<uint64_t>());
    GPTModel model(cfg);
    const auto params = model.named_parameters();
    const Json& crcs = c.at("param_crc32");
    ASSERT_EQ(params.size(), crcs.size());
    for (size_t i = 0; i < params.size(); ++i) {
      ASSERT_EQ(params[i].first, crcs[i][0].get<std::string>());
      EXPECT_EQ(crc32(params[i].second->value), crcs[i][1].get<uint32_t>()) << params[i].first;
    }
    for (int64_t i = 0; i < cfg.n_layers; ++i) {
      EXPECT_EQ(model.trf_blocks[i].att.sliding_window_size(), layer_sliding_window(cfg, i));
      EXPECT_EQ(model.trf_blocks[i].att.num_kv_heads(),
                cfg.n_kv_groups > 0 ? cfg.n_kv_groups : cfg.n_heads);
    }
    // SGD: p -= lr · grad, as torch.optim.SGD(lr) steps.
    const float lr = c.at("lr").get<float>();
    const int64_t B = c.at("batch"), T = c.at("tokens");
    const Json& losses = c.at("losses");
    model.train();
    std::vector<float> ours;
    for (size_t s = 0; s < losses.size(); ++s) {
      const Json& batch = c.at("batches")[s];
      const Tensor xs = Tensor::from_int64({B, T}, batch[0].get<std::vector<int64_t>>());
      const Tensor ys = Tensor::from_int64({B, T}, batch[1].get<std::vector<int64_t>>());
      model.zero_grad();
      const float loss = model.forward_loss(xs, ys);
      model.backward_loss();
      for (const auto& [name, p] : model.named_parameters()) {
        float* v = p->value.data();
        const float* g = p->grad.data();
        for (int64_t i = 0; i < p->value.numel(); ++i) v[i] -= lr * g[i];
      }
      ours.push_back(loss);
      const double diff = std::fabs(loss - losses[s].get<double>());
      EXPECT_LE(diff, 1e-4) << "step " << s << ": attn " << loss << ", torch " << losses[s];
      worst_loss = std::max(worst_loss, diff);
    }
    EXPECT_LT(ours.back(), ours.front()) << "the loss falls";
    // Greedy generation, with and without the cache, gives torch's tokens.
    model.eval();
    const std::vector<int64_t> prompt = c.at("prompt");
    const std::vector<int64_t> want = c.at("generated");
    const Tensor idx = Tensor::from_int64({1, int64_t(prompt.size())}, prompt);
    for (const bool use_cache : {true, false}) {
      Generator gen(1);
      const Tensor out = generate(
          model, idx,
          {.max_new_tokens = int64_t(want.size() - prompt.size()), .use_cache = use_cache}, gen);
      EXPECT_EQ(out.to_int64_vector(), want) << (use_cache ? "with" : "without") << " the cache";
    }
  }
  std::printf("[  TORCH   ] gqa_swa GPT: %zu models, max |loss attn - torch| %.3g\n", cases.size(),
              worst_loss);
}

}  // namespace
}  // namespace attn::test
