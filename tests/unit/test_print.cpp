// PyTorch-style printing on hand-checked cases (the byte-for-byte comparison
// with torch itself is tests/torch/test_print_torch.cpp).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <sstream>

#include "attn/print.h"

using attn::Shape;
using attn::Tensor;

TEST(Print, FixedStyleWithAlignedColumns) {
  Tensor t = Tensor::of({2, 3}, {0.43f, 0.15f, 0.89f, 0.55f, 0.87f, 0.66f});
  EXPECT_EQ(attn::to_string(t),
            "tensor([[0.4300, 0.1500, 0.8900],\n        [0.5500, 0.8700, 0.6600]])");
  // A minus sign widens every column.
  EXPECT_EQ(attn::to_string(Tensor::of({3}, {-1.5f, 0.25f, 10.0f / 3.0f})),
            "tensor([-1.5000,  0.2500,  3.3333])");
}

TEST(Print, IntegerAndScientificStyles) {
  EXPECT_EQ(attn::to_string(Tensor::of({3}, {1, 2, 30})), "tensor([ 1.,  2., 30.])");
  EXPECT_EQ(attn::to_string(Tensor::of({2}, {1e-5f, 1.0f})), "tensor([1.0000e-05, 1.0000e+00])");
  EXPECT_EQ(attn::to_string(Tensor::of({2}, {-0.0f, 1.0f})),
            "tensor([-0., 1.])");  // -0 is not counted in the width
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(attn::to_string(Tensor::of({3}, {0.5f, -inf, NAN})),
            "tensor([0.5000,   -inf,    nan])");
}

TEST(Print, ScalarsEmptiesAndSuffixes) {
  EXPECT_EQ(attn::to_string(Tensor(Shape{}, std::vector<float>{0.5f})), "tensor(0.5000)");
  EXPECT_EQ(attn::to_string(Tensor()), "tensor([])");
  EXPECT_EQ(attn::to_string(Tensor({0, 3})), "tensor([], size=(0, 3))");
  attn::PrintOptions options;
  options.suffix = "grad_fn=<MmBackward0>";
  EXPECT_EQ(attn::to_string(Tensor::of({2}, {0.25f, 0.75f}), options),
            "tensor([0.2500, 0.7500], grad_fn=<MmBackward0>)");
  std::ostringstream os;
  os << Tensor::arange(3);
  EXPECT_EQ(os.str(), "tensor([0., 1., 2.])");
}

// torch.set_printoptions(sci_mode=...): the notation is forced, the width is the
// one the automatic choice gives (PyTorch 1.13); nothing to format keeps "0.".
TEST(Print, SciModeForcedKeepsTheAutomaticWidth) {
  attn::PrintOptions fixed;
  fixed.sci_mode = false;
  EXPECT_EQ(attn::to_string(Tensor::of({2, 1}, {-5.9605e-08f, 1.9868e-08f}), fixed),
            "tensor([[    -0.0000],\n        [     0.0000]])");
  EXPECT_EQ(attn::to_string(Tensor::of({2}, {1.0f, 1e9f}), fixed),
            "tensor([        1., 1000000000.])");
  EXPECT_EQ(attn::to_string(Tensor::of({2}, {0.25f, 0.5f}), fixed), "tensor([0.2500, 0.5000])");
  EXPECT_EQ(attn::to_string(Tensor::zeros({2}), fixed), "tensor([0., 0.])");
  attn::PrintOptions sci;
  sci.sci_mode = true;
  EXPECT_EQ(attn::to_string(Tensor::of({3}, {1, -2, 30}), sci),
            "tensor([1.0000e+00, -2.0000e+00, 3.0000e+01])");
  EXPECT_EQ(attn::to_string(Tensor::zeros({2}), sci), "tensor([0., 0.])");
}

TEST(Print, SummarisesAboveTheThreshold) {
  // 1001 elements: the first and last three around "...".
  EXPECT_EQ(attn::to_string(Tensor::arange(1001)),
            "tensor([   0.,    1.,    2.,  ...,  998.,  999., 1000.])");
  attn::PrintOptions options;
  options.threshold = 4;
  options.edgeitems = 1;
  EXPECT_EQ(attn::to_string(Tensor::arange(9).reshape({3, 3}), options),
            "tensor([[0.,  ..., 2.],\n        ...,\n        [6.,  ..., 8.]])");
}
