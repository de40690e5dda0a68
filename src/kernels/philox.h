// kernels/philox.h - Philox4x32-10 (Salmon et al., "Parallel random numbers:
// as easy as 1, 2, 3", SC'11) and the dropout rule the fused kernels share.
// Internal to src/kernels; the public description lives in attn/kernels.h.
#pragma once

#include <cstdint>

namespace attn::kernels {

inline constexpr int64_t kMaxHeadDim = 256;

struct PhiloxBlock {
  uint32_t x[4];
};

// Ten rounds of  (hi0, lo0) = M0 · x0, (hi1, lo1) = M1 · x2,
// x = (hi1 ^ x1 ^ k0, lo1, hi0 ^ x3 ^ k1, lo0), the key bumped by the Weyl
// constants W0, W1 between rounds.
inline PhiloxBlock philox4x32_10(PhiloxBlock c, uint64_t key) {
  constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;
  constexpr uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;
  uint32_t k0 = static_cast<uint32_t>(key), k1 = static_cast<uint32_t>(key >> 32);
  for (int round = 0; round < 10; ++round) {
    const uint64_t p0 = uint64_t{kM0} * c.x[0];
    const uint64_t p1 = uint64_t{kM1} * c.x[2];
    const uint32_t hi0 = uint32_t(p0 >> 32), lo0 = uint32_t(p0);
    const uint32_t hi1 = uint32_t(p1 >> 32), lo1 = uint32_t(p1);
    c = PhiloxBlock{{hi1 ^ c.x[1] ^ k0, lo1, hi0 ^ c.x[3] ^ k1, lo0}};
    k0 += kW0;
    k1 += kW1;
  }
  return c;
}

// The four draws for keys j0 .. j0+3 (j0 a multiple of 4) of query i in head (b, h).
inline PhiloxBlock philox_dropout_block(uint64_t seed, int64_t b, int64_t h, int64_t i,
                                        int64_t j0) {
  return philox4x32_10(PhiloxBlock{{uint32_t(j0 >> 2), uint32_t(i), uint32_t(h), uint32_t(b)}},
                       seed);
}

// Keep a weight when its draw r >= threshold = p · 2^32 (probability 1 - p);
// kept weights are scaled by 1/(1-p) computed as in torch: (float)(1 - p).
struct DropoutRule {
  explicit DropoutRule(float p)
      : threshold(uint32_t(double(p) * 4294967296.0)),
        scale(p > 0.0f ? 1.0f / float(1.0 - double(p)) : 1.0f) {}
  float noise(uint32_t r) const { return r >= threshold ? scale : 0.0f; }
  uint32_t threshold;
  float scale;
};

}  // namespace attn::kernels
