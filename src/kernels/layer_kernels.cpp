// SIMD layer normalisation and GELU, forward and backward, and AdamW's update
// (attn/layer_kernels.h states the maths and the contract; attn::ref's loops
// are the specification). Highway dynamic dispatch; OpenMP over rows (layer
// norm) or over chunks of elements (GELU, AdamW) once there is enough work to
// pay for the threads.
#include "attn/layer_kernels.h"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <vector>

#include "attn/tensor.h"

#ifdef _OPENMP
#include <omp.h>
#endif

#include "kernels/hwy_targets.h"
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/layer_kernels.cpp"
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

// Elements (GELU) or row elements (layer norm) below which one thread does it all.
constexpr int64_t kParallelElements = int64_t{1} << 15;
constexpr float kGeluCubic = 0.044715f;

// The last n < Lanes(d) floats at p in the first lanes, zeros after: through a
// buffer, since Highway's MaskedLoad may read a whole (aligned) vector on
// targets without masked loads.
HWY_INLINE VF LoadTail(DF d, const float* p, size_t n) {
  HWY_ALIGN float buf[hn::MaxLanes(DF())] = {};
  std::copy_n(p, n, buf);
  return hn::Load(d, buf);
}

// Stores the first n < Lanes(d) lanes of v to p.
HWY_INLINE void StoreTail(DF d, VF v, float* p, size_t n) {
  HWY_ALIGN float buf[hn::MaxLanes(DF())];
  hn::Store(v, d, buf);
  std::copy_n(buf, n, p);
}

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

// bf16(v) in the lanes of a uint16 vector: to_bfloat16 (attn/tensor.h) in
// vector lanes, u + 0x7FFF + (bit 16 of u), the high half; NaN becomes 0xFFFF.
HWY_INLINE hn::Vec<hn::Rebind<uint16_t, DF>> RoundToBf16Vec(DF /*d*/, VF v) {
  const hn::RebindToUnsigned<DF> du;
  const hn::RebindToSigned<DF> di;
  const hn::Rebind<uint16_t, DF> du16;
  const auto u = hn::BitCast(du, v);
  const auto lsb = hn::And(hn::ShiftRight<16>(u), hn::Set(du, 1u));
  const auto rounded = hn::ShiftRight<16>(hn::Add(u, hn::Add(hn::Set(du, 0x7FFFu), lsb)));
  const auto bits = hn::IfThenElse(hn::RebindMask(du, hn::IsNaN(v)), hn::Set(du, 0xFFFFu), rounded);
  return hn::DemoteTo(du16, hn::BitCast(di, bits));  // every lane <= 0xFFFF: exact
}

// float(bf16(v)) lane by lane: RoundToBf16Vec's bits in the high half, zeros
// below (a NaN: 0xFFFF0000).
HWY_INLINE VF RoundToBf16ValuesVec(DF d, VF v) {
  const hn::RebindToUnsigned<DF> du;
  const auto u = hn::BitCast(du, v);
  const auto lsb = hn::And(hn::ShiftRight<16>(u), hn::Set(du, 1u));
  const auto rounded =
      hn::And(hn::Add(u, hn::Add(hn::Set(du, 0x7FFFu), lsb)), hn::Set(du, 0xFFFF0000u));
  return hn::BitCast(
      d, hn::IfThenElse(hn::RebindMask(du, hn::IsNaN(v)), hn::Set(du, 0xFFFF0000u), rounded));
}

// A float holding a bf16 value: an output rounded to bf16 and kept in float32
// (a bf16 product's operand on gemm_bf16's widened route, attn/bf16_operand.h).
struct Bf16Value {
  float value;
};

// Stores the lanes of v to out (float), or rounded to bf16 (the bf16 path),
// or rounded to bf16 values in float32.
HWY_INLINE void StoreOut(DF d, VF v, float* out) { hn::StoreU(v, d, out); }
HWY_INLINE void StoreOut(DF d, VF v, BFloat16* out) {
  hn::StoreU(RoundToBf16Vec(d, v), hn::Rebind<uint16_t, DF>(), reinterpret_cast<uint16_t*>(out));
}
HWY_INLINE void StoreOut(DF d, VF v, Bf16Value* out) {
  hn::StoreU(RoundToBf16ValuesVec(d, v), d, &out->value);
}
inline void StoreOut(float v, float* out) { *out = v; }
inline void StoreOut(float v, BFloat16* out) { *out = to_bfloat16(v); }
inline void StoreOut(float v, Bf16Value* out) { out->value = to_float(to_bfloat16(v)); }

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

// u = √(2/π) (x + 0.044715 x³), written as x · (k0 + k1 x²).
HWY_INLINE VF GeluInner(DF d, VF x) {
  const float k0 = static_cast<float>(std::numbers::sqrt2 / std::sqrt(std::numbers::pi));
  const VF x2 = hn::Mul(x, x);
  return hn::Mul(x, hn::MulAdd(hn::Set(d, k0 * kGeluCubic), x2, hn::Set(d, k0)));
}

HWY_INLINE VF GeluForwardVec(DF d, VF x) {
  const VF t = hn::Tanh(d, GeluInner(d, x));
  const VF half_x = hn::Mul(hn::Set(d, 0.5f), x);
  return hn::MulAdd(half_x, t, half_x);  // 0.5 x (1 + t)
}

// gelu'(x) from t = tanh(u): 0.5 (1 + t) + 0.5 x (1 − t²) du/dx.
HWY_INLINE VF GeluSlopeFromTanh(DF d, VF x, VF t) {
  const float k0 = static_cast<float>(std::numbers::sqrt2 / std::sqrt(std::numbers::pi));
  const VF half = hn::Set(d, 0.5f);
  const VF x2 = hn::Mul(x, x);
  // du/dx = k0 (1 + 3 · 0.044715 x²)
  const VF du = hn::MulAdd(hn::Set(d, k0 * 3.0f * kGeluCubic), x2, hn::Set(d, k0));
  const VF one_minus_t2 = hn::NegMulAdd(t, t, hn::Set(d, 1.0f));
  // 0.5 (1 + t) + 0.5 x (1 − t²) du
  return hn::MulAdd(hn::Mul(hn::Mul(half, x), one_minus_t2), du, hn::MulAdd(half, t, half));
}

HWY_INLINE VF GeluBackwardVec(DF d, VF dy, VF x) {
  return hn::Mul(dy, GeluSlopeFromTanh(d, x, hn::Tanh(d, GeluInner(d, x))));
}

// gelu(x) (GeluForwardVec's bits) and gelu'(x) (the factor GeluBackwardVec
// multiplies dy by, its bits) from one tanh.
HWY_INLINE VF GeluForwardSlopeVec(DF d, VF x, VF& slope) {
  const VF t = hn::Tanh(d, GeluInner(d, x));
  slope = GeluSlopeFromTanh(d, x, t);
  const VF half_x = hn::Mul(hn::Set(d, 0.5f), x);
  return hn::MulAdd(half_x, t, half_x);  // 0.5 x (1 + t)
}

void GeluForwardRange(float* y, const float* x, size_t n) {
  const DF d;
  const size_t N = hn::Lanes(d);
  size_t i = 0;
  for (; i + N <= n; i += N) hn::StoreU(GeluForwardVec(d, hn::LoadU(d, x + i)), d, y + i);
  if (i < n) StoreTail(d, GeluForwardVec(d, LoadTail(d, x + i, n - i)), y + i, n - i);
}

void GeluBackwardRange(float* dx, const float* dy, const float* x, size_t n) {
  const DF d;
  const size_t N = hn::Lanes(d);
  size_t i = 0;
  for (; i + N <= n; i += N) {
    hn::StoreU(GeluBackwardVec(d, hn::LoadU(d, dy + i), hn::LoadU(d, x + i)), d, dx + i);
  }
  if (i < n) {
    const VF g = GeluBackwardVec(d, LoadTail(d, dy + i, n - i), LoadTail(d, x + i, n - i));
    StoreTail(d, g, dx + i, n - i);
  }
}

// Runs f(begin, count) over [0, n) in chunks, on the OpenMP threads when n is large.
template <class F>
void Chunked(int64_t n, const F& f) {
  constexpr int64_t kChunk = 1 << 13;
  if (n < kParallelElements) {
    f(0, size_t(n));
    return;
  }
#pragma omp parallel for schedule(static)
  for (int64_t c = 0; c < (n + kChunk - 1) / kChunk; ++c) {
    f(size_t(c * kChunk), size_t(std::min(kChunk, n - c * kChunk)));
  }
}

void GeluForward(float* y, const float* x, int64_t n) {
  Chunked(n, [&](size_t i, size_t count) { GeluForwardRange(y + i, x + i, count); });
}

void GeluBackward(float* dx, const float* dy, const float* x, int64_t n) {
  Chunked(n, [&](size_t i, size_t count) { GeluBackwardRange(dx + i, dy + i, x + i, count); });
}

// y = bf16(f(x)), n elements: f on float vectors, rounded as it is stored.
// The tail runs f on a zero-padded vector and rounds lane by lane.
template <class F>
void MapToBf16Range(BFloat16* y, const float* x, size_t n, const F& f) {
  const DF d;
  const hn::Rebind<uint16_t, DF> du16;
  const size_t N = hn::Lanes(d);
  auto* out = reinterpret_cast<uint16_t*>(y);
  size_t i = 0;
  for (; i + N <= n; i += N) hn::StoreU(RoundToBf16Vec(d, f(hn::LoadU(d, x + i))), du16, out + i);
  if (i < n) {
    HWY_ALIGN float buf[hn::MaxLanes(DF())];
    hn::Store(f(LoadTail(d, x + i, n - i)), d, buf);
    for (size_t k = 0; k < n - i; ++k) y[i + k] = to_bfloat16(buf[k]);
  }
}

// dst = bf16(src); y = bf16(gelu(x)) (GeluForwardRange's values, rounded).
void RoundToBf16Range(BFloat16* dst, const float* src, size_t n) {
  MapToBf16Range(dst, src, n, [](VF v) { return v; });
}
void GeluForwardBf16Range(BFloat16* y, const float* x, size_t n) {
  MapToBf16Range(y, x, n, [](VF v) { return GeluForwardVec(DF(), v); });
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

void GeluForwardBf16(BFloat16* y, const float* x, int64_t n) {
  Chunked(n, [&](size_t i, size_t count) { GeluForwardBf16Range(y + i, x + i, count); });
}

// ---- bias + GELU (FeedForward's fc and its activation in one pass) ----

// Rows [r0, r1) of h (M, C): h += b, then y = gelu(h) (float, or rounded to
// bf16); with kSlope, h = gelu'(h + b) is stored instead of h + b.
template <bool kSlope, class Out>
void BiasGeluRows(float* h, Out* y, const float* b, int64_t r0, int64_t r1, size_t C) {
  const DF d;
  const size_t N = hn::Lanes(d);
  // y = gelu(v); the value h keeps.
  const auto gelu = [&](VF v, VF& keep) {
    if constexpr (kSlope) return GeluForwardSlopeVec(d, v, keep);
    keep = v;
    return GeluForwardVec(d, v);
  };
  for (int64_t r = r0; r < r1; ++r) {
    float* ph = h + r * int64_t(C);
    Out* py = y + r * int64_t(C);
    size_t c = 0;
    for (; c + N <= C; c += N) {
      VF keep;
      const VF g = gelu(hn::Add(hn::LoadU(d, ph + c), hn::LoadU(d, b + c)), keep);
      hn::StoreU(keep, d, ph + c);
      StoreOut(d, g, py + c);
    }
    if (c < C) {  // the tail: gelu on a zero-padded vector, stored lane by lane
      const size_t n = C - c;
      VF keep;
      const VF g = gelu(hn::Add(LoadTail(d, ph + c, n), LoadTail(d, b + c, n)), keep);
      HWY_ALIGN float vb[hn::MaxLanes(DF())], gb[hn::MaxLanes(DF())];
      hn::Store(keep, d, vb);
      hn::Store(g, d, gb);
      for (size_t k = 0; k < n; ++k) {
        ph[c + k] = vb[k];
        StoreOut(gb[k], py + c + k);
      }
    }
  }
}

// Runs f(r0, r1) over the rows [0, M) in chunks of kGeluChunkRows, on the
// OpenMP threads when M·C is large.
template <class F>
void RowChunks(int64_t M, int64_t C, const F& f) {
  const int64_t chunks = (M + kGeluChunkRows - 1) / kGeluChunkRows;
  const auto run = [&](int64_t k) {
    f(k, k * kGeluChunkRows, std::min(M, (k + 1) * kGeluChunkRows));
  };
  if (M * C < kParallelElements) {
    for (int64_t k = 0; k < chunks; ++k) run(k);
    return;
  }
#pragma omp parallel for schedule(static)
  for (int64_t k = 0; k < chunks; ++k) run(k);
}

template <bool kSlope, class Out>
void BiasGeluForwardAs(float* h, Out* y, const float* b, int64_t M, int64_t C) {
  RowChunks(M, C, [&](int64_t, int64_t r0, int64_t r1) {
    BiasGeluRows<kSlope>(h, y, b, r0, r1, size_t(C));
  });
}

void BiasGeluForward(float* h, float* y, const float* b, int64_t M, int64_t C) {
  BiasGeluForwardAs<false>(h, y, b, M, C);
}
void BiasGeluForwardBf16(float* h, BFloat16* y, const float* b, int64_t M, int64_t C) {
  BiasGeluForwardAs<false>(h, y, b, M, C);
}
void BiasGeluForwardSlope(float* h, float* y, const float* b, int64_t M, int64_t C) {
  BiasGeluForwardAs<true>(h, y, b, M, C);
}
void BiasGeluForwardSlopeBf16(float* h, BFloat16* y, const float* b, int64_t M, int64_t C) {
  BiasGeluForwardAs<true>(h, y, b, M, C);
}
void BiasGeluForwardSlopeBf16Values(float* h, float* y, const float* b, int64_t M, int64_t C) {
  BiasGeluForwardAs<true>(h, reinterpret_cast<Bf16Value*>(y), b, M, C);
}

// Rows [r0, r1): dh = gelu'(h) ⊙ dy (GeluBackwardVec), or with kFromSlope
// dh = dy ⊙ s where s = gelu'(h) was stored by the forward (the same bits),
// stored as Out; the float dh summed over these rows, in row order, into
// db_part (C, zeroed).
template <bool kFromSlope, class Out>
void GeluBackwardBiasRows(Out* dh, float* db_part, const float* dy, const float* h, int64_t r0,
                          int64_t r1, size_t C) {
  const DF d;
  const size_t N = hn::Lanes(d);
  const auto grad = [&](VF vdy, VF vh) {
    if constexpr (kFromSlope) return hn::Mul(vdy, vh);
    return GeluBackwardVec(d, vdy, vh);
  };
  for (int64_t r = r0; r < r1; ++r) {
    const float* pdy = dy + r * int64_t(C);
    const float* ph = h + r * int64_t(C);
    Out* pdh = dh + r * int64_t(C);
    size_t c = 0;
    for (; c + N <= C; c += N) {
      const VF g = grad(hn::LoadU(d, pdy + c), hn::LoadU(d, ph + c));
      hn::StoreU(hn::Add(hn::LoadU(d, db_part + c), g), d, db_part + c);
      StoreOut(d, g, pdh + c);
    }
    if (c < C) {
      const size_t n = C - c;
      HWY_ALIGN float gb[hn::MaxLanes(DF())];
      hn::Store(grad(LoadTail(d, pdy + c, n), LoadTail(d, ph + c, n)), d, gb);
      for (size_t k = 0; k < n; ++k) {
        db_part[c + k] += gb[k];
        StoreOut(gb[k], pdh + c + k);
      }
    }
  }
}

template <bool kFromSlope, class Out>
void GeluBackwardBiasAs(Out* dh, float* db, const float* dy, const float* h, int64_t M,
                        int64_t C) {
  // One partial db per chunk of kGeluChunkRows rows, added in chunk order:
  // the same bits for any thread count.
  const int64_t chunks = (M + kGeluChunkRows - 1) / kGeluChunkRows;
  std::vector<float> partial(size_t(chunks * C), 0.0f);  // (chunks, C)
  RowChunks(M, C, [&](int64_t k, int64_t r0, int64_t r1) {
    GeluBackwardBiasRows<kFromSlope>(dh, partial.data() + k * C, dy, h, r0, r1, size_t(C));
  });
  for (int64_t k = 0; k < chunks; ++k) {
    const float* p = partial.data() + k * C;
    for (int64_t c = 0; c < C; ++c) db[c] += p[c];
  }
}

void GeluBackwardBias(float* dh, float* db, const float* dy, const float* h, int64_t M,
                      int64_t C) {
  GeluBackwardBiasAs<false>(dh, db, dy, h, M, C);
}
void GeluBackwardBiasBf16(BFloat16* dh, float* db, const float* dy, const float* h, int64_t M,
                          int64_t C) {
  GeluBackwardBiasAs<false>(dh, db, dy, h, M, C);
}
void SlopeBackwardBias(float* dh, float* db, const float* dy, const float* slope, int64_t M,
                       int64_t C) {
  GeluBackwardBiasAs<true>(dh, db, dy, slope, M, C);
}
void SlopeBackwardBiasBf16(BFloat16* dh, float* db, const float* dy, const float* slope,
                           int64_t M, int64_t C) {
  GeluBackwardBiasAs<true>(dh, db, dy, slope, M, C);
}
void SlopeBackwardBiasBf16Values(float* dh, float* db, const float* dy, const float* slope,
                                 int64_t M, int64_t C) {
  GeluBackwardBiasAs<true>(reinterpret_cast<Bf16Value*>(dh), db, dy, slope, M, C);
}

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

const char* LayerKernelsTarget() { return hwy::TargetName(HWY_TARGET); }

// NOLINTNEXTLINE(google-readability-namespace-comments)
}  // namespace HWY_NAMESPACE
}  // namespace attn::kernels
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace attn::kernels {

HWY_EXPORT(LayerNormForward);
HWY_EXPORT(LayerNormForwardBf16);
HWY_EXPORT(LayerNormBackward);
HWY_EXPORT(GeluForward);
HWY_EXPORT(GeluBackward);
HWY_EXPORT(AdamWUpdate);
HWY_EXPORT(RoundToBf16);
HWY_EXPORT(RoundToBf16Values);
HWY_EXPORT(GeluForwardBf16);
HWY_EXPORT(LayerKernelsTarget);
HWY_EXPORT(AddLayerNormForward);
HWY_EXPORT(AddLayerNormForwardBf16);
HWY_EXPORT(BiasGeluForward);
HWY_EXPORT(BiasGeluForwardBf16);
HWY_EXPORT(GeluBackwardBias);
HWY_EXPORT(GeluBackwardBiasBf16);
HWY_EXPORT(BiasGeluForwardSlope);
HWY_EXPORT(BiasGeluForwardSlopeBf16);
HWY_EXPORT(SlopeBackwardBias);
HWY_EXPORT(SlopeBackwardBiasBf16);
HWY_EXPORT(BiasGeluForwardSlopeBf16Values);
HWY_EXPORT(SlopeBackwardBiasBf16Values);
HWY_EXPORT(AdamWUpdateZeroGrad);
HWY_EXPORT(SumSquares);
HWY_EXPORT(AdamWUpdateZeroGradMany);
HWY_EXPORT(SumSquaresMany);

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

void bias_gelu_forward(float* h, float* y, const float* b, int64_t M, int64_t N) {
  if (M > 0 && N > 0) HWY_DYNAMIC_DISPATCH(BiasGeluForward)(h, y, b, M, N);
}

void bias_gelu_forward_bf16(float* h, BFloat16* y, const float* b, int64_t M, int64_t N) {
  if (M > 0 && N > 0) HWY_DYNAMIC_DISPATCH(BiasGeluForwardBf16)(h, y, b, M, N);
}

void gelu_backward_bias(float* dh, float* db, const float* dy, const float* h, int64_t M,
                        int64_t N) {
  if (M > 0 && N > 0) HWY_DYNAMIC_DISPATCH(GeluBackwardBias)(dh, db, dy, h, M, N);
}

void gelu_backward_bias_bf16(BFloat16* dh, float* db, const float* dy, const float* h, int64_t M,
                             int64_t N) {
  if (M > 0 && N > 0) HWY_DYNAMIC_DISPATCH(GeluBackwardBiasBf16)(dh, db, dy, h, M, N);
}

void bias_gelu_forward_slope(float* h, float* y, const float* b, int64_t M, int64_t N) {
  if (M > 0 && N > 0) HWY_DYNAMIC_DISPATCH(BiasGeluForwardSlope)(h, y, b, M, N);
}

void bias_gelu_forward_slope_bf16(float* h, BFloat16* y, const float* b, int64_t M, int64_t N) {
  if (M > 0 && N > 0) HWY_DYNAMIC_DISPATCH(BiasGeluForwardSlopeBf16)(h, y, b, M, N);
}

void slope_backward_bias(float* dh, float* db, const float* dy, const float* slope, int64_t M,
                         int64_t N) {
  if (M > 0 && N > 0) HWY_DYNAMIC_DISPATCH(SlopeBackwardBias)(dh, db, dy, slope, M, N);
}

void slope_backward_bias_bf16(BFloat16* dh, float* db, const float* dy, const float* slope,
                              int64_t M, int64_t N) {
  if (M > 0 && N > 0) HWY_DYNAMIC_DISPATCH(SlopeBackwardBiasBf16)(dh, db, dy, slope, M, N);
}

void bias_gelu_forward_slope_bf16_values(float* h, float* y, const float* b, int64_t M, int64_t N) {
  if (M > 0 && N > 0) HWY_DYNAMIC_DISPATCH(BiasGeluForwardSlopeBf16Values)(h, y, b, M, N);
}

void slope_backward_bias_bf16_values(float* dh, float* db, const float* dy, const float* slope,
                                     int64_t M, int64_t N) {
  if (M > 0 && N > 0) HWY_DYNAMIC_DISPATCH(SlopeBackwardBiasBf16Values)(dh, db, dy, slope, M, N);
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

void gelu_forward(float* y, const float* x, int64_t n) {
  if (n > 0) HWY_DYNAMIC_DISPATCH(GeluForward)(y, x, n);
}

void gelu_backward(float* dx, const float* dy, const float* x, int64_t n) {
  if (n > 0) HWY_DYNAMIC_DISPATCH(GeluBackward)(dx, dy, x, n);
}

void adamw_update(float* w, float* m, float* v, const float* g, int64_t n, const AdamWScalars& c) {
  if (n > 0) HWY_DYNAMIC_DISPATCH(AdamWUpdate)(w, m, v, g, n, c);
}

void round_to_bf16(BFloat16* dst, const float* src, int64_t n) {
  if (n > 0) HWY_DYNAMIC_DISPATCH(RoundToBf16)(dst, src, n);
}

void round_to_bf16_values(float* dst, const float* src, int64_t n) {
  if (n > 0) HWY_DYNAMIC_DISPATCH(RoundToBf16Values)(dst, src, n);
}

void gelu_forward_bf16(BFloat16* y, const float* x, int64_t n) {
  if (n > 0) HWY_DYNAMIC_DISPATCH(GeluForwardBf16)(y, x, n);
}

const char* layer_kernels_target() { return HWY_DYNAMIC_DISPATCH(LayerKernelsTarget)(); }

// ---- bias rows and column sums ----
// Plain loops the compiler vectorises; memory-bound, so what matters is that
// both cores stream. Below kParallelElements elements one thread does it all.
namespace {
constexpr int64_t kRowsParallelElements = int64_t{1} << 15;

float as_float(float v) { return v; }
float as_float(BFloat16 v) { return to_float(v); }

// Columns [N·t/n, N·(t+1)/n) for thread t of n, so that each column is summed
// by one thread over all rows in row order: the serial loop's bits for any n.
template <class T>
void column_sums(float* db, const T* A, int64_t lda, int64_t M, int64_t N) {
#pragma omp parallel if (M * N >= kRowsParallelElements)
  {
    int64_t t = 0, n = 1;
#ifdef _OPENMP
    t = omp_get_thread_num();
    n = omp_get_num_threads();
#endif
    const int64_t j0 = N * t / n, j1 = N * (t + 1) / n;
    for (int64_t r = 0; r < M; ++r) {
      const T* row = A + r * lda;
      for (int64_t j = j0; j < j1; ++j) db[j] += as_float(row[j]);
    }
  }
}
}  // namespace

void fill_rows(float* C, int64_t ldc, const float* b, int64_t M, int64_t N) {
#pragma omp parallel for schedule(static) if (M * N >= kRowsParallelElements)
  for (int64_t r = 0; r < M; ++r) std::copy_n(b, N, C + r * ldc);
}

void fill_rows_add(float* C, int64_t ldc, const float* b, const float* R, int64_t ldr, int64_t M,
                   int64_t N) {
#pragma omp parallel for schedule(static) if (M * N >= kRowsParallelElements)
  for (int64_t r = 0; r < M; ++r) {
    float* c = C + r * ldc;
    const float* x = R + r * ldr;
    for (int64_t j = 0; j < N; ++j) c[j] = x[j] + b[j];
  }
}

void column_sums_accumulate(float* db, const float* A, int64_t lda, int64_t M, int64_t N) {
  column_sums(db, A, lda, M, N);
}

void column_sums_accumulate(float* db, const BFloat16* A, int64_t lda, int64_t M, int64_t N) {
  column_sums(db, A, lda, M, N);
}

}  // namespace attn::kernels
#endif  // HWY_ONCE
