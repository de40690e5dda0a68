// attn::Tensor against PyTorch 1.13 (tests/torch/oracle_tensor.py): float32 ->
// bfloat16 bit for bit, the shape, strides, offset and storage sharing of
// every view case, and str() of bfloat16 and int64 tensors byte for byte.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <string>

#include "attn/ops.h"
#include "attn/print.h"
#include "attn/tensor.h"
#include "oracle.h"

using attn::BFloat16;
using attn::DType;
using attn::Shape;
using attn::Tensor;
using nlohmann::json;

namespace {

const json& tensor_oracle() {
  static const json j = attn::test::read_oracle_json("tensor.json", "oracle_tensor.py");
  return j;
}

// The same op names and arguments as oracle_tensor.py's apply().
Tensor apply(Tensor x, const json& ops) {
  for (const json& op : ops) {
    const std::string name = op.at(0);
    if (name == "transpose") {
      x = x.transpose(op.at(1), op.at(2));
    } else if (name == "reshape") {
      x = x.reshape(op.at(1).get<Shape>());
    } else if (name == "view") {
      x = x.view(op.at(1).get<Shape>());
    } else if (name == "permute") {
      x = x.permute(op.at(1).get<Shape>());
    } else if (name == "slice") {
      x = x.slice(op.at(1), op.at(2), op.at(3));
    } else if (name == "select") {
      x = x.select(op.at(1), op.at(2));
    } else if (name == "unsqueeze") {
      x = x.unsqueeze(op.at(1));
    } else if (name == "squeeze") {
      x = x.squeeze(op.at(1));
    } else if (name == "contiguous") {
      x = x.contiguous();
    } else {
      throw std::invalid_argument("tensor.json: unknown op " + name);
    }
  }
  return x;
}

}  // namespace

TEST(TensorTorch, BFloat16ConversionIsBitExact) {
  const json& c = tensor_oracle().at("bf16");
  const auto in = c.at("float_bits").get<std::vector<uint32_t>>();
  const auto want = c.at("bf16_bits").get<std::vector<uint16_t>>();
  ASSERT_EQ(in.size(), want.size());
  ASSERT_GE(in.size(), 1000u);
  std::vector<float> values(in.size());
  std::memcpy(values.data(), in.data(), in.size() * sizeof(float));
  // One by one, and through a whole tensor's to(kBFloat16).
  const Tensor bf = Tensor({static_cast<int64_t>(values.size())}, values).to(DType::kBFloat16);
  const BFloat16* got = bf.data_ptr<BFloat16>();
  size_t mismatches = 0;
  for (size_t i = 0; i < in.size(); ++i) {
    const uint16_t one = attn::to_bfloat16(values[i]).bits;
    if (one != want[i] || got[i].bits != want[i]) {
      ++mismatches;
      ADD_FAILURE() << "float bits 0x" << std::hex << in[i] << ": torch 0x" << want[i] << ", attn 0x"
                    << one;
    }
  }
  EXPECT_EQ(mismatches, 0u);
  // bfloat16 -> float32 is exact: the widened value has the same top half.
  const Tensor back = bf.to(DType::kFloat32);
  for (size_t i = 0; i < in.size(); ++i) {
    uint32_t u;
    const float f = back.data()[i];
    std::memcpy(&u, &f, sizeof u);
    if (std::isnan(f)) continue;
    EXPECT_EQ(u >> 16, want[i]) << i;
    EXPECT_EQ(u & 0xFFFFu, 0u) << i;
  }
  std::printf("  %zu float32 -> bfloat16 conversions bit-identical to torch's\n", in.size());
}

TEST(TensorTorch, ViewsHaveTorchsLayout) {
  const json& cases = tensor_oracle().at("views");
  ASSERT_GE(cases.size(), 25u);
  for (const json& c : cases) {
    const std::string name = c.at("name");
    const Shape shape = c.at("shape").get<Shape>();
    const Tensor x = Tensor::arange(attn::shape_numel(shape)).view(shape);
    const Tensor y = apply(x, c.at("ops"));
    const json& r = c.at("result");
    EXPECT_EQ(y.shape(), r.at("shape").get<Shape>()) << name;
    EXPECT_EQ(y.strides(), r.at("stride").get<Shape>()) << name;
    EXPECT_EQ(y.storage_offset(), r.at("storage_offset").get<int64_t>()) << name;
    EXPECT_EQ(y.is_contiguous(), r.at("is_contiguous").get<bool>()) << name;
    EXPECT_EQ(y.shares_storage_with(x), r.at("shares_storage").get<bool>()) << name;
    EXPECT_EQ(y.to_vector(), r.at("values").get<std::vector<float>>()) << name;
  }
}

TEST(TensorTorch, BFloat16AndInt64PrintLikeTorch) {
  const json& cases = tensor_oracle().at("print");
  ASSERT_GE(cases.size(), 15u);
  for (const json& c : cases) {
    const std::string name = c.at("name");
    Tensor t;
    if (c.at("dtype") == "int64") {
      t = Tensor::from_int64(c.at("tensor").at("shape").get<Shape>(),
                             c.at("tensor").at("values").get<std::vector<int64_t>>());
    } else {
      t = attn::test::tensor_from_bits_json(c.at("tensor")).to(DType::kBFloat16);
    }
    EXPECT_EQ(attn::to_string(t), c.at("str").get<std::string>()) << name;
  }
}
