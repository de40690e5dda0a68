// Scaled-dot-product attention on caller-owned strided memory
// (attn/sdpa_strided.h): the checks, the raw problem, the routed kernels.
#include "attn/sdpa_strided.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "attention/sdpa_common.h"
#include "attn/utf8.h"

namespace attn {

namespace {

[[noreturn]] void fail(const char* who, const std::string& what) { detail::sdpa::fail(who, what); }

// (b, h, t, d) strides of a 4-D tensor (the d stride of a width-1 dim does not matter).
SdpaStrides strides4(const StridedTensor& t) {
  const auto& s = t.strides();
  return {s[0], s[1], s[2], t.sizes()[3] == 1 ? 1 : s[3]};
}
// (b, h, t) strides of a 3-D tensor (lse).
SdpaStrides strides3(const StridedTensor& t) {
  const auto& s = t.strides();
  return {s[0], s[1], s[2], 1};
}
// (total, H, W) token-major tensors as the raw layer's (b, h, t) strides (b unused).
SdpaStrides token_major(const StridedTensor& t) {
  const auto& s = t.strides();
  return {0, s[1], s[0], t.sizes()[2] == 1 ? 1 : s[2]};
}

bool is_bf16(const char* who, const StridedTensor& q) {
  if (q.dtype() == "float32") return false;
  if (q.dtype() == "bfloat16") return true;
  fail(who, fmt::format("q has dtype {}; q, k and v must be float32 or bfloat16",
                        printable(q.dtype())));
}

// The options checked as the Tensor entry points check them (the heads rule,
// dropout, scale, window, softcap), for the batched and the varlen calls alike.
void check_options(const char* who, const SdpaOptions& o, int64_t Hq, int64_t Hkv) {
  detail::sdpa::check_heads(who, o, Hq, Hkv);
  detail::sdpa::check_scalar_options(who, o);
}

// ALiBi slopes, (Hq) or (rows, Hq) float32 with last stride 1, into p: one
// slope per head, or per head of each of the `rows` batches (`rows_name`: "B")
// or sequences ("nseq").
template <class T>
void set_alibi(const char* who, SdpaProblemT<T>& p, const StridedTensor& alibi, int64_t rows,
               const char* rows_name) {
  const int64_t Hq = p.Hq;
  const bool per_head = alibi.sizes() == std::vector<int64_t>{Hq};
  const bool per_row = alibi.sizes() == std::vector<int64_t>{rows, Hq};
  if ((!per_head && !per_row) || alibi.dtype() != "float32")
    fail(who, fmt::format("alibi_slopes must be float32 (Hq) = ({}) or ({}, Hq) = ({}, {})", Hq,
                          rows_name, rows, Hq));
  if (Hq > 1 && alibi.strides().back() != 1) fail(who, "alibi_slopes must have last stride 1");
  p.alibi_slopes = alibi.data<const float>();
  p.alibi_b_stride = per_row ? alibi.strides()[0] : 0;
}

// The raw problem over q, k, v (4-D, one dtype), the optional mask (4-D, each
// size 1 or full: an additive float32 one, or a bool one read in place) and ALiBi slopes ((Hq) or
// (B, Hq), fp32, last stride 1).
template <class T>
SdpaProblemT<T> problem(const char* who, const StridedTensor& q, const StridedTensor& k,
                        const StridedTensor& v, const StridedTensor* mask,
                        const StridedTensor* alibi, const SdpaOptions& o) {
  for (const StridedTensor* t : {&q, &k, &v})
    if (t->sizes().size() != 4) fail(who, fmt::format("{} must be 4-D (B, H, T, D)", t->name()));
  const int64_t B = q.sizes()[0], Hq = q.sizes()[1], Tq = q.sizes()[2], D = q.sizes()[3];
  const int64_t Hkv = k.sizes()[1], Tk = k.sizes()[2], Dv = v.sizes()[3];
  k.expect({B, Hkv, Tk, D}, q.dtype());
  v.expect({B, Hkv, Tk, Dv}, q.dtype());
  check_options(who, o, Hq, Hkv);

  SdpaProblemT<T> p;
  p.B = B, p.Hq = Hq, p.Hkv = Hkv, p.Tq = Tq, p.Tk = Tk, p.D = D, p.Dv = Dv;
  p.q = q.data<const T>(), p.k = k.data<const T>(), p.v = v.data<const T>();
  p.q_strides = strides4(q), p.k_strides = strides4(k), p.v_strides = strides4(v);
  if (mask) {
    const std::vector<int64_t> full{B, Hq, Tq, Tk};
    const bool boolean = mask->dtype() == "bool";
    if (mask->sizes().size() != 4 || (mask->dtype() != "float32" && !boolean))
      fail(who,
           "attn_mask must reach the kernel as a 4-D float32 additive mask or a 4-D bool mask");
    int64_t st[4];
    for (size_t d = 0; d < 4; ++d) {
      if (mask->sizes()[d] != 1 && mask->sizes()[d] != full[d])
        fail(who, fmt::format("attn_mask ({}) does not broadcast to ({})",
                              fmt::join(mask->sizes(), ", "), fmt::join(full, ", ")));
      st[d] = mask->sizes()[d] == 1 ? 0 : mask->strides()[d];
    }
    if (boolean)
      p.bool_mask = mask->data<const uint8_t>();
    else
      p.mask = mask->data<const float>();
    p.mask_strides = {st[0], st[1], st[2], st[3]};
  }
  if (alibi) set_alibi(who, p, *alibi, B, "B");
  detail::sdpa::set_options(p, o, D);
  return p;
}

template <class T>
void forward_as(const char* who, const StridedTensor& q, const StridedTensor& k,
                const StridedTensor& v, const StridedTensor& out, const StridedTensor& lse,
                const StridedTensor* mask, const StridedTensor* alibi, const SdpaOptions& opt) {
  const SdpaProblemT<T> p = problem<T>(who, q, k, v, mask, alibi, opt);
  out.expect({p.B, p.Hq, p.Tq, p.Dv}, q.dtype());
  lse.expect({p.B, p.Hq, p.Tq}, "float32");
  SdpaOutputT<T> o;
  o.out = out.data<T>();
  o.out_strides = strides4(out);
  o.lse = lse.data<float>();
  o.lse_strides = strides3(lse);
  sdpa_forward_routed(o, p);
}

template <class T>
void backward_as(const char* who, const StridedTensor& dout, const StridedTensor& q,
                 const StridedTensor& k, const StridedTensor& v, const StridedTensor& out,
                 const StridedTensor& lse, const StridedTensor& dq, const StridedTensor& dk,
                 const StridedTensor& dv, const StridedTensor* mask, const StridedTensor* alibi,
                 const SdpaOptions& opt) {
  const SdpaProblemT<T> p = problem<T>(who, q, k, v, mask, alibi, opt);
  const std::string& dtype = q.dtype();
  dout.expect({p.B, p.Hq, p.Tq, p.Dv}, dtype);
  out.expect({p.B, p.Hq, p.Tq, p.Dv}, dtype);
  lse.expect({p.B, p.Hq, p.Tq}, "float32");
  dq.expect({p.B, p.Hq, p.Tq, p.D}, dtype);
  dk.expect({p.B, p.Hkv, p.Tk, p.D}, dtype);
  dv.expect({p.B, p.Hkv, p.Tk, p.Dv}, dtype);
  SdpaBackwardIOT<T> io;
  io.dout = dout.data<const T>(), io.dout_strides = strides4(dout);
  io.out = out.data<const T>(), io.out_strides = strides4(out);
  io.lse = lse.data<const float>(), io.lse_strides = strides3(lse);
  io.dq = dq.data<T>(), io.dq_strides = strides4(dq);
  io.dk = dk.data<T>(), io.dk_strides = strides4(dk);
  io.dv = dv.data<T>(), io.dv_strides = strides4(dv);
  sdpa_backward_routed(io, p);
}

// ---- variable-length packed batches -------------------------------------------------------

// cu_seqlens as offsets: 0 first, never decreasing, `total` last, every length <= max_seqlen.
void check_cu_seqlens(const char* who, const char* name, const std::vector<int64_t>& c,
                      int64_t total, int64_t max_seqlen) {
  if (c.size() < 2) fail(who, fmt::format("{} must hold nseq + 1 >= 2 offsets", name));
  if (c[0] != 0) fail(who, fmt::format("{}[0] must be 0, got {}", name, c[0]));
  for (size_t n = 1; n < c.size(); ++n) {
    if (c[n] < c[n - 1])
      fail(who, fmt::format("{} must not decrease: {}[{}] = {} after {}", name, name, n, c[n],
                            c[n - 1]));
    if (c[n] - c[n - 1] > max_seqlen)
      fail(who, fmt::format("sequence {} of {} has length {} > max_seqlen {}", n - 1, name,
                            c[n] - c[n - 1], max_seqlen));
  }
  if (c.back() != total)
    fail(who, fmt::format("{} ends at {} but the tensor has {} tokens", name, c.back(), total));
}

// The problem's cu_seqlens point into the caller's vectors, which outlive the call.
template <class T>
SdpaProblemT<T> varlen_problem(const char* who, const StridedTensor& q, const StridedTensor& k,
                               const StridedTensor& v, const std::vector<int64_t>& cu_q,
                               const std::vector<int64_t>& cu_k, int64_t max_q, int64_t max_k,
                               const StridedTensor* alibi, const SdpaOptions& o) {
  for (const StridedTensor* t : {&q, &k, &v})
    if (t->sizes().size() != 3) fail(who, fmt::format("{} must be 3-D (total, H, D)", t->name()));
  const int64_t total_q = q.sizes()[0], Hq = q.sizes()[1], D = q.sizes()[2];
  const int64_t total_k = k.sizes()[0], Hkv = k.sizes()[1], Dv = v.sizes()[2];
  k.expect({total_k, Hkv, D}, q.dtype());
  v.expect({total_k, Hkv, Dv}, q.dtype());
  check_cu_seqlens(who, "cu_seqlens_q", cu_q, total_q, max_q);
  check_cu_seqlens(who, "cu_seqlens_k", cu_k, total_k, max_k);
  const int64_t nseq = int64_t(cu_q.size()) - 1;
  if (int64_t(cu_k.size()) - 1 != nseq)
    fail(who, fmt::format("cu_seqlens_q holds {} sequences but cu_seqlens_k holds {}", nseq,
                          cu_k.size() - 1));
  check_options(who, o, Hq, Hkv);
  SdpaProblemT<T> p;
  p.B = nseq, p.Hq = Hq, p.Hkv = Hkv, p.Tq = total_q, p.Tk = total_k, p.D = D, p.Dv = Dv;
  p.q = q.data<const T>(), p.k = k.data<const T>(), p.v = v.data<const T>();
  p.q_strides = token_major(q), p.k_strides = token_major(k), p.v_strides = token_major(v);
  p.cu_seqlens_q = cu_q.data();
  p.cu_seqlens_k = cu_k.data();
  if (alibi) set_alibi(who, p, *alibi, nseq, "nseq");
  detail::sdpa::set_options(p, o, D);
  return p;
}

template <class T>
void varlen_forward_as(const char* who, const StridedTensor& q, const StridedTensor& k,
                       const StridedTensor& v, const StridedTensor& out, const StridedTensor& lse,
                       const std::vector<int64_t>& cu_q, const std::vector<int64_t>& cu_k,
                       int64_t max_q, int64_t max_k, const StridedTensor* alibi,
                       const SdpaOptions& opt) {
  const SdpaProblemT<T> p = varlen_problem<T>(who, q, k, v, cu_q, cu_k, max_q, max_k, alibi, opt);
  out.expect({p.Tq, p.Hq, p.Dv}, q.dtype());
  lse.expect({p.Hq, p.Tq}, "float32");
  SdpaOutputT<T> o;
  o.out = out.data<T>();
  o.out_strides = token_major(out);
  o.lse = lse.data<float>();
  o.lse_strides = SdpaStrides{0, lse.strides()[0], lse.strides()[1], 1};
  sdpa_forward_routed(o, p);
}

template <class T>
void varlen_backward_as(const char* who, const StridedTensor& dout, const StridedTensor& q,
                        const StridedTensor& k, const StridedTensor& v, const StridedTensor& out,
                        const StridedTensor& lse, const StridedTensor& dq,
                        const StridedTensor& dk, const StridedTensor& dv,
                        const std::vector<int64_t>& cu_q, const std::vector<int64_t>& cu_k,
                        int64_t max_q, int64_t max_k, const StridedTensor* alibi,
                        const SdpaOptions& opt) {
  const SdpaProblemT<T> p = varlen_problem<T>(who, q, k, v, cu_q, cu_k, max_q, max_k, alibi, opt);
  const std::string& dtype = q.dtype();
  dout.expect({p.Tq, p.Hq, p.Dv}, dtype);
  out.expect({p.Tq, p.Hq, p.Dv}, dtype);
  lse.expect({p.Hq, p.Tq}, "float32");
  dq.expect({p.Tq, p.Hq, p.D}, dtype);
  dk.expect({p.Tk, p.Hkv, p.D}, dtype);
  dv.expect({p.Tk, p.Hkv, p.Dv}, dtype);
  SdpaBackwardIOT<T> io;
  io.dout = dout.data<const T>(), io.dout_strides = token_major(dout);
  io.out = out.data<const T>(), io.out_strides = token_major(out);
  io.lse = lse.data<const float>();
  io.lse_strides = SdpaStrides{0, lse.strides()[0], lse.strides()[1], 1};
  io.dq = dq.data<T>(), io.dq_strides = token_major(dq);
  io.dk = dk.data<T>(), io.dk_strides = token_major(dk);
  io.dv = dv.data<T>(), io.dv_strides = token_major(dv);
  sdpa_backward_routed(io, p);
}

}  // namespace

StridedTensor::StridedTensor(const char* who, const char* name, uintptr_t data, std::string dtype,
                             std::vector<int64_t> sizes, std::vector<int64_t> strides)
    : who_(who),
      name_(name),
      data_(data),
      dtype_(std::move(dtype)),
      sizes_(std::move(sizes)),
      strides_(std::move(strides)) {
  if (sizes_.size() != strides_.size())
    fail(who_, fmt::format("{}: {} sizes but {} strides", name_, sizes_.size(), strides_.size()));
  for (size_t d = 0; d < sizes_.size(); ++d) {
    if (sizes_[d] < 1) fail(who_, fmt::format("{}: every size must be >= 1", name_));
    if (strides_[d] < 0) fail(who_, fmt::format("{}: strides must be >= 0", name_));
  }
  if (data_ == 0) fail(who_, fmt::format("{}: null data pointer", name_));
}

void StridedTensor::expect(const std::vector<int64_t>& sizes, const std::string& dtype) const {
  if (sizes_ != sizes)
    fail(who_, fmt::format("{} has sizes ({}), expected ({})", name_, fmt::join(sizes_, ", "),
                           fmt::join(sizes, ", ")));
  if (dtype_ != dtype)
    fail(who_, fmt::format("{} has dtype {}, expected {}", name_, printable(dtype_), dtype));
}

void sdpa_forward_strided(const char* who, const StridedTensor& q, const StridedTensor& k,
                          const StridedTensor& v, const StridedTensor& out,
                          const StridedTensor& lse, const StridedTensor* attn_mask,
                          const StridedTensor* alibi_slopes, const SdpaOptions& options) {
  if (is_bf16(who, q))
    forward_as<BFloat16>(who, q, k, v, out, lse, attn_mask, alibi_slopes, options);
  else
    forward_as<float>(who, q, k, v, out, lse, attn_mask, alibi_slopes, options);
}

void sdpa_backward_strided(const char* who, const StridedTensor& dout, const StridedTensor& q,
                           const StridedTensor& k, const StridedTensor& v,
                           const StridedTensor& out, const StridedTensor& lse,
                           const StridedTensor& dq, const StridedTensor& dk,
                           const StridedTensor& dv, const StridedTensor* attn_mask,
                           const StridedTensor* alibi_slopes, const SdpaOptions& options) {
  if (is_bf16(who, q))
    backward_as<BFloat16>(who, dout, q, k, v, out, lse, dq, dk, dv, attn_mask, alibi_slopes,
                          options);
  else
    backward_as<float>(who, dout, q, k, v, out, lse, dq, dk, dv, attn_mask, alibi_slopes,
                       options);
}

std::string sdpa_path_strided(const char* who, const StridedTensor& q, const StridedTensor& k,
                              const StridedTensor& v, const StridedTensor* attn_mask,
                              const StridedTensor* alibi_slopes, const SdpaOptions& options) {
  if (!is_bf16(who, q)) {
    problem<float>(who, q, k, v, attn_mask, alibi_slopes, options);  // checked as the call is
    return "fp32 kernel";
  }
  return kernels::sdpa_bf16_path(
      problem<BFloat16>(who, q, k, v, attn_mask, alibi_slopes, options));
}

void sdpa_varlen_forward_strided(const char* who, const StridedTensor& q, const StridedTensor& k,
                                 const StridedTensor& v, const StridedTensor& out,
                                 const StridedTensor& lse, const std::vector<int64_t>& cu_seqlens_q,
                                 const std::vector<int64_t>& cu_seqlens_k, int64_t max_seqlen_q,
                                 int64_t max_seqlen_k, const StridedTensor* alibi_slopes,
                                 const SdpaOptions& options) {
  if (is_bf16(who, q))
    varlen_forward_as<BFloat16>(who, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                max_seqlen_k, alibi_slopes, options);
  else
    varlen_forward_as<float>(who, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                             max_seqlen_k, alibi_slopes, options);
}

void sdpa_varlen_backward_strided(
    const char* who, const StridedTensor& dout, const StridedTensor& q, const StridedTensor& k,
    const StridedTensor& v, const StridedTensor& out, const StridedTensor& lse,
    const StridedTensor& dq, const StridedTensor& dk, const StridedTensor& dv,
    const std::vector<int64_t>& cu_seqlens_q, const std::vector<int64_t>& cu_seqlens_k,
    int64_t max_seqlen_q, int64_t max_seqlen_k, const StridedTensor* alibi_slopes,
    const SdpaOptions& options) {
  if (is_bf16(who, q))
    varlen_backward_as<BFloat16>(who, dout, q, k, v, out, lse, dq, dk, dv, cu_seqlens_q,
                                 cu_seqlens_k, max_seqlen_q, max_seqlen_k, alibi_slopes, options);
  else
    varlen_backward_as<float>(who, dout, q, k, v, out, lse, dq, dk, dv, cu_seqlens_q,
                              cu_seqlens_k, max_seqlen_q, max_seqlen_k, alibi_slopes, options);
}

void sdpa_dropout_noise_strided(const char* who, const StridedTensor& noise, float dropout_p,
                                uint64_t dropout_seed) {
  if (noise.sizes().size() != 4 || noise.dtype() != "float32")
    fail(who, "noise must be a 4-D float32 (B, H, Tq, Tk)");
  if (!(dropout_p >= 0.0f && dropout_p < 1.0f))
    fail(who, fmt::format("dropout_p must be in [0, 1), got {}", dropout_p));
  const auto& n = noise.sizes();
  const auto& s = noise.strides();
  kernels::sdpa_dropout_noise(noise.data<float>(), {s[0], s[1], s[2], s[3]}, n[0], n[1], n[2],
                              n[3], dropout_p, dropout_seed);
}

}  // namespace attn
