// GroupedQueryAttention and MultiHeadAttentionWithSWA (attn/nn.h) without
// PyTorch: central finite differences for dx and every parameter gradient on
// both sdpa paths (with dropout too, its Philox masks fixed by reseeding), the
// fused kernel and the plain reference drawing the same dropout masks, the
// window changing what a query sees, and every bad option or cache a one-line
// std::invalid_argument naming the values.
#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>

#include "attn/gpt.h"
#include "attn/kv_cache.h"
#include "attn/nn.h"
#include "attn/ops.h"
#include "attn/random.h"
#include "gradcheck.h"

namespace attn::test {
namespace {

using namespace attn::nn;

TEST(GqaSwa, GradcheckBothPathsWithAndWithoutDropout) {
  for (const AttentionBackend backend : {AttentionBackend::kAuto, AttentionBackend::kReference}) {
    for (const float p : {0.0f, 0.3f}) {
      const std::string tag = std::string(to_string(backend)) + " p=" + std::to_string(p);
      Generator gen(5);
      GroupedQueryAttention gqa({.d_in = 5, .d_out = 8, .context_length = 7, .dropout = p,
                                 .num_heads = 4, .num_kv_groups = 2, .qkv_bias = true,
                                 .backend = backend},
                                gen);
      gradcheck_module("GQA 4:2 " + tag, gqa, random_tensor({2, 7, 5}, 1), {},
                       [&] { gen.manual_seed(9); });
      Generator gen2(6);
      MultiHeadAttentionWithSWA swa({.d_in = 3, .d_out = 6, .context_length = 9, .dropout = p,
                                     .num_heads = 2, .sliding_window_size = 3,
                                     .backend = backend},
                                    gen2);
      gradcheck_module("SWA w=3 " + tag, swa, random_tensor({1, 9, 3}, 2), {},
                       [&] { gen2.manual_seed(9); });
      Generator gen3(7);
      MultiHeadAttention mqa_window({.d_in = 4, .d_out = 6, .context_length = 6, .dropout = p,
                                     .num_heads = 3, .backend = backend,
                                     .variant = AttentionVariant::kGroupedQuery,
                                     .num_kv_groups = 1, .sliding_window_size = 2},
                                    gen3);
      gradcheck_module("MQA w=2 " + tag, mqa_window, random_tensor({2, 6, 4}, 3), {},
                       [&] { gen3.manual_seed(9); });
    }
  }
}

TEST(GqaSwa, FusedAndReferenceDrawTheSameDropoutMasks) {
  const Tensor x = random_tensor({2, 11, 6}, 4);
  Tensor y[2];
  int i = 0;
  for (const AttentionBackend backend : {AttentionBackend::kAuto, AttentionBackend::kReference}) {
    Generator gen(3);
    GroupedQueryAttention m({.d_in = 6, .d_out = 12, .context_length = 11, .dropout = 0.5f,
                             .num_heads = 6, .num_kv_groups = 3, .backend = backend},
                            gen);
    y[i++] = m.forward(x);
  }
  EXPECT_LE(max_abs_diff(y[0], y[1]), 1e-5f);
  Generator gen(3);
  GroupedQueryAttention m({.d_in = 6, .d_out = 12, .context_length = 11, .dropout = 0.5f,
                           .num_heads = 6, .num_kv_groups = 3},
                          gen);
  m.eval();
  EXPECT_GT(max_abs_diff(m.forward(x), y[0]), 1e-3f) << "dropout changed nothing";
}

TEST(GqaSwa, WindowLimitsWhatAQuerySees) {
  // With w = 1 each token sees only itself: changing token 0 changes no later output.
  MultiHeadAttentionWithSWA m({.d_in = 4, .d_out = 4, .context_length = 5, .num_heads = 2,
                               .sliding_window_size = 1});
  m.eval();
  Tensor x = random_tensor({1, 5, 4}, 8);
  const Tensor y0 = m.forward(x);
  x.data()[0] += 1.0f;
  const Tensor y1 = m.forward(x);
  EXPECT_GT(max_abs_diff(slice(y0, 1, 0, 1), slice(y1, 1, 0, 1)), 1e-4f);
  EXPECT_EQ(max_abs_diff(slice(y0, 1, 1, 5), slice(y1, 1, 1, 5)), 0.0f);
  m.set_sliding_window_size(0);  // the book's None: full causal attention
  const Tensor y2 = m.forward(x);
  EXPECT_GT(max_abs_diff(slice(y2, 1, 1, 5), slice(y1, 1, 1, 5)), 1e-4f);
}

TEST(GqaSwa, AttentionWeightsGiveTheOutput) {
  // out_proj(merge(weights @ v, each key/value head repeated)) is the forward's y.
  for (const int64_t w : {int64_t{0}, int64_t{3}}) {
    MultiHeadAttention m({.d_in = 5, .d_out = 8, .context_length = 7, .num_heads = 4,
                          .variant = AttentionVariant::kGroupedQuery, .num_kv_groups = 2,
                          .sliding_window_size = w});
    m.eval();
    const Tensor x = random_tensor({2, 7, 5}, 11);
    const Tensor y = m.forward(x);
    const Tensor P = m.attention_weights();  // (2, 4, 7, 7)
    ASSERT_EQ(P.shape(), (Shape{2, 4, 7, 7}));
    for (int64_t i = 0; i < 7; ++i) {
      for (int64_t j = 0; j < 7; ++j) {
        const bool seen = j <= i && (w == 0 || i - j < w);
        if (!seen) {
          EXPECT_EQ(P.at({1, 3, i, j}), 0.0f) << i << " " << j;
        }
      }
    }
    const Tensor v = transpose(m.W_value.forward(x).reshape({2, 7, 2, 2}), 1, 2);  // (2, 2, 7, 2)
    const Tensor v_rep = cat({slice(v, 1, 0, 1), slice(v, 1, 0, 1), slice(v, 1, 1, 2),
                              slice(v, 1, 1, 2)}, 1);  // (2, 4, 7, 2): repeat_interleave
    const Tensor context = transpose(matmul(P, v_rep), 1, 2).reshape({2, 7, 8});
    EXPECT_LE(max_abs_diff(m.out_proj.forward(context), y), 1e-5f) << "w " << w;
  }
}

template <class F>
void expect_invalid(F&& f, const std::string& message) {
  try {
    f();
    ADD_FAILURE() << "no exception; expected: " << message;
  } catch (const std::invalid_argument& e) {
    EXPECT_EQ(std::string(e.what()), message);
  }
}

// The book's K:1 schedule for every stride, against its rule computed in
// uint64 (layer i windowed when i % (K + 1) < K; K < 0 every layer, 0 none):
// a checkpoint's stride may be int64's largest, where K + 1 in int64
// overflowed (issue 46; a signed overflow, undefined behaviour).
TEST(GqaSwa, LayerScheduleHoldsForEveryStride) {
  GPTConfig cfg{.vocab_size = 5,
                .context_length = 4,
                .emb_dim = 8,
                .n_heads = 2,
                .n_layers = 7,
                .sliding_window_size = 3};
  for (const int64_t K :
       {int64_t{-1}, std::numeric_limits<int64_t>::min(), int64_t{0}, int64_t{1}, int64_t{2},
        int64_t{5}, int64_t{6}, int64_t{7}, std::numeric_limits<int64_t>::max() - 1,
        std::numeric_limits<int64_t>::max()}) {
    cfg.sliding_window_stride = K;
    for (int64_t i = 0; i < cfg.n_layers; ++i) {
      const auto k = static_cast<uint64_t>(K), layer = static_cast<uint64_t>(i);
      const bool windowed = K < 0 || (K > 0 && layer % (k + 1) < k);
      EXPECT_EQ(layer_sliding_window(cfg, i), windowed ? 3 : 0) << "K " << K << " layer " << i;
    }
  }
}

TEST(GqaSwa, BadOptionsAndCachesThrow) {
  expect_invalid([] { GroupedQueryAttention({.d_in = 4, .d_out = 6, .context_length = 4,
                                             .num_heads = 3, .num_kv_groups = 2}); },
                 "GroupedQueryAttention: num_heads (3) must be divisible by num_kv_groups (2), "
                 "which must be >= 1");
  expect_invalid([] { GroupedQueryAttention({.d_in = 4, .d_out = 6, .context_length = 4,
                                             .num_heads = 3, .num_kv_groups = 0}); },
                 "GroupedQueryAttention: num_heads (3) must be divisible by num_kv_groups (0), "
                 "which must be >= 1");
  expect_invalid([] { MultiHeadAttentionWithSWA({.d_in = 4, .d_out = 6, .context_length = 4,
                                                 .num_heads = 3, .sliding_window_size = -1}); },
                 "MultiHeadAttentionWithSWA: sliding_window_size must be >= 0 (0: none), got -1");
  expect_invalid([] { MultiHeadAttention({.d_in = 4, .d_out = 4, .context_length = 4,
                                          .num_heads = 2, .num_kv_groups = 1}); },
                 "MultiHeadAttention: num_kv_groups (1) and sliding_window_size (0) need variant "
                 "kGroupedQuery or kSlidingWindow");
  expect_invalid([] { MultiHeadAttention({.d_in = 4, .d_out = 4, .context_length = 4,
                                          .num_heads = 2, .dtype = DType::kBFloat16,
                                          .variant = AttentionVariant::kSlidingWindow}); },
                 "MultiHeadAttentionWithSWA: only float32 is supported, got dtype bfloat16");
  MultiHeadAttention chapter({.d_in = 4, .d_out = 4, .context_length = 4, .num_heads = 2});
  expect_invalid([&] { chapter.set_sliding_window_size(2); },
                 "MultiHeadAttention: set_sliding_window_size(2) needs variant kGroupedQuery or "
                 "kSlidingWindow (the chapter's module has no window)");
  expect_invalid([] { GPTModel({.vocab_size = 5, .context_length = 4, .emb_dim = 8, .n_heads = 4,
                                .n_layers = 1, .n_kv_groups = 3}); },
                 "GPTModel: n_heads (4) must be divisible by n_kv_groups (3; 0: off)");
  expect_invalid([] { GPTModel({.vocab_size = 5, .context_length = 4, .emb_dim = 8, .n_heads = 4,
                                .n_layers = 1, .sliding_window_size = -2}); },
                 "GPTModel: sliding_window_size must be >= 0 (0: off), got -2");
  // A cache made for the chapter's module (4 heads) does not fit GQA's 2.
  GroupedQueryAttention gqa({.d_in = 4, .d_out = 4, .context_length = 4, .num_heads = 4,
                             .num_kv_groups = 2});
  gqa.eval();
  MultiHeadAttention mha({.d_in = 4, .d_out = 4, .context_length = 4, .num_heads = 4});
  KVCache cache = make_kv_cache(mha, 1);
  expect_invalid([&] { forward_cached(gqa, random_tensor({1, 1, 4}, 1), cache); },
                 "forward_cached: cache made for 4 key/value heads, head_dim 1, context_length 4 "
                 "but the GroupedQueryAttention has 2, 1, 4");
  KVCache ok = make_kv_cache(gqa, 1);
  forward_cached(gqa, random_tensor({1, 3, 4}, 1), ok);
  expect_invalid([&] { forward_cached(gqa, random_tensor({1, 2, 4}, 1), ok); },
                 "forward_cached: 2 new tokens at positions 3..4 would exceed context_length 4 "
                 "(the cache holds 3)");
  EXPECT_EQ(ok.length, 3);
  EXPECT_THROW(gqa.attention_weights(), std::logic_error);  // no forward yet
  GroupedQueryAttention fresh({.d_in = 4, .d_out = 4, .context_length = 4, .num_heads = 4,
                               .num_kv_groups = 2});
  EXPECT_THROW(fresh.backward(random_tensor({1, 2, 4}, 1)), std::logic_error);
}

}  // namespace
}  // namespace attn::test
