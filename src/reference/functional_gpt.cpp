// The GPT model's maths around the attention (attn/functional_gpt.h): layer
// normalisation, GELU (tanh form) and cross-entropy, forward and backward.
// Rows: x (..., C) is read as N = numel / C rows of C values.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numbers>
#include <stdexcept>
#include <vector>

#include "attn/functional_gpt.h"
#include "attn/ops.h"

namespace attn::ref {
namespace {

void check_float(const char* fn, const char* what, const Tensor& t) {
  if (t.dtype() != DType::kFloat32) {
    throw std::invalid_argument(fmt::format("{}: {} must be float32, got {} of shape {}", fn, what,
                                            dtype_name(t.dtype()), shape_str(t.shape())));
  }
}

void check_vector(const char* fn, const char* what, const Tensor& t, int64_t C) {
  if (t.shape() != Shape{C}) {
    throw std::invalid_argument(
        fmt::format("{}: {} has shape {}, expected ({},)", fn, what, shape_str(t.shape()), C));
  }
}

// The constants of the tanh form, as the book's float32 code holds them.
const float kSqrt2OverPi = std::sqrt(static_cast<float>(2.0 / std::numbers::pi));  // torch.sqrt(torch.tensor(2/π))
constexpr float kGeluCubic = 0.044715f;

}  // namespace

// ---- RMS normalisation -----------------------------------------------------------------

Tensor rms_norm_forward(const Tensor& x_in, const Tensor& weight_in, float eps, float weight_offset,
                        RmsNormSaved* saved) {
  check_float("rms_norm_forward", "x", x_in);
  if (x_in.dim() < 1 || x_in.size(-1) < 1) {
    throw std::invalid_argument(fmt::format(
        "rms_norm_forward: x of shape {} has no last dim to normalise", shape_str(x_in.shape())));
  }
  if (!(eps >= 0.0f) || !std::isfinite(eps))
    throw std::invalid_argument(fmt::format("rms_norm_forward: eps must be >= 0, got {}", eps));
  const int64_t C = x_in.size(-1), N = x_in.numel() / C;
  check_vector("rms_norm_forward", "weight", weight_in, C);
  const Tensor x = x_in.contiguous(), weight = weight_in.contiguous();
  Tensor inv_rms({N});  // (N)
  Tensor y(x.shape());  // (..., C)
  const float* px = x.data();
  const float* w = weight.data();
  float* py = y.data();
  float* pr = inv_rms.data();
  // Rows are independent: one row per iteration, the same bits for any thread count.
#pragma omp parallel for schedule(static) if (N * C >= 65536)
  for (int64_t n = 0; n < N; ++n) {
    const float* row = px + n * C;
    double sum_sq = 0.0;
    for (int64_t c = 0; c < C; ++c) sum_sq += static_cast<double>(row[c]) * row[c];
    const float mean_sq = static_cast<float>(sum_sq / static_cast<double>(C));
    const float r = 1.0f / std::sqrt(mean_sq + eps);
    pr[n] = r;
    for (int64_t c = 0; c < C; ++c) py[n * C + c] = row[c] * r * (w[c] + weight_offset);
  }
  if (saved != nullptr) *saved = {inv_rms};
  return y;
}

Tensor rms_norm_backward(const Tensor& dy_in, const Tensor& x_in, const Tensor& weight_in,
                         float weight_offset, const RmsNormSaved& saved, Tensor& dweight) {
  if (dy_in.shape() != x_in.shape()) {
    throw std::invalid_argument(
        fmt::format("rms_norm_backward: dy shape {} does not match x shape {}",
                    shape_str(dy_in.shape()), shape_str(x_in.shape())));
  }
  check_float("rms_norm_backward", "dy", dy_in);
  check_float("rms_norm_backward", "x", x_in);
  const int64_t C = x_in.size(-1), N = x_in.numel() / C;
  check_vector("rms_norm_backward", "weight", weight_in, C);
  check_vector("rms_norm_backward", "dweight", dweight, C);
  if (saved.inv_rms.shape() != Shape{N}) {
    throw std::invalid_argument(
        fmt::format("rms_norm_backward: saved inv_rms {} does not hold {} rows",
                    shape_str(saved.inv_rms.shape()), N));
  }
  const Tensor dy = dy_in.contiguous(), x = x_in.contiguous(), weight = weight_in.contiguous();
  Tensor dx(x.shape());                                                        // (..., C)
  std::vector<double> dweight_acc(static_cast<size_t>(C), 0.0);                // (C)
  std::vector<float> xhat(static_cast<size_t>(C)), g(static_cast<size_t>(C));  // one row
  const float* w = weight.data();
  const float* inv_rms = saved.inv_rms.data();
  for (int64_t n = 0; n < N; ++n) {
    const float* px = x.data() + n * C;
    const float* pdy = dy.data() + n * C;
    const float r = inv_rms[n];
    double sum_gx = 0.0;
    for (int64_t c = 0; c < C; ++c) {
      const auto i = static_cast<size_t>(c);
      xhat[i] = px[c] * r;
      g[i] = pdy[c] * (w[c] + weight_offset);
      sum_gx += static_cast<double>(g[i]) * xhat[i];
      dweight_acc[i] += static_cast<double>(pdy[c]) * xhat[i];
    }
    const double mean_gx = sum_gx / static_cast<double>(C);
    float* pdx = dx.data() + n * C;
    for (int64_t c = 0; c < C; ++c) {
      const auto i = static_cast<size_t>(c);
      pdx[c] = static_cast<float>(r * (g[i] - xhat[i] * mean_gx));
    }
  }
  for (int64_t c = 0; c < C; ++c)
    dweight.data()[c] += static_cast<float>(dweight_acc[static_cast<size_t>(c)]);
  return dx;
}

// ---- layer normalisation ----------------------------------------------------------

Tensor layer_norm_forward(const Tensor& x_in, const Tensor& scale_in, const Tensor& shift_in,
                          float eps, LayerNormSaved* saved) {
  check_float("layer_norm_forward", "x", x_in);
  if (x_in.dim() < 1 || x_in.size(-1) < 1) {
    throw std::invalid_argument(fmt::format("layer_norm_forward: x of shape {} has no last dim to normalise",
                                            shape_str(x_in.shape())));
  }
  const int64_t C = x_in.size(-1), N = x_in.numel() / C;
  check_vector("layer_norm_forward", "scale", scale_in, C);
  check_vector("layer_norm_forward", "shift", shift_in, C);
  const Tensor x = x_in.contiguous(), scale = scale_in.contiguous(), shift = shift_in.contiguous();
  const Tensor mean_rows = mean(x.view({N, C}), -1);  // (N) PyTorch's float mean, its bits
  Tensor std_rows({N});                               // (N) sqrt(var + eps)
  Tensor y(x.shape());                                // (..., C)
  const float* px = x.data();
  const float* ps = scale.data();
  const float* pb = shift.data();
  float* py = y.data();
  for (int64_t n = 0; n < N; ++n) {
    const float* row = px + n * C;
    // The biased variance in double (PyTorch's Welford reduction accumulates in double).
    double mean_d = 0.0;
    for (int64_t c = 0; c < C; ++c) mean_d += row[c];
    mean_d /= static_cast<double>(C);
    double m2 = 0.0;
    for (int64_t c = 0; c < C; ++c) m2 += (row[c] - mean_d) * (row[c] - mean_d);
    const float var = static_cast<float>(m2 / static_cast<double>(C));
    const float mu = mean_rows.data()[n];
    const float sd = std::sqrt(var + eps);
    std_rows.data()[n] = sd;
    for (int64_t c = 0; c < C; ++c) {
      const float norm_x = (row[c] - mu) / sd;
      py[n * C + c] = ps[c] * norm_x + pb[c];
    }
  }
  if (saved != nullptr) *saved = {mean_rows, std_rows};
  return y;
}

Tensor layer_norm_backward(const Tensor& dy_in, const Tensor& x_in, const Tensor& scale_in,
                           const LayerNormSaved& saved, Tensor& dscale, Tensor& dshift) {
  if (dy_in.shape() != x_in.shape()) {
    throw std::invalid_argument(fmt::format("layer_norm_backward: dy shape {} does not match x shape {}",
                                            shape_str(dy_in.shape()), shape_str(x_in.shape())));
  }
  const int64_t C = x_in.size(-1), N = x_in.numel() / C;
  check_vector("layer_norm_backward", "scale", scale_in, C);
  check_vector("layer_norm_backward", "dscale", dscale, C);
  check_vector("layer_norm_backward", "dshift", dshift, C);
  if (saved.mean.shape() != Shape{N} || saved.std.shape() != Shape{N}) {
    throw std::invalid_argument(fmt::format(
        "layer_norm_backward: saved mean {} and std {} do not hold {} rows",
        shape_str(saved.mean.shape()), shape_str(saved.std.shape()), N));
  }
  const Tensor dy = dy_in.contiguous(), x = x_in.contiguous(), scale = scale_in.contiguous();
  Tensor dx(x.shape());                                                // (..., C)
  std::vector<double> dscale_acc(static_cast<size_t>(C), 0.0);         // (C)
  std::vector<double> dshift_acc(static_cast<size_t>(C), 0.0);         // (C)
  std::vector<float> xhat(static_cast<size_t>(C)), g(static_cast<size_t>(C));  // one row
  for (int64_t n = 0; n < N; ++n) {
    const float* px = x.data() + n * C;
    const float* pdy = dy.data() + n * C;
    const float mu = saved.mean.data()[n], sd = saved.std.data()[n];
    double sum_g = 0.0, sum_gx = 0.0;
    for (int64_t c = 0; c < C; ++c) {
      const auto i = static_cast<size_t>(c);
      xhat[i] = (px[c] - mu) / sd;
      g[i] = pdy[c] * scale.data()[c];
      sum_g += g[i];
      sum_gx += static_cast<double>(g[i]) * xhat[i];
      dscale_acc[i] += static_cast<double>(pdy[c]) * xhat[i];
      dshift_acc[i] += pdy[c];
    }
    const double mean_g = sum_g / static_cast<double>(C), mean_gx = sum_gx / static_cast<double>(C);
    float* pdx = dx.data() + n * C;
    for (int64_t c = 0; c < C; ++c) {
      const auto i = static_cast<size_t>(c);
      pdx[c] = static_cast<float>((g[i] - mean_g - xhat[i] * mean_gx) / sd);
    }
  }
  for (int64_t c = 0; c < C; ++c) {
    dscale.data()[c] += static_cast<float>(dscale_acc[static_cast<size_t>(c)]);
    dshift.data()[c] += static_cast<float>(dshift_acc[static_cast<size_t>(c)]);
  }
  return dx;
}

// ---- GELU ------------------------------------------------------------------------------

Tensor gelu_forward(const Tensor& x_in) {
  check_float("gelu_forward", "x", x_in);
  const Tensor x = x_in.contiguous();
  Tensor y(x.shape());
  const float* px = x.data();
  float* py = y.data();
  for (int64_t i = 0; i < x.numel(); ++i) {
    const float v = px[i];
    const float cube = v * v * v;                       // torch.pow(x, 3)
    const float u = kSqrt2OverPi * (v + kGeluCubic * cube);
    py[i] = (0.5f * v) * (1.0f + std::tanh(u));         // 0.5 * x * (1 + tanh(u))
  }
  return y;
}

Tensor gelu_backward(const Tensor& dy_in, const Tensor& x_in) {
  if (dy_in.shape() != x_in.shape()) {
    throw std::invalid_argument(fmt::format("gelu_backward: dy shape {} does not match x shape {}",
                                            shape_str(dy_in.shape()), shape_str(x_in.shape())));
  }
  const Tensor dy = dy_in.contiguous(), x = x_in.contiguous();
  Tensor dx(x.shape());
  const float* px = x.data();
  const float* pdy = dy.data();
  float* pdx = dx.data();
  for (int64_t i = 0; i < x.numel(); ++i) {
    const float v = px[i];
    const float u = kSqrt2OverPi * (v + kGeluCubic * v * v * v);
    const float t = std::tanh(u);
    const float du_dx = kSqrt2OverPi * (1.0f + 3.0f * kGeluCubic * v * v);
    pdx[i] = pdy[i] * (0.5f * (1.0f + t) + 0.5f * v * (1.0f - t * t) * du_dx);
  }
  return dx;
}

// ---- cross-entropy -----------------------------------------------------------------------

float cross_entropy_forward(const Tensor& logits_in, const Tensor& targets, CrossEntropySaved* saved,
                            int64_t ignore_index) {
  check_float("cross_entropy_forward", "logits", logits_in);
  if (targets.dtype() != DType::kInt64) {
    throw std::invalid_argument(fmt::format("cross_entropy_forward: targets must be int64, got {} of shape {}",
                                            dtype_name(targets.dtype()), shape_str(targets.shape())));
  }
  if (logits_in.dim() < 2 || logits_in.size(-1) < 1) {
    throw std::invalid_argument(fmt::format(
        "cross_entropy_forward: logits must be (..., V) with at least 2 dims and V >= 1, got {}",
        shape_str(logits_in.shape())));
  }
  Shape expected = logits_in.shape();
  expected.pop_back();
  if (targets.shape() != expected) {
    throw std::invalid_argument(fmt::format(
        "cross_entropy_forward: targets shape {} does not match logits shape {} without its last dim",
        shape_str(targets.shape()), shape_str(logits_in.shape())));
  }
  const int64_t V = logits_in.size(-1), N = logits_in.numel() / V;
  const std::vector<int64_t> t = targets.to_int64_vector();
  for (int64_t n = 0; n < N; ++n) {
    const int64_t target = t[static_cast<size_t>(n)];
    if (target != ignore_index && (target < 0 || target >= V)) {
      throw std::invalid_argument(fmt::format(
          "cross_entropy_forward: target {} at position {} is out of range for {} classes", target, n, V));
    }
  }
  const Tensor logits = logits_in.contiguous();
  Tensor probs({N, V});  // (N, V)
  double total = 0.0;
  int64_t counted = 0;
  for (int64_t n = 0; n < N; ++n) {
    const float* row = logits.data() + n * V;
    const float row_max = *std::max_element(row, row + V);
    double sum_exp = 0.0;
    for (int64_t v = 0; v < V; ++v) sum_exp += std::exp(static_cast<double>(row[v]) - row_max);
    const double lse = row_max + std::log(sum_exp);  // logsumexp of the row
    float* p = probs.data() + n * V;
    for (int64_t v = 0; v < V; ++v) p[v] = static_cast<float>(std::exp(row[v] - lse));
    const int64_t target = t[static_cast<size_t>(n)];
    if (target == ignore_index) continue;
    total += lse - row[target];
    ++counted;
  }
  if (saved != nullptr) *saved = {probs, t, counted, ignore_index, logits.shape()};
  if (counted == 0) return std::numeric_limits<float>::quiet_NaN();
  return static_cast<float>(total / static_cast<double>(counted));
}

Tensor cross_entropy_backward(float dloss, const CrossEntropySaved& saved) {
  const int64_t N = saved.probs.size(0), V = saved.probs.size(1);
  Tensor dlogits({N, V});  // (N, V)
  if (saved.counted > 0) {
    const float per_row = dloss / static_cast<float>(saved.counted);
    for (int64_t n = 0; n < N; ++n) {
      const int64_t target = saved.targets[static_cast<size_t>(n)];
      if (target == saved.ignore_index) continue;
      const float* p = saved.probs.data() + n * V;
      float* d = dlogits.data() + n * V;
      for (int64_t v = 0; v < V; ++v) d[v] = (p[v] - (v == target ? 1.0f : 0.0f)) * per_row;
    }
  }
  return dlogits.view(saved.logits_shape);
}

}  // namespace attn::ref
