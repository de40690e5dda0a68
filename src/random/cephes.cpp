// Cephes single-precision log and sincos, lane by lane as avx_mathfun.h
// computes them (see cephes.h). Built with -ffp-contract=off: every fused
// multiply-add below is an explicit std::fmaf, every other product is rounded.
#include "random/cephes.h"

#include <bit>
#include <cmath>
#include <cstdint>

namespace attn::detail {
namespace {

// avx_mathfun.h writes its constants as double literals stored into float
// arrays; static_cast<float> of the same literal gives the same float.
constexpr float kSqrtHalf = static_cast<float>(0.707106781186547524);
constexpr float kLogP0 = static_cast<float>(7.0376836292E-2);
constexpr float kLogP1 = static_cast<float>(-1.1514610310E-1);
constexpr float kLogP2 = static_cast<float>(1.1676998740E-1);
constexpr float kLogP3 = static_cast<float>(-1.2420140846E-1);
constexpr float kLogP4 = static_cast<float>(+1.4249322787E-1);
constexpr float kLogP5 = static_cast<float>(-1.6668057665E-1);
constexpr float kLogP6 = static_cast<float>(+2.0000714765E-1);
constexpr float kLogP7 = static_cast<float>(-2.4999993993E-1);
constexpr float kLogP8 = static_cast<float>(+3.3333331174E-1);
// log(2) split in two: q2 has few bits so e * q2 is exact, q1 the remainder.
constexpr float kLogQ1 = static_cast<float>(-2.12194440e-4);
constexpr float kLogQ2 = static_cast<float>(0.693359375);

// pi/4 split in three for "extended precision modular arithmetic".
constexpr float kMinusDP1 = static_cast<float>(-0.78515625);
constexpr float kMinusDP2 = static_cast<float>(-2.4187564849853515625e-4);
constexpr float kMinusDP3 = static_cast<float>(-3.77489497744594108e-8);
constexpr float kSinP0 = static_cast<float>(-1.9515295891E-4);
constexpr float kSinP1 = static_cast<float>(8.3321608736E-3);
constexpr float kSinP2 = static_cast<float>(-1.6666654611E-1);
constexpr float kCosP0 = static_cast<float>(2.443315711809948E-005);
constexpr float kCosP1 = static_cast<float>(-1.388731625493765E-003);
constexpr float kCosP2 = static_cast<float>(4.166664568298827E-002);
constexpr float kFourOverPi = static_cast<float>(1.27323954473516);

constexpr uint32_t kSignMask = 0x80000000u;
constexpr uint32_t kExponentMask = 0x7f800000u;
constexpr uint32_t kMinNormPos = 0x00800000u;  // the smallest normal float

inline uint32_t bits(float x) { return std::bit_cast<uint32_t>(x); }
inline float from_bits(uint32_t b) { return std::bit_cast<float>(b); }
// _mm256_and_ps(mask, x) for a comparison mask that is all ones or all zeros.
inline float select_or_zero(bool keep, float x) { return keep ? x : from_bits(0u); }

}  // namespace

float cephes_logf(float x) {
  const bool invalid = x <= 0.0f;  // _CMP_LE_OS: false for NaN
  // _mm256_max_ps(x, min_norm): cuts off denormals (and NaN, like maxps).
  const float min_norm = from_bits(kMinNormPos);
  x = x > min_norm ? x : min_norm;

  // x = m * 2^e with m in [0.5, 1).
  auto exponent = static_cast<int32_t>(bits(x) >> 23);
  x = from_bits((bits(x) & ~kExponentMask) | bits(0.5f));
  exponent -= 0x7f;
  float e = static_cast<float>(exponent);
  e = e + 1.0f;

  // if m < sqrt(1/2): e -= 1, x = m + m - 1, else x = m - 1.
  const bool below = x < kSqrtHalf;
  const float tmp = select_or_zero(below, x);
  x = x - 1.0f;
  e = e - select_or_zero(below, 1.0f);
  x = x + tmp;

  const float z = x * x;
  float y = std::fmaf(kLogP0, x, kLogP1);
  y = std::fmaf(y, x, kLogP2);
  y = std::fmaf(y, x, kLogP3);
  y = std::fmaf(y, x, kLogP4);
  y = std::fmaf(y, x, kLogP5);
  y = std::fmaf(y, x, kLogP6);
  y = std::fmaf(y, x, kLogP7);
  y = std::fmaf(y, x, kLogP8);
  y = y * x;
  y = std::fmaf(y, z, e * kLogQ1);  // y * x * z + e * q1, fused as GCC fuses it
  y = y - z * 0.5f;                 // z * 0.5 is exact: fused or not, same bits
  x = x + y;
  x = x + e * kLogQ2;  // e * q2 is exact

  if (invalid) return from_bits(0xffffffffu);  // x | all-ones mask: a NaN
  return x;
}

SinCos cephes_sincosf(float x) {
  uint32_t sign_sin = bits(x) & kSignMask;
  x = from_bits(bits(x) & ~kSignMask);  // |x|

  // Octant j of |x|, rounded up to even: (trunc(|x| * 4/pi) + 1) & ~1.
  const float scaled = x * kFourOverPi;
  auto j = static_cast<int32_t>(scaled);  // _mm256_cvttps_epi32 (|x| < 2^31 here)
  j = (j + 1) & ~1;
  const float y = static_cast<float>(j);

  const auto swap_sign_sin = static_cast<uint32_t>(j & 4) << 29;
  const bool sin_poly = (j & 2) == 0;  // the sine polynomial gives sin, else cos

  // x - j * pi/4 in three steps (fused as GCC fuses them; RNG.md found the
  // same bits either way).
  x = std::fmaf(y, kMinusDP1, x);
  x = std::fmaf(y, kMinusDP2, x);
  x = std::fmaf(y, kMinusDP3, x);

  const auto sign_cos = static_cast<uint32_t>(~(j - 2) & 4) << 29;
  sign_sin ^= swap_sign_sin;

  // cos on [-pi/4, pi/4]: 1 - z/2 + z^2 (p2 + z (p1 + z p0)).
  const float z = x * x;
  float yc = std::fmaf(kCosP0, z, kCosP1);
  yc = std::fmaf(yc, z, kCosP2);
  yc = yc * z;
  yc = std::fmaf(yc, z, -(z * 0.5f));  // yc * z * z - 0.5 * z, fused
  yc = yc + 1.0f;

  // sin on [-pi/4, pi/4]: x + x z (p2 + z (p1 + z p0)).
  float ys = std::fmaf(kSinP0, z, kSinP1);
  ys = std::fmaf(ys, z, kSinP2);
  ys = ys * z;
  ys = std::fmaf(ys, x, x);  // ys * z * x + x, fused

  // Selection as the AVX code does it, with and/andnot and an add of +0 (which
  // turns a -0 into +0, so it is kept).
  const float sin_from_ys = select_or_zero(sin_poly, ys);
  const float sin_from_yc = select_or_zero(!sin_poly, yc);
  const float cos_from_ys = ys - sin_from_ys;
  const float cos_from_yc = yc - sin_from_yc;
  const float sin_value = sin_from_yc + sin_from_ys;
  const float cos_value = cos_from_yc + cos_from_ys;
  return {from_bits(bits(sin_value) ^ sign_sin), from_bits(bits(cos_value) ^ sign_cos)};
}

void normal_fill16(float* u, float mean, float std) {
  constexpr auto two_pi = static_cast<float>(2.0 * 3.14159265358979323846);  // 6.2831855f
  constexpr float minus_two = -2.0f;
  for (int j = 0; j < 8; ++j) {
    const float radius = std::sqrt(minus_two * cephes_logf(1.0f - u[j]));
    const float theta = two_pi * u[j + 8];
    const SinCos sc = cephes_sincosf(theta);
    u[j] = std::fmaf(radius * sc.cos, std, mean);
    u[j + 8] = std::fmaf(radius * sc.sin, std, mean);
  }
}

}  // namespace attn::detail
