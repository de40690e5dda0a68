// The Tensor container: shape bookkeeping, checked element access, comparisons.
#include "attn/tensor.h"

#include <cmath>
#include <stdexcept>

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace attn {

std::string shape_str(const Shape& shape) {
  if (shape.size() == 1) return fmt::format("({},)", shape[0]);
  return fmt::format("({})", fmt::join(shape, ", "));
}

int64_t shape_numel(const Shape& shape) {
  int64_t n = 1;
  for (int64_t s : shape) {
    if (s < 0) throw std::invalid_argument(fmt::format("negative size in shape {}", shape_str(shape)));
    n *= s;
  }
  return n;
}

Tensor::Tensor(Shape shape, float fill)
    : shape_(std::move(shape)), values_(static_cast<size_t>(shape_numel(shape_)), fill) {}

Tensor::Tensor(Shape shape, std::vector<float> values) : shape_(std::move(shape)), values_(std::move(values)) {
  if (shape_numel(shape_) != static_cast<int64_t>(values_.size())) {
    throw std::invalid_argument(fmt::format("Tensor: shape {} holds {} values, got {}", shape_str(shape_),
                                            shape_numel(shape_), values_.size()));
  }
}

Tensor Tensor::of(Shape shape, std::initializer_list<float> values) {
  return Tensor(std::move(shape), std::vector<float>(values));
}

Tensor Tensor::arange(int64_t n) {
  Tensor t({n});
  for (int64_t i = 0; i < n; ++i) t.values_[static_cast<size_t>(i)] = static_cast<float>(i);
  return t;
}

int64_t Tensor::size(int64_t d) const {
  const int64_t nd = dim();
  const int64_t k = d < 0 ? d + nd : d;
  if (k < 0 || k >= nd) {
    throw std::out_of_range(fmt::format("Tensor::size: dim {} out of range for shape {}", d, shape_str(shape_)));
  }
  return shape_[static_cast<size_t>(k)];
}

float& Tensor::operator[](int64_t i) {
  if (i < 0 || i >= numel()) {
    throw std::out_of_range(fmt::format("Tensor: flat index {} out of range for {} elements", i, numel()));
  }
  return values_[static_cast<size_t>(i)];
}

float Tensor::operator[](int64_t i) const { return const_cast<Tensor&>(*this)[i]; }

int64_t Tensor::offset(std::initializer_list<int64_t> index) const {
  if (static_cast<int64_t>(index.size()) != dim()) {
    throw std::out_of_range(
        fmt::format("Tensor::at: {} indices for shape {}", index.size(), shape_str(shape_)));
  }
  int64_t off = 0;
  size_t d = 0;
  for (int64_t i : index) {
    const int64_t n = shape_[d];
    if (i < 0 || i >= n) {
      throw std::out_of_range(fmt::format("Tensor::at: index {} out of range for dim {} of shape {}", i, d,
                                          shape_str(shape_)));
    }
    off = off * n + i;
    ++d;
  }
  return off;
}

float& Tensor::at(std::initializer_list<int64_t> index) { return values_[static_cast<size_t>(offset(index))]; }
float Tensor::at(std::initializer_list<int64_t> index) const {
  return values_[static_cast<size_t>(offset(index))];
}

Tensor Tensor::reshape(Shape shape) const {
  int64_t known = 1;
  int inferred = -1;
  for (size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] == -1) {
      if (inferred >= 0) throw std::invalid_argument("reshape: only one dimension can be -1");
      inferred = static_cast<int>(d);
    } else if (shape[d] < 0) {
      throw std::invalid_argument(fmt::format("reshape: invalid size {} in {}", shape[d], shape_str(shape)));
    } else {
      known *= shape[d];
    }
  }
  if (inferred >= 0) {
    if (known == 0 || numel() % known != 0) {
      throw std::invalid_argument(
          fmt::format("reshape: shape {} is invalid for input of size {}", shape_str(shape), numel()));
    }
    shape[static_cast<size_t>(inferred)] = numel() / known;
  }
  if (shape_numel(shape) != numel()) {
    throw std::invalid_argument(
        fmt::format("reshape: shape {} is invalid for input of size {}", shape_str(shape), numel()));
  }
  return Tensor(std::move(shape), values_);
}

float Tensor::item() const {
  if (numel() != 1) {
    throw std::invalid_argument(fmt::format("item: tensor of shape {} has {} elements, not 1",
                                            shape_str(shape_), numel()));
  }
  return values_[0];
}

float max_abs_diff(const Tensor& a, const Tensor& b) {
  if (a.shape() != b.shape()) {
    throw std::invalid_argument(
        fmt::format("max_abs_diff: shapes differ: {} vs {}", shape_str(a.shape()), shape_str(b.shape())));
  }
  float m = 0.0f;
  for (int64_t i = 0; i < a.numel(); ++i) {
    const float x = a.data()[i], y = b.data()[i];
    if (std::isnan(x) != std::isnan(y)) return INFINITY;
    if (std::isnan(x)) continue;
    if (x == y) continue;  // equal infinities
    m = std::max(m, std::fabs(x - y));
  }
  return m;
}

bool allclose(const Tensor& a, const Tensor& b, float rtol, float atol) {
  if (a.shape() != b.shape()) return false;
  for (int64_t i = 0; i < a.numel(); ++i) {
    const float x = a.data()[i], y = b.data()[i];
    if (x == y) continue;
    if (!(std::fabs(x - y) <= atol + rtol * std::fabs(y))) return false;
  }
  return true;
}

bool has_non_finite(const Tensor& t) {
  for (float x : t.values()) {
    if (!std::isfinite(x)) return true;
  }
  return false;
}

}  // namespace attn
