// The paged key/value cache (attn/paged_kv_cache.h) and forward_paged: a
// batched step of sequences at their own positions gives, row for row, the
// logits each sequence gets alone through the existing cache (forward_cached),
// whatever the other sequences of the step, the chunking of the prompts and
// the order of the blocks.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "attn/decoder.h"
#include "attn/generate.h"
#include "attn/hf_decoder.h"
#include "attn/hf_gpt2.h"
#include "attn/paged_kv_cache.h"

namespace attn::test {
namespace {

const std::string kFixtures = std::string(ATTN_TESTS_DIR) + "/fixtures";

// A model as the test drives it: alone (the existing cache) and paged.
struct Driver {
  int64_t vocab = 0;
  std::function<std::vector<std::vector<float>>(const std::vector<int64_t>& tokens,
                                                int64_t prompt)>
      alone;  // logits rows for positions prompt - 1 .. tokens.size() - 1
  std::function<nn::PagedKVCache(int64_t block_size, int64_t blocks)> make_cache;
  std::function<Tensor(const std::vector<int64_t>&, const std::vector<nn::PagedSequence>&,
                       nn::PagedKVCache&)>
      paged;
};

std::vector<float> row_of(const Tensor& logits2d, int64_t r) {
  const Tensor c = logits2d.contiguous();
  const int64_t V = c.size(1);
  return std::vector<float>(c.data() + r * V, c.data() + (r + 1) * V);
}

// kv_dtype: the element type of both caches (alone and paged).
Driver decoder_driver(nn::DecoderLM& model, DType kv_dtype = DType::kFloat32) {
  Driver d;
  d.vocab = model.config().vocab_size;
  d.alone = [&model, kv_dtype](const std::vector<int64_t>& tokens, int64_t prompt) {
    const int64_t T = static_cast<int64_t>(tokens.size());
    nn::DecoderKVCache cache = nn::make_kv_cache(model, 1, T, kv_dtype);
    std::vector<std::vector<float>> rows;
    const std::vector<int64_t> head(tokens.begin(), tokens.begin() + prompt);
    Tensor logits = nn::forward_cached(model, Tensor::from_int64({1, prompt}, head), cache, true);
    rows.push_back(row_of(logits.view({1, -1}), 0));
    for (int64_t p = prompt; p < T; ++p) {
      logits = nn::forward_cached(model, Tensor::from_int64({1, 1}, {tokens[p]}), cache, true);
      rows.push_back(row_of(logits.view({1, -1}), 0));
    }
    return rows;
  };
  d.make_cache = [&model, kv_dtype](int64_t bs, int64_t n) {
    return nn::make_paged_kv_cache(model, bs, n, kv_dtype);
  };
  d.paged = [&model](const std::vector<int64_t>& ids, const std::vector<nn::PagedSequence>& seqs,
                     nn::PagedKVCache& cache) {
    return nn::forward_paged(model, ids, seqs, cache);
  };
  return d;
}

Driver gpt_driver(nn::GPTModel& model) {
  Driver d;
  d.vocab = model.config().vocab_size;
  d.alone = [&model](const std::vector<int64_t>& tokens, int64_t prompt) {
    const int64_t T = static_cast<int64_t>(tokens.size());
    nn::GPTKVCache cache = nn::make_gpt_kv_cache(model, 1);
    std::vector<std::vector<float>> rows;
    const std::vector<int64_t> head(tokens.begin(), tokens.begin() + prompt);
    Tensor logits = nn::forward_cached(model, Tensor::from_int64({1, prompt}, head), cache, false);
    rows.push_back(row_of(logits.view({1, -1}), 0));
    for (int64_t p = prompt; p < T; ++p) {
      logits = nn::forward_cached(model, Tensor::from_int64({1, 1}, {tokens[p]}), cache, false);
      rows.push_back(row_of(logits.view({1, -1}), 0));
    }
    return rows;
  };
  d.make_cache = [&model](int64_t bs, int64_t n) { return nn::make_paged_kv_cache(model, bs, n); };
  d.paged = [&model](const std::vector<int64_t>& ids, const std::vector<nn::PagedSequence>& seqs,
                     nn::PagedKVCache& cache) {
    return nn::forward_paged(model, ids, seqs, cache);
  };
  return d;
}

struct Seq {
  std::vector<int64_t> tokens;  // prompt, then the tokens fed one at a time
  int64_t prompt = 0;
  int64_t start_step = 0;  // joins the batch at this step
  nn::BlockTable table;
  int64_t fed = 0;
  std::map<int64_t, std::vector<float>> rows;  // position -> logits
};

// Runs the sequences as a server would: they join at their steps, prompts in
// chunks of `chunk` tokens, then one token a step; each leaves when its tokens
// are all fed, returning its blocks. Checks every row against `alone`.
void expect_batched_equals_alone(Driver& d, int64_t block_size, int64_t chunk, bool reverse) {
  std::vector<Seq> seqs(4);
  const int64_t prompts[] = {5, 9, 3, 12}, news[] = {6, 3, 8, 4}, starts[] = {0, 0, 2, 5};
  for (int64_t s = 0; s < 4; ++s) {
    Seq& q = seqs[static_cast<size_t>(s)];
    q.prompt = prompts[s];
    q.start_step = reverse ? 5 - starts[s] : starts[s];
    for (int64_t t = 0; t < prompts[s] + news[s]; ++t)
      q.tokens.push_back((37 * s + 11 * t + 3) % d.vocab);
  }
  nn::PagedKVCache cache = d.make_cache(block_size, 64);
  const int64_t total_blocks = cache.free_blocks();
  for (int64_t step = 0; step < 64; ++step) {
    std::vector<nn::PagedSequence> batch;
    std::vector<int64_t> ids;
    std::vector<Seq*> members;
    for (Seq& q : seqs) {
      const int64_t T = static_cast<int64_t>(q.tokens.size());
      if (step < q.start_step || q.fed == T) continue;
      const int64_t n = q.fed < q.prompt ? std::min(chunk, q.prompt - q.fed) : 1;
      ASSERT_TRUE(cache.reserve(q.table, q.fed + n));
      batch.push_back({&q.table, n});
      ids.insert(ids.end(), q.tokens.begin() + q.fed, q.tokens.begin() + q.fed + n);
      members.push_back(&q);
    }
    if (batch.empty()) continue;
    const Tensor logits = d.paged(ids, batch, cache);  // (S, V)
    ASSERT_EQ(logits.size(0), static_cast<int64_t>(batch.size()));
    for (size_t i = 0; i < members.size(); ++i) {
      Seq& q = *members[i];
      q.fed += batch[i].count;
      EXPECT_EQ(q.table.length, q.fed);
      if (q.fed >= q.prompt) q.rows[q.fed - 1] = row_of(logits, static_cast<int64_t>(i));
      if (q.fed == static_cast<int64_t>(q.tokens.size())) cache.release(q.table);
    }
  }
  EXPECT_EQ(cache.free_blocks(), total_blocks);  // every sequence gave its blocks back
  for (Seq& q : seqs) {
    const auto alone = d.alone(q.tokens, q.prompt);
    ASSERT_EQ(q.rows.size(), alone.size());
    for (size_t r = 0; r < alone.size(); ++r) {
      const auto& got = q.rows.at(q.prompt - 1 + static_cast<int64_t>(r));
      for (size_t v = 0; v < got.size(); ++v) {
        ASSERT_NEAR(got[v], alone[r][v], 1e-5 * std::max(1.0f, std::fabs(alone[r][v])))
            << "position " << q.prompt - 1 + static_cast<int64_t>(r) << " logit " << v;
      }
    }
  }
}

class PagedDecoder : public ::testing::TestWithParam<std::string> {};

TEST_P(PagedDecoder, BatchedStepEqualsEachSequenceAlone) {
  std::unique_ptr<nn::DecoderLM> model;
  io::load_hf_decoder(kFixtures + "/open_models/" + GetParam(), model);
  model->eval();
  Driver d = decoder_driver(*model);
  expect_batched_equals_alone(d, 4, 4, false);
  expect_batched_equals_alone(d, 16, 7, true);
  expect_batched_equals_alone(d, 1, 64, false);
}

// A bf16 pool against a bf16 DecoderKVCache (both round the keys and values
// as they store them); and the bf16 cache's logits beside the float32 one's.
TEST_P(PagedDecoder, Bf16PoolEqualsTheBf16CacheAndStaysNearFloat32) {
  std::unique_ptr<nn::DecoderLM> model;
  io::load_hf_decoder(kFixtures + "/open_models/" + GetParam(), model);
  model->eval();
  Driver d = decoder_driver(*model, DType::kBFloat16);
  expect_batched_equals_alone(d, 4, 4, false);
  expect_batched_equals_alone(d, 16, 7, true);
  std::vector<int64_t> tokens;
  for (int64_t t = 0; t < 40; ++t) tokens.push_back((13 * t + 5) % d.vocab);
  const auto bf16 = d.alone(tokens, 6);
  const auto fp32 = decoder_driver(*model).alone(tokens, 6);
  float worst = 0.0f, largest = 0.0f;
  for (size_t r = 0; r < fp32.size(); ++r) {
    for (size_t v = 0; v < fp32[r].size(); ++v) {
      worst = std::max(worst, std::fabs(bf16[r][v] - fp32[r][v]));
      largest = std::max(largest, std::fabs(fp32[r][v]));
    }
  }
  EXPECT_GT(worst, 0.0f);  // the cache did round
  EXPECT_LT(worst, 2e-2f * largest);
  std::printf("[  PAGED   ] %s: bf16 cache vs float32, max |difference| %.3g of max |logit| %.3g\n",
              GetParam().c_str(), double(worst), double(largest));
}

// llama3, qwen2, qwen3: RoPE, GQA, QK-norm, biases; gemma3: sliding layers
// (a window of 4 in the fixture) and sandwich norms; gemma2: the softcaps.
INSTANTIATE_TEST_SUITE_P(Families, PagedDecoder,
                         ::testing::Values("llama3", "qwen2", "qwen3", "gemma3", "gemma2"));

TEST(PagedGpt, BatchedStepEqualsEachSequenceAlone) {
  std::unique_ptr<nn::GPTModel> model;
  io::load_model_dir(kFixtures + "/hf_gpt2/fp32", model);
  model->eval();
  Driver d = gpt_driver(*model);
  expect_batched_equals_alone(d, 4, 4, false);
  expect_batched_equals_alone(d, 16, 7, true);
}

TEST(PagedKVCache, ReservesAndReleasesBlocks) {
  nn::PagedKVCache cache(
      {.num_layers = 2, .num_kv_heads = 2, .head_dim = 8, .block_size = 4, .num_blocks = 5});
  EXPECT_EQ(cache.bytes(), 2 * 2 * 5 * 4 * 2 * 8 * 4);
  EXPECT_EQ(nn::PagedKVCache({.num_layers = 2,
                              .num_kv_heads = 2,
                              .head_dim = 8,
                              .block_size = 4,
                              .num_blocks = 5,
                              .dtype = DType::kBFloat16})
                .bytes(),
            2 * 2 * 5 * 4 * 2 * 8 * 2);
  EXPECT_THROW(nn::PagedKVCache({.num_layers = 1,
                                 .num_kv_heads = 1,
                                 .head_dim = 8,
                                 .block_size = 4,
                                 .num_blocks = 4,
                                 .dtype = DType::kInt64}),
               std::invalid_argument);
  nn::BlockTable a, b;
  EXPECT_TRUE(cache.reserve(a, 9));  // 3 blocks
  EXPECT_EQ(a.blocks.size(), 3u);
  EXPECT_EQ(cache.free_blocks(), 2);
  EXPECT_FALSE(cache.reserve(b, 12));  // 3 > 2 free: nothing taken
  EXPECT_TRUE(b.blocks.empty());
  EXPECT_EQ(cache.free_blocks(), 2);
  EXPECT_TRUE(cache.reserve(a, 12));  // still 3 blocks
  EXPECT_EQ(cache.free_blocks(), 2);
  cache.release(a);
  EXPECT_EQ(cache.free_blocks(), 5);
  EXPECT_TRUE(cache.reserve(b, 20));
  EXPECT_EQ(cache.free_blocks(), 0);
  // copy_rows: the first rows of one block into another, every layer, keys and values.
  for (int64_t l = 0; l < 2; ++l)
    for (int64_t i = 0; i < 4 * 2 * 8; ++i) {
      cache.keys(l).data()[b.blocks[0] * 64 + i] = float(100 * l + i);
      cache.values(l).data()[b.blocks[0] * 64 + i] = -float(100 * l + i);
    }
  cache.copy_rows(b.blocks[0], b.blocks[1], 3);
  for (int64_t l = 0; l < 2; ++l)
    for (int64_t i = 0; i < 4 * 2 * 8; ++i) {
      const bool copied = i < 3 * 2 * 8;  // 3 rows of (Hkv 2, hd 8)
      EXPECT_EQ(cache.keys(l).data()[b.blocks[1] * 64 + i], copied ? float(100 * l + i) : 0.0f);
      EXPECT_EQ(cache.values(l).data()[b.blocks[1] * 64 + i], copied ? -float(100 * l + i) : 0.0f);
    }
  EXPECT_THROW(cache.copy_rows(b.blocks[0], b.blocks[0], 1), std::invalid_argument);
  EXPECT_THROW(cache.copy_rows(b.blocks[0], b.blocks[1], 5), std::invalid_argument);
  EXPECT_THROW(cache.copy_rows(b.blocks[0], 7, 1), std::invalid_argument);
  EXPECT_THROW(
      nn::PagedKVCache(
          {.num_layers = 1, .num_kv_heads = 1, .head_dim = 8, .block_size = 0, .num_blocks = 4}),
      std::invalid_argument);
}

TEST(PagedKVCache, AStepWithoutItsBlocksIsRefusedAndChangesNothing) {
  std::unique_ptr<nn::DecoderLM> model;
  io::load_hf_decoder(kFixtures + "/open_models/qwen3", model);
  model->eval();
  nn::PagedKVCache cache = nn::make_paged_kv_cache(*model, 4, 8);
  nn::BlockTable t;
  ASSERT_TRUE(cache.reserve(t, 4));
  const std::vector<int64_t> ids = {1, 2, 3, 4, 5};
  std::vector<nn::PagedSequence> step = {{&t, 5}};
  try {
    nn::forward_paged(*model, ids, step, cache);
    FAIL() << "no throw";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("5 new tokens at position 0 but blocks for 4"),
              std::string::npos)
        << e.what();
  }
  EXPECT_EQ(t.length, 0);
  step = {{&t, 4}};
  EXPECT_THROW(nn::forward_paged(*model, std::vector<int64_t>{1, 2, 3}, step, cache),
               std::invalid_argument);  // 3 ids for 4 tokens
  EXPECT_THROW(nn::forward_paged(*model, std::vector<int64_t>{1, 2, 3, 99999}, step, cache),
               std::invalid_argument);  // an id past the vocabulary
  step = {{&t, 2}, {&t, 2}};
  EXPECT_THROW(nn::forward_paged(*model, std::vector<int64_t>{1, 2, 3, 4}, step, cache),
               std::invalid_argument);  // one table twice
  EXPECT_EQ(t.length, 0);
}

}  // namespace
}  // namespace attn::test
