// walkthrough_ch3.cpp - `attn walkthrough` (chapter 3): the SPEC's worked
// examples, step by step.
//
// Each section below follows the chapter's PyTorch code line by line (the same
// code is in tests/torch/oracle_walkthrough.py) and shows every intermediate
// tensor with attn::to_string, which prints exactly what PyTorch prints.
#include "walkthrough_ch3.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>
#include <utility>

#include "attn/functional.h"
#include "attn/nn.h"
#include "attn/ops.h"
#include "attn/print.h"
#include "attn/random.h"

namespace attn::cli {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

// "Your journey starts with one step": six tokens, 3-d embeddings (SPEC, "The example input").
Tensor example_inputs() {
  return Tensor::of({6, 3}, {0.43f, 0.15f, 0.89f,    // Your     (x^1)
                             0.55f, 0.87f, 0.66f,    // journey  (x^2)
                             0.57f, 0.85f, 0.64f,    // starts   (x^3)
                             0.22f, 0.58f, 0.33f,    // with     (x^4)
                             0.77f, 0.25f, 0.10f,    // one      (x^5)
                             0.05f, 0.80f, 0.55f});  // step     (x^6)
}

const std::vector<std::string> kTokens = {"Your", "journey", "starts", "with", "one", "step"};

// Python's `d_k**0.5` for an int d_k: a double square root, then the float the
// tensor op uses.
float sqrt_of(int64_t d_k) { return static_cast<float>(std::sqrt(static_cast<double>(d_k))); }

// Collects the tensors of one section and does its seeding.
class Steps {
 public:
  Steps(std::string section, std::optional<uint64_t> seed_override, std::vector<Shown>* out)
      : section_(std::move(section)), seed_override_(seed_override), out_(out) {}

  // torch.manual_seed(spec_seed), or the --seed override; returns the seed used, for the text.
  uint64_t seed(uint64_t spec_seed) {
    const uint64_t s = seed_override_.value_or(spec_seed);
    manual_seed(s);
    return s;
  }

  // Shows `value` as `name`: what it is, and the PyTorch line that computes it.
  void show(std::string name, const Tensor& value, const std::string& what,
            const std::string& torch_line) {
    if (out_ == nullptr) return;
    out_->push_back(
        Shown{section_, std::move(name),
              fmt::format("{}: {}   shape {}", what, torch_line, shape_str(value.shape())), value,
              what, torch_line, std::nullopt});
  }

  // Marks the tensor shown last as an attention matrix (or attaches its module's
  // weights) for the pictures.
  void attention(AttentionMatrix matrix) {
    if (out_ != nullptr && !out_->empty()) out_->back().attention = std::move(matrix);
  }
  // The common case: the shown (T, T) matrix itself, tokens on both axes.
  void attention_square(const Tensor& matrix, const std::vector<std::string>& tokens, bool causal,
                        bool scores = false) {
    attention(AttentionMatrix{matrix, tokens, tokens, causal, scores, ""});
  }

  // The same seeds, nothing shown: a section recomputing an earlier one's result.
  Steps quiet() const { return Steps(section_, seed_override_, nullptr); }

 private:
  std::string section_;
  std::optional<uint64_t> seed_override_;
  std::vector<Shown>* out_;
};

// ---- 1. simplified self-attention, no trainable weights ---------------------------------

void simplified(Steps& s) {
  const Tensor inputs = example_inputs();  // (6, 3)
  s.show("inputs", inputs, "the six tokens, one 3-d embedding per row",
         "inputs = torch.tensor([[0.43, 0.15, 0.89], ...])");

  const Tensor query = select(inputs, 1);  // x_2, "journey"
  const int64_t T = inputs.size(0);
  Tensor attn_scores_2({T});
  for (int64_t i = 0; i < T; ++i) attn_scores_2[i] = dot(select(inputs, i), query);
  s.show("attn_scores_2", attn_scores_2, "scores of the query x_2 (\"journey\") with every token",
         "attn_scores_2[i] = torch.dot(x_i, query) for i, x_i in enumerate(inputs)");

  const Tensor attn_weights_2_tmp = normalize_sum(attn_scores_2, 0);
  s.show("attn_weights_2_tmp", attn_weights_2_tmp, "weights by plain division by the sum",
         "attn_weights_2_tmp = attn_scores_2 / attn_scores_2.sum()");
  s.show("attn_weights_2_tmp.sum()", sum(attn_weights_2_tmp, 0), "their sum",
         "attn_weights_2_tmp.sum()");

  const Tensor attn_weights_2_naive = softmax_naive(attn_scores_2, 0);
  s.show("attn_weights_2_naive", attn_weights_2_naive,
         "weights by the naive softmax (overflows for large scores)",
         "attn_weights_2_naive = torch.exp(attn_scores_2) / torch.exp(attn_scores_2).sum(dim=0)");
  const Tensor attn_weights_2 = softmax(attn_scores_2, 0);
  s.show("attn_weights_2", attn_weights_2, "weights by the stable softmax, exp(w - max) / sum",
         "attn_weights_2 = torch.softmax(attn_scores_2, dim=0)");
  s.attention({attn_weights_2.reshape({1, T}), {kTokens[1]}, kTokens, false, false, ""});
  s.show("attn_weights_2.sum()", sum(attn_weights_2, 0), "their sum", "attn_weights_2.sum()");

  Tensor context_vec_2 = Tensor::zeros(query.shape());
  for (int64_t i = 0; i < T; ++i) context_vec_2 += mul(select(inputs, i), attn_weights_2[i]);
  s.show("context_vec_2", context_vec_2, "context vector of x_2, the weighted sum of all tokens",
         "context_vec_2 += attn_weights_2[i] * x_i for i, x_i in enumerate(inputs)");

  const Tensor attn_scores_loops = ref::attention_scores_loops(inputs);
  s.show("attn_scores_loops", attn_scores_loops, "all scores by two loops over the tokens",
         "attn_scores[i, j] = torch.dot(x_i, x_j)");
  s.attention_square(attn_scores_loops, kTokens, false, /*scores=*/true);
  const ref::SimplifiedAttention all =
      ref::simplified_attention(inputs, ref::Normalization::kSoftmax);
  s.show("attn_scores", all.scores, "all scores as one matrix product",
         "attn_scores = inputs @ inputs.T");
  s.attention_square(all.scores, kTokens, false, /*scores=*/true);
  s.show("attn_weights", all.weights, "each row softmaxed",
         "attn_weights = torch.softmax(attn_scores, dim=-1)");
  s.attention_square(all.weights, kTokens, false);
  s.show("attn_weights.sum(dim=-1)", sum(all.weights, -1), "every row sums to 1",
         "attn_weights.sum(dim=-1)");
  s.show("all_context_vecs", all.context, "all six context vectors",
         "all_context_vecs = attn_weights @ inputs");
}

// ---- 2. trainable weights, step by step -------------------------------------------------

void trainable(Steps& s) {
  const Tensor inputs = example_inputs();  // (6, 3)
  const Tensor x_2 = select(inputs, 1);    // (3)
  const int64_t d_in = inputs.size(1);
  const int64_t d_out = 2;

  const uint64_t seed = s.seed(123);
  const Tensor W_query = rand({d_in, d_out});  // (3, 2)
  const Tensor W_key = rand({d_in, d_out});
  const Tensor W_value = rand({d_in, d_out});
  s.show("W_query", W_query, "query weights, uniform [0, 1) numbers",
         fmt::format("torch.manual_seed({}); W_query = torch.nn.Parameter(torch.rand(d_in, d_out))",
                     seed));
  s.show("W_key", W_key, "key weights, the next draws",
         "W_key = torch.nn.Parameter(torch.rand(d_in, d_out))");
  s.show("W_value", W_value, "value weights, the next draws",
         "W_value = torch.nn.Parameter(torch.rand(d_in, d_out))");

  const Tensor query_2 = matmul(x_2, W_query);  // (2)
  s.show("query_2", query_2, "the query of x_2 (\"journey\")", "query_2 = x_2 @ W_query");
  const Tensor keys = matmul(inputs, W_key);      // (6, 2)
  const Tensor values = matmul(inputs, W_value);  // (6, 2)
  s.show("keys", keys, "the keys of all tokens", "keys = inputs @ W_key");
  s.show("values", values, "the values of all tokens", "values = inputs @ W_value");

  const Tensor keys_2 = select(keys, 1);
  s.show("attn_score_22", matmul(query_2, keys_2), "the score of query 2 with key 2",
         "attn_score_22 = query_2.dot(keys_2)");
  const Tensor attn_scores_2 = matmul(query_2, t(keys));  // (6)
  s.show("attn_scores_2", attn_scores_2, "all scores of query 2",
         "attn_scores_2 = query_2 @ keys.T");
  const int64_t d_k = keys.size(-1);
  const Tensor attn_weights_2 = softmax(div(attn_scores_2, sqrt_of(d_k)), -1);
  s.show("attn_weights_2", attn_weights_2, "scaled by 1/sqrt(d_k) and softmaxed",
         "attn_weights_2 = torch.softmax(attn_scores_2 / d_k**0.5, dim=-1)");
  s.attention({attn_weights_2.reshape({1, attn_weights_2.size(0)}),
               {kTokens[1]},
               kTokens,
               false,
               false,
               ""});
  s.show("context_vec_2", matmul(attn_weights_2, values), "the context vector of x_2",
         "context_vec_2 = attn_weights_2 @ values");
}

// ---- 3. the compact classes -------------------------------------------------------------

void self_attention(Steps& s) {
  const Tensor inputs = example_inputs();
  const int64_t d_in = inputs.size(1);
  const int64_t d_out = 2;

  uint64_t seed = s.seed(123);
  nn::SelfAttentionV1 sa_v1({.d_in = d_in, .d_out = d_out});
  s.show("sa_v1(inputs)", sa_v1.forward(inputs),
         "SelfAttention_v1 (rand parameters): all six context vectors",
         fmt::format("torch.manual_seed({}); sa_v1 = SelfAttention_v1(d_in, d_out); sa_v1(inputs)",
                     seed));
  s.attention({sa_v1.attention_weights(), kTokens, kTokens, false, false,
               "the module's attention weights, softmax(Q K^T / sqrt(d_k))"});
  seed = s.seed(789);
  nn::SelfAttentionV2 sa_v2({.d_in = d_in, .d_out = d_out});
  s.show("sa_v2(inputs)", sa_v2.forward(inputs),
         "SelfAttention_v2 (nn.Linear, no bias): all six context vectors",
         fmt::format("torch.manual_seed({}); sa_v2 = SelfAttention_v2(d_in, d_out); sa_v2(inputs)",
                     seed));
  s.attention({sa_v2.attention_weights(), kTokens, kTokens, false, false,
               "the module's attention weights, softmax(Q K^T / sqrt(d_k))"});
}

// ---- 4. causal attention ----------------------------------------------------------------

// Step 4 on the seed-789 SelfAttention_v2 of step 3; returns the causal weights (6, 6).
Tensor causal_weights(Steps& s) {
  const Tensor inputs = example_inputs();
  const uint64_t seed = s.seed(789);
  nn::SelfAttentionV2 sa_v2({.d_in = inputs.size(1), .d_out = 2});
  const Tensor queries = sa_v2.W_query.forward(inputs);  // (6, 2)
  const Tensor keys = sa_v2.W_key.forward(inputs);       // (6, 2)
  const Tensor attn_scores = matmul(queries, t(keys));   // (6, 6)
  const float sqrt_d_k = sqrt_of(keys.size(-1));
  const Tensor attn_weights = softmax(div(attn_scores, sqrt_d_k), -1);
  s.show("attn_weights", attn_weights,
         fmt::format("unmasked weights of SelfAttention_v2 (seed {})", seed),
         "attn_weights = torch.softmax(attn_scores / keys.shape[-1]**0.5, dim=-1)");
  s.attention_square(attn_weights, kTokens, false);

  const int64_t context_length = attn_scores.size(0);
  const Tensor mask_simple = ref::tril_ones(context_length);
  s.show("mask_simple", mask_simple, "ones on and below the diagonal",
         "mask_simple = torch.tril(torch.ones(context_length, context_length))");
  const Tensor masked_simple = mul(attn_weights, mask_simple);
  s.show("masked_simple", masked_simple, "the future zeroed",
         "masked_simple = attn_weights * mask_simple");
  s.attention_square(masked_simple, kTokens, true);
  const Tensor row_sums = sum(masked_simple, -1, /*keepdim=*/true);  // (6, 1)
  const Tensor masked_simple_norm = div(masked_simple, row_sums);
  s.show("masked_simple_norm", masked_simple_norm, "each row renormalised to sum 1",
         "masked_simple_norm = masked_simple / masked_simple.sum(dim=-1, keepdim=True)");
  s.attention_square(masked_simple_norm, kTokens, true);

  const Tensor mask = ref::future_mask(context_length);  // 1 where j > i
  const Tensor masked = masked_fill(attn_scores, mask, -kInf);
  s.show("masked", masked, "the efficient way: scores above the diagonal set to -inf",
         "mask = torch.triu(torch.ones(context_length, context_length), diagonal=1); "
         "masked = attn_scores.masked_fill(mask.bool(), -torch.inf)");
  s.attention_square(masked, kTokens, true, /*scores=*/true);
  const Tensor attn_weights_causal = softmax(div(masked, sqrt_d_k), 1);
  s.show("attn_weights_causal", attn_weights_causal,
         "their softmax: the same causal weights in one step",
         "attn_weights = torch.softmax(masked / keys.shape[-1]**0.5, dim=1)");
  s.attention_square(attn_weights_causal, kTokens, true);
  return attn_weights_causal;
}

void causal(Steps& s) { causal_weights(s); }

// ---- 5. dropout -------------------------------------------------------------------------

void dropout_section(Steps& s) {
  Steps step4 = s.quiet();
  const Tensor attn_weights = causal_weights(step4);  // (6, 6), shown in the causal section

  uint64_t seed = s.seed(123);
  nn::Dropout dropout({.p = 0.5f});
  const Tensor example = Tensor::ones({6, 6});
  s.show("dropout(example)", dropout.forward(example),
         "half the entries zeroed, the kept ones scaled by 1/(1-p) = 2",
         fmt::format("torch.manual_seed({}); dropout = torch.nn.Dropout(0.5); "
                     "dropout(torch.ones(6, 6))",
                     seed));
  seed = s.seed(123);
  const Tensor dropped = dropout.forward(attn_weights);
  s.show("dropout(attn_weights)", dropped, "the same dropout on the causal weights of step 4",
         fmt::format("torch.manual_seed({}); dropout(attn_weights)", seed));
  s.attention_square(dropped, kTokens, true);
}

// ---- 6. batched causal attention and multi-head attention -------------------------------

void multihead(Steps& s) {
  const Tensor inputs = example_inputs();
  const Tensor batch = stack({inputs, inputs}, 0);  // (2, 6, 3)
  s.show("batch", batch, "two copies of the sentence as a batch (B, T, d_in)",
         "batch = torch.stack((inputs, inputs), dim=0)");
  const int64_t d_in = batch.size(2);
  const int64_t d_out = 2;
  const int64_t context_length = batch.size(1);

  // Every module here takes the reference path: its bits are PyTorch's, so every
  // printed digit is torch's (the fused path agrees to rounding, which can move
  // the last printed digit).
  constexpr auto kReference = nn::AttentionBackend::kReference;
  uint64_t seed = s.seed(123);
  nn::CausalAttention ca({.d_in = d_in,
                          .d_out = d_out,
                          .context_length = context_length,
                          .dropout = 0.0f,
                          .backend = kReference});
  s.show("ca(batch)", ca.forward(batch), "CausalAttention: one context vector per token",
         fmt::format("torch.manual_seed({}); ca = CausalAttention(d_in, d_out, context_length, "
                     "0.0); ca(batch)",
                     seed));
  s.attention({select(ca.attention_weights(), 0), kTokens, kTokens, true, false,
               "the module's causal attention weights for batch[0]"});

  const nn::MultiHeadAttentionOptions two_heads = {.d_in = d_in,
                                                   .d_out = d_out,
                                                   .context_length = context_length,
                                                   .dropout = 0.0f,
                                                   .num_heads = 2,
                                                   .backend = kReference};
  seed = s.seed(123);
  nn::MultiHeadAttentionWrapper mha_wrapper(two_heads);
  s.show("mha_wrapper(batch)", mha_wrapper.forward(batch),
         "two causal heads side by side: width num_heads * d_out",
         fmt::format("torch.manual_seed({}); mha_wrapper = MultiHeadAttentionWrapper(d_in, d_out, "
                     "context_length, 0.0, num_heads=2); mha_wrapper(batch)",
                     seed));
  std::vector<Tensor> head_weights;  // H of (T, T)
  for (const auto& head : mha_wrapper.heads)
    head_weights.push_back(select(head->attention_weights(), 0));
  s.attention({stack(head_weights, 0), kTokens, kTokens, true, false,
               "each head's causal attention weights for batch[0]"});
  seed = s.seed(123);
  nn::MultiHeadAttention mha(two_heads);
  s.show("mha(batch)", mha.forward(batch),
         "one module, weights split into two heads of width 1, then out_proj: width d_out",
         fmt::format("torch.manual_seed({}); mha = MultiHeadAttention(d_in, d_out, "
                     "context_length, 0.0, num_heads=2); mha(batch)",
                     seed));
  s.attention({select(mha.attention_weights(), 0), kTokens, kTokens, true, false,
               "each head's causal attention weights for batch[0]"});
}

// ---- 7. averaging the past, and one head ------------------------------------------------

void averaging(Steps& s) {
  uint64_t seed = s.seed(1337);
  const int64_t B = 4, T = 8, C = 2;
  const Tensor x = randn({B, T, C});
  s.show("x[0]", select(x, 0), "the first of four random sequences of 8 tokens, 2 channels",
         fmt::format("torch.manual_seed({}); x = torch.randn(4, 8, 2); x[0]", seed));
  s.show("xbow[0]", select(ref::xbow_loops(x), 0),
         "route 1: the mean of each token and the ones before it, by loops",
         "xbow[b, t] = torch.mean(x[b, :t+1], 0)");
  const Tensor tril = ref::tril_ones(T);
  const Tensor wei = div(tril, sum(tril, 1, /*keepdim=*/true));  // (T, T)
  s.show("wei", wei, "a lower-triangular matrix with rows summing to 1",
         "wei = torch.tril(torch.ones(T, T)); wei = wei / wei.sum(1, keepdim=True)");
  std::vector<std::string> positions;
  for (int64_t i = 0; i < T; ++i) positions.push_back(std::to_string(i));
  s.attention_square(wei, positions, true);
  s.show("xbow2[0]", select(ref::xbow_matmul(x), 0), "route 2: the same means as one product",
         "xbow2 = wei @ x");
  s.show("xbow3[0]", select(ref::xbow_softmax(x), 0),
         "route 3: zeros masked with -inf above the diagonal, softmaxed, times x",
         "wei = F.softmax(torch.zeros(T, T).masked_fill(tril == 0, float('-inf')), dim=-1); "
         "xbow3 = wei @ x");

  // A single decoder head on wider tokens.
  seed = s.seed(1337);
  const int64_t n_embd = 32, head_size = 16;
  const Tensor x32 = randn({B, T, n_embd});  // (4, 8, 32)
  // The reference path: its bits are PyTorch's, so every printed digit is torch's
  // (the fused path agrees to rounding, which can move the last printed digit).
  nn::Head head({.n_embd = n_embd,
                 .head_size = head_size,
                 .block_size = T,
                 .causal = true,
                 .backend = nn::AttentionBackend::kReference});
  const Tensor out = head.forward(x32);                  // (B, T, head_size)
  s.show("wei[0]", select(head.attention_weights(), 0),  // (T, T) of (B, T, T)
         "a decoder head's weights for the first sequence: no token sees the future",
         fmt::format("torch.manual_seed({}); x = torch.randn(4, 8, 32); key, query, value = "
                     "nn.Linear(32, 16, bias=False) x3; wei = F.softmax((q @ k.transpose(-2, "
                     "-1) * 16**-0.5).masked_fill(tril == 0, float('-inf')), dim=-1)",
                     seed));
  s.attention_square(select(head.attention_weights(), 0), positions, true);
  s.show("out[0]", select(out, 0), "the head's output for the first sequence",
         "v = value(x); out = wei @ v");
}

// ---- 8. embedding a sentence ------------------------------------------------------------

// "Life is short, eat dessert first" without the comma: the words, and each word's
// index in the sorted vocabulary.
struct Sentence {
  std::vector<std::string> words;
  std::vector<int64_t> indices;
  int64_t vocab_size = 0;
};
Sentence sentence_indices(const std::string& sentence) {
  Sentence out;
  std::string text = sentence;
  text.erase(std::remove(text.begin(), text.end(), ','), text.end());
  std::istringstream in(text);
  for (std::string w; in >> w;) out.words.push_back(w);
  std::vector<std::string> vocab = out.words;
  std::sort(vocab.begin(), vocab.end());
  vocab.erase(std::unique(vocab.begin(), vocab.end()), vocab.end());
  std::map<std::string, int64_t> index;
  for (size_t i = 0; i < vocab.size(); ++i) index[vocab[i]] = static_cast<int64_t>(i);
  for (const auto& w : out.words) out.indices.push_back(index.at(w));
  out.vocab_size = static_cast<int64_t>(vocab.size());
  return out;
}
const char* const kSentence = "Life is short, eat dessert first";

void embedding(Steps& s) {
  const Sentence sentence = sentence_indices(kSentence);
  const int64_t d = 16;
  uint64_t seed = s.seed(123);
  nn::Embedding embed({.num_embeddings = sentence.vocab_size, .embedding_dim = d});
  const Tensor embedded_sentence = embed.forward(sentence.indices);  // (6, 16)
  s.show(
      "embedded_sentence", embedded_sentence,
      fmt::format("the sentence as indices [{}], each mapped to a row of a standard normal table",
                  fmt::join(sentence.indices, ", ")),
      fmt::format("torch.manual_seed({}); embed = torch.nn.Embedding({}, {}); "
                  "embedded_sentence = embed(sentence_int).detach()",
                  seed, sentence.vocab_size, d));

  seed = s.seed(123);
  const int64_t d_q = 24, d_k = 24, d_v = 28;
  const Tensor W_query = rand({d_q, d});  // (24, 16), used as W x
  const Tensor W_key = rand({d_k, d});    // (24, 16)
  const Tensor W_value = rand({d_v, d});  // (28, 16)
  const Tensor x_2 = select(embedded_sentence, 1);
  const Tensor query_2 = matmul(W_query, x_2);  // (24)
  s.show("query_2", query_2, "the query of the second token (\"is\"), d_q = 24",
         fmt::format("torch.manual_seed({}); W_query, W_key = torch.rand(24, 16) x2; W_value = "
                     "torch.rand(28, 16); query_2 = W_query.matmul(x_2)",
                     seed));
  const Tensor keys = t(matmul(W_key, t(embedded_sentence)));      // (6, 24)
  const Tensor values = t(matmul(W_value, t(embedded_sentence)));  // (6, 28)
  s.show("keys", keys, "the keys of all six tokens, one per row",
         "keys = W_key.matmul(embedded_sentence.T).T");
  s.show("omega_24", matmul(query_2, select(keys, 4)),
         "the unnormalised score of query 2 with the fifth key", "omega_24 = query_2.dot(keys[4])");
  const Tensor omega_2 = matmul(query_2, t(keys));  // (6)
  s.show("omega_2", omega_2, "all scores of query 2", "omega_2 = query_2.matmul(keys.T)");
  const Tensor attention_weights_2 = softmax(div(omega_2, sqrt_of(d_k)), 0);
  s.show("attention_weights_2", attention_weights_2,
         "scaled by 1/sqrt(d_k) = 1/sqrt(24), softmaxed",
         "attention_weights_2 = F.softmax(omega_2 / d_k**0.5, dim=0)");
  s.attention({attention_weights_2.reshape({1, attention_weights_2.size(0)}),
               {sentence.words[1]},
               sentence.words,
               false,
               false,
               ""});
  s.show("context_vector_2", matmul(attention_weights_2, values),
         "the context vector of the second token, d_v = 28 wide",
         "context_vector_2 = attention_weights_2.matmul(values)");
}

using SectionFn = void (*)(Steps&);
struct SectionEntry {
  WalkthroughSection info;
  SectionFn run;
};

const std::vector<SectionEntry>& section_table() {
  static const std::vector<SectionEntry> table = {
      {{"simplified", "1. Simplified self-attention (no trainable weights)",
        "scores w_i = x_i . x_q, weights a = softmax(w), context z = sum_i a_i x_i; "
        "then all tokens at once: A = softmax(X X^T), Z = A X"},
       simplified},
      {{"trainable", "2. Self-attention with trainable weights, step by step",
        "Q = X W_q, K = X W_k, V = X W_v; weights = softmax(Q K^T / sqrt(d_k)); "
        "context = weights V   (d_in = 3, d_out = 2)"},
       trainable},
      {{"self-attention", "3. The same as modules: SelfAttention_v1 and SelfAttention_v2",
        "v1 holds rand(d_in, d_out) parameters, v2 holds nn.Linear layers without bias"},
       self_attention},
      {{"causal", "4. Causal attention: no token attends to later ones",
        "two routes to the same weights: softmax, zero the future, renormalise; "
        "or fill the future with -inf, then softmax"},
       causal},
      {{"dropout", "5. Dropout on the attention weights (training mode, p = 0.5)",
        "each weight is kept with probability 1 - p and kept ones are scaled by 1/(1 - p)"},
       dropout_section},
      {{"multihead", "6. Batches, causal attention modules and multi-head attention",
        "CausalAttention; MultiHeadAttentionWrapper (heads concatenated); "
        "MultiHeadAttention (one projection split into heads, then out_proj)"},
       multihead},
      {{"averaging", "7. Mixing tokens by averaging the past, and a single head",
        "xbow[b, t] = mean(x[b, 0..t]) three ways; then a decoder head: "
        "softmax(q k^T / sqrt(head_size), future masked) v"},
       averaging},
      {{"embedding", "8. Embedding a sentence, with d_q = d_k = 24 and d_v = 28",
        "\"Life is short, eat dessert first\" -> word indices -> Embedding(6, 16) -> "
        "queries, keys, values of different widths"},
       embedding},
  };
  return table;
}

const SectionEntry& find_section(const std::string& name) {
  return find_section_entry(section_table(), name, "");
}

// ---- output -----------------------------------------------------------------------------

nlohmann::json json_values(const Tensor& t) {
  nlohmann::json values = nlohmann::json::array();
  for (float v : t.to_vector()) {
    if (std::isnan(v)) {
      values.push_back("nan");  // JSON has no non-finite numbers
    } else if (std::isinf(v)) {
      values.push_back(v > 0 ? "inf" : "-inf");
    } else {
      values.push_back(v);
    }
  }
  return values;
}

}  // namespace

const std::vector<std::string>& walkthrough_tokens() { return kTokens; }

const std::vector<WalkthroughSection>& walkthrough_ch3_sections() {
  static const std::vector<WalkthroughSection> sections = section_infos(section_table());
  return sections;
}

void check_ch3_section(const std::string& name) { find_section(name); }

std::vector<Shown> run_walkthrough_ch3(const WalkthroughOptions& options) {
  std::vector<const SectionEntry*> chosen;
  if (options.sections.empty()) {
    for (const auto& e : section_table()) chosen.push_back(&e);
  } else {
    for (const auto& name : options.sections) {
      const SectionEntry* e = &find_section(name);  // throws for an unknown name
      if (std::find(chosen.begin(), chosen.end(), e) == chosen.end()) chosen.push_back(e);
    }
  }
  std::vector<Shown> shown;
  for (const SectionEntry* e : chosen) {
    Steps steps(e->info.name, options.seed, &shown);
    e->run(steps);
  }
  return shown;
}

std::string ch3_to_json(const std::vector<Shown>& shown) {
  std::string out = "[";
  for (size_t i = 0; i < shown.size(); ++i) {
    const Shown& s = shown[i];
    const nlohmann::json j = {{"section", s.section},           {"name", s.name},
                              {"explanation", s.explanation},   {"shape", s.value.shape()},
                              {"values", json_values(s.value)}, {"text", to_string(s.value)}};
    out += (i == 0 ? "\n" : ",\n") + j.dump();
  }
  out += "\n]\n";
  return out;
}

std::string ch3_to_text(const std::vector<Shown>& shown, const std::optional<uint64_t>& seed) {
  std::string out = fmt::format(
      "attn walkthrough: the attention chapter's worked examples on \"Your journey starts with "
      "one step\".\nEvery tensor prints as PyTorch 1.13 prints it; the line above it says what "
      "it is and the PyTorch code it mirrors.\n{}\n",
      seed ? fmt::format("Every torch.manual_seed uses {} (--seed).", *seed)
           : std::string("Seeds as in the book (--seed N replaces every one)."));
  std::string section;
  for (const Shown& s : shown) {
    if (s.section != section) {
      section = s.section;
      const WalkthroughSection& info = find_section(section).info;
      out += fmt::format("\n== {} ==\n   {}\n", info.title, info.intro);
    }
    out += fmt::format("\n# {}\n{}\n", s.explanation, to_string(s.value));
  }
  return out;
}

}  // namespace attn::cli
