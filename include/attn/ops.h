// attn/ops.h - the tensor operations the chapter uses, with PyTorch semantics.
//
// The ops take float32 tensors of any layout (a strided view is read through
// contiguous()) and return new contiguous tensors, except the shape ops below,
// which return views sharing the input's storage, as PyTorch's do. Another
// dtype is an std::invalid_argument naming it. Negative dims count from the end, as in PyTorch. Binary element-wise
// ops broadcast with NumPy/PyTorch rules (trailing dims aligned, size-1 dims
// stretched). Every op checks its arguments and throws std::invalid_argument
// whose message names the op and the shapes involved, e.g.
//   "matmul: inner dims differ: (6, 3) @ (2, 3)",
// or, for a dim or index outside its range, std::out_of_range, e.g.
//   "softmax: dim 2 out of range for shape (2, 3) (expected -2 to 1)".
// Element-wise ops round exactly as PyTorch's CPU kernels do (x / s is a true
// division); a sum over the last dim, and normalize_sum over it, add in
// PyTorch's own float order and give its bits; sums over other dims and sum_all
// accumulate in double, so they may differ from PyTorch's float sums in the
// last bits.
// Matrix products go to BLAS (gemm::sgemm and gemm::sdot, attn/gemm.h).
#pragma once

#include <vector>

#include "attn/tensor.h"

namespace attn {

// ---- element-wise, broadcasting ----------------------------------------------
Tensor add(const Tensor& a, const Tensor& b);
Tensor sub(const Tensor& a, const Tensor& b);
Tensor mul(const Tensor& a, const Tensor& b);
Tensor div(const Tensor& a, const Tensor& b);
Tensor add(const Tensor& a, float s);
Tensor mul(const Tensor& a, float s);
Tensor div(const Tensor& a, float s);
Tensor operator+(const Tensor& a, const Tensor& b);
Tensor operator-(const Tensor& a, const Tensor& b);
Tensor operator*(const Tensor& a, const Tensor& b);
Tensor operator/(const Tensor& a, const Tensor& b);
Tensor operator+(const Tensor& a, float s);
Tensor operator-(const Tensor& a, float s);
Tensor operator*(const Tensor& a, float s);
Tensor operator*(float s, const Tensor& a);
Tensor operator/(const Tensor& a, float s);
Tensor operator-(const Tensor& a);
// In place: writes into a's storage, seen by every tensor sharing it (add_).
Tensor& operator+=(Tensor& a, const Tensor& b);  // b must broadcast to a's shape
Tensor exp(const Tensor& a);
Tensor sqrt(const Tensor& a);

// ---- reductions ---------------------------------------------------------------
Tensor sum(const Tensor& a, int64_t dim, bool keepdim = false);
Tensor mean(const Tensor& a, int64_t dim, bool keepdim = false);
Tensor max(const Tensor& a, int64_t dim, bool keepdim = false);  // values only
float sum_all(const Tensor& a);

// ---- matrix products ------------------------------------------------------------
// PyTorch's torch.matmul for dim >= 1 operands: 1-D x 1-D is a dot product
// (shape ()), 2-D x 2-D a matrix product, and N-D operands are batched over the
// leading dims with broadcasting, e.g. (B, H, T, hd) @ (B, H, hd, T) -> (B, H, T, T)
// and (B, T, d_in) @ (d_in, d_out) -> (B, T, d_out). A 1-D operand is treated as
// a row (left) or column (right) vector and that dim is removed from the result.
Tensor matmul(const Tensor& a, const Tensor& b);
// Dot product of two 1-D tensors of equal length, as a float.
float dot(const Tensor& a, const Tensor& b);

// ---- shape: views sharing a's storage (Tensor's members of the same names) ----------
// Swap two dims: a view with the two strides swapped (not contiguous).
Tensor transpose(const Tensor& a, int64_t dim0, int64_t dim1);
// Reorder all dims: result dim i is a's dim dims[i].
Tensor permute(const Tensor& a, const Shape& dims);
// The matrix transpose of a 2-D tensor, a.T.
Tensor t(const Tensor& a);
// Index dim 0 (a[i]): shape loses its first dim. Negative i counts from the end.
Tensor select(const Tensor& a, int64_t i);
// Index any dim: a.select(dim, i).
Tensor select(const Tensor& a, int64_t dim, int64_t i);
// a.narrow / slicing a[..., start:end, ...] on one dim (end exclusive, clamped like Python).
Tensor slice(const Tensor& a, int64_t dim, int64_t start, int64_t end);
Tensor unsqueeze(const Tensor& a, int64_t dim);
Tensor squeeze(const Tensor& a, int64_t dim);
// New contiguous tensors from several.
Tensor cat(const std::vector<Tensor>& tensors, int64_t dim);
Tensor stack(const std::vector<Tensor>& tensors, int64_t dim = 0);

// ---- masks and normalisations ----------------------------------------------------
// Lower / upper triangle of a 2-D (or batched, last two dims) tensor:
// tril keeps j <= i + diagonal, triu keeps j >= i + diagonal, the rest is 0.
Tensor tril(const Tensor& a, int64_t diagonal = 0);
Tensor triu(const Tensor& a, int64_t diagonal = 0);
// Where mask != 0, put value; mask broadcasts to a's shape.
Tensor masked_fill(const Tensor& a, const Tensor& mask, float value);
// Stable softmax over dim: exp(x - max) / sum(exp(x - max)). A row of all -inf
// gives NaN, as in PyTorch.
Tensor softmax(const Tensor& a, int64_t dim);
// Naive softmax over dim: exp(x) / sum(exp(x)); overflows to inf/NaN for large x,
// which is the point of showing it.
Tensor softmax_naive(const Tensor& a, int64_t dim);
// Plain normalisation: x / sum(x) over dim.
Tensor normalize_sum(const Tensor& a, int64_t dim);

}  // namespace attn
