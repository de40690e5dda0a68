// SIMD layer normalisation, forward and backward (alone or fused with the
// residual add), and the rounding to bf16 of the bf16 path's operands
// (attn/layer_kernels.h states the maths and the contract; attn::ref's loops
// are the specification). Highway dynamic dispatch; OpenMP over rows (layer
// norm) or over chunks of elements (rounding) once there is enough work to pay
// for the threads. The header's other kernels: gelu_kernels.cpp (GELU, alone
// and with the bias), adamw_kernels.cpp (AdamW's update, the gradients' norm),
// bias_kernels.cpp (a Linear layer's bias rows and column sums).
#include "attn/layer_kernels.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "attn/tensor.h"

#include "cpu/hwy_targets.h"
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/layer_kernels.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>
// After highway.h: the -inl header is compiled once per target.
#include "kernels/layer_kernels-inl.h"  // NOLINT(build/include_order)

HWY_BEFORE_NAMESPACE();
namespace attn::kernels {
namespace HWY_NAMESPACE {

// Σ of n floats in vector lanes, then across the lanes (a fixed order).
HWY_INLINE float SumRow(DF d, const float* p, size_t n) {
  const size_t N = hn::Lanes(d);
  VF acc0 = hn::Zero(d), acc1 = hn::Zero(d);
  size_t i = 0;
  for (; i + 2 * N <= n; i += 2 * N) {
    acc0 = hn::Add(acc0, hn::LoadU(d, p + i));
    acc1 = hn::Add(acc1, hn::LoadU(d, p + i + N));
  }
  for (; i + N <= n; i += N) acc0 = hn::Add(acc0, hn::LoadU(d, p + i));
  if (i < n) acc1 = hn::Add(acc1, LoadTail(d, p + i, n - i));
  return hn::GetLane(hn::SumOfLanes(d, hn::Add(acc0, acc1)));
}

// Σ (p[i] − mu) and Σ (p[i] − mu)² over n floats.
HWY_INLINE void SumDeviations(DF d, const float* p, size_t n, float mu, float& sum, float& sum_sq) {
  const size_t N = hn::Lanes(d);
  const VF vmu = hn::Set(d, mu);
  VF s = hn::Zero(d), sq = hn::Zero(d);
  size_t i = 0;
  for (; i + N <= n; i += N) {
    const VF dev = hn::Sub(hn::LoadU(d, p + i), vmu);
    s = hn::Add(s, dev);
    sq = hn::MulAdd(dev, dev, sq);
  }
  if (i < n) {
    const VF dev =
        hn::IfThenElseZero(hn::FirstN(d, n - i), hn::Sub(LoadTail(d, p + i, n - i), vmu));
    s = hn::Add(s, dev);
    sq = hn::MulAdd(dev, dev, sq);
  }
  sum = hn::GetLane(hn::SumOfLanes(d, s));
  sum_sq = hn::GetLane(hn::SumOfLanes(d, sq));
}

// x1 = a + r over one row of C floats (a float add per element: add()'s bits).
HWY_INLINE void AddRow(DF d, float* x1, const float* a, const float* r, size_t C) {
  const size_t N = hn::Lanes(d);
  size_t c = 0;
  for (; c + N <= C; c += N) {
    hn::StoreU(hn::Add(hn::LoadU(d, a + c), hn::LoadU(d, r + c)), d, x1 + c);
  }
  for (; c < C; ++c) x1[c] = a[c] + r[c];
}

// With residual != null the rows are x1 = x + residual, written to x1 first
// (add_layer_norm_forward); otherwise x itself.
template <class Out>
void LayerNormRows(Out* y, float* mean, float* std, const float* x, const float* scale,
                   const float* shift, int64_t n0, int64_t n1, size_t C, float eps,
                   const float* residual = nullptr, float* x1 = nullptr) {
  const DF d;
  const size_t N = hn::Lanes(d);
  for (int64_t n = n0; n < n1; ++n) {
    const float* row = x + n * int64_t(C);
    if (residual != nullptr) {
      float* sum = x1 + n * int64_t(C);
      AddRow(d, sum, row, residual + n * int64_t(C), C);
      row = sum;
    }
    Out* out = y + n * int64_t(C);
    // Corrected two-pass mean and variance: the float mean's rounding error
    // (large when |mean| >> std) is measured by Σ (x − mu) and taken out.
    const float mu0 = SumRow(d, row, C) / float(C);
    float dev_sum, dev_sq;
    SumDeviations(d, row, C, mu0, dev_sum, dev_sq);
    const float shift_mu = dev_sum / float(C);
    const float mu = mu0 + shift_mu;
    const float var = std::max(0.0f, dev_sq / float(C) - shift_mu * shift_mu);
    const float sd = std::sqrt(var + eps);
    mean[n] = mu;
    std[n] = sd;
    const float r = 1.0f / sd;
    const VF vmu = hn::Set(d, mu), vr = hn::Set(d, r);
    size_t c = 0;
    for (; c + N <= C; c += N) {
      const VF xhat = hn::Mul(hn::Sub(hn::LoadU(d, row + c), vmu), vr);
      StoreOut(d, hn::MulAdd(hn::LoadU(d, scale + c), xhat, hn::LoadU(d, shift + c)), out + c);
    }
    // The tail rounds as the vector lanes do: x̂ = (x − mean)·r, one fused scale·x̂ + shift.
    for (; c < C; ++c) StoreOut(std::fma(scale[c], (row[c] - mu) * r, shift[c]), out + c);
  }
}

// RMSNorm (nn::RMSNorm; ref::rms_norm_forward is the specification, which
// sums the squares in double): Σ x² in float vector lanes, r = 1 / √(Σ x² / C
// + eps), y = x · r · (w + offset) in the reference's order of products.
void RmsNormRows(float* y, float* inv_rms, const float* x, const float* w, int64_t n0, int64_t n1,
                 size_t C, float eps, float offset) {
  const DF d;
  const size_t N = hn::Lanes(d);
  for (int64_t n = n0; n < n1; ++n) {
    const float* row = x + n * int64_t(C);
    VF sq0 = hn::Zero(d), sq1 = hn::Zero(d);
    size_t c = 0;
    for (; c + 2 * N <= C; c += 2 * N) {
      const VF a = hn::LoadU(d, row + c), b = hn::LoadU(d, row + c + N);
      sq0 = hn::MulAdd(a, a, sq0);
      sq1 = hn::MulAdd(b, b, sq1);
    }
    for (; c + N <= C; c += N) {
      const VF a = hn::LoadU(d, row + c);
      sq0 = hn::MulAdd(a, a, sq0);
    }
    if (c < C) {
      const VF a = LoadTail(d, row + c, C - c);
      sq1 = hn::MulAdd(a, a, sq1);
    }
    const float mean_sq = hn::GetLane(hn::SumOfLanes(d, hn::Add(sq0, sq1))) / float(C);
    const float r = 1.0f / std::sqrt(mean_sq + eps);
    inv_rms[n] = r;
    float* out = y + n * int64_t(C);
    const VF vr = hn::Set(d, r), voff = hn::Set(d, offset);
    c = 0;
    for (; c + N <= C; c += N) {
      const VF scale = hn::Add(hn::LoadU(d, w + c), voff);
      hn::StoreU(hn::Mul(hn::Mul(hn::LoadU(d, row + c), vr), scale), d, out + c);
    }
    for (; c < C; ++c) out[c] = row[c] * r * (w[c] + offset);
  }
}

void RmsNormForward(float* y, float* inv_rms, const float* x, const float* w, int64_t Nrows,
                    int64_t C, float eps, float offset) {
  if (Nrows * C < kParallelElements) {
    RmsNormRows(y, inv_rms, x, w, 0, Nrows, size_t(C), eps, offset);
    return;
  }
#pragma omp parallel for schedule(static)
  for (int64_t chunk = 0; chunk < (Nrows + kLayerNormChunkRows - 1) / kLayerNormChunkRows;
       ++chunk) {
    RmsNormRows(y, inv_rms, x, w, chunk * kLayerNormChunkRows,
                std::min(Nrows, (chunk + 1) * kLayerNormChunkRows), size_t(C), eps, offset);
  }
}

template <class Out>
void LayerNormForwardAs(Out* y, float* mean, float* std, const float* x, const float* scale,
                        const float* shift, int64_t Nrows, int64_t C, float eps,
                        const float* residual = nullptr, float* x1 = nullptr) {
  if (Nrows * C < kParallelElements) {
    LayerNormRows(y, mean, std, x, scale, shift, 0, Nrows, size_t(C), eps, residual, x1);
    return;
  }
#pragma omp parallel for schedule(static)
  for (int64_t chunk = 0; chunk < (Nrows + kLayerNormChunkRows - 1) / kLayerNormChunkRows;
       ++chunk) {
    LayerNormRows(y, mean, std, x, scale, shift, chunk * kLayerNormChunkRows,
                  std::min(Nrows, (chunk + 1) * kLayerNormChunkRows), size_t(C), eps, residual,
                  x1);
  }
}

void LayerNormForward(float* y, float* mean, float* std, const float* x, const float* scale,
                      const float* shift, int64_t Nrows, int64_t C, float eps) {
  LayerNormForwardAs(y, mean, std, x, scale, shift, Nrows, C, eps);
}

void LayerNormForwardBf16(BFloat16* y, float* mean, float* std, const float* x, const float* scale,
                          const float* shift, int64_t Nrows, int64_t C, float eps) {
  LayerNormForwardAs(y, mean, std, x, scale, shift, Nrows, C, eps);
}

void AddLayerNormForward(float* x1, float* y, float* mean, float* std, const float* a,
                         const float* r, const float* scale, const float* shift, int64_t Nrows,
                         int64_t C, float eps) {
  LayerNormForwardAs(y, mean, std, a, scale, shift, Nrows, C, eps, r, x1);
}

void AddLayerNormForwardBf16(float* x1, BFloat16* y, float* mean, float* std, const float* a,
                             const float* r, const float* scale, const float* shift,
                             int64_t Nrows, int64_t C, float eps) {
  LayerNormForwardAs(y, mean, std, a, scale, shift, Nrows, C, eps, r, x1);
}

// dx for rows [n0, n1); dy·x̂ and dy summed over those rows into ds, db (C),
// which the caller zeroed.
// With dresidual != null, dx = dresidual + the layer norm's dx (add()'s bits).
void LayerNormBackwardRows(float* dx, float* ds, float* db, const float* dy, const float* x,
                           const float* scale, const float* mean, const float* std, int64_t n0,
                           int64_t n1, size_t C, const float* dresidual) {
  const DF d;
  const size_t N = hn::Lanes(d);
  for (int64_t n = n0; n < n1; ++n) {
    const float* px = x + n * int64_t(C);
    const float* pdy = dy + n * int64_t(C);
    float* pdx = dx + n * int64_t(C);
    const float mu = mean[n], r = 1.0f / std[n];
    const VF vmu = hn::Set(d, mu), vr = hn::Set(d, r);
    // Pass 1: Σ g and Σ g·x̂ over the row; dscale, dshift partial sums.
    VF sum_g = hn::Zero(d), sum_gx = hn::Zero(d);
    size_t c = 0;
    for (; c + N <= C; c += N) {
      const VF xhat = hn::Mul(hn::Sub(hn::LoadU(d, px + c), vmu), vr);
      const VF vdy = hn::LoadU(d, pdy + c);
      const VF g = hn::Mul(vdy, hn::LoadU(d, scale + c));
      sum_g = hn::Add(sum_g, g);
      sum_gx = hn::MulAdd(g, xhat, sum_gx);
      hn::StoreU(hn::MulAdd(vdy, xhat, hn::LoadU(d, ds + c)), d, ds + c);
      hn::StoreU(hn::Add(vdy, hn::LoadU(d, db + c)), d, db + c);
    }
    float sg = hn::GetLane(hn::SumOfLanes(d, sum_g));
    float sgx = hn::GetLane(hn::SumOfLanes(d, sum_gx));
    for (size_t t = c; t < C; ++t) {  // the tail, rounded as the lanes are (fused where they fuse)
      const float xhat = (px[t] - mu) * r, g = pdy[t] * scale[t];
      sg += g;
      sgx = std::fma(g, xhat, sgx);
      ds[t] = std::fma(pdy[t], xhat, ds[t]);
      db[t] += pdy[t];
    }
    const float mean_g = sg / float(C), mean_gx = sgx / float(C);
    // Pass 2: dx = (g − mean_g − x̂ · mean_gx) · r.
    const VF vmg = hn::Set(d, mean_g), vmgx = hn::Set(d, mean_gx);
    if (dresidual == nullptr) {
      for (c = 0; c + N <= C; c += N) {
        const VF xhat = hn::Mul(hn::Sub(hn::LoadU(d, px + c), vmu), vr);
        const VF g = hn::Mul(hn::LoadU(d, pdy + c), hn::LoadU(d, scale + c));
        hn::StoreU(hn::Mul(hn::NegMulAdd(xhat, vmgx, hn::Sub(g, vmg)), vr), d, pdx + c);
      }
      for (; c < C; ++c) {
        const float xhat = (px[c] - mu) * r, g = pdy[c] * scale[c];
        pdx[c] = std::fma(-xhat, mean_gx, g - mean_g) * r;
      }
    } else {
      const float* pdr = dresidual + n * int64_t(C);
      for (c = 0; c + N <= C; c += N) {
        const VF xhat = hn::Mul(hn::Sub(hn::LoadU(d, px + c), vmu), vr);
        const VF g = hn::Mul(hn::LoadU(d, pdy + c), hn::LoadU(d, scale + c));
        const VF ln = hn::Mul(hn::NegMulAdd(xhat, vmgx, hn::Sub(g, vmg)), vr);
        hn::StoreU(hn::Add(hn::LoadU(d, pdr + c), ln), d, pdx + c);
      }
      for (; c < C; ++c) {
        const float xhat = (px[c] - mu) * r, g = pdy[c] * scale[c];
        pdx[c] = pdr[c] + std::fma(-xhat, mean_gx, g - mean_g) * r;
      }
    }
  }
}

void LayerNormBackward(float* dx, float* dscale, float* dshift, const float* dy, const float* x,
                       const float* scale, const float* mean, const float* std, int64_t Nrows,
                       int64_t C, const float* dresidual) {
  // One partial (dscale, dshift) per chunk of kLayerNormChunkRows rows, added
  // in chunk order: the same bits for any thread count.
  const int64_t chunks = (Nrows + kLayerNormChunkRows - 1) / kLayerNormChunkRows;
  std::vector<float> partial(size_t(chunks * 2 * C), 0.0f);  // (chunks, 2, C)
  const auto run = [&](int64_t k) {
    float* ds = partial.data() + k * 2 * C;
    LayerNormBackwardRows(dx, ds, ds + C, dy, x, scale, mean, std, k * kLayerNormChunkRows,
                          std::min(Nrows, (k + 1) * kLayerNormChunkRows), size_t(C), dresidual);
  };
  if (Nrows * C < kParallelElements) {
    for (int64_t k = 0; k < chunks; ++k) run(k);
  } else {
#pragma omp parallel for schedule(static)
    for (int64_t k = 0; k < chunks; ++k) run(k);
  }
  for (int64_t k = 0; k < chunks; ++k) {
    const float* ds = partial.data() + k * 2 * C;
    for (int64_t c = 0; c < C; ++c) {
      dscale[c] += ds[c];
      dshift[c] += ds[C + c];
    }
  }
}

// ---- bf16 rounding (the bf16 path's operands) ----

// dst = bf16(src).
void RoundToBf16Range(BFloat16* dst, const float* src, size_t n) {
  MapToBf16Range(dst, src, n, [](VF v) { return v; });
}

void RoundToBf16(BFloat16* dst, const float* src, int64_t n) {
  Chunked(n, [&](size_t i, size_t count) { RoundToBf16Range(dst + i, src + i, count); });
}

// dst = float(bf16(src)): RoundToBf16Vec's bits in the high half, zeros below
// (a NaN: 0xFFFF0000). dst may be src.
void RoundToBf16ValuesRange(float* dst, const float* src, size_t n) {
  const DF d;
  const size_t N = hn::Lanes(d);
  size_t i = 0;
  for (; i + N <= n; i += N) hn::StoreU(RoundToBf16ValuesVec(d, hn::LoadU(d, src + i)), d, dst + i);
  for (; i < n; ++i) dst[i] = to_float(to_bfloat16(src[i]));
}

void RoundToBf16Values(float* dst, const float* src, int64_t n) {
  Chunked(n, [&](size_t i, size_t count) { RoundToBf16ValuesRange(dst + i, src + i, count); });
}

// ---- the SIMD target the kernels run on ----

const char* LayerKernelsTarget() { return hwy::TargetName(HWY_TARGET); }

// NOLINTNEXTLINE(google-readability-namespace-comments)
}  // namespace HWY_NAMESPACE
}  // namespace attn::kernels
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace attn::kernels {

HWY_EXPORT(LayerNormForward);
HWY_EXPORT(RmsNormForward);

void rms_norm_forward(float* y, float* inv_rms, const float* x, const float* weight, int64_t N,
                      int64_t C, float eps, float weight_offset) {
  if (N <= 0 || C <= 0) return;
  HWY_DYNAMIC_DISPATCH(RmsNormForward)(y, inv_rms, x, weight, N, C, eps, weight_offset);
}
HWY_EXPORT(LayerNormForwardBf16);
HWY_EXPORT(LayerNormBackward);
HWY_EXPORT(AddLayerNormForward);
HWY_EXPORT(AddLayerNormForwardBf16);
HWY_EXPORT(RoundToBf16);
HWY_EXPORT(RoundToBf16Values);
HWY_EXPORT(LayerKernelsTarget);

void layer_norm_forward(float* y, float* mean, float* std, const float* x, const float* scale,
                        const float* shift, int64_t N, int64_t C, float eps) {
  if (N <= 0 || C <= 0) return;
  HWY_DYNAMIC_DISPATCH(LayerNormForward)(y, mean, std, x, scale, shift, N, C, eps);
}

void layer_norm_forward_bf16(BFloat16* y, float* mean, float* std, const float* x,
                             const float* scale, const float* shift, int64_t N, int64_t C,
                             float eps) {
  if (N <= 0 || C <= 0) return;
  HWY_DYNAMIC_DISPATCH(LayerNormForwardBf16)(y, mean, std, x, scale, shift, N, C, eps);
}

void layer_norm_backward(float* dx, float* dscale, float* dshift, const float* dy, const float* x,
                         const float* scale, const float* mean, const float* std, int64_t N,
                         int64_t C) {
  if (N <= 0 || C <= 0) return;
  HWY_DYNAMIC_DISPATCH(LayerNormBackward)(dx, dscale, dshift, dy, x, scale, mean, std, N, C,
                                          nullptr);
}

void layer_norm_backward_add(float* dx, float* dscale, float* dshift, const float* dy,
                             const float* dresidual, const float* x, const float* scale,
                             const float* mean, const float* std, int64_t N, int64_t C) {
  if (N <= 0 || C <= 0) return;
  HWY_DYNAMIC_DISPATCH(LayerNormBackward)(dx, dscale, dshift, dy, x, scale, mean, std, N, C,
                                          dresidual);
}

void add_layer_norm_forward(float* x1, float* y, float* mean, float* std, const float* a,
                            const float* r, const float* scale, const float* shift, int64_t N,
                            int64_t C, float eps) {
  if (N <= 0 || C <= 0) return;
  HWY_DYNAMIC_DISPATCH(AddLayerNormForward)(x1, y, mean, std, a, r, scale, shift, N, C, eps);
}

void add_layer_norm_forward_bf16(float* x1, BFloat16* y, float* mean, float* std, const float* a,
                                 const float* r, const float* scale, const float* shift,
                                 int64_t N, int64_t C, float eps) {
  if (N <= 0 || C <= 0) return;
  HWY_DYNAMIC_DISPATCH(AddLayerNormForwardBf16)(x1, y, mean, std, a, r, scale, shift, N, C, eps);
}

void round_to_bf16(BFloat16* dst, const float* src, int64_t n) {
  if (n > 0) HWY_DYNAMIC_DISPATCH(RoundToBf16)(dst, src, n);
}

void round_to_bf16_values(float* dst, const float* src, int64_t n) {
  if (n > 0) HWY_DYNAMIC_DISPATCH(RoundToBf16Values)(dst, src, n);
}

const char* layer_kernels_target() { return HWY_DYNAMIC_DISPATCH(LayerKernelsTarget)(); }

}  // namespace attn::kernels
#endif  // HWY_ONCE
