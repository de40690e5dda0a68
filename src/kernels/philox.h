// kernels/philox.h - Philox4x32-10 (Salmon et al., "Parallel random numbers:
// as easy as 1, 2, 3", SC'11) and the dropout rule the fused kernels share:
// the one definition of both, used by the scalar noise (flash_dropout_noise)
// and by the kernels' lane-parallel generators (kernels/flash_tiles-inl.h, for
// the sdpa kernel on every engine, and flash_attention_amx.cpp).
// Internal to src/kernels; the public description lives in attn/kernels.h.
#pragma once

#include <cstdint>

namespace attn::kernels {

// The round's multipliers and the Weyl constants that bump the key.
inline constexpr uint32_t kPhiloxM0 = 0xD2511F53u, kPhiloxM1 = 0xCD9E8D57u;
inline constexpr uint32_t kPhiloxW0 = 0x9E3779B9u, kPhiloxW1 = 0xBB67AE85u;
inline constexpr int kPhiloxRounds = 10;

// One round on one counter (x0, x1, x2, x3) with round key (k0, k1):
// (hi0, lo0) = M0 · x0, (hi1, lo1) = M1 · x2,
// x = (hi1 ^ x1 ^ k0, lo1, hi0 ^ x3 ^ k1, lo0).
inline void philox_round(uint32_t& x0, uint32_t& x1, uint32_t& x2, uint32_t& x3, uint32_t k0,
                         uint32_t k1) {
  const uint64_t p0 = uint64_t{kPhiloxM0} * x0;
  const uint64_t p1 = uint64_t{kPhiloxM1} * x2;
  const uint32_t y0 = uint32_t(p1 >> 32) ^ x1 ^ k0;
  const uint32_t y2 = uint32_t(p0 >> 32) ^ x3 ^ k1;
  x0 = y0;
  x1 = uint32_t(p1);
  x2 = y2;
  x3 = uint32_t(p0);
}

// The key's two words, and the key of the next round.
inline void philox_key(uint64_t key, uint32_t& k0, uint32_t& k1) {
  k0 = uint32_t(key), k1 = uint32_t(key >> 32);
}
inline void philox_bump_key(uint32_t& k0, uint32_t& k1) {
  k0 += kPhiloxW0;
  k1 += kPhiloxW1;
}

struct PhiloxBlock {
  uint32_t x[4];
};

// Ten rounds, the key bumped between them.
inline PhiloxBlock philox4x32_10(PhiloxBlock c, uint64_t key) {
  uint32_t k0, k1;
  philox_key(key, k0, k1);
  for (int round = 0; round < kPhiloxRounds; ++round) {
    philox_round(c.x[0], c.x[1], c.x[2], c.x[3], k0, k1);
    philox_bump_key(k0, k1);
  }
  return c;
}

// The four draws for keys j0 .. j0+3 (j0 a multiple of 4) of query i in head (b, h).
inline PhiloxBlock philox_dropout_block(uint64_t seed, int64_t b, int64_t h, int64_t i,
                                        int64_t j0) {
  return philox4x32_10(PhiloxBlock{{uint32_t(j0 >> 2), uint32_t(i), uint32_t(h), uint32_t(b)}},
                       seed);
}

// The keep/drop rule: a weight is kept when its 32-bit draw is >= threshold =
// p · 2^32 (probability 1 - p).
inline bool keep(uint32_t draw, uint32_t threshold) { return draw >= threshold; }

// The rule for one p: kept weights are scaled by 1/(1-p) computed as in torch,
// (float)(1 - p); noise(draw) is the factor a weight with that draw gets.
struct DropoutRule {
  explicit DropoutRule(float p)
      : threshold(uint32_t(double(p) * 4294967296.0)),
        scale(p > 0.0f ? 1.0f / float(1.0 - double(p)) : 1.0f) {}
  bool active() const { return threshold != 0; }  // p < 2^-32 drops nothing
  float noise(uint32_t draw) const { return keep(draw, threshold) ? scale : 0.0f; }
  uint32_t threshold;
  float scale;
};

}  // namespace attn::kernels
