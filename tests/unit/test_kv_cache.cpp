// Generating one token at a time (attn/kv_cache.h): token by token, in chunks
// and as one prefill, forward_cached must give MultiHeadAttention::forward's
// outputs on the whole sequence (evaluation mode) within 1e-5 absolute; reset()
// starts a new sequence; the module's training state is left alone; every
// error message is asserted.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "expect.h"
#include "attn/functional.h"
#include "attn/kv_cache.h"
#include "attn/nn.h"
#include "attn/ops.h"
#include "attn/random.h"

namespace attn::test {
namespace {

using namespace attn::nn;

constexpr float kTolerance = 1e-5f;  // absolute; the outputs here are O(1)

struct Config {
  int64_t B, T, d_in, num_heads, head_dim, context_length;
  bool qkv_bias;
};

std::string describe(const Config& c) {
  return "B " + std::to_string(c.B) + " T " + std::to_string(c.T) + " d_in " +
         std::to_string(c.d_in) + " H " + std::to_string(c.num_heads) + " hd " +
         std::to_string(c.head_dim) + " ctx " + std::to_string(c.context_length) +
         (c.qkv_bias ? " bias" : "");
}

// Shapes on both sides of the vector widths: heads 1..8, hd 1..64, T 1..64, B 1..3.
std::vector<Config> configs() {
  return {
      {1, 1, 3, 1, 1, 1, false},    {1, 6, 3, 2, 1, 6, true},      {2, 6, 3, 1, 2, 8, false},
      {3, 15, 16, 3, 5, 15, true},  {2, 16, 17, 4, 16, 20, false}, {1, 17, 15, 2, 17, 17, true},
      {3, 33, 8, 8, 3, 40, false},  {2, 31, 33, 5, 8, 31, true},   {1, 64, 64, 8, 8, 64, false},
      {2, 64, 32, 1, 64, 64, true}, {1, 40, 24, 4, 33, 48, false}, {3, 20, 7, 6, 15, 25, true},
      {1, 63, 16, 2, 64, 65, true}, {2, 12, 1, 7, 4, 12, false},
  };
}

std::unique_ptr<MultiHeadAttention> make_module(const Config& c, uint64_t seed) {
  manual_seed(seed);
  auto mha = std::make_unique<MultiHeadAttention>(
      MultiHeadAttentionOptions{.d_in = c.d_in,
                                .d_out = c.num_heads * c.head_dim,
                                .context_length = c.context_length,
                                .dropout = 0.1f,
                                .num_heads = c.num_heads,
                                .qkv_bias = c.qkv_bias});
  mha->eval();
  return mha;
}

// Feeds x (B, T, d_in) through forward_cached in chunks of the given sizes
// (summing to T) and returns the outputs concatenated: (B, T, d_out).
Tensor generate_in_chunks(const MultiHeadAttention& mha, const Tensor& x, KVCache& cache,
                          const std::vector<int64_t>& chunks,
                          attn::gemm::Engine engine = attn::gemm::Engine::kBlas) {
  std::vector<Tensor> outs;
  int64_t start = 0;
  for (const int64_t n : chunks) {
    const int64_t before = cache.length;
    outs.push_back(
        forward_cached(mha, slice(x, 1, start, start + n), cache, engine));  // (B, n, d_out)
    EXPECT_EQ(cache.length, before + n);
    start += n;
  }
  EXPECT_EQ(start, x.size(1));
  return cat(outs, 1);
}

std::vector<int64_t> ones(int64_t T) { return std::vector<int64_t>(static_cast<size_t>(T), 1); }

// Prefill min(5, T) tokens, then one at a time.
std::vector<int64_t> prefill_then_ones(int64_t T) {
  std::vector<int64_t> chunks{std::min<int64_t>(5, T)};
  for (int64_t t = chunks[0]; t < T; ++t) chunks.push_back(1);
  return chunks;
}

// Chunks of 1, 2, 3, ... tokens (the last one cut to fit).
std::vector<int64_t> growing(int64_t T) {
  std::vector<int64_t> chunks;
  for (int64_t n = 1, left = T; left > 0; ++n) {
    chunks.push_back(std::min(n, left));
    left -= chunks.back();
  }
  return chunks;
}

TEST(KVCache, GenerationEqualsForwardOnTheWholeSequence) {
  float worst = 0.0f;
  uint64_t seed = 100;
  for (const Config& c : configs()) {
    SCOPED_TRACE(describe(c));
    auto mha = make_module(c, ++seed);
    const Tensor x = randn({c.B, c.T, c.d_in});  // (B, T, d_in)
    const Tensor y = mha->forward(x);            // (B, T, d_out)
    const std::vector<std::pair<const char*, std::vector<int64_t>>> schedules{
        {"token by token", ones(c.T)},
        {"prefill 5, then one at a time", prefill_then_ones(c.T)},
        {"growing chunks", growing(c.T)},
        {"one prefill", {c.T}},
        // After a filled cache, T - 1 > 16 new tokens: the fast engine's
        // flash-decoding kernel takes them in blocks of 16.
        {"one token, then the rest", c.T > 1 ? std::vector<int64_t>{1, c.T - 1} : ones(c.T)},
    };
    // kFast: the fast GEMM, the flash kernel for a prefill of the empty cache,
    // flash-decoding (attn/decode_attention.h) for the tokens after it.
    for (const auto engine : {attn::gemm::Engine::kBlas, attn::gemm::Engine::kFast}) {
      for (const auto& [name, chunks] : schedules) {
        SCOPED_TRACE(std::string(name) +
                     (engine == attn::gemm::Engine::kFast ? ", fast engine" : ""));
        KVCache cache = make_kv_cache(*mha, c.B);
        const Tensor y_cached = generate_in_chunks(*mha, x, cache, chunks, engine);
        ASSERT_EQ(y_cached.shape(), y.shape());
        const float diff = max_abs_diff(y_cached, y);
        EXPECT_LE(diff, kTolerance);
        worst = std::max(worst, diff);
      }
    }
  }
  std::printf("[  KVCACHE ] %zu shapes x 5 schedules x 2 engines: max |cached - forward| = %.3g\n",
              configs().size(), static_cast<double>(worst));
}

// The sentence of the chapter, 6 tokens of width 3, heads of width 1.
TEST(KVCache, EachTokenSeesExactlyThePast) {
  const Config c{2, 6, 3, 2, 1, 6, false};
  auto mha = make_module(c, 123);
  const Tensor x = randn({c.B, c.T, c.d_in});
  KVCache cache = make_kv_cache(*mha, c.B);
  for (int64_t t = 0; t < c.T; ++t) {
    const Tensor y_t = forward_cached(*mha, slice(x, 1, t, t + 1), cache);  // (B, 1, d_out)
    // forward() on the prefix 0..t has token t last: the same output.
    const Tensor y_prefix = mha->forward(slice(x, 1, 0, t + 1));  // (B, t + 1, d_out)
    EXPECT_LE(max_abs_diff(y_t, slice(y_prefix, 1, t, t + 1)), kTolerance) << "token " << t;
  }
  EXPECT_EQ(cache.length, 6);
  EXPECT_EQ(cache.remaining(), 0);
}

TEST(KVCache, CacheHoldsTheProjectedKeysAndValues) {
  const Config c{2, 5, 4, 2, 3, 7, true};
  auto mha = make_module(c, 7);
  const Tensor x = randn({c.B, c.T, c.d_in});
  KVCache cache = make_kv_cache(*mha, c.B);
  EXPECT_EQ(cache.keys.shape(), (Shape{2, 2, 7, 3}));
  EXPECT_EQ(cache.values.shape(), (Shape{2, 2, 7, 3}));
  forward_cached(*mha, x, cache);
  const Tensor k = transpose(mha->W_key.forward(x).reshape({2, 5, 2, 3}), 1, 2);    // (B, H, T, hd)
  const Tensor v = transpose(mha->W_value.forward(x).reshape({2, 5, 2, 3}), 1, 2);  // (B, H, T, hd)
  EXPECT_LE(max_abs_diff(slice(cache.keys, 2, 0, 5), k), 1e-6f);
  EXPECT_LE(max_abs_diff(slice(cache.values, 2, 0, 5), v), 1e-6f);
  // Rows not yet written stay zero.
  EXPECT_EQ(max_abs_diff(slice(cache.keys, 2, 5, 7), Tensor::zeros({2, 2, 2, 3})), 0.0f);
}

TEST(KVCache, ResetStartsANewSequence) {
  const Config c{2, 9, 5, 3, 4, 9, true};
  auto mha = make_module(c, 11);
  const Tensor x_a = randn({c.B, c.T, c.d_in});
  const Tensor x_b = randn({c.B, c.T, c.d_in});
  KVCache cache = make_kv_cache(*mha, c.B);
  generate_in_chunks(*mha, x_a, cache, ones(c.T));
  EXPECT_EQ(cache.length, 9);
  cache.reset();
  EXPECT_EQ(cache.length, 0);
  EXPECT_EQ(cache.remaining(), 9);
  EXPECT_EQ(sum_all(mul(cache.keys, cache.keys)), 0.0f);
  EXPECT_EQ(sum_all(mul(cache.values, cache.values)), 0.0f);
  const Tensor y_b = generate_in_chunks(*mha, x_b, cache, prefill_then_ones(c.T));
  EXPECT_LE(max_abs_diff(y_b, mha->forward(x_b)), kTolerance);
  // Without reset the second sequence would attend to the first one's tokens.
  KVCache stale = make_kv_cache(*mha, c.B);
  forward_cached(*mha, slice(x_a, 1, 0, 4), stale);
  const Tensor y_stale = forward_cached(*mha, slice(x_b, 1, 0, 1), stale);
  EXPECT_GT(max_abs_diff(y_stale, slice(y_b, 1, 0, 1)), 1e-3f);
}

TEST(KVCache, LeavesTheModulesTrainingStateAlone) {
  // dropout 0: training mode is allowed, and forward() is deterministic.
  manual_seed(5);
  MultiHeadAttention mha({.d_in = 6, .d_out = 8, .context_length = 10, .num_heads = 2});
  const Tensor x = randn({2, 7, 6});
  const Tensor dy = randn({2, 7, 8});
  mha.forward(x);
  const Tensor dx_expected = mha.backward(dy);
  const Tensor dwk_expected = mha.W_key.weight.grad;
  mha.zero_grad();

  mha.forward(x);
  KVCache cache = make_kv_cache(mha, 1);
  const Tensor other = randn({1, 4, 6});
  forward_cached(mha, other, cache);  // between forward and backward
  EXPECT_EQ(max_abs_diff(mha.backward(dy), dx_expected), 0.0f);
  EXPECT_EQ(max_abs_diff(mha.W_key.weight.grad, dwk_expected), 0.0f);
}

TEST(KVCache, ReferenceMatchesAttentionForwardWhenTheCacheIsFull) {
  manual_seed(9);
  const Tensor q = randn({2, 3, 11, 17});  // (B, H, T, hd)
  const Tensor k = randn({2, 3, 11, 17});
  const Tensor v = randn({2, 3, 11, 17});
  const Tensor expected = ref::attention_forward(q, k, v, {.causal = true}, nullptr, nullptr);
  EXPECT_LE(max_abs_diff(ref::cached_attention_forward(q, k, v, 0), expected), 1e-6f);
  // The last 4 queries at offset 7 see what rows 7..10 of the full causal result see.
  const Tensor tail = ref::cached_attention_forward(slice(q, 2, 7, 11), k, v, 7);
  EXPECT_LE(max_abs_diff(tail, slice(expected, 2, 7, 11)), 1e-6f);
  // Rows beyond the last query's position are never read.
  Tensor k_garbage = k, v_garbage = v;
  for (int64_t bh = 0; bh < 6; ++bh) {
    for (int64_t i = 9 * 17; i < 11 * 17; ++i) {
      k_garbage[bh * 11 * 17 + i] = 1e30f;
      v_garbage[bh * 11 * 17 + i] = -1e30f;
    }
  }
  const Tensor head = ref::cached_attention_forward(slice(q, 2, 5, 9), k_garbage, v_garbage, 5);
  EXPECT_LE(max_abs_diff(head, slice(expected, 2, 5, 9)), 1e-6f);
}

TEST(KVCache, ReferenceErrors) {
  const Tensor q = Tensor::zeros({1, 2, 3, 4});
  const Tensor kv = Tensor::zeros({1, 2, 5, 4});
  expect_message<std::invalid_argument>(
      [&] { ref::cached_attention_forward(q, kv, kv, 3); },
      "cached_attention_forward: positions up to 5 do not fit the capacity 5: q (1, 2, 3, 4), "
      "keys (1, 2, 5, 4), values (1, 2, 5, 4), offset 3");
  expect_message<std::invalid_argument>(
      [&] {
        ref::cached_attention_forward(q, kv, Tensor::zeros({1, 2, 5, 3}), 0);
      },
      "cached_attention_forward: keys and values differ in shape: q (1, 2, 3, 4), keys (1, 2, 5, "
      "4), values (1, 2, 5, 3), offset 0");
  expect_message<std::invalid_argument>(
      [&] {
        ref::cached_attention_forward(Tensor::zeros({1, 3, 3, 4}), kv, kv, 0);
      },
      "cached_attention_forward: q and keys differ in B, H or hd: q (1, 3, 3, 4), keys (1, 2, 5, "
      "4), values (1, 2, 5, 4), offset 0");
  expect_message<std::invalid_argument>(
      [&] { ref::cached_attention_forward(q, kv, kv, -1); },
      "cached_attention_forward: negative offset: q (1, 2, 3, 4), keys (1, 2, 5, 4), values (1, "
      "2, 5, 4), offset -1");
  expect_message<std::invalid_argument>(
      [&] {
        ref::cached_attention_forward(Tensor::zeros({2, 3, 4}), kv, kv, 0);
      },
      "cached_attention_forward: expected 4-D (B, H, T, hd): q (2, 3, 4), keys (1, 2, 5, 4), "
      "values (1, 2, 5, 4), offset 0");
}

TEST(KVCache, Errors) {
  manual_seed(3);
  MultiHeadAttention mha(
      {.d_in = 3, .d_out = 4, .context_length = 6, .dropout = 0.5f, .num_heads = 2});
  expect_message<std::invalid_argument>([&] { make_kv_cache(mha, 0); },
                                        "make_kv_cache: batch must be positive, got 0");
  KVCache cache = make_kv_cache(mha, 2);
  // Training mode with dropout > 0.
  expect_message<std::invalid_argument>(
      [&] {
        forward_cached(mha, Tensor::zeros({2, 1, 3}), cache);
      },
      "forward_cached: the module is in training mode with dropout 0.5; call eval() first "
      "(generation applies no dropout)");
  mha.eval();
  expect_message<std::invalid_argument>(
      [&] {
        forward_cached(mha, Tensor::zeros({2, 1, 4}), cache);
      },
      "forward_cached: input last dim 4 does not match d_in 3");
  expect_message<std::invalid_argument>(
      [&] {
        forward_cached(mha, Tensor::zeros({2, 3}), cache);
      },
      "forward_cached: expected input of shape (B, T, d_in), got (2, 3)");
  expect_message<std::invalid_argument>(
      [&] {
        forward_cached(mha, Tensor::zeros({3, 1, 3}), cache);
      },
      "forward_cached: input batch 3 does not match the cache's batch 2");
  expect_message<std::invalid_argument>(
      [&] {
        forward_cached(mha, Tensor::zeros({2, 7, 3}), cache);
      },
      "forward_cached: 7 new tokens at positions 0..6 would exceed context_length 6 (the cache "
      "holds 0)");
  // Fill to 5, then 2 more do not fit but 1 does; a full cache refuses even one.
  forward_cached(mha, randn({2, 5, 3}), cache);
  const Tensor keys_before = cache.keys.clone();
  expect_message<std::invalid_argument>(
      [&] {
        forward_cached(mha, Tensor::zeros({2, 2, 3}), cache);
      },
      "forward_cached: 2 new tokens at positions 5..6 would exceed context_length 6 (the cache "
      "holds 5)");
  EXPECT_EQ(cache.length, 5);  // a refused call leaves the cache as it was
  EXPECT_EQ(max_abs_diff(cache.keys, keys_before), 0.0f);
  forward_cached(mha, randn({2, 1, 3}), cache);
  expect_message<std::invalid_argument>(
      [&] {
        forward_cached(mha, Tensor::zeros({2, 1, 3}), cache);
      },
      "forward_cached: 1 new token at positions 6..6 would exceed context_length 6 (the cache "
      "holds 6)");

  // A cache made for another module shape.
  MultiHeadAttention other({.d_in = 3, .d_out = 4, .context_length = 6, .num_heads = 4});
  KVCache wrong = make_kv_cache(other, 2);
  expect_message<std::invalid_argument>(
      [&] {
        forward_cached(mha, Tensor::zeros({2, 1, 3}), wrong);
      },
      "forward_cached: cache made for num_heads 4, head_dim 1, context_length 6 but the module "
      "has num_heads 2, head_dim 2, context_length 6");
  MultiHeadAttention longer({.d_in = 3, .d_out = 4, .context_length = 8, .num_heads = 2});
  KVCache long_cache = make_kv_cache(longer, 2);
  expect_message<std::invalid_argument>(
      [&] {
        forward_cached(mha, Tensor::zeros({2, 1, 3}), long_cache);
      },
      "forward_cached: cache made for num_heads 2, head_dim 2, context_length 8 but the module "
      "has num_heads 2, head_dim 2, context_length 6");
  // Buffers or length changed by hand.
  KVCache tampered = make_kv_cache(mha, 2);
  tampered.values = Tensor::zeros({2, 2, 5, 2});
  expect_message<std::invalid_argument>(
      [&] {
        forward_cached(mha, Tensor::zeros({2, 1, 3}), tampered);
      },
      "forward_cached: cache buffers keys (2, 2, 6, 2), values (2, 2, 5, 2) are not the (2, 2, "
      "6, 2) of its sizes");
  KVCache negative = make_kv_cache(mha, 2);
  negative.length = -1;
  expect_message<std::invalid_argument>(
      [&] {
        forward_cached(mha, Tensor::zeros({2, 1, 3}), negative);
      },
      "forward_cached: cache length -1 outside 0 .. context_length 6");
}

}  // namespace
}  // namespace attn::test
