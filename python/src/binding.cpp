// binding.cpp - attn._attn, the extension module under the Python package attn
// (python/attn/__init__.py is the public API; docs/python.md).
//
// No PyTorch here: a tensor crosses as a "ref", the tuple
//   (data pointer, dtype name, sizes, strides in elements)
// that python/attn/_sdpa.py builds from a torch tensor (tensor.data_ptr(),
// tensor.size(), tensor.stride()), so the kernels read and write the caller's
// memory in place and one build serves every PyTorch version. The Python side
// checks shapes and dtypes first with PyTorch's messages; the checks here are
// the last line (a bad ref must never reach a kernel) and throw
// std::invalid_argument, which pybind11 raises as ValueError.
//
// The kernels run with the GIL released, on `threads` OpenMP threads (the
// caller's choice: torch.get_num_threads() unless attn.set_num_threads was
// called); the calling thread's OpenMP setting is restored afterwards, as it
// may be PyTorch's own (Debian's PyTorch shares this libgomp).
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <omp.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "attn/kernels.h"
#include "attn/sdpa.h"
#include "attn/tensor.h"
#include "attn/tokenizer.h"
#include "attn/utf8.h"
#include "kernels/philox.h"
#include "nn/sdpa_common.h"

namespace py = pybind11;

namespace {

constexpr const char* kWho = "attn._attn";

// (data pointer, dtype name, sizes, strides)
using Ref = std::tuple<uintptr_t, std::string, std::vector<int64_t>, std::vector<int64_t>>;

[[noreturn]] void fail(const std::string& what) { attn::detail::sdpa::fail(kWho, what); }

struct View {
  const char* name;
  uintptr_t ptr;
  std::string dtype;
  std::vector<int64_t> sizes, strides;

  View(const char* n, const Ref& r)
      : name(n),
        ptr(std::get<0>(r)),
        dtype(std::get<1>(r)),
        sizes(std::get<2>(r)),
        strides(std::get<3>(r)) {
    if (sizes.size() != strides.size())
      fail(fmt::format("{}: {} sizes but {} strides", name, sizes.size(), strides.size()));
    for (size_t d = 0; d < sizes.size(); ++d) {
      if (sizes[d] < 1) fail(fmt::format("{}: every size must be >= 1", name));
      if (strides[d] < 0) fail(fmt::format("{}: strides must be >= 0", name));
    }
    if (ptr == 0) fail(fmt::format("{}: null data pointer", name));
  }
  void expect(const std::vector<int64_t>& want, const char* want_dtype) const {
    if (sizes != want)
      fail(fmt::format("{} has sizes ({}), expected ({})", name, fmt::join(sizes, ", "),
                       fmt::join(want, ", ")));
    if (dtype != want_dtype)
      fail(fmt::format("{} has dtype {}, expected {}", name, attn::printable(dtype), want_dtype));
  }
  // (b, h, t, d) strides of a 4-D ref (the d stride of a width-1 dim does not matter).
  attn::SdpaStrides strides4() const {
    return {strides[0], strides[1], strides[2], sizes[3] == 1 ? 1 : strides[3]};
  }
  // (b, h, t) strides of a 3-D ref (lse).
  attn::SdpaStrides strides3() const { return {strides[0], strides[1], strides[2], 1}; }
  template <class T>
  T* data() const {
    return reinterpret_cast<T*>(ptr);
  }
};

struct Options {
  bool is_causal = false;
  bool bottom_right = false;
  std::optional<float> scale;
  float softcap = 0.0f;
  int64_t window_left = -1, window_right = -1;
  float dropout_p = 0.0f;
  uint64_t dropout_seed = 0;
  bool enable_gqa = false;
};

// The problem over q, k, v (4-D refs of one dtype), the optional additive fp32
// mask (4-D, each size 1 or full) and ALiBi slopes ((Hq) or (B, Hq), fp32, last stride 1).
// The Python call's options as attn's, checked as the C++ entry points check
// them (the heads rule, dropout, scale, window, softcap), for the batched and
// the varlen calls alike.
attn::SdpaOptions sdpa_options(const Options& opt, int64_t Hq, int64_t Hkv) {
  attn::SdpaOptions o;
  o.enable_gqa = opt.enable_gqa;
  o.dropout_p = opt.dropout_p;
  o.dropout_seed = opt.dropout_seed;
  o.is_causal = opt.is_causal;
  o.causal_alignment =
      opt.bottom_right ? attn::CausalAlignment::kBottomRight : attn::CausalAlignment::kTopLeft;
  o.scale = opt.scale;
  o.window_left = opt.window_left, o.window_right = opt.window_right;
  o.softcap = opt.softcap;
  attn::detail::sdpa::check_heads(kWho, o, Hq, Hkv);
  attn::detail::sdpa::check_scalar_options(kWho, o);
  return o;
}

template <class T>
attn::SdpaProblemT<T> problem(const View& q, const View& k, const View& v,
                              const std::optional<View>& mask, const std::optional<View>& alibi,
                              const Options& opt) {
  for (const View* t : {&q, &k, &v})
    if (t->sizes.size() != 4) fail(fmt::format("{} must be 4-D (B, H, T, D)", t->name));
  const int64_t B = q.sizes[0], Hq = q.sizes[1], Tq = q.sizes[2], D = q.sizes[3];
  const int64_t Hkv = k.sizes[1], Tk = k.sizes[2], Dv = v.sizes[3];
  k.expect({B, Hkv, Tk, D}, q.dtype.c_str());
  v.expect({B, Hkv, Tk, Dv}, q.dtype.c_str());
  const attn::SdpaOptions o = sdpa_options(opt, Hq, Hkv);

  attn::SdpaProblemT<T> p;
  p.B = B, p.Hq = Hq, p.Hkv = Hkv, p.Tq = Tq, p.Tk = Tk, p.D = D, p.Dv = Dv;
  p.q = q.data<const T>(), p.k = k.data<const T>(), p.v = v.data<const T>();
  p.q_strides = q.strides4(), p.k_strides = k.strides4(), p.v_strides = v.strides4();
  if (mask) {
    const std::vector<int64_t> full{B, Hq, Tq, Tk};
    if (mask->sizes.size() != 4 || mask->dtype != "float32")
      fail("attn_mask must reach the kernel as a 4-D float32 additive mask");
    int64_t st[4];
    for (size_t d = 0; d < 4; ++d) {
      if (mask->sizes[d] != 1 && mask->sizes[d] != full[d])
        fail(fmt::format("attn_mask ({}) does not broadcast to ({})", fmt::join(mask->sizes, ", "),
                         fmt::join(full, ", ")));
      st[d] = mask->sizes[d] == 1 ? 0 : mask->strides[d];
    }
    p.mask = mask->data<const float>();
    p.mask_strides = {st[0], st[1], st[2], st[3]};
  }
  if (alibi) {
    const bool per_head = alibi->sizes == std::vector<int64_t>{Hq};
    const bool per_batch = alibi->sizes == std::vector<int64_t>{B, Hq};
    if ((!per_head && !per_batch) || alibi->dtype != "float32")
      fail(fmt::format("alibi_slopes must be float32 (Hq) = ({}) or (B, Hq) = ({}, {})", Hq, B,
                       Hq));
    if (Hq > 1 && alibi->strides.back() != 1) fail("alibi_slopes must have last stride 1");
    p.alibi_slopes = alibi->data<const float>();
    p.alibi_b_stride = per_batch ? alibi->strides[0] : 0;
  }
  attn::detail::sdpa::set_options(p, o, D);
  return p;
}

// Runs f on `threads` OpenMP threads with the GIL released, then restores the
// calling thread's OpenMP setting.
template <class F>
void run(int threads, F&& f) {
  py::gil_scoped_release release;
  const int before = omp_get_max_threads();
  if (threads > 0) omp_set_num_threads(threads);
  try {
    f();
  } catch (...) {
    omp_set_num_threads(before);
    throw;
  }
  omp_set_num_threads(before);
}

std::optional<View> optional_view(const char* name, const std::optional<Ref>& r) {
  if (!r) return std::nullopt;
  return View(name, *r);
}

template <class T>
void forward_as(const View& q, const View& k, const View& v, const View& out, const View& lse,
                const std::optional<View>& mask, const std::optional<View>& alibi,
                const Options& opt, int threads) {
  const attn::SdpaProblemT<T> p = problem<T>(q, k, v, mask, alibi, opt);
  out.expect({p.B, p.Hq, p.Tq, p.Dv}, q.dtype.c_str());
  lse.expect({p.B, p.Hq, p.Tq}, "float32");
  attn::SdpaOutputT<T> o;
  o.out = out.data<T>();
  o.out_strides = out.strides4();
  o.lse = lse.data<float>();
  o.lse_strides = lse.strides3();
  run(threads, [&] { attn::sdpa_forward_routed(o, p); });
}

template <class T>
void backward_as(const View& dout, const View& q, const View& k, const View& v, const View& out,
                 const View& lse, const View& dq, const View& dk, const View& dv,
                 const std::optional<View>& mask, const std::optional<View>& alibi,
                 const Options& opt, int threads) {
  const attn::SdpaProblemT<T> p = problem<T>(q, k, v, mask, alibi, opt);
  const char* dtype = q.dtype.c_str();
  dout.expect({p.B, p.Hq, p.Tq, p.Dv}, dtype);
  out.expect({p.B, p.Hq, p.Tq, p.Dv}, dtype);
  lse.expect({p.B, p.Hq, p.Tq}, "float32");
  dq.expect({p.B, p.Hq, p.Tq, p.D}, dtype);
  dk.expect({p.B, p.Hkv, p.Tk, p.D}, dtype);
  dv.expect({p.B, p.Hkv, p.Tk, p.Dv}, dtype);
  attn::SdpaBackwardIOT<T> io;
  io.dout = dout.data<const T>(), io.dout_strides = dout.strides4();
  io.out = out.data<const T>(), io.out_strides = out.strides4();
  io.lse = lse.data<const float>(), io.lse_strides = lse.strides3();
  io.dq = dq.data<T>(), io.dq_strides = dq.strides4();
  io.dk = dk.data<T>(), io.dk_strides = dk.strides4();
  io.dv = dv.data<T>(), io.dv_strides = dv.strides4();
  run(threads, [&] { attn::sdpa_backward_routed(io, p); });
}

// ---- variable-length packed batches (attn::sdpa_varlen_*'s raw form) ---------------

// cu_seqlens as offsets: 0 first, never decreasing, `total` last, every length <= max_seqlen.
std::vector<int64_t> check_cu_seqlens(const char* name, std::vector<int64_t> c, int64_t total,
                                      int64_t max_seqlen) {
  if (c.size() < 2) fail(fmt::format("{} must hold nseq + 1 >= 2 offsets", name));
  if (c[0] != 0) fail(fmt::format("{}[0] must be 0, got {}", name, c[0]));
  for (size_t n = 1; n < c.size(); ++n) {
    if (c[n] < c[n - 1])
      fail(fmt::format("{} must not decrease: {}[{}] = {} after {}", name, name, n, c[n],
                       c[n - 1]));
    if (c[n] - c[n - 1] > max_seqlen)
      fail(fmt::format("sequence {} of {} has length {} > max_seqlen {}", n - 1, name,
                       c[n] - c[n - 1], max_seqlen));
  }
  if (c.back() != total)
    fail(fmt::format("{} ends at {} but the tensor has {} tokens", name, c.back(), total));
  return c;
}

// (total, H, W) token-major refs as the raw layer's (b, h, t) strides (b unused).
attn::SdpaStrides token_major(const View& t) {
  return {0, t.strides[1], t.strides[0], t.sizes[2] == 1 ? 1 : t.strides[2]};
}

struct Varlen {
  std::vector<int64_t> cu_q, cu_k;  // what the problem's pointers point into
};

template <class T>
attn::SdpaProblemT<T> varlen_problem(Varlen& keep, const View& q, const View& k, const View& v,
                                     const std::vector<int64_t>& cu_q,
                                     const std::vector<int64_t>& cu_k, int64_t max_q,
                                     int64_t max_k, const std::optional<View>& alibi,
                                     const Options& opt) {
  for (const View* t : {&q, &k, &v})
    if (t->sizes.size() != 3) fail(fmt::format("{} must be 3-D (total, H, D)", t->name));
  const int64_t total_q = q.sizes[0], Hq = q.sizes[1], D = q.sizes[2];
  const int64_t total_k = k.sizes[0], Hkv = k.sizes[1], Dv = v.sizes[2];
  k.expect({total_k, Hkv, D}, q.dtype.c_str());
  v.expect({total_k, Hkv, Dv}, q.dtype.c_str());
  keep.cu_q = check_cu_seqlens("cu_seqlens_q", cu_q, total_q, max_q);
  keep.cu_k = check_cu_seqlens("cu_seqlens_k", cu_k, total_k, max_k);
  const int64_t nseq = int64_t(keep.cu_q.size()) - 1;
  if (int64_t(keep.cu_k.size()) - 1 != nseq)
    fail(fmt::format("cu_seqlens_q holds {} sequences but cu_seqlens_k holds {}", nseq,
                     keep.cu_k.size() - 1));
  const attn::SdpaOptions o = sdpa_options(opt, Hq, Hkv);
  attn::SdpaProblemT<T> p;
  p.B = nseq, p.Hq = Hq, p.Hkv = Hkv, p.Tq = total_q, p.Tk = total_k, p.D = D, p.Dv = Dv;
  p.q = q.data<const T>(), p.k = k.data<const T>(), p.v = v.data<const T>();
  p.q_strides = token_major(q), p.k_strides = token_major(k), p.v_strides = token_major(v);
  p.cu_seqlens_q = keep.cu_q.data();
  p.cu_seqlens_k = keep.cu_k.data();
  if (alibi) {
    const bool per_head = alibi->sizes == std::vector<int64_t>{Hq};
    const bool per_seq = alibi->sizes == std::vector<int64_t>{nseq, Hq};
    if ((!per_head && !per_seq) || alibi->dtype != "float32")
      fail(fmt::format("alibi_slopes must be float32 (Hq) = ({}) or (nseq, Hq) = ({}, {})", Hq,
                       nseq, Hq));
    if (Hq > 1 && alibi->strides.back() != 1) fail("alibi_slopes must have last stride 1");
    p.alibi_slopes = alibi->data<const float>();
    p.alibi_b_stride = per_seq ? alibi->strides[0] : 0;
  }
  attn::detail::sdpa::set_options(p, o, D);
  return p;
}

template <class T>
void varlen_forward_as(const View& q, const View& k, const View& v, const View& out,
                       const View& lse, const std::vector<int64_t>& cu_q,
                       const std::vector<int64_t>& cu_k, int64_t max_q, int64_t max_k,
                       const std::optional<View>& alibi, const Options& opt, int threads) {
  Varlen keep;
  const attn::SdpaProblemT<T> p =
      varlen_problem<T>(keep, q, k, v, cu_q, cu_k, max_q, max_k, alibi, opt);
  out.expect({p.Tq, p.Hq, p.Dv}, q.dtype.c_str());
  lse.expect({p.Hq, p.Tq}, "float32");
  attn::SdpaOutputT<T> o;
  o.out = out.data<T>();
  o.out_strides = token_major(out);
  o.lse = lse.data<float>();
  o.lse_strides = attn::SdpaStrides{0, lse.strides[0], lse.strides[1], 1};
  run(threads, [&] { attn::sdpa_forward_routed(o, p); });
}

template <class T>
void varlen_backward_as(const View& dout, const View& q, const View& k, const View& v,
                        const View& out, const View& lse, const View& dq, const View& dk,
                        const View& dv, const std::vector<int64_t>& cu_q,
                        const std::vector<int64_t>& cu_k, int64_t max_q, int64_t max_k,
                        const std::optional<View>& alibi, const Options& opt, int threads) {
  Varlen keep;
  const attn::SdpaProblemT<T> p =
      varlen_problem<T>(keep, q, k, v, cu_q, cu_k, max_q, max_k, alibi, opt);
  const char* dtype = q.dtype.c_str();
  dout.expect({p.Tq, p.Hq, p.Dv}, dtype);
  out.expect({p.Tq, p.Hq, p.Dv}, dtype);
  lse.expect({p.Hq, p.Tq}, "float32");
  dq.expect({p.Tq, p.Hq, p.D}, dtype);
  dk.expect({p.Tk, p.Hkv, p.D}, dtype);
  dv.expect({p.Tk, p.Hkv, p.Dv}, dtype);
  attn::SdpaBackwardIOT<T> io;
  io.dout = dout.data<const T>(), io.dout_strides = token_major(dout);
  io.out = out.data<const T>(), io.out_strides = token_major(out);
  io.lse = lse.data<const float>();
  io.lse_strides = attn::SdpaStrides{0, lse.strides[0], lse.strides[1], 1};
  io.dq = dq.data<T>(), io.dq_strides = token_major(dq);
  io.dk = dk.data<T>(), io.dk_strides = token_major(dk);
  io.dv = dv.data<T>(), io.dv_strides = token_major(dv);
  run(threads, [&] { attn::sdpa_backward_routed(io, p); });
}

bool is_bf16(const View& q) {
  if (q.dtype == "float32") return false;
  if (q.dtype == "bfloat16") return true;
  fail(fmt::format("q has dtype {}; q, k and v must be float32 or bfloat16",
                   attn::printable(q.dtype)));
}

Options options_of(bool is_causal, bool bottom_right, std::optional<float> scale, float softcap,
                   int64_t window_left, int64_t window_right, float dropout_p,
                   uint64_t dropout_seed, bool enable_gqa) {
  return {is_causal,    bottom_right, scale,       softcap,   window_left,
          window_right, dropout_p,    dropout_seed, enable_gqa};
}

}  // namespace

PYBIND11_MODULE(_attn, m) {
  m.doc() = "attn's kernels on raw tensor refs (python/attn is the API; docs/python.md)";
  // ATTN_SIMD_TARGET, ATTN_BF16_PATH and ATTN_GEMV_BF16_PATH force a path here
  // as in the attn CLI (docs/gemm.md); an unknown name fails the import with an
  // ImportError naming the valid ones.
  attn::kernels::apply_path_environment();

  m.def(
      "sdpa_forward",
      [](const Ref& q, const Ref& k, const Ref& v, const Ref& out, const Ref& lse,
         const std::optional<Ref>& mask, const std::optional<Ref>& alibi, bool is_causal,
         bool bottom_right, std::optional<float> scale, float softcap, int64_t window_left,
         int64_t window_right, float dropout_p, uint64_t dropout_seed, bool enable_gqa,
         int threads) {
        const View qv("query", q), kv("key", k), vv("value", v), ov("out", out), lv("lse", lse);
        const Options opt = options_of(is_causal, bottom_right, scale, softcap, window_left,
                                       window_right, dropout_p, dropout_seed, enable_gqa);
        const auto mv = optional_view("attn_mask", mask), av = optional_view("alibi_slopes", alibi);
        if (is_bf16(qv))
          forward_as<attn::BFloat16>(qv, kv, vv, ov, lv, mv, av, opt, threads);
        else
          forward_as<float>(qv, kv, vv, ov, lv, mv, av, opt, threads);
      },
      py::arg("q"), py::arg("k"), py::arg("v"), py::arg("out"), py::arg("lse"), py::arg("mask"),
      py::arg("alibi"), py::arg("is_causal"), py::arg("bottom_right"), py::arg("scale"),
      py::arg("softcap"), py::arg("window_left"), py::arg("window_right"), py::arg("dropout_p"),
      py::arg("dropout_seed"), py::arg("enable_gqa"), py::arg("threads"),
      "Writes out (B, Hq, Tq, Dv) and lse (B, Hq, Tq) in place: attn's fused sdpa kernel.");

  m.def(
      "sdpa_path",
      [](const Ref& q, const Ref& k, const Ref& v, const std::optional<Ref>& mask,
         const std::optional<Ref>& alibi, bool is_causal, bool bottom_right,
         std::optional<float> scale, float softcap, int64_t window_left, int64_t window_right,
         float dropout_p, uint64_t dropout_seed, bool enable_gqa) {
        const View qv("query", q), kv("key", k), vv("value", v);
        const Options opt = options_of(is_causal, bottom_right, scale, softcap, window_left,
                                       window_right, dropout_p, dropout_seed, enable_gqa);
        const auto mv = optional_view("attn_mask", mask), av = optional_view("alibi_slopes", alibi);
        if (!is_bf16(qv)) {
          problem<float>(qv, kv, vv, mv, av, opt);  // checked as the call would be
          return std::string("fp32 kernel");
        }
        return std::string(
            attn::kernels::sdpa_bf16_path(problem<attn::BFloat16>(qv, kv, vv, mv, av, opt)));
      },
      py::arg("q"), py::arg("k"), py::arg("v"), py::arg("mask"), py::arg("alibi"),
      py::arg("is_causal"), py::arg("bottom_right"), py::arg("scale"), py::arg("softcap"),
      py::arg("window_left"), py::arg("window_right"), py::arg("dropout_p"),
      py::arg("dropout_seed"), py::arg("enable_gqa"),
      "The path sdpa_forward and sdpa_backward take for this call: \"fp32 kernel\", or "
      "attn::kernels::sdpa_bf16_path's \"AMX\", \"AVX512-BF16\" or \"bf16 tiles widened to "
      "fp32\".");

  m.def(
      "sdpa_backward",
      [](const Ref& dout, const Ref& q, const Ref& k, const Ref& v, const Ref& out,
         const Ref& lse, const Ref& dq, const Ref& dk, const Ref& dv,
         const std::optional<Ref>& mask, const std::optional<Ref>& alibi, bool is_causal,
         bool bottom_right, std::optional<float> scale, float softcap, int64_t window_left,
         int64_t window_right, float dropout_p, uint64_t dropout_seed, bool enable_gqa,
         int threads) {
        const View gv("grad_out", dout), qv("query", q), kv("key", k), vv("value", v),
            ov("out", out), lv("lse", lse), dqv("dq", dq), dkv("dk", dk), dvv("dv", dv);
        const Options opt = options_of(is_causal, bottom_right, scale, softcap, window_left,
                                       window_right, dropout_p, dropout_seed, enable_gqa);
        const auto mv = optional_view("attn_mask", mask), av = optional_view("alibi_slopes", alibi);
        if (is_bf16(qv))
          backward_as<attn::BFloat16>(gv, qv, kv, vv, ov, lv, dqv, dkv, dvv, mv, av, opt,
                                      threads);
        else
          backward_as<float>(gv, qv, kv, vv, ov, lv, dqv, dkv, dvv, mv, av, opt, threads);
      },
      py::arg("dout"), py::arg("q"), py::arg("k"), py::arg("v"), py::arg("out"), py::arg("lse"),
      py::arg("dq"), py::arg("dk"), py::arg("dv"), py::arg("mask"), py::arg("alibi"),
      py::arg("is_causal"), py::arg("bottom_right"), py::arg("scale"), py::arg("softcap"),
      py::arg("window_left"), py::arg("window_right"), py::arg("dropout_p"),
      py::arg("dropout_seed"), py::arg("enable_gqa"), py::arg("threads"),
      "Writes dq, dk, dv in place: attn's fused sdpa backward (out and lse from the forward).");

  m.def(
      "sdpa_varlen_forward",
      [](const Ref& q, const Ref& k, const Ref& v, const Ref& out, const Ref& lse,
         const std::vector<int64_t>& cu_q, const std::vector<int64_t>& cu_k, int64_t max_q,
         int64_t max_k, const std::optional<Ref>& alibi, bool is_causal, bool bottom_right,
         std::optional<float> scale, float softcap, int64_t window_left, int64_t window_right,
         float dropout_p, uint64_t dropout_seed, bool enable_gqa, int threads) {
        const View qv("q", q), kv("k", k), vv("v", v), ov("out", out), lv("lse", lse);
        const Options opt = options_of(is_causal, bottom_right, scale, softcap, window_left,
                                       window_right, dropout_p, dropout_seed, enable_gqa);
        const auto av = optional_view("alibi_slopes", alibi);
        if (is_bf16(qv))
          varlen_forward_as<attn::BFloat16>(qv, kv, vv, ov, lv, cu_q, cu_k, max_q, max_k, av,
                                            opt, threads);
        else
          varlen_forward_as<float>(qv, kv, vv, ov, lv, cu_q, cu_k, max_q, max_k, av, opt,
                                   threads);
      },
      py::arg("q"), py::arg("k"), py::arg("v"), py::arg("out"), py::arg("lse"),
      py::arg("cu_seqlens_q"), py::arg("cu_seqlens_k"), py::arg("max_seqlen_q"),
      py::arg("max_seqlen_k"), py::arg("alibi"), py::arg("is_causal"), py::arg("bottom_right"),
      py::arg("scale"), py::arg("softcap"), py::arg("window_left"), py::arg("window_right"),
      py::arg("dropout_p"), py::arg("dropout_seed"), py::arg("enable_gqa"), py::arg("threads"),
      "Packed variable-length batch: writes out (total_q, Hq, Dv) and lse (Hq, total_q).");

  m.def(
      "sdpa_varlen_backward",
      [](const Ref& dout, const Ref& q, const Ref& k, const Ref& v, const Ref& out,
         const Ref& lse, const Ref& dq, const Ref& dk, const Ref& dv,
         const std::vector<int64_t>& cu_q, const std::vector<int64_t>& cu_k, int64_t max_q,
         int64_t max_k, const std::optional<Ref>& alibi, bool is_causal, bool bottom_right,
         std::optional<float> scale, float softcap, int64_t window_left, int64_t window_right,
         float dropout_p, uint64_t dropout_seed, bool enable_gqa, int threads) {
        const View gv("grad_out", dout), qv("q", q), kv("k", k), vv("v", v), ov("out", out),
            lv("lse", lse), dqv("dq", dq), dkv("dk", dk), dvv("dv", dv);
        const Options opt = options_of(is_causal, bottom_right, scale, softcap, window_left,
                                       window_right, dropout_p, dropout_seed, enable_gqa);
        const auto av = optional_view("alibi_slopes", alibi);
        if (is_bf16(qv))
          varlen_backward_as<attn::BFloat16>(gv, qv, kv, vv, ov, lv, dqv, dkv, dvv, cu_q, cu_k,
                                             max_q, max_k, av, opt, threads);
        else
          varlen_backward_as<float>(gv, qv, kv, vv, ov, lv, dqv, dkv, dvv, cu_q, cu_k, max_q,
                                    max_k, av, opt, threads);
      },
      py::arg("dout"), py::arg("q"), py::arg("k"), py::arg("v"), py::arg("out"), py::arg("lse"),
      py::arg("dq"), py::arg("dk"), py::arg("dv"), py::arg("cu_seqlens_q"),
      py::arg("cu_seqlens_k"), py::arg("max_seqlen_q"), py::arg("max_seqlen_k"),
      py::arg("alibi"), py::arg("is_causal"), py::arg("bottom_right"), py::arg("scale"),
      py::arg("softcap"), py::arg("window_left"), py::arg("window_right"), py::arg("dropout_p"),
      py::arg("dropout_seed"), py::arg("enable_gqa"), py::arg("threads"),
      "Packed variable-length batch: writes dq, dk, dv in place.");

  m.def(
      "dropout_noise",
      [](const Ref& noise, float dropout_p, uint64_t dropout_seed) {
        const View z("noise", noise);
        if (z.sizes.size() != 4 || z.dtype != "float32")
          fail("noise must be a 4-D float32 (B, H, Tq, Tk)");
        if (!(dropout_p >= 0.0f && dropout_p < 1.0f))
          fail(fmt::format("dropout_p must be in [0, 1), got {}", dropout_p));
        const attn::kernels::DropoutRule rule(dropout_p);
        float* base = z.data<float>();
        const int64_t B = z.sizes[0], H = z.sizes[1], Tq = z.sizes[2], Tk = z.sizes[3];
        for (int64_t b = 0; b < B; ++b)
          for (int64_t h = 0; h < H; ++h)
            for (int64_t i = 0; i < Tq; ++i)
              for (int64_t j0 = 0; j0 < Tk; j0 += 4) {
                const attn::kernels::PhiloxBlock r =
                    attn::kernels::philox_dropout_block(dropout_seed, b, h, i, j0);
                for (int64_t j = j0; j < std::min(j0 + 4, Tk); ++j)
                  base[b * z.strides[0] + h * z.strides[1] + i * z.strides[2] +
                       j * z.strides[3]] = rule.active() ? rule.noise(r.x[j - j0]) : 1.0f;
              }
      },
      py::arg("noise"), py::arg("dropout_p"), py::arg("dropout_seed"),
      "Writes the dropout factors Z (0 or 1/(1-p)) the kernels apply for (b, h, i, j).");

  // GPT-2's tokenizer (attn/tokenizer.h); python/attn/_tokenizer.py gives it tiktoken's API.
  using attn::text::Tokenizer;
  py::class_<Tokenizer>(m, "Tokenizer")
      .def_static("gpt2", &Tokenizer::gpt2, py::return_value_policy::reference,
                  "GPT-2's vocabulary, embedded in the library.")
      .def_static("from_files", &Tokenizer::from_files, py::arg("vocab_json"),
                  py::arg("merges_txt"), "A vocabulary in Hugging Face's vocab.json + merges.txt.")
      .def(
          "encode",
          [](const Tokenizer& t, const std::string& text, bool allow_special, int threads) {
            py::gil_scoped_release release;
            return threads == 1 ? t.encode(text, allow_special)
                                : t.encode_parallel(text, allow_special, threads);
          },
          py::arg("text"), py::arg("allow_special"), py::arg("threads"),
          "The ids of UTF-8 text (threads 1: one thread; else encode_parallel's).")
      .def(
          "decode_bytes",
          [](const Tokenizer& t, const std::vector<int64_t>& ids) {
            std::string bytes;
            {
              py::gil_scoped_release release;
              bytes = t.decode(ids);
            }
            return py::bytes(bytes);
          },
          py::arg("ids"), "The bytes of the tokens, joined.")
      .def(
          "token_bytes",
          [](const Tokenizer& t, int64_t id) { return py::bytes(t.token_bytes(id)); },
          py::arg("id"))
      .def_property_readonly("vocab_size", &Tokenizer::vocab_size)
      .def_property_readonly("eot_token", &Tokenizer::eot_token);

  m.def("kernel_target", [] { return std::string(attn::kernels::sdpa_target()); },
        "The SIMD target attn's sdpa kernel runs (\"AVX3\", \"AVX2\", ...).");
  m.def("bf16_paths", &attn::kernels::flash_attention_bf16_paths,
        "The bf16 paths of the core's kernel this CPU can run, best first (\"AMX\", ...).");
  m.def(
      "use_bf16_path",
      [](const std::optional<std::string>& name) {
        return attn::kernels::flash_attention_bf16_use_path(name ? name->c_str() : nullptr);
      },
      py::arg("name"),
      "Forces the core's bf16 path (a name of bf16_paths(); None: the automatic choice); "
      "false for an unknown name. For tests and benchmarks, not while kernels run.");
  m.def("max_threads", [] { return omp_get_max_threads(); },
        "OpenMP's default thread count in this process (omp_get_max_threads).");
}
