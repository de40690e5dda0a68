// The cross-entropy of rows of logits in place (attn/cross_entropy_rows.h
// states the maths; ref::cross_entropy_forward / _backward are the
// specification): per row a SIMD max, a SIMD sum of exp(x − max), the
// log-sum-exp in double, the row's loss, and optionally the row overwritten by
// its gradient. Highway dynamic dispatch; OpenMP over rows.
#include "attn/cross_entropy_rows.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "cpu/hwy_targets.h"
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/cross_entropy_rows.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>
// After highway.h: the -inl header is compiled once per target.
#include <hwy/contrib/math/math-inl.h>  // NOLINT(build/include_order)

HWY_BEFORE_NAMESPACE();
namespace attn::kernels {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using DF = hn::ScalableTag<float>;
using VF = hn::Vec<DF>;

// max_v row[v] over V floats (NaN propagates through the sum below).
HWY_INLINE float RowMax(DF d, const float* row, size_t V) {
  const size_t N = hn::Lanes(d);
  VF m = hn::Set(d, -std::numeric_limits<float>::infinity());
  size_t i = 0;
  for (; i + N <= V; i += N) m = hn::Max(m, hn::LoadU(d, row + i));
  float out = hn::GetLane(hn::MaxOfLanes(d, m));
  for (; i < V; ++i) out = std::max(out, row[i]);
  return out;
}

// Σ_v exp(row[v] − shift): two vector accumulators, then across the lanes.
HWY_INLINE double RowSumExp(DF d, const float* row, size_t V, float shift) {
  const size_t N = hn::Lanes(d);
  const VF vs = hn::Set(d, shift);
  VF acc0 = hn::Zero(d), acc1 = hn::Zero(d);
  size_t i = 0;
  for (; i + 2 * N <= V; i += 2 * N) {
    acc0 = hn::Add(acc0, hn::Exp(d, hn::Sub(hn::LoadU(d, row + i), vs)));
    acc1 = hn::Add(acc1, hn::Exp(d, hn::Sub(hn::LoadU(d, row + i + N), vs)));
  }
  for (; i + N <= V; i += N) acc0 = hn::Add(acc0, hn::Exp(d, hn::Sub(hn::LoadU(d, row + i), vs)));
  double sum = static_cast<double>(hn::GetLane(hn::SumOfLanes(d, hn::Add(acc0, acc1))));
  for (; i < V; ++i) sum += std::exp(static_cast<double>(row[i]) - shift);
  return sum;
}

// row[v] = scale · exp(row[v] − shift).
HWY_INLINE void RowExpScaled(DF d, float* row, size_t V, float shift, float scale) {
  const size_t N = hn::Lanes(d);
  const VF vl = hn::Set(d, shift), vsc = hn::Set(d, scale);
  size_t i = 0;
  for (; i + N <= V; i += N)
    hn::StoreU(hn::Mul(vsc, hn::Exp(d, hn::Sub(hn::LoadU(d, row + i), vl))), d, row + i);
  for (; i < V; ++i) row[i] = scale * std::exp(row[i] - shift);
}

void CrossEntropyRows(double* loss, float* logits, int64_t ld, const int64_t* targets, int64_t M,
                      int64_t V, int64_t ignore_index, bool write_grad, float grad_scale) {
#pragma omp parallel for schedule(static) if (M > 1)
  for (int64_t r = 0; r < M; ++r) {
    const DF d;
    float* row = logits + r * ld;
    const int64_t t = targets[r];
    const float row_max = RowMax(d, row, size_t(V));
    const double sum_exp = RowSumExp(d, row, size_t(V), row_max);
    const double lse = static_cast<double>(row_max) + std::log(sum_exp);
    const bool counted = t != ignore_index;
    loss[r] = counted ? lse - static_cast<double>(row[t]) : 0.0;
    if (!write_grad) continue;
    if (!counted) {
      std::fill(row, row + V, 0.0f);
      continue;
    }
    // softmax = exp(x − max) / Σ exp(x − max), the division folded into the scale.
    RowExpScaled(d, row, size_t(V), row_max, static_cast<float>(grad_scale / sum_exp));
    row[t] -= grad_scale;
  }
}

// NOLINTNEXTLINE(google-readability-namespace-comments)
}  // namespace HWY_NAMESPACE
}  // namespace attn::kernels
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace attn::kernels {

HWY_EXPORT(CrossEntropyRows);

void cross_entropy_rows(double* loss, float* logits, int64_t ld, const int64_t* targets, int64_t M,
                        int64_t V, int64_t ignore_index, bool write_grad, float grad_scale) {
  if (M <= 0 || V <= 0) return;
  HWY_DYNAMIC_DISPATCH(CrossEntropyRows)
  (loss, logits, ld, targets, M, V, ignore_index, write_grad, grad_scale);
}

}  // namespace attn::kernels
#endif  // HWY_ONCE
