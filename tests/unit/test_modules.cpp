// Behaviour of the modules (attn/nn.h): causality, dropout modes, parameter
// names, counts, shapes and creation order, the maths they must equal, and
// every error message.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <set>
#include <stdexcept>
#include <string>

#include "expect.h"
#include "attn/functional.h"
#include "attn/nn.h"
#include "attn/ops.h"
#include "attn/random.h"
#include "gradcheck.h"

namespace attn::test {
namespace {

using namespace attn::nn;

Tensor example_inputs() {  // "Your journey starts with one step"
  return Tensor::of({6, 3}, {0.43f, 0.15f, 0.89f, 0.55f, 0.87f, 0.66f, 0.57f, 0.85f, 0.64f, 0.22f,
                             0.58f, 0.33f, 0.77f, 0.25f, 0.10f, 0.05f, 0.80f, 0.55f});
}
Tensor example_batch() { return stack({example_inputs(), example_inputs()}); }  // (2, 6, 3)

std::vector<std::string> names(Module& m) {
  std::vector<std::string> out;
  for (auto& [name, p] : m.named_parameters()) out.push_back(name);
  return out;
}

// x with tokens from `from` on replaced by other numbers.
Tensor change_future(const Tensor& x, int64_t from) {
  Tensor y = x.clone();
  const int64_t T = x.size(1), C = x.size(2);
  for (int64_t b = 0; b < x.size(0); ++b) {
    for (int64_t t = from; t < T; ++t) {
      for (int64_t c = 0; c < C; ++c) y.at({b, t, c}) += 3.0f + static_cast<float>(c);
    }
  }
  return y;
}

// The largest change of outputs at tokens before `from` when tokens from `from` on change.
template <class M>
float past_change(M& m, const Tensor& x, int64_t from) {
  const Tensor a = slice(m.forward(x), 1, 0, from);
  const Tensor b = slice(m.forward(change_future(x, from)), 1, 0, from);
  return max_abs_diff(a, b);
}

// ---- causality ---------------------------------------------------------------------

TEST(Modules, FutureTokensDoNotChangeThePast) {
  const Tensor x3 = random_tensor({2, 6, 3}, 1);
  for (int64_t from : {1, 3, 5}) {
    Generator gen(123);
    CausalAttention ca({.d_in = 3, .d_out = 2, .context_length = 6}, gen);
    EXPECT_EQ(past_change(ca, x3, from), 0.0f) << "CausalAttention from " << from;
    MultiHeadAttentionWrapper wrapper({.d_in = 3, .d_out = 2, .context_length = 6, .num_heads = 2},
                                      gen);
    EXPECT_EQ(past_change(wrapper, x3, from), 0.0f) << "MultiHeadAttentionWrapper from " << from;
    MultiHeadAttention mha({.d_in = 3, .d_out = 4, .context_length = 6, .num_heads = 2}, gen);
    EXPECT_EQ(past_change(mha, x3, from), 0.0f) << "MultiHeadAttention from " << from;
  }
  const Tensor x8 = random_tensor({2, 8, 8}, 2);
  Generator gen(1337);
  Head decoder({.n_embd = 8, .head_size = 4, .block_size = 8}, gen);
  EXPECT_EQ(past_change(decoder, x8, 4), 0.0f);
  MultiHead multi({.n_embd = 8, .num_heads = 2, .head_size = 4, .block_size = 8}, gen);
  EXPECT_EQ(past_change(multi, x8, 4), 0.0f);
  // Same code with the mask off: an encoder head sees the future.
  Head encoder({.n_embd = 8, .head_size = 4, .block_size = 8, .causal = false}, gen);
  EXPECT_GT(past_change(encoder, x8, 4), 1e-3f);
  SelfAttentionV2 v2({.d_in = 8, .d_out = 4}, gen);
  EXPECT_GT(past_change(v2, x8, 4), 1e-3f);
}

// ---- dropout -------------------------------------------------------------------------

TEST(Modules, DropoutOnOnesKeepsZeroOrTwo) {
  Generator gen(123);
  Dropout dropout({.p = 0.5f}, gen);
  const Tensor y = dropout.forward(Tensor::ones({6, 6}));
  int zeros = 0, twos = 0;
  for (float v : y.values()) {
    EXPECT_TRUE(v == 0.0f || v == 2.0f) << v;
    zeros += v == 0.0f;
    twos += v == 2.0f;
  }
  EXPECT_GT(zeros, 5);
  EXPECT_GT(twos, 5);
  // The mask PyTorch 1.13 (no MKL) prints for torch.manual_seed(123);
  // nn.Dropout(0.5)(torch.ones(6, 6)), as in the book.
  const Tensor book = Tensor::of({6, 6}, {2, 2, 0, 2, 2, 0, 0, 0, 0, 2, 0, 2, 2, 2, 2, 2, 0, 2,
                                          0, 2, 2, 0, 0, 2, 0, 2, 0, 2, 0, 2, 0, 2, 2, 2, 2, 0});
  EXPECT_EQ(max_abs_diff(y, book), 0.0f);
  // The same seed gives the same mask as attn::dropout_noise.
  Generator gen2(123);
  EXPECT_EQ(max_abs_diff(y, dropout_noise({6, 6}, 0.5f, gen2)), 0.0f);
}

TEST(Modules, DropoutIdentityInEvalModeAndForPZero) {
  const Tensor x = random_tensor({4, 5}, 3);
  Generator gen(1);
  Dropout dropout({.p = 0.5f}, gen);
  dropout.eval();
  EXPECT_FALSE(dropout.is_training());
  EXPECT_EQ(max_abs_diff(dropout.forward(x), x), 0.0f);
  EXPECT_EQ(max_abs_diff(dropout.backward(x), x), 0.0f);
  dropout.train();
  EXPECT_GT(max_abs_diff(dropout.forward(x), x), 0.0f);

  Generator gen0(1), fresh(1);
  Dropout none({.p = 0.0f}, gen0);
  EXPECT_EQ(max_abs_diff(none.forward(x), x), 0.0f);
  EXPECT_EQ(gen0.random(), fresh.random());  // p = 0 draws nothing

  Generator gen1(1);
  Dropout all({.p = 1.0f}, gen1);
  const Tensor dropped = all.forward(x);
  for (float v : dropped.values()) EXPECT_EQ(v, 0.0f);
}

TEST(Modules, AttentionDropoutOnlyInTraining) {
  const Tensor batch = example_batch();
  Generator g0(123), g1(123);
  CausalAttention plain({.d_in = 3, .d_out = 2, .context_length = 6}, g0);
  CausalAttention dropped({.d_in = 3, .d_out = 2, .context_length = 6, .dropout = 0.5f}, g1);
  const Tensor expected = plain.forward(batch);
  EXPECT_GT(max_abs_diff(dropped.forward(batch), expected), 1e-3f);
  dropped.eval();
  EXPECT_EQ(max_abs_diff(dropped.forward(batch), expected), 0.0f);
  EXPECT_FALSE(dropped.dropout.is_training());

  MultiHeadAttention mha(
      {.d_in = 3, .d_out = 2, .context_length = 6, .dropout = 0.5f, .num_heads = 2}, g0);
  mha.eval();
  EXPECT_FALSE(mha.dropout.is_training());
  EXPECT_FALSE(mha.W_query.is_training());
  MultiHeadAttentionWrapper wrapper(
      {.d_in = 3, .d_out = 2, .context_length = 6, .dropout = 0.5f, .num_heads = 2}, g0);
  wrapper.eval();
  EXPECT_FALSE(wrapper.heads[1]->dropout.is_training());
  wrapper.train();
  EXPECT_TRUE(wrapper.heads[1]->dropout.is_training());
}

// The module draws one double uniform per weight, row-major (B, T, T), from its
// generator at forward time, and drops the attention weights.
TEST(Modules, CausalAttentionDropsWeightsWithItsGenerator) {
  const Tensor batch = example_batch();
  Generator gen(123);
  CausalAttention m({.d_in = 3, .d_out = 2, .context_length = 6, .dropout = 0.5f}, gen);
  gen.manual_seed(99);
  const Tensor y = m.forward(batch);

  gen.manual_seed(99);
  const Tensor noise = dropout_noise({2, 6, 6}, 0.5f, gen);
  const Tensor q = ref::linear_forward(batch, m.W_query.weight.value, nullptr);
  const Tensor k = ref::linear_forward(batch, m.W_key.weight.value, nullptr);
  const Tensor v = ref::linear_forward(batch, m.W_value.weight.value, nullptr);
  const Tensor expected = ref::attention_forward(q, k, v, {.causal = true}, &noise, nullptr);
  EXPECT_LE(max_abs_diff(y, expected), 1e-6f);
}

// ---- the maths the modules must equal -----------------------------------------------------

TEST(Modules, SelfAttentionV1WorkedExample) {
  // torch.manual_seed(123); SelfAttention_v1(3, 2)(inputs)[1] -> tensor([0.3061, 0.8210])
  Generator gen(123);
  SelfAttentionV1 m({.d_in = 3, .d_out = 2}, gen);
  const Tensor y = m.forward(example_inputs());
  ASSERT_EQ(y.shape(), (Shape{6, 2}));
  EXPECT_NEAR(y.at({1, 0}), 0.3061f, 5e-5f);
  EXPECT_NEAR(y.at({1, 1}), 0.8210f, 5e-5f);
}

// Worked example 6 (SPEC.md): seed 123, d_in 3, d_out 2, context_length 6,
// dropout 0, on the example batch. Expected values from PyTorch 1.13 (%.6f),
// first sequence; the second is identical.
TEST(Modules, WorkedExamplesMatchPyTorch) {
  const Tensor batch = example_batch();
  const auto expect_first = [&](const Tensor& y, const std::vector<float>& expected) {
    const Tensor first = select(y, 0);
    ASSERT_EQ(first.numel(), static_cast<int64_t>(expected.size()));
    for (size_t i = 0; i < expected.size(); ++i) {
      EXPECT_NEAR(first[static_cast<int64_t>(i)], expected[i], 2e-6f) << i;
    }
    EXPECT_EQ(max_abs_diff(select(y, 0), select(y, 1)), 0.0f);
  };
  manual_seed(123);
  CausalAttention ca({.d_in = 3, .d_out = 2, .context_length = 6});
  expect_first(ca.forward(batch),
               {-0.451920f, 0.221605f, -0.587435f, 0.005776f, -0.630023f, -0.063183f, -0.567457f,
                -0.084253f, -0.552562f, -0.098068f, -0.529901f, -0.108068f});
  manual_seed(123);
  MultiHeadAttentionWrapper wrapper({.d_in = 3, .d_out = 2, .context_length = 6, .num_heads = 2});
  const Tensor yw = wrapper.forward(batch);
  ASSERT_EQ(yw.shape(), (Shape{2, 6, 4}));
  expect_first(yw, {-0.451920f, 0.221605f,  0.477196f,  0.106348f,  -0.587435f, 0.005776f,
                    0.589073f,  0.325660f,  -0.630023f, -0.063183f, 0.620196f,  0.385963f,
                    -0.567457f, -0.084253f, 0.547769f,  0.358925f,  -0.552562f, -0.098068f,
                    0.532089f,  0.342797f,  -0.529901f, -0.108068f, 0.507653f,  0.349348f});
  manual_seed(123);
  MultiHeadAttention mha({.d_in = 3, .d_out = 2, .context_length = 6, .num_heads = 2});
  expect_first(mha.forward(batch),
               {0.319018f, 0.485763f, 0.294346f, 0.389676f, 0.285575f, 0.359278f, 0.269264f,
                0.387327f, 0.263871f, 0.392796f, 0.257474f, 0.402783f});
}

// Dropout on the weights draws at forward time from the module's generator in
// PyTorch's order, and backward agrees with autograd: torch.manual_seed(123);
// MultiHeadAttention(3, 4, 6, 0.5, num_heads=2, qkv_bias=True);
// y = m(batch); x, r = rand(2, 6, 3), rand(2, 6, 4); torch.manual_seed(5);
// (m(x) * r).sum().backward(); y[0, :2] and W_query.weight.grad.
TEST(Modules, DropoutAndBackwardMatchPyTorch) {
  manual_seed(123);
  MultiHeadAttention m({.d_in = 3,
                        .d_out = 4,
                        .context_length = 6,
                        .dropout = 0.5f,
                        .num_heads = 2,
                        .qkv_bias = true});
  const Tensor y = m.forward(example_batch());  // draws (2, 2, 6, 6) dropout noise
  const std::vector<float> expected_y = {0.094087f,  -0.306712f, -1.017126f, -0.124680f,
                                         -0.217540f, -0.192353f, -0.337902f, -0.030345f};
  for (int64_t i = 0; i < 8; ++i) EXPECT_NEAR(y[i], expected_y[static_cast<size_t>(i)], 2e-6f);
  const Tensor x = rand({2, 6, 3});
  const Tensor r = rand({2, 6, 4});
  manual_seed(5);
  m.forward(x);
  m.backward(r);
  const std::vector<float> expected = {-0.003645f, 0.010903f,  -0.002625f, -0.070370f,
                                       -0.049166f, -0.070473f, 0.018393f,  0.008563f,
                                       0.011948f,  0.004049f,  0.013718f,  0.011755f};
  ASSERT_EQ(m.W_query.weight.grad.numel(), 12);
  for (int64_t i = 0; i < 12; ++i)
    EXPECT_NEAR(m.W_query.weight.grad[i], expected[static_cast<size_t>(i)], 5e-6f);
}

TEST(Modules, AttentionWeightsOfTheLastForward) {
  Generator gen(789);
  CausalAttention ca({.d_in = 3, .d_out = 2, .context_length = 6, .dropout = 0.5f}, gen);
  ca.forward(example_batch());
  const Tensor& w = ca.attention_weights();  // before dropout
  ASSERT_EQ(w.shape(), (Shape{2, 6, 6}));
  const Tensor row_sums = sum(w, -1);
  for (float s : row_sums.values()) EXPECT_NEAR(s, 1.0f, 1e-6f);
  EXPECT_EQ(w.at({0, 1, 2}), 0.0f);  // the future
  MultiHeadAttention mha({.d_in = 3, .d_out = 4, .context_length = 6, .num_heads = 2}, gen);
  mha.forward(example_batch());
  EXPECT_EQ(mha.attention_weights().shape(), (Shape{2, 2, 6, 6}));
}

TEST(Modules, SelfAttentionV1ByHand) {
  Generator gen(123);
  SelfAttentionV1 m({.d_in = 3, .d_out = 2}, gen);
  const Tensor x = example_inputs();
  const Tensor q = matmul(x, m.W_query.value), k = matmul(x, m.W_key.value),
               v = matmul(x, m.W_value.value);
  const Tensor weights = softmax(matmul(q, t(k)) / std::sqrt(2.0f), -1);
  EXPECT_LE(max_abs_diff(m.forward(x), matmul(weights, v)), 1e-6f);
  // A batch gives each sequence the same result.
  const Tensor yb = m.forward(example_batch());
  EXPECT_LE(max_abs_diff(select(yb, 1), matmul(weights, v)), 1e-6f);
}

TEST(Modules, MultiHeadAttentionEqualsPerHeadLoop) {
  Generator gen(123);
  const int64_t H = 3, hd = 2, d_out = H * hd;
  MultiHeadAttention m(
      {.d_in = 5, .d_out = d_out, .context_length = 8, .num_heads = H, .qkv_bias = true}, gen);
  const Tensor x = random_tensor({2, 7, 5}, 9);
  const Tensor q = m.W_query.forward(x), k = m.W_key.forward(x),
               v = m.W_value.forward(x);  // (B, T, d_out)
  std::vector<Tensor> heads;
  for (int64_t h = 0; h < H; ++h) {
    const auto cols = [&](const Tensor& a) { return slice(a, -1, h * hd, (h + 1) * hd); };
    heads.push_back(ref::attention_forward(cols(q), cols(k), cols(v),
                                           {.causal = true, .scale = 1.0f / std::sqrt(2.0f)},
                                           nullptr, nullptr));
  }
  const Tensor expected = m.out_proj.forward(cat(heads, -1));
  EXPECT_LE(max_abs_diff(m.forward(x), expected), 1e-5f);
}

TEST(Modules, WrapperConcatenatesItsHeads) {
  Generator gen(123);
  MultiHeadAttentionWrapper m({.d_in = 3, .d_out = 2, .context_length = 6, .num_heads = 2}, gen);
  const Tensor batch = example_batch();
  const Tensor y = m.forward(batch);
  ASSERT_EQ(y.shape(), (Shape{2, 6, 4}));  // H * d_out wide
  EXPECT_EQ(max_abs_diff(slice(y, -1, 0, 2), m.heads[0]->forward(batch)), 0.0f);
  EXPECT_EQ(max_abs_diff(slice(y, -1, 2, 4), m.heads[1]->forward(batch)), 0.0f);
}

TEST(Modules, HeadScaleIsHeadSizeToMinusHalf) {
  Generator gen(1337);
  Head head({.n_embd = 32, .head_size = 16, .block_size = 8}, gen);
  const Tensor x = random_tensor({2, 8, 32}, 1337);
  const Tensor k = head.key.forward(x), q = head.query.forward(x), v = head.value.forward(x);
  Tensor wei = matmul(q, transpose(k, -2, -1)) * 0.25f;  // 16^-0.5
  wei = masked_fill(wei, ref::future_mask(8), -INFINITY);
  EXPECT_LE(max_abs_diff(head.forward(x), matmul(softmax(wei, -1), v)), 1e-5f);
}

// ---- parameters: names, counts, shapes, creation order ---------------------------------

TEST(Modules, ParameterNamesAndShapes) {
  Generator gen(1);
  SelfAttentionV1 v1({.d_in = 3, .d_out = 2, .d_v = 4}, gen);
  EXPECT_EQ(names(v1), (std::vector<std::string>{"W_query", "W_key", "W_value"}));
  EXPECT_EQ(v1.W_value.value.shape(), (Shape{3, 4}));
  SelfAttentionV2 v2({.d_in = 3, .d_out = 2, .qkv_bias = true}, gen);
  EXPECT_EQ(names(v2), (std::vector<std::string>{"W_query.weight", "W_query.bias", "W_key.weight",
                                                 "W_key.bias", "W_value.weight", "W_value.bias"}));
  EXPECT_EQ(v2.parameter("W_key.weight").value.shape(), (Shape{2, 3}));
  CausalAttention ca({.d_in = 3, .d_out = 2, .context_length = 6}, gen);
  EXPECT_EQ(names(ca),
            (std::vector<std::string>{"W_query.weight", "W_key.weight", "W_value.weight"}));
  EXPECT_EQ(ca.mask().shape(), (Shape{6, 6}));
  EXPECT_EQ(max_abs_diff(ca.mask(), ref::future_mask(6)), 0.0f);
  MultiHeadAttentionWrapper wrapper({.d_in = 3, .d_out = 2, .context_length = 6, .num_heads = 2},
                                    gen);
  EXPECT_EQ(names(wrapper),
            (std::vector<std::string>{"heads.0.W_query.weight", "heads.0.W_key.weight",
                                      "heads.0.W_value.weight", "heads.1.W_query.weight",
                                      "heads.1.W_key.weight", "heads.1.W_value.weight"}));
  MultiHeadAttention mha({.d_in = 3, .d_out = 4, .context_length = 6, .num_heads = 2}, gen);
  EXPECT_EQ(names(mha),
            (std::vector<std::string>{"W_query.weight", "W_key.weight", "W_value.weight",
                                      "out_proj.weight", "out_proj.bias"}));
  EXPECT_EQ(mha.out_proj.weight.value.shape(), (Shape{4, 4}));
  EXPECT_EQ(mha.parameter("out_proj.bias").value.shape(), (Shape{4}));
  EXPECT_EQ(mha.head_dim(), 2);
  Head head({.n_embd = 8, .head_size = 4, .block_size = 8}, gen);
  EXPECT_EQ(names(head), (std::vector<std::string>{"key.weight", "query.weight", "value.weight"}));
  MultiHead multi({.n_embd = 8, .num_heads = 2, .head_size = 4, .block_size = 8}, gen);
  EXPECT_EQ(names(multi), (std::vector<std::string>{"heads.0.key.weight", "heads.0.query.weight",
                                                    "heads.0.value.weight", "heads.1.key.weight",
                                                    "heads.1.query.weight", "heads.1.value.weight",
                                                    "proj.weight", "proj.bias"}));
  EXPECT_EQ(multi.proj.weight.value.shape(), (Shape{8, 8}));
  Embedding emb({.num_embeddings = 6, .embedding_dim = 16}, gen);
  EXPECT_EQ(names(emb), (std::vector<std::string>{"weight"}));
  Linear lin({.in_features = 3, .out_features = 5, .bias = false}, gen);
  EXPECT_EQ(names(lin), (std::vector<std::string>{"weight"}));
  EXPECT_EQ(lin.num_parameters(), 15);
}

TEST(Modules, GptTwoSizedMultiHeadAttention) {
  Generator gen(123);
  MultiHeadAttention mha({.d_in = 768, .d_out = 768, .context_length = 1024, .num_heads = 12}, gen);
  EXPECT_EQ(mha.num_parameters(), 2360064);  // 4·768² + 768
  EXPECT_EQ(mha.head_dim(), 64);
  const Tensor y = mha.forward(random_tensor({1, 4, 768}, 1));
  EXPECT_EQ(y.shape(), (Shape{1, 4, 768}));
  EXPECT_FALSE(has_non_finite(y));
  Generator gen2(1);
  MultiHeadAttention largest({.d_in = 1600, .d_out = 1600, .context_length = 8, .num_heads = 25},
                             gen2);
  EXPECT_EQ(largest.head_dim(), 64);
  EXPECT_EQ(largest.num_parameters(), 4 * 1600 * 1600 + 1600);
}

TEST(Modules, UnknownParameterNameListsKnownOnes) {
  Generator gen(1);
  MultiHeadAttention mha({.d_in = 3, .d_out = 2, .context_length = 6, .num_heads = 2}, gen);
  expect_message<std::out_of_range>([&] { mha.parameter("W_q.weight"); },
                                    "Module: no parameter named 'W_q.weight'; known: "
                                    "W_query.weight, W_key.weight, W_value.weight, "
                                    "out_proj.weight, out_proj.bias");
}

TEST(Modules, CreationOrderFollowsPyTorch) {
  // SelfAttention_v2 / CausalAttention: W_query, W_key, W_value.
  Generator a(789), b(789), c(789);
  SelfAttentionV2 v2({.d_in = 3, .d_out = 2}, a);
  CausalAttention ca({.d_in = 3, .d_out = 2, .context_length = 6}, b);
  Linear q({.in_features = 3, .out_features = 2, .bias = false}, c);
  Linear k({.in_features = 3, .out_features = 2, .bias = false}, c);
  Linear v({.in_features = 3, .out_features = 2, .bias = false}, c);
  EXPECT_EQ(max_abs_diff(v2.W_value.weight.value, v.weight.value), 0.0f);
  EXPECT_EQ(max_abs_diff(ca.W_key.weight.value, k.weight.value), 0.0f);
  EXPECT_EQ(max_abs_diff(ca.W_query.weight.value, q.weight.value), 0.0f);

  // v1: rand(d_in, d_out) three times.
  Generator d(123), e(123);
  SelfAttentionV1 v1({.d_in = 3, .d_out = 2}, d);
  rand({3, 2}, e);
  EXPECT_EQ(max_abs_diff(v1.W_key.value, rand({3, 2}, e)), 0.0f);

  // MultiHeadAttention: W_query, W_key, W_value, out_proj (weight, bias).
  Generator f(123), g(123);
  MultiHeadAttention mha({.d_in = 3, .d_out = 2, .context_length = 6, .num_heads = 2}, f);
  for (int i = 0; i < 3; ++i) Linear skip({.in_features = 3, .out_features = 2, .bias = false}, g);
  Linear out({.in_features = 2, .out_features = 2}, g);
  EXPECT_EQ(max_abs_diff(mha.out_proj.weight.value, out.weight.value), 0.0f);
  EXPECT_EQ(max_abs_diff(mha.out_proj.bias.value, out.bias.value), 0.0f);

  // The wrapper's second head comes after all of the first.
  Generator h(123), i(123);
  MultiHeadAttentionWrapper wrapper({.d_in = 3, .d_out = 2, .context_length = 6, .num_heads = 2},
                                    h);
  CausalAttention first({.d_in = 3, .d_out = 2, .context_length = 6}, i);
  CausalAttention second({.d_in = 3, .d_out = 2, .context_length = 6}, i);
  EXPECT_EQ(max_abs_diff(wrapper.heads[1]->W_query.weight.value, second.W_query.weight.value),
            0.0f);

  // Head: key, query, value; MultiHead: all heads, then proj.
  Generator j(1337), l(1337);
  MultiHead multi({.n_embd = 4, .num_heads = 2, .head_size = 2, .block_size = 4}, j);
  Head h0({.n_embd = 4, .head_size = 2, .block_size = 4}, l);
  Linear key1({.in_features = 4, .out_features = 2, .bias = false}, l);
  Linear query1({.in_features = 4, .out_features = 2, .bias = false}, l);
  Linear value1({.in_features = 4, .out_features = 2, .bias = false}, l);
  Linear proj({.in_features = 4, .out_features = 4}, l);
  EXPECT_EQ(max_abs_diff(multi.heads[0]->value.weight.value, h0.value.weight.value), 0.0f);
  EXPECT_EQ(max_abs_diff(multi.heads[1]->query.weight.value, query1.weight.value), 0.0f);
  EXPECT_EQ(max_abs_diff(multi.proj.weight.value, proj.weight.value), 0.0f);
  EXPECT_EQ(max_abs_diff(multi.proj.bias.value, proj.bias.value), 0.0f);
}

TEST(Modules, EmbeddingLooksUpRows) {
  Generator gen(123), ref_gen(123);
  Embedding emb({.num_embeddings = 6, .embedding_dim = 16}, gen);
  EXPECT_EQ(max_abs_diff(emb.weight.value, randn({6, 16}, ref_gen)),
            0.0f);  // normal_ == randn(6·16)
  const std::vector<int64_t> sentence = {0, 4, 5, 2, 1, 3};
  const Tensor x = emb.forward(sentence);
  ASSERT_EQ(x.shape(), (Shape{6, 16}));
  EXPECT_EQ(max_abs_diff(select(x, 1), select(emb.weight.value, 4)), 0.0f);
  EXPECT_EQ(emb.forward(sentence, {2, 3}).shape(), (Shape{2, 3, 16}));
}

TEST(Modules, ZeroGradAndAccumulation) {
  Generator gen(3);
  CausalAttention m({.d_in = 3, .d_out = 2, .context_length = 6}, gen);
  const Tensor x = example_batch();
  const Tensor dy = random_tensor({2, 6, 2}, 4);
  m.forward(x);
  m.backward(dy);
  const Tensor once = m.W_key.weight.grad.clone();
  m.backward(dy);  // accumulates
  EXPECT_LE(max_abs_diff(m.W_key.weight.grad, once * 2.0f), 1e-6f);
  m.zero_grad();
  for (auto& [name, p] : m.named_parameters()) {
    for (float g : p->grad.values()) EXPECT_EQ(g, 0.0f) << name;
  }
}

TEST(Modules, SingleTokenWorksEverywhere) {
  Generator gen(5);
  const Tensor x = random_tensor({1, 1, 4}, 6);
  CausalAttention ca({.d_in = 4, .d_out = 3, .context_length = 4}, gen);
  MultiHeadAttentionWrapper wrapper({.d_in = 4, .d_out = 3, .context_length = 4, .num_heads = 2},
                                    gen);
  MultiHeadAttention mha({.d_in = 4, .d_out = 4, .context_length = 4, .num_heads = 2}, gen);
  Head head({.n_embd = 4, .head_size = 2, .block_size = 4}, gen);
  MultiHead multi({.n_embd = 4, .num_heads = 2, .head_size = 2, .block_size = 4}, gen);
  // One token attends only to itself: weight 1, output = its value.
  EXPECT_LE(max_abs_diff(ca.forward(x), ca.W_value.forward(x)), 1e-6f);
  EXPECT_EQ(wrapper.forward(x).shape(), (Shape{1, 1, 6}));
  EXPECT_EQ(mha.forward(x).shape(), (Shape{1, 1, 4}));
  EXPECT_EQ(head.forward(x).shape(), (Shape{1, 1, 2}));
  EXPECT_EQ(multi.forward(x).shape(), (Shape{1, 1, 4}));
}

// ---- errors ------------------------------------------------------------------------------

TEST(Modules, BackwardBeforeForwardThrows) {
  Generator gen(1);
  const Tensor dy({1, 1, 2});
  CausalAttention ca({.d_in = 3, .d_out = 2, .context_length = 6}, gen);
  expect_message<std::logic_error>([&] { ca.backward(dy); },
                                   "CausalAttention: backward() called before forward()");
  MultiHeadAttention mha({.d_in = 3, .d_out = 2, .context_length = 6, .num_heads = 2}, gen);
  expect_message<std::logic_error>([&] { mha.backward(dy); },
                                   "MultiHeadAttention: backward() called before forward()");
  Linear lin({.in_features = 3, .out_features = 2}, gen);
  expect_message<std::logic_error>([&] { lin.backward(dy); },
                                   "Linear: backward() called before forward()");
  Dropout drop({.p = 0.1f}, gen);
  EXPECT_THROW(drop.backward(dy), std::logic_error);
  SelfAttentionV1 v1({.d_in = 3, .d_out = 2}, gen);
  EXPECT_THROW(v1.backward(dy), std::logic_error);
  SelfAttentionV2 v2({.d_in = 3, .d_out = 2}, gen);
  EXPECT_THROW(v2.backward(dy), std::logic_error);
  MultiHeadAttentionWrapper wrapper({.d_in = 3, .d_out = 2, .context_length = 6}, gen);
  EXPECT_THROW(wrapper.backward(dy), std::logic_error);
  Head head({.n_embd = 3, .head_size = 2, .block_size = 6}, gen);
  EXPECT_THROW(head.backward(dy), std::logic_error);
  MultiHead multi({.n_embd = 3, .head_size = 2, .block_size = 6}, gen);
  EXPECT_THROW(multi.backward(dy), std::logic_error);
  Embedding emb({.num_embeddings = 3, .embedding_dim = 2}, gen);
  EXPECT_THROW(emb.backward(dy), std::logic_error);
}

TEST(Modules, ErrorMessagesNameTheValues) {
  Generator gen(1);
  using IA = std::invalid_argument;
  expect_message<IA>(
      [&] {
        MultiHeadAttention m({.d_in = 768, .d_out = 770, .context_length = 8, .num_heads = 12},
                             gen);
      },
      "MultiHeadAttention: d_out (770) must be divisible by num_heads (12)");
  expect_message<IA>(
      [&] {
        MultiHeadAttention m({.d_in = 4, .d_out = 4, .context_length = 8, .num_heads = 0}, gen);
      },
      "MultiHeadAttention: num_heads must be positive, got 0");
  expect_message<IA>([&] { Dropout d({.p = 1.5f}, gen); }, "Dropout: p must be in [0, 1], got 1.5");
  expect_message<IA>([&] { Dropout d({.p = -0.1f}, gen); },
                     "Dropout: p must be in [0, 1], got -0.1");
  expect_message<IA>([&] { Dropout d({.p = NAN}, gen); }, "Dropout: p must be in [0, 1], got nan");
  expect_message<IA>(
      [&] {
        CausalAttention m({.d_in = 3, .d_out = 2, .context_length = 6, .dropout = 2.0f}, gen);
      },
      "Dropout: p must be in [0, 1], got 2");
  expect_message<IA>([&] { CausalAttention m({.d_in = 3, .d_out = 2, .context_length = 0}, gen); },
                     "CausalAttention: context_length must be positive, got 0");

  CausalAttention ca({.d_in = 3, .d_out = 2, .context_length = 6}, gen);
  expect_message<IA>(
      [&] {
        ca.forward(random_tensor({2, 7, 3}, 1));
      },
      "CausalAttention: input has 7 tokens but context_length is 6");
  expect_message<IA>(
      [&] {
        ca.forward(random_tensor({2, 6, 4}, 1));
      },
      "CausalAttention: input last dim 4 does not match d_in 3");
  expect_message<IA>([&] { ca.forward(example_inputs()); },
                     "CausalAttention: expected input of shape (B, T, d_in), got (6, 3)");
  expect_message<IA>([&] { ca.forward(Tensor({2, 0, 3})); }, "CausalAttention: input has 0 tokens");
  expect_message<IA>(
      [&] {
        ca.forward(Tensor({0, 2, 3}));
      },
      "CausalAttention: input has batch size 0");
  ca.forward(example_batch());
  expect_message<IA>(
      [&] {
        ca.backward(Tensor({2, 6, 3}));
      },
      "CausalAttention: gradient shape (2, 6, 3) does not match output shape (2, 6, 2)");

  MultiHeadAttention mha({.d_in = 3, .d_out = 2, .context_length = 6, .num_heads = 2}, gen);
  expect_message<IA>(
      [&] {
        mha.forward(random_tensor({1, 7, 3}, 1));
      },
      "MultiHeadAttention: input has 7 tokens but context_length is 6");
  MultiHeadAttentionWrapper wrapper({.d_in = 3, .d_out = 2, .context_length = 6, .num_heads = 2},
                                    gen);
  expect_message<IA>(
      [&] {
        wrapper.forward(random_tensor({1, 7, 3}, 1));
      },
      "MultiHeadAttentionWrapper: input has 7 tokens but context_length is 6");

  Linear lin({.in_features = 3, .out_features = 2}, gen);
  expect_message<IA>(
      [&] {
        lin.forward(random_tensor({4, 5}, 1));
      },
      "Linear: input last dim 5 does not match in_features 3");
  expect_message<IA>([&] { Linear l({.in_features = 0, .out_features = 2}, gen); },
                     "Linear: in_features must be positive, got 0");

  Head head({.n_embd = 8, .head_size = 4, .block_size = 8}, gen);
  expect_message<IA>(
      [&] {
        head.forward(random_tensor({1, 9, 8}, 1));
      },
      "Head: input has 9 tokens but block_size is 8");
  expect_message<IA>(
      [&] {
        head.forward(random_tensor({1, 4, 6}, 1));
      },
      "Head: input last dim 6 does not match n_embd 8");
  Head encoder({.n_embd = 8, .head_size = 4, .block_size = 8, .causal = false}, gen);
  EXPECT_EQ(encoder.forward(random_tensor({1, 9, 8}, 1)).shape(),
            (Shape{1, 9, 4}));  // no mask, no limit
  MultiHead multi({.n_embd = 8, .num_heads = 2, .head_size = 4, .block_size = 8}, gen);
  expect_message<IA>(
      [&] {
        multi.forward(random_tensor({1, 9, 8}, 1));
      },
      "MultiHead: input has 9 tokens but block_size is 8");

  SelfAttentionV1 v1({.d_in = 3, .d_out = 2}, gen);
  expect_message<IA>(
      [&] {
        v1.forward(random_tensor({6, 4}, 1));
      },
      "SelfAttentionV1: input last dim 4 does not match d_in 3");
  expect_message<IA>(
      [&] { v1.forward(random_tensor({6}, 1)); },
      "SelfAttentionV1: expected input of shape (T, d_in) or (B, T, d_in), got (6,)");

  Embedding emb({.num_embeddings = 6, .embedding_dim = 4}, gen);
  expect_message<IA>(
      [&] {
        emb.forward({0, 6});
      },
      "Embedding: index 6 is out of range for num_embeddings 6");
  expect_message<IA>(
      [&] {
        emb.forward({0, -1});
      },
      "Embedding: index -1 is out of range for num_embeddings 6");
  expect_message<IA>(
      [&] {
        emb.forward({0, 1, 2}, {2, 2});
      },
      "Embedding: 3 indices do not fill shape (2, 2)");
}

// A bad option throws before any parameter is drawn: the generator is where it was.
TEST(Modules, OptionErrorsComeBeforeAnyDraw) {
  const auto expect_no_draw = [](const std::function<void(Generator&)>& make,
                                 const std::string& message) {
    Generator gen(5), untouched(5);
    expect_message<std::invalid_argument>([&] { make(gen); }, message);
    EXPECT_EQ(gen.random64(), untouched.random64()) << message;
  };
  const std::string bad_p = "Dropout: p must be in [0, 1], got 1.5";
  expect_no_draw(
      [](Generator& g) {
        CausalAttention m({.d_in = 3, .d_out = 2, .context_length = 6, .dropout = 1.5f}, g);
      },
      bad_p);
  expect_no_draw(
      [](Generator& g) {
        MultiHeadAttention m(
            {.d_in = 4, .d_out = 4, .context_length = 6, .dropout = 1.5f, .num_heads = 2}, g);
      },
      bad_p);
  expect_no_draw(
      [](Generator& g) {
        MultiHeadAttentionWrapper m(
            {.d_in = 4, .d_out = 2, .context_length = 6, .dropout = 1.5f, .num_heads = 2}, g);
      },
      bad_p);
  expect_no_draw(
      [](Generator& g) {
        Head m({.n_embd = 4, .head_size = 2, .block_size = 6, .dropout = 1.5f}, g);
      },
      bad_p);
  expect_no_draw(
      [](Generator& g) {
        MultiHead m({.n_embd = 4, .num_heads = 2, .head_size = 2, .block_size = 6, .dropout = 1.5f},
                    g);
      },
      bad_p);
}

}  // namespace
}  // namespace attn::test
