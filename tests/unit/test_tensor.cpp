// The Tensor container: construction, checked access, reshape, comparisons.
#include <gtest/gtest.h>

#include <cmath>
#include <stdexcept>

#include "attn/tensor.h"

using attn::Tensor;

TEST(Tensor, ShapeAndValues) {
  Tensor t = Tensor::of({2, 3}, {1, 2, 3, 4, 5, 6});
  EXPECT_EQ(t.dim(), 2);
  EXPECT_EQ(t.numel(), 6);
  EXPECT_EQ(t.size(-1), 3);
  EXPECT_EQ(t.at({1, 2}), 6.0f);
  EXPECT_EQ(t[4], 5.0f);
  EXPECT_EQ(attn::shape_str(t.shape()), "(2, 3)");
  EXPECT_EQ(attn::shape_str({5}), "(5,)");
}

TEST(Tensor, CheckedAccessNamesTheValues) {
  Tensor t({2, 3});
  try {
    t.at({2, 0});
    FAIL() << "expected std::out_of_range";
  } catch (const std::out_of_range& e) {
    EXPECT_STREQ(e.what(), "Tensor::at: index 2 out of range for dim 0 of shape (2, 3)");
  }
  EXPECT_THROW(t[6], std::out_of_range);
  EXPECT_THROW(t.size(2), std::out_of_range);
  EXPECT_THROW(Tensor({2, 2}, std::vector<float>{1, 2, 3}), std::invalid_argument);
}

TEST(Tensor, Reshape) {
  Tensor t = Tensor::arange(12);
  Tensor r = t.reshape({3, -1});
  EXPECT_EQ(r.shape(), (attn::Shape{3, 4}));
  EXPECT_EQ(r.at({2, 1}), 9.0f);
  try {
    t.reshape({5, -1});
    FAIL();
  } catch (const std::invalid_argument& e) {
    EXPECT_STREQ(e.what(), "reshape: shape (5, -1) is invalid for input of size 12");
  }
}

TEST(Tensor, Comparisons) {
  Tensor a = Tensor::of({3}, {1.0f, 2.0f, NAN});
  Tensor b = Tensor::of({3}, {1.0f, 2.5f, NAN});
  EXPECT_FLOAT_EQ(attn::max_abs_diff(a, b), 0.5f);
  EXPECT_TRUE(attn::has_non_finite(a));
  EXPECT_FALSE(attn::allclose(a, b));
  EXPECT_TRUE(attn::allclose(Tensor::of({1}, {1.0f}), Tensor::of({1}, {1.000001f})));
}
