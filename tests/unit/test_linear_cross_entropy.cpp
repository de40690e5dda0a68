// The fused output head + cross-entropy (attn/linear_cross_entropy.h) against
// the plain path it replaces, the specification: ref::linear_forward, then
// ref::cross_entropy_forward / _backward, then ref::linear_backward (fp32), or
// nn::Linear in bf16 mode with the same cross-entropy (bf16); and
// GPTModel::forward_loss fused vs unfused (GPTOptions::fused_loss = false):
// the loss and every parameter gradient.
//
// Tolerances, as max|fused − plain| <= tol · max(floor, max|plain|):
//   fp32: loss 1e-5 (relative), dh, dW and every model gradient 1e-4 (the
//   GEMMs and the exp differ in rounding only; the log-sum-exp is a float sum);
//   bf16: loss 1e-3, gradients 2e-2 (both sides round dlogits to bf16 before
//   the backward products; an element whose float value differs in the last
//   bit can round to the neighbouring bf16, 2^-8 relative).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "attn/cross_entropy_rows.h"
#include "attn/functional.h"
#include "attn/functional_gpt.h"
#include "attn/gemm.h"
#include "attn/gpt.h"
#include "attn/layer_kernels.h"
#include "attn/linear_cross_entropy.h"
#include "attn/ops.h"
#include "attn/random.h"
#include "attn/train.h"
#include "gemm_route_guard.h"
#include "gradcheck.h"

namespace attn::test {
namespace {

using namespace attn::nn;

template <class Fn>
std::string error_of(Fn&& fn) {
  try {
    fn();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "(no exception)";
}

float max_abs(const Tensor& t) { return max_abs_diff(t, Tensor::zeros(t.shape())); }

// max|a − b| / max(floor, max|b|), printed.
float rel_err(const std::string& what, const Tensor& a, const Tensor& b, float floor = 1e-6f) {
  const float err = max_abs_diff(a, b) / std::max(floor, max_abs(b));
  std::printf("[ fused-ce ] %s: %.2e\n", what.c_str(), err);
  return err;
}

// Targets in [0, V), with every `ignore_every`-th one -100 (0: none).
Tensor targets_of(int64_t N, int64_t V, uint64_t seed, int64_t ignore_every = 0) {
  Generator gen(seed);
  std::vector<int64_t> t;
  for (int64_t r = 0; r < N; ++r) {
    const auto v = static_cast<int64_t>(gen.random() % static_cast<uint64_t>(V));
    t.push_back(ignore_every > 0 && r % ignore_every == 3 ? ref::kIgnoreIndex : v);
  }
  return Tensor::from_int64({N}, t);
}

struct Plain {
  float loss;
  Tensor dh, dW;
};

// The specification in fp32: logits = h Wᵀ, the reference cross-entropy, back.
Plain plain_fp32(const Tensor& h, const Tensor& W, const Tensor& targets) {
  const Tensor logits = ref::linear_forward(h, W, nullptr);
  ref::CrossEntropySaved saved;
  const float loss = ref::cross_entropy_forward(logits, targets.reshape({h.size(0)}), &saved);
  Tensor dW(W.shape());
  const Tensor dh =
      ref::linear_backward(ref::cross_entropy_backward(1.0f, saved), h, W, dW, nullptr);
  return {loss, dh, dW};
}

// The specification in bf16: nn::Linear in bf16 mode (the GPT's out_head), then the same loss.
Plain plain_bf16(const Tensor& h, const Tensor& W, const Tensor& targets) {
  Linear head({.in_features = W.size(1),
               .out_features = W.size(0),
               .bias = false,
               .dtype = DType::kBFloat16});
  head.weight.value = W.clone();
  head.weight.grad = Tensor(W.shape());
  ref::CrossEntropySaved saved;
  const float loss = ref::cross_entropy_forward(head.forward(h), targets, &saved);
  const Tensor dh = head.backward(ref::cross_entropy_backward(1.0f, saved));
  return {loss, dh, head.weight.grad};
}

struct Case {
  int64_t N, E, V, chunk, ignore_every;
};

std::string fmt_case(const Case& c, DType dtype) {
  return std::string(dtype_name(dtype)) + " N=" + std::to_string(c.N) +
         " E=" + std::to_string(c.E) + " V=" + std::to_string(c.V) +
         " chunk=" + std::to_string(c.chunk) + (c.ignore_every > 0 ? " with ignored rows" : "");
}

void check_case(const Case& c, DType dtype) {
  const std::string what = fmt_case(c, dtype);
  const Tensor h = random_tensor({c.N, c.E}, 100 + c.N);
  const Tensor W = mul(random_tensor({c.V, c.E}, 200 + c.V), 0.5f);
  const Tensor targets = targets_of(c.N, c.V, 300 + c.N, c.ignore_every);
  const bool bf16 = dtype == DType::kBFloat16;
  const Plain p = bf16 ? plain_bf16(h, W, targets) : plain_fp32(h, W, targets);
  Tensor dh, dW(W.shape());
  const float loss =
      linear_cross_entropy(h, W, targets, {.chunk_rows = c.chunk, .dtype = dtype}, &dh, &dW);
  // Without gradients: the same loss.
  const float loss_only =
      linear_cross_entropy(h, W, targets, {.chunk_rows = c.chunk, .dtype = dtype});
  EXPECT_EQ(loss, loss_only) << what;
  const float loss_tol = bf16 ? 1e-3f : 1e-5f, grad_tol = bf16 ? 2e-2f : 1e-4f;
  EXPECT_LE(std::fabs(loss - p.loss), loss_tol * std::max(1.0f, std::fabs(p.loss)))
      << what << ": " << loss << " vs " << p.loss;
  EXPECT_LE(rel_err(what + " dh", dh, p.dh), grad_tol) << what;
  EXPECT_LE(rel_err(what + " dW", dW, p.dW), grad_tol) << what;
  // dW accumulates: a second call adds the same again.
  linear_cross_entropy(h, W, targets, {.chunk_rows = c.chunk, .dtype = dtype}, nullptr, &dW);
  EXPECT_LE(rel_err(what + " dW twice", dW, mul(p.dW, 2.0f)), grad_tol) << what;
}

const std::vector<Case> kCases = {
    {1, 8, 11, 0, 0},       // one row
    {37, 16, 50, 8, 0},     // 37 rows in chunks of 8: the last has 5
    {37, 16, 50, 8, 5},     // ... with ignore_index rows
    {64, 24, 97, 16, 0},    // a multiple of the chunk
    {1100, 32, 257, 0, 7},  // the default chunk (512): 512 + 512 + 76 rows
};

TEST(LinearCrossEntropy, Fp32MatchesThePlainPath) {
  for (const Case& c : kCases) check_case(c, DType::kFloat32);
}

TEST(LinearCrossEntropy, Bf16MatchesThePlainBf16Path) {
  for (const Case& c : kCases) check_case(c, DType::kBFloat16);
}

// Every route of gemm_bf16 this build and CPU has, forced (the widened route
// widens W and h once and each chunk's dlogits in place, not per product).
TEST(LinearCrossEntropy, Bf16OnEveryGemmRouteMatchesThePlainBf16Path) {
  for (const std::string& route : gemm::gemm_bf16_routes()) {
    SCOPED_TRACE("gemm_bf16 route " + route);
    const GemmBf16RouteGuard guard(route);
    ASSERT_TRUE(guard.forced());
    for (const Case& c : kCases) check_case(c, DType::kBFloat16);
  }
}

// On the widened route the fused loss widens W, h and each chunk's
// bf16(dlogits) once: the bits of the same steps with every product through
// gemm_bf16_widened (each widening its operands itself), chunk by chunk.
TEST(LinearCrossEntropy, Bf16WidenedRouteGivesThePerProductBits) {
  const int64_t N = 300, E = 24, V = 97, C = 128;
  const Tensor h = random_tensor({N, E}, 5), W = mul(random_tensor({V, E}, 6), 0.5f);
  const Tensor targets = targets_of(N, V, 7, 9);
  Tensor dh, dW(W.shape());
  float loss = 0.0f;
  {
    const GemmBf16RouteGuard guard("widened");
    ASSERT_TRUE(guard.forced());
    loss =
        linear_cross_entropy(h, W, targets, {.chunk_rows = C, .dtype = DType::kBFloat16}, &dh, &dW);
  }
  // The per-product steps.
  const Tensor hb = h.to(DType::kBFloat16), Wb = W.to(DType::kBFloat16);
  const std::vector<int64_t> t = targets.to_int64_vector();
  int64_t counted = 0;
  for (const int64_t v : t) counted += v != ref::kIgnoreIndex;
  Tensor logits({C, V}), want_dh({N, E}), want_dW(W.shape());
  Tensor dlb = Tensor::empty({C, V}, DType::kBFloat16);
  std::vector<double> row_loss(static_cast<size_t>(N));
  using gemm::Trans;
  const BFloat16 *hp = hb.data_ptr<BFloat16>(), *Wp = Wb.data_ptr<BFloat16>();
  for (int64_t r0 = 0; r0 < N; r0 += C) {
    const int64_t m = std::min(C, N - r0);
    gemm::gemm_bf16_widened(Trans::kNo, Trans::kYes, m, V, E, 1.0f, hp + r0 * E, E, Wp, E, 0.0f,
                            logits.data(), V);
    kernels::cross_entropy_rows(row_loss.data() + r0, logits.data(), V, t.data() + r0, m, V,
                                ref::kIgnoreIndex, true, 1.0f / float(counted));
    kernels::round_to_bf16(dlb.data_ptr<BFloat16>(), logits.data(), m * V);
    const BFloat16* dl = dlb.data_ptr<BFloat16>();
    gemm::gemm_bf16_widened(Trans::kNo, Trans::kNo, m, E, V, 1.0f, dl, V, Wp, E, 0.0f,
                            want_dh.data() + r0 * E, E);
    gemm::gemm_bf16_widened(Trans::kYes, Trans::kNo, V, E, m, 1.0f, dl, V, hp + r0 * E, E, 1.0f,
                            want_dW.data(), E);
  }
  double total = 0.0;
  for (const double l : row_loss) total += l;
  EXPECT_EQ(loss, static_cast<float>(total / static_cast<double>(counted)));
  EXPECT_EQ(max_abs_diff(dh, want_dh), 0.0f);
  EXPECT_EQ(max_abs_diff(dW, want_dW), 0.0f);
}

TEST(LinearCrossEntropy, TheChunkSizeChangesNothingButRounding) {
  const Tensor h = random_tensor({300, 32}, 1), W = random_tensor({120, 32}, 2);
  const Tensor targets = targets_of(300, 120, 3, 11);
  Tensor dh1, dW1({120, 32}), dh2, dW2({120, 32});
  const float l1 = linear_cross_entropy(h, W, targets, {.chunk_rows = 7}, &dh1, &dW1);
  const float l2 = linear_cross_entropy(h, W, targets, {.chunk_rows = 300}, &dh2, &dW2);
  EXPECT_NEAR(l1, l2, 1e-6f * std::fabs(l2));
  EXPECT_LE(rel_err("chunk 7 vs 300 dh", dh1, dh2), 1e-5f);
  EXPECT_LE(rel_err("chunk 7 vs 300 dW", dW1, dW2), 1e-5f);
}

TEST(LinearCrossEntropy, AllRowsIgnoredGivesNaNAndZeroGradients) {
  const Tensor h = random_tensor({4, 8}, 1), W = random_tensor({5, 8}, 2);
  const Tensor targets = Tensor::from_int64({4}, {-100, -100, -100, -100});
  Tensor dh, dW({5, 8});
  EXPECT_TRUE(std::isnan(linear_cross_entropy(h, W, targets, {}, &dh, &dW)));
  EXPECT_EQ(max_abs(dh), 0.0f);
  EXPECT_EQ(max_abs(dW), 0.0f);
}

TEST(LinearCrossEntropy, ErrorsNameTheValues) {
  const Tensor h = random_tensor({20, 8}, 1), W = random_tensor({50, 8}, 2);
  std::vector<int64_t> t(20, 1);
  t[13] = 70;
  EXPECT_EQ(error_of([&] { linear_cross_entropy(h, W, Tensor::from_int64({20}, t)); }),
            "linear_cross_entropy: target 70 at position 13 is out of range for 50 classes");
  t[13] = -1;
  EXPECT_EQ(error_of([&] { linear_cross_entropy(h, W, Tensor::from_int64({20}, t)); }),
            "linear_cross_entropy: target -1 at position 13 is out of range for 50 classes");
  const Tensor ok = targets_of(20, 50, 4);
  EXPECT_EQ(error_of([&] {
              linear_cross_entropy(h, random_tensor({50, 9}, 2), ok);
            }),
            "linear_cross_entropy: expected h (N, E) and W (V, E) with V >= 1, got h (20, 8) and W "
            "(50, 9)");
  EXPECT_EQ(error_of([&] { linear_cross_entropy(h, W, targets_of(19, 50, 4)); }),
            "linear_cross_entropy: targets must be int64 of shape (20,), got int64 of shape (19,)");
  EXPECT_EQ(error_of([&] { linear_cross_entropy(h, W, ok, {.chunk_rows = -1}); }),
            "linear_cross_entropy: chunk_rows must be >= 0 (0: 512), got -1");
  EXPECT_EQ(error_of([&] { linear_cross_entropy(h, W, ok, {.dtype = DType::kInt64}); }),
            "linear_cross_entropy: dtype must be float32 or bfloat16, got int64");
  Tensor dW({50, 7});
  EXPECT_EQ(
      error_of([&] { linear_cross_entropy(h, W, ok, {}, nullptr, &dW); }),
      "linear_cross_entropy: dW must be a contiguous float32 tensor of W's shape (50, 8), got "
      "float32 of shape (50, 7)");
}

// ---- GPTModel::forward_loss, fused vs the plain path -----------------------------------

Tensor ids_of(int64_t B, int64_t T, int64_t V, uint64_t seed, int64_t ignore_every = 0) {
  return targets_of(B * T, V, seed, ignore_every).reshape({B, T});
}

// Every parameter's gradient of the fused model against the plain one's; the
// worst relative error is returned. Names out_head.weight (or tok_emb.weight,
// tied), final_norm.scale/shift and every block weight.
float compare_models(const std::string& what, GPTModel& fused, GPTModel& plain, float tol) {
  const auto a = fused.named_parameters(), b = plain.named_parameters();
  EXPECT_EQ(a.size(), b.size());
  float worst = 0.0f;
  for (size_t i = 0; i < a.size(); ++i) {
    const float scale = std::max(max_abs(b[i].second->grad), 1e-6f);
    const float err = max_abs_diff(a[i].second->grad, b[i].second->grad) / scale;
    worst = std::max(worst, err);
    EXPECT_LE(err, tol) << what << " " << a[i].first;
  }
  std::printf("[ fused-ce ] GPT %s: worst gradient error %.2e over %zu parameters\n", what.c_str(),
              worst, a.size());
  return worst;
}

void check_model(int64_t B, int64_t T, bool tied, DType dtype) {
  const GPTConfig cfg{.vocab_size = 97,
                      .context_length = 256,
                      .emb_dim = 32,
                      .n_heads = 4,
                      .n_layers = 2,
                      .tie_embeddings = tied};
  const std::string what = std::string(dtype_name(dtype)) + (tied ? " tied" : " untied") +
                           " B=" + std::to_string(B) + " T=" + std::to_string(T);
  manual_seed(5);
  GPTModel fused(cfg, {.dtype = dtype});
  manual_seed(5);
  GPTModel plain(cfg, {.dtype = dtype, .fused_loss = false});
  ASSERT_TRUE(fused.fused_loss());
  ASSERT_FALSE(plain.fused_loss());
  const Tensor ids = ids_of(B, T, 97, 6), targets = ids_of(B, T, 97, 7, 9);
  const float lf = fused.forward_loss(ids, targets), lp = plain.forward_loss(ids, targets);
  const bool bf16 = dtype == DType::kBFloat16;
  EXPECT_LE(std::fabs(lf - lp), (bf16 ? 1e-3f : 1e-5f) * lp) << what << ": " << lf << " vs " << lp;
  fused.backward_loss();
  plain.backward_loss();
  compare_models(what, fused, plain, bf16 ? 2e-2f : 1e-4f);
  if (tied) {
    EXPECT_TRUE(fused.out_head.weight.grad.shares_storage_with(fused.tok_emb.weight.grad));
  }
  // Evaluation: the fused loss without gradients is the training pass's loss (no dropout).
  fused.eval();
  EXPECT_EQ(fused.forward_loss(ids, targets), lf) << what;
}

TEST(GptFusedLoss, Fp32UntiedMatchesThePlainPath) {
  check_model(2, 33, false, DType::kFloat32);   // 66 rows: one chunk
  check_model(3, 200, false, DType::kFloat32);  // 600 rows: 512 + 88
}

TEST(GptFusedLoss, Fp32TiedMatchesThePlainPath) {
  check_model(2, 33, true, DType::kFloat32);
  check_model(3, 200, true, DType::kFloat32);
}

TEST(GptFusedLoss, Bf16MatchesThePlainBf16Path) {
  check_model(3, 200, false, DType::kBFloat16);
  check_model(3, 200, true, DType::kBFloat16);
}

TEST(GptFusedLoss, BackwardLossScalesByDloss) {
  const GPTConfig cfg{
      .vocab_size = 31, .context_length = 16, .emb_dim = 16, .n_heads = 2, .n_layers = 1};
  manual_seed(3);
  GPTModel a(cfg);
  manual_seed(3);
  GPTModel b(cfg, {.fused_loss = false});
  const Tensor ids = ids_of(2, 16, 31, 1), targets = ids_of(2, 16, 31, 2);
  a.forward_loss(ids, targets);
  b.forward_loss(ids, targets);
  a.backward_loss(0.25f);
  b.backward_loss(0.25f);
  compare_models("dloss 0.25", a, b, 1e-4f);
}

TEST(GptFusedLoss, TheReferenceLayersTakeThePlainPath) {
  const GPTConfig cfg{
      .vocab_size = 31, .context_length = 16, .emb_dim = 16, .n_heads = 2, .n_layers = 1};
  GPTModel model(cfg, {.layers = LayerImpl::kReference});
  EXPECT_FALSE(model.fused_loss());
}

TEST(GptFusedLoss, ErrorsNameTheValues) {
  const GPTConfig cfg{
      .vocab_size = 31, .context_length = 16, .emb_dim = 16, .n_heads = 2, .n_layers = 1};
  manual_seed(3);
  GPTModel model(cfg);
  const Tensor ids = ids_of(2, 8, 31, 1);
  std::vector<int64_t> t(16, 0);
  t[11] = 31;
  EXPECT_EQ(error_of([&] {
              model.forward_loss(ids, Tensor::from_int64({2, 8}, t));
            }),
            "linear_cross_entropy: target 31 at position 11 is out of range for 31 classes");
  EXPECT_EQ(
      error_of([&] { model.forward_loss(ids, ids_of(2, 7, 31, 2)); }),
      "GPTModel: targets must be int64 of the token ids' shape (2, 8), got int64 of shape (2, 7)");
  GPTModel fresh(cfg);
  EXPECT_EQ(error_of([&] { fresh.backward_loss(); }),
            "GPTModel: backward_loss() called before forward_loss()");
  fresh.eval();
  fresh.forward_loss(ids, ids_of(2, 8, 31, 2));
  EXPECT_EQ(error_of([&] { fresh.backward_loss(); }),
            "GPTModel: backward_loss() after a fused forward_loss() in evaluation mode, which "
            "computes no gradients (call train() before forward_loss())");
  // The fused pass does not run out_head.forward: backward(dlogits) has no forward to use.
  EXPECT_EQ(error_of([&] {
              fresh.backward(Tensor({2, 8, 31}));
            }),
            "GPTModel: backward() called before forward()");
}

// attn train's default is the fused loss; --fused-loss false (TrainOptions::fused_loss) the
// plain path; both train the same (the losses of 5 steps and an evaluation agree within float
// rounding), and the choice is kept in the checkpoint's train_args.
TEST(GptFusedLoss, TrainerTakesTheFusedLossByDefault) {
  std::string text;
  for (int i = 0; i < 400; ++i) text += "the quick brown fox jumps over the lazy dog. ";
  train::TrainOptions o;
  o.n_layers = 1;
  o.n_heads = 2;
  o.emb_dim = 16;
  o.context_length = 16;
  o.batch_size = 4;
  o.max_iters = 5;
  o.eval_iters = 2;
  EXPECT_TRUE(o.fused_loss);
  train::Trainer fused(text, o);
  o.fused_loss = false;
  train::Trainer plain(text, o);
  EXPECT_TRUE(fused.model().fused_loss());
  EXPECT_FALSE(plain.model().fused_loss());
  for (int i = 0; i < 5; ++i) {
    const float a = fused.step(), b = plain.step();
    EXPECT_NEAR(a, b, 1e-4f * b) << "step " << i;
  }
  const train::EvalResult ea = fused.evaluate(), eb = plain.evaluate();
  EXPECT_NEAR(ea.val_loss, eb.val_loss, 1e-4 * eb.val_loss);
  EXPECT_FALSE(train::TrainOptions::from_json(o.to_json()).fused_loss);
  EXPECT_TRUE(train::TrainOptions::from_json("{}").fused_loss);
}

}  // namespace
}  // namespace attn::test
