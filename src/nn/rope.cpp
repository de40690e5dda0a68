// Rotary position embedding (attn/rope.h): the book's compute_rope_params in
// its float32 steps, and apply_rope / its backward on tensors, checked and
// handed to ref:: or kernels::rope_rows.
#include "attn/rope.h"

#include <fmt/format.h>

#include <cmath>
#include <stdexcept>
#include <vector>

namespace attn {
namespace {

void check_head_dim(const char* fn, int64_t head_dim) {
  if (head_dim < 2 || head_dim % 2 != 0) {
    throw std::invalid_argument(
        fmt::format("{}: head_dim must be even and >= 2, got {}", fn, head_dim));
  }
}

void check_freq_config(const RopeFreqConfig& f) {
  if (!(f.factor > 0.0f) || !std::isfinite(f.factor) || !(f.low_freq_factor > 0.0f) ||
      !(f.high_freq_factor > f.low_freq_factor) || !std::isfinite(f.high_freq_factor) ||
      f.original_context_length < 1) {
    throw std::invalid_argument(fmt::format(
        "compute_rope_params: freq_config needs factor > 0, 0 < low_freq_factor < "
        "high_freq_factor and original_context_length >= 1, got factor {}, low_freq_factor {}, "
        "high_freq_factor {}, original_context_length {}",
        f.factor, f.low_freq_factor, f.high_freq_factor, f.original_context_length));
  }
}

}  // namespace

// The book's steps in float32 (PyTorch's order: `1.0 / t` and `c / t` are
// t.reciprocal() * c, each op rounded to float).
Tensor rope_inverse_frequencies(int64_t head_dim, float theta_base,
                                const std::optional<RopeFreqConfig>& freq_config) {
  check_head_dim("compute_rope_params", head_dim);
  if (!(theta_base > 1.0f) || !std::isfinite(theta_base)) {
    throw std::invalid_argument(
        fmt::format("compute_rope_params: theta_base must be finite and > 1, got {}", theta_base));
  }
  if (freq_config) check_freq_config(*freq_config);
  const int64_t half = head_dim / 2;
  Tensor inv_freq = Tensor::empty({half});  // (hd/2)
  float* theta = inv_freq.data();
  for (int64_t i = 0; i < half; ++i) {
    // arange(0, hd, 2).float() / hd, then theta_base ** that, then 1.0 / that.
    const float exponent = static_cast<float>(2 * i) / static_cast<float>(head_dim);
    const float power = static_cast<float>(std::pow(double{theta_base}, double{exponent}));
    theta[i] = 1.0f / power;
  }
  if (!freq_config) return inv_freq;
  const RopeFreqConfig& f = *freq_config;
  const auto orig = static_cast<float>(f.original_context_length);
  const auto low_freq_wavelen =
      static_cast<float>(double(f.original_context_length) / double{f.low_freq_factor});
  const auto high_freq_wavelen =
      static_cast<float>(double(f.original_context_length) / double{f.high_freq_factor});
  const auto two_pi = static_cast<float>(6.283185307179586);  // 2 * torch.pi
  const auto band = static_cast<float>(double{f.high_freq_factor} - double{f.low_freq_factor});
  for (int64_t i = 0; i < half; ++i) {
    const float wavelen = (1.0f / theta[i]) * two_pi;
    const float scaled = theta[i] / f.factor;
    const float smooth = ((1.0f / wavelen) * orig - f.low_freq_factor) / band;
    const float smoothed = (1.0f - smooth) * scaled + smooth * theta[i];
    if (wavelen > low_freq_wavelen) {
      theta[i] = scaled;  // long wavelengths: slowed down by factor
    } else if (wavelen >= high_freq_wavelen) {
      theta[i] = smoothed;  // the band in between: blended
    }                       // short wavelengths: unchanged
  }
  return inv_freq;
}

RopeParams rope_tables(const Tensor& inv_freq, int64_t context_length) {
  if (context_length < 1) {
    throw std::invalid_argument(
        fmt::format("compute_rope_params: context_length must be >= 1, got {}", context_length));
  }
  if (inv_freq.dtype() != DType::kFloat32 || inv_freq.dim() != 1 || inv_freq.numel() < 1) {
    throw std::invalid_argument(
        fmt::format("rope_tables: inv_freq must be (head_dim / 2) float32, got {} {}",
                    dtype_name(inv_freq.dtype()), shape_str(inv_freq.shape())));
  }
  const Tensor theta_c = inv_freq.contiguous();
  const int64_t half = theta_c.numel();
  const int64_t head_dim = 2 * half;
  RopeParams p{Tensor::empty({context_length, head_dim}),
               Tensor::empty({context_length, head_dim})};
  const float* theta = theta_c.data();
  float* c = p.cos.data();
  float* s = p.sin.data();
  for (int64_t pos = 0; pos < context_length; ++pos) {
    for (int64_t i = 0; i < half; ++i) {
      const float angle = static_cast<float>(pos) * theta[i];  // float32, as the book
      const auto cv = static_cast<float>(std::cos(double{angle}));
      const auto sv = static_cast<float>(std::sin(double{angle}));
      c[pos * head_dim + i] = c[pos * head_dim + half + i] = cv;  // cat([angles, angles])
      s[pos * head_dim + i] = s[pos * head_dim + half + i] = sv;
    }
  }
  return p;
}

RopeParams compute_rope_params(int64_t head_dim, float theta_base, int64_t context_length,
                               const std::optional<RopeFreqConfig>& freq_config) {
  if (context_length < 1) {
    throw std::invalid_argument(
        fmt::format("compute_rope_params: context_length must be >= 1, got {}", context_length));
  }
  return rope_tables(rope_inverse_frequencies(head_dim, theta_base, freq_config), context_length);
}

namespace {

// Checks x (B, H, T, hd), the tables and the offset; the rows of x (stride(-1) = 1).
RopeRows rope_rows_of(const char* fn, const Tensor& x, const Tensor& cos, const Tensor& sin,
                      const RopeOptions& o) {
  if (x.dim() != 4) {
    throw std::invalid_argument(
        fmt::format("{}: x must be (B, H, T, head_dim), got {}", fn, shape_str(x.shape())));
  }
  if (x.dtype() != DType::kFloat32 && x.dtype() != DType::kBFloat16) {
    throw std::invalid_argument(
        fmt::format("{}: x must be float32 or bfloat16, got {}", fn, dtype_name(x.dtype())));
  }
  const int64_t hd = x.size(3);
  check_head_dim(fn, hd);
  for (const Tensor* t : {&cos, &sin}) {
    if (t->dtype() != DType::kFloat32 || t->dim() != 2 || t->size(1) != hd) {
      throw std::invalid_argument(
          fmt::format("{}: cos and sin must be float32 (context_length, {}), got {} {} and {} {}",
                      fn, hd, dtype_name(cos.dtype()), shape_str(cos.shape()),
                      dtype_name(sin.dtype()), shape_str(sin.shape())));
    }
  }
  if (cos.shape() != sin.shape()) {
    throw std::invalid_argument(fmt::format("{}: cos {} and sin {} differ in shape", fn,
                                            shape_str(cos.shape()), shape_str(sin.shape())));
  }
  const int64_t T = x.size(2), L = cos.size(0);
  if (o.position_offset < 0 || o.position_offset + T > L) {
    throw std::invalid_argument(fmt::format(
        "{}: positions {} .. {} (position_offset {} + {} tokens) do not fit the {} rows of "
        "cos and sin",
        fn, o.position_offset, o.position_offset + T - 1, o.position_offset, T, L));
  }
  if (hd > 1 && x.stride(3) != 1) {
    throw std::invalid_argument(
        fmt::format("{}: x's last stride must be 1, got strides {}", fn, shape_str(x.strides())));
  }
  return RopeRows{.B = x.size(0),
                  .H = x.size(1),
                  .T = T,
                  .hd = hd,
                  .stride_b = x.stride(0),
                  .stride_h = x.stride(1),
                  .stride_t = x.stride(2),
                  .position_offset = o.position_offset};
}

Tensor& rope_in_place(const char* fn, Tensor& x, const Tensor& cos, const Tensor& sin,
                      const RopeOptions& o, bool inverse) {
  RopeRows r = rope_rows_of(fn, x, cos, sin, o);
  if (x.numel() == 0) return x;
  const Tensor c = cos.contiguous(), s = sin.contiguous();
  r.cos = c.data();
  r.sin = s.data();
  r.inverse = inverse;
  const bool ref = o.backend == RopeBackend::kReference;
  if (x.dtype() == DType::kFloat32) {
    float* p = x.data_ptr<float>();
    ref ? ref::rope_rows(p, r) : kernels::rope_rows(p, r);
  } else {
    BFloat16* p = x.data_ptr<BFloat16>();
    ref ? ref::rope_rows(p, r) : kernels::rope_rows(p, r);
  }
  return x;
}

}  // namespace

Tensor apply_rope(const Tensor& x, const Tensor& cos, const Tensor& sin, const RopeOptions& o) {
  Tensor y = x.clone();  // (B, H, T, hd) contiguous
  return rope_in_place("apply_rope", y, cos, sin, o, false);
}

Tensor& apply_rope_(Tensor& x, const Tensor& cos, const Tensor& sin, const RopeOptions& o) {
  return rope_in_place("apply_rope_", x, cos, sin, o, false);
}

Tensor apply_rope_backward(const Tensor& dy, const Tensor& cos, const Tensor& sin,
                           const RopeOptions& o) {
  Tensor dx = dy.clone();
  return rope_in_place("apply_rope_backward", dx, cos, sin, o, true);
}

Tensor& apply_rope_backward_(Tensor& dy, const Tensor& cos, const Tensor& sin,
                             const RopeOptions& o) {
  return rope_in_place("apply_rope_backward_", dy, cos, sin, o, true);
}

}  // namespace attn
