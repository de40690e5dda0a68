// attn::sum and attn::normalize_sum over the last dim against torch 1.13, bit for bit
// (tests/torch/oracle_sum_order.py): the same float additions in the same order.
#include <gtest/gtest.h>

#include <cstring>

#include "attn/ops.h"
#include "oracle.h"

namespace {

uint32_t bits_of(float f) {
  uint32_t b = 0;
  std::memcpy(&b, &f, sizeof b);
  return b;
}

int count_bit_differences(const attn::Tensor& a, const attn::Tensor& b) {
  EXPECT_EQ(a.shape(), b.shape());
  if (a.shape() != b.shape()) return static_cast<int>(a.numel());
  int d = 0;
  for (int64_t i = 0; i < a.numel(); ++i) d += bits_of(a[i]) != bits_of(b[i]);
  return d;
}

TEST(SumOrderTorch, LastDimSumsAreBitIdentical) {
  const auto cases = attn::test::read_oracle_json("sum_order.json", "oracle_sum_order.py").at("cases");
  ASSERT_GT(cases.size(), 100u);
  for (const auto& c : cases) {
    const attn::Tensor x = attn::test::tensor_from_bits_json(c.at("x"));
    const std::string where = "shape " + attn::shape_str(x.shape());
    EXPECT_EQ(
        count_bit_differences(attn::sum(x, -1), attn::test::tensor_from_bits_json(c.at("sum"))), 0)
        << where;
    EXPECT_EQ(count_bit_differences(attn::sum(x, -1, /*keepdim=*/true).reshape({-1}),
                                    attn::test::tensor_from_bits_json(c.at("sum"))),
              0)
        << where << " keepdim";
    EXPECT_EQ(count_bit_differences(attn::normalize_sum(x, -1),
                                    attn::test::tensor_from_bits_json(c.at("normalized"))),
              0)
        << where;
  }
}

}  // namespace
