// What belongs to the raw problem itself (attn/sdpa_problem.h) rather than
// to one way of computing it: the dropout noise every engine applies.
#include "attn/sdpa_problem.h"

#include <algorithm>

#include "kernels/philox.h"

namespace attn::kernels {

void sdpa_dropout_noise(float* noise, const SdpaStrides& s, int64_t B, int64_t H, int64_t Tq,
                        int64_t Tk, float dropout_p, uint64_t dropout_seed) {
  const DropoutRule rule(dropout_p);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < Tq; ++i) {
        float* row = noise + b * s.b + h * s.h + i * s.t;
        for (int64_t j0 = 0; j0 < Tk; j0 += 4) {
          const PhiloxBlock r = philox_dropout_block(dropout_seed, b, h, i, j0);
          for (int64_t j = j0; j < std::min(j0 + 4, Tk); ++j)
            row[j * s.d] = rule.noise(r.x[j - j0]);
        }
      }
}

}  // namespace attn::kernels
