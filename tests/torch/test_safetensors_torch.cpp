// safetensors files across the language boundary, with an independent reader
// and writer on the other side (tests/torch/safetensors_numpy.py: json + numpy,
// no `safetensors` package):
//
//   Python -> attn  oracle_safetensors.py writes the state_dict of the book's
//                   MultiHeadAttention (torch.manual_seed(123)) and a file of
//                   every dtype; attn reads them, loads the weights into its own
//                   nn::MultiHeadAttention and compares every weight bit for bit
//                   and the forward output.
//   attn -> Python  attn writes the same module's weights and the same dtype
//                   tensors; /usr/bin/python3 safetensors_numpy.py reads them,
//                   checks the writer's promises, loads the weights into the
//                   book's module and returns its output.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "attn/gpt.h"
#include "attn/nn.h"
#include "attn/random.h"
#include "attn/safetensors.h"
#include "attn/state_dict.h"
#include "cli.h"
#include "oracle.h"

using attn::BFloat16;
using attn::DType;
using attn::Shape;
using attn::Tensor;
using Json = nlohmann::json;
namespace io = attn::io;

namespace {

constexpr double kTolerance = 1e-5;  // relative to max(1, max|torch|), as the module tests

attn::nn::MultiHeadAttentionOptions
mha_options() {  // the oracle's MultiHeadAttention(8, 12, 10, 0.0, 3, True)
  return {.d_in = 8,
          .d_out = 12,
          .context_length = 10,
          .dropout = 0.0f,
          .num_heads = 3,
          .qkv_bias = true};
}

// Every element's bit pattern (int64 as its value), row-major.
std::vector<int64_t> bits_of(const Tensor& t) {
  const Tensor c = t.contiguous();
  std::vector<int64_t> bits;
  for (int64_t i = 0; i < c.numel(); ++i) {
    switch (c.dtype()) {
      case DType::kFloat32: {
        uint32_t u;
        std::memcpy(&u, c.data_ptr<float>() + i, sizeof u);
        bits.push_back(u);
        break;
      }
      case DType::kBFloat16:
        bits.push_back(c.data_ptr<BFloat16>()[i].bits);
        break;
      case DType::kInt64:
        bits.push_back(c.data_ptr<int64_t>()[i]);
        break;
    }
  }
  return bits;
}

std::vector<int64_t> json_bits(const Json& j) { return j.at("bits").get<std::vector<int64_t>>(); }

bool has_name(attn::nn::Module& m, const std::string& name) {
  const auto sd = m.state_dict();
  return std::any_of(sd.begin(), sd.end(), [&](const auto& e) { return e.first == name; });
}

void expect_close(const Tensor& got, const Tensor& want, const std::string& what) {
  ASSERT_EQ(got.shape(), want.shape()) << what;
  float scale = 1.0f;
  for (float v : want.values()) scale = std::max(scale, std::fabs(v));
  const float diff = attn::max_abs_diff(got, want);
  EXPECT_LE(diff, kTolerance * scale) << what;
  std::printf("%s: max |attn - torch| = %.3g (bound %.3g)\n", what.c_str(), diff,
              kTolerance * scale);
}

// The tensors of every dtype and shape that both sides write (the oracle's list).
std::vector<std::pair<std::string, Tensor>> dtype_tensors_from(const Json& expected) {
  std::vector<std::pair<std::string, Tensor>> tensors;
  for (const auto& [name, e] : expected.items()) {
    const Shape shape = e.at("shape").get<Shape>();
    const DType dtype = io::dtype_from_safetensors(e.at("dtype").get<std::string>());
    const auto bits = json_bits(e);
    Tensor t = Tensor::empty(shape, dtype);
    for (size_t i = 0; i < bits.size(); ++i) {
      if (dtype == DType::kFloat32) {
        const auto u = static_cast<uint32_t>(bits[i]);
        std::memcpy(t.data_ptr<float>() + i, &u, sizeof u);
      } else if (dtype == DType::kBFloat16) {
        t.data_ptr<BFloat16>()[i].bits = static_cast<uint16_t>(bits[i]);
      } else {
        t.data_ptr<int64_t>()[i] = bits[i];
      }
    }
    tensors.emplace_back(name, t);
  }
  return tensors;
}

// Runs /usr/bin/python3 tests/torch/safetensors_numpy.py with args; its stdout as JSON.
Json run_python_reader(const std::string& args) {
  const std::string out = attn::test::temp_path("py_stdout"),
                    err = attn::test::temp_path("py_stderr");
  const std::string command = std::string("'") + ATTN_TORCH_PYTHON + "' '" + ATTN_TESTS_DIR +
                              "/torch/safetensors_numpy.py' " + args + " >'" + out + "' 2>'" + err +
                              "'";
  const int status = std::system(command.c_str());
  const std::string text = attn::test::read_text(out), error = attn::test::read_text(err);
  std::remove(out.c_str());
  std::remove(err.c_str());
  if (status != 0) {
    ADD_FAILURE() << command << "\nfailed with status " << status << ":\n" << error;
    return Json();
  }
  return Json::parse(text);
}

}  // namespace

TEST(SafetensorsTorch, LoadsTheBookMultiHeadAttentionWrittenByPython) {
  const Json oracle =
      attn::test::read_oracle_json("safetensors.json", "oracle_safetensors.py").at("mha");
  const io::SafetensorsFile file =
      io::read_safetensors(attn::test::oracle_path("safetensors_mha.safetensors"));
  EXPECT_EQ(file.metadata, oracle.at("metadata").get<decltype(file.metadata)>());
  ASSERT_EQ(file.tensors.size(), oracle.at("state_dict").size());
  for (const auto& [name, t] : file.tensors) {
    EXPECT_EQ(t.shape(), oracle.at("state_dict").at(name).at("shape").get<Shape>()) << name;
    EXPECT_EQ(bits_of(t), json_bits(oracle.at("state_dict").at(name))) << name;
  }

  attn::manual_seed(999);  // other weights, replaced by the file's
  attn::nn::MultiHeadAttention m(mha_options());
  // Both modules have the causal mask as a persistent buffer: every name loads.
  ASSERT_TRUE(has_name(m, "mask"));
  const io::LoadResult r = io::load_state_dict(m, file, /*strict=*/true);
  EXPECT_TRUE(r.missing.empty());
  EXPECT_TRUE(r.unexpected.empty());

  // Every weight bit for bit: against the file, and against attn's own module
  // made from the same seed (attn's generator is torch's).
  attn::manual_seed(123);
  attn::nn::MultiHeadAttention same_seed(mha_options());
  const auto loaded = m.state_dict(), seeded = same_seed.state_dict();
  ASSERT_EQ(loaded.size(), seeded.size());
  for (size_t i = 0; i < loaded.size(); ++i) {
    const std::string& name = loaded[i].first;
    EXPECT_EQ(bits_of(loaded[i].second), json_bits(oracle.at("state_dict").at(name))) << name;
    EXPECT_EQ(bits_of(loaded[i].second), bits_of(seeded[i].second)) << name;
  }

  m.eval();
  const Tensor x = attn::test::tensor_from_bits_json(oracle.at("x"));
  const Tensor y = attn::test::tensor_from_bits_json(oracle.at("y"));
  expect_close(m.forward(x), y, "forward of the loaded module vs torch");
}

TEST(SafetensorsTorch, ReadsEveryDTypeWrittenByPython) {
  const Json expected =
      attn::test::read_oracle_json("safetensors.json", "oracle_safetensors.py").at("dtypes");
  const io::SafetensorsFile file =
      io::read_safetensors(attn::test::oracle_path("safetensors_dtypes.safetensors"));
  EXPECT_EQ(file.metadata.at("what"), "every dtype attn reads");
  ASSERT_EQ(file.tensors.size(), expected.size());
  for (const auto& [name, t] : file.tensors) {
    const Json& e = expected.at(name);
    EXPECT_STREQ(io::safetensors_dtype_name(t.dtype()), e.at("dtype").get<std::string>().c_str())
        << name;
    EXPECT_EQ(t.shape(), e.at("shape").get<Shape>()) << name;
    EXPECT_EQ(bits_of(t), json_bits(e)) << name;
  }
  // The BF16 tensor is torch's float32 -> bfloat16 cast of recorded float32
  // values: attn's cast of the same values gives the same bits.
  const Tensor source = attn::test::tensor_from_bits_json(expected.at("bf16 cube").at("from_f32"));
  for (const auto& [name, t] : file.tensors) {
    if (name == "bf16 cube") {
      EXPECT_EQ(bits_of(source.to(DType::kBFloat16)), bits_of(t));
    }
  }
}

TEST(SafetensorsTorch, PythonReadsWhatAttnWrites) {
  // Every dtype: the oracle's tensors written by attn, read back by numpy.
  const Json expected =
      attn::test::read_oracle_json("safetensors.json", "oracle_safetensors.py").at("dtypes");
  const std::string dtypes_path = attn::test::temp_path("dtypes.safetensors");
  io::write_safetensors(dtypes_path, dtype_tensors_from(expected), {{"writer", "attn"}});
  const Json dumped = run_python_reader("dump '" + dtypes_path + "'");
  ASSERT_FALSE(dumped.is_null());
  EXPECT_EQ(dumped.at("metadata"), Json({{"writer", "attn"}}));
  EXPECT_EQ(dumped.at("writer_checks"), Json({{"header_padded_to_8", true},
                                              {"ordered_by_size_then_name", true},
                                              {"metadata_first", true}}));
  ASSERT_EQ(dumped.at("tensors").size(), expected.size());
  for (const auto& [name, e] : expected.items()) {
    const Json& got = dumped.at("tensors").at(name);
    EXPECT_EQ(got.at("dtype"), e.at("dtype")) << name;
    EXPECT_EQ(got.at("shape"), e.at("shape")) << name;
    EXPECT_EQ(json_bits(got), json_bits(e)) << name;
  }

  // The module: attn's MultiHeadAttention from seed 123 is torch's, bit for bit;
  // torch runs it on attn's input.
  attn::manual_seed(123);
  attn::nn::MultiHeadAttention m(mha_options());
  const std::string weights = attn::test::temp_path("mha.safetensors");
  const std::string input = attn::test::temp_path("x.safetensors");
  io::save_state_dict(m, weights, {{"model", "MultiHeadAttention"}});
  const Tensor x = attn::randn({2, 5, 8});
  io::write_safetensors(input, {{"x", x}});
  const Json result = run_python_reader("mha '" + weights + "' '" + input + "'");
  ASSERT_FALSE(result.is_null());
  EXPECT_TRUE(result.at("equal_to_seed_123").get<bool>()) << result.at("mismatches");
  EXPECT_EQ(result.at("unexpected_keys"), Json::array());
  EXPECT_EQ(result.at("missing_keys"), Json::array());  // the mask buffer too
  m.eval();
  Json y_json = result.at("y");
  expect_close(m.forward(x), attn::test::tensor_from_bits_json(y_json),
               "attn forward vs torch on attn's file");
  std::remove(dtypes_path.c_str());
  std::remove(weights.c_str());
  std::remove(input.c_str());
}

// The book's whole GPTModel both ways: a state_dict written by Python loads
// strictly into attn's GPTModel (every key, the attention's mask buffers
// included) and gives torch's logits; attn's model, saved, loads strictly into
// the book's class in Python and gives attn's logits.
TEST(SafetensorsTorch, GptWeightsGoBothWaysWithTheSameLogits) {
  const Json oracle = attn::test::read_oracle_json("safetensors.json", "oracle_safetensors.py").at("gpt");
  const Json& c = oracle.at("config");
  const attn::nn::GPTConfig cfg{.vocab_size = c.at("vocab_size"),
                                .context_length = c.at("context_length"),
                                .emb_dim = c.at("emb_dim"),
                                .n_heads = c.at("n_heads"),
                                .n_layers = c.at("n_layers"),
                                .drop_rate = c.at("drop_rate"),
                                .qkv_bias = c.at("qkv_bias")};
  const auto rows = oracle.at("ids").get<std::vector<std::vector<int64_t>>>();
  std::vector<int64_t> flat;
  for (const auto& r : rows) flat.insert(flat.end(), r.begin(), r.end());
  const Tensor ids = Tensor::from_int64({static_cast<int64_t>(rows.size()), static_cast<int64_t>(rows[0].size())}, flat);

  attn::manual_seed(5);  // other weights, all replaced by the file's
  attn::nn::GPTModel model(cfg);
  const io::LoadResult r =
      io::load_state_dict(model, attn::test::oracle_path("safetensors_gpt.safetensors"), /*strict=*/true);
  EXPECT_TRUE(r.missing.empty());
  EXPECT_TRUE(r.unexpected.empty());
  model.eval();
  expect_close(model.forward(ids), attn::test::tensor_from_bits_json(oracle.at("logits")),
               "attn GPTModel on the book's weights vs torch");

  // And back: attn's own model (another seed) read by the book's class.
  attn::manual_seed(11);
  attn::nn::GPTModel mine(cfg);
  mine.eval();
  const std::string weights = attn::test::temp_path("gpt.safetensors"),
                    input = attn::test::temp_path("ids.safetensors");
  io::save_state_dict(mine, weights, {{"model", "GPTModel"}});
  io::write_safetensors(input, {{"ids", ids}});
  const Json result = run_python_reader("gpt '" + weights + "' '" + input + "'");
  ASSERT_FALSE(result.is_null());
  expect_close(mine.forward(ids), attn::test::tensor_from_bits_json(result.at("logits")),
               "attn GPTModel vs the book's GPTModel on attn's file");
  std::remove(weights.c_str());
  std::remove(input.c_str());
}
