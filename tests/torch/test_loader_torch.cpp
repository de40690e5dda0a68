// train::WindowLoader, randperm and random_int64 against torch 1.13's DataLoader,
// randperm and int64 random_() (tests/torch/oracle_loader.py): the same windows in
// the same batches, pass after pass, and the same draws from the generator.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "attn/random.h"
#include "attn/train.h"
#include "oracle.h"

namespace {

using attn::Generator;

TEST(LoaderTorch, RandpermAndInt64DrawsAreTorchs) {
  const auto j = attn::test::read_oracle_json("loader.json", "oracle_loader.py");
  for (const auto& c : j.at("randperm")) {
    Generator g(c.at("seed").get<uint64_t>());
    EXPECT_EQ(attn::randperm(c.at("n").get<int64_t>(), g), c.at("perm").get<std::vector<int64_t>>())
        << "seed " << c.at("seed") << " n " << c.at("n");
  }
  Generator g(123);
  for (const auto& v : j.at("random_int64_seed123")) EXPECT_EQ(attn::random_int64(g), v.get<int64_t>());
}

TEST(LoaderTorch, BatchesAndDrawsOverSeveralPassesAreTorchs) {
  const auto j = attn::test::read_oracle_json("loader.json", "oracle_loader.py");
  ASSERT_GE(j.at("cases").size(), 6u);
  for (const auto& c : j.at("cases")) {
    const int64_t n = c.at("n");
    const bool shuffle = c.at("shuffle");
    std::vector<int64_t> ids(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) ids[static_cast<size_t>(i)] = i;  // a window's first id is its start
    attn::train::WindowLoader loader(ids, c.at("batch"), c.at("max_length"), c.at("stride"), shuffle,
                                     /*drop_last=*/shuffle);
    const std::string where = "case n=" + std::to_string(n) + " shuffle=" + std::to_string(shuffle);
    EXPECT_EQ(loader.windows(), c.at("windows").get<int64_t>()) << where;
    EXPECT_EQ(loader.batches(), c.at("batches").get<int64_t>()) << where;
    Generator gen(c.at("seed").get<uint64_t>());
    for (const auto& pass : c.at("passes")) {
      loader.start_pass(gen);
      for (const auto& batch : pass) {
        ASSERT_TRUE(loader.in_pass()) << where;
        auto [x, y] = loader.next();
        ASSERT_EQ(x.shape()[0], static_cast<int64_t>(batch.size())) << where;
        const int64_t T = x.shape()[1];
        const auto* xs = x.data_ptr<int64_t>();
        const auto* ys = y.data_ptr<int64_t>();
        for (size_t r = 0; r < batch.size(); ++r) {
          EXPECT_EQ(xs[static_cast<int64_t>(r) * T], batch[r].get<int64_t>()) << where;
          EXPECT_EQ(ys[static_cast<int64_t>(r) * T], batch[r].get<int64_t>() + 1) << where;  // shifted by one
        }
      }
      EXPECT_FALSE(loader.in_pass()) << where;
    }
    attn::train::WindowLoader cut = loader;  // a pass cut short after one batch
    cut.start_pass(gen);
    (void)cut.next();
    const attn::Tensor after = attn::rand({4}, gen);
    const auto want = c.at("rand_after").get<std::vector<float>>();
    for (int64_t i = 0; i < 4; ++i) EXPECT_EQ(after[i], want[static_cast<size_t>(i)]) << where;
  }
}

}  // namespace
