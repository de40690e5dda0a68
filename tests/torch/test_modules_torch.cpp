// Differential tests of every module against PyTorch 1.13, same seed on both sides.
//
// tests/torch/oracle_modules.py runs the chapter's PyTorch classes
// (tests/torch/book_modules.py) on 60 random configurations per module kind and
// writes modules_<kind>.json (plus three MultiHeadAttention cases at GPT-2 sizes,
// 768/12 and 1600/25, whose weight gradients are stored as every 1009th value). Here attn runs the
// identical protocol:
//   manual_seed(seed); construct the module (draws its parameters);
//   eval() if the case says so; x = randn(x_shape); y = forward(x) (dropout draws);
//   dy = randn(y.shape); dx = backward(dy)
// (twice without zero_grad in the cases marked "passes": 2, so grads accumulate)
// and is compared with PyTorch in three steps:
//  1. Random numbers, exactly: the initial parameters (by PyTorch name, in
//     PyTorch's order), x and dy must have the same float32 bits as PyTorch's
//     (CRC-32 of the bytes). A mismatch is reported as a generator or draw-order
//     bug and the case's numerical comparisons are skipped.
//  2. The output y, dL/dx and every parameter gradient, with the tolerance
//        max|attn - torch| <= 1e-5 * max(1, max|torch|)
//     widened, only where float32 itself cannot do that well, to
//        4 * err64,
//     err64 being PyTorch's own float32-vs-float64 difference on that tensor
//     (recorded by the oracle; it matters for SelfAttention_v1, whose rand(0, 1)
//     weights give large, nearly saturated softmax scores).
//  3. A summary line per kind with the largest differences seen, also stored as
//     test properties (max_diff_y, max_diff_dx, max_diff_dparam, worst_ratio,
//     worst_base_ratio: the same against the plain 1e-5 rule).
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <iomanip>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "attn/nn.h"
#include "attn/random.h"
#include "attn/tensor.h"
#include "oracle.h"

namespace {

using attn::Shape;
using attn::Tensor;
using Json = nlohmann::ordered_json;  // keeps PyTorch's parameter order

static_assert(std::endian::native == std::endian::little,
              "the oracle stores float32 little-endian bytes");

constexpr double kTolerance = 1e-5;   // relative to max(1, max|torch|)
constexpr double kErr64Factor = 4.0;  // widening for ill-conditioned tensors
constexpr int kMinCasesPerKind = 50;

// ---- decoding the oracle's tensors ----------------------------------------------------

using attn::test::crc32;

std::vector<unsigned char> base64_decode(const std::string& text) {
  auto value = [](char ch) -> int {
    if (ch >= 'A' && ch <= 'Z') return ch - 'A';
    if (ch >= 'a' && ch <= 'z') return ch - 'a' + 26;
    if (ch >= '0' && ch <= '9') return ch - '0' + 52;
    if (ch == '+') return 62;
    if (ch == '/') return 63;
    return -1;
  };
  std::vector<unsigned char> out;
  out.reserve(text.size() / 4 * 3);
  uint32_t acc = 0;
  int bits = 0;
  for (char ch : text) {
    if (ch == '=') break;
    const int v = value(ch);
    if (v < 0) throw std::runtime_error(std::string("base64: bad character '") + ch + "'");
    acc = (acc << 6) | static_cast<uint32_t>(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out.push_back(static_cast<unsigned char>((acc >> bits) & 0xFFu));
    }
  }
  return out;
}

// {"shape", "f32le" (base64 of float32 little-endian), "crc32"} -> the reference.
// A GPT-2-sized tensor is stored as every stride-th value of its flat form
// (with "stride" and "absmax", the largest |value| of the whole tensor).
struct Reference {
  Shape shape;
  Tensor values;       // (numel) when stride == 1 reshaped to shape; else the samples
  int64_t stride = 1;  // values[i] is element i * stride of the flat tensor
  double absmax = 0.0;
};

Reference packed_tensor(const Json& j) {
  Reference r;
  r.shape = j.at("shape").get<Shape>();
  r.stride = j.value("stride", int64_t{1});
  const int64_t total = attn::shape_numel(r.shape);
  const int64_t n = r.stride == 1 ? total : (total + r.stride - 1) / r.stride;
  const std::vector<unsigned char> bytes = base64_decode(j.at("f32le").get<std::string>());
  if (static_cast<int64_t>(bytes.size()) != n * static_cast<int64_t>(sizeof(float)))
    throw std::runtime_error("oracle tensor of shape " + attn::shape_str(r.shape) + " holds " +
                             std::to_string(bytes.size()) + " bytes");
  std::vector<float> values(static_cast<size_t>(n));
  if (n > 0) std::memcpy(values.data(), bytes.data(), bytes.size());
  r.values = Tensor(r.stride == 1 ? r.shape : Shape{n}, std::move(values));
  if (crc32(r.values) != j.at("crc32").get<uint32_t>())
    throw std::runtime_error("oracle tensor fails its CRC-32: the file is damaged");
  for (float v : r.values.values())
    r.absmax = std::max(r.absmax, static_cast<double>(std::fabs(v)));
  r.absmax = std::max(r.absmax, j.value("absmax", 0.0));
  return r;
}

Json read_kind(const std::string& kind) {
  return attn::test::read_oracle_json<Json>("modules_" + kind + ".json", "oracle_modules.py");
}

// ---- comparison and the per-kind summary ---------------------------------------------

struct Summary {
  int cases = 0;
  int rng_mismatches = 0;
  int widened = 0;                // tensors whose tolerance came from err64
  double max_y = 0.0;             // largest max|attn - torch| of the output
  double max_dx = 0.0;            // ... of dL/dx
  double max_dparam = 0.0;        // ... of any parameter gradient
  double worst_ratio = 0.0;       // largest difference / tolerance
  double worst_base_ratio = 0.0;  // largest difference / 1e-5 * max(1, max|torch|)
  std::string worst_where;
};

std::string head_str(const Tensor& t, int64_t n = 4) {
  std::ostringstream s;
  s << std::setprecision(9) << "[";
  for (int64_t i = 0; i < std::min(n, t.numel()); ++i) s << (i ? ", " : "") << t[i];
  s << "]";
  return s.str();
}

// Step 1: the same bits as PyTorch's tensor whose fingerprint is fp.
bool same_draws(const Tensor& got, const Json& fp, const std::string& what) {
  const Shape shape = fp.at("shape").get<Shape>();
  if (got.shape() != shape) {
    ADD_FAILURE() << what << ": shape " << attn::shape_str(got.shape()) << ", torch has "
                  << attn::shape_str(shape);
    return false;
  }
  if (crc32(got) == fp.at("crc32").get<uint32_t>()) return true;
  double sum = 0.0;
  for (float v : got.values()) sum += v;
  ADD_FAILURE() << what << " differs from PyTorch's with the same seed (random-number or "
                << "draw-order bug): attn sum " << sum << " first " << head_str(got)
                << "; torch sum " << fp.at("sum").get<double>() << " first "
                << fp.at("head").dump();
  return false;
}

// Step 2: close to PyTorch's tensor within the stated tolerance.
void expect_close(const Tensor& got, const Json& ref_json, double err64, const std::string& what,
                  double& max_seen, Summary& summary) {
  const Reference ref = packed_tensor(ref_json);
  ASSERT_EQ(attn::shape_str(got.shape()), attn::shape_str(ref.shape)) << what << ": shape";
  double diff = 0.0;
  int64_t where = 0;  // flat index into got
  for (int64_t i = 0; i < ref.values.numel(); ++i) {
    const int64_t at = i * ref.stride;
    const double d = std::fabs(static_cast<double>(got[at]) - static_cast<double>(ref.values[i]));
    if (!(d <= diff)) {  // also catches NaN
      diff = std::isnan(d) ? INFINITY : d;
      where = i;
    }
  }
  const double base = kTolerance * std::max(1.0, ref.absmax);
  const double tol = std::max(base, kErr64Factor * err64);
  if (tol > base) ++summary.widened;
  summary.worst_base_ratio = std::max(summary.worst_base_ratio, diff / base);
  max_seen = std::max(max_seen, diff);
  if (diff / tol > summary.worst_ratio) {
    summary.worst_ratio = diff / tol;
    summary.worst_where = what;
  }
  EXPECT_LE(diff, tol) << what << ": max |attn - torch| = " << diff << " at flat index "
                       << where * ref.stride << " (attn " << got[where * ref.stride] << ", torch "
                       << ref.values[where] << "), tolerance " << tol
                       << " (1e-5 * max(1, max|torch| = " << ref.absmax
                       << "), or 4 * torch's own fp32-vs-fp64 error " << err64 << ")";
}

// ---- the protocol, generic over module kinds ----------------------------------------------

Shape shape_of(const Json& j) { return j.get<Shape>(); }

// Parameters must exist under PyTorch's names, in PyTorch's order, with PyTorch's bits.
bool check_parameters(attn::nn::Module& m, const Json& c) {
  const Json& params = c.at("params");
  auto named = m.named_parameters();
  std::vector<std::string> got_names, torch_names;
  for (auto& [name, p] : named) got_names.push_back(name);
  for (auto it = params.begin(); it != params.end(); ++it) torch_names.push_back(it.key());
  if (got_names != torch_names) {
    std::string g, t;
    for (auto& n : got_names) g += n + " ";
    for (auto& n : torch_names) t += n + " ";
    ADD_FAILURE() << "parameter names/order: attn [ " << g << "], torch [ " << t << "]";
    return false;
  }
  bool ok = true;
  for (auto& [name, p] : named)
    ok = same_draws(p->value, params.at(name), "parameter " + name) && ok;
  return ok;
}

void compare_grads(attn::nn::Module& m, const Json& c, const std::string& name, Summary& s) {
  const Json& grads = c.at("grads");
  const Json& err64 = c.at("err64");
  for (auto& [pname, p] : m.named_parameters()) {
    expect_close(p->grad, grads.at(pname), err64.at(pname).get<double>(), name + " d" + pname,
                 s.max_dparam, s);
  }
}

template <class M>
using Factory = std::function<std::unique_ptr<M>(const Json& cfg)>;

// Modules with Tensor forward(const Tensor&) and Tensor backward(const Tensor&).
// Modules with Tensor forward(const Tensor&) and Tensor backward(const Tensor&).
// With "passes": 2 the step runs twice without zero_grad: parameter grads must
// accumulate; x, y, dy and dx are compared for the last pass.
template <class M>
void run_case(const Json& c, const Factory<M>& make, Summary& s) {
  const Json& cfg = c.at("config");
  const std::string name = c.at("name").get<std::string>();
  const int passes = cfg.value("passes", 1);
  attn::manual_seed(cfg.at("seed").get<uint64_t>());
  std::unique_ptr<M> m = make(cfg);
  if (!check_parameters(*m, c)) {
    ++s.rng_mismatches;
    return;
  }
  if (cfg.value("eval", false)) m->eval();
  for (int pass = 1; pass <= passes; ++pass) {
    const bool last = pass == passes;
    Tensor x = attn::randn(shape_of(cfg.at("x_shape")));
    if (last && !same_draws(x, c.at("x"), "x")) {
      ++s.rng_mismatches;
      return;
    }
    Tensor y = m->forward(x);
    if (last) {
      expect_close(y, c.at("y"), c.at("err64").at("y").get<double>(), name + " y", s.max_y, s);
    }
    Tensor dy = attn::randn(y.shape());
    if (last &&
        !same_draws(dy, c.at("dy"), "dy (drawn after forward: dropout drew a different count?)")) {
      ++s.rng_mismatches;
      return;
    }
    Tensor dx = m->backward(dy);
    if (last) {
      expect_close(dx, c.at("grads").at("x"), c.at("err64").at("x").get<double>(), name + " dx",
                   s.max_dx, s);
    }
  }
  compare_grads(*m, c, name, s);
}

// Embedding: fixed indices instead of x, no input gradient.
void run_embedding_case(const Json& c, Summary& s) {
  namespace nn = attn::nn;
  const Json& cfg = c.at("config");
  const std::string name = c.at("name").get<std::string>();
  const int passes = cfg.value("passes", 1);
  attn::manual_seed(cfg.at("seed").get<uint64_t>());
  nn::Embedding m({.num_embeddings = cfg.at("num_embeddings").get<int64_t>(),
                   .embedding_dim = cfg.at("embedding_dim").get<int64_t>()});
  if (!check_parameters(m, c)) {
    ++s.rng_mismatches;
    return;
  }
  const auto indices = cfg.at("indices").get<std::vector<int64_t>>();
  const Shape shape{cfg.at("B").get<int64_t>(), cfg.at("T").get<int64_t>()};
  for (int pass = 1; pass <= passes; ++pass) {
    const bool last = pass == passes;
    Tensor y = m.forward(indices, shape);
    if (last) {
      expect_close(y, c.at("y"), c.at("err64").at("y").get<double>(), name + " y", s.max_y, s);
    }
    Tensor dy = attn::randn(y.shape());
    if (last && !same_draws(dy, c.at("dy"), "dy")) {
      ++s.rng_mismatches;
      return;
    }
    m.backward(dy);
  }
  compare_grads(m, c, name, s);
}

template <class M>
std::function<void(const Json&, Summary&)> with(Factory<M> make) {
  return [make](const Json& c, Summary& s) { run_case<M>(c, make, s); };
}

int64_t i64(const Json& cfg, const char* key) { return cfg.at(key).get<int64_t>(); }
float f32(const Json& cfg, const char* key) { return cfg.at(key).get<float>(); }
// The options of MultiHeadAttention and of the wrapper, which share one struct.
attn::nn::MultiHeadAttentionOptions mha_options(const Json& c) {
  return {.d_in = i64(c, "d_in"),
          .d_out = i64(c, "d_out"),
          .context_length = i64(c, "context_length"),
          .dropout = f32(c, "dropout"),
          .num_heads = i64(c, "num_heads"),
          .qkv_bias = c.at("qkv_bias").get<bool>()};
}

// The C++ twin of oracle_modules.build(): kind -> how to run one case.
const std::map<std::string, std::function<void(const Json&, Summary&)>>& runners() {
  namespace nn = attn::nn;
  static const std::map<std::string, std::function<void(const Json&, Summary&)>> table = {
      {"linear", with<nn::Linear>([](const Json& c) {
         return std::make_unique<nn::Linear>(
             nn::LinearOptions{.in_features = i64(c, "in_features"),
                               .out_features = i64(c, "out_features"),
                               .bias = c.at("bias").get<bool>()});
       })},
      {"dropout", with<nn::Dropout>([](const Json& c) {
         return std::make_unique<nn::Dropout>(nn::DropoutOptions{.p = f32(c, "p")});
       })},
      {"embedding", run_embedding_case},
      {"self_attention_v1", with<nn::SelfAttentionV1>([](const Json& c) {
         return std::make_unique<nn::SelfAttentionV1>(
             nn::SelfAttentionOptions{.d_in = i64(c, "d_in"),
                                      .d_out = i64(c, "d_out"),
                                      .d_v = i64(c, "d_v"),
                                      .qkv_bias = false});
       })},
      {"self_attention_v2", with<nn::SelfAttentionV2>([](const Json& c) {
         return std::make_unique<nn::SelfAttentionV2>(
             nn::SelfAttentionOptions{.d_in = i64(c, "d_in"),
                                      .d_out = i64(c, "d_out"),
                                      .d_v = i64(c, "d_v"),
                                      .qkv_bias = c.at("qkv_bias").get<bool>()});
       })},
      {"causal_attention", with<nn::CausalAttention>([](const Json& c) {
         return std::make_unique<nn::CausalAttention>(
             nn::CausalAttentionOptions{.d_in = i64(c, "d_in"),
                                        .d_out = i64(c, "d_out"),
                                        .context_length = i64(c, "context_length"),
                                        .dropout = f32(c, "dropout"),
                                        .qkv_bias = c.at("qkv_bias").get<bool>(),
                                        .softmax_dim = i64(c, "softmax_dim")});
       })},
      {"multi_head_attention_wrapper", with<nn::MultiHeadAttentionWrapper>([](const Json& c) {
         return std::make_unique<nn::MultiHeadAttentionWrapper>(
             mha_options(c));
       })},
      {"multi_head_attention", with<nn::MultiHeadAttention>([](const Json& c) {
         return std::make_unique<nn::MultiHeadAttention>(
             mha_options(c));
       })},
      {"head", with<nn::Head>([](const Json& c) {
         return std::make_unique<nn::Head>(nn::HeadOptions{.n_embd = i64(c, "n_embd"),
                                                           .head_size = i64(c, "head_size"),
                                                           .block_size = i64(c, "block_size"),
                                                           .dropout = f32(c, "dropout"),
                                                           .causal = c.at("causal").get<bool>()});
       })},
      {"multi_head", with<nn::MultiHead>([](const Json& c) {
         return std::make_unique<nn::MultiHead>(
             nn::MultiHeadOptions{.n_embd = i64(c, "n_embd"),
                                  .num_heads = i64(c, "num_heads"),
                                  .head_size = i64(c, "head_size"),
                                  .block_size = i64(c, "block_size"),
                                  .dropout = f32(c, "dropout"),
                                  .causal = c.at("causal").get<bool>()});
       })},
  };
  return table;
}

std::string fmt_g(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3g", v);
  return buf;
}

// Runs every case of modules_<file_kind>.json with run and prints the summary.
void run_file(const std::string& file_kind, const std::function<void(const Json&, Summary&)>& run,
              int min_cases) {
  const Json file = read_kind(file_kind);
  ASSERT_EQ(file.at("kind").get<std::string>(), file_kind);
  // attn's randn follows torch's AVX2 kernel; the oracle asks torch for it, which
  // fails only on a CPU without AVX2, where x and dy would differ from the start.
  const std::string capability = file.at("cpu_capability").get<std::string>();
  if (capability != "AVX2") {
    GTEST_SKIP() << "torch ran its " << capability << " kernels, not the AVX2 ones attn reproduces";
  }
  const Json& cases = file.at("cases");
  ASSERT_GE(static_cast<int>(cases.size()), min_cases);
  Summary s;
  for (const Json& c : cases) {
    Json shown = c.at("config");
    shown.erase("indices");  // Embedding's B * T indices would drown the message
    SCOPED_TRACE(c.at("name").get<std::string>() + " " + shown.dump());
    ++s.cases;
    try {
      run(c, s);
    } catch (const std::exception& e) {
      ADD_FAILURE() << "exception: " << e.what();
    }
  }
  std::printf(
      "[  TORCH   ] %s: %d configs, max |attn - torch|: y %s, dx %s, dparam %s; "
      "worst diff/tolerance %s (%s); worst diff/(1e-5 * max(1, max|torch|)) %s; "
      "%d tensors on the fp64-based tolerance; %d random-number mismatches\n",
      file_kind.c_str(), s.cases, fmt_g(s.max_y).c_str(), fmt_g(s.max_dx).c_str(),
      fmt_g(s.max_dparam).c_str(), fmt_g(s.worst_ratio).c_str(), s.worst_where.c_str(),
      fmt_g(s.worst_base_ratio).c_str(), s.widened, s.rng_mismatches);
  ::testing::Test::RecordProperty("configs", s.cases);
  ::testing::Test::RecordProperty("max_diff_y", fmt_g(s.max_y));
  ::testing::Test::RecordProperty("max_diff_dx", fmt_g(s.max_dx));
  ::testing::Test::RecordProperty("max_diff_dparam", fmt_g(s.max_dparam));
  ::testing::Test::RecordProperty("worst_ratio", fmt_g(s.worst_ratio));
  ::testing::Test::RecordProperty("worst_base_ratio", fmt_g(s.worst_base_ratio));
  ::testing::Test::RecordProperty("rng_mismatches", s.rng_mismatches);
}

class ModulesVsTorch : public ::testing::TestWithParam<std::string> {};

TEST_P(ModulesVsTorch, SameSeedSameNumbers) {
  run_file(GetParam(), runners().at(GetParam()), kMinCasesPerKind);
}

// MultiHeadAttention at GPT-2 sizes: 768 wide with 12 heads, 1600 with 25 heads
// (head_dim 64); weight gradients compared on every 1009th value.
TEST(ModulesVsTorchGpt2, MultiHeadAttention) {
  run_file("multi_head_attention_gpt2", runners().at("multi_head_attention"), 3);
}

INSTANTIATE_TEST_SUITE_P(Torch, ModulesVsTorch,
                         ::testing::Values("linear", "dropout", "embedding", "self_attention_v1",
                                           "self_attention_v2", "causal_attention",
                                           "multi_head_attention_wrapper", "multi_head_attention",
                                           "head", "multi_head"),
                         [](const ::testing::TestParamInfo<std::string>& param_info) {
                           return param_info.param;
                         });

// The decoder itself, on a known vector: "AACAPw==" is float32 1.0 little-endian.
TEST(ModulesVsTorchDecoding, Base64AndCrc32) {
  const auto bytes = base64_decode("AACAPw==");
  ASSERT_EQ(bytes.size(), 4u);
  float one = 0.0f;
  std::memcpy(&one, bytes.data(), 4);
  EXPECT_EQ(one, 1.0f);
  const char* text = "123456789";
  EXPECT_EQ(crc32(text, 9), 0xCBF43926u);  // the CRC-32 check value
}

}  // namespace
