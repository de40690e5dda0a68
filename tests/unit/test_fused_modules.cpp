// The fused path of CausalAttention, MultiHeadAttention, Head and MultiHead
// (attn/fused.h) against the reference path: outputs and every gradient on
// many shapes, with and without dropout (the reference fed the kernel's Philox
// mask), causality, the choice kAuto makes, the recomputed attention weights,
// finite differences, and the error messages.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

#include "attn/functional.h"
#include "attn/fused.h"
#include "attn/gemm.h"
#include "attn/kernels.h"
#include "attn/nn.h"
#include "attn/ops.h"
#include "attn/random.h"
#include "expect.h"
#include "gemm_route_guard.h"
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

// One module built twice from the same seed, once per path (options(backend)
// gives its options), run forward and backward on x with output gradient R:
// each path is the one asked for, and the output, dx and every parameter
// gradient agree within kRelTol of the output's scale.
template <class M, class Options>
void expect_paths_agree(Options options, uint64_t seed, const Tensor& x, const Tensor& R,
                        const std::string& what) {
  Generator g_fused(seed), g_ref(seed);  // the same weights in both
  M fused(options(AttentionBackend::kFused), g_fused);
  M reference(options(AttentionBackend::kReference), g_ref);
  const auto a = forward_backward(fused, x, R);
  const auto b = forward_backward(reference, x, R);
  EXPECT_EQ(fused.last_backend(), AttentionBackend::kFused) << what;
  EXPECT_EQ(reference.last_backend(), AttentionBackend::kReference) << what;
  const auto names = result_names(fused);
  ASSERT_EQ(a.size(), b.size()) << what;
  for (size_t n = 0; n < a.size(); ++n)
    EXPECT_LE(rel_err(a[n], b[n], max_abs(b[0])), kRelTol) << what << " " << names[n];
}

// The path a module's forward on x takes.
template <class M>
AttentionBackend path_of(M& m, const Tensor& x) {
  m.forward(x);
  return m.last_backend();
}

// The kAuto rule of attn/nn.h, the same for every module with two paths;
// options(backend, p, exact_dropout) gives the module's options.
template <class M, class Options>
void expect_auto_rule(Options options, const Tensor& x, Generator& gen) {
  using enum AttentionBackend;
  M p0(options(kAuto, 0.0f, true), gen);
  EXPECT_EQ(p0.last_backend(), kAuto);  // before any forward
  EXPECT_EQ(path_of(p0, x), kFused);    // training, p = 0: same maths
  M exact(options(kAuto, 0.1f, true), gen);
  EXPECT_EQ(path_of(exact, x), kReference);  // training with PyTorch's dropout stream
  exact.eval();
  EXPECT_EQ(path_of(exact, x), kFused);  // evaluation: dropout is off
  exact.train();
  EXPECT_EQ(path_of(exact, x), kReference);
  M philox(options(kAuto, 0.1f, false), gen);
  EXPECT_EQ(path_of(philox, x), kFused);  // other masks allowed
  M all(options(kAuto, 1.0f, false), gen);
  EXPECT_EQ(path_of(all, x), kReference);  // p = 1: the kernel needs p < 1
  M forced_ref(options(kReference, 0.0f, true), gen);
  forced_ref.eval();
  EXPECT_EQ(path_of(forced_ref, x), kReference);
  M forced_fused(options(kFused, 0.1f, true), gen);
  EXPECT_EQ(path_of(forced_fused, x), kFused);
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
    expect_paths_agree<MultiHeadAttention>(
        [&](AttentionBackend backend) { return mha_options(s, backend); }, 11,
        random_tensor({s.B, s.T, s.d_in}, 21), random_tensor({s.B, s.T, s.H * s.hd}, 22),
        name_of(s));
  }
}

// dtype = kBFloat16 (mixed precision, attn/fused.h) against the fp32 fused
// path of the same module: the output and every gradient within bf16's
// tolerance of the scale of the result or of y, whichever is larger. The
// key bias's gradient is left out: zero in exact arithmetic (softmax ignores
// a constant added to a row of scores), it is rounding noise in both modes,
// larger in bf16 (the fp32 tests above check it). x, the weights, qkv,
// the context and dy are rounded to bf16 (2^-9 each) and the kernel rounds
// P and dS, so the bound is 3e-2 (largest seen: printed); the gradients stay
// fp32 tensors (the master copy) and the path taken is the fused one.
void bf16_mixed_precision_tracks_float32();
// On every gemm_bf16 route (the block's operands are made once in the
// route's form, attn/bf16_operand.h).
TEST(FusedModules, Bf16MixedPrecisionTracksFloat32) {
  for (const std::string& route : gemm::gemm_bf16_routes()) {
    const GemmBf16RouteGuard guard(route);
    ASSERT_TRUE(guard.forced());
    SCOPED_TRACE("gemm_bf16 route " + route);
    bf16_mixed_precision_tracks_float32();
  }
}

void bf16_mixed_precision_tracks_float32() {
  float worst = 0.0f;
  uint64_t seed = 40;
  for (const Shape4& s : shapes()) {
    for (bool bias : {false, true}) {
      Shape4 shape = s;
      shape.bias = bias;
      const Tensor x = random_tensor({s.B, s.T, s.d_in}, 31 + seed);
      const Tensor R = random_tensor({s.B, s.T, s.H * s.hd}, 32 + seed);
      Generator g32(seed), g16(seed);
      MultiHeadAttention m32(mha_options(shape, AttentionBackend::kFused), g32);
      MultiHeadAttentionOptions o16 = mha_options(shape, AttentionBackend::kAuto);
      o16.dtype = DType::kBFloat16;
      MultiHeadAttention m16(o16, g16);
      const auto a = forward_backward(m16, x, R);
      const auto b = forward_backward(m32, x, R);
      EXPECT_EQ(m16.last_backend(), AttentionBackend::kFused);
      const auto names = result_names(m16);
      for (size_t n = 0; n < a.size(); ++n) {
        EXPECT_EQ(a[n].dtype(), DType::kFloat32) << names[n];
        if (names[n] == "W_key.bias.grad") continue;  // zero in exact maths: noise in both
        const float err = rel_err(a[n], b[n], max_abs(b[0]));
        worst = std::max(worst, err);
        EXPECT_LE(err, 3e-2f) << name_of(shape) << " " << names[n];
        if (names[n] == "out_proj.bias.grad") {  // Σ_rows dy: fp32 in both modes
          EXPECT_EQ(max_abs_diff(a[n], b[n]), 0.0f) << name_of(shape);
        }
      }
      EXPECT_GT(max_abs_diff(a[0], b[0]), 0.0f) << name_of(shape) << ": bf16 gave the fp32 bits";
      ++seed;
    }
  }
  std::printf("bf16 module vs fp32 module (%s, gemm_bf16 %s): largest relative error %.2e\n",
              kernels::flash_attention_bf16_path(), gemm::gemm_bf16_route(), worst);
}

TEST(FusedModules, Bf16NeedsTheFusedPath) {
  const Shape4 s{1, 8, 16, 2, 8, false};
  MultiHeadAttentionOptions o = mha_options(s, AttentionBackend::kReference);
  o.dtype = DType::kBFloat16;
  expect_message<std::invalid_argument>(
      [&] { MultiHeadAttention m(o); },
      "MultiHeadAttention: dtype = bfloat16 runs on the fused path only, which "
      "backend = kReference excludes (head_dim 8, max 256)");
  o.backend = AttentionBackend::kAuto;
  o.dtype = DType::kInt64;
  expect_message<std::invalid_argument>(
      [&] { MultiHeadAttention m(o); },
      "MultiHeadAttention: dtype must be float32 or bfloat16, got int64");
  // Training with dropout: kAuto would take the reference path in fp32; bf16 takes the fused one.
  o.dtype = DType::kBFloat16;
  o.dropout = 0.1f;
  MultiHeadAttention m(o);
  const Tensor x = random_tensor({1, 8, 16}, 5);
  EXPECT_EQ(path_of(m, x), AttentionBackend::kFused);
  EXPECT_FALSE(has_non_finite(m.backward(random_tensor({1, 8, 16}, 6))));
}

// A bf16 input (a bf16 LayerNorm's output in the GPT) is what the bf16 module
// would round its float32 input to: the same bits out. The fp32 module refuses it.
TEST(FusedModules, Bf16ModuleTakesBf16InputAsRounded) {
  const Shape4 s{2, 9, 16, 2, 8, true};
  MultiHeadAttentionOptions o = mha_options(s, AttentionBackend::kAuto);
  o.dtype = DType::kBFloat16;
  Generator g1(3), g2(3);
  MultiHeadAttention a(o, g1), b(o, g2);
  const Tensor x = random_tensor({2, 9, 16}, 7), dy = random_tensor({2, 9, 16}, 8);
  EXPECT_EQ(max_abs_diff(a.forward(x), b.forward(x.to(DType::kBFloat16))), 0.0f);
  EXPECT_EQ(max_abs_diff(a.backward(dy), b.backward(dy)), 0.0f);
  EXPECT_EQ(max_abs_diff(a.W_query.weight.grad, b.W_query.weight.grad), 0.0f);
  MultiHeadAttention f32(mha_options(s, AttentionBackend::kFused));
  expect_message<std::invalid_argument>(
      [&] { f32.forward(x.to(DType::kBFloat16)); },
      "attention_block_forward: x must be float32 with dtype = float32, got bfloat16");
}

TEST(FusedModules, StepsReuseTheirBuffersWithoutCarryingValuesOver) {
  // One module stepped through shapes that grow, shrink and repeat (its fused
  // buffers are reused whenever a shape repeats, reallocated otherwise)
  // gives at each step the same bits as a fresh module with the same weights.
  // Without qkv biases, so every product must overwrite, not accumulate.
  const std::vector<Shape4> steps = {{2, 17, 24, 3, 8, false},
                                     {2, 17, 24, 3, 8, false},
                                     {1, 40, 24, 3, 8, false},
                                     {2, 17, 24, 3, 8, false},
                                     {2, 5, 24, 3, 8, false}};
  const auto options = mha_options(steps[2], AttentionBackend::kFused);  // the longest T
  Generator g_stepped(5);
  MultiHeadAttention stepped(options, g_stepped);
  uint64_t seed = 40;
  for (const Shape4& s : steps) {
    Generator g_fresh(5);
    MultiHeadAttention fresh(options, g_fresh);
    const Tensor x = random_tensor({s.B, s.T, s.d_in}, seed++);
    const Tensor R = random_tensor({s.B, s.T, s.H * s.hd}, seed++);
    const auto a = forward_backward(stepped, x, R);
    const auto b = forward_backward(fresh, x, R);
    const auto names = result_names(stepped);
    ASSERT_EQ(a.size(), b.size());
    for (size_t n = 0; n < a.size(); ++n)
      EXPECT_EQ(a[n].to_vector(), b[n].to_vector()) << name_of(s) << " " << names[n];
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
    expect_paths_agree<CausalAttention>(options, 12, random_tensor({s.B, s.T, s.d_in}, 23),
                                        random_tensor({s.B, s.T, d_out}, 24),
                                        "d_out=" + std::to_string(d_out) + " " + name_of(s));
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

// The reference maths of the fused block (attn/fused.h) on a module's own
// Linear layers, with a given (B, H, T, T) dropout noise: returns y, dx and the
// parameter gradients in named_parameters() order (accumulated from zero into
// the module's grads). out_proj may be nullptr (y = context).
template <class M>
std::vector<Tensor> reference_block_with_noise(M& m, Linear& W_query, Linear& W_key,
                                               Linear& W_value, Linear* out_proj, int64_t H,
                                               const ref::AttentionOptions& attention,
                                               const Tensor& x, const Tensor& R,
                                               const Tensor& noise) {
  const int64_t B = x.size(0), T = x.size(1), d_out = W_query.weight.value.size(0), hd = d_out / H;
  const auto bias = [](Linear& l) { return l.options().bias ? &l.bias.value : nullptr; };
  const auto bias_grad = [](Linear& l) { return l.options().bias ? &l.bias.grad : nullptr; };
  const auto heads = [&](const Tensor& y) {  // (B, T, d_out) -> (B, H, T, hd)
    return transpose(y.reshape({B, T, H, hd}), 1, 2);
  };
  const auto merge = [&](const Tensor& y) {  // (B, H, T, hd) -> (B, T, d_out)
    return transpose(y, 1, 2).reshape({B, T, d_out});
  };
  Linear* lin[3] = {&W_query, &W_key, &W_value};
  Tensor qkv[3];  // q, k, v (B, H, T, hd)
  for (int j = 0; j < 3; ++j)
    qkv[j] = heads(ref::linear_forward(x, lin[j]->weight.value, bias(*lin[j])));
  ref::AttentionSaved saved;
  const Tensor context =
      merge(ref::attention_forward(qkv[0], qkv[1], qkv[2], attention, &noise, &saved));

  m.zero_grad();
  Tensor y = context, dcontext = R;  // (B, T, d_out)
  if (out_proj != nullptr) {
    y = ref::linear_forward(context, out_proj->weight.value, bias(*out_proj));
    dcontext = ref::linear_backward(R, context, out_proj->weight.value, out_proj->weight.grad,
                                    bias_grad(*out_proj));
  }
  const ref::AttentionGrads g =
      ref::attention_backward(heads(dcontext), qkv[0], qkv[1], qkv[2], saved, attention);
  const Tensor* dproj[3] = {&g.dq, &g.dk, &g.dv};
  Tensor dx;
  for (int j = 0; j < 3; ++j) {
    const Tensor dxj = ref::linear_backward(merge(*dproj[j]), x, lin[j]->weight.value,
                                            lin[j]->weight.grad, bias_grad(*lin[j]));
    if (j == 0) {
      dx = dxj;
    } else {
      dx += dxj;
    }
  }
  std::vector<Tensor> out = {y, dx};
  for (auto& [name, p] : m.named_parameters()) out.push_back(p->grad);
  return out;
}

// The kernel's Philox mask for one forward, as a (B, H, T, T) tensor.
Tensor philox_noise(int64_t B, int64_t H, int64_t T, int64_t hd, bool causal, float p,
                    uint64_t seed) {
  kernels::FlashAttentionParams params;
  params.B = B, params.T = T, params.H = H, params.hd = hd;
  params.causal = causal, params.dropout_p = p, params.dropout_seed = seed;
  Tensor noise({B, H, T, T});  // (B, H, T, T)
  kernels::flash_dropout_noise(noise.data(), params);
  return noise;
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

      const Tensor noise = philox_noise(s.B, s.H, s.T, s.hd, /*causal=*/true, p, seed);
      const auto names = result_names(m);
      const auto b = reference_block_with_noise(m, m.W_query, m.W_key, m.W_value, &m.out_proj, s.H,
                                                {.causal = true}, x, R, noise);
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
    Tensor changed = x.clone();
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
  using enum AttentionBackend;
  Generator gen(52);
  expect_auto_rule<MultiHeadAttention>(
      [&](AttentionBackend backend, float p, bool exact) {
        return mha_options(s, backend, p, exact);
      },
      x, gen);
  MultiHeadAttention wide({.d_in = 4, .d_out = 300, .context_length = 5, .num_heads = 1}, gen);
  EXPECT_EQ(path_of(wide, x), kReference);  // head_dim 300 > 256

  CausalAttention bug({.d_in = 4, .d_out = 2, .context_length = 5, .softmax_dim = 1}, gen);
  EXPECT_EQ(path_of(bug, x), kReference);  // the softmax-over-queries bug
  CausalAttention ca({.d_in = 4, .d_out = 2, .context_length = 5}, gen);
  EXPECT_EQ(path_of(ca, x), kFused);
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
  for (bool causal : {true, false}) {
    Head head({.n_embd = 6,
               .head_size = 4,
               .block_size = 8,
               .causal = causal,
               .backend = AttentionBackend::kReference},
              gen);
    gradcheck_module(std::string("reference Head ") + (causal ? "decoder" : "encoder"), head,
                     random_tensor({2, 5, 6}, 91));
    EXPECT_EQ(head.last_backend(), AttentionBackend::kReference);
  }
}

// ---- Head and MultiHead (section 5): one head of width head_size, no biases,
// no output projection, scale head_size^-0.5, causal or not ----

struct HeadShape {
  int64_t B, T, n_embd, head_size;
  bool causal;
};
std::string name_of(const HeadShape& s) {
  return "B=" + std::to_string(s.B) + " T=" + std::to_string(s.T) +
         " n_embd=" + std::to_string(s.n_embd) + " head_size=" + std::to_string(s.head_size) +
         (s.causal ? " decoder" : " encoder");
}

HeadOptions head_options(const HeadShape& s, AttentionBackend backend, float dropout = 0.0f,
                         bool exact_dropout = true) {
  return {.n_embd = s.n_embd,
          .head_size = s.head_size,
          .block_size = s.T + 3,
          .dropout = dropout,
          .causal = s.causal,
          .backend = backend,
          .exact_dropout = exact_dropout};
}

// The reference path's attention options of a Head: the same scale expression.
ref::AttentionOptions head_attention(const HeadShape& s) {
  return {.causal = s.causal,
          .scale = static_cast<float>(std::pow(static_cast<double>(s.head_size), -0.5))};
}

TEST(FusedModules, HeadMatchesReference) {
  // T = 1, odd T and both sides of the kernel's widths; head_size 1 .. 256.
  const std::vector<HeadShape> all = {
      {1, 1, 8, 16, true},    {1, 1, 5, 3, false},     {2, 15, 16, 16, true},
      {2, 17, 24, 32, false}, {1, 64, 32, 64, true},   {1, 65, 96, 64, false},
      {3, 33, 20, 24, true},  {2, 6, 3, 1, false},     {1, 31, 48, 48, true},
      {2, 63, 64, 17, false}, {1, 129, 64, 128, true}, {1, 200, 40, 128, false},
      {1, 40, 32, 256, true}, {2, 7, 9, 5, false},
  };
  for (const HeadShape& s : all) {
    expect_paths_agree<Head>([&](AttentionBackend backend) { return head_options(s, backend); }, 14,
                             random_tensor({s.B, s.T, s.n_embd}, 27),
                             random_tensor({s.B, s.T, s.head_size}, 28), name_of(s));
  }
}

TEST(FusedModules, MultiHeadHeadsTakeTheBackend) {
  for (bool causal : {true, false}) {
    for (int64_t T : {1, 9, 17}) {
      const MultiHeadOptions o = {
          .n_embd = 12, .num_heads = 3, .head_size = 5, .block_size = 17, .causal = causal};
      MultiHeadOptions of = o, orf = o;
      of.backend = AttentionBackend::kFused;
      orf.backend = AttentionBackend::kReference;
      Generator g_fused(15), g_ref(15);
      MultiHead fused(of, g_fused);
      MultiHead reference(orf, g_ref);
      const Tensor x = random_tensor({2, T, 12}, 29), R = random_tensor({2, T, 12}, 30);
      const auto a = forward_backward(fused, x, R);
      const auto b = forward_backward(reference, x, R);
      for (const auto& head : fused.heads)
        EXPECT_EQ(head->last_backend(), AttentionBackend::kFused);
      for (const auto& head : reference.heads)
        EXPECT_EQ(head->last_backend(), AttentionBackend::kReference);
      const auto names = result_names(fused);
      ASSERT_EQ(a.size(), b.size());
      for (size_t n = 0; n < a.size(); ++n)
        EXPECT_LE(rel_err(a[n], b[n], max_abs(b[0])), kRelTol)
            << (causal ? "decoder" : "encoder") << " T=" << T << " " << names[n];
    }
  }
}

TEST(FusedModules, HeadDropoutUsesThePhiloxMaskSeededFromTheGenerator) {
  for (const HeadShape& s : {HeadShape{2, 17, 24, 32, true}, HeadShape{1, 65, 16, 16, false},
                             HeadShape{1, 1, 8, 8, true}, HeadShape{2, 9, 6, 3, false}}) {
    for (float p : {0.1f, 0.5f}) {
      Generator gen(35);
      Head m(head_options(s, AttentionBackend::kAuto, p, /*exact_dropout=*/false), gen);
      const Tensor x = random_tensor({s.B, s.T, s.n_embd}, 36);
      const Tensor R = random_tensor({s.B, s.T, s.head_size}, 37);
      Generator probe = gen;  // the head draws one random64() per forward
      const uint64_t seed = probe.random64();
      const auto a = forward_backward(m, x, R);
      EXPECT_EQ(m.last_backend(), AttentionBackend::kFused);
      EXPECT_EQ(gen.random(), probe.random()) << "exactly one random64() per forward";

      const Tensor noise = philox_noise(s.B, 1, s.T, s.head_size, s.causal, p, seed);
      const auto names = result_names(m);
      const auto b = reference_block_with_noise(m, m.query, m.key, m.value, nullptr, 1,
                                                head_attention(s), x, R, noise);
      ASSERT_EQ(a.size(), b.size());
      for (size_t n = 0; n < a.size(); ++n)
        EXPECT_LE(rel_err(a[n], b[n], max_abs(b[0])), kRelTol)
            << name_of(s) << " p=" << p << " " << names[n];
    }
  }
}

TEST(FusedModules, FusedDecoderHeadDoesNotSeeTheFuture) {
  const Tensor x = random_tensor({2, 24, 8}, 43);
  for (bool causal : {true, false}) {
    Generator gen(44);
    Head head({.n_embd = 8,
               .head_size = 16,
               .block_size = 24,
               .causal = causal,
               .backend = AttentionBackend::kFused},
              gen);
    for (int64_t from : {1, 7, 16, 17, 23}) {
      Tensor changed = x.clone();
      for (int64_t b = 0; b < 2; ++b)
        for (int64_t t = from; t < 24; ++t)
          for (int64_t c = 0; c < 8; ++c) changed.at({b, t, c}) += 2.0f + float(c);
      const float past = max_abs_diff(slice(head.forward(x), 1, 0, from),
                                      slice(head.forward(changed), 1, 0, from));
      if (causal) {
        EXPECT_EQ(past, 0.0f) << from;
      } else {
        EXPECT_GT(past, 1e-3f) << "an encoder head sees the future, from " << from;
      }
    }
  }
}

TEST(FusedModules, HeadAutoPicksTheExpectedPath) {
  const HeadShape s{1, 5, 4, 3, true};
  const Tensor x = random_tensor({1, 5, 4}, 53);
  using enum AttentionBackend;
  Generator gen(54);
  expect_auto_rule<Head>([&](AttentionBackend backend, float p,
                             bool exact) { return head_options(s, backend, p, exact); },
                         x, gen);
  Head wide(head_options({1, 5, 4, 300, false}, kAuto), gen);
  EXPECT_EQ(path_of(wide, x), kReference);  // head_size 300 > 256
  Head encoder(head_options({1, 5, 4, 3, false}, kAuto), gen);
  EXPECT_EQ(path_of(encoder, x), kFused);

  // MultiHead: every head chooses as a Head would; proj and the output dropout are plain.
  MultiHead multi({.n_embd = 4, .num_heads = 2, .head_size = 3, .block_size = 5, .dropout = 0.1f},
                  gen);
  multi.forward(x);
  for (const auto& head : multi.heads) EXPECT_EQ(head->last_backend(), kReference);
  multi.eval();
  multi.forward(x);
  for (const auto& head : multi.heads) EXPECT_EQ(head->last_backend(), kFused);
  MultiHead philox_multi({.n_embd = 4,
                          .num_heads = 2,
                          .head_size = 3,
                          .block_size = 5,
                          .dropout = 0.1f,
                          .exact_dropout = false},
                         gen);
  philox_multi.forward(x);
  for (const auto& head : philox_multi.heads) EXPECT_EQ(head->last_backend(), kFused);
}

TEST(FusedModules, HeadAttentionWeightsAreRecomputedAfterAFusedForward) {
  for (bool causal : {true, false}) {
    const HeadShape s{2, 9, 6, 4, causal};
    Generator g1(64), g2(64);
    Head fused(head_options(s, AttentionBackend::kFused), g1);
    Head reference(head_options(s, AttentionBackend::kReference), g2);
    const Tensor x = random_tensor({s.B, s.T, s.n_embd}, 65);
    fused.forward(x);
    reference.forward(x);
    ASSERT_EQ(fused.attention_weights().shape(), (Shape{2, 9, 9}));
    EXPECT_LE(max_abs_diff(fused.attention_weights(), reference.attention_weights()), 1e-6f)
        << (causal ? "decoder" : "encoder");
    // A new forward (a reference one in between) replaces them.
    fused.eval();
    const Tensor x2 = random_tensor({1, 4, s.n_embd}, 66);
    fused.forward(x2);
    reference.forward(x2);
    EXPECT_EQ(fused.last_backend(), AttentionBackend::kFused);
    ASSERT_EQ(fused.attention_weights().shape(), (Shape{1, 4, 4}));
    EXPECT_LE(max_abs_diff(fused.attention_weights(), reference.attention_weights()), 1e-6f);
  }
  // Switching paths on one module: a reference forward after a fused one keeps its own weights.
  Generator g3(67), g4(67);
  Head h({.n_embd = 6, .head_size = 4, .block_size = 9, .dropout = 0.2f}, g3);
  Head expected({.n_embd = 6, .head_size = 4, .block_size = 9, .dropout = 0.2f}, g4);
  const Tensor x = random_tensor({2, 9, 6}, 68);
  h.eval();
  h.forward(x);  // fused
  EXPECT_EQ(h.last_backend(), AttentionBackend::kFused);
  h.attention_weights();
  h.train();
  expected.train();
  h.forward(x);  // reference, PyTorch's dropout stream
  expected.forward(x);
  EXPECT_EQ(h.last_backend(), AttentionBackend::kReference);
  EXPECT_EQ(max_abs_diff(h.attention_weights(), expected.attention_weights()), 0.0f);
}

TEST(FusedModules, HeadFusedRequestsAndInputsAreChecked) {
  using IA = std::invalid_argument;
  expect_message<IA>(
      [] {
        Head m(
            {.n_embd = 4, .head_size = 300, .block_size = 5, .backend = AttentionBackend::kFused});
      },
      "Head: backend = kFused needs head_dim <= 256, got 300; use kAuto or kReference");
  expect_message<IA>(
      [] {
        Head m({.n_embd = 4,
                .head_size = 2,
                .block_size = 5,
                .dropout = 1.0f,
                .backend = AttentionBackend::kFused});
      },
      "Head: backend = kFused needs dropout < 1, got 1; use kAuto or kReference");
  expect_message<IA>(
      [] {
        MultiHead m({.n_embd = 4,
                     .num_heads = 2,
                     .head_size = 257,
                     .block_size = 5,
                     .backend = AttentionBackend::kFused});
      },
      "MultiHead: backend = kFused needs head_dim <= 256, got 257; use kAuto or kReference");

  // A decoder head keeps its block_size limit on the fused path; an encoder head has none.
  Generator gen(73);
  Head decoder({.n_embd = 8, .head_size = 4, .block_size = 8, .backend = AttentionBackend::kFused},
               gen);
  expect_message<IA>(
      [&] {
        decoder.forward(random_tensor({1, 9, 8}, 74));
      },
      "Head: input has 9 tokens but block_size is 8");
  expect_message<IA>(
      [&] {
        decoder.forward(random_tensor({1, 4, 6}, 74));
      },
      "Head: input last dim 6 does not match n_embd 8");
  Head encoder({.n_embd = 8,
                .head_size = 4,
                .block_size = 8,
                .causal = false,
                .backend = AttentionBackend::kFused},
               gen);
  EXPECT_EQ(encoder.forward(random_tensor({1, 9, 8}, 75)).shape(), (Shape{1, 9, 4}));
  EXPECT_EQ(encoder.last_backend(), AttentionBackend::kFused);
  expect_message<IA>(
      [&] {
        encoder.backward(Tensor({1, 9, 5}));
      },
      "Head: gradient shape (1, 9, 5) does not match output shape (1, 9, 4)");
  Head fresh({.n_embd = 8, .head_size = 4, .block_size = 8, .backend = AttentionBackend::kFused},
             gen);
  expect_message<std::logic_error>(
      [&] {
        fresh.backward(Tensor({1, 1, 4}));
      },
      "Head: backward() called before forward()");
}

TEST(FusedModules, GradcheckHead) {
  for (bool causal : {true, false}) {
    for (int64_t T : {1, 6}) {
      Generator gen(92);
      Head m({.n_embd = 5,
              .head_size = 3,
              .block_size = 8,
              .causal = causal,
              .backend = AttentionBackend::kFused},
             gen);
      const std::string name =
          std::string("fused Head ") + (causal ? "decoder" : "encoder") + " T=" + std::to_string(T);
      gradcheck_module(name, m, random_tensor({2, T, 5}, 93));
      EXPECT_EQ(m.last_backend(), AttentionBackend::kFused);
    }
  }
  // With Philox dropout: reseeding before each forward gives the same mask.
  Generator drop_gen(94);
  Head drop({.n_embd = 4,
             .head_size = 3,
             .block_size = 6,
             .dropout = 0.25f,
             .causal = false,
             .exact_dropout = false},
            drop_gen);
  gradcheck_module("fused Head encoder dropout 0.25", drop, random_tensor({2, 6, 4}, 95), {},
                   [&] { drop_gen.manual_seed(96); });
  EXPECT_EQ(drop.last_backend(), AttentionBackend::kFused);
}

TEST(FusedModules, GradcheckMultiHead) {
  Generator gen(97);
  MultiHead m({.n_embd = 6,
               .num_heads = 2,
               .head_size = 3,
               .block_size = 8,
               .backend = AttentionBackend::kFused},
              gen);
  gradcheck_module("fused MultiHead", m, random_tensor({2, 5, 6}, 98));
  for (const auto& head : m.heads) EXPECT_EQ(head->last_backend(), AttentionBackend::kFused);
}

}  // namespace
}  // namespace attn::test
