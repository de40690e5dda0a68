// AdamW's element update and the squared norm of a gradient (attn/optim.h's
// AdamW::step and clip_grad_norm; attn/layer_kernels.h states the maths and the
// contract), one tensor at a time or all of them in one parallel region. Built
// with -ffp-contract=off (CMakeLists.txt): a multiply and an add fuse only where
// the code says MulAdd or std::fma, so the update rounds as PyTorch's kernel
// does. Highway dynamic dispatch; OpenMP over chunks of elements once there is
// enough work to pay for the threads.
#include <algorithm>
#include <cmath>
#include <vector>

#include "attn/layer_kernels.h"

#include "cpu/hwy_targets.h"
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/adamw_kernels.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>
// After highway.h: the -inl header is compiled once per target.
#include "kernels/layer_kernels-inl.h"  // NOLINT(build/include_order)

HWY_BEFORE_NAMESPACE();
namespace attn::kernels {
namespace HWY_NAMESPACE {

// AdamW's element update (attn/layer_kernels.h states it), n elements from 0.
// The gradient is g·grad_scale (clip_grad_norm's g *= clip_coef, the same
// rounding); with ZeroGrad, g is set to 0 once read (the next zero_grad).
template <bool ZeroGrad>
void AdamWRange(float* w, float* m, float* v, float* g, size_t n, const AdamWScalars& c) {
  const DF d;
  const size_t N = hn::Lanes(d);
  const VF decay = hn::Set(d, c.decay), beta1 = hn::Set(d, c.beta1), beta2 = hn::Set(d, c.beta2);
  const VF omb1 = hn::Set(d, c.one_minus_beta1), omb2 = hn::Set(d, c.one_minus_beta2);
  const VF bc2 = hn::Set(d, c.bias_correction2_sqrt), eps = hn::Set(d, c.eps);
  const VF nss = hn::Set(d, c.neg_step_size), gscale = hn::Set(d, c.grad_scale);
  size_t i = 0;
  for (; i + N <= n; i += N) {
    const VF gi = hn::Mul(hn::LoadU(d, g + i), gscale);
    if constexpr (ZeroGrad) hn::StoreU(hn::Zero(d), d, g + i);
    const VF wi = hn::Mul(hn::LoadU(d, w + i), decay);
    const VF mi = hn::MulAdd(gi, omb1, hn::Mul(hn::LoadU(d, m + i), beta1));
    const VF vi = hn::Add(hn::Mul(hn::LoadU(d, v + i), beta2), hn::Mul(hn::Mul(omb2, gi), gi));
    const VF denom = hn::Add(hn::Div(hn::Sqrt(vi), bc2), eps);
    hn::StoreU(hn::Add(wi, hn::Div(hn::Mul(nss, mi), denom)), d, w + i);
    hn::StoreU(mi, d, m + i);
    hn::StoreU(vi, d, v + i);
  }
  for (; i < n; ++i) {
    const float gi = g[i] * c.grad_scale;
    if constexpr (ZeroGrad) g[i] = 0.0f;
    w[i] = w[i] * c.decay;
    m[i] = std::fma(gi, c.one_minus_beta1, m[i] * c.beta1);
    v[i] = v[i] * c.beta2 + c.one_minus_beta2 * gi * gi;
    const float denom = std::sqrt(v[i]) / c.bias_correction2_sqrt + c.eps;
    w[i] = w[i] + c.neg_step_size * m[i] / denom;
  }
}

void AdamWUpdate(float* w, float* m, float* v, const float* g, int64_t n, const AdamWScalars& c) {
  // ZeroGrad = false never writes g.
  auto* gw = const_cast<float*>(g);
  Chunked(n, [&](size_t i, size_t count) {
    AdamWRange<false>(w + i, m + i, v + i, gw + i, count, c);
  });
}

void AdamWUpdateZeroGrad(float* w, float* m, float* v, float* g, int64_t n,
                         const AdamWScalars& c) {
  Chunked(n, [&](size_t i, size_t count) {
    AdamWRange<true>(w + i, m + i, v + i, g + i, count, c);
  });
}

// Σ x[i]² in double over [0, n): double lanes, added across the lanes at the end.
double SumSquaresRange(const float* x, size_t n) {
  const hn::ScalableTag<double> dd;
  const hn::Rebind<float, decltype(dd)> df;  // half-width float vectors, promoted
  const size_t N = hn::Lanes(dd);
  auto acc0 = hn::Zero(dd), acc1 = hn::Zero(dd);
  size_t i = 0;
  for (; i + 2 * N <= n; i += 2 * N) {
    const auto a = hn::PromoteTo(dd, hn::LoadU(df, x + i));
    const auto b = hn::PromoteTo(dd, hn::LoadU(df, x + i + N));
    acc0 = hn::MulAdd(a, a, acc0);
    acc1 = hn::MulAdd(b, b, acc1);
  }
  double sum = hn::GetLane(hn::SumOfLanes(dd, hn::Add(acc0, acc1)));
  for (; i < n; ++i) sum += static_cast<double>(x[i]) * x[i];
  return sum;
}

double SumSquares(const float* x, int64_t n) {
  // Fixed chunks, their sums added in chunk order: the same bits for any thread count.
  constexpr int64_t kChunk = int64_t{1} << 14;
  const int64_t chunks = (n + kChunk - 1) / kChunk;
  std::vector<double> partial(size_t(chunks), 0.0);
#pragma omp parallel for schedule(static) if (n >= kParallelElements * 4)
  for (int64_t k = 0; k < chunks; ++k) {
    partial[size_t(k)] = SumSquaresRange(x + k * kChunk, size_t(std::min(kChunk, n - k * kChunk)));
  }
  double sum = 0.0;
  for (double p : partial) sum += p;
  return sum;
}

// ---- many tensors in one parallel region (AdamW::step and its clipping) ----
// Chunks of every tensor, in tensor order, as the one-tensor kernels cut them;
// a task is one chunk: (tensor, begin, count).
struct ChunkTask {
  int64_t tensor, begin, count;
};
std::vector<ChunkTask> ChunkTasks(const int64_t* sizes, int64_t count, int64_t chunk) {
  std::vector<ChunkTask> tasks;
  for (int64_t t = 0; t < count; ++t)
    for (int64_t b = 0; b < sizes[t]; b += chunk) tasks.push_back({t, b, std::min(chunk, sizes[t] - b)});
  return tasks;
}

// Runs f(task) for every task, on the OpenMP threads when there are
// kParallelElements elements in all or more: one fork and join for them all.
template <class F>
void RunTasks(const std::vector<ChunkTask>& tasks, int64_t total, const F& f) {
  const auto n = static_cast<int64_t>(tasks.size());
#pragma omp parallel for schedule(static) if (total >= kParallelElements)
  for (int64_t i = 0; i < n; ++i) f(tasks[size_t(i)]);
}

void AdamWUpdateZeroGradMany(const AdamWTensor* tensors, int64_t count) {
  std::vector<int64_t> sizes(static_cast<size_t>(count));
  int64_t total = 0;
  for (int64_t t = 0; t < count; ++t) total += (sizes[size_t(t)] = tensors[t].n);
  constexpr int64_t kChunk = 1 << 13;  // Chunked's
  RunTasks(ChunkTasks(sizes.data(), count, kChunk), total, [&](const ChunkTask& k) {
    const AdamWTensor& a = tensors[k.tensor];
    AdamWRange<true>(a.w + k.begin, a.m + k.begin, a.v + k.begin, a.g + k.begin, size_t(k.count),
                     *a.scalars);
  });
}

void SumSquaresMany(double* sums, const float* const* xs, const int64_t* ns, int64_t count) {
  constexpr int64_t kChunk = int64_t{1} << 14;  // SumSquares's
  const std::vector<ChunkTask> tasks = ChunkTasks(ns, count, kChunk);
  int64_t total = 0;
  for (int64_t t = 0; t < count; ++t) total += ns[t];
  std::vector<double> partial(tasks.size(), 0.0);
  const ChunkTask* first = tasks.data();
  RunTasks(tasks, total, [&](const ChunkTask& k) {
    partial[size_t(&k - first)] = SumSquaresRange(xs[k.tensor] + k.begin, size_t(k.count));
  });
  // Each tensor's chunk sums in chunk order from 0.0: SumSquares's bits.
  for (int64_t t = 0; t < count; ++t) sums[t] = 0.0;
  for (size_t i = 0; i < tasks.size(); ++i) sums[tasks[i].tensor] += partial[i];
}

// NOLINTNEXTLINE(google-readability-namespace-comments)
}  // namespace HWY_NAMESPACE
}  // namespace attn::kernels
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace attn::kernels {

HWY_EXPORT(AdamWUpdate);
HWY_EXPORT(AdamWUpdateZeroGrad);
HWY_EXPORT(SumSquares);
HWY_EXPORT(AdamWUpdateZeroGradMany);
HWY_EXPORT(SumSquaresMany);

void adamw_update(float* w, float* m, float* v, const float* g, int64_t n, const AdamWScalars& c) {
  if (n > 0) HWY_DYNAMIC_DISPATCH(AdamWUpdate)(w, m, v, g, n, c);
}

void adamw_update_zero_grad(float* w, float* m, float* v, float* g, int64_t n,
                            const AdamWScalars& c) {
  if (n > 0) HWY_DYNAMIC_DISPATCH(AdamWUpdateZeroGrad)(w, m, v, g, n, c);
}

void adamw_update_zero_grad(const AdamWTensor* tensors, int64_t count) {
  if (count > 0) HWY_DYNAMIC_DISPATCH(AdamWUpdateZeroGradMany)(tensors, count);
}

void sum_of_squares(double* sums, const float* const* xs, const int64_t* ns, int64_t count) {
  if (count > 0) HWY_DYNAMIC_DISPATCH(SumSquaresMany)(sums, xs, ns, count);
}

double sum_of_squares(const float* x, int64_t n) {
  return n > 0 ? HWY_DYNAMIC_DISPATCH(SumSquares)(x, n) : 0.0;
}

}  // namespace attn::kernels
#endif  // HWY_ONCE
