// Module state on shared storage: tied parameters (one value, one gradient
// that both users accumulate into), saved inputs that share the caller's
// storage instead of copying it, and Embedding's int64 input.
#include <gtest/gtest.h>

#include <stdexcept>
#include <string>

#include "attn/nn.h"
#include "attn/ops.h"
#include "attn/random.h"
#include "expect.h"

using attn::Generator;
using attn::Shape;
using attn::Tensor;
using namespace attn::nn;

namespace {

// GPT-2's weight tying in miniature: the token embedding (vocab, emb) and the
// output head Linear(emb -> vocab, no bias) hold one matrix.
struct TiedLm : Module {
  explicit TiedLm(Generator& gen)
      : tok_emb({.num_embeddings = 7, .embedding_dim = 4}, gen),
        out_head({.in_features = 4, .out_features = 7, .bias = false}, gen) {
    register_module("tok_emb", &tok_emb);
    register_module("out_head", &out_head);
    tie(out_head.weight, tok_emb.weight);
  }
  Embedding tok_emb;
  Linear out_head;
};

}  // namespace

TEST(ModuleState, TiedParameterIsOneValueAndOneGradient) {
  Generator gen(5);
  TiedLm m(gen);
  EXPECT_TRUE(m.out_head.weight.is(m.tok_emb.weight));
  EXPECT_TRUE(m.out_head.weight.value.shares_storage_with(m.tok_emb.weight.value));
  // Listed and counted once, under its first name, as PyTorch's named_parameters().
  const auto params = m.named_parameters();
  ASSERT_EQ(params.size(), 1u);
  EXPECT_EQ(params[0].first, "tok_emb.weight");
  EXPECT_EQ(m.num_parameters(), 7 * 4);
  EXPECT_TRUE(m.parameter("out_head.weight").is(m.tok_emb.weight));  // either name finds it
  // state_dict keeps both keys, as torch's does.
  const auto sd = m.state_dict();
  ASSERT_EQ(sd.size(), 2u);
  EXPECT_EQ(sd[0].first, "tok_emb.weight");
  EXPECT_EQ(sd[1].first, "out_head.weight");
  EXPECT_TRUE(sd[1].second.shares_storage_with(sd[0].second));

  // Both users' gradients accumulate into the one gradient.
  const Tensor ids = Tensor::from_int64({2, 3}, {1, 4, 6, 0, 4, 2});
  const Tensor h = m.tok_emb.forward(ids);  // (2, 3, 4)
  const Tensor logits = m.out_head.forward(h);  // (2, 3, 7)
  const Tensor dlogits = attn::randn({2, 3, 7}, gen);
  const Tensor dh = m.out_head.backward(dlogits);
  m.tok_emb.backward(dh);
  // The same sums by hand: out_head's dW = dlogitsᵀ h, tok_emb's rows += dh.
  Tensor expected = attn::matmul(attn::t(dlogits.reshape({6, 7})), h.reshape({6, 4}));  // (7, 4)
  const std::vector<int64_t> rows = ids.to_int64_vector();
  for (size_t n = 0; n < rows.size(); ++n) {
    Tensor row = expected.select(0, rows[n]);
    row += dh.reshape({6, 4}).select(0, static_cast<int64_t>(n));
  }
  EXPECT_LE(attn::max_abs_diff(m.tok_emb.weight.grad, expected), 1e-6f);
  EXPECT_TRUE(m.out_head.weight.grad.shares_storage_with(m.tok_emb.weight.grad));
  m.zero_grad();
  EXPECT_EQ(attn::max_abs_diff(m.out_head.weight.grad, Tensor({7, 4})), 0.0f);
}

TEST(ModuleState, TieChecksShapes) {
  Generator gen(1);
  Linear a({.in_features = 3, .out_features = 2}, gen);
  Linear b({.in_features = 2, .out_features = 3}, gen);
  attn::test::expect_message<std::invalid_argument>(
      [&] { tie(a.weight, b.weight); }, "tie: the parameter has shape (2, 3) but the source has shape (3, 2)");
}

// A module keeps what backward needs as handles on the caller's storage: the
// reference CausalAttention's three Linear layers each hold x, not a copy of it.
TEST(ModuleState, SavedInputsShareTheCallersStorage) {
  Generator gen(2);
  CausalAttention ca({.d_in = 3, .d_out = 2, .context_length = 6, .backend = AttentionBackend::kReference},
                     gen);
  const Tensor x = attn::randn({2, 6, 3}, gen);
  ASSERT_EQ(x.storage_use_count(), 1);
  ca.forward(x);
  EXPECT_EQ(x.storage_use_count(), 4);  // x, and W_query, W_key, W_value's saved input
  ca.forward(attn::randn({2, 6, 3}, gen));
  EXPECT_EQ(x.storage_use_count(), 1);  // released by the next forward

  MultiHeadAttention mha({.d_in = 3, .d_out = 4, .context_length = 6, .num_heads = 2,
                          .backend = AttentionBackend::kFused},
                         gen);
  mha.forward(x);
  EXPECT_EQ(x.storage_use_count(), 2);  // the fused block's saved x
}

TEST(ModuleState, EmbeddingTakesInt64Ids) {
  Generator gen(3);
  Embedding emb({.num_embeddings = 5, .embedding_dim = 2}, gen);
  const Tensor ids = Tensor::from_int64({2, 2}, {4, 0, 0, 3});
  const Tensor y = emb.forward(ids);
  ASSERT_EQ(y.shape(), (Shape{2, 2, 2}));
  EXPECT_EQ(attn::max_abs_diff(y.select(0, 0).select(0, 0), emb.weight.value.select(0, 4)), 0.0f);
  // A strided view of ids works too.
  EXPECT_EQ(attn::max_abs_diff(emb.forward(ids.transpose(0, 1)), emb.forward(ids).transpose(0, 1)), 0.0f);
  attn::test::expect_message<std::invalid_argument>([&] { emb.forward(Tensor::of({2}, {1, 2})); },
                                                    "Embedding: indices must be int64, got float32 of shape (2,)");
}

// The causal mask is a buffer made on its first read: a module used on the
// fused path (or not at all) never allocates (context_length, context_length).
TEST(ModuleState, CausalMaskIsMadeOnlyWhenRead) {
  Generator gen(4);
  MultiHeadAttention mha({.d_in = 8, .d_out = 8, .context_length = 4096, .num_heads = 2}, gen);
  mha.eval();
  EXPECT_FALSE(mha.buffer_materialized("mask"));
  mha.forward(attn::randn({1, 5, 8}, gen));  // the fused path: no mask read
  EXPECT_EQ(mha.last_backend(), AttentionBackend::kFused);
  EXPECT_FALSE(mha.buffer_materialized("mask"));
  const auto materialized = [&] {
    for (const auto& [name, t] : mha.state_dict())
      if (name == "mask") return t.shape();
    return Shape{};
  };
  EXPECT_EQ(materialized(), (Shape{4096, 4096}));  // state_dict reads (and so makes) it
  EXPECT_TRUE(mha.buffer_materialized("mask"));
  MultiHeadAttentionWrapper wrapper({.d_in = 4, .d_out = 2, .context_length = 3, .num_heads = 2}, gen);
  EXPECT_FALSE(wrapper.buffer_materialized("heads.1.mask"));
  EXPECT_EQ(wrapper.named_buffers().size(), 2u);
  EXPECT_TRUE(wrapper.buffer_materialized("heads.1.mask"));
  EXPECT_THROW((void)wrapper.buffer_materialized("heads.2.mask"), std::out_of_range);
  EXPECT_EQ(mha.mask().at({0, 1}), 1.0f);
  EXPECT_EQ(mha.mask().at({1, 0}), 0.0f);
  Head encoder({.n_embd = 4, .head_size = 2, .block_size = 0, .causal = false}, gen);
  EXPECT_TRUE(encoder.named_buffers().empty());
  EXPECT_THROW((void)encoder.tril(), std::logic_error);
}
