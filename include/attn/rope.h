// attn/rope.h - rotary position embedding (RoPE) as the book's Llama chapter
// defines it (ch05/07_gpt_to_llama: compute_rope_params, apply_rope), with
// forward and backward, and position offsets for a KV cache.
//
// The half-split convention (Llama's rotate_half, not the interleaved pairs of
// the RoPE paper): a head vector x of even width hd is split into halves
// x1 = x[:hd/2], x2 = x[hd/2:], and
//
//   rotated = cat(-x2, x1)
//   y       = x ⊙ cos[p] + rotated ⊙ sin[p]          p: the token's position
//
// with cos, sin (context_length, hd) tables whose row p holds cos(p·θ_i),
// sin(p·θ_i) twice over (i = 0 .. hd/2-1, then again), θ_i = theta_base^(-2i/hd):
// pair (x_i, x_{i+hd/2}) is turned by the angle p·θ_i.
// Backward: y is linear in x, and dy -> dx is the transposed map
//   dx_i        = dy_i ⊙ cos_i + dy_{i+h} ⊙ sin_{i+h}          (i < h = hd/2)
//   dx_{i+h}    = dy_{i+h} ⊙ cos_{i+h} - dy_i ⊙ sin_i
// which, for the book's tables (cos_i = cos_{i+h}, sin_i = sin_{i+h}), is the
// rotation by -p·θ_i.
//
// Positions: token t of x (B, H, T, hd) is at position position_offset + t: a
// decoder with a KV cache of L tokens rotates its T new queries and keys with
// position_offset = L, so they are turned exactly as in one pass over the
// whole sequence. position_offset + T must not pass the tables' rows.
//
// Llama 3's frequency scaling (the book's freq_config; standalone-llama32):
// with wavelen_i = 2π / θ_i, low = original_context_length / low_freq_factor
// and high = original_context_length / high_freq_factor,
//   θ_i / factor                                       where wavelen_i > low
//   θ_i                                                where wavelen_i < high
//   (1 - s) θ_i / factor + s θ_i,
//       s = (original_context_length / wavelen_i - low_freq_factor)
//           / (high_freq_factor - low_freq_factor)     in between.
//
// compute_rope_params follows the book's float32 steps (θ_i, then p · θ_i
// rounded to float, then cos and sin of that float), so its tables agree with
// the book's to about one float ulp of the angle.
//
// apply_rope: the plain loop (ref::rope_rows, the specification) and the same
// loop over rows in parallel (OpenMP, one row per iteration: the same bits for
// any thread count; the inner loop over the hd/2 pairs is contiguous and the
// compiler vectorises it). x float32 or bfloat16 (computed in float32, rounded
// once to bf16 as the book's `.to(dtype=x.dtype)`); any strides with the last
// one 1 (a token-major view of a fused qkv buffer is rotated in place).
#pragma once

#include <cstdint>
#include <optional>

#include "attn/rope_kernel.h"
#include "attn/tensor.h"

namespace attn {

// The book's freq_config dictionary, same names (Llama 3.1 / 3.2's values:
// factor 32, low_freq_factor 1, high_freq_factor 4, original_context_length 8192).
struct RopeFreqConfig {
  float factor = 1.0f;
  float low_freq_factor = 1.0f;
  float high_freq_factor = 4.0f;
  int64_t original_context_length = 8192;
};

struct RopeParams {
  Tensor cos;  // (context_length, head_dim) float32
  Tensor sin;  // (context_length, head_dim) float32
};

// compute_rope_params(head_dim, theta_base=10_000, context_length=4096,
// freq_config=None). Throws std::invalid_argument naming the values when
// head_dim is odd or < 2, theta_base <= 1 or not finite, context_length < 1,
// or freq_config has factor <= 0, low_freq_factor <= 0, high_freq_factor <=
// low_freq_factor or original_context_length < 1.
RopeParams compute_rope_params(int64_t head_dim, float theta_base = 10000.0f,
                               int64_t context_length = 4096,
                               const std::optional<RopeFreqConfig>& freq_config = std::nullopt);

// The inverse frequencies θ_i (head_dim / 2) float32, after freq_config.
Tensor rope_inverse_frequencies(int64_t head_dim, float theta_base = 10000.0f,
                                const std::optional<RopeFreqConfig>& freq_config = std::nullopt);

// The cos, sin tables (context_length, hd) of any inverse frequencies (hd / 2)
// float32: row p holds cos(p·θ_i), sin(p·θ_i) twice over, with p·θ_i rounded
// to float first (compute_rope_params is this on rope_inverse_frequencies).
RopeParams rope_tables(const Tensor& inv_freq, int64_t context_length);

enum class RopeBackend : uint8_t {
  kKernel,     // rows in parallel (OpenMP)
  kReference,  // ref::rope_rows, one thread
};

struct RopeOptions {
  int64_t position_offset = 0;  // the position of token 0 (a KV cache's length)
  RopeBackend backend = RopeBackend::kKernel;
};

// apply_rope(x, cos, sin): x (B, H, T, hd) float32 or bfloat16, any strides with
// stride(-1) = 1 (else copied first); cos, sin (L, hd) float32 with
// position_offset + T <= L. Returns a new contiguous tensor of x's dtype.
// Throws std::invalid_argument naming the shapes, dtypes or offset.
Tensor apply_rope(const Tensor& x, const Tensor& cos, const Tensor& sin,
                  const RopeOptions& options = {});
// The same, written into x (a view of a larger buffer is written in place);
// x's stride(-1) must be 1. Returns x.
Tensor& apply_rope_(Tensor& x, const Tensor& cos, const Tensor& sin,
                    const RopeOptions& options = {});
// dL/dx for dL/dy = dy (B, H, T, hd) of apply_rope with the same tables and
// options: the transposed map above (rotation by -p·θ). A new contiguous tensor.
Tensor apply_rope_backward(const Tensor& dy, const Tensor& cos, const Tensor& sin,
                           const RopeOptions& options = {});
// The same, in place on dy.
Tensor& apply_rope_backward_(Tensor& dy, const Tensor& cos, const Tensor& sin,
                             const RopeOptions& options = {});

}  // namespace attn
