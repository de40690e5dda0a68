// The tensor operations of attn/ops.h, with PyTorch semantics.
//
// Layout: every op reads its inputs through float_input (contiguous float32,
// copied from a strided view when needed), so an op on dim d sees the
// tensor as (outer, n, inner) with outer = prod(shape[:d]), n = shape[d],
// inner = prod(shape[d+1:]); element (o, i, j) sits at (o * n + i) * inner + j.
// Broadcasting maps an output index to each operand through strides that are 0
// on the stretched (size-1 or missing) dims.
//
// Errors: a shape that does not fit throws std::invalid_argument, a dim or
// index outside its range throws std::out_of_range; both name the op and the
// shapes.
#include "attn/ops.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>

#include "attn/gemm.h"

namespace attn {
// ---- PyTorch's float sum order -----------------------------------------------------
// torch 1.13's CPU sum of n contiguous floats (aten/src/ATen/native/cpu/SumKernel.cpp,
// cascade_sum, inner reduction) accumulates in float in a fixed order: 4 interleaved
// accumulators ("ilp"), each a 4-level cascade of blocks of 16 rows; for n >= 8 the
// same over 8-float vectors (AVX2 lanes), then the scalar tail, then the 8 lanes in
// order. Reproducing the order reproduces its bits (checked against torch for n = 1 ..
// 20000), so a printed sum such as tensor(1.0000) versus tensor(1.) agrees too.
namespace torch_order {

struct Vec8 {
  std::array<float, 8> v{};
  Vec8& operator+=(const Vec8& o) {
    for (int l = 0; l < 8; ++l) v[l] += o.v[l];
    return *this;
  }
};
inline void add_to(float& a, float b) { a += b; }
inline void add_to(Vec8& a, const Vec8& b) { a += b; }

inline int64_t ceil_log2(int64_t x) {
  int64_t r = 0;
  while ((int64_t{1} << r) < x) ++r;
  return r;
}

// multi_row_sum with nrows = 4: rows of 4 consecutive items, item(i) for i in [0, 4 * size).
template <typename Acc, typename Item>
std::array<Acc, 4> multi_row_sum(const Item& item, int64_t size) {
  constexpr int64_t kLevels = 4, kRows = 4;
  const int64_t level_power = std::max<int64_t>(4, ceil_log2(size) / kLevels);
  const int64_t level_step = int64_t{1} << level_power;
  const int64_t level_mask = level_step - 1;
  Acc acc[kLevels][kRows] = {};
  int64_t i = 0;
  while (i + level_step <= size) {
    for (int64_t j = 0; j < level_step; ++j, ++i) {
      for (int64_t k = 0; k < kRows; ++k) add_to(acc[0][k], item(i * kRows + k));
    }
    for (int64_t j = 1; j < kLevels; ++j) {
      for (int64_t k = 0; k < kRows; ++k) {
        add_to(acc[j][k], acc[j - 1][k]);
        acc[j - 1][k] = Acc{};
      }
      if ((i & (level_mask << (j * level_power))) != 0) break;
    }
  }
  for (; i < size; ++i) {
    for (int64_t k = 0; k < kRows; ++k) add_to(acc[0][k], item(i * kRows + k));
  }
  for (int64_t j = 1; j < kLevels; ++j) {
    for (int64_t k = 0; k < kRows; ++k) add_to(acc[0][k], acc[j][k]);
  }
  return {acc[0][0], acc[0][1], acc[0][2], acc[0][3]};
}

// row_sum: n items as (n / 4, 4) partial sums, the tail into the first, then the four.
template <typename Acc, typename Item>
Acc row_sum(const Item& item, int64_t n) {
  const int64_t size_ilp = n / 4;
  std::array<Acc, 4> p = multi_row_sum<Acc>(item, size_ilp);
  for (int64_t i = size_ilp * 4; i < n; ++i) add_to(p[0], item(i));
  for (int k = 1; k < 4; ++k) add_to(p[0], p[k]);
  return p[0];
}

inline float sum(const float* x, int64_t n) {
  if (n < 8) return row_sum<float>([x](int64_t i) { return x[i]; }, n);
  const int64_t vec_size = n / 8;
  const Vec8 lanes = row_sum<Vec8>(
      [x](int64_t i) {
        Vec8 v;
        for (int l = 0; l < 8; ++l) v.v[l] = x[i * 8 + l];
        return v;
      },
      vec_size);
  float acc = 0.0f;
  for (int64_t k = vec_size * 8; k < n; ++k) acc += x[k];
  for (int l = 0; l < 8; ++l) acc += lanes.v[l];
  return acc;
}

}  // namespace torch_order

namespace {

// Every op reads float32 values in row-major order: a strided view is copied
// into a contiguous tensor first (a contiguous one is used as it is), and
// another dtype is an error that names the op.
Tensor float_input(const char* op, const Tensor& t) {
  if (t.dtype() != DType::kFloat32) {
    throw std::invalid_argument(fmt::format("{}: expected a float32 tensor, got {} of shape {}; convert it with "
                                            "to(DType::kFloat32)",
                                            op, dtype_name(t.dtype()), shape_str(t.shape())));
  }
  return t.contiguous();
}

// A dim in [-ndim, ndim) made non-negative. A 0-d tensor accepts dim 0 and -1,
// as in PyTorch (it behaves like a 1-element vector there).
int64_t wrap_dim(const char* op, int64_t dim, const Shape& shape) {
  const int64_t ndim = std::max<int64_t>(static_cast<int64_t>(shape.size()), 1);
  if (dim < -ndim || dim >= ndim) {
    throw std::out_of_range(fmt::format("{}: dim {} out of range for shape {} (expected {} to {})",
                                        op, dim, shape_str(shape), -ndim, ndim - 1));
  }
  return dim < 0 ? dim + ndim : dim;
}

int64_t prod(const Shape& shape, size_t begin, size_t end) {
  int64_t p = 1;
  for (size_t d = begin; d < end && d < shape.size(); ++d) p *= shape[d];
  return p;
}

// The (outer, n, inner) view of `shape` around dim d (d already wrapped).
struct Split {
  int64_t outer, n, inner;
};
Split split_at(const Shape& shape, int64_t d) {
  if (shape.empty()) return {1, 1, 1};  // a 0-d tensor as one element
  const auto k = static_cast<size_t>(d);
  return {prod(shape, 0, k), shape[k], prod(shape, k + 1, shape.size())};
}

// NumPy broadcasting: trailing dims aligned, each pair equal or one of them 1.
Shape broadcast_shapes(const char* op, const Shape& a, const Shape& b) {
  const size_t nd = std::max(a.size(), b.size());
  Shape out(nd);
  for (size_t i = 0; i < nd; ++i) {
    // i counts from the last dim.
    const int64_t sa = i < a.size() ? a[a.size() - 1 - i] : 1;
    const int64_t sb = i < b.size() ? b[b.size() - 1 - i] : 1;
    if (sa != sb && sa != 1 && sb != 1) {
      throw std::invalid_argument(
          fmt::format("{}: shapes {} and {} cannot be broadcast (size {} vs {} at dim {})", op,
                      shape_str(a), shape_str(b), sa, sb, static_cast<int64_t>(nd - 1 - i)));
    }
    out[nd - 1 - i] = sa == 1 ? sb : sa;
  }
  return out;
}

// Element strides of `shape` read through the broadcast shape `out`
// (out.size() >= shape.size()): 0 on dims that are missing or stretched.
std::vector<int64_t> broadcast_strides(const Shape& shape, const Shape& out) {
  std::vector<int64_t> strides(out.size(), 0);
  int64_t stride = 1;
  for (size_t i = 0; i < shape.size(); ++i) {
    const size_t d = shape.size() - 1 - i;  // dim in `shape`
    const size_t od = out.size() - 1 - i;   // the same dim in `out`
    strides[od] = shape[d] == 1 ? 0 : stride;
    stride *= shape[d];
  }
  return strides;
}

// Calls f(out_index, a_offset, b_offset) for every element of `out`, in
// row-major order, with the offsets given by the two stride vectors.
template <class F>
void for_each_broadcast(const Shape& out, const std::vector<int64_t>& sa,
                        const std::vector<int64_t>& sb, F f) {
  const int64_t total = shape_numel(out);
  if (total == 0) return;
  const size_t nd = out.size();
  if (nd == 0) {
    f(0, 0, 0);
    return;
  }
  std::vector<int64_t> idx(nd, 0);
  const int64_t n_last = out[nd - 1];
  const int64_t sa_last = sa[nd - 1], sb_last = sb[nd - 1];
  int64_t oa = 0, ob = 0;  // offsets of the current row start
  for (int64_t i = 0; i < total; i += n_last) {
    for (int64_t j = 0; j < n_last; ++j) f(i + j, oa + j * sa_last, ob + j * sb_last);
    // Advance the multi-index over the leading dims (the last one is done).
    for (size_t d = nd - 1; d-- > 0;) {
      ++idx[d];
      oa += sa[d];
      ob += sb[d];
      if (idx[d] < out[d]) break;
      oa -= sa[d] * out[d];
      ob -= sb[d] * out[d];
      idx[d] = 0;
    }
  }
}

// Elementwise ops on at least this many elements split them over the OpenMP
// threads (a residual add of a (64, 256, 384) activation is 6.3 M).
constexpr int64_t kParallelElements = int64_t{1} << 16;

template <class F>
Tensor binary(const char* op, const Tensor& a_in, const Tensor& b_in, F f) {
  const Tensor a = float_input(op, a_in), b = float_input(op, b_in);
  if (a.shape() == b.shape()) {
    Tensor out = Tensor::empty(a.shape());
    const float* pa = a.data();
    const float* pb = b.data();
    float* po = out.data();
    const int64_t n = a.numel();
    // Element by element: the same bits on any number of threads.
#pragma omp parallel for schedule(static) if (n >= kParallelElements)
    for (int64_t i = 0; i < n; ++i) po[i] = f(pa[i], pb[i]);
    return out;
  }
  const Shape shape = broadcast_shapes(op, a.shape(), b.shape());
  Tensor out(shape);
  const float* pa = a.data();
  const float* pb = b.data();
  float* po = out.data();
  for_each_broadcast(shape, broadcast_strides(a.shape(), shape),
                     broadcast_strides(b.shape(), shape),
                     [&](int64_t i, int64_t ia, int64_t ib) { po[i] = f(pa[ia], pb[ib]); });
  return out;
}

template <class F>
Tensor unary(const char* op, const Tensor& a_in, F f) {
  const Tensor a = float_input(op, a_in);
  Tensor out = Tensor::empty(a.shape());
  const float* pa = a.data();
  float* po = out.data();
  const int64_t n = a.numel();
#pragma omp parallel for schedule(static) if (n >= kParallelElements)
  for (int64_t i = 0; i < n; ++i) po[i] = f(pa[i]);
  return out;
}

// The shape after reducing dim d: removed, or kept as 1.
Shape reduced_shape(const Shape& shape, int64_t d, bool keepdim) {
  if (shape.empty()) return shape;
  Shape out = shape;
  if (keepdim) {
    out[static_cast<size_t>(d)] = 1;
  } else {
    out.erase(out.begin() + d);
  }
  return out;
}

}  // namespace

// ---- element-wise, broadcasting ----------------------------------------------

Tensor add(const Tensor& a, const Tensor& b) {
  return binary("add", a, b, [](float x, float y) { return x + y; });
}
Tensor sub(const Tensor& a, const Tensor& b) {
  return binary("sub", a, b, [](float x, float y) { return x - y; });
}
Tensor mul(const Tensor& a, const Tensor& b) {
  return binary("mul", a, b, [](float x, float y) { return x * y; });
}
Tensor div(const Tensor& a, const Tensor& b) {
  return binary("div", a, b, [](float x, float y) { return x / y; });
}
Tensor add(const Tensor& a, float s) {
  return unary("add", a, [s](float x) { return x + s; });
}
Tensor mul(const Tensor& a, float s) {
  return unary("mul", a, [s](float x) { return x * s; });
}
// A true division, not a multiplication by 1/s: PyTorch 1.13 on CPU divides,
// and x / s and x * (1/s) differ in the last bit for some x.
Tensor div(const Tensor& a, float s) {
  return unary("div", a, [s](float x) { return x / s; });
}

Tensor operator+(const Tensor& a, const Tensor& b) { return add(a, b); }
Tensor operator-(const Tensor& a, const Tensor& b) { return sub(a, b); }
Tensor operator*(const Tensor& a, const Tensor& b) { return mul(a, b); }
Tensor operator/(const Tensor& a, const Tensor& b) { return div(a, b); }
Tensor operator+(const Tensor& a, float s) { return add(a, s); }
Tensor operator-(const Tensor& a, float s) {
  return unary("sub", a, [s](float x) { return x - s; });
}
Tensor operator*(const Tensor& a, float s) { return mul(a, s); }
Tensor operator*(float s, const Tensor& a) { return mul(a, s); }
Tensor operator/(const Tensor& a, float s) { return div(a, s); }
Tensor operator-(const Tensor& a) {
  return unary("neg", a, [](float x) { return -x; });
}

// In place on a's storage (every tensor sharing it sees the sum, as with
// PyTorch's add_); a strided a is written through its strides.
Tensor& operator+=(Tensor& a, const Tensor& b_in) {
  if (!a.is_contiguous()) return a.copy_(a + b_in);
  if (a.dtype() != DType::kFloat32) (void)float_input("add_", a);  // throws, naming the dtype
  const Tensor b = float_input("add_", b_in);
  if (a.shape() == b.shape()) {
    float* pa = a.data();
    const float* pb = b.data();
    for (int64_t i = 0; i < a.numel(); ++i) pa[i] += pb[i];
    return a;
  }
  const Shape shape = broadcast_shapes("add_", a.shape(), b.shape());
  if (shape != a.shape()) {
    throw std::invalid_argument(
        fmt::format("add_: {} does not broadcast to the shape {} of the tensor added to",
                    shape_str(b.shape()), shape_str(a.shape())));
  }
  float* pa = a.data();
  const float* pb = b.data();
  for_each_broadcast(shape, broadcast_strides(a.shape(), shape),
                     broadcast_strides(b.shape(), shape),
                     [&](int64_t i, int64_t, int64_t ib) { pa[i] += pb[ib]; });
  return a;
}

Tensor exp(const Tensor& a) {
  return unary("exp", a, [](float x) { return std::exp(x); });
}
Tensor sqrt(const Tensor& a) {
  return unary("sqrt", a, [](float x) { return std::sqrt(x); });
}

// ---- reductions ---------------------------------------------------------------
// A sum over the last (contiguous) dim adds in PyTorch's own float order
// (torch_order::sum above) and gives its bits. A sum over any other dim, and
// sum_all, accumulate in double and round once: within half an ulp of the exact
// sum, where PyTorch's float cascade is within a few ulps of it, so the two may
// differ in the last bits.

Tensor sum(const Tensor& a_in, int64_t dim, bool keepdim) {
  const Tensor a = float_input("sum", a_in);
  const int64_t d = wrap_dim("sum", dim, a.shape());
  const auto [outer, n, inner] = split_at(a.shape(), d);
  Tensor out(reduced_shape(a.shape(), d, keepdim));
  const float* pa = a.data();
  float* po = out.data();
  for (int64_t o = 0; o < outer; ++o) {
    if (inner == 1) {  // the reduced dim is contiguous: PyTorch's own order and bits
      po[o] = torch_order::sum(pa + o * n, n);
      continue;
    }
    for (int64_t j = 0; j < inner; ++j) {
      double s = 0.0;
      for (int64_t i = 0; i < n; ++i) s += pa[(o * n + i) * inner + j];
      po[o * inner + j] = static_cast<float>(s);
    }
  }
  return out;
}

// mean = sum / n, both in float, as PyTorch computes it (sum, then div_).
Tensor mean(const Tensor& a, int64_t dim, bool keepdim) {
  const int64_t d = wrap_dim("mean", dim, a.shape());
  const float n = static_cast<float>(split_at(a.shape(), d).n);
  Tensor out = sum(a, dim, keepdim);
  for (float& x : out.values()) x /= n;
  return out;
}

// The largest value along dim; a NaN anywhere in the row gives NaN (PyTorch).
Tensor max(const Tensor& a_in, int64_t dim, bool keepdim) {
  const Tensor a = float_input("max", a_in);
  const int64_t d = wrap_dim("max", dim, a.shape());
  const auto [outer, n, inner] = split_at(a.shape(), d);
  if (n == 0) {
    throw std::invalid_argument(
        fmt::format("max: cannot reduce dim {} of size 0 in shape {}", dim, shape_str(a.shape())));
  }
  Tensor out(reduced_shape(a.shape(), d, keepdim));
  const float* pa = a.data();
  float* po = out.data();
  for (int64_t o = 0; o < outer; ++o) {
    for (int64_t j = 0; j < inner; ++j) {
      float m = pa[o * n * inner + j];
      for (int64_t i = 1; i < n && !std::isnan(m); ++i) {
        const float x = pa[(o * n + i) * inner + j];
        if (std::isnan(x) || x > m) m = x;
      }
      po[o * inner + j] = m;
    }
  }
  return out;
}

float sum_all(const Tensor& a_in) {
  const Tensor a = float_input("sum_all", a_in);
  double s = 0.0;
  for (float x : a.values()) s += x;
  return static_cast<float>(s);
}

// ---- matrix products ------------------------------------------------------------

float dot(const Tensor& a_in, const Tensor& b_in) {
  const Tensor a = float_input("dot", a_in), b = float_input("dot", b_in);
  if (a.dim() != 1 || b.dim() != 1 || a.numel() != b.numel()) {
    throw std::invalid_argument(
        fmt::format("dot: expects two 1-D tensors of equal length, got {} and {}",
                    shape_str(a.shape()), shape_str(b.shape())));
  }
  return gemm::sdot(a.numel(), a.data(), b.data());
}

namespace {
// C (m, n) = A (m, k) @ B (k, n), all row-major and contiguous (k == 0: C = 0).
void mm(float* c, const float* a, const float* b, int64_t m, int64_t k, int64_t n) {
  gemm::sgemm(gemm::Trans::kNo, gemm::Trans::kNo, m, n, k, 1.0f, a, k, b, n, 0.0f, c, n);
}
}  // namespace

Tensor matmul(const Tensor& a_in, const Tensor& b_in) {
  const Tensor a = float_input("matmul", a_in), b = float_input("matmul", b_in);
  if (a.dim() == 0 || b.dim() == 0) {
    throw std::invalid_argument(
        fmt::format("matmul: both arguments need at least 1 dim, got {} @ {}", shape_str(a.shape()),
                    shape_str(b.shape())));
  }
  if (a.dim() == 1 && b.dim() == 1) {
    if (a.numel() != b.numel()) {
      throw std::invalid_argument(fmt::format("matmul: inner dims differ: {} @ {}",
                                              shape_str(a.shape()), shape_str(b.shape())));
    }
    return Tensor(Shape{}, std::vector<float>{dot(a, b)});
  }
  // A 1-D left operand is a row (1, k), a 1-D right operand a column (k, 1).
  const bool a_vec = a.dim() == 1, b_vec = b.dim() == 1;
  const int64_t m = a_vec ? 1 : a.size(-2);
  const int64_t k = a.size(-1);
  const int64_t kb = b_vec ? b.size(0) : b.size(-2);
  const int64_t n = b_vec ? 1 : b.size(-1);
  if (k != kb) {
    throw std::invalid_argument(fmt::format("matmul: inner dims differ: {} @ {}",
                                            shape_str(a.shape()), shape_str(b.shape())));
  }
  const Shape batch_a(a.shape().begin(), a.shape().end() - std::min<int64_t>(a.dim(), 2));
  const Shape batch_b(b.shape().begin(), b.shape().end() - std::min<int64_t>(b.dim(), 2));
  Shape batch;
  try {
    batch = broadcast_shapes("matmul", batch_a, batch_b);
  } catch (const std::invalid_argument&) {
    throw std::invalid_argument(
        fmt::format("matmul: batch dims {} and {} cannot be broadcast: {} @ {}", shape_str(batch_a),
                    shape_str(batch_b), shape_str(a.shape()), shape_str(b.shape())));
  }
  Shape out_shape = batch;
  if (!a_vec) out_shape.push_back(m);
  if (!b_vec) out_shape.push_back(n);
  Tensor out(out_shape);
  const int64_t num_batches = shape_numel(batch);
  if (num_batches == 0) return out;

  if (shape_numel(batch_b) == 1 && batch_a == batch) {
    // (..., m, k) @ (k, n): one product with all leading dims folded into the rows.
    mm(out.data(), a.data(), b.data(), num_batches * m, k, n);
    return out;
  }
  // One product per batch index; the operands' matrices are found through
  // broadcast strides counted in whole matrices.
  const Shape batch_idx_shape = batch.empty() ? Shape{1} : batch;
  const auto sa = broadcast_strides(batch_a.empty() ? Shape{1} : batch_a, batch_idx_shape);
  const auto sb = broadcast_strides(batch_b.empty() ? Shape{1} : batch_b, batch_idx_shape);
  for_each_broadcast(batch_idx_shape, sa, sb, [&](int64_t i, int64_t ia, int64_t ib) {
    mm(out.data() + i * m * n, a.data() + ia * m * k, b.data() + ib * k * n, m, k, n);
  });
  return out;
}

// ---- shape ------------------------------------------------------------------------

// The view ops share a's storage (attn/tensor.h); they are PyTorch's views.
Tensor transpose(const Tensor& a, int64_t dim0, int64_t dim1) { return a.transpose(dim0, dim1); }

Tensor permute(const Tensor& a, const Shape& dims) { return a.permute(dims); }

// torch.t: a 0-D or 1-D tensor is returned as it is, a 2-D one transposed.
Tensor t(const Tensor& a) {
  if (a.dim() > 2) {
    throw std::invalid_argument(
        fmt::format("t: expects a tensor with <= 2 dims, got {}", shape_str(a.shape())));
  }
  return a.dim() < 2 ? a : a.transpose(0, 1);
}

Tensor select(const Tensor& a, int64_t i) { return a.select(0, i); }
Tensor select(const Tensor& a, int64_t dim, int64_t i) { return a.select(dim, i); }
Tensor slice(const Tensor& a, int64_t dim, int64_t start, int64_t end) { return a.slice(dim, start, end); }

// torch.cat: equal shapes except on dim. As in PyTorch, 1-D empty tensors of
// shape (0,) are skipped whatever the others' shapes are.
Tensor cat(const std::vector<Tensor>& tensors, int64_t dim) {
  if (tensors.empty()) throw std::invalid_argument("cat: expects a non-empty list of tensors");
  std::vector<Tensor> dense;  // the parts, each contiguous float32
  dense.reserve(tensors.size());
  for (const Tensor& x : tensors) {
    if (!(x.dim() == 1 && x.numel() == 0)) dense.push_back(float_input("cat", x));
  }
  std::vector<const Tensor*> parts;
  for (const Tensor& x : dense) parts.push_back(&x);
  if (parts.empty()) return tensors.front().clone();
  const Shape& first = parts.front()->shape();
  if (first.empty()) {
    throw std::invalid_argument("cat: zero-dimensional tensor cannot be concatenated");
  }
  const int64_t d = wrap_dim("cat", dim, first);
  Shape out_shape = first;
  out_shape[static_cast<size_t>(d)] = 0;
  for (size_t p = 0; p < parts.size(); ++p) {
    const Shape& s = parts[p]->shape();
    bool fits = s.size() == first.size();
    for (size_t k = 0; fits && k < s.size(); ++k)
      fits = k == static_cast<size_t>(d) || s[k] == first[k];
    if (!fits) {
      throw std::invalid_argument(
          fmt::format("cat: sizes must match except in dim {}: {} (tensor 0) and {} (tensor {})",
                      dim, shape_str(first), shape_str(s), p));
    }
    out_shape[static_cast<size_t>(d)] += s[static_cast<size_t>(d)];
  }
  Tensor out(out_shape);
  const Split view = split_at(out_shape, d);
  const int64_t outer = view.outer, inner = view.inner;
  float* dst = out.data();
  for (int64_t o = 0; o < outer; ++o) {
    for (const Tensor* x : parts) {
      const int64_t block = x->size(d) * inner;  // this tensor's slab inside one outer index
      const float* src = x->data() + o * block;
      dst = std::copy(src, src + block, dst);
    }
  }
  return out;
}

Tensor stack(const std::vector<Tensor>& tensors, int64_t dim) {
  if (tensors.empty()) throw std::invalid_argument("stack: expects a non-empty list of tensors");
  const Shape& first = tensors.front().shape();
  for (size_t p = 1; p < tensors.size(); ++p) {
    if (tensors[p].shape() != first) {
      throw std::invalid_argument(
          fmt::format("stack: expects tensors of equal shape, got {} (tensor 0) and {} (tensor {})",
                      shape_str(first), shape_str(tensors[p].shape()), p));
    }
  }
  // The new dim may be anywhere in [-(ndim + 1), ndim].
  Shape grown = first;
  grown.push_back(1);
  const int64_t d = wrap_dim("stack", dim, grown);
  std::vector<Tensor> parts;
  parts.reserve(tensors.size());
  for (const Tensor& x : tensors) parts.push_back(unsqueeze(x, d));
  return cat(parts, d);
}

Tensor unsqueeze(const Tensor& a, int64_t dim) { return a.unsqueeze(dim); }
Tensor squeeze(const Tensor& a, int64_t dim) { return a.squeeze(dim); }

// ---- masks and normalisations ----------------------------------------------------

namespace {
// Keeps (i, j) of every matrix in the last two dims where keep(j - i) holds.
template <class Keep>
Tensor triangle(const char* op, const Tensor& a_in, Keep keep) {
  const Tensor a = float_input(op, a_in);
  if (a.dim() < 2) {
    throw std::invalid_argument(
        fmt::format("{}: expects a tensor with at least 2 dims, got {}", op, shape_str(a.shape())));
  }
  const int64_t rows = a.size(-2), cols = a.size(-1);
  const int64_t mats = rows * cols == 0 ? 0 : a.numel() / (rows * cols);
  Tensor out = a.clone();
  float* p = out.data();
  for (int64_t b = 0; b < mats; ++b)
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t j = 0; j < cols; ++j)
        if (!keep(j - i)) p[(b * rows + i) * cols + j] = 0.0f;
  return out;
}
}  // namespace

Tensor tril(const Tensor& a, int64_t diagonal) {
  return triangle("tril", a, [diagonal](int64_t j_minus_i) { return j_minus_i <= diagonal; });
}
Tensor triu(const Tensor& a, int64_t diagonal) {
  return triangle("triu", a, [diagonal](int64_t j_minus_i) { return j_minus_i >= diagonal; });
}

Tensor masked_fill(const Tensor& a_in, const Tensor& mask_in, float value) {
  const Tensor a = float_input("masked_fill", a_in), mask = float_input("masked_fill", mask_in);
  bool fits = mask.dim() <= a.dim();
  for (int64_t i = 1; fits && i <= mask.dim(); ++i) {
    const int64_t sm = mask.shape()[static_cast<size_t>(mask.dim() - i)];
    fits = sm == 1 || sm == a.shape()[static_cast<size_t>(a.dim() - i)];
  }
  if (!fits) {
    throw std::invalid_argument(
        fmt::format("masked_fill: mask of shape {} does not broadcast to the shape {}",
                    shape_str(mask.shape()), shape_str(a.shape())));
  }
  Tensor out = a.clone();
  float* po = out.data();
  const float* pm = mask.data();
  for_each_broadcast(a.shape(), broadcast_strides(a.shape(), a.shape()),
                     broadcast_strides(mask.shape(), a.shape()),
                     [&](int64_t i, int64_t, int64_t im) {
                       if (pm[im] != 0.0f) po[i] = value;
                     });
  return out;
}

namespace {
// Applies f(row pointer, stride, n) to every row along dim (the (outer, inner)
// pairs of the (outer, n, inner) view), on a copy of a.
template <class F>
Tensor along_dim(const char* op, const Tensor& a, int64_t dim, F f) {
  const int64_t d = wrap_dim(op, dim, a.shape());
  const auto [outer, n, inner] = split_at(a.shape(), d);
  Tensor out = float_input(op, a).clone();
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t j = 0; j < inner; ++j) f(out.data() + o * n * inner + j, inner, n);
  return out;
}
}  // namespace

// softmax(x)_i = exp(x_i - m) / sum_j exp(x_j - m) with m = max_j x_j, which
// cannot overflow. Like PyTorch's kernel, it multiplies by 1/sum. A row of
// all -inf has m = -inf, x - m = NaN, so the row becomes NaN, as in PyTorch.
Tensor softmax(const Tensor& a, int64_t dim) {
  return along_dim("softmax", a, dim, [](float* x, int64_t stride, int64_t n) {
    float m = -std::numeric_limits<float>::infinity();
    for (int64_t i = 0; i < n; ++i) m = std::max(m, x[i * stride]);
    float s = 0.0f;
    for (int64_t i = 0; i < n; ++i) {
      x[i * stride] = std::exp(x[i * stride] - m);
      s += x[i * stride];
    }
    const float inv_s = 1.0f / s;
    for (int64_t i = 0; i < n; ++i) x[i * stride] *= inv_s;
  });
}

// exp(x_i) / sum_j exp(x_j): exp overflows to inf above x ~ 88.7, giving inf/inf = NaN.
Tensor softmax_naive(const Tensor& a, int64_t dim) {
  return along_dim("softmax_naive", a, dim, [](float* x, int64_t stride, int64_t n) {
    float s = 0.0f;
    for (int64_t i = 0; i < n; ++i) {
      x[i * stride] = std::exp(x[i * stride]);
      s += x[i * stride];
    }
    for (int64_t i = 0; i < n; ++i) x[i * stride] /= s;
  });
}

// x_i / sum_j x_j; the sum is rounded to float before the division, as
// PyTorch's x / x.sum(dim, keepdim=True) does.
Tensor normalize_sum(const Tensor& a, int64_t dim) {
  return along_dim("normalize_sum", a, dim, [](float* x, int64_t stride, int64_t n) {
    float sf = 0.0f;
    if (stride == 1) {
      sf = torch_order::sum(x, n);
    } else {
      double s = 0.0;
      for (int64_t i = 0; i < n; ++i) s += x[i * stride];
      sf = static_cast<float>(s);
    }
    for (int64_t i = 0; i < n; ++i) x[i * stride] /= sf;
  });
}

}  // namespace attn
