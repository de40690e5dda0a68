// The fused path of CausalAttention and MultiHeadAttention (attn/fused.h)
// against the reference path: outputs and every gradient on many shapes, with
// and without dropout (the reference fed the kernel's Philox mask), causality,
// the choice kAuto makes, finite differences, and the error messages.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

#include "attn/functional.h"
#include "attn/kernels.h"
#include "attn/nn.h"
#include "attn/ops.h"
#include "attn/random.h"
#include "gradcheck.h"

namespace attn::test {
namespace {

using namespace attn::nn;

constexpr float kRelTol = 2e-5f;  // max |fused - reference| / scale

float max_abs(const Tensor& t) {
  float m = 0.0f;
  for (float v : t.values()) m = std::max(m, std::fabs(v));
  return m;
}

// max |a - b| relative to the scale of b, or to `floor` where that is larger.
// Some gradients are zero in exact arithmetic and only rounding noise in
// both paths (the key bias: softmax ignores a constant added to a row of
// scores; q and k at T = 1), so the floor is the scale of the output y.
float rel_err(const Tensor& a, const Tensor& b, float floor) {
  EXPECT_EQ(a.shape(), b.shape());
  if (a.shape() != b.shape()) return INFINITY;
  return max_abs_diff(a, b) / std::max({max_abs(b), floor, 1e-6f});
}

struct Shape4 {
  int64_t B, T, d_in, H, hd;
  bool bias;
};
std::string name_of(const Shape4& s) {
  return "B=" + std::to_string(s.B) + " T=" + std::to_string(s.T) +
         " d_in=" + std::to_string(s.d_in) + " H=" + std::to_string(s.H) +
         " hd=" + std::to_string(s.hd) + (s.bias ? " bias" : "");
}

// Sizes on both sides of the kernel's vector and tile widths; heads 1 .. 12,
// head_dim 1 .. 128; T = 1.
const std::vector<Shape4>& shapes() {
  static const std::vector<Shape4> all = {
      {1, 1, 8, 1, 16, true},    {2, 15, 16, 2, 16, false},  {2, 17, 24, 3, 32, true},
      {1, 64, 32, 4, 64, false}, {1, 65, 96, 12, 64, true},  {1, 200, 40, 2, 128, false},
      {3, 33, 20, 5, 24, true},  {2, 6, 3, 2, 1, false},     {1, 31, 48, 6, 48, true},
      {2, 63, 64, 8, 16, false}, {1, 129, 64, 1, 128, true}, {1, 16, 12, 12, 17, false},
  };
  return all;
}

// Runs forward and backward of m on x with output gradient R; returns y, dx
// and the parameter gradients in named_parameters() order.
template <class M>
std::vector<Tensor> forward_backward(M& m, const Tensor& x, const Tensor& R) {
  m.zero_grad();
  std::vector<Tensor> out = {m.forward(x)};
  out.push_back(m.backward(R));
  for (auto& [name, p] : m.named_parameters()) out.push_back(p->grad);
  return out;
}
template <class M>
std::vector<std::string> result_names(M& m) {
  std::vector<std::string> names = {"y", "dx"};
  for (auto& [name, p] : m.named_parameters()) names.push_back(name + ".grad");
  return names;
}

MultiHeadAttentionOptions mha_options(const Shape4& s, AttentionBackend backend,
                                      float dropout = 0.0f, bool exact_dropout = true) {
  return {.d_in = s.d_in,
          .d_out = s.H * s.hd,
          .context_length = s.T + 3,
          .dropout = dropout,
          .num_heads = s.H,
          .qkv_bias = s.bias,
          .backend = backend,
          .exact_dropout = exact_dropout};
}

TEST(FusedModules, MultiHeadAttentionMatchesReference) {
  for (const Shape4& s : shapes()) {
    Generator g_fused(11), g_ref(11);  // the same weights in both
    MultiHeadAttention fused(mha_options(s, AttentionBackend::kFused), g_fused);
    MultiHeadAttention reference(mha_options(s, AttentionBackend::kReference), g_ref);
    const Tensor x = random_tensor({s.B, s.T, s.d_in}, 21);
    const Tensor R = random_tensor({s.B, s.T, s.H * s.hd}, 22);
    const auto a = forward_backward(fused, x, R);
    const auto b = forward_backward(reference, x, R);
    EXPECT_EQ(fused.last_backend(), AttentionBackend::kFused);
    EXPECT_EQ(reference.last_backend(), AttentionBackend::kReference);
    const auto names = result_names(fused);
    ASSERT_EQ(a.size(), b.size());
    for (size_t n = 0; n < a.size(); ++n)
      EXPECT_LE(rel_err(a[n], b[n], max_abs(b[0])), kRelTol) << name_of(s) << " " << names[n];
  }
}

TEST(FusedModules, CausalAttentionMatchesReference) {
  // CausalAttention is one head of width d_out without an output projection.
  for (const Shape4& s : shapes()) {
    if (s.H * s.hd > 256) continue;  // the kernel's head_dim limit
    const int64_t d_out = s.H * s.hd;
    const auto options = [&](AttentionBackend backend) {
      return CausalAttentionOptions{.d_in = s.d_in,
                                    .d_out = d_out,
                                    .context_length = s.T,
                                    .qkv_bias = s.bias,
                                    .backend = backend};
    };
    Generator g_fused(12), g_ref(12);
    CausalAttention fused(options(AttentionBackend::kFused), g_fused);
    CausalAttention reference(options(AttentionBackend::kReference), g_ref);
    const Tensor x = random_tensor({s.B, s.T, s.d_in}, 23);
    const Tensor R = random_tensor({s.B, s.T, d_out}, 24);
    const auto a = forward_backward(fused, x, R);
    const auto b = forward_backward(reference, x, R);
    const auto names = result_names(fused);
    for (size_t n = 0; n < a.size(); ++n)
      EXPECT_LE(rel_err(a[n], b[n], max_abs(b[0])), kRelTol)
          << "d_out=" << d_out << " " << name_of(s) << " " << names[n];
  }
}

TEST(FusedModules, WrapperHeadsTakeTheBackend) {
  Generator g_fused(13), g_ref(13);
  const MultiHeadAttentionOptions o = {.d_in = 6, .d_out = 4, .context_length = 9, .num_heads = 3};
  MultiHeadAttentionOptions of = o, orf = o;
  of.backend = AttentionBackend::kFused;
  orf.backend = AttentionBackend::kReference;
  MultiHeadAttentionWrapper fused(of, g_fused);
  MultiHeadAttentionWrapper reference(orf, g_ref);
  const Tensor x = random_tensor({2, 9, 6}, 25), R = random_tensor({2, 9, 12}, 26);
  const auto a = forward_backward(fused, x, R);
  const auto b = forward_backward(reference, x, R);
  for (const auto& head : fused.heads) EXPECT_EQ(head->last_backend(), AttentionBackend::kFused);
  for (size_t n = 0; n < a.size(); ++n) EXPECT_LE(rel_err(a[n], b[n], max_abs(b[0])), kRelTol) << n;
}

// ---- dropout on the fused path: the kernel's Philox mask, fed to the reference maths ----

// The reference maths of MultiHeadAttention with a given (B, H, T, T) noise:
// returns y, dx and the gradients in named_parameters() order (W_query.weight,
// [W_query.bias,] W_key..., W_value..., out_proj.weight, out_proj.bias).
std::vector<Tensor> reference_with_noise(MultiHeadAttention& m, const Tensor& x, const Tensor& R,
                                         const Tensor& noise) {
  const int64_t B = x.size(0), T = x.size(1), H = m.options().num_heads, hd = m.head_dim();
  const int64_t d_out = m.options().d_out;
  const auto bias = [](Linear& l) { return l.options().bias ? &l.bias.value : nullptr; };
  const auto heads = [&](const Tensor& y) {  // (B, T, d_out) -> (B, H, T, hd)
    return transpose(y.reshape({B, T, H, hd}), 1, 2);
  };
  const auto merge = [&](const Tensor& y) {  // (B, H, T, hd) -> (B, T, d_out)
    return transpose(y, 1, 2).reshape({B, T, d_out});
  };
  const Tensor q = heads(ref::linear_forward(x, m.W_query.weight.value, bias(m.W_query)));
  const Tensor k = heads(ref::linear_forward(x, m.W_key.weight.value, bias(m.W_key)));
  const Tensor v = heads(ref::linear_forward(x, m.W_value.weight.value, bias(m.W_value)));
  ref::AttentionSaved saved;
  const ref::AttentionOptions causal{.causal = true};
  const Tensor context = merge(ref::attention_forward(q, k, v, causal, &noise, &saved));
  const Tensor y = ref::linear_forward(context, m.out_proj.weight.value, &m.out_proj.bias.value);

  std::vector<Tensor> grads;
  for (auto& [name, p] : m.named_parameters()) grads.push_back(Tensor::zeros(p->value.shape()));
  // grads: [Wq, (bq), Wk, (bk), Wv, (bv), Wo, bo]
  const bool b = m.options().qkv_bias;
  const size_t per = b ? 2 : 1;
  Tensor& dWo = grads[3 * per];
  Tensor& dbo = grads[3 * per + 1];
  const Tensor dcontext =
      heads(ref::linear_backward(R, context, m.out_proj.weight.value, dWo, &dbo));
  const ref::AttentionGrads g = ref::attention_backward(dcontext, q, k, v, saved, causal);
  Tensor dx;
  const Tensor* dproj[3] = {&g.dq, &g.dk, &g.dv};
  Linear* lin[3] = {&m.W_query, &m.W_key, &m.W_value};
  for (int j = 0; j < 3; ++j) {
    Tensor* db = b ? &grads[j * per + 1] : nullptr;
    const Tensor dxj =
        ref::linear_backward(merge(*dproj[j]), x, lin[j]->weight.value, grads[j * per], db);
    if (j == 0) {
      dx = dxj;
    } else {
      dx += dxj;
    }
  }
  std::vector<Tensor> out = {y, dx};
  for (auto& gr : grads) out.push_back(gr);
  return out;
}

TEST(FusedModules, DropoutUsesThePhiloxMaskSeededFromTheGenerator) {
  for (const Shape4& s : {Shape4{2, 17, 24, 3, 32, true}, Shape4{1, 65, 64, 4, 16, false},
                          Shape4{1, 1, 8, 2, 8, true}}) {
    for (float p : {0.1f, 0.5f}) {
      Generator gen(31);
      MultiHeadAttention m(mha_options(s, AttentionBackend::kAuto, p, /*exact_dropout=*/false),
                           gen);
      const Tensor x = random_tensor({s.B, s.T, s.d_in}, 32);
      const Tensor R = random_tensor({s.B, s.T, s.H * s.hd}, 33);
      Generator probe = gen;  // the module draws one random64() per forward
      const uint64_t seed = probe.random64();
      const auto a = forward_backward(m, x, R);
      EXPECT_EQ(m.last_backend(), AttentionBackend::kFused);
      EXPECT_EQ(gen.random(), probe.random()) << "exactly one random64() per forward";

      kernels::FlashAttentionParams params;
      params.B = s.B, params.T = s.T, params.H = s.H, params.hd = s.hd;
      params.causal = true, params.dropout_p = p, params.dropout_seed = seed;
      Tensor noise({s.B, s.H, s.T, s.T});  // (B, H, T, T)
      kernels::flash_dropout_noise(noise.data(), params);
      const auto b = reference_with_noise(m, x, R, noise);
      const auto names = result_names(m);
      ASSERT_EQ(a.size(), b.size());
      for (size_t n = 0; n < a.size(); ++n)
        EXPECT_LE(rel_err(a[n], b[n], max_abs(b[0])), kRelTol)
            << name_of(s) << " p=" << p << " " << names[n];
    }
  }
}

TEST(FusedModules, SeededDropoutIsReproducible) {
  const Shape4 s{2, 20, 16, 2, 8, false};
  const Tensor x = random_tensor({s.B, s.T, s.d_in}, 34);
  const auto run = [&](uint64_t seed) {
    Generator gen(seed);
    MultiHeadAttention m(mha_options(s, AttentionBackend::kFused, 0.3f), gen);
    const Tensor first = m.forward(x);
    return std::make_pair(first, m.forward(x));  // a second forward draws a new mask
  };
  const auto [a1, a2] = run(5);
  const auto [b1, b2] = run(5);
  EXPECT_EQ(max_abs_diff(a1, b1), 0.0f);
  EXPECT_EQ(max_abs_diff(a2, b2), 0.0f);
  EXPECT_GT(max_abs_diff(a1, a2), 1e-3f);
  // Evaluation mode: dropout is the identity, no draws.
  Generator g1(5), g2(5);
  MultiHeadAttention dropped(mha_options(s, AttentionBackend::kFused, 0.3f), g1);
  MultiHeadAttention plain(mha_options(s, AttentionBackend::kFused, 0.0f), g2);
  dropped.eval();
  EXPECT_EQ(max_abs_diff(dropped.forward(x), plain.forward(x)), 0.0f);
  EXPECT_EQ(g1.random(), g2.random());
}

// ---- behaviour ----

TEST(FusedModules, FutureTokensDoNotChangeEarlierOutputs) {
  const Shape4 s{2, 40, 12, 3, 16, true};
  Generator gen(41);
  MultiHeadAttention mha(mha_options(s, AttentionBackend::kFused), gen);
  CausalAttention ca({.d_in = 12,
                      .d_out = 20,
                      .context_length = 40,
                      .qkv_bias = true,
                      .backend = AttentionBackend::kFused},
                     gen);
  const Tensor x = random_tensor({s.B, s.T, s.d_in}, 42);
  for (int64_t from : {1, 7, 16, 17, 39}) {
    Tensor changed = x;
    for (int64_t b = 0; b < s.B; ++b)
      for (int64_t t = from; t < s.T; ++t)
        for (int64_t c = 0; c < s.d_in; ++c) changed.at({b, t, c}) += 2.0f + float(c);
    const auto past = [&](const Tensor& y) { return slice(y, 1, 0, from); };
    EXPECT_EQ(max_abs_diff(past(mha.forward(x)), past(mha.forward(changed))), 0.0f) << from;
    EXPECT_EQ(max_abs_diff(past(ca.forward(x)), past(ca.forward(changed))), 0.0f) << from;
    EXPECT_GT(max_abs_diff(mha.forward(x), mha.forward(changed)), 1e-3f) << from;
  }
}

TEST(FusedModules, AutoPicksTheExpectedPath) {
  const Shape4 s{1, 5, 4, 2, 4, false};
  const Tensor x = random_tensor({1, 5, 4}, 51);
  const auto path = [&](MultiHeadAttention& m) {
    m.forward(x);
    return m.last_backend();
  };
  using enum AttentionBackend;
  Generator gen(52);
  MultiHeadAttention p0(mha_options(s, kAuto, 0.0f), gen);
  EXPECT_EQ(p0.last_backend(), kAuto);  // before any forward
  EXPECT_EQ(path(p0), kFused);          // training, p = 0: same maths
  MultiHeadAttention exact(mha_options(s, kAuto, 0.1f), gen);
  EXPECT_EQ(path(exact), kReference);  // training with PyTorch's dropout stream
  exact.eval();
  EXPECT_EQ(path(exact), kFused);  // evaluation: dropout is off
  MultiHeadAttention philox(mha_options(s, kAuto, 0.1f, false), gen);
  EXPECT_EQ(path(philox), kFused);  // other masks allowed
  MultiHeadAttention all(mha_options(s, kAuto, 1.0f, false), gen);
  EXPECT_EQ(path(all), kReference);  // p = 1: the kernel needs p < 1
  MultiHeadAttention forced_ref(mha_options(s, kReference), gen);
  forced_ref.eval();
  EXPECT_EQ(path(forced_ref), kReference);
  MultiHeadAttention forced_fused(mha_options(s, kFused, 0.1f), gen);
  EXPECT_EQ(path(forced_fused), kFused);
  MultiHeadAttention wide({.d_in = 4, .d_out = 300, .context_length = 5, .num_heads = 1}, gen);
  EXPECT_EQ(path(wide), kReference);  // head_dim 300 > 256

  CausalAttention bug({.d_in = 4, .d_out = 2, .context_length = 5, .softmax_dim = 1}, gen);
  bug.forward(x);
  EXPECT_EQ(bug.last_backend(), kReference);  // the softmax-over-queries bug
  CausalAttention ca({.d_in = 4, .d_out = 2, .context_length = 5}, gen);
  ca.forward(x);
  EXPECT_EQ(ca.last_backend(), kFused);
}

TEST(FusedModules, AttentionWeightsAreRecomputedAfterAFusedForward) {
  const Shape4 s{2, 9, 6, 3, 4, true};
  Generator g1(61), g2(61);
  MultiHeadAttention fused(mha_options(s, AttentionBackend::kFused), g1);
  MultiHeadAttention reference(mha_options(s, AttentionBackend::kReference), g2);
  const Tensor x = random_tensor({s.B, s.T, s.d_in}, 62);
  fused.forward(x);
  reference.forward(x);
  ASSERT_EQ(fused.attention_weights().shape(), (Shape{2, 3, 9, 9}));
  EXPECT_LE(max_abs_diff(fused.attention_weights(), reference.attention_weights()), 1e-6f);
  // A new forward replaces them.
  const Tensor x2 = random_tensor({1, 4, s.d_in}, 63);
  fused.forward(x2);
  reference.forward(x2);
  EXPECT_LE(max_abs_diff(fused.attention_weights(), reference.attention_weights()), 1e-6f);

  CausalAttention ca({.d_in = 6, .d_out = 5, .context_length = 9}, g1);
  ca.forward(x);
  EXPECT_EQ(ca.last_backend(), AttentionBackend::kFused);
  EXPECT_EQ(ca.attention_weights().shape(), (Shape{2, 9, 9}));
}

TEST(FusedModules, FusedRequestsTheKernelCannotServeAreErrors) {
  const auto message = [](const std::function<void()>& f) -> std::string {
    try {
      f();
    } catch (const std::invalid_argument& e) {
      return e.what();
    }
    return "no exception";
  };
  EXPECT_EQ(message([] {
              MultiHeadAttention m({.d_in = 4,
                                    .d_out = 600,
                                    .context_length = 5,
                                    .num_heads = 2,
                                    .backend = AttentionBackend::kFused});
            }),
            "MultiHeadAttention: backend = kFused needs head_dim <= 256, got 300; use kAuto or "
            "kReference");
  EXPECT_EQ(message([] {
              CausalAttention m({.d_in = 4,
                                 .d_out = 2,
                                 .context_length = 5,
                                 .dropout = 1.0f,
                                 .backend = AttentionBackend::kFused});
            }),
            "CausalAttention: backend = kFused needs dropout < 1, got 1; use kAuto or kReference");
  EXPECT_EQ(message([] {
              CausalAttention m({.d_in = 4,
                                 .d_out = 2,
                                 .context_length = 5,
                                 .softmax_dim = 1,
                                 .backend = AttentionBackend::kFused});
            }),
            "CausalAttention: backend = kFused computes the softmax over the keys only, got "
            "softmax_dim = 1");
  EXPECT_STREQ(to_string(AttentionBackend::kAuto), "auto");
  EXPECT_STREQ(to_string(AttentionBackend::kReference), "reference");
  EXPECT_STREQ(to_string(AttentionBackend::kFused), "fused");
}

TEST(FusedModules, BackwardChecksTheGradientShape) {
  Generator gen(71);
  MultiHeadAttention m(mha_options({1, 4, 3, 2, 2, false}, AttentionBackend::kFused), gen);
  m.forward(random_tensor({1, 4, 3}, 72));
  EXPECT_THROW(m.backward(Tensor({1, 5, 4})), std::invalid_argument);
}

// ---- finite differences through the fused path ----

TEST(FusedModules, GradcheckMultiHeadAttention) {
  Generator gen(81);
  MultiHeadAttention m(mha_options({2, 7, 5, 3, 2, true}, AttentionBackend::kFused), gen);
  gradcheck_module("fused MultiHeadAttention", m, random_tensor({2, 7, 5}, 82));
  EXPECT_EQ(m.last_backend(), AttentionBackend::kFused);

  // With Philox dropout: reseeding before each forward gives the same mask.
  Generator drop_gen(83);
  MultiHeadAttention drop(mha_options({2, 6, 4, 2, 3, false}, AttentionBackend::kFused, 0.25f),
                          drop_gen);
  gradcheck_module("fused MultiHeadAttention dropout 0.25", drop, random_tensor({2, 6, 4}, 84), {},
                   [&] { drop_gen.manual_seed(85); });
}

TEST(FusedModules, GradcheckCausalAttention) {
  Generator gen(86);
  CausalAttention m({.d_in = 4,
                     .d_out = 3,
                     .context_length = 8,
                     .qkv_bias = true,
                     .backend = AttentionBackend::kFused},
                    gen);
  gradcheck_module("fused CausalAttention", m, random_tensor({2, 8, 4}, 87));
}

TEST(FusedModules, GradcheckReferencePathStillCovered) {
  // The existing gradchecks run kAuto, which is now fused at p = 0: keep one
  // explicit reference-path check of each module.
  Generator gen(88);
  MultiHeadAttention m(mha_options({2, 7, 5, 3, 2, true}, AttentionBackend::kReference), gen);
  gradcheck_module("reference MultiHeadAttention", m, random_tensor({2, 7, 5}, 89));
  CausalAttention ca(
      {.d_in = 4, .d_out = 3, .context_length = 8, .backend = AttentionBackend::kReference}, gen);
  gradcheck_module("reference CausalAttention", ca, random_tensor({2, 8, 4}, 90));
  EXPECT_EQ(m.last_backend(), AttentionBackend::kReference);
}

}  // namespace
}  // namespace attn::test
