// attn::Generator: the golden vectors of data/golden/rng_vectors.json bit
// for bit, plus behaviour (seeding, the normal cache, draw counts, errors,
// sizes around the 16-wide block, statistics, accuracy of the Cephes functions).
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <iostream>
#include <limits>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "attn/random.h"
#include "oracle.h"
#include "random/cephes.h"

namespace {

using attn::Generator;
using attn::Shape;
using attn::Tensor;
using nlohmann::json;

uint32_t bits_of(float x) { return std::bit_cast<uint32_t>(x); }

// Appends t's values to out and returns the shape torch would report for the
// stacked result.
Tensor concat(const std::vector<Tensor>& parts, Shape shape) {
  std::vector<float> values;
  for (const Tensor& p : parts) values.insert(values.end(), p.values().begin(), p.values().end());
  return Tensor(std::move(shape), std::move(values));
}

// Compares one golden vector ({"shape", "values", "float32_bits"}) with got,
// bit for bit; returns the number of values compared.
int64_t expect_golden(const json& vec, const Tensor& got, const std::string& what) {
  const Shape shape = vec.at("shape").get<Shape>();
  EXPECT_EQ(got.shape(), shape) << what;
  const json& hex = vec.at("float32_bits");
  const json& text = vec.at("values");
  EXPECT_EQ(hex.size(), text.size()) << what;
  EXPECT_EQ(static_cast<size_t>(got.numel()), hex.size()) << what;
  int64_t compared = 0;
  for (size_t i = 0; i < hex.size() && i < static_cast<size_t>(got.numel()); ++i) {
    const auto want = static_cast<uint32_t>(std::stoul(hex[i].get<std::string>(), nullptr, 16));
    // The %.9g text and the bit pattern in the file must agree.
    EXPECT_EQ(bits_of(std::strtof(text[i].get<std::string>().c_str(), nullptr)), want)
        << what << " value " << i;
    EXPECT_EQ(bits_of(got[static_cast<int64_t>(i)]), want)
        << what << " value " << i << ": got " << got[static_cast<int64_t>(i)] << ", torch "
        << text[i];
    ++compared;
  }
  return compared;
}

// The number of values the golden file holds: bit patterns, MT19937 words, and
// the float64 values that come without bit patterns.
int64_t golden_value_count(const json& j) {
  int64_t n = 0;
  if (!j.is_object()) return 0;
  for (const auto& [key, value] : j.items()) {
    if (key == "float32_bits" || key == "mt19937_first_10_uint32") {
      n += static_cast<int64_t>(value.size());
    } else if (key == "values" && !j.contains("float32_bits")) {
      n += static_cast<int64_t>(value.size());
    } else {
      n += golden_value_count(value);
    }
  }
  return n;
}

TEST(RandomGolden, EveryVectorBitExact) {
  // read_data_json throws (and so fails the test) if the file cannot be read,
  // naming the path it looked for (tests/oracle.h).
  const json golden = attn::test::read_data_json("golden/rng_vectors.json");
  const json& seeds = golden.at("seeds");
  ASSERT_GE(seeds.size(), 3u);

  // One replay per key; a key without one fails the test, so every vector in
  // the file is checked.
  using Replay = std::function<Tensor(Generator&)>;
  const std::map<std::string, Replay> tensor_vectors = {
      {"rand_20", [](Generator& g) { return attn::rand({20}, g); }},
      {"rand_3x2",
       [](Generator& g) {
         return attn::rand({3, 2}, g);
       }},
      {"rand_3x2_three_times",
       [](Generator& g) {
         std::vector<Tensor> w;
         for (int i = 0; i < 3; ++i) w.push_back(attn::rand({3, 2}, g));
         return concat(w, {3, 3, 2});
       }},
      {"randn_10", [](Generator& g) { return attn::randn({10}, g); }},
      {"randn_15", [](Generator& g) { return attn::randn({15}, g); }},
      {"randn_16", [](Generator& g) { return attn::randn({16}, g); }},
      {"randn_17", [](Generator& g) { return attn::randn({17}, g); }},
      {"randn_40", [](Generator& g) { return attn::randn({40}, g); }},
      {"randn_3_then_randn_3",
       [](Generator& g) {
         Tensor a = attn::randn({3}, g);
         Tensor b = attn::randn({3}, g);
         return concat({a, b}, {6});
       }},
      {"linear_3_2_nobias",
       [](Generator& g) {
         Tensor w({2, 3});
         attn::init_linear_(w, nullptr, g);
         return w;
       }},
      {"linear_3_2_nobias_x3",
       [](Generator& g) {
         std::vector<Tensor> w;  // three tensors, each its own storage
         for (int i = 0; i < 3; ++i) w.push_back(Tensor({2, 3}));
         for (Tensor& t : w) attn::init_linear_(t, nullptr, g);
         return concat(w, {3, 2, 3});
       }},
      {"dropout_0.5_ones_6x6",
       [](Generator& g) {
         return attn::dropout_noise({6, 6}, 0.5f, g);
       }},
      {"dropout_0.1_ones_4x5",
       [](Generator& g) {
         return attn::dropout_noise({4, 5}, 0.1f, g);
       }},
  };

  int64_t compared = 0;
  int64_t vectors = 0;
  for (const auto& [seed_text, entries] : seeds.items()) {
    const uint64_t seed = std::stoull(seed_text);
    for (const auto& [key, vec] : entries.items()) {
      const std::string what = "seed " + seed_text + ", " + key;
      ++vectors;
      if (key == "mt19937_first_10_uint32") {
        Generator g(seed);
        for (const json& want : vec) {
          EXPECT_EQ(g.random(), want.get<uint32_t>()) << what;
          ++compared;
        }
      } else if (key == "rand_5_float64") {
        Generator g(seed);
        for (const json& want : vec.at("values")) {
          // 17 significant digits read back to the exact double.
          const double w = std::strtod(want.get<std::string>().c_str(), nullptr);
          EXPECT_EQ(std::bit_cast<uint64_t>(g.uniform_double()), std::bit_cast<uint64_t>(w))
              << what;
          ++compared;
        }
      } else if (key == "linear_3_2") {
        Generator g(seed);
        Tensor weight({2, 3});
        Tensor bias({2});
        attn::init_linear_(weight, &bias, g);
        compared += expect_golden(vec.at("weight"), weight, what + ".weight");
        compared += expect_golden(vec.at("bias"), bias, what + ".bias");
        // The file's bound is kaiming_uniform_'s double, sqrt(3) * gain / sqrt(3)
        // with gain = sqrt(2 / (1 + sqrt(5)^2)); as a float it is (float)(1/sqrt(3)).
        const double bound = std::strtod(vec.at("bound").get<std::string>().c_str(), nullptr);
        const double gain = std::sqrt(2.0 / (1.0 + std::pow(std::sqrt(5.0), 2.0)));
        EXPECT_EQ(bound, std::sqrt(3.0) * (gain / std::sqrt(3.0)));
        EXPECT_EQ(static_cast<float>(bound), static_cast<float>(1.0 / std::sqrt(3.0)));
      } else if (auto it = tensor_vectors.find(key); it != tensor_vectors.end()) {
        Generator g(seed);
        compared += expect_golden(vec, it->second(g), what);
      } else {
        ADD_FAILURE() << "golden vector without a check: " << what;
      }
    }
  }

  // nn.Embedding(6, 16) after torch.manual_seed(123), through the default
  // generator and the free functions' default argument.
  for (const auto& [key, vec] : golden.items()) {
    if (key == "generator" || key == "format" || key == "seeds") continue;
    ++vectors;
    if (key == "embedding_6x16_seed123") {
      attn::manual_seed(123);
      Tensor weight({6, 16});
      attn::normal_(weight, 0.0f, 1.0f);
      compared += expect_golden(vec, weight, key);
    } else {
      ADD_FAILURE() << "golden vector without a check: " << key;
    }
  }
  EXPECT_EQ(compared, golden_value_count(golden))
      << "some values of the golden file were not compared";
  std::cout << "[ RandomGolden ] " << compared << " values in " << vectors
            << " vectors bit-exact\n";
}

// ---- seeding and the engine ----------------------------------------------------------

TEST(Random, OnlyTheLow32BitsOfTheSeedReachMT19937) {
  Generator a(123);
  Generator b((uint64_t{1} << 32) + 123);
  Generator c(static_cast<uint64_t>(int64_t{-1}));  // torch.manual_seed(-1)
  Generator d(0xffffffffULL);
  EXPECT_EQ(b.initial_seed(), (uint64_t{1} << 32) + 123);
  for (int i = 0; i < 1000; ++i) {
    EXPECT_EQ(a.random(), b.random());
    EXPECT_EQ(c.random(), d.random());
  }
}

TEST(Random, Random64TakesTheFirstDrawAsTheHighWord) {
  Generator a(7);
  Generator b(7);
  for (int i = 0; i < 700; ++i) {  // past one full MT state of 624 words
    const uint64_t hi = b.random();
    const uint64_t lo = b.random();
    EXPECT_EQ(a.random64(), (hi << 32) | lo);
  }
}

TEST(Random, ManualSeedRestartsTheStreamAndClearsTheNormalCache) {
  Generator g(123);
  const double first = g.normal_double();  // leaves the sine half in the cache
  const double second = g.normal_double();
  g.manual_seed(123);
  EXPECT_EQ(g.normal_double(), first);
  g.normal_double();  // consumes the cache
  g.manual_seed(123);
  g.normal_double();
  g.manual_seed(123);  // a reseed with a value still cached drops it
  EXPECT_EQ(g.normal_double(), first);
  EXPECT_EQ(g.normal_double(), second);
}

TEST(Random, FreeFunctionsUseTheDefaultGenerator) {
  attn::manual_seed(99);
  const Tensor a = attn::rand({5});
  Generator g(99);
  const Tensor b = attn::rand({5}, g);
  EXPECT_EQ(a.to_vector(), b.to_vector());
  EXPECT_EQ(attn::default_generator().initial_seed(), 99u);
}

// ---- draw counts ---------------------------------------------------------------

// Whether a and b are at the same point of their streams (same seed assumed).
bool same_position(Generator& a, Generator& b) {
  return a.random() == b.random() && a.random() == b.random();
}

TEST(Random, DrawCounts) {
  Generator g(5);
  Generator ref(5);
  attn::rand({3, 4}, g);  // one draw each
  for (int i = 0; i < 12; ++i) ref.random();
  EXPECT_TRUE(same_position(g, ref));

  attn::dropout_noise({7}, 0.5f, g);  // two draws each
  for (int i = 0; i < 14; ++i) ref.random();
  EXPECT_TRUE(same_position(g, ref));

  attn::dropout_noise({100}, 0.0f, g);  // p == 0 and p == 1 draw nothing
  attn::dropout_noise({100}, 1.0f, g);
  attn::dropout_noise({0}, 0.5f, g);
  EXPECT_TRUE(same_position(g, ref));

  attn::randn({17}, g);  // 17 uniforms, then 16 more for the tail block
  for (int i = 0; i < 33; ++i) ref.random();
  EXPECT_TRUE(same_position(g, ref));

  attn::randn({3}, g);  // two Box-Muller pairs of double uniforms, one value cached
  for (int i = 0; i < 8; ++i) ref.random();
  EXPECT_TRUE(same_position(g, ref));
  attn::randn({1}, g);  // the cached value: no draws
  EXPECT_TRUE(same_position(g, ref));

  Tensor w({4, 3});
  Tensor b({4});
  attn::init_linear_(w, &b, g);  // out*in + out
  for (int i = 0; i < 16; ++i) ref.random();
  EXPECT_TRUE(same_position(g, ref));
}

TEST(Random, DropoutValues) {
  Generator g(1);
  const Tensor ones = attn::dropout_noise({2, 3}, 0.0f, g);
  const Tensor zeros = attn::dropout_noise({2, 3}, 1.0f, g);
  for (int64_t i = 0; i < 6; ++i) {
    EXPECT_EQ(ones[i], 1.0f);
    EXPECT_EQ(zeros[i], 0.0f);
  }
  const Tensor half = attn::dropout_noise({1000}, 0.5f, g);
  const Tensor tenth = attn::dropout_noise({1000}, 0.1f, g);
  int kept = 0;
  for (int64_t i = 0; i < 1000; ++i) {
    EXPECT_TRUE(half[i] == 0.0f || half[i] == 2.0f);
    EXPECT_TRUE(tenth[i] == 0.0f || tenth[i] == 1.0f / 0.9f);
    kept += half[i] != 0.0f;
  }
  EXPECT_NEAR(kept, 500, 60);  // binomial(1000, 0.5): sd 16
}

// ---- sizes around the 16-wide block ------------------------------------------------

TEST(Random, RandnSizesAroundTheBlock) {
  for (int64_t n : {1, 2, 15, 16, 17, 31, 32, 33, 63, 64, 65, 255, 256, 257}) {
    Generator g(42);
    const Tensor x = attn::randn({n}, g);
    ASSERT_EQ(x.numel(), n);
    EXPECT_FALSE(attn::has_non_finite(x)) << n;
    if (n < 16) {
      // The scalar path is a prefix property: randn(n) starts randn(n + 1)...
      Generator h(42);
      const Tensor longer = attn::randn({n + 1}, h);
      if (n + 1 < 16) {
        for (int64_t i = 0; i < n; ++i) EXPECT_EQ(x[i], longer[i]) << n;
      }
      continue;
    }
    // ...the vectorised one is blockwise: full blocks agree with the
    // multiple-of-16 size below, up to where the redrawn tail block starts.
    const int64_t full = n / 16 * 16;
    Generator h(42);
    const Tensor blocks = attn::randn({full}, h);
    const int64_t same_until = n % 16 == 0 ? n : n - 16;
    for (int64_t i = 0; i < same_until; ++i) EXPECT_EQ(x[i], blocks[i]) << n << " at " << i;
    if (n % 16 != 0) {
      int differ = 0;
      for (int64_t i = same_until; i < full; ++i) differ += x[i] != blocks[i];
      EXPECT_GT(differ, 0) << n << ": the tail block is redrawn";
    }
  }
  EXPECT_EQ(attn::randn({0}).numel(), 0);
  EXPECT_EQ(attn::rand({2, 0, 3}).numel(), 0);
}

// ---- statistics ----------------------------------------------------------------------

void expect_moments(const std::vector<double>& x, double mean, double var, const char* what) {
  double s = 0.0;
  double s2 = 0.0;
  for (double v : x) s += v;
  const double m = s / static_cast<double>(x.size());
  for (double v : x) s2 += (v - m) * (v - m);
  const double sample_var = s2 / static_cast<double>(x.size() - 1);
  // 200000 samples: the sample mean's sd is sqrt(var / n) < 0.0023 here.
  EXPECT_NEAR(m, mean, 0.012 * std::sqrt(var)) << what;
  EXPECT_NEAR(sample_var, var, 0.02 * var) << what;
}

TEST(Random, Moments) {
  constexpr int64_t n = 200000;
  Generator g(2024);
  const Tensor u = attn::rand({n}, g);
  const Tensor z = attn::randn({n}, g);
  Tensor y({n});
  attn::normal_(y, 3.0f, 0.5f, g);
  std::vector<double> uv(u.values().begin(), u.values().end());
  std::vector<double> zv(z.values().begin(), z.values().end());
  std::vector<double> yv(y.values().begin(), y.values().end());
  std::vector<double> scalar;
  for (int64_t i = 0; i < n; ++i) scalar.push_back(g.normal_double());
  for (double v : uv) ASSERT_TRUE(v >= 0.0 && v < 1.0);
  expect_moments(uv, 0.5, 1.0 / 12.0, "rand");
  expect_moments(zv, 0.0, 1.0, "randn (vectorised)");
  expect_moments(yv, 3.0, 0.25, "normal_(3, 0.5)");
  expect_moments(scalar, 0.0, 1.0, "normal_double");
}

TEST(Random, LinearInitStaysInsideTheBound) {
  for (int64_t d_in : {1, 2, 15, 16, 17, 64, 65, 768}) {
    Generator g(d_in);
    Tensor w({5, d_in});
    Tensor b({5});
    attn::init_linear_(w, &b, g);
    const auto bound = static_cast<float>(1.0 / std::sqrt(static_cast<double>(d_in)));
    for (float v : w.values()) EXPECT_LE(std::fabs(v), bound) << d_in;
    for (float v : b.values()) EXPECT_LE(std::fabs(v), bound) << d_in;
  }
}

// ---- the Cephes functions ----------------------------------------------------------

TEST(Random, CephesLogIsAccurate) {
  // Every 1 - u the sampler can pass: k * 2^-24 for k in 1..2^24 (sampled).
  double worst = 0.0;
  for (uint32_t k = 1; k <= (1u << 24); k += 997) {
    const float x = static_cast<float>(k) * 0x1p-24f;
    const double exact = std::log(static_cast<double>(x));
    const double err =
        std::fabs(attn::detail::cephes_logf(x) - exact) / std::max(std::fabs(exact), 1e-30);
    worst = std::max(worst, err);
  }
  EXPECT_LT(worst, 4e-7);
  EXPECT_EQ(attn::detail::cephes_logf(1.0f), 0.0f);
  EXPECT_TRUE(std::isnan(attn::detail::cephes_logf(0.0f)));
  EXPECT_TRUE(std::isnan(attn::detail::cephes_logf(-2.0f)));
}

TEST(Random, CephesSinCosIsAccurate) {
  double worst = 0.0;
  for (int i = 0; i < 100000; ++i) {
    const float theta = 6.2831855f * static_cast<float>(i) / 100000.0f;
    const attn::detail::SinCos sc = attn::detail::cephes_sincosf(theta);
    worst = std::max(worst, std::fabs(sc.sin - std::sin(static_cast<double>(theta))));
    worst = std::max(worst, std::fabs(sc.cos - std::cos(static_cast<double>(theta))));
  }
  EXPECT_LT(worst, 2e-7);
  const attn::detail::SinCos zero = attn::detail::cephes_sincosf(0.0f);
  EXPECT_EQ(bits_of(zero.sin), 0u);
  EXPECT_EQ(zero.cos, 1.0f);
  const attn::detail::SinCos neg = attn::detail::cephes_sincosf(-1.0f);  // sin is odd, cos even
  const attn::detail::SinCos pos = attn::detail::cephes_sincosf(1.0f);
  EXPECT_EQ(neg.sin, -pos.sin);
  EXPECT_EQ(neg.cos, pos.cos);
}

// ---- bad input ----------------------------------------------------------------------

template <typename F>
std::string message_of(F&& f) {
  try {
    f();
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "(no std::invalid_argument thrown)";
}

TEST(Random, BadInputNamesTheValues) {
  Generator g(1);
  EXPECT_EQ(message_of([&] { attn::dropout_noise({3}, -0.1f, g); }),
            "dropout: probability p must be in [0, 1], got p=-0.1");
  EXPECT_EQ(message_of([&] { attn::dropout_noise({3}, 1.5f, g); }),
            "dropout: probability p must be in [0, 1], got p=1.5");
  EXPECT_EQ(
      message_of([&] { attn::dropout_noise({3}, std::numeric_limits<float>::quiet_NaN(), g); }),
      "dropout: probability p must be in [0, 1], got p=nan");

  Tensor v({6});
  EXPECT_EQ(message_of([&] { attn::init_linear_(v, nullptr, g); }),
            "init_linear_: weight must be 2-D (out_features, in_features), got shape (6,)");
  Tensor w3({2, 3, 4});
  EXPECT_EQ(message_of([&] { attn::init_linear_(w3, nullptr, g); }),
            "init_linear_: weight must be 2-D (out_features, in_features), got shape (2, 3, 4)");
  Tensor w({2, 3});
  Tensor bad_bias({3});
  EXPECT_EQ(message_of([&] { attn::init_linear_(w, &bad_bias, g); }),
            "init_linear_: bias shape (3,) does not match weight shape (2, 3) (expected (2,))");
  Tensor bias_2d({2, 1});
  EXPECT_EQ(message_of([&] { attn::init_linear_(w, &bias_2d, g); }),
            "init_linear_: bias shape (2, 1) does not match weight shape (2, 3) (expected (2,))");

  EXPECT_EQ(message_of([&] { attn::uniform_(w, 1.0f, 0.5f, g); }),
            "uniform_: expects a [from, to) range with from <= to, got from=1 and to=0.5");
  EXPECT_EQ(message_of([&] { attn::uniform_(w, -3e38f, 3e38f, g); }),
            "uniform_: to - from must be finite, got from=-3e+38 and to=3e+38");
  EXPECT_EQ(message_of([&] { attn::normal_(w, 0.0f, -1.0f, g); }),
            "normal_: expects std >= 0, got std=-1");
  EXPECT_THROW(attn::rand({-1, 2}, g), std::invalid_argument);
}

}  // namespace
