// SIMD GELU (the tanh form), forward and backward: alone, rounded to bf16 as
// it is stored, in the gated feed-forward (SwiGLU's SiLU beside it), and fused
// with the bias of FeedForward's fc, keeping either
// h + b or the slope gelu'(h + b) for the backward (attn/layer_kernels.h
// states the maths and the contract; ref::gelu_forward / _backward are the
// specification). Highway dynamic dispatch; OpenMP over chunks of elements, or
// of kGeluChunkRows rows, once there is enough work to pay for the threads.
#include <algorithm>
#include <cmath>
#include <numbers>
#include <vector>

#include "attn/bfloat16.h"
#include "attn/layer_kernels.h"

#include "cpu/hwy_targets.h"
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/gelu_kernels.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>
// After highway.h: the -inl headers are compiled once per target.
#include <hwy/contrib/math/math-inl.h>  // NOLINT(build/include_order)
// (Tanh; and what the layer kernels' files share)
#include "kernels/layer_kernels-inl.h"

HWY_BEFORE_NAMESPACE();
namespace attn::kernels {
namespace HWY_NAMESPACE {

constexpr float kGeluCubic = 0.044715f;

// Stores the first n < Lanes(d) lanes of v to p.
HWY_INLINE void StoreTail(DF d, VF v, float* p, size_t n) {
  HWY_ALIGN float buf[hn::MaxLanes(DF())];
  hn::Store(v, d, buf);
  std::copy_n(buf, n, p);
}

// A float holding a bf16 value: an output rounded to bf16 and kept in float32
// (a bf16 product's operand on gemm_bf16's widened route, attn/bf16_operand.h).
struct Bf16Value {
  float value;
};

// StoreOut (layer_kernels-inl.h) to bf16 values kept in float32.
HWY_INLINE void StoreOut(DF d, VF v, Bf16Value* out) {
  hn::StoreU(RoundToBf16ValuesVec(d, v), d, &out->value);
}
inline void StoreOut(float v, Bf16Value* out) { out->value = to_float(to_bfloat16(v)); }

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

void GeluForward(float* y, const float* x, int64_t n) {
  Chunked(n, [&](size_t i, size_t count) { GeluForwardRange(y + i, x + i, count); });
}

void GeluBackward(float* dx, const float* dy, const float* x, int64_t n) {
  Chunked(n, [&](size_t i, size_t count) { GeluBackwardRange(dx + i, dy + i, x + i, count); });
}

// y = bf16(gelu(x)) (GeluForwardRange's values, rounded).
void GeluForwardBf16Range(BFloat16* y, const float* x, size_t n) {
  MapToBf16Range(y, x, n, [](VF v) { return GeluForwardVec(DF(), v); });
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

// ---- the gated feed-forward: z = act(g) ⊙ u ------------------------------------------------

// silu(g) = g · σ(g), σ(g) = 1 / (1 + e^-g); sigma gets σ(g).
HWY_INLINE VF SiluVec(DF d, VF g, VF& sigma) {
  const VF one = hn::Set(d, 1.0f);
  sigma = hn::Div(one, hn::Add(one, hn::Exp(d, hn::Neg(g))));
  return hn::Mul(g, sigma);
}

template <bool kGelu>
HWY_INLINE VF GateVec(DF d, VF g) {
  if constexpr (kGelu) {
    return GeluForwardVec(d, g);
  } else {
    VF sigma;
    return SiluVec(d, g, sigma);
  }
}

// act'(g): silu' = σ (1 + g (1 − σ)); gelu' as GeluSlopeFromTanh. a gets act(g).
template <bool kGelu>
HWY_INLINE VF GateSlopeVec(DF d, VF g, VF& a) {
  if constexpr (kGelu) {
    VF slope;
    a = GeluForwardSlopeVec(d, g, slope);
    return slope;
  } else {
    VF sigma;
    a = SiluVec(d, g, sigma);
    const VF one = hn::Set(d, 1.0f);
    return hn::Mul(sigma, hn::MulAdd(g, hn::Sub(one, sigma), one));
  }
}

template <bool kGelu>
void GatedForwardRange(float* z, float* a, const float* g, const float* u, size_t n) {
  const DF d;
  const size_t N = hn::Lanes(d);
  auto step = [&](size_t i, size_t count) {
    const bool whole = count == N;
    const VF gv = whole ? hn::LoadU(d, g + i) : LoadTail(d, g + i, count);
    const VF uv = whole ? hn::LoadU(d, u + i) : LoadTail(d, u + i, count);
    const VF av = GateVec<kGelu>(d, gv);
    const VF zv = hn::Mul(av, uv);
    if (whole) {
      hn::StoreU(zv, d, z + i);
      if (a != nullptr) hn::StoreU(av, d, a + i);
    } else {
      StoreTail(d, zv, z + i, count);
      if (a != nullptr) StoreTail(d, av, a + i, count);
    }
  };
  size_t i = 0;
  for (; i + N <= n; i += N) step(i, N);
  if (i < n) step(i, n - i);
}

template <bool kGelu>
void GatedBackwardRange(float* dg, float* du, const float* dz, const float* g, const float* u,
                        size_t n) {
  const DF d;
  const size_t N = hn::Lanes(d);
  auto step = [&](size_t i, size_t count) {
    const bool whole = count == N;
    auto load = [&](const float* p) {
      return whole ? hn::LoadU(d, p + i) : LoadTail(d, p + i, count);
    };
    const VF dzv = load(dz), gv = load(g), uv = load(u);
    VF av;
    const VF slope = GateSlopeVec<kGelu>(d, gv, av);
    const VF dgv = hn::Mul(hn::Mul(dzv, uv), slope);
    const VF duv = hn::Mul(dzv, av);
    if (whole) {
      hn::StoreU(dgv, d, dg + i);
      hn::StoreU(duv, d, du + i);
    } else {
      StoreTail(d, dgv, dg + i, count);
      StoreTail(d, duv, du + i, count);
    }
  };
  size_t i = 0;
  for (; i + N <= n; i += N) step(i, N);
  if (i < n) step(i, n - i);
}

void GatedActivationForward(float* z, float* a, const float* g, const float* u, int64_t n,
                            bool gelu) {
  Chunked(n, [&](size_t i, size_t count) {
    float* ai = a != nullptr ? a + i : nullptr;
    if (gelu) {
      GatedForwardRange<true>(z + i, ai, g + i, u + i, count);
    } else {
      GatedForwardRange<false>(z + i, ai, g + i, u + i, count);
    }
  });
}

void GatedActivationBackward(float* dg, float* du, const float* dz, const float* g, const float* u,
                             int64_t n, bool gelu) {
  Chunked(n, [&](size_t i, size_t count) {
    if (gelu) {
      GatedBackwardRange<true>(dg + i, du + i, dz + i, g + i, u + i, count);
    } else {
      GatedBackwardRange<false>(dg + i, du + i, dz + i, g + i, u + i, count);
    }
  });
}

// NOLINTNEXTLINE(google-readability-namespace-comments)
}  // namespace HWY_NAMESPACE
}  // namespace attn::kernels
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace attn::kernels {

HWY_EXPORT(GeluForward);
HWY_EXPORT(GeluBackward);
HWY_EXPORT(GatedActivationForward);
HWY_EXPORT(GatedActivationBackward);

void gated_activation_forward(float* z, float* a, const float* g, const float* u, int64_t n,
                              bool gelu) {
  if (n > 0) HWY_DYNAMIC_DISPATCH(GatedActivationForward)(z, a, g, u, n, gelu);
}

void gated_activation_backward(float* dg, float* du, const float* dz, const float* g,
                               const float* u, int64_t n, bool gelu) {
  if (n > 0) HWY_DYNAMIC_DISPATCH(GatedActivationBackward)(dg, du, dz, g, u, n, gelu);
}
HWY_EXPORT(GeluForwardBf16);
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

void gelu_forward(float* y, const float* x, int64_t n) {
  if (n > 0) HWY_DYNAMIC_DISPATCH(GeluForward)(y, x, n);
}

void gelu_backward(float* dx, const float* dy, const float* x, int64_t n) {
  if (n > 0) HWY_DYNAMIC_DISPATCH(GeluBackward)(dx, dy, x, n);
}

void gelu_forward_bf16(BFloat16* y, const float* x, int64_t n) {
  if (n > 0) HWY_DYNAMIC_DISPATCH(GeluForwardBf16)(y, x, n);
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

}  // namespace attn::kernels
#endif  // HWY_ONCE
