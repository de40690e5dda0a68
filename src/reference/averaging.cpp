// 5. Averaging the past, the step before attention in a character-level GPT:
// xbow[b, t] = mean(x[b, 0..t]), by loops, by a normalised lower-triangular
// matrix, and by softmax over zero scores masked with -inf above the diagonal.
#include <fmt/format.h>

#include <limits>
#include <stdexcept>

#include "attn/functional.h"
#include "attn/ops.h"

namespace attn::ref {
namespace {

void check_btc(const char* fn, const Tensor& x) {
  if (x.dim() < 2 || x.numel() == 0) {
    throw std::invalid_argument(fmt::format("{}: expected input (B, T, C) or (T, C), got shape {}",
                                            fn, shape_str(x.shape())));
  }
}

}  // namespace

Tensor xbow_loops(const Tensor& x_in) {
  check_btc("xbow_loops", x_in);
  const Tensor x = x_in.contiguous();  // read row-major below
  const int64_t T = x.size(-2), C = x.size(-1);
  const int64_t B = x.numel() / (T * C);  // every leading dim counts as batch
  Tensor xbow(x.shape());                 // (B, T, C)
  for (int64_t b = 0; b < B; ++b) {
    const float* xb = x.data() + b * T * C;
    float* out = xbow.data() + b * T * C;
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t c = 0; c < C; ++c) {
        float total = 0.0f;  // Σ_{s <= t} x[b, s, c]
        for (int64_t s = 0; s <= t; ++s) total += xb[s * C + c];
        out[t * C + c] = total / static_cast<float>(t + 1);
      }
    }
  }
  return xbow;
}

Tensor xbow_matmul(const Tensor& x) {
  check_btc("xbow_matmul", x);
  const int64_t T = x.size(-2);
  Tensor wei = tril_ones(T);                  // (T, T)
  wei = wei / sum(wei, 1, /*keepdim=*/true);  // row t holds 1/(t+1) for s <= t
  return matmul(wei, x);                      // (T, T) @ (B, T, C) -> (B, T, C)
}

Tensor xbow_softmax(const Tensor& x) {
  check_btc("xbow_softmax", x);
  const int64_t T = x.size(-2);
  Tensor wei = Tensor::zeros({T, T});
  // 0 where s <= t, -inf where s > t: the future.
  wei = masked_fill(wei, future_mask(T), -std::numeric_limits<float>::infinity());
  wei = softmax(wei, -1);  // row t: exp(0) / (t + 1) for s <= t, exp(-inf) = 0 after
  return matmul(wei, x);   // (T, T) @ (B, T, C) -> (B, T, C)
}

}  // namespace attn::ref
