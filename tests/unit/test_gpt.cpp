// The GPT model (attn/gpt.h), its maths (attn/functional_gpt.h) and its
// optimizer (attn/optim.h) without PyTorch: finite differences for every
// backward, GPT_CONFIG_124M's size, behaviour (causality, eval mode, the two
// attention paths, errors) and the optimizer's rules.
// Finite differences: |numerical - analytic| <= 1e-3 + 1e-2·|numerical|,
// eps = 3e-3 (gradcheck.h), loss Σ y ⊙ R with R ~ N(0, 1).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <vector>

#include "attn/functional_gpt.h"
#include "attn/gpt.h"
#include "attn/ops.h"
#include "attn/optim.h"
#include "attn/random.h"
#include "gradcheck.h"

namespace attn::test {
namespace {

using namespace attn::nn;

// A GPT small enough for finite differences.
GPTConfig tiny(float drop_rate = 0.0f, bool qkv_bias = false) {
  return {.vocab_size = 11, .context_length = 6, .emb_dim = 8, .n_heads = 2, .n_layers = 2,
          .drop_rate = drop_rate, .qkv_bias = qkv_bias};
}

Tensor token_ids(int64_t B, int64_t T, int64_t vocab, uint64_t seed) {
  Generator gen(seed);
  std::vector<int64_t> ids;
  for (int64_t i = 0; i < B * T; ++i) ids.push_back(static_cast<int64_t>(gen.random() % vocab));
  return Tensor::from_int64({B, T}, ids);
}

template <class Fn>
std::string error_of(Fn&& fn) {
  try {
    fn();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "(no exception)";
}

// ---- finite differences ----------------------------------------------------------------

TEST(GptGradcheck, LayerNorm) {
  LayerNorm ln(7);
  ln.scale.value = add(random_tensor({7}, 1), 1.0f);
  ln.shift.value = random_tensor({7}, 2);
  gradcheck_module("LayerNorm", ln, random_tensor({2, 3, 7}, 3));
}

TEST(GptGradcheck, Gelu) {
  GELU gelu;
  gradcheck_module("GELU", gelu, mul(random_tensor({3, 4, 5}, 4), 2.0f));
}

TEST(GptGradcheck, FeedForward) {
  manual_seed(5);
  FeedForward ff(tiny());
  gradcheck_module("FeedForward", ff, random_tensor({2, 3, 8}, 6));
}

TEST(GptGradcheck, TransformerBlockBothPathsWithAndWithoutDropout) {
  struct Case {
    std::string name;
    GPTConfig cfg;
    GPTOptions options;
    AttentionBackend expected;
  };
  const std::vector<Case> cases = {
      {"no dropout (fused)", tiny(), {}, AttentionBackend::kFused},
      {"no dropout, qkv_bias, reference", tiny(0.0f, true), {.attention_backend = AttentionBackend::kReference},
       AttentionBackend::kReference},
      {"dropout 0.2 (reference, PyTorch's masks)", tiny(0.2f), {}, AttentionBackend::kReference},
      {"dropout 0.2, exact_dropout false (fused)", tiny(0.2f), {.exact_dropout = false}, AttentionBackend::kFused},
  };
  for (const Case& c : cases) {
    manual_seed(7);
    TransformerBlock block(c.cfg, c.options);
    // The same masks at every forward: reseed the generator the dropouts draw from.
    gradcheck_module("TransformerBlock " + c.name, block, random_tensor({2, 5, 8}, 8), {.max_coords = 100},
                     [] { manual_seed(9); });
    EXPECT_EQ(block.att.last_backend(), c.expected) << c.name;
  }
}

TEST(GptGradcheck, CrossEntropyWithAnIgnoredTarget) {
  Tensor logits = mul(random_tensor({2, 3, 5}, 10), 2.0f);
  const Tensor targets = Tensor::from_int64({2, 3}, {0, 4, ref::kIgnoreIndex, 2, 2, 1});
  ref::CrossEntropySaved saved;
  ref::cross_entropy_forward(logits, targets, &saved);
  EXPECT_EQ(saved.counted, 5);
  const Tensor dlogits = ref::cross_entropy_backward(1.0f, saved);
  for (int64_t v = 0; v < 5; ++v) EXPECT_EQ(dlogits.at({0, 2, v}), 0.0f) << "the ignored row";
  check_tensor_grad("cross_entropy logits", logits, dlogits,
                    [&] { return static_cast<double>(ref::cross_entropy_forward(logits, targets, nullptr)); }, {});
}

// The whole model: the loss Σ logits ⊙ R, every parameter (token ids have no gradient).
void gradcheck_gpt(const std::string& name, const GPTConfig& cfg, const GPTOptions& options) {
  manual_seed(11);
  GPTModel model(cfg, options);
  const Tensor ids = token_ids(2, 5, cfg.vocab_size, 12);
  const auto reseed = [] { manual_seed(13); };
  reseed();
  const Tensor R = random_tensor(model.forward(ids).shape(), 14);
  model.zero_grad();
  reseed();
  model.forward(ids);
  model.backward(R);
  const auto loss = [&] {
    reseed();
    return dot_loss(model.forward(ids), R);
  };
  for (auto& [pname, p] : model.named_parameters()) {
    const Tensor analytic = p->grad.clone();
    check_tensor_grad(name + " " + pname, p->value, analytic, loss, {.max_coords = 100});
  }
}

TEST(GptGradcheck, WholeModel) { gradcheck_gpt("GPTModel", tiny(), {}); }

TEST(GptGradcheck, WholeModelWithDropout) { gradcheck_gpt("GPTModel dropout 0.2", tiny(0.2f, true), {}); }

TEST(GptGradcheck, CrossEntropyThroughTheModel) {
  manual_seed(15);
  GPTModel model(tiny());
  const Tensor ids = token_ids(2, 4, 11, 16), targets = token_ids(2, 4, 11, 17);
  CrossEntropyLoss ce;
  ce.forward(model.forward(ids), targets);
  model.backward(ce.backward());
  Parameter& w = model.parameter("trf_blocks.1.ff.layers.0.weight");
  const Tensor analytic = w.grad.clone();
  check_tensor_grad("GPTModel + cross-entropy ff weight", w.value, analytic,
                    [&] { return static_cast<double>(ce.forward(model.forward(ids), targets)); },
                    {.eps = 1e-2f, .abs_tol = 2e-4, .rel_tol = 1e-2, .max_coords = 100});
}

// ---- the book's GPT-2 small --------------------------------------------------------------

TEST(Gpt, Config124MHasTheBooksParameterCountAndRunsForward) {
  manual_seed(123);
  GPTModel model(GPT_CONFIG_124M);
  EXPECT_EQ(model.num_parameters(), 163009536);  // the book's count, out_head not tied
  const auto named = model.named_parameters();
  ASSERT_EQ(named.size(), 2u + 12u * 13u + 3u);  // qkv_bias false: 13 per block
  EXPECT_EQ(named.front().first, "tok_emb.weight");
  EXPECT_EQ(named[2].first, "trf_blocks.0.att.W_query.weight");
  EXPECT_EQ(named.back().first, "out_head.weight");
  EXPECT_EQ(model.parameter("trf_blocks.11.norm2.scale").value.shape(), Shape{768});
  model.eval();
  const Tensor logits = model.forward(token_ids(1, 8, 50257, 18));
  EXPECT_EQ(logits.shape(), (Shape{1, 8, 50257}));
  EXPECT_FALSE(has_non_finite(logits));
}

// ---- behaviour ------------------------------------------------------------------------------

TEST(Gpt, ParameterNamesFollowTheBooksStateDict) {
  manual_seed(1);
  GPTModel model(tiny(0.1f, true));
  std::vector<std::string> names;
  for (const auto& [name, p] : model.named_parameters()) names.push_back(name);
  const std::vector<std::string> block = {
      "att.W_query.weight", "att.W_query.bias", "att.W_key.weight", "att.W_key.bias", "att.W_value.weight",
      "att.W_value.bias", "att.out_proj.weight", "att.out_proj.bias", "ff.layers.0.weight", "ff.layers.0.bias",
      "ff.layers.2.weight", "ff.layers.2.bias", "norm1.scale", "norm1.shift", "norm2.scale", "norm2.shift"};
  std::vector<std::string> expected = {"tok_emb.weight", "pos_emb.weight"};
  for (int b = 0; b < 2; ++b)
    for (const auto& n : block) expected.push_back("trf_blocks." + std::to_string(b) + "." + n);
  for (const char* n : {"final_norm.scale", "final_norm.shift", "out_head.weight"}) expected.push_back(n);
  EXPECT_EQ(names, expected);
}

TEST(Gpt, EarlierLogitsDoNotDependOnLaterTokens) {
  manual_seed(2);
  GPTModel model(tiny());
  Tensor ids = token_ids(1, 6, 11, 3);
  const Tensor before = model.forward(ids);
  std::vector<int64_t> changed = ids.to_int64_vector();
  changed[4] = (changed[4] + 1) % 11;
  changed[5] = (changed[5] + 5) % 11;
  const Tensor after = model.forward(Tensor::from_int64({1, 6}, changed));
  EXPECT_EQ(max_abs_diff(slice(before, 1, 0, 4), slice(after, 1, 0, 4)), 0.0f);
  EXPECT_GT(max_abs_diff(slice(before, 1, 4, 6), slice(after, 1, 4, 6)), 0.0f);
}

TEST(Gpt, EvalModeIsDeterministicAndTrainingWithDropoutIsNot) {
  manual_seed(4);
  GPTModel model(tiny(0.5f));
  const Tensor ids = token_ids(2, 6, 11, 5);
  const Tensor a = model.forward(ids), b = model.forward(ids);
  EXPECT_GT(max_abs_diff(a, b), 0.0f);
  model.eval();
  EXPECT_EQ(max_abs_diff(model.forward(ids), model.forward(ids)), 0.0f);
  EXPECT_EQ(model.trf_blocks[1].att.last_backend(), AttentionBackend::kFused);
}

TEST(Gpt, FusedAndReferenceAttentionAgreeUpToRounding) {
  const GPTConfig cfg{.vocab_size = 50, .context_length = 40, .emb_dim = 64, .n_heads = 4, .n_layers = 2};
  manual_seed(6);
  GPTModel fused(cfg);
  manual_seed(6);
  GPTModel reference(cfg, {.attention_backend = AttentionBackend::kReference});
  const Tensor ids = token_ids(2, 33, 50, 7);
  const Tensor y_fused = fused.forward(ids), y_ref = reference.forward(ids);
  EXPECT_EQ(fused.trf_blocks[0].att.last_backend(), AttentionBackend::kFused);
  EXPECT_EQ(reference.trf_blocks[0].att.last_backend(), AttentionBackend::kReference);
  EXPECT_LE(max_abs_diff(y_fused, y_ref), 1e-5f);
  const Tensor dy = random_tensor(y_ref.shape(), 8);
  fused.backward(dy);
  reference.backward(dy);
  const auto a = fused.named_parameters(), b = reference.named_parameters();
  for (size_t i = 0; i < a.size(); ++i) {
    float scale = 1e-3f;
    for (float v : b[i].second->grad.values()) scale = std::max(scale, std::fabs(v));
    EXPECT_LE(max_abs_diff(a[i].second->grad, b[i].second->grad), 1e-5f * scale) << a[i].first;
  }
}

// Mixed precision (GPTOptions::dtype = kBFloat16, as torch.autocast): the same
// weights give logits and float32 gradients within bf16 rounding of the fp32
// model's (bf16 keeps 8 bits: 2^-9 = 2e-3 relative per operand; two layers of
// products, layer norms that rescale, and gradients that pass back through
// all of it, reach about 1e-2 here), and every product really ran in bf16.
float max_abs(const Tensor& t) { return max_abs_diff(t, Tensor::zeros(t.shape())); }

TEST(Gpt, Bf16MixedPrecisionTracksFloat32) {
  const GPTConfig cfg{.vocab_size = 50,
                      .context_length = 40,
                      .emb_dim = 64,
                      .n_heads = 4,
                      .n_layers = 2,
                      .qkv_bias = true};
  manual_seed(9);
  GPTModel f32(cfg);
  manual_seed(9);
  GPTModel b16(cfg, {.dtype = DType::kBFloat16});
  const Tensor ids = token_ids(2, 33, 50, 10), targets = token_ids(2, 33, 50, 11);
  CrossEntropyLoss loss32, loss16;
  const Tensor y32 = f32.forward(ids), y16 = b16.forward(ids);
  ASSERT_EQ(y16.dtype(), DType::kFloat32);
  const float scale = max_abs(y32);
  EXPECT_LE(max_abs_diff(y16, y32), 2e-2f * scale);
  EXPECT_GT(max_abs_diff(y16, y32), 0.0f) << "bf16 gave the fp32 bits";
  EXPECT_NEAR(loss16.forward(y16, targets), loss32.forward(y32, targets), 1e-2f);
  f32.backward(loss32.backward());
  b16.backward(loss16.backward());
  const auto a = b16.named_parameters(), b = f32.named_parameters();
  float worst = 0.0f;
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_EQ(a[i].second->grad.dtype(), DType::kFloat32) << a[i].first;
    if (a[i].first.find("W_key.bias") != std::string::npos) continue;  // zero in exact maths
    const float g = std::max(max_abs(b[i].second->grad), 1e-6f);
    const float err = max_abs_diff(a[i].second->grad, b[i].second->grad) / g;
    worst = std::max(worst, err);
    EXPECT_LE(err, 5e-2f) << a[i].first;
  }
  std::printf("bf16 GPT vs fp32 GPT: logits %.2e, largest gradient error %.2e (relative)\n",
              max_abs_diff(y16, y32) / scale, worst);
  EXPECT_EQ(b16.trf_blocks[0].att.last_backend(), AttentionBackend::kFused);
}

TEST(Gpt, TiedOutputHeadSharesTheTokenEmbedding) {
  manual_seed(8);
  GPTModel model(tiny());
  tie(model.out_head.weight, model.tok_emb.weight);
  EXPECT_EQ(model.num_parameters(), 11 * 8 + 6 * 8 + 2 * (4 * 64 + 8 + 8 * 32 + 32 + 32 * 8 + 8 + 32) + 16);
  CrossEntropyLoss ce;
  ce.forward(model.forward(token_ids(1, 4, 11, 9)), token_ids(1, 4, 11, 10));
  model.backward(ce.backward());
  EXPECT_TRUE(model.out_head.weight.grad.shares_storage_with(model.tok_emb.weight.grad));
}

TEST(Gpt, ErrorsNameTheValues) {
  EXPECT_EQ(error_of([] { GPTModel m({.vocab_size = 10, .context_length = 4, .emb_dim = 10, .n_heads = 3}); }),
            "GPTModel: emb_dim (10) must be divisible by n_heads (3)");
  EXPECT_EQ(error_of([] { GPTModel m({.vocab_size = 0, .context_length = 4, .emb_dim = 8, .n_heads = 2}); }),
            "GPTModel: vocab_size must be positive, got 0");
  manual_seed(1);
  GPTModel model(tiny());
  EXPECT_EQ(error_of([&] { model.forward(token_ids(1, 7, 11, 1)); }),
            "GPTModel: input has 7 tokens but context_length is 6");
  EXPECT_EQ(error_of([&] { model.forward(Tensor({1, 3})); }),
            "GPTModel: expected token ids (B, T) of int64, got float32 of shape (1, 3)");
  EXPECT_EQ(error_of([&] { model.forward(Tensor::from_int64({1, 2}, {3, 11})); }),
            "Embedding: index 11 is out of range for num_embeddings 11");
  GPTModel fresh(tiny());
  EXPECT_EQ(error_of([&] { fresh.backward(Tensor({1, 2, 11})); }), "GPTModel: backward() called before forward()");
  CrossEntropyLoss ce;
  EXPECT_EQ(error_of([&] { ce.forward(Tensor({2, 3, 5}), Tensor::from_int64({2, 3}, {0, 1, 2, 3, 4, 5})); }),
            "cross_entropy_forward: target 5 at position 5 is out of range for 5 classes");
  EXPECT_EQ(error_of([&] { ce.forward(Tensor({2, 3, 5}), Tensor::from_int64({3, 2}, {0, 1, 2, 3, 4, 0})); }),
            "cross_entropy_forward: targets shape (3, 2) does not match logits shape (2, 3, 5) without its last dim");
  LayerNorm ln(4);
  EXPECT_EQ(error_of([&] { ln.forward(Tensor({2, 5})); }), "LayerNorm: input shape (2, 5) does not end in emb_dim 4");
}

TEST(Gpt, CrossEntropyOfUniformLogitsIsLogV) {
  CrossEntropyLoss ce;
  const float loss = ce.forward(Tensor({2, 3, 50}), Tensor::from_int64({2, 3}, {0, 1, 2, 3, 4, 49}));
  EXPECT_NEAR(loss, std::log(50.0f), 1e-6f);
  EXPECT_TRUE(std::isnan(ce.forward(Tensor({1, 1, 3}), Tensor::from_int64({1, 1}, {ref::kIgnoreIndex}))));
}

// ---- the optimizer --------------------------------------------------------------------------

TEST(GptOptim, DecayGroupsSplitByDimension) {
  manual_seed(1);
  GPTModel model(tiny());
  const auto groups = optim::decay_groups(model, 0.1);
  ASSERT_EQ(groups.size(), 2u);
  EXPECT_EQ(groups[0].weight_decay, 0.1);
  EXPECT_EQ(groups[1].weight_decay, 0.0);
  for (const Parameter* p : groups[0].params) EXPECT_GE(p->value.dim(), 2);
  for (const Parameter* p : groups[1].params) EXPECT_EQ(p->value.dim(), 1);
  EXPECT_EQ(groups[0].params.size() + groups[1].params.size(), model.named_parameters().size());
  EXPECT_EQ(groups[0].params.size(), 2u + 2u * 6u + 1u);  // embeddings, 6 matrices per block, out_head
}

TEST(GptOptim, FirstAdamWStepIsDecayThenLrTimesTheSignOfTheGradient) {
  Parameter p{Tensor::of({4}, {1.0f, -2.0f, 0.5f, 3.0f}), Tensor::of({4}, {0.3f, -4.0f, 1e-3f, 0.0f})};
  optim::AdamW opt({{.params = {&p}, .weight_decay = 0.1}}, {.lr = 0.01, .beta1 = 0.9, .beta2 = 0.95});
  opt.step();
  // m̂ = g, v̂ = g², so the update is lr · g / (|g| + eps): the sign of g (0 for g = 0).
  const std::vector<float> expected = {1.0f * 0.999f - 0.01f, -2.0f * 0.999f + 0.01f, 0.5f * 0.999f - 0.01f,
                                       3.0f * 0.999f};
  for (int64_t i = 0; i < 4; ++i) EXPECT_NEAR(p.value[i], expected[static_cast<size_t>(i)], 1e-6f) << i;
  EXPECT_EQ(opt.steps(), 1);
  EXPECT_EQ(error_of([] { Parameter q{Tensor({1}), Tensor({1})};
                          optim::AdamW bad({{.params = {&q}}}, {.beta2 = 1.0}); }),
            "AdamW: invalid beta parameter at index 1: 1");
}

TEST(GptOptim, ClipGradNormScalesOnlyAboveTheLimit) {
  Parameter a{Tensor({2}), Tensor::of({2}, {3.0f, 0.0f})}, b{Tensor({1}), Tensor::of({1}, {4.0f})};
  EXPECT_FLOAT_EQ(optim::clip_grad_norm({&a, &b}, 10.0), 5.0f);
  EXPECT_EQ(a.grad[0], 3.0f);  // under the limit: unchanged
  EXPECT_FLOAT_EQ(optim::clip_grad_norm({&a, &b}, 1.0), 5.0f);
  EXPECT_NEAR(a.grad[0], 0.6f, 1e-6f);
  EXPECT_NEAR(b.grad[0], 0.8f, 1e-6f);
}

TEST(GptOptim, WarmupThenCosineToMinLr) {
  const optim::CosineSchedule s{.learning_rate = 1.0, .min_lr = 0.1, .warmup_iters = 4, .lr_decay_iters = 14};
  EXPECT_DOUBLE_EQ(optim::get_lr(0, s), 0.2);
  EXPECT_DOUBLE_EQ(optim::get_lr(3, s), 0.8);
  EXPECT_DOUBLE_EQ(optim::get_lr(4, s), 1.0);
  EXPECT_NEAR(optim::get_lr(9, s), 0.55, 1e-12);  // half way: (1 + 0.1) / 2
  EXPECT_NEAR(optim::get_lr(14, s), 0.1, 1e-12);
  EXPECT_DOUBLE_EQ(optim::get_lr(100, s), 0.1);
}

TEST(GptOptim, TrainingOnOneBatchDrivesTheLossDown) {
  manual_seed(3);
  GPTModel model({.vocab_size = 20, .context_length = 8, .emb_dim = 16, .n_heads = 2, .n_layers = 2,
                  .drop_rate = 0.1f});
  optim::AdamW opt(model, {.lr = 1e-2, .beta1 = 0.9, .beta2 = 0.95, .weight_decay = 0.1});
  const Tensor x = token_ids(4, 8, 20, 4), y = token_ids(4, 8, 20, 5);
  CrossEntropyLoss ce;
  float first = 0.0f, last = 0.0f;
  for (int it = 0; it < 40; ++it) {
    opt.set_lr(optim::get_lr(it, {.learning_rate = 1e-2, .min_lr = 1e-3, .warmup_iters = 5, .lr_decay_iters = 40}));
    const float loss = ce.forward(model.forward(x), y);
    opt.zero_grad();
    model.backward(ce.backward());
    optim::clip_grad_norm(model, 1.0);
    opt.step();
    if (it == 0) first = loss;
    last = loss;
  }
  EXPECT_NEAR(first, std::log(20.0f), 0.5f);
  EXPECT_LT(last, 0.5f * first);
}

}  // namespace
}  // namespace attn::test
