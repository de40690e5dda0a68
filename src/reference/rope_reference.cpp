// ref::rope_rows (attn/rope_kernel.h): rotary position embedding, the specification:
// every row of (B, H, T, hd) in order, one thread.
#include "attn/rope_kernel.h"

#include <type_traits>
#include <vector>

#include "kernels/rope_row.h"

namespace attn::ref {
namespace {

template <class T>
void rows(T* x, const RopeRows& r) {
  std::vector<float> buf(static_cast<size_t>(r.hd));
  for (int64_t b = 0; b < r.B; ++b) {
    for (int64_t h = 0; h < r.H; ++h) {
      for (int64_t t = 0; t < r.T; ++t) {
        T* row = x + b * r.stride_b + h * r.stride_h + t * r.stride_t;  // (hd)
        const int64_t p = r.position_offset + t;                        // its position
        const float* c = r.cos + p * r.hd;
        const float* s = r.sin + p * r.hd;
        if constexpr (std::is_same_v<T, float>) {
          detail::rope_row(row, c, s, r.hd, r.inverse);
        } else {
          detail::rope_row(row, c, s, r.hd, r.inverse, buf.data());
        }
      }
    }
  }
}

}  // namespace

void rope_rows(float* x, const RopeRows& r) { rows(x, r); }
void rope_rows(BFloat16* x, const RopeRows& r) { rows(x, r); }

}  // namespace attn::ref
