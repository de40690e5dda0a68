// attn/tensor.h - the row-major float32 tensor every part of attn speaks.
//
// A Tensor owns a contiguous buffer of float32 values in row-major (C) order
// and a shape. Element (i0, i1, ..., in) lives at offset
//   ((i0 * s1 + i1) * s2 + i2) ... * sn + in.
// Tensors have value semantics: copying a Tensor copies its values. Every op in
// attn/ops.h returns a new contiguous Tensor; there are no strided views in the
// reference path (the fused kernels in attn/kernels.h take raw pointers and
// strides instead).
//
// Dimension vocabulary used across attn:
//   B batch, T tokens, d_in / d_out embedding widths, H num_heads,
//   hd head_dim = d_out / H, context_length the longest causal input.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

namespace attn {

using Shape = std::vector<int64_t>;

// "(2, 6, 3)" - the form every error message uses for a shape.
std::string shape_str(const Shape& shape);
int64_t shape_numel(const Shape& shape);

class Tensor {
 public:
  Tensor() = default;  // an empty tensor of shape (0)
  explicit Tensor(Shape shape, float fill = 0.0f);
  Tensor(Shape shape, std::vector<float> values);  // throws if sizes differ

  static Tensor zeros(Shape shape) { return Tensor(std::move(shape), 0.0f); }
  static Tensor ones(Shape shape) { return Tensor(std::move(shape), 1.0f); }
  static Tensor full(Shape shape, float value) { return Tensor(std::move(shape), value); }
  // Tensor::of({6, 3}, {0.43f, 0.15f, ...}): a literal, row-major.
  static Tensor of(Shape shape, std::initializer_list<float> values);
  // 0, 1, ..., n-1 as float.
  static Tensor arange(int64_t n);

  const Shape& shape() const { return shape_; }
  int64_t dim() const { return static_cast<int64_t>(shape_.size()); }
  // size(-1) is the last dimension; throws std::out_of_range naming the dims.
  int64_t size(int64_t d) const;
  int64_t numel() const { return static_cast<int64_t>(values_.size()); }
  bool empty() const { return values_.empty(); }

  float* data() { return values_.data(); }
  const float* data() const { return values_.data(); }
  std::vector<float>& values() { return values_; }
  const std::vector<float>& values() const { return values_; }

  // Flat element access (row-major offset), bounds-checked.
  float& operator[](int64_t i);
  float operator[](int64_t i) const;
  // Multi-index access, bounds-checked: t.at({b, i, j}).
  float& at(std::initializer_list<int64_t> index);
  float at(std::initializer_list<int64_t> index) const;

  // Same values, new shape; one entry may be -1 (inferred). Throws if numel differs.
  Tensor reshape(Shape shape) const;
  // The scalar value of a one-element tensor; throws otherwise.
  float item() const;

 private:
  int64_t offset(std::initializer_list<int64_t> index) const;
  Shape shape_{0};
  std::vector<float> values_;
};

// Element-wise comparison helpers for tests and checks.
float max_abs_diff(const Tensor& a, const Tensor& b);  // throws on shape mismatch
bool allclose(const Tensor& a, const Tensor& b, float rtol = 1e-5f, float atol = 1e-8f);
bool has_non_finite(const Tensor& t);

}  // namespace attn
