// The Tensor entry points of attn/sdpa.h: every check on the caller's tensors
// and options (messages name the values), the mask turned into an additive one
// of its own broadcast shape, then the reference or the fused kernel. bf16:
// the fused kernel reads the bf16 tensors in place; the reference runs on
// exact fp32 copies and its outputs are rounded to bf16.
#include "attn/sdpa.h"

#include <fmt/format.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "attn/kernels.h"
#include "kernels/flash_bf16_strided.h"
#include "kernels/sdpa_mask.h"
#include "attention/sdpa_common.h"

namespace attn {

namespace {

constexpr const char* kWho = "scaled_dot_product_attention";
constexpr int64_t kMaxTokens = int64_t{1} << 31;

using detail::sdpa::has_rows;
using detail::sdpa::is_bf16_reference;
using detail::sdpa::rows_contiguous;
[[noreturn]] void fail(const std::string& what) { detail::sdpa::fail(kWho, what); }
void check_float32(const char* name, const Tensor& t) {
  detail::sdpa::check_float32(kWho, name, t);
}
void check_dtypes(const Tensor& q, const Tensor& k, const Tensor& v) {
  detail::sdpa::check_dtypes(kWho, q, k, v);
}
void check_same_dtype(const char* name, const Tensor& t, const Tensor& q) {
  detail::sdpa::check_same_dtype(kWho, name, t, q);
}

void check_4d(const char* name, const Tensor& t, const char* layout) {
  if (t.dim() != 4)
    fail(fmt::format("{} must be 4-D {}, got shape {}", name, layout, shape_str(t.shape())));
  for (int64_t d = 0; d < 4; ++d)
    if (t.size(d) < 1)
      fail(fmt::format("{} {} has an empty dim: every size must be >= 1", name,
                       shape_str(t.shape())));
}

SdpaStrides strides_of(const Tensor& t) {
  return {t.stride(0), t.stride(1), t.stride(2), t.size(3) == 1 ? 1 : t.stride(3)};
}

struct Sizes {
  int64_t B, Hq, Hkv, Tq, Tk, D, Dv;
};

Sizes check_qkv(const Tensor& q, const Tensor& k, const Tensor& v, const SdpaOptions& o) {
  check_dtypes(q, k, v);
  check_4d("q", q, "(B, Hq, Tq, D)");
  check_4d("k", k, "(B, Hkv, Tk, D)");
  check_4d("v", v, "(B, Hkv, Tk, Dv)");
  const Sizes s{q.size(0), q.size(1), k.size(1), q.size(2), k.size(2), q.size(3), v.size(3)};
  if (k.size(0) != s.B || v.size(0) != s.B)
    fail(fmt::format("batch sizes differ: q {}, k {}, v {}", shape_str(q.shape()),
                     shape_str(k.shape()), shape_str(v.shape())));
  if (v.size(1) != s.Hkv)
    fail(fmt::format("k has {} heads but v has {} (k {}, v {})", s.Hkv, v.size(1),
                     shape_str(k.shape()), shape_str(v.shape())));
  if (v.size(2) != s.Tk)
    fail(fmt::format("k has {} keys but v has {} values (k {}, v {})", s.Tk, v.size(2),
                     shape_str(k.shape()), shape_str(v.shape())));
  if (k.size(3) != s.D)
    fail(fmt::format("q and k must have the same head dim: q {} has D = {}, k {} has {}",
                     shape_str(q.shape()), s.D, shape_str(k.shape()), k.size(3)));
  if (s.Tq > kMaxTokens || s.Tk > kMaxTokens)
    fail(fmt::format("Tq ({}) and Tk ({}) must be <= 2^31", s.Tq, s.Tk));
  detail::sdpa::check_heads(kWho, o, s.Hq, s.Hkv);
  detail::sdpa::check_scalar_options(kWho, o);
  return s;
}

// ---- bf16 on the AMX kernel -------------------------------------------------------------
// Every bf16 call runs on the sdpa kernel (kernels::sdpa_forward), whose
// products are the bf16 path's engine: VDPBF16PS on "AVX512-BF16" (and on
// "AMX" where it measured as fast as the FMA), fp32 FMAs on widened tiles
// elsewhere; it serves every case (masks, windows, ALiBi, softcap, varlen,
// grouped heads, Tq != Tk, Dv != D). The AMX tile kernel is the one engine
// not yet inside it: where the path is AMX, attn/kernels.h's
// flash_attention_*_bf16 take the calls they can, in their strided form
// (kernels/flash_bf16_strided.h): no window, ALiBi or softcap, D = Dv, and a
// scale >= 0 (the core reads a negative scale as "the default"); an attn_mask,
// grouped-query heads and Tq != Tk (either causal alignment) they take
// themselves (kernels::SdpaExtras: the mask with the sdpa kernel's rules,
// closed keys weighing 0 and the 64 x 64 tiles it hides skipped; a query that
// sees no key gives 0). The AMX kernel's dropout noise is sdpa's: Philox
// counters (j/4, i, h, b) with the same key and rule, so dropout is served
// too. Forward and backward decide with this one predicate, so they route alike.
bool core_takes(const Sizes& s, bool plain, float scale) {
  if (std::strcmp(kernels::flash_attention_bf16_path(), "AMX") != 0) return false;
  if (!plain) return false;
  if (s.Hkv <= 0 || s.Hq % s.Hkv != 0 || s.Tq < 1 || s.Tk < 1 || s.D != s.Dv ||
      s.D > kernels::kMaxHeadDim)
    return false;
  return scale >= 0.0f;
}

bool core_serves(const Sizes& s, const SdpaOptions& o) {
  const bool plain = o.backend == SdpaBackend::kFused && o.alibi_slopes.empty() &&
                     o.softcap == 0.0f && o.window_left == -1 && o.window_right == -1;
  return core_takes(s, plain, o.scale ? *o.scale : 1.0f / std::sqrt(float(s.D)));
}

// The same rule on a raw problem (its scale already resolved; varlen never).
template <class T>
bool core_serves(const SdpaProblemT<T>& p) {
  // (A boolean mask goes to the sdpa kernel, which reads it in place.)
  const bool plain = !p.alibi_slopes && p.softcap == 0.0f && p.window_left == -1 &&
                     p.window_right == -1 && !p.cu_seqlens_q && !p.cu_seqlens_k && !p.bool_mask;
  return core_takes({p.B, p.Hq, p.Hkv, p.Tq, p.Tk, p.D, p.Dv}, plain, p.scale);
}

kernels::FlashAttentionParams core_params(const Sizes& s, const SdpaOptions& o) {
  kernels::FlashAttentionParams p;
  p.B = s.B, p.T = s.Tq, p.H = s.Hq, p.hd = s.D;
  p.causal = o.is_causal;
  p.scale = o.scale ? *o.scale : 1.0f / std::sqrt(float(s.D));
  p.dropout_p = o.dropout_p;
  p.dropout_seed = o.dropout_seed;
  return p;  // strides 0: packed (B, T, H, D) buffers
}

// x (B, H, T, D) as the packed token-major (B, T, H, D) buffer the core reads:
// in place when x is already such a buffer's transposed view, else a copy
// (O(B·H·T·D), beside the O(B·H·T²·D) attention).
Tensor token_major(const Tensor& x) {
  const Tensor t = x.transpose(1, 2);
  return t.is_contiguous() ? t : t.contiguous();
}

// A (B, T, H, D) result as sdpa returns it: (B, H, T, D) contiguous.
Tensor head_major(const Tensor& x) { return x.transpose(1, 2).contiguous(); }

Tensor additive_mask(const SdpaOptions& o, const Sizes& s);

// The mask (checked, a boolean one turned into 0 / -inf, held by `held`; a
// dim of size 1 broadcasts) and the key/value heads, as the core's kernels take them.
kernels::SdpaExtras core_extras(const SdpaOptions& o, const Sizes& s, Tensor& held) {
  kernels::SdpaExtras x;
  x.Hkv = s.Hkv;
  x.Tk = s.Tk;
  x.bottom_right = o.causal_alignment == CausalAlignment::kBottomRight;
  if (o.attn_mask.empty()) return x;
  held = additive_mask(o, s);
  auto at = [&](int64_t d) { return held.size(d) == 1 ? 0 : held.stride(d); };
  x.mask = {held.data_ptr<float>(), at(0), at(1), at(2), at(3)};
  return x;
}

// An operand of the core route: as given, or made rows when the call needs
// the kernel's strided form (a mask, grouped heads or Tq != Tk: the core's
// token-major fallback runs none of them).
Tensor core_operand(const Tensor& x, const Sizes& s, const SdpaOptions& o) {
  const bool strided_only = !o.attn_mask.empty() || s.Hq != s.Hkv || s.Tq != s.Tk;
  return strided_only ? rows_contiguous(x) : x;
}

SdpaForward forward_core(const Tensor& q_in, const Tensor& k_in, const Tensor& v_in, const Sizes& s,
                         const SdpaOptions& o) {
  // Rows of contiguous elements (any other strides): read in place and the
  // output written head-major straight away (the kernel packs each head itself).
  const Tensor q = core_operand(q_in, s, o), k = core_operand(k_in, s, o),
               v = core_operand(v_in, s, o);
  if (has_rows(q) && has_rows(k) && has_rows(v)) {
    Tensor held;
    const kernels::SdpaExtras extras = core_extras(o, s, held);
    SdpaForward f{Tensor::empty({s.B, s.Hq, s.Tq, s.Dv}, DType::kBFloat16),
                  Tensor::empty({s.B, s.Hq, s.Tq})};
    auto at = [](const Tensor& x) {
      return kernels::RowStrides{x.stride(0), x.stride(1), x.stride(2)};
    };
    const kernels::ForwardStrides st{at(q), at(k), at(v), at(f.out),
                                     kernels::RowStrides{s.Hq * s.Tq, s.Tq, 1}};
    auto bits = [](const Tensor& x) {
      return reinterpret_cast<const uint16_t*>(x.data_ptr<BFloat16>());
    };
    kernels::flash_attention_forward_bf16(reinterpret_cast<uint16_t*>(f.out.data_ptr<BFloat16>()),
                                          f.lse.data(), bits(q), bits(k), bits(v),
                                          core_params(s, o), st, extras);
    return f;
  }
  const Tensor qt = token_major(q), kt = token_major(k), vt = token_major(v);
  Tensor out_t = Tensor::empty({s.B, s.Tq, s.Hq, s.Dv}, DType::kBFloat16);
  SdpaForward f{Tensor(), Tensor::empty({s.B, s.Hq, s.Tq})};
  kernels::flash_attention_forward_bf16(out_t.data_ptr<BFloat16>(), f.lse.data(),
                                        qt.data_ptr<BFloat16>(), kt.data_ptr<BFloat16>(),
                                        vt.data_ptr<BFloat16>(), core_params(s, o));
  f.out = head_major(out_t);
  return f;
}

// The problem the reference and the kernel read; q, k, v already rows_contiguous.
template <class T>
struct Prepared {
  Tensor q, k, v, mask, alibi;  // holds what the pointers point into
  SdpaProblemT<T> p;
};

constexpr float kInf = std::numeric_limits<float>::infinity();
// Masks of at least this many elements are checked and converted on OpenMP's threads.
constexpr int64_t kParallelElements = int64_t{1} << 16;

// Whether pred holds for every x[j · stride], j < n: one pass without an
// early exit, which the compiler vectorises (stride 1).
template <class T, class Pred, class Stride>
bool all_of(const T* x, int64_t n, Stride stride, Pred pred) {
  int bad = 0;
  for (int64_t j = 0; j < n; ++j) bad |= pred(x[j * stride]) ? 0 : 1;
  return bad == 0;
}

// The first i in [0, n) with bad(x[i]), or -1: a parallel vectorised scan that
// only says whether there is one (a mask of T = 4096 is 16.8M values, checked
// every call), then a serial search for the first when there is.
template <class T, class Bad>
int64_t first_where(const T* x, int64_t n, Bad bad) {
  constexpr int64_t kChunk = int64_t{1} << 14;
  const int64_t chunks = (n + kChunk - 1) / kChunk;
  int any = 0;
#pragma omp parallel for schedule(static) reduction(| : any) if (n >= kParallelElements)
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t i0 = c * kChunk;
    any |= all_of(x + i0, std::min(kChunk, n - i0), std::integral_constant<int64_t, 1>(),
                  [&bad](T v) { return !bad(v); })
               ? 0
               : 1;
  }
  if (any == 0) return -1;
  for (int64_t i = 0; i < n; ++i)
    if (bad(x[i])) return i;
  return -1;
}

Tensor additive_mask(const SdpaOptions& o, const Sizes& s) {
  const Tensor& m = o.attn_mask;
  if (m.dim() < 1 || m.dim() > 4)
    fail(
        fmt::format("attn_mask must have 1 to 4 dims broadcastable to (B, Hq, Tq, Tk) = {}, got {}",
                    shape_str({s.B, s.Hq, s.Tq, s.Tk}), shape_str(m.shape())));
  const Shape full{s.B, s.Hq, s.Tq, s.Tk};
  Shape shape(4, 1);
  for (int64_t d = 0; d < m.dim(); ++d) shape[size_t(4 - m.dim() + d)] = m.size(d);
  for (size_t d = 0; d < 4; ++d)
    if (shape[d] != 1 && shape[d] != full[d])
      fail(fmt::format("attn_mask of shape {} does not broadcast to (B, Hq, Tq, Tk) = {}",
                       shape_str(m.shape()), shape_str(full)));
  if (o.attn_mask_type == MaskType::kAdditive) {
    if (m.dtype() != DType::kFloat32)
      fail(
          fmt::format("an additive attn_mask must be float32, got {} (a 0/1 mask needs "
                      "attn_mask_type = MaskType::kBoolean)",
                      dtype_name(m.dtype())));
    // A NaN or +inf score would make its row's softmax NaN: refused here, not
    // passed on silently (-inf is a mask; any finite value a bias).
    const Tensor c = m.contiguous();  // m itself, unless it is strided
    const float* x = c.data();
    const int64_t n = first_where(x, c.numel(), [](float y) {
      return !(y <= std::numeric_limits<float>::max()) && y != -kInf;  // NaN or +inf
    });
    if (n >= 0)
      fail(fmt::format(
          "an additive attn_mask must hold finite values or -inf, got {} at flat index {}", x[n],
          n));
    return c.reshape(shape);
  }
  if (m.dtype() == DType::kBFloat16)
    fail("a boolean attn_mask must be float32 or int64 holding 0 and 1, got bfloat16");
  // Boolean: true (1) adds 0, false (0) adds -inf (PyTorch's conversion).
  Tensor out(shape);
  float* dst = out.data();
  const Tensor c = m.contiguous();
  const int64_t count = c.numel();
  if (c.dtype() == DType::kInt64) {
    const int64_t* x = c.data_ptr<int64_t>();
    const int64_t n = first_where(x, count, [](int64_t y) { return y != 0 && y != 1; });
    if (n >= 0)
      fail(fmt::format("a boolean attn_mask holds 0 or 1, got {} at flat index {}", x[n], n));
#pragma omp parallel for schedule(static) if (count >= kParallelElements)
    for (int64_t i = 0; i < count; ++i) dst[i] = x[i] != 0 ? 0.0f : -kInf;
  } else {
    const float* x = c.data();
    const int64_t n = first_where(x, count, [](float y) { return y != 0.0f && y != 1.0f; });
    if (n >= 0)
      fail(fmt::format("a boolean attn_mask holds 0 or 1, got {} at flat index {}", x[n], n));
#pragma omp parallel for schedule(static) if (count >= kParallelElements)
    for (int64_t i = 0; i < count; ++i) dst[i] = x[i] != 0.0f ? 0.0f : -kInf;
  }
  return out;
}

// Whether the (T, T) plane x (rows si, keys sj apart) is open (open(x)) on
// and below the diagonal and closed above. The first two and the last two rows
// alone first (where most other masks differ: a padding mask's last row), then
// every row on OpenMP's threads, each row's two loops without an early exit
// (vectorised for contiguous rows).
template <class E, class Open, class Closed>
bool plane_is_causal(const E* x, int64_t T, int64_t si, int64_t sj, Open open, Closed closed) {
  auto row_is_causal = [&](int64_t i, auto key_stride) {
    return all_of(x + i * si, i + 1, key_stride, open) &&
           all_of(x + i * si + (i + 1) * key_stride, T - i - 1, key_stride, closed);
  };
  auto rows_are_causal = [&](auto key_stride) {
    const int64_t ends = std::min<int64_t>(T, 2);  // rows [0, ends) and [T - ends, T)
    for (int64_t i = 0; i < ends; ++i)
      if (!row_is_causal(i, key_stride) || !row_is_causal(T - 1 - i, key_stride)) return false;
    int bad = 0;
#pragma omp parallel for schedule(static) reduction(| : bad) if (T * T >= kParallelElements)
    for (int64_t i = ends; i < T - ends; ++i)
      if (bad == 0 && !row_is_causal(i, key_stride)) bad = 1;
    return bad == 0;
  };
  return sj == 1 ? rows_are_causal(std::integral_constant<int64_t, 1>()) : rows_are_causal(sj);
}

// An additive mask's open and closed values: 0; what closes a key in the
// kernel (kernels/sdpa_mask.h: -inf, or the float32 minimum and its like).
constexpr auto additive_open = [](float y) { return y == 0.0f; };
constexpr auto additive_closed = [](float y) { return kernels::mask_value_closes(y); };

// Whether attn_mask is exactly the causal pattern of a square problem, one
// (T, T) plane shared by every batch and head: open (additive 0, boolean true)
// on and below the diagonal, closed above (boolean false, additive -inf or a
// value below -FLT_MAX / log2(e), such as the float32 minimum that
// transformers' masks hold: its weight is exactly 0, in the kernel as in the
// definition, beside the row's open diagonal). Such a call runs as is_causal:
// the same sums (adding 0 leaves a score's bits, and a closed key's weight is 0
// either way), without the mask's checks and scans, the tiles above the
// diagonal never visited, and bf16 on the core's kernels where they run. Most masks
// that are not causal are told by their first or last two rows, at once.
// The reference backend keeps the mask: it is the definition.
bool mask_is_causal(const SdpaOptions& o, const Sizes& s) {
  const Tensor& m = o.attn_mask;
  if (m.empty() || o.is_causal || o.backend == SdpaBackend::kReference || s.Tq != s.Tk ||
      o.window_left != -1 || o.window_right != -1 || m.dim() < 2 || m.dim() > 4)
    return false;
  const int64_t T = s.Tq, dims = m.dim();
  if (m.size(dims - 2) != T || m.size(dims - 1) != T) return false;
  for (int64_t d = 0; d + 2 < dims; ++d)
    if (m.size(d) != 1) return false;
  const int64_t si = m.stride(dims - 2), sj = m.stride(dims - 1);
  auto causal = [&](const auto* x, auto open, auto closed) {
    return plane_is_causal(x, T, si, sj, open, closed);
  };
  if (m.dtype() == DType::kInt64) {
    if (o.attn_mask_type != MaskType::kBoolean) return false;
    return causal(
        m.data_ptr<int64_t>(), [](int64_t y) { return y == 1; }, [](int64_t y) { return y == 0; });
  }
  if (m.dtype() != DType::kFloat32) return false;
  const float* x = m.data_ptr<float>();
  if (o.attn_mask_type == MaskType::kBoolean)
    return causal(x, [](float y) { return y == 1.0f; }, [](float y) { return y == 0.0f; });
  return causal(x, additive_open, additive_closed);
}

// The options a call runs with: options itself, or is_causal in place of a
// causal mask (mask_is_causal).
SdpaOptions as_run(const SdpaOptions& options, const Sizes& s) {
  if (!mask_is_causal(options, s)) return options;
  SdpaOptions o = options;
  o.attn_mask = Tensor();
  o.attn_mask_type = MaskType::kAdditive;
  o.is_causal = true;
  o.causal_alignment = CausalAlignment::kTopLeft;
  return o;
}

// The raw layer's rule (the Python binding's calls): a problem whose additive
// mask is one causal plane of a square, windowless problem runs as is_causal.
template <class T>
SdpaProblemT<T> as_run(const SdpaProblemT<T>& p) {
  const SdpaStrides& ms = p.mask_strides;
  if ((!p.mask && !p.bool_mask) || p.is_causal || p.cu_seqlens_q || p.Tq != p.Tk ||
      p.window_left != -1 || p.window_right != -1 || (ms.b != 0 && p.B > 1) ||
      (ms.h != 0 && p.Hq > 1))
    return p;
  const bool causal =
      p.mask ? plane_is_causal(p.mask, p.Tq, ms.t, ms.d, additive_open, additive_closed)
             : plane_is_causal(
                   p.bool_mask, p.Tq, ms.t, ms.d, [](uint8_t y) { return y != 0; },
                   [](uint8_t y) { return y == 0; });
  if (!causal) return p;
  SdpaProblemT<T> r = p;
  r.mask = nullptr;
  r.bool_mask = nullptr;
  r.mask_strides = {};
  r.is_causal = true;
  r.causal_alignment = CausalAlignment::kTopLeft;
  return r;
}

template <class T>
Prepared<T> prepare(const Tensor& q, const Tensor& k, const Tensor& v, const SdpaOptions& o) {
  const Sizes s = check_qkv(q, k, v, o);
  Prepared<T> r;
  r.q = rows_contiguous(q), r.k = rows_contiguous(k), r.v = rows_contiguous(v);
  SdpaProblemT<T>& p = r.p;
  p.B = s.B, p.Hq = s.Hq, p.Hkv = s.Hkv, p.Tq = s.Tq, p.Tk = s.Tk, p.D = s.D, p.Dv = s.Dv;
  p.q = r.q.template data_ptr<T>(), p.k = r.k.template data_ptr<T>(),
  p.v = r.v.template data_ptr<T>();
  p.q_strides = strides_of(r.q), p.k_strides = strides_of(r.k), p.v_strides = strides_of(r.v);
  if (!o.attn_mask.empty()) {
    r.mask = additive_mask(o, s);
    p.mask = r.mask.template data_ptr<float>();
    int64_t st[4];
    for (int64_t d = 0; d < 4; ++d) st[d] = r.mask.size(d) == 1 ? 0 : r.mask.stride(d);
    p.mask_strides = {st[0], st[1], st[2], st[3]};
  }
  if (!o.alibi_slopes.empty()) {
    const Tensor& a = o.alibi_slopes;
    check_float32("alibi_slopes", a);
    const bool per_head = a.dim() == 1 && a.size(0) == s.Hq;
    const bool per_batch = a.dim() == 2 && a.size(0) == s.B && a.size(1) == s.Hq;
    if (!per_head && !per_batch)
      fail(fmt::format("alibi_slopes must be (Hq) = ({}) or (B, Hq) = ({}, {}), got {}", s.Hq, s.B,
                       s.Hq, shape_str(a.shape())));
    r.alibi = a.contiguous();
    p.alibi_slopes = r.alibi.template data_ptr<float>();
    p.alibi_b_stride = per_batch ? s.Hq : 0;
  }
  detail::sdpa::set_options(p, o, s.D);
  return r;
}

SdpaStrides contiguous_of(int64_t H, int64_t T, int64_t W) { return {H * T * W, T * W, W, 1}; }

// The fused kernel on T = float or BFloat16 tensors (the fp32 reference too for float).
template <class T>
SdpaForward forward(const Tensor& q, const Tensor& k, const Tensor& v, const SdpaOptions& options) {
  const Prepared<T> r = prepare<T>(q, k, v, options);
  const SdpaProblemT<T>& p = r.p;
  SdpaForward f{Tensor::empty({p.B, p.Hq, p.Tq, p.Dv}, dtype_of<T>()),
                Tensor::empty({p.B, p.Hq, p.Tq})};
  const SdpaOutputT<T> o{f.out.data_ptr<T>(), contiguous_of(p.Hq, p.Tq, p.Dv), f.lse.data()};
  if constexpr (std::is_same_v<T, float>) {
    if (options.backend == SdpaBackend::kReference) {
      ref::sdpa_forward(o, p);
      return f;
    }
  }
  kernels::sdpa_forward(o, p);
  return f;
}

}  // namespace

SdpaForward scaled_dot_product_attention_forward(const Tensor& q, const Tensor& k, const Tensor& v,
                                                 const SdpaOptions& options) {
  if (is_bf16_reference(q, options)) {  // the spec on the bf16 values, exactly widened
    check_qkv(q, k, v, options);
    SdpaForward f = forward<float>(q.to(DType::kFloat32), k.to(DType::kFloat32),
                                   v.to(DType::kFloat32), options);
    f.out = f.out.to(DType::kBFloat16);
    return f;
  }
  const Sizes s = check_qkv(q, k, v, options);
  const SdpaOptions o = as_run(options, s);
  if (q.dtype() == DType::kBFloat16) {
    if (core_serves(s, o)) return forward_core(q, k, v, s, o);
    return forward<BFloat16>(q, k, v, o);
  }
  return forward<float>(q, k, v, o);
}

Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                    const SdpaOptions& options) {
  return scaled_dot_product_attention_forward(q, k, v, options).out;
}

namespace {

// dout, out (B, Hq, Tq, Dv) in q's dtype and lse (B, Hq, Tq) float32.
void check_backward_io(const Tensor& dout, const Tensor& out, const Tensor& lse, const Tensor& q,
                       const Sizes& s) {
  const Shape out_shape{s.B, s.Hq, s.Tq, s.Dv};
  check_same_dtype("dout", dout, q);
  check_same_dtype("out", out, q);
  check_float32("lse", lse);
  if (dout.shape() != out_shape)
    fail(fmt::format("dout has shape {} but the output is {}", shape_str(dout.shape()),
                     shape_str(out_shape)));
  if (out.shape() != out_shape)
    fail(fmt::format("out has shape {} but the output is {}", shape_str(out.shape()),
                     shape_str(out_shape)));
  if (lse.shape() != Shape{s.B, s.Hq, s.Tq})
    fail(fmt::format("lse has shape {} but must be (B, Hq, Tq) = {}", shape_str(lse.shape()),
                     shape_str({s.B, s.Hq, s.Tq})));
}

SdpaGrads backward_core(const Tensor& dout_in, const Tensor& q_in, const Tensor& k_in,
                        const Tensor& v_in, const Tensor& out_in, const Tensor& lse, const Sizes& s,
                        const SdpaOptions& o) {
  check_backward_io(dout_in, out_in, lse, q_in, s);
  // Rows of contiguous elements (any other strides): read in place, the
  // gradients written head-major straight away.
  const Tensor dout = core_operand(dout_in, s, o), q = core_operand(q_in, s, o),
               k = core_operand(k_in, s, o), v = core_operand(v_in, s, o),
               out = core_operand(out_in, s, o);
  if (has_rows(q) && has_rows(k) && has_rows(v) && has_rows(dout) && has_rows(out)) {
    Tensor held;
    const kernels::SdpaExtras extras = core_extras(o, s, held);
    const Tensor lse_c = lse.contiguous();
    const Shape q_shape{s.B, s.Hq, s.Tq, s.D}, kv_shape{s.B, s.Hkv, s.Tk, s.D};
    SdpaGrads g{Tensor::empty(q_shape, DType::kBFloat16), Tensor::empty(kv_shape, DType::kBFloat16),
                Tensor::empty(kv_shape, DType::kBFloat16)};
    auto at = [](const Tensor& x) {
      return kernels::RowStrides{x.stride(0), x.stride(1), x.stride(2)};
    };
    const kernels::BackwardStrides st{at(dout), at(q),    at(k),
                                      at(v),    at(out),  kernels::RowStrides{s.Hq * s.Tq, s.Tq, 1},
                                      at(g.dq), at(g.dk), at(g.dv)};
    auto in = [](const Tensor& x) { return reinterpret_cast<const uint16_t*>(x.data_ptr<BFloat16>()); };
    auto grad = [](Tensor& x) { return reinterpret_cast<uint16_t*>(x.data_ptr<BFloat16>()); };
    kernels::flash_attention_backward_bf16(grad(g.dq), grad(g.dk), grad(g.dv), in(dout), in(q),
                                           in(k), in(v), in(out), lse_c.data(), core_params(s, o),
                                           st, extras);
    return g;
  }
  const Tensor qt = token_major(q), kt = token_major(k), vt = token_major(v);
  const Tensor dout_t = token_major(dout), out_t = token_major(out), lse_c = lse.contiguous();
  const Shape shape{s.B, s.Tq, s.Hq, s.D};
  Tensor dq = Tensor::empty(shape, DType::kBFloat16), dk = Tensor::empty(shape, DType::kBFloat16),
         dv = Tensor::empty(shape, DType::kBFloat16);
  kernels::flash_attention_backward_bf16(
      dq.data_ptr<BFloat16>(), dk.data_ptr<BFloat16>(), dv.data_ptr<BFloat16>(),
      dout_t.data_ptr<BFloat16>(), qt.data_ptr<BFloat16>(), kt.data_ptr<BFloat16>(),
      vt.data_ptr<BFloat16>(), out_t.data_ptr<BFloat16>(), lse_c.data(), core_params(s, o));
  return {head_major(dq), head_major(dk), head_major(dv)};
}

template <class T>
SdpaGrads backward(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                   const Tensor& out, const Tensor& lse, const SdpaOptions& options) {
  const Prepared<T> r = prepare<T>(q, k, v, options);
  const SdpaProblemT<T>& p = r.p;
  check_backward_io(dout, out, lse, q, {p.B, p.Hq, p.Hkv, p.Tq, p.Tk, p.D, p.Dv});
  const Tensor dout_r = rows_contiguous(dout), out_r = rows_contiguous(out);
  const Tensor lse_c = lse.contiguous();
  constexpr DType dtype = dtype_of<T>();
  SdpaGrads g{Tensor::empty({p.B, p.Hq, p.Tq, p.D}, dtype),
              Tensor::empty({p.B, p.Hkv, p.Tk, p.D}, dtype),
              Tensor::empty({p.B, p.Hkv, p.Tk, p.Dv}, dtype)};
  SdpaBackwardIOT<T> io;
  io.dout = dout_r.data_ptr<T>(), io.dout_strides = strides_of(dout_r);
  io.out = out_r.data_ptr<T>(), io.out_strides = strides_of(out_r);
  io.lse = lse_c.data();
  io.dq = g.dq.data_ptr<T>(), io.dk = g.dk.data_ptr<T>(), io.dv = g.dv.data_ptr<T>();
  io.dq_strides = contiguous_of(p.Hq, p.Tq, p.D);
  io.dk_strides = contiguous_of(p.Hkv, p.Tk, p.D);
  io.dv_strides = contiguous_of(p.Hkv, p.Tk, p.Dv);
  if constexpr (std::is_same_v<T, float>) {
    if (options.backend == SdpaBackend::kReference) {
      ref::sdpa_backward(io, p);
      return g;
    }
  }
  kernels::sdpa_backward(io, p);
  return g;
}

}  // namespace

SdpaGrads scaled_dot_product_attention_backward(const Tensor& dout, const Tensor& q,
                                                const Tensor& k, const Tensor& v, const Tensor& out,
                                                const Tensor& lse, const SdpaOptions& options) {
  if (is_bf16_reference(q, options)) {  // the spec on the bf16 values, exactly widened
    check_qkv(q, k, v, options);
    check_same_dtype("dout", dout, q);
    check_same_dtype("out", out, q);
    const DType f32 = DType::kFloat32, bf16 = DType::kBFloat16;
    SdpaGrads g =
        backward<float>(dout.to(f32), q.to(f32), k.to(f32), v.to(f32), out.to(f32), lse, options);
    return {g.dq.to(bf16), g.dk.to(bf16), g.dv.to(bf16)};
  }
  const Sizes s = check_qkv(q, k, v, options);
  const SdpaOptions o = as_run(options, s);
  if (q.dtype() == DType::kBFloat16) {
    if (core_serves(s, o)) return backward_core(dout, q, k, v, out, lse, s, o);
    return backward<BFloat16>(dout, q, k, v, out, lse, o);
  }
  return backward<float>(dout, q, k, v, out, lse, o);
}

// ---- the raw layer, routed (sdpa_forward_routed / sdpa_backward_routed) ----------------
namespace {

// One (B, H, T, W) strided operand of the core's kernels, which read and write
// rows of contiguous elements at any (b, h, t) strides: x itself when its rows
// are contiguous (head-major tensors as PyTorch's, token-major views, slices;
// the kernels pack each head into their tile layouts anyway, so a token-major
// copy first would only add a pass: at T = 256 it doubled the call), else a
// packed (B, T, H, W) copy of an input, or a buffer for an output that
// scatter() copies back afterwards.
struct CoreRows {
  BFloat16* data = nullptr;
  kernels::RowStrides st;
  std::vector<BFloat16> packed;  // empty in place
};

// One (b, h, t) row of W elements at base + b·s.b + h·s.h + t·s.t, step s.d,
// and its place in the packed (B, T, H, W) buffer.
template <class F>
void for_rows(const SdpaStrides& s, int64_t B, int64_t H, int64_t T, int64_t W, F&& f) {
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t h = 0; h < H; ++h) f(b * s.b + h * s.h + t * s.t, ((b * T + t) * H + h) * W);
}

CoreRows core_rows(const BFloat16* x, const SdpaStrides& s, int64_t B, int64_t H, int64_t T,
                   int64_t W, bool input) {
  CoreRows r;
  if (W == 1 || s.d == 1) {
    r.data = const_cast<BFloat16*>(x);
    r.st = {s.b, s.h, s.t};
    return r;
  }
  r.packed.resize(size_t(B * T * H * W));
  r.data = r.packed.data();
  r.st = {T * H * W, W, H * W};
  if (input)
    for_rows(s, B, H, T, W, [&](int64_t from, int64_t to) {
      for (int64_t d = 0; d < W; ++d) r.packed[size_t(to + d)] = x[from + d * s.d];
    });
  return r;
}

void scatter(const CoreRows& r, BFloat16* x, const SdpaStrides& s, int64_t B, int64_t H, int64_t T,
             int64_t W) {
  if (r.packed.empty()) return;
  for_rows(s, B, H, T, W, [&](int64_t to, int64_t from) {
    for (int64_t d = 0; d < W; ++d) x[to + d * s.d] = r.packed[size_t(from + d)];
  });
}

kernels::FlashAttentionParams raw_core_params(const SdpaProblemBf16& p) {
  kernels::FlashAttentionParams f;
  f.B = p.B, f.T = p.Tq, f.H = p.Hq, f.hd = p.D;
  f.causal = p.is_causal;
  f.scale = p.scale;
  f.dropout_p = p.dropout_p;
  f.dropout_seed = p.dropout_seed;
  return f;
}

kernels::SdpaExtras raw_core_extras(const SdpaProblemBf16& p) {
  const SdpaStrides& m = p.mask_strides;
  kernels::SdpaExtras x;
  x.mask = {p.mask, m.b, m.h, m.t, m.d};
  x.Hkv = p.Hkv;
  x.Tk = p.Tk;
  x.bottom_right = p.causal_alignment == CausalAlignment::kBottomRight;
  return x;
}

kernels::RowStrides lse_rows(const std::optional<SdpaStrides>& lse_strides,
                             const SdpaProblemBf16& p) {
  const SdpaStrides ls = sdpa_lse_strides(lse_strides, p);
  return {ls.b, ls.h, ls.t};
}

uint16_t* bits(BFloat16* x) { return reinterpret_cast<uint16_t*>(x); }

// A raw operand (data, strides) pointed at its rows: in place or the packed copy.
template <class T>
void point_at(T*& data, SdpaStrides& strides, const CoreRows& r) {
  data = r.data;
  strides = {r.st.b, r.st.h, r.st.t, 1};
}

// p with q, k and v read from their rows.
SdpaProblemBf16 on_rows(SdpaProblemBf16 p, const CoreRows& q, const CoreRows& k,
                        const CoreRows& v) {
  point_at(p.q, p.q_strides, q), point_at(p.k, p.k_strides, k), point_at(p.v, p.v_strides, v);
  return p;
}

}  // namespace

void sdpa_forward_routed(const SdpaOutput& o, const SdpaProblem& p) {
  kernels::sdpa_forward(o, as_run(p));
}

void sdpa_backward_routed(const SdpaBackwardIO& io, const SdpaProblem& p) {
  kernels::sdpa_backward(io, as_run(p));
}

void sdpa_forward_routed(const SdpaOutputBf16& o, const SdpaProblemBf16& given) {
  const SdpaProblemBf16 p = as_run(given);
  // A varlen problem's tensors are packed (total, H, W) rows: the kernel as given.
  if (p.cu_seqlens_q) return kernels::sdpa_forward(o, p);
  const int64_t B = p.B, H = p.Hq, Hkv = p.Hkv, T = p.Tq, Tk = p.Tk, D = p.D, Dv = p.Dv;
  const CoreRows q = core_rows(p.q, p.q_strides, B, H, T, D, true);
  const CoreRows k = core_rows(p.k, p.k_strides, B, Hkv, Tk, D, true);
  const CoreRows v = core_rows(p.v, p.v_strides, B, Hkv, Tk, Dv, true);
  const CoreRows out = core_rows(o.out, o.out_strides, B, H, T, Dv, false);
  if (core_serves(p)) {
    const kernels::ForwardStrides st{q.st, k.st, v.st, out.st, lse_rows(o.lse_strides, p)};
    kernels::flash_attention_forward_bf16(bits(out.data), o.lse, bits(q.data), bits(k.data),
                                          bits(v.data), raw_core_params(p), st, raw_core_extras(p));
  } else {  // the sdpa kernel, on the rows
    SdpaOutputBf16 ro = o;
    point_at(ro.out, ro.out_strides, out);
    kernels::sdpa_forward(ro, on_rows(p, q, k, v));
  }
  scatter(out, o.out, o.out_strides, B, H, T, Dv);
}

void sdpa_backward_routed(const SdpaBackwardIOBf16& io, const SdpaProblemBf16& given) {
  const SdpaProblemBf16 p = as_run(given);
  if (p.cu_seqlens_q) return kernels::sdpa_backward(io, p);
  const int64_t B = p.B, H = p.Hq, Hkv = p.Hkv, T = p.Tq, Tk = p.Tk, D = p.D, Dv = p.Dv;
  const CoreRows dout = core_rows(io.dout, io.dout_strides, B, H, T, Dv, true);
  const CoreRows q = core_rows(p.q, p.q_strides, B, H, T, D, true);
  const CoreRows k = core_rows(p.k, p.k_strides, B, Hkv, Tk, D, true);
  const CoreRows v = core_rows(p.v, p.v_strides, B, Hkv, Tk, Dv, true);
  const CoreRows out = core_rows(io.out, io.out_strides, B, H, T, Dv, true);
  const CoreRows dq = core_rows(io.dq, io.dq_strides, B, H, T, D, false);
  const CoreRows dk = core_rows(io.dk, io.dk_strides, B, Hkv, Tk, D, false);
  const CoreRows dv = core_rows(io.dv, io.dv_strides, B, Hkv, Tk, Dv, false);
  if (core_serves(p)) {
    const kernels::BackwardStrides st{
        dout.st, q.st, k.st, v.st, out.st, lse_rows(io.lse_strides, p), dq.st, dk.st, dv.st};
    kernels::flash_attention_backward_bf16(
        bits(dq.data), bits(dk.data), bits(dv.data), bits(dout.data), bits(q.data), bits(k.data),
        bits(v.data), bits(out.data), io.lse, raw_core_params(p), st, raw_core_extras(p));
  } else {  // the sdpa kernel, on the rows
    SdpaBackwardIOBf16 ri = io;
    point_at(ri.dout, ri.dout_strides, dout), point_at(ri.out, ri.out_strides, out);
    point_at(ri.dq, ri.dq_strides, dq), point_at(ri.dk, ri.dk_strides, dk);
    point_at(ri.dv, ri.dv_strides, dv);
    kernels::sdpa_backward(ri, on_rows(p, q, k, v));
  }
  scatter(dq, io.dq, io.dq_strides, B, H, T, D);
  scatter(dk, io.dk, io.dk_strides, B, Hkv, Tk, D);
  scatter(dv, io.dv, io.dv_strides, B, Hkv, Tk, Dv);
}

namespace kernels {

namespace {
// The sdpa kernel's engine for bf16 problems, as a path name.
const char* sdpa_kernel_bf16_path() {
  return bf16_dot_engine_chosen() ? "AVX512-BF16" : "bf16 tiles widened to fp32";
}
}  // namespace

// The routes above, for this CPU (sdpa_bf16_path(q, k, v, options) names a
// given call's).
const char* sdpa_bf16_path() {
  const char* core = flash_attention_bf16_path();
  if (std::strcmp(core, "AMX") == 0)
    return bf16_dot_engine_chosen()
               ? "AMX where the call allows it, else AVX512-BF16"
               : "AMX where the call allows it, else bf16 tiles widened to fp32";
  return sdpa_kernel_bf16_path();
}

const char* sdpa_bf16_path(const SdpaProblemBf16& p) {
  return core_serves(as_run(p)) ? flash_attention_bf16_path() : sdpa_kernel_bf16_path();
}

const char* sdpa_bf16_path(const Tensor& q, const Tensor& k, const Tensor& v,
                           const SdpaOptions& options) {
  if (is_bf16_reference(q, options)) return "reference (fp32 on the widened values)";
  const Sizes s = check_qkv(q, k, v, options);
  return core_serves(s, as_run(options, s)) ? flash_attention_bf16_path() : sdpa_kernel_bf16_path();
}

}  // namespace kernels

}  // namespace attn
