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

#include "attn/kernels.h"
#include "nn/sdpa_common.h"

namespace attn {

namespace {

constexpr const char* kWho = "scaled_dot_product_attention";
constexpr int64_t kMaxTokens = int64_t{1} << 31;

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

// ---- bf16 on the core's AMX kernel (attn/kernels.h's flash_attention_*_bf16) ----------
// The call is exactly the core's problem when it has no mask, window, ALiBi or
// softcap, Hq = Hkv, Tq = Tk (so both causal alignments are the core's
// top-left), D = Dv, and a scale >= 0 (the core reads a negative scale as
// "the default"). The core's dropout noise is sdpa's: Philox counters (j/4,
// i, h, b) with the same key and rule, so dropout is served too. Forward and
// backward decide with this one predicate, so they route alike.
bool amx_serves(const Sizes& s, const SdpaOptions& o) {
  if (std::strcmp(kernels::flash_attention_bf16_path(), "AMX") != 0) return false;
  if (o.backend != SdpaBackend::kFused) return false;
  if (!o.attn_mask.empty() || !o.alibi_slopes.empty() || o.softcap != 0.0f) return false;
  if (o.window_left != -1 || o.window_right != -1) return false;
  if (s.Hq != s.Hkv || s.Tq != s.Tk || s.D != s.Dv || s.D > kernels::kMaxHeadDim) return false;
  const float scale = o.scale ? *o.scale : 1.0f / std::sqrt(float(s.D));
  return scale >= 0.0f;
}

kernels::FlashAttentionParams amx_params(const Sizes& s, const SdpaOptions& o) {
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

SdpaForward forward_amx(const Tensor& q, const Tensor& k, const Tensor& v, const Sizes& s,
                        const SdpaOptions& o) {
  const Tensor qt = token_major(q), kt = token_major(k), vt = token_major(v);
  Tensor out_t = Tensor::empty({s.B, s.Tq, s.Hq, s.Dv}, DType::kBFloat16);
  SdpaForward f{Tensor(), Tensor::empty({s.B, s.Hq, s.Tq})};
  kernels::flash_attention_forward_bf16(out_t.data_ptr<BFloat16>(), f.lse.data(),
                                        qt.data_ptr<BFloat16>(), kt.data_ptr<BFloat16>(),
                                        vt.data_ptr<BFloat16>(), amx_params(s, o));
  f.out = head_major(out_t);
  return f;
}

// The problem the reference and the kernel read; q, k, v already rows_contiguous.
template <class T>
struct Prepared {
  Tensor q, k, v, mask, alibi;  // holds what the pointers point into
  SdpaProblemT<T> p;
};

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
    const std::vector<float> values = m.to_vector();
    for (size_t n = 0; n < values.size(); ++n) {
      if (std::isnan(values[n]) || values[n] == std::numeric_limits<float>::infinity())
        fail(fmt::format(
            "an additive attn_mask must hold finite values or -inf, got {} at flat index {}",
            values[n], n));
    }
    return m.reshape(shape);
  }
  if (m.dtype() == DType::kBFloat16)
    fail("a boolean attn_mask must be float32 or int64 holding 0 and 1, got bfloat16");
  // Boolean: true (1) adds 0, false (0) adds -inf (PyTorch's conversion).
  Tensor out(shape);
  float* dst = out.data();
  if (m.dtype() == DType::kInt64) {
    const std::vector<int64_t> values = m.to_int64_vector();
    for (size_t n = 0; n < values.size(); ++n) {
      if (values[n] != 0 && values[n] != 1)
        fail(
            fmt::format("a boolean attn_mask holds 0 or 1, got {} at flat index {}", values[n], n));
      dst[n] = values[n] ? 0.0f : -std::numeric_limits<float>::infinity();
    }
  } else {
    const std::vector<float> values = m.to_vector();
    for (size_t n = 0; n < values.size(); ++n) {
      if (values[n] != 0.0f && values[n] != 1.0f)
        fail(
            fmt::format("a boolean attn_mask holds 0 or 1, got {} at flat index {}", values[n], n));
      dst[n] = values[n] != 0.0f ? 0.0f : -std::numeric_limits<float>::infinity();
    }
  }
  return out;
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
  if (q.dtype() == DType::kBFloat16) {
    const Sizes s = check_qkv(q, k, v, options);
    if (amx_serves(s, options)) return forward_amx(q, k, v, s, options);
    return forward<BFloat16>(q, k, v, options);
  }
  return forward<float>(q, k, v, options);
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

SdpaGrads backward_amx(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                       const Tensor& out, const Tensor& lse, const Sizes& s,
                       const SdpaOptions& o) {
  check_backward_io(dout, out, lse, q, s);
  const Tensor qt = token_major(q), kt = token_major(k), vt = token_major(v);
  const Tensor dout_t = token_major(dout), out_t = token_major(out), lse_c = lse.contiguous();
  const Shape shape{s.B, s.Tq, s.Hq, s.D};
  Tensor dq = Tensor::empty(shape, DType::kBFloat16), dk = Tensor::empty(shape, DType::kBFloat16),
         dv = Tensor::empty(shape, DType::kBFloat16);
  kernels::flash_attention_backward_bf16(
      dq.data_ptr<BFloat16>(), dk.data_ptr<BFloat16>(), dv.data_ptr<BFloat16>(),
      dout_t.data_ptr<BFloat16>(), qt.data_ptr<BFloat16>(), kt.data_ptr<BFloat16>(),
      vt.data_ptr<BFloat16>(), out_t.data_ptr<BFloat16>(), lse_c.data(), amx_params(s, o));
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
  if (q.dtype() == DType::kBFloat16) {
    const Sizes s = check_qkv(q, k, v, options);
    if (amx_serves(s, options)) return backward_amx(dout, q, k, v, out, lse, s, options);
    return backward<BFloat16>(dout, q, k, v, out, lse, options);
  }
  return backward<float>(dout, q, k, v, out, lse, options);
}

namespace kernels {

const char* sdpa_bf16_path(const Tensor& q, const Tensor& k, const Tensor& v,
                           const SdpaOptions& options) {
  if (is_bf16_reference(q, options)) return "reference (fp32 on the widened values)";
  return amx_serves(check_qkv(q, k, v, options), options) ? "AMX" : "bf16 tiles widened to fp32";
}

}  // namespace kernels

}  // namespace attn
