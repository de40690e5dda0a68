// Finite-difference checks of every backward pass: the reference attention
// (all options) and every module, input gradient and every parameter gradient.
// Tolerance: |numerical - analytic| <= 1e-3 + 1e-2·|numerical|, eps = 3e-3,
// inputs and R ~ N(0, 1) (see gradcheck.h).
#include <gtest/gtest.h>

#include "attn/functional.h"
#include "attn/nn.h"
#include "attn/ops.h"
#include "attn/random.h"
#include "gradcheck.h"

namespace attn::test {
namespace {

using namespace attn::nn;

// ---- the reference functions -------------------------------------------------------

TEST(GradcheckReference, SoftmaxBackwardEveryDim) {
  for (int64_t dim : {0, 1, -1}) {
    Tensor x = random_tensor({3, 4, 5}, 11);
    const Tensor R = random_tensor({3, 4, 5}, 12);
    const Tensor dx = ref::softmax_backward(R, softmax(x, dim), dim);
    check_tensor_grad("softmax dim " + std::to_string(dim), x, dx,
                      [&] { return dot_loss(softmax(x, dim), R); }, {});
  }
}

TEST(GradcheckReference, LinearFunctions) {
  Tensor x = random_tensor({2, 3, 4}, 1);
  Tensor w = random_tensor({5, 4}, 2);
  Tensor b = random_tensor({5}, 3);
  const Tensor R = random_tensor({2, 3, 5}, 4);
  Tensor dw({5, 4}), db({5});
  const Tensor dx = ref::linear_backward(R, x, w, dw, &db);
  const auto loss = [&] { return dot_loss(ref::linear_forward(x, w, &b), R); };
  check_tensor_grad("linear_forward x", x, dx, loss, {});
  check_tensor_grad("linear_forward weight", w, dw, loss, {});
  check_tensor_grad("linear_forward bias", b, db, loss, {});

  Tensor wp = random_tensor({4, 5}, 5);  // plain (in, out) parameter
  Tensor dwp({4, 5});
  const Tensor dxp = ref::matmul_param_backward(R, x, wp, dwp);
  const auto loss_p = [&] { return dot_loss(matmul(x, wp), R); };
  check_tensor_grad("matmul_param x", x, dxp, loss_p, {});
  check_tensor_grad("matmul_param weight", wp, dwp, loss_p, {});
}

struct AttentionCase {
  std::string name;
  Shape lead;
  int64_t T_q, T_k, d_k, d_v;
  ref::AttentionOptions options;
  float p;  // dropout on the weights, 0 for none
};

TEST(GradcheckReference, AttentionBackwardAllOptions) {
  const std::vector<AttentionCase> cases = {
      {"plain (B)", {2}, 5, 5, 4, 3, {}, 0.0f},
      {"causal (B, H)", {2, 3}, 4, 4, 3, 3, {.causal = true}, 0.0f},
      {"causal T=1", {1}, 1, 1, 4, 2, {.causal = true}, 0.0f},
      {"causal T_q > T_k", {2}, 5, 3, 4, 2, {.causal = true}, 0.0f},
      {"causal T_q < T_k", {2}, 3, 5, 4, 2, {.causal = true}, 0.0f},
      {"scale 0.7", {2}, 4, 6, 3, 5, {.scale = 0.7f}, 0.0f},
      {"softmax_dim 1 (the bug)", {2}, 5, 5, 3, 3, {.softmax_dim = 1}, 0.0f},
      {"causal softmax_dim 1", {2}, 5, 5, 3, 3, {.causal = true, .softmax_dim = 1}, 0.0f},
      {"causal dropout 0.4", {2, 2}, 5, 5, 3, 4, {.causal = true}, 0.4f},
      {"no leading dims", {}, 4, 4, 3, 3, {.causal = true}, 0.3f},
  };
  uint64_t seed = 100;
  for (const auto& c : cases) {
    const auto shape = [&](int64_t a, int64_t b) {
      Shape s = c.lead;
      s.push_back(a);
      s.push_back(b);
      return s;
    };
    Tensor q = random_tensor(shape(c.T_q, c.d_k), ++seed);
    Tensor k = random_tensor(shape(c.T_k, c.d_k), ++seed);
    Tensor v = random_tensor(shape(c.T_k, c.d_v), ++seed);
    const Tensor R = random_tensor(shape(c.T_q, c.d_v), ++seed);
    Generator gen(++seed);
    const Tensor noise =
        dropout_noise(shape(c.T_q, c.T_k), c.p, gen);  // fixed for every evaluation
    const Tensor* noise_ptr = c.p > 0.0f ? &noise : nullptr;
    ref::AttentionSaved saved;
    ref::attention_forward(q, k, v, c.options, noise_ptr, &saved);
    const ref::AttentionGrads g = ref::attention_backward(R, q, k, v, saved, c.options);
    const auto loss = [&] {
      return dot_loss(ref::attention_forward(q, k, v, c.options, noise_ptr, nullptr), R);
    };
    check_tensor_grad("attention " + c.name + " dq", q, g.dq, loss, {});
    check_tensor_grad("attention " + c.name + " dk", k, g.dk, loss, {});
    check_tensor_grad("attention " + c.name + " dv", v, g.dv, loss, {});
  }
}

// ---- the modules -------------------------------------------------------------------

TEST(GradcheckModules, Linear) {
  for (bool bias : {true, false}) {
    Generator gen(1);
    Linear m({.in_features = 4, .out_features = 3, .bias = bias}, gen);
    gradcheck_module(bias ? "Linear bias" : "Linear no bias", m, random_tensor({2, 5, 4}, 2));
  }
  Generator gen(3);
  Linear m({.in_features = 1, .out_features = 1}, gen);
  gradcheck_module("Linear 1x1", m, random_tensor({1, 1}, 4));
}

TEST(GradcheckModules, DropoutWithFixedNoise) {
  Generator gen(5);
  Dropout m({.p = 0.4f}, gen);
  gradcheck_module("Dropout p=0.4", m, random_tensor({3, 7}, 6), {}, [&] { gen.manual_seed(77); });
  m.eval();
  gradcheck_module("Dropout eval", m, random_tensor({3, 7}, 6));
}

TEST(GradcheckModules, Embedding) {
  Generator gen(8);
  Embedding m({.num_embeddings = 6, .embedding_dim = 5}, gen);
  const std::vector<int64_t> indices = {0, 4, 5, 2, 4, 3};  // index 4 twice: gradients add
  const Tensor R = random_tensor({2, 3, 5}, 9);
  m.zero_grad();
  m.forward(indices, {2, 3});
  m.backward(R);
  const Tensor analytic = m.weight.grad.clone();
  check_tensor_grad("Embedding weight", m.weight.value, analytic,
                    [&] {
                      return dot_loss(m.forward(indices, {2, 3}), R);
                    },
                    {});
}

TEST(GradcheckModules, SelfAttentionV1) {
  for (const Shape& shape : {Shape{6, 3}, Shape{2, 5, 3}, Shape{1, 1, 3}}) {
    Generator gen(123);
    SelfAttentionV1 m({.d_in = 3, .d_out = 2}, gen);
    gradcheck_module("SelfAttentionV1 " + shape_str(shape), m, random_tensor(shape, 10));
  }
  Generator gen(123);
  SelfAttentionV1 m({.d_in = 4, .d_out = 3, .d_v = 5}, gen);
  gradcheck_module("SelfAttentionV1 d_v=5", m, random_tensor({2, 4, 4}, 11));
}

TEST(GradcheckModules, SelfAttentionV2) {
  for (const Shape& shape : {Shape{6, 3}, Shape{2, 5, 3}, Shape{1, 1, 3}}) {
    Generator gen(789);
    SelfAttentionV2 m({.d_in = 3, .d_out = 2}, gen);
    gradcheck_module("SelfAttentionV2 " + shape_str(shape), m, random_tensor(shape, 12));
  }
  Generator gen(789);
  SelfAttentionV2 m({.d_in = 4, .d_out = 3, .d_v = 5, .qkv_bias = true}, gen);
  gradcheck_module("SelfAttentionV2 d_v=5 bias", m, random_tensor({2, 4, 4}, 13));
}

TEST(GradcheckModules, CausalAttention) {
  for (int64_t T : {1, 4, 6}) {
    Generator gen(123);
    CausalAttention m({.d_in = 3, .d_out = 2, .context_length = 6}, gen);
    gradcheck_module("CausalAttention T=" + std::to_string(T), m, random_tensor({2, T, 3}, 14));
  }
  Generator gen(123);
  CausalAttention drop(
      {.d_in = 4, .d_out = 3, .context_length = 8, .dropout = 0.3f, .qkv_bias = true}, gen);
  gradcheck_module("CausalAttention dropout 0.3", drop, random_tensor({2, 5, 4}, 15), {},
                   [&] { gen.manual_seed(2024); });
  Generator gen2(123);
  CausalAttention bug({.d_in = 3, .d_out = 2, .context_length = 6, .softmax_dim = 1}, gen2);
  gradcheck_module("CausalAttention softmax_dim=1", bug, random_tensor({2, 6, 3}, 16));
}

TEST(GradcheckModules, MultiHeadAttentionWrapper) {
  Generator gen(123);
  MultiHeadAttentionWrapper m(
      {.d_in = 3, .d_out = 2, .context_length = 6, .dropout = 0.2f, .num_heads = 2}, gen);
  gradcheck_module("MultiHeadAttentionWrapper", m, random_tensor({2, 6, 3}, 17), {},
                   [&] { gen.manual_seed(5); });
  Generator gen1(1);
  MultiHeadAttentionWrapper one({.d_in = 4, .d_out = 3, .context_length = 3, .num_heads = 3}, gen1);
  gradcheck_module("MultiHeadAttentionWrapper T=1", one, random_tensor({1, 1, 4}, 18));
}

TEST(GradcheckModules, MultiHeadAttention) {
  Generator gen(123);
  MultiHeadAttention m({.d_in = 5, .d_out = 6, .context_length = 8, .num_heads = 3}, gen);
  gradcheck_module("MultiHeadAttention 3 heads", m, random_tensor({2, 7, 5}, 19));
  for (int64_t T : {1, 2}) {
    Generator g(7);
    MultiHeadAttention small({.d_in = 3, .d_out = 2, .context_length = 6, .num_heads = 2}, g);
    gradcheck_module("MultiHeadAttention T=" + std::to_string(T), small,
                     random_tensor({2, T, 3}, 20));
  }
  Generator gen_d(9);
  MultiHeadAttention drop({.d_in = 4,
                           .d_out = 4,
                           .context_length = 5,
                           .dropout = 0.25f,
                           .num_heads = 2,
                           .qkv_bias = true},
                          gen_d);
  gradcheck_module("MultiHeadAttention dropout 0.25 bias", drop, random_tensor({2, 5, 4}, 21), {},
                   [&] { gen_d.manual_seed(31); });
}

// Head width 16 and T = 17, 15: on both sides of a 16-wide vector; entries sampled.
TEST(GradcheckModules, MultiHeadAttentionWiderHeads) {
  for (int64_t T : {15, 17}) {
    Generator gen(123);
    MultiHeadAttention m({.d_in = 16, .d_out = 32, .context_length = 32, .num_heads = 2}, gen);
    gradcheck_module("MultiHeadAttention hd=16 T=" + std::to_string(T), m,
                     random_tensor({1, T, 16}, 27), {.max_coords = 120});
  }
}

TEST(GradcheckModules, Head) {
  for (bool causal : {true, false}) {
    for (int64_t T : {1, 5}) {
      Generator gen(1337);
      Head m({.n_embd = 6, .head_size = 4, .block_size = 8, .causal = causal}, gen);
      gradcheck_module(
          std::string(causal ? "Head decoder" : "Head encoder") + " T=" + std::to_string(T), m,
          random_tensor({2, T, 6}, 22));
    }
  }
  Generator gen(1337);
  Head drop({.n_embd = 6, .head_size = 4, .block_size = 8, .dropout = 0.3f}, gen);
  gradcheck_module("Head dropout 0.3", drop, random_tensor({2, 5, 6}, 23), {},
                   [&] { gen.manual_seed(3); });
}

TEST(GradcheckModules, MultiHead) {
  for (bool causal : {true, false}) {
    Generator gen(1337);
    MultiHead m({.n_embd = 6, .num_heads = 2, .head_size = 3, .block_size = 8, .causal = causal},
                gen);
    gradcheck_module(std::string("MultiHead ") + (causal ? "decoder" : "encoder"), m,
                     random_tensor({2, 5, 6}, 24));
  }
  Generator gen(1337);
  MultiHead drop({.n_embd = 4, .num_heads = 3, .head_size = 2, .block_size = 4, .dropout = 0.2f},
                 gen);
  gradcheck_module("MultiHead dropout 0.2 (weights and output)", drop, random_tensor({2, 4, 4}, 25),
                   {}, [&] { gen.manual_seed(8); });
  Generator gen1(2);
  MultiHead one({.n_embd = 4, .num_heads = 2, .head_size = 2, .block_size = 4}, gen1);
  gradcheck_module("MultiHead T=1", one, random_tensor({1, 1, 4}, 26));
}

}  // namespace
}  // namespace attn::test
