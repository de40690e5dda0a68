// attn::Generator against torch 1.13 itself: tests/torch/oracle_random.py runs
// sequences of rand / randn / uniform_ / normal_ / nn.Linear / nn.Embedding /
// dropout calls after torch.manual_seed and stores every value exactly; this
// test replays each sequence and compares the bits of every value.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <bit>
#include <cstdint>
#include <iostream>
#include <string>
#include <vector>

#include "attn/random.h"
#include "oracle.h"

namespace {

using attn::Generator;
using attn::Shape;
using attn::Tensor;
using nlohmann::json;

// One op's output: float32 values, or float64 values for rand64 / uniform64.
struct Output {
  std::vector<float> f32;
  std::vector<double> f64;
  bool is_f64 = false;
};

Output run_op(const json& op, Generator& gen) {
  const std::string kind = op.at("op").get<std::string>();
  Output out;
  if (kind == "rand") {
    out.f32 = attn::rand(op.at("shape").get<Shape>(), gen).to_vector();
  } else if (kind == "randn") {
    const Tensor x = attn::randn(op.at("shape").get<Shape>(), gen);
    if (op.contains("keep")) {
      for (const json& range : op.at("keep")) {
        const auto start = range.at(0).get<int64_t>();
        const auto end = range.at(1).get<int64_t>();
        for (int64_t i = start; i < end; ++i) out.f32.push_back(x[i]);
      }
    } else {
      out.f32 = x.to_vector();
    }
  } else if (kind == "uniform") {
    Tensor t({op.at("n").get<int64_t>()});
    attn::uniform_(t, op.at("from").get<float>(), op.at("to").get<float>(), gen);
    out.f32 = t.to_vector();
  } else if (kind == "normal") {
    Tensor t({op.at("n").get<int64_t>()});
    attn::normal_(t, op.at("mean").get<float>(), op.at("std").get<float>(), gen);
    out.f32 = t.to_vector();
  } else if (kind == "rand64" || kind == "uniform64") {
    const int64_t n = op.at("n").get<int64_t>();
    const double from = kind == "rand64" ? 0.0 : op.at("from").get<double>();
    const double to = kind == "rand64" ? 1.0 : op.at("to").get<double>();
    out.is_f64 = true;
    for (int64_t i = 0; i < n; ++i) out.f64.push_back(gen.uniform_double(from, to));
  } else if (kind == "linear") {
    const int64_t d_in = op.at("in").get<int64_t>();
    const int64_t d_out = op.at("out").get<int64_t>();
    Tensor weight({d_out, d_in});  // (out, in)
    Tensor bias({d_out});
    const bool has_bias = op.at("bias").get<bool>();
    attn::init_linear_(weight, has_bias ? &bias : nullptr, gen);
    out.f32 = weight.to_vector();
    if (has_bias) out.f32.insert(out.f32.end(), bias.values().begin(), bias.values().end());
  } else if (kind == "embedding") {
    Tensor weight({op.at("num").get<int64_t>(), op.at("dim").get<int64_t>()});
    attn::normal_(weight, 0.0f, 1.0f, gen);
    out.f32 = weight.to_vector();
  } else if (kind == "dropout") {
    out.f32 =
        attn::dropout_noise({op.at("n").get<int64_t>()}, op.at("p").get<float>(), gen).to_vector();
  } else {
    throw std::invalid_argument("random.json: unknown op " + kind);
  }
  return out;
}

TEST(RandomTorch, EverySequenceBitExact) {
  const json oracle = attn::test::read_oracle_json("random.json", "oracle_random.py");
  // attn follows torch's AVX2 kernels (with their fused multiply-adds and the
  // Cephes normal); the oracle asks torch for them, which fails only on a CPU
  // without AVX2, where torch's values come from other kernels.
  const std::string capability = oracle.at("cpu_capability").get<std::string>();
  if (capability != "AVX2") {
    GTEST_SKIP() << "torch ran its " << capability << " kernels, not the AVX2 ones attn reproduces";
  }
  const json& cases = oracle.at("cases");
  ASSERT_GT(cases.size(), 100u);

  int64_t compared = 0;
  for (const json& c : cases) {
    const std::string name = c.at("name").get<std::string>();
    const json& ops = c.at("ops");
    const json& outputs = c.at("outputs");
    ASSERT_EQ(ops.size(), outputs.size()) << name;
    Generator gen(c.at("seed").get<uint64_t>());
    for (size_t k = 0; k < ops.size(); ++k) {
      const json& op = ops[k];
      if (op.at("op") == "manual_seed") {
        gen.manual_seed(static_cast<uint64_t>(op.at("seed").get<int64_t>()));
        continue;
      }
      const Output got = run_op(op, gen);
      const json& want = outputs[k].at("values");
      const bool want_f64 = outputs[k].at("dtype") == "float64";
      ASSERT_EQ(got.is_f64, want_f64) << name << ", op " << k;
      const size_t n = got.is_f64 ? got.f64.size() : got.f32.size();
      ASSERT_EQ(n, want.size()) << name << ", op " << k << " (" << op.dump() << ")";
      int mismatches = 0;
      for (size_t i = 0; i < n; ++i) {
        bool same = false;
        std::string detail;
        if (got.is_f64) {
          const double w = want[i].get<double>();
          same = std::bit_cast<uint64_t>(got.f64[i]) == std::bit_cast<uint64_t>(w);
          detail = fmt::format("got {:.17g}, torch {:.17g}", got.f64[i], w);
        } else {
          const auto w = static_cast<float>(want[i].get<double>());
          same = std::bit_cast<uint32_t>(got.f32[i]) == std::bit_cast<uint32_t>(w);
          detail = fmt::format("got {:.9g} ({:#010x}), torch {:.9g} ({:#010x})", got.f32[i],
                               std::bit_cast<uint32_t>(got.f32[i]), w, std::bit_cast<uint32_t>(w));
        }
        ++compared;
        if (!same && ++mismatches <= 3) {
          ADD_FAILURE() << name << ", op " << k << " (" << op.dump() << "), value " << i << ": "
                        << detail;
        }
      }
      EXPECT_EQ(mismatches, 0) << name << ", op " << k << ": " << mismatches << " of " << n
                               << " values differ";
    }
  }
  std::cout << "[ RandomTorch ] " << compared << " values bit-exact against torch "
            << oracle.at("torch").get<std::string>() << " in " << cases.size() << " sequences\n";
}

// torch.Generator() without a seed: PyTorch's default seed 67280421310721.
TEST(RandomTorch, UnseededGeneratorMatchesTorch) {
  const json oracle = attn::test::read_oracle_json("random.json", "oracle_random.py");
  const json& fresh = oracle.at("unseeded_generator");
  Generator gen;
  EXPECT_EQ(gen.initial_seed(), fresh.at("initial_seed").get<uint64_t>());
  const Tensor got = attn::rand({20}, gen);
  const json& want = fresh.at("rand");
  ASSERT_EQ(want.size(), 20u);
  for (size_t i = 0; i < 20; ++i) {
    EXPECT_EQ(std::bit_cast<uint32_t>(got[static_cast<int64_t>(i)]),
              std::bit_cast<uint32_t>(static_cast<float>(want[i].get<double>())))
        << "value " << i;
  }
}

}  // namespace
