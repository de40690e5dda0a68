// src/kernels/bf16_load-inl.h - bfloat16 read as float32 in vectors: the one
// widening load of the Highway kernels (the fp32 attention kernel's bf16
// tiles, decode attention, the decode GEMV's widened path). A bf16 is the high
// half of a float's bits, so the load is exact: promote the 16-bit lanes to
// 32 bits and shift them up. (The kernels written with AVX-512 intrinsics use
// avx512::LoadWidened, kernels/avx512_bf16-inl.h, the same operation.)
// A Highway per-target header: include it after <hwy/highway.h> in a file
// compiled once per target (foreach_target), outside any namespace.
#if defined(ATTN_KERNELS_BF16_LOAD_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef ATTN_KERNELS_BF16_LOAD_INL_H_
#undef ATTN_KERNELS_BF16_LOAD_INL_H_
#else
#define ATTN_KERNELS_BF16_LOAD_INL_H_
#endif

#include <hwy/highway.h>

#include <cstdint>

HWY_BEFORE_NAMESPACE();
namespace attn::kernels {
namespace HWY_NAMESPACE {

// Lanes(d) bf16 values (their bits) at p, as fp32; p need not be aligned.
template <class DF>
HWY_INLINE hwy::HWY_NAMESPACE::Vec<DF> LoadBf16(DF d, const uint16_t* HWY_RESTRICT p) {
  namespace hn = hwy::HWY_NAMESPACE;
  const hn::RebindToUnsigned<DF> du;   // u32 lanes
  const hn::Rebind<uint16_t, DF> dh;   // as many u16 lanes
  return hn::BitCast(d, hn::ShiftLeft<16>(hn::PromoteTo(du, hn::LoadU(dh, p))));
}

// NOLINTNEXTLINE(google-readability-namespace-comments)
}  // namespace HWY_NAMESPACE
}  // namespace attn::kernels
HWY_AFTER_NAMESPACE();

#endif  // ATTN_KERNELS_BF16_LOAD_INL_H_ toggle
