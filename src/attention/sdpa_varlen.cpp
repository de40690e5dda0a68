// Variable-length packed batches for scaled-dot-product attention (attn/sdpa.h,
// flash_attn_varlen_func's semantics): the Tensor entry points and their checks
// (messages name the values). The sequence views the reference and the fused
// kernel run each sequence through (sdpa_sequence) are in attn/sdpa.h. bf16,
// as src/attention/sdpa.cpp: the fused kernel reads the bf16 tensors in place; the
// reference runs on exact fp32 copies and its outputs are rounded to bf16.
#include <fmt/format.h>

#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "attn/sdpa.h"
#include "attention/sdpa_common.h"

namespace attn {

// ---- the Tensor entry points ---------------------------------------------------------

namespace {

constexpr const char* kWho = "sdpa_varlen";
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

void check_3d(const char* name, const Tensor& t, const char* layout) {
  if (t.dim() != 3)
    fail(fmt::format("{} must be 3-D {} (packed, token-major), got shape {}", name, layout,
                     shape_str(t.shape())));
  if (t.size(1) < 1 || t.size(2) < 1)
    fail(fmt::format("{} {} must have at least one head and a head dim >= 1", name,
                     shape_str(t.shape())));
}

// A (total, H, W) token-major tensor as the (b, h, t) strides of the raw layer (b unused).
SdpaStrides token_major_strides(const Tensor& t) {
  return {0, t.stride(1), t.stride(0), t.size(2) == 1 ? 1 : t.stride(2)};
}

// cu_seqlens as offsets: 1-D int64, at least two entries, 0 first, never
// decreasing, `total` last, every length <= max_seqlen.
std::vector<int64_t> check_cu_seqlens(const char* name, const Tensor& c, int64_t total,
                                      const char* total_name, const char* max_name,
                                      int64_t max_seqlen) {
  if (c.dtype() != DType::kInt64)
    fail(fmt::format("{} must be int64, got {}", name, dtype_name(c.dtype())));
  if (c.dim() != 1 || c.size(0) < 2)
    fail(fmt::format("{} must be 1-D (nseq + 1) with nseq >= 1, got shape {}", name,
                     shape_str(c.shape())));
  std::vector<int64_t> v = c.to_int64_vector();
  if (v[0] != 0) fail(fmt::format("{}[0] must be 0, got {}", name, v[0]));
  for (size_t n = 1; n < v.size(); ++n) {
    if (v[n] < v[n - 1])
      fail(fmt::format("{} must not decrease: {}[{}] = {} after {}[{}] = {}", name, name, n, v[n],
                       name, n - 1, v[n - 1]));
    if (v[n] - v[n - 1] > max_seqlen)
      fail(fmt::format("sequence {} has length {} ({}[{}] - {}[{}]) but {} is {}", n - 1,
                       v[n] - v[n - 1], name, n, name, n - 1, max_name, max_seqlen));
  }
  if (v.back() != total)
    fail(fmt::format("{}[{}] = {} must equal {} = {}", name, v.size() - 1, v.back(), total_name,
                     total));
  return v;
}

template <class T>
struct Prepared {
  Tensor q, k, v, alibi;                            // what the pointers point into
  std::vector<int64_t> cu_seqlens_q, cu_seqlens_k;  // likewise
  SdpaProblemT<T> p;
};

template <class T>
Prepared<T> prepare(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& cu_seqlens_q,
                    const Tensor& cu_seqlens_k, int64_t max_seqlen_q, int64_t max_seqlen_k,
                    const SdpaOptions& o) {
  check_dtypes(q, k, v);
  check_3d("q", q, "(total_q, Hq, D)");
  check_3d("k", k, "(total_k, Hkv, D)");
  check_3d("v", v, "(total_k, Hkv, Dv)");
  const int64_t total_q = q.size(0), total_k = k.size(0);
  const int64_t Hq = q.size(1), Hkv = k.size(1), D = q.size(2), Dv = v.size(2);
  if (v.size(0) != total_k)
    fail(fmt::format("k has {} keys but v has {} values (k {}, v {})", total_k, v.size(0),
                     shape_str(k.shape()), shape_str(v.shape())));
  if (v.size(1) != Hkv)
    fail(fmt::format("k has {} heads but v has {} (k {}, v {})", Hkv, v.size(1),
                     shape_str(k.shape()), shape_str(v.shape())));
  if (k.size(2) != D)
    fail(fmt::format("q and k must have the same head dim: q {} has D = {}, k {} has {}",
                     shape_str(q.shape()), D, shape_str(k.shape()), k.size(2)));
  detail::sdpa::check_heads(kWho, o, Hq, Hkv);
  if (!o.attn_mask.empty())
    fail(
        fmt::format("attn_mask (shape {}) is not supported for packed variable-length batches: the "
                    "sequences are separate by construction; use is_causal, a window or ALiBi",
                    shape_str(o.attn_mask.shape())));
  if (max_seqlen_q < 0 || max_seqlen_k < 0 || max_seqlen_q > kMaxTokens ||
      max_seqlen_k > kMaxTokens)
    fail(fmt::format("max_seqlen_q ({}) and max_seqlen_k ({}) must be in [0, 2^31]", max_seqlen_q,
                     max_seqlen_k));
  detail::sdpa::check_scalar_options(kWho, o);

  Prepared<T> r;
  r.cu_seqlens_q = check_cu_seqlens("cu_seqlens_q", cu_seqlens_q, total_q, "total_q (q.size(0))",
                                    "max_seqlen_q", max_seqlen_q);
  r.cu_seqlens_k = check_cu_seqlens("cu_seqlens_k", cu_seqlens_k, total_k, "total_k (k.size(0))",
                                    "max_seqlen_k", max_seqlen_k);
  const int64_t nseq = int64_t(r.cu_seqlens_q.size()) - 1;
  if (int64_t(r.cu_seqlens_k.size()) - 1 != nseq)
    fail(fmt::format("cu_seqlens_q holds {} sequences but cu_seqlens_k holds {}", nseq,
                     r.cu_seqlens_k.size() - 1));
  r.q = rows_contiguous(q), r.k = rows_contiguous(k), r.v = rows_contiguous(v);
  SdpaProblemT<T>& p = r.p;
  p.B = nseq, p.Hq = Hq, p.Hkv = Hkv, p.Tq = total_q, p.Tk = total_k, p.D = D, p.Dv = Dv;
  p.q = r.q.template data_ptr<T>(), p.k = r.k.template data_ptr<T>(),
  p.v = r.v.template data_ptr<T>();
  p.q_strides = token_major_strides(r.q);
  p.k_strides = token_major_strides(r.k);
  p.v_strides = token_major_strides(r.v);
  p.cu_seqlens_q = r.cu_seqlens_q.data();
  p.cu_seqlens_k = r.cu_seqlens_k.data();
  if (!o.alibi_slopes.empty()) {
    const Tensor& a = o.alibi_slopes;
    check_float32("alibi_slopes", a);
    const bool per_head = a.dim() == 1 && a.size(0) == Hq;
    const bool per_seq = a.dim() == 2 && a.size(0) == nseq && a.size(1) == Hq;
    if (!per_head && !per_seq)
      fail(fmt::format("alibi_slopes must be (Hq) = ({}) or (nseq, Hq) = ({}, {}), got {}", Hq,
                       nseq, Hq, shape_str(a.shape())));
    r.alibi = a.contiguous();
    p.alibi_slopes = r.alibi.template data_ptr<float>();
    p.alibi_b_stride = per_seq ? Hq : 0;
  }
  detail::sdpa::set_options(p, o, D);
  return r;
}

// (total, H, W) contiguous as raw strides.
SdpaStrides packed_strides(int64_t H, int64_t W) { return {0, W, H * W, 1}; }

// The fused kernel on T = float or BFloat16 tensors (the fp32 reference too for float).
template <class T>
SdpaForward forward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& cu_seqlens_q,
                    const Tensor& cu_seqlens_k, int64_t max_seqlen_q, int64_t max_seqlen_k,
                    const SdpaOptions& options) {
  const Prepared<T> r =
      prepare<T>(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, options);
  const SdpaProblemT<T>& p = r.p;
  constexpr DType dtype = dtype_of<T>();
  if (p.Tq == 0 || p.Tk == 0)  // no query, or no key at all: zeros, lse -inf
    return {Tensor::zeros({p.Tq, p.Hq, p.Dv}, dtype),
            Tensor::full({p.Hq, p.Tq}, -std::numeric_limits<float>::infinity())};
  SdpaForward f{Tensor::empty({p.Tq, p.Hq, p.Dv}, dtype), Tensor::empty({p.Hq, p.Tq})};
  const SdpaOutputT<T> o{f.out.template data_ptr<T>(), packed_strides(p.Hq, p.Dv), f.lse.data(),
                         SdpaStrides{0, p.Tq, 1, 1}};
  if constexpr (std::is_same_v<T, float>) {
    if (options.backend == SdpaBackend::kReference) {
      ref::sdpa_forward(o, p);
      return f;
    }
  }
  kernels::sdpa_forward(o, p);
  return f;
}

template <class T>
SdpaGrads backward(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                   const Tensor& out, const Tensor& lse, const Tensor& cu_seqlens_q,
                   const Tensor& cu_seqlens_k, int64_t max_seqlen_q, int64_t max_seqlen_k,
                   const SdpaOptions& options) {
  const Prepared<T> r =
      prepare<T>(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, options);
  const SdpaProblemT<T>& p = r.p;
  const Shape out_shape{p.Tq, p.Hq, p.Dv};
  check_same_dtype("dout", dout, q);
  check_same_dtype("out", out, q);
  check_float32("lse", lse);
  if (dout.shape() != out_shape)
    fail(fmt::format("dout has shape {} but the output is (total_q, Hq, Dv) = {}",
                     shape_str(dout.shape()), shape_str(out_shape)));
  if (out.shape() != out_shape)
    fail(fmt::format("out has shape {} but the output is (total_q, Hq, Dv) = {}",
                     shape_str(out.shape()), shape_str(out_shape)));
  if (lse.shape() != Shape{p.Hq, p.Tq})
    fail(fmt::format("lse has shape {} but must be (Hq, total_q) = {}", shape_str(lse.shape()),
                     shape_str({p.Hq, p.Tq})));
  constexpr DType dtype = dtype_of<T>();
  if (p.Tq == 0 || p.Tk == 0)  // nothing attends: every gradient 0
    return {Tensor::zeros({p.Tq, p.Hq, p.D}, dtype), Tensor::zeros({p.Tk, p.Hkv, p.D}, dtype),
            Tensor::zeros({p.Tk, p.Hkv, p.Dv}, dtype)};
  SdpaGrads g{Tensor::empty({p.Tq, p.Hq, p.D}, dtype), Tensor::empty({p.Tk, p.Hkv, p.D}, dtype),
              Tensor::empty({p.Tk, p.Hkv, p.Dv}, dtype)};
  const Tensor dout_r = rows_contiguous(dout), out_r = rows_contiguous(out);
  const Tensor lse_c = lse.contiguous();
  SdpaBackwardIOT<T> io;
  io.dout = dout_r.template data_ptr<T>(), io.dout_strides = token_major_strides(dout_r);
  io.out = out_r.template data_ptr<T>(), io.out_strides = token_major_strides(out_r);
  io.lse = lse_c.data(), io.lse_strides = SdpaStrides{0, p.Tq, 1, 1};
  io.dq = g.dq.template data_ptr<T>(), io.dk = g.dk.template data_ptr<T>(),
  io.dv = g.dv.template data_ptr<T>();
  io.dq_strides = packed_strides(p.Hq, p.D);
  io.dk_strides = packed_strides(p.Hkv, p.D);
  io.dv_strides = packed_strides(p.Hkv, p.Dv);
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

SdpaForward sdpa_varlen_forward(const Tensor& q, const Tensor& k, const Tensor& v,
                                const Tensor& cu_seqlens_q, const Tensor& cu_seqlens_k,
                                int64_t max_seqlen_q, int64_t max_seqlen_k,
                                const SdpaOptions& options) {
  if (is_bf16_reference(q, options)) {  // the spec on the bf16 values, exactly widened
    check_dtypes(q, k, v);
    const DType f32 = DType::kFloat32;
    SdpaForward f = forward<float>(q.to(f32), k.to(f32), v.to(f32), cu_seqlens_q, cu_seqlens_k,
                                   max_seqlen_q, max_seqlen_k, options);
    f.out = f.out.to(DType::kBFloat16);
    return f;
  }
  return q.dtype() == DType::kBFloat16 ? forward<BFloat16>(q, k, v, cu_seqlens_q, cu_seqlens_k,
                                                           max_seqlen_q, max_seqlen_k, options)
                                       : forward<float>(q, k, v, cu_seqlens_q, cu_seqlens_k,
                                                        max_seqlen_q, max_seqlen_k, options);
}

SdpaGrads sdpa_varlen_backward(const Tensor& dout, const Tensor& q, const Tensor& k,
                               const Tensor& v, const Tensor& out, const Tensor& lse,
                               const Tensor& cu_seqlens_q, const Tensor& cu_seqlens_k,
                               int64_t max_seqlen_q, int64_t max_seqlen_k,
                               const SdpaOptions& options) {
  if (is_bf16_reference(q, options)) {  // the spec on the bf16 values, exactly widened
    check_dtypes(q, k, v);
    check_same_dtype("dout", dout, q);
    check_same_dtype("out", out, q);
    const DType f32 = DType::kFloat32, bf16 = DType::kBFloat16;
    SdpaGrads g = backward<float>(dout.to(f32), q.to(f32), k.to(f32), v.to(f32), out.to(f32), lse,
                                  cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, options);
    return {g.dq.to(bf16), g.dk.to(bf16), g.dv.to(bf16)};
  }
  return q.dtype() == DType::kBFloat16
             ? backward<BFloat16>(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                  max_seqlen_k, options)
             : backward<float>(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                               max_seqlen_k, options);
}

}  // namespace attn
