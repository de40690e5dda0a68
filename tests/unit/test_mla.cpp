// MultiHeadLatentAttention (attn/mla.h): its parameters and names, causality,
// finite-difference gradients (with and without biases, with dropout on a
// reseeded generator), the latent cache (cached decode = uncached forward for
// any split into prefill and steps; the cache holds the latents; the module's
// saved state untouched), and errors naming the values.
#include <gtest/gtest.h>

#include <stdexcept>
#include <string>
#include <vector>

#include "attn/mla.h"
#include "attn/ops.h"
#include "attn/random.h"
#include "gradcheck.h"

namespace attn {
namespace {

using nn::MultiHeadLatentAttention;

std::string message_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::logic_error& e) {  // std::invalid_argument, or backward before forward
    return e.what();
  }
  return "no exception";
}

TEST(Mla, ParametersInTheBooksOrderWithTheBooksDefaultLatent) {
  Generator gen(1);
  MultiHeadLatentAttention m({.d_in = 24, .d_out = 32, .num_heads = 4}, gen);
  EXPECT_EQ(m.latent_dim(), 16);  // max(16, 32 / 8)
  std::vector<std::string> names;
  for (auto& [name, value] : m.state_dict()) names.push_back(name + " " + shape_str(value.shape()));
  EXPECT_EQ(names, (std::vector<std::string>{"W_query.weight (32, 24)", "W_DKV.weight (16, 24)",
                                             "W_UK.weight (32, 16)", "W_UV.weight (32, 16)",
                                             "out_proj.weight (32, 32)", "out_proj.bias (32,)"}));
  MultiHeadLatentAttention wide({.d_in = 8, .d_out = 256, .num_heads = 8, .qkv_bias = true}, gen);
  EXPECT_EQ(wide.latent_dim(), 32);
  EXPECT_EQ(wide.state_dict().size(), 10u);  // four W_* with biases, out_proj
}

TEST(Mla, EarlierOutputsDoNotDependOnLaterTokens) {
  Generator gen(2);
  MultiHeadLatentAttention m({.d_in = 6, .d_out = 8, .num_heads = 2, .latent_dim = 3}, gen);
  Tensor x = test::random_tensor({1, 5, 6}, 3);
  const Tensor y = m.forward(x);
  for (int64_t i = 0; i < 6; ++i) x.at({0, 4, i}) += 1.0f;
  const Tensor y2 = m.forward(x);
  EXPECT_EQ(max_abs_diff(y.slice(1, 0, 4), y2.slice(1, 0, 4)), 0.0f);
  EXPECT_GT(max_abs_diff(y.slice(1, 4, 5), y2.slice(1, 4, 5)), 1e-4f);
}

TEST(Mla, GradientsMatchFiniteDifferences) {
  for (bool bias : {false, true}) {
    Generator gen(4);
    MultiHeadLatentAttention m(
        {.d_in = 5, .d_out = 6, .num_heads = 2, .qkv_bias = bias, .latent_dim = 3}, gen);
    test::gradcheck_module(bias ? "mla+bias" : "mla", m, test::random_tensor({2, 4, 5}, 5));
  }
}

TEST(Mla, GradientsWithDropoutMatchFiniteDifferences) {
  Generator gen(6);
  MultiHeadLatentAttention m(
      {.d_in = 4, .d_out = 4, .dropout = 0.3f, .num_heads = 2, .latent_dim = 2}, gen);
  // The same Philox seed every forward: reseed the module's generator.
  test::gradcheck_module("mla dropout", m, test::random_tensor({1, 5, 4}, 7), {},
                         [&] { gen = Generator(99); });
}

TEST(Mla, CachedDecodeEqualsTheUncachedForward) {
  Generator gen(8);
  MultiHeadLatentAttention m(
      {.d_in = 12, .d_out = 16, .num_heads = 4, .qkv_bias = true, .latent_dim = 5}, gen);
  m.eval();
  const Tensor x = test::random_tensor({2, 9, 12}, 9);
  const Tensor want = m.forward(x);
  nn::LatentKVCache cache = nn::make_latent_kv_cache(m, 2, 12);
  for (int64_t prefill : {1, 4, 9}) {
    cache.reset();
    std::vector<Tensor> steps{nn::forward_cached(m, x.slice(1, 0, prefill), cache)};
    for (int64_t t = prefill; t < 9; ++t)
      steps.push_back(nn::forward_cached(m, x.slice(1, t, t + 1), cache));
    EXPECT_LT(max_abs_diff(cat(steps, 1), want), 2e-6f) << "prefill " << prefill;
    EXPECT_EQ(cache.length, 9);
    // The cache holds the latents x W_DKVᵀ + b of the tokens, nothing wider.
    EXPECT_EQ(cache.c_kv.shape(), (Shape{2, 12, 5}));
    const Tensor latents = ref::linear_forward(x, m.W_DKV.weight.value, &m.W_DKV.bias.value);
    EXPECT_LT(max_abs_diff(cache.c_kv.slice(1, 0, 9), latents), 1e-6f);
  }
  // Two tokens at once after a prefill, too.
  cache.reset();
  const Tensor a = nn::forward_cached(m, x.slice(1, 0, 3), cache);
  const Tensor b = nn::forward_cached(m, x.slice(1, 3, 5), cache);
  EXPECT_LT(max_abs_diff(cat({a, b}, 1), want.slice(1, 0, 5)), 2e-6f);
}

TEST(Mla, CachedDecodeLeavesTheModulesBackwardState) {
  Generator gen(10);
  MultiHeadLatentAttention m({.d_in = 4, .d_out = 4, .num_heads = 1, .latent_dim = 2}, gen);
  const Tensor x = test::random_tensor({1, 3, 4}, 11);
  const Tensor dy = test::random_tensor({1, 3, 4}, 12);
  m.forward(x);
  m.zero_grad();
  const Tensor dx = m.backward(dy);
  m.forward(x);
  nn::LatentKVCache cache = nn::make_latent_kv_cache(m, 1, 8);
  nn::forward_cached(m, test::random_tensor({1, 5, 4}, 13), cache);
  m.zero_grad();
  EXPECT_EQ(max_abs_diff(m.backward(dy), dx), 0.0f);
}

TEST(Mla, ErrorsNameTheValues) {
  EXPECT_NE(message_of([] {
              MultiHeadLatentAttention({.d_in = 4, .d_out = 6, .num_heads = 4});
            }).find("d_out (6) must be divisible by num_heads (4)"),
            std::string::npos);
  EXPECT_NE(message_of([] {
              MultiHeadLatentAttention({.d_in = 4, .d_out = 4, .num_heads = 1, .latent_dim = -2});
            }).find("latent_dim must be positive (or 0 for max(16, d_out / 8)), got -2"),
            std::string::npos);
  EXPECT_NE(message_of([] {
              MultiHeadLatentAttention({.d_in = 4, .d_out = 4, .dropout = 1.0f});
            }).find("dropout must be in [0, 1), got 1"),
            std::string::npos);
  EXPECT_NE(message_of([] {
              MultiHeadLatentAttention({.d_in = 0, .d_out = 4});
            }).find("d_in must be positive, got 0"),
            std::string::npos);
  MultiHeadLatentAttention m(
      {.d_in = 4, .d_out = 4, .dropout = 0.1f, .num_heads = 2, .latent_dim = 2});
  EXPECT_NE(message_of([&] {
              m.backward(Tensor({1, 2, 4}));
            }).find("before forward"),
            std::string::npos);
  EXPECT_NE(message_of([&] {
              m.forward(Tensor({1, 2, 5}));
            }).find("input last dim 5 does not match d_in 4"),
            std::string::npos);
  m.forward(Tensor({1, 2, 4}));
  EXPECT_NE(message_of([&] {
              m.backward(Tensor({1, 3, 4}));
            }).find("gradient shape (1, 3, 4) does not match output shape (1, 2, 4)"),
            std::string::npos);
  nn::LatentKVCache cache = nn::make_latent_kv_cache(m, 1, 4);
  EXPECT_NE(message_of([&] {
              nn::forward_cached(m, Tensor({1, 2, 4}), cache);
            }).find("training mode with dropout 0.1; call eval() first"),
            std::string::npos);
  m.eval();
  EXPECT_NE(message_of([&] {
              nn::forward_cached(m, Tensor({1, 5, 4}), cache);
            }).find("5 new tokens do not fit the cache (0 of 4 positions used)"),
            std::string::npos);
  EXPECT_NE(message_of([&] {
              nn::forward_cached(m, Tensor({2, 1, 4}), cache);
            }).find("input batch 2 and module latent_dim 2 do not match the cache's batch 1"),
            std::string::npos);
  EXPECT_EQ(cache.length, 0);
  EXPECT_NE(message_of([&] {
              nn::make_latent_kv_cache(m, 0, 4);
            }).find("batch and context_length must be >= 1, got 0 and 4"),
            std::string::npos);
}

}  // namespace
}  // namespace attn
