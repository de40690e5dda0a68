// The fast path of the attention modules (attn/fused.h): four projections on
// the fast GEMM (gemm::Engine::kFast, attn/gemm.h) around the flash kernel, all in the token-major
// layout (B·T rows), so nothing is transposed or split into per-head copies.
#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <stdexcept>
#include <vector>

#include "attn/fused.h"
#include "attn/gemm.h"
#include "attn/kernels.h"
#include "attn/layer_kernels.h"
#include "attn/rope_kernel.h"

namespace attn::fused {
namespace {

constexpr int kQKV = 3;  // q, k, v: the column blocks of qkv

// Every product below runs on the OpenMP threads that also run the flash
// kernel (gemm::sgemm_rows_parallel: oneDNN on OpenMP's threads, or the BLAS
// split by rows of C): handing it to the BLAS's own threads instead makes two
// thread pools take turns on the same cores, and each spins while the other works.
using gemm::Trans;

// C (M, N; ldc) = beta·C + A (M, K; lda) · Bᵀ where B is (N, K; ldb): y = x Wᵀ.
void gemm_nt(float* C, int64_t ldc, const float* A, int64_t lda, const float* Bm, int64_t ldb,
             int64_t M, int64_t N, int64_t K, float beta) {
  gemm::sgemm_rows_parallel(Trans::kNo, Trans::kYes, M, N, K, 1.0f, A, lda, Bm, ldb, beta, C, ldc,
                            gemm::Engine::kFast);
}
// C (M, N; ldc) = beta·C + A (M, K; lda) · B (K, N; ldb): dx = dy W.
void gemm_nn(float* C, int64_t ldc, const float* A, int64_t lda, const float* Bm, int64_t ldb,
             int64_t M, int64_t N, int64_t K, float beta) {
  gemm::sgemm_rows_parallel(Trans::kNo, Trans::kNo, M, N, K, 1.0f, A, lda, Bm, ldb, beta, C, ldc,
                            gemm::Engine::kFast);
}
// C (M, N; ldc) += Aᵀ · B where A is (K, M; lda) and B (K, N; ldb): dW += dyᵀ x.
void gemm_tn_accumulate(float* C, int64_t ldc, const float* A, int64_t lda, const float* Bm,
                        int64_t ldb, int64_t M, int64_t N, int64_t K) {
  gemm::sgemm_rows_parallel(Trans::kYes, Trans::kNo, M, N, K, 1.0f, A, lda, Bm, ldb, 1.0f, C, ldc,
                            gemm::Engine::kFast);
}
// Every row of C (M, N; ldc) set to b, so that a product with beta = 1 adds
// onto it; returns that beta (0 without a bias: the product overwrites).
float prefill_bias(float* C, int64_t ldc, const Tensor* b, int64_t M, int64_t N) {
  if (b == nullptr) return 0.0f;
  kernels::fill_rows(C, ldc, b->data(), M, N);
  return 1.0f;
}
// db (N) += Σ_rows A (M, N; lda): kernels::column_sums_accumulate (on the
// OpenMP threads, not a BLAS sgemv, which would wake the BLAS's own thread
// pool to spin against the OpenMP threads of the kernels around it).
using kernels::column_sums_accumulate;
// y = x Wᵀ + b into C (M, N; ldc).
void linear_into(float* C, int64_t ldc, const float* x, int64_t d_in, const Tensor& W,
                 const Tensor* b, int64_t M, int64_t N) {
  const float beta = prefill_bias(C, ldc, b, M, N);
  gemm_nt(C, ldc, x, d_in, W.data(), d_in, M, N, d_in, beta);
}

// ---- bf16 mode: the products take bf16 operands and sum in fp32 ----

// RoPE (attn/rope.h) on the q and k column blocks of a (B, T, 3·d_out)
// buffer, token t at position t; inverse: the backward's transposed map on dq,
// dk. Nothing without tables.
template <class V>
void rope_qk(V* qkv, const Tensor& cos, const Tensor& sin, const kernels::FlashAttentionParams& p,
             bool inverse) {
  if (cos.empty()) return;
  const int64_t d_out = p.H * p.hd;
  const RopeRows r{.B = p.B,
                   .H = p.H,
                   .T = p.T,
                   .hd = p.hd,
                   .stride_b = p.T * kQKV * d_out,
                   .stride_h = p.hd,
                   .stride_t = kQKV * d_out,
                   .position_offset = 0,
                   .cos = cos.data(),
                   .sin = sin.data(),
                   .inverse = inverse};
  kernels::rope_rows(qkv, r);          // q
  kernels::rope_rows(qkv + d_out, r);  // k
}

using kernels::Bf16At;
using kernels::Bf16Operand;
using kernels::round_to_bf16;  // dst[i] = bf16(src[i]) (nearest even), SIMD on OpenMP's threads
// C (M, N; ldc) = beta·C + op(A) · op(B) on bf16 operands (kernels::gemm_bf16).
void gemm_bf16(Trans ta, Trans tb, float* C, int64_t ldc, Bf16At A, int64_t lda, Bf16At Bm,
               int64_t ldb, int64_t M, int64_t N, int64_t K, float beta) {
  kernels::gemm_bf16(ta, tb, M, N, K, 1.0f, A, lda, Bm, ldb, beta, C, ldc);
}
// y = x Wᵀ + b into C (M, N; ldc) from bf16 x and W, summed in fp32.
void linear_into_bf16(float* C, int64_t ldc, const Bf16Operand& x, int64_t d_in,
                      const Bf16Operand& W, const Tensor* b, int64_t M, int64_t N) {
  const float beta = prefill_bias(C, ldc, b, M, N);
  gemm_bf16(Trans::kNo, Trans::kYes, C, ldc, x, d_in, W, d_in, M, N, d_in, beta);
}

// t itself when it already has this shape and no other tensor holds its
// storage (its values stale: the caller overwrites every element), else a new
// zeroed tensor of the shape. Reusing the buffers of the previous step
// matters for long sequences: a fresh buffer of tens of MB costs a page fault
// per 4 KB before any work. A storage someone else still holds (a y handed out
// as the context, say) is never overwritten.
Tensor& reuse(Tensor& t, const Shape& shape, DType dtype = DType::kFloat32) {
  if (t.shape() != shape || t.dtype() != dtype || !t.is_contiguous() || t.storage_use_count() != 1)
    t = Tensor::zeros(shape, dtype);
  return t;
}

void check_shape(const char* what, const Tensor* t, const Shape& expected) {
  if (t != nullptr && t->shape() != expected) {
    throw std::invalid_argument(fmt::format("attention_block: {} has shape {}, expected {}", what,
                                            shape_str(t->shape()), shape_str(expected)));
  }
}

// Checks the weights against each other and returns (d_in, d_out).
std::array<int64_t, 2> checked_widths(const ProjectionWeights& w) {
  if (w.W_query == nullptr || w.W_key == nullptr || w.W_value == nullptr) {
    throw std::invalid_argument("attention_block: W_query, W_key and W_value are required");
  }
  if (w.W_query->dim() != 2) {
    throw std::invalid_argument(fmt::format(
        "attention_block: W_query must be (d_out, d_in), got {}", shape_str(w.W_query->shape())));
  }
  const int64_t d_out = w.W_query->size(0), d_in = w.W_query->size(1);
  check_shape("W_key", w.W_key, {d_out, d_in});
  check_shape("W_value", w.W_value, {d_out, d_in});
  check_shape("b_query", w.b_query, {d_out});
  check_shape("b_key", w.b_key, {d_out});
  check_shape("b_value", w.b_value, {d_out});
  check_shape("W_out", w.W_out, {d_out, d_out});
  if (w.W_out == nullptr && w.b_out != nullptr) {
    throw std::invalid_argument("attention_block: b_out given without W_out");
  }
  check_shape("b_out", w.b_out, {d_out});
  return {d_in, d_out};
}

std::array<const Tensor*, kQKV> weights_of(const ProjectionWeights& w) {
  return {w.W_query, w.W_key, w.W_value};
}
std::array<const Tensor*, kQKV> biases_of(const ProjectionWeights& w) {
  return {w.b_query, w.b_key, w.b_value};
}

// Gradient slots must exist exactly where the weights do, with their shapes.
void check_grads(const ProjectionWeights& w, const ProjectionGrads& g) {
  const std::array<std::pair<const Tensor*, const Tensor*>, 8> pairs = {{{w.W_query, g.W_query},
                                                                         {w.W_key, g.W_key},
                                                                         {w.W_value, g.W_value},
                                                                         {w.b_query, g.b_query},
                                                                         {w.b_key, g.b_key},
                                                                         {w.b_value, g.b_value},
                                                                         {w.W_out, g.W_out},
                                                                         {w.b_out, g.b_out}}};
  constexpr std::array<const char*, 8> names = {"W_query", "W_key",   "W_value", "b_query",
                                                "b_key",   "b_value", "W_out",   "b_out"};
  for (size_t n = 0; n < pairs.size(); ++n) {
    const auto [value, grad] = pairs[n];
    if ((value == nullptr) != (grad == nullptr)) {
      throw std::invalid_argument(fmt::format(
          "attention_block_backward: the gradient of {} is {} but the weight is {}", names[n],
          grad == nullptr ? "missing" : "given", value == nullptr ? "absent" : "present"));
    }
    if (value != nullptr) check_shape(names[n], grad, value->shape());
  }
}

// attention_block_backward in bf16 mode: the same steps on the bf16 copies the
// forward saved, the parameter gradients accumulated in fp32.
Tensor backward_bf16(const Tensor& dy, const ProjectionWeights& w, AttentionBlockSaved& saved,
                     const ProjectionGrads& grads) {
  const kernels::FlashAttentionParams& p = saved.params;
  const int64_t B = p.B, T = p.T, N = B * T, d_out = p.H * p.hd, d_in = saved.x_bf16.shape()[2];
  // dy rounded (B, T, d_out): the kernel's dO without out_proj, else the
  // operand of out_proj's two products.
  saved.dy_bf16 = Bf16Operand::rounded(dy, std::move(saved.dy_bf16));
  // Through out_proj: dcontext = dy W_out, dW_out += dyᵀ context, db_out += Σ_rows dy.
  const BFloat16* dcontext = nullptr;
  if (w.W_out != nullptr) {
    Tensor& dcontext32 = reuse(saved.dcontext_f32, {B, T, d_out});  // (B, T, d_out)
    gemm_bf16(Trans::kNo, Trans::kNo, dcontext32.data(), d_out, saved.dy_bf16, d_out,
              saved.weights_bf16[3], d_out, N, d_out, d_out, 0.0f);
    gemm_bf16(Trans::kYes, Trans::kNo, grads.W_out->data(), d_out, saved.dy_bf16, d_out,
              saved.context_bf16, d_out, d_out, d_out, N, 1.0f);
    if (grads.b_out != nullptr)
      column_sums_accumulate(grads.b_out->data(), dy.data(), d_out, N, d_out);
    Tensor& dcontext_buffer = reuse(saved.dcontext, {B, T, d_out}, DType::kBFloat16);
    round_to_bf16(dcontext_buffer.data_ptr<BFloat16>(), dcontext32.data(), N * d_out);
    dcontext = dcontext_buffer.data_ptr<BFloat16>();
  } else {
    // The kernel reads bf16: dy's operand is bf16 on the matmul route, float32 on the widened one.
    Tensor& dyb = reuse(saved.dcontext, {B, T, d_out}, DType::kBFloat16);
    round_to_bf16(dyb.data_ptr<BFloat16>(), dy.data(), N * d_out);
    dcontext = dyb.data_ptr<BFloat16>();
  }
  // Through the kernel (last step's bf16 operand of dqkv let go of, as the context's).
  if (!saved.dqkv_bf16.widened()) saved.dqkv_bf16 = Bf16Operand();
  Tensor& dqkv = reuse(saved.dqkv, {B, T, kQKV * d_out}, DType::kBFloat16);  // (B, T, 3·d_out)
  const BFloat16* qkv = saved.qkv.data_ptr<BFloat16>();
  BFloat16* dq = dqkv.data_ptr<BFloat16>();
  kernels::flash_attention_backward_bf16(dq, dq + d_out, dq + 2 * d_out, dcontext, qkv, qkv + d_out,
                                         qkv + 2 * d_out, saved.context.data_ptr<BFloat16>(),
                                         saved.lse.data(), p);
  rope_qk(dq, saved.rope_cos, saved.rope_sin, p, true);  // dq, dk back through the rotation
  // Through the projections: dx = Σ_j dqkv_j W_j, dW_j += dqkv_jᵀ x, db_j += Σ_rows dqkv_j.
  const std::array<Tensor*, kQKV> dweights = {grads.W_query, grads.W_key, grads.W_value};
  const std::array<Tensor*, kQKV> dbiases = {grads.b_query, grads.b_key, grads.b_value};
  Tensor dx({B, T, d_in});  // (B, T, d_in), fp32
  // dq | dk | dv as one operand: each block's two products at leading dimension 3·d_out.
  saved.dqkv_bf16 = Bf16Operand::of(dqkv, std::move(saved.dqkv_bf16));
  for (int j = 0; j < kQKV; ++j) {
    const BFloat16* dblock = dq + j * d_out;
    const Bf16At dblock_op(saved.dqkv_bf16, j * d_out);
    gemm_bf16(Trans::kNo, Trans::kNo, dx.data(), d_in, dblock_op, kQKV * d_out,
              saved.weights_bf16[size_t(j)], d_in, N, d_in, d_out, j == 0 ? 0.0f : 1.0f);
    gemm_bf16(Trans::kYes, Trans::kNo, dweights[j]->data(), d_in, dblock_op, kQKV * d_out,
              saved.x_bf16, d_in, d_out, d_in, N, 1.0f);
    if (dbiases[j] != nullptr)
      column_sums_accumulate(dbiases[j]->data(), dblock, kQKV * d_out, N, d_out);
  }
  return dx;
}

}  // namespace

Tensor attention_block_forward(const Tensor& x_in, const ProjectionWeights& w,
                               const AttentionBlockOptions& options, AttentionBlockSaved* saved) {
  const Tensor x = x_in.contiguous();  // the projections read it row-major
  const auto [d_in, d_out] = checked_widths(w);
  if (x.dim() != 3 || x.size(2) != d_in || x.size(0) < 1 || x.size(1) < 1) {
    throw std::invalid_argument(
        fmt::format("attention_block_forward: expected x of shape (B, T, d_in = {}), got {}", d_in,
                    shape_str(x.shape())));
  }
  if (options.num_heads < 1 || d_out % options.num_heads != 0) {
    throw std::invalid_argument(
        fmt::format("attention_block_forward: d_out ({}) must be divisible by num_heads ({})",
                    d_out, options.num_heads));
  }
  const int64_t B = x.size(0), T = x.size(1), N = B * T, H = options.num_heads;
  kernels::FlashAttentionParams p;
  p.B = B, p.T = T, p.H = H, p.hd = d_out / H;
  p.causal = options.causal;
  p.scale = options.scale;
  p.dropout_p = options.dropout_p;
  p.dropout_seed = options.dropout_seed;
  p.q_stride = p.k_stride = p.v_stride = kQKV * d_out;
  p.o_stride = d_out;
  p = kernels::validated(p);  // throws for head_dim > kMaxHeadDim, p outside [0, 1), ...
  Tensor rope_cos, rope_sin;  // (L >= T, hd) contiguous float32, or empty
  if ((options.rope_cos == nullptr) != (options.rope_sin == nullptr)) {
    throw std::invalid_argument("attention_block_forward: rope_cos and rope_sin go together");
  }
  if (options.rope_cos != nullptr) {
    const Tensor& c = *options.rope_cos;
    const Tensor& sn = *options.rope_sin;
    if (c.dtype() != DType::kFloat32 || c.dim() != 2 || c.size(0) < T || c.size(1) != p.hd ||
        sn.shape() != c.shape() || sn.dtype() != DType::kFloat32 || p.hd % 2 != 0) {
      throw std::invalid_argument(fmt::format(
          "attention_block_forward: RoPE tables must be float32 (L >= T = {}, head_dim = {}, "
          "even), got cos {} and sin {}",
          T, p.hd, shape_str(c.shape()), shape_str(sn.shape())));
    }
    rope_cos = c.contiguous();
    rope_sin = sn.contiguous();
  }

  if (options.dtype != DType::kFloat32 && options.dtype != DType::kBFloat16) {
    throw std::invalid_argument(
        fmt::format("attention_block_forward: dtype must be float32 or bfloat16, got {}",
                    dtype_name(options.dtype)));
  }
  // With saved, the buffers live in it, reused from the previous step when the
  // shapes match; without, they are this call's own.
  AttentionBlockSaved local;
  AttentionBlockSaved& s = saved != nullptr ? *saved : local;
  const bool bf16 = options.dtype == DType::kBFloat16;
  if (x.dtype() != DType::kFloat32 && !(bf16 && x.dtype() == DType::kBFloat16)) {
    throw std::invalid_argument(
        fmt::format("attention_block_forward: x must be float32{} with dtype = {}, got {}",
                    bf16 ? " or bfloat16" : "", dtype_name(options.dtype), dtype_name(x.dtype())));
  }
  if (bf16) {
    // x, the weights: rounded to bf16 once per step (the weights are the fp32
    // master copy); a bf16 x is taken as it is.
    s.x = Tensor();
    s.x_bf16 = Bf16Operand::rounded(x, std::move(s.x_bf16));  // (B, T, d_in)
    const std::array<const Tensor*, 4> all = {w.W_query, w.W_key, w.W_value, w.W_out};
    for (size_t j = 0; j < all.size(); ++j) {
      s.weights_bf16[j] = all[j] == nullptr
                              ? Bf16Operand()
                              : Bf16Operand::rounded(*all[j], std::move(s.weights_bf16[j]));
    }
    // qkv = x Wᵀ + b in fp32 sums, kept in bf16.
    Tensor& qkv32 = reuse(s.qkv_f32, {B, T, kQKV * d_out});  // (B, T, 3·d_out)
    const auto biases = biases_of(w);
    for (int j = 0; j < kQKV; ++j)
      linear_into_bf16(qkv32.data() + j * d_out, kQKV * d_out, s.x_bf16, d_in,
                       s.weights_bf16[size_t(j)], biases[j], N, d_out);
    Tensor& qkv = reuse(s.qkv, {B, T, kQKV * d_out}, DType::kBFloat16);
    round_to_bf16(qkv.data_ptr<BFloat16>(), qkv32.data(), qkv32.numel());
    rope_qk(qkv.data_ptr<BFloat16>(), rope_cos, rope_sin, p, false);  // q, k rotated in bf16
    const BFloat16* q = qkv.data_ptr<BFloat16>();
    // (A bf16 operand shares its tensor's storage: let go of last step's, so
    // that reuse finds the buffer free.)
    if (!s.context_bf16.widened()) s.context_bf16 = Bf16Operand();
    Tensor& context = reuse(s.context, {B, T, d_out}, DType::kBFloat16);  // (B, T, d_out)
    Tensor& lse = reuse(s.lse, {B, H, T});                                // (B, H, T)
    kernels::flash_attention_forward_bf16(context.data_ptr<BFloat16>(), lse.data(), q, q + d_out,
                                          q + 2 * d_out, p);
    Tensor y;
    if (w.W_out != nullptr) {
      y = Tensor::empty({B, T, d_out});  // (B, T, d_out) = context W_outᵀ + b_out, fp32
      s.context_bf16 = Bf16Operand::of(context, std::move(s.context_bf16));
      linear_into_bf16(y.data(), d_out, s.context_bf16, d_out, s.weights_bf16[3], w.b_out, N,
                       d_out);
    } else {
      y = context.to(DType::kFloat32);
    }
    if (saved != nullptr) {
      saved->params = p;
      saved->rope_cos = rope_cos;
      saved->rope_sin = rope_sin;
    }
    return y;
  }

  // qkv = x [W_query; W_key; W_value]ᵀ + b: one column block per projection.
  Tensor& qkv = reuse(s.qkv, {B, T, kQKV * d_out});  // (B, T, 3·d_out)
  const auto weights = weights_of(w);
  const auto biases = biases_of(w);
  for (int j = 0; j < kQKV; ++j)
    linear_into(qkv.data() + j * d_out, kQKV * d_out, x.data(), d_in, *weights[j], biases[j], N,
                d_out);
  rope_qk(qkv.data(), rope_cos, rope_sin, p, false);  // q, k rotated in place
  const float* q = qkv.data();
  Tensor& context = reuse(s.context, {B, T, d_out});  // (B, T, H, hd) = (B, T, d_out)
  Tensor& lse = reuse(s.lse, {B, H, T});              // (B, H, T)
  kernels::flash_attention_forward(context.data(), lse.data(), q, q + d_out, q + 2 * d_out, p);

  Tensor y;
  if (w.W_out != nullptr) {
    y = Tensor::empty({B, T, d_out});  // (B, T, d_out) = context W_outᵀ + b_out
    linear_into(y.data(), d_out, context.data(), d_out, *w.W_out, w.b_out, N, d_out);
  } else if (saved == nullptr) {
    y = std::move(context);
  } else {
    y = context;
  }
  if (saved != nullptr) {
    saved->x = x;  // shares x's storage: nothing is copied
    saved->params = p;
    saved->rope_cos = rope_cos;
    saved->rope_sin = rope_sin;
  }
  return y;
}

Tensor attention_block_backward(const Tensor& dy_in, const ProjectionWeights& w,
                                AttentionBlockSaved& saved, const ProjectionGrads& grads) {
  const Tensor dy = dy_in.contiguous();  // the products read it row-major
  const auto [d_in, d_out] = checked_widths(w);
  check_grads(w, grads);
  const kernels::FlashAttentionParams& p = saved.params;
  const int64_t B = p.B, T = p.T, N = B * T;
  const Shape& x_shape =
      saved.qkv.dtype() == DType::kBFloat16 ? saved.x_bf16.shape() : saved.x.shape();
  if (saved.qkv.shape() != Shape{B, T, kQKV * d_out} || x_shape != Shape{B, T, d_in}) {
    throw std::invalid_argument(fmt::format(
        "attention_block_backward: saved state (x {}, qkv {}) does not fit these weights "
        "(d_in {}, d_out {})",
        shape_str(x_shape), shape_str(saved.qkv.shape()), d_in, d_out));
  }
  if (dy.shape() != Shape{B, T, d_out}) {
    throw std::invalid_argument(
        fmt::format("attention_block_backward: gradient shape {} does not match output shape {}",
                    shape_str(dy.shape()), shape_str(Shape{B, T, d_out})));
  }

  if (saved.qkv.dtype() == DType::kBFloat16) return backward_bf16(dy, w, saved, grads);

  // Through out_proj: dcontext = dy W_out, dW_out += dyᵀ context, db_out += Σ_rows dy.
  const float* dcontext = dy.data();
  if (w.W_out != nullptr) {
    Tensor& dcontext_buffer = reuse(saved.dcontext, {B, T, d_out});  // (B, T, d_out)
    gemm_nn(dcontext_buffer.data(), d_out, dy.data(), d_out, w.W_out->data(), d_out, N, d_out,
            d_out, 0.0f);
    gemm_tn_accumulate(grads.W_out->data(), d_out, dy.data(), d_out, saved.context.data(), d_out,
                       d_out, d_out, N);
    if (grads.b_out != nullptr)
      column_sums_accumulate(grads.b_out->data(), dy.data(), d_out, N, d_out);
    dcontext = dcontext_buffer.data();
  }

  // Through the kernel: dq, dk, dv in the column blocks of one (B, T, 3·d_out) buffer.
  Tensor& dqkv = reuse(saved.dqkv, {B, T, kQKV * d_out});  // (B, T, 3·d_out)
  const float* qkv = saved.qkv.data();
  float* dq = dqkv.data();
  kernels::flash_attention_backward(dq, dq + d_out, dq + 2 * d_out, dcontext, qkv, qkv + d_out,
                                    qkv + 2 * d_out, saved.context.data(), saved.lse.data(), p);
  rope_qk(dq, saved.rope_cos, saved.rope_sin, p, true);  // dq, dk back through the rotation

  // Through the projections: dx = Σ_j dqkv_j W_j, dW_j += dqkv_jᵀ x, db_j += Σ_rows dqkv_j.
  const auto weights = weights_of(w);
  const std::array<Tensor*, kQKV> dweights = {grads.W_query, grads.W_key, grads.W_value};
  const std::array<Tensor*, kQKV> dbiases = {grads.b_query, grads.b_key, grads.b_value};
  Tensor dx({B, T, d_in});  // (B, T, d_in)
  for (int j = 0; j < kQKV; ++j) {
    const float* dblock = dqkv.data() + j * d_out;
    gemm_nn(dx.data(), d_in, dblock, kQKV * d_out, weights[j]->data(), d_in, N, d_in, d_out,
            j == 0 ? 0.0f : 1.0f);
    gemm_tn_accumulate(dweights[j]->data(), d_in, dblock, kQKV * d_out, saved.x.data(), d_in, d_out,
                       d_in, N);
    if (dbiases[j] != nullptr)
      column_sums_accumulate(dbiases[j]->data(), dblock, kQKV * d_out, N, d_out);
  }
  return dx;
}

double attention_block_forward_flops(int64_t B, int64_t T, int64_t d_in, int64_t d_out, bool causal,
                                     bool out_proj) {
  const double rows = double(B) * double(T);
  const double projections = 3.0 * 2.0 * rows * double(d_in) * double(d_out) +
                             (out_proj ? 2.0 * rows * double(d_out) * double(d_out) : 0.0);
  // 4·B·H·T²·hd = 4·B·T²·d_out (Q Kᵀ and P V), halved when causal.
  const double core =
      4.0 * double(B) * double(T) * double(T) * double(d_out) / (causal ? 2.0 : 1.0);
  return projections + core;
}

double attention_block_backward_flops(int64_t B, int64_t T, int64_t d_in, int64_t d_out,
                                      bool causal, bool out_proj) {
  const double core =
      4.0 * double(B) * double(T) * double(T) * double(d_out) / (causal ? 2.0 : 1.0);
  const double all = attention_block_forward_flops(B, T, d_in, d_out, causal, out_proj);
  return 2.0 * (all - core) + 2.5 * core;
}

}  // namespace attn::fused
