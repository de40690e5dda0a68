// src/kernels/layer_kernels-inl.h - what the files of the layer kernels
// (attn/layer_kernels.h: layer_kernels.cpp, gelu_kernels.cpp,
// adamw_kernels.cpp) share: the vector type, the tail load, the split of n
// elements into chunks over the OpenMP threads, and the rounding to bf16 of an
// output as it is stored.
// A Highway per-target header: include it after <hwy/highway.h> in a file
// compiled once per target (foreach_target), outside any namespace.
#if defined(ATTN_KERNELS_LAYER_KERNELS_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef ATTN_KERNELS_LAYER_KERNELS_INL_H_
#undef ATTN_KERNELS_LAYER_KERNELS_INL_H_
#else
#define ATTN_KERNELS_LAYER_KERNELS_INL_H_
#endif

#include <hwy/highway.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "attn/bfloat16.h"

HWY_BEFORE_NAMESPACE();
namespace attn::kernels {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using DF = hn::ScalableTag<float>;
using VF = hn::Vec<DF>;

// Elements (GELU, AdamW) or row elements (layer norm) below which one thread does it all.
constexpr int64_t kParallelElements = int64_t{1} << 15;

// The last n < Lanes(d) floats at p in the first lanes, zeros after: through a
// buffer, since Highway's MaskedLoad may read a whole (aligned) vector on
// targets without masked loads.
HWY_INLINE VF LoadTail(DF d, const float* p, size_t n) {
  HWY_ALIGN float buf[hn::MaxLanes(DF())] = {};
  std::copy_n(p, n, buf);
  return hn::Load(d, buf);
}

// bf16(v) in the lanes of a uint16 vector: to_bfloat16 (attn/bfloat16.h) in
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

// Stores the lanes of v to out (float), or rounded to bf16 (the bf16 path);
// gelu_kernels.cpp adds a third form, bf16 values kept in float32.
HWY_INLINE void StoreOut(DF d, VF v, float* out) { hn::StoreU(v, d, out); }
HWY_INLINE void StoreOut(DF d, VF v, BFloat16* out) {
  hn::StoreU(RoundToBf16Vec(d, v), hn::Rebind<uint16_t, DF>(), reinterpret_cast<uint16_t*>(out));
}
inline void StoreOut(float v, float* out) { *out = v; }
inline void StoreOut(float v, BFloat16* out) { *out = to_bfloat16(v); }

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

// NOLINTNEXTLINE(google-readability-namespace-comments)
}  // namespace HWY_NAMESPACE
}  // namespace attn::kernels
HWY_AFTER_NAMESPACE();

#endif  // ATTN_KERNELS_LAYER_KERNELS_INL_H_
