// kernels::rope_rows (attn/rope_kernel.h): rotary position embedding over the rows of
// (B, H, T, hd) in parallel. Each row is one OpenMP iteration running the
// reference's row loop (kernels/rope_row.h, the loop ref::rope_rows runs too),
// so the bits do not depend on the thread count and equal ref::rope_rows'. RoPE reads and writes each value
// once (memory-bound): the contiguous pair loop, vectorised by the compiler at
// the build's baseline, is all it needs.
#include <type_traits>
#include <vector>

#include "attn/rope_kernel.h"
#include "kernels/rope_row.h"

namespace attn::kernels {
namespace {

// Below this many values one thread does it (the fork costs more).
constexpr int64_t kParallelMin = int64_t{1} << 15;

template <class T>
void rows(T* x, const RopeRows& r) {
  const int64_t n = r.B * r.H * r.T;
  const bool parallel = n * r.hd >= kParallelMin;
#pragma omp parallel if (parallel)
  {
    std::vector<float> buf(std::is_same_v<T, float> ? 0 : static_cast<size_t>(r.hd));
#pragma omp for schedule(static)
    for (int64_t row = 0; row < n; ++row) {
      const int64_t t = row % r.T, bh = row / r.T;
      const int64_t h = bh % r.H, b = bh / r.H;
      T* v = x + b * r.stride_b + h * r.stride_h + t * r.stride_t;  // (hd)
      const int64_t p = r.position_offset + t;
      const float* c = r.cos + p * r.hd;
      const float* s = r.sin + p * r.hd;
      if constexpr (std::is_same_v<T, float>) {
        detail::rope_row(v, c, s, r.hd, r.inverse);
      } else {
        detail::rope_row(v, c, s, r.hd, r.inverse, buf.data());
      }
    }
  }
}

}  // namespace

void rope_rows(float* x, const RopeRows& r) { rows(x, r); }
void rope_rows(BFloat16* x, const RopeRows& r) { rows(x, r); }

}  // namespace attn::kernels
