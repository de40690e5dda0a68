// attn/sdpa.h - scaled-dot-product attention as PyTorch 2.x's
// torch.nn.functional.scaled_dot_product_attention and FlashAttention 2 define
// it: masks, Tq != Tk with either causal alignment, grouped-query heads,
// sliding windows, ALiBi and logit soft-capping, forward and backward.
//
// Shapes (PyTorch's):
//   q (B, Hq, Tq, D)   k (B, Hkv, Tk, D)   v (B, Hkv, Tk, Dv)   ->   out (B, Hq, Tq, Dv)
//   lse (B, Hq, Tq): the natural log of each row's softmax denominator (-inf for a
//   row with no key it may attend to).
// Any strides: head-major (B, H, T, D) tensors, token-major views of (B, T, H, D)
// (x.view({B, T, H, D}).transpose(1, 2)), or slices of one fused qkv buffer, are
// read in place. The fused kernel needs the last dim contiguous (stride 1); an
// input whose last stride is not 1 is copied first.
//
// What is computed, for batch b, query head h (its key/value head is
// h / (Hq / Hkv)), query i and key j:
//   s[i, j] = scale · q_i · k_j                     scale defaults to 1 / sqrt(D)
//   s       = softcap · tanh(s / softcap)           when softcap > 0 (Gemma 2)
//   s      += -alibi_slopes[h] · |i + δ - j|        when ALiBi slopes are given
//   s      += attn_mask[b, h, i, j]                 additive mask (a boolean mask adds
//                                                   0 where true, -inf where false)
//   s       = -inf where j is outside the causal/window band (below)
//   P = softmax_j(s), O = (P ⊙ Z) V                 Z: dropout noise, 0 or 1/(1-p)
// A row whose scores are all -inf has P = 0: its output is 0, its lse -inf and
// its gradients 0 (PyTorch >= 2.5), never NaN.
//
// dtypes: q, k, v (and dout, out) all float32 or all bfloat16; attn_mask and
// alibi_slopes float32 (or a boolean mask's int64), lse float32. With bfloat16
// (as PyTorch's SDPA on bf16 tensors on the CPU): the bf16 values are widened
// exactly to fp32, scores, softmax, lse and every sum are fp32, and out, dq,
// dk, dv are returned in bf16, each rounded once (to nearest even) at the end.
// The bf16 reference is the fp32 reference on the widened inputs, its outputs
// rounded; the fused kernel widens tile by tile (no fp32 copy of q, k or v).
//
// The diagonal δ, and the band of keys a query may see:
//   CausalAlignment::kTopLeft      δ = 0        (PyTorch's is_causal: query i sees keys j <= i)
//   CausalAlignment::kBottomRight  δ = Tk - Tq  (FlashAttention 2's, every KV-cache decoder's:
//                                                the last query sees the last key)
//   is_causal:        j <= i + δ
//   window_left  >= 0: j >= i + δ - window_left      (-1: unbounded)
//   window_right >= 0: j <= i + δ + window_right     (-1: unbounded; is_causal caps it at 0)
// The same δ aligns the window and the ALiBi distance; when Tq = Tk both alignments agree.
//
// Two implementations behind one entry point, chosen by SdpaOptions::backend:
// the plain reference (src/reference/sdpa_reference.cpp: the specification, one row at a
// time) and the fused kernel (src/kernels/sdpa_kernel.cpp: tiles of queries and
// keys with an online softmax, never a Tq x Tk matrix; key tiles outside the
// causal/window band are skipped, so a window of w keys costs O(T·w)).
// The fused kernel is deterministic for any OpenMP thread count.
#pragma once

#include <cstdint>
#include <optional>

#include "attn/sdpa_problem.h"
#include "attn/tensor.h"

namespace attn {

enum class MaskType : uint8_t {
  kAdditive,  // float32 values added to the scores (-inf masks)
  kBoolean,   // float32 or int64 values 0 or 1; 1 (true) = may attend, PyTorch 2's meaning
};

enum class SdpaBackend : uint8_t {
  kFused,      // src/kernels/sdpa_kernel.cpp
  kReference,  // src/reference/sdpa_reference.cpp
};

// Option names follow torch.nn.functional.scaled_dot_product_attention and
// flash_attn_func (window_size = (window_left, window_right), alibi_slopes, softcap).
struct SdpaOptions {
  // Broadcastable to (B, Hq, Tq, Tk): up to 4 dims, aligned on the right, each
  // 1 or the full size ((Tq, Tk), (B, 1, 1, Tk), (1, Hq, Tq, Tk), ...). Empty: no mask.
  // The fused backend runs a mask that is exactly the causal pattern of a
  // square problem (one plane: open on and below the diagonal, closed above:
  // false, -inf, or a value whose weight is exactly 0 such as transformers'
  // float32 minimum) as is_causal: the same sums, at is_causal's speed. Other
  // masks: the kernel classifies their blocks (16 x 16; 64 x 64 on the bf16 core's
  // AMX and AVX512-BF16 kernels) once a call and skips the tiles they close. bf16
  // runs on the core's kernel where that is AMX or AVX512-BF16, masked or not.
  Tensor attn_mask;
  MaskType attn_mask_type = MaskType::kAdditive;
  float dropout_p = 0.0f;     // in [0, 1)
  uint64_t dropout_seed = 0;  // Philox key (attn/kernels.h describes the stream)
  bool is_causal = false;     // combines with attn_mask (PyTorch refuses both at once)
  CausalAlignment causal_alignment = CausalAlignment::kTopLeft;
  std::optional<float> scale;  // none: 1 / sqrt(D)
  bool enable_gqa = false;     // allow Hq != Hkv (Hq a multiple of Hkv); no copies are made
  int64_t window_left = -1;    // -1 or >= 0
  int64_t window_right = -1;   // -1 or >= 0
  Tensor alibi_slopes;         // empty, (Hq) or (B, Hq) float32
  float softcap = 0.0f;        // 0: off; else > 0
  SdpaBackend backend = SdpaBackend::kFused;
};

struct SdpaForward {
  Tensor out;  // (B, Hq, Tq, Dv) contiguous, q's dtype; varlen: (total_q, Hq, Dv)
  Tensor lse;  // (B, Hq, Tq) contiguous, float32; varlen: (Hq, total_q)
};

struct SdpaGrads {
  Tensor dq;  // (B, Hq, Tq, D)   contiguous, q's dtype (all three); varlen: (total_q, Hq, D)
  Tensor
      dk;  // (B, Hkv, Tk, D)  summed over the query heads of each group; varlen: (total_k, Hkv, D)
  Tensor dv;  // (B, Hkv, Tk, Dv) varlen: (total_k, Hkv, Dv)
};

// Checks everything (dtypes as above, 4-D shapes that agree, the mask's shape and
// values, the options) and throws std::invalid_argument naming the values.
SdpaForward scaled_dot_product_attention_forward(const Tensor& q, const Tensor& k, const Tensor& v,
                                                 const SdpaOptions& options = {});
// The output alone, as torch's function returns it.
Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                    const SdpaOptions& options = {});
// dout (B, Hq, Tq, Dv), q's dtype; out and lse are the forward's (same options, same
// dropout seed).
SdpaGrads scaled_dot_product_attention_backward(const Tensor& dout, const Tensor& q,
                                                const Tensor& k, const Tensor& v, const Tensor& out,
                                                const Tensor& lse, const SdpaOptions& options = {});

// ---- variable-length packed batches (flash_attn_varlen_func's) -------------------------
// Many sequences of different lengths in one call, no padding: the tokens of
// every sequence one after the other along dim 0 (token-major, as FlashAttention 2
// takes them), sequence b at rows [cu_seqlens[b], cu_seqlens[b + 1]):
//   q (total_q, Hq, D)   k (total_k, Hkv, D)   v (total_k, Hkv, Dv)   ->   out (total_q, Hq, Dv)
//   lse (Hq, total_q): FlashAttention 2's varlen layout (one row per head, the
//   tokens of every sequence along it); -inf for a row with no key.
//   cu_seqlens_q, cu_seqlens_k: int64 (nseq + 1), 0 = c[0] <= c[1] <= ... <= c[nseq] = total
//   (attn has no int32 dtype); a sequence may be empty (length 0: it contributes
//   nothing; queries with no key give 0 as above). Tq_b and Tk_b (sequence b's
//   lengths) may differ. max_seqlen_q, max_seqlen_k: at least every length
//   (checked; FlashAttention 2 trusts them).
// Any strides with the last dim contiguous (slices of a fused (total, 3, H, D)
// buffer are read in place; an input whose last stride is not 1 is copied first).
// Each sequence is exactly the batched problem above with B = 1, Tq = Tq_b, Tk = Tk_b:
// causal alignment (FlashAttention 2's causal is CausalAlignment::kBottomRight:
// δ = Tk_b - Tq_b), windows, ALiBi distances in the sequence's own positions;
// alibi_slopes (Hq) or (nseq, Hq); GQA; softcap; dropout with sequence b's
// Philox counter at (b, h, i, j), i and j positions within the sequence.
// attn_mask is refused (a per-sequence dense mask has no packed form).
// dtypes as the batched functions: q, k, v (dout, out) float32 or all bfloat16,
// out, dq, dk, dv in q's dtype, lse float32 (bf16: the reference on the widened
// values, rounded; the fused kernel widens tile by tile).
// Without dropout, the fused kernel's answer for each sequence is bit-identical
// to scaled_dot_product_attention_forward on that sequence alone (in either dtype).
SdpaForward sdpa_varlen_forward(const Tensor& q, const Tensor& k, const Tensor& v,
                                const Tensor& cu_seqlens_q, const Tensor& cu_seqlens_k,
                                int64_t max_seqlen_q, int64_t max_seqlen_k,
                                const SdpaOptions& options = {});
// dout (total_q, Hq, Dv), q's dtype; out, lse the forward's. dq (total_q, Hq, D), dk (total_k,
// Hkv, D), dv (total_k, Hkv, Dv), contiguous.
SdpaGrads sdpa_varlen_backward(const Tensor& dout, const Tensor& q, const Tensor& k,
                               const Tensor& v, const Tensor& out, const Tensor& lse,
                               const Tensor& cu_seqlens_q, const Tensor& cu_seqlens_k,
                               int64_t max_seqlen_q, int64_t max_seqlen_k,
                               const SdpaOptions& options = {});

namespace kernels {
// The bf16 paths of attn::scaled_dot_product_attention*:
//  - "AMX": the core's AMX kernel (flash_attention_forward_bf16 / _backward_bf16,
//    attn/kernels.h), taken when flash_attention_bf16_path() is "AMX" (so
//    flash_attention_bf16_use_path and ATTN_BF16_PATH force it off) and the call is
//    the core's problem: the fused backend, no window, ALiBi or softcap, D = Dv <=
//    kMaxHeadDim, scale >= 0; dropout any p (the same Philox noise); any
//    attn_mask (the AMX kernel adds it, skipping the tiles it hides),
//    grouped-query heads (K and V packed once per key/value head), and Tq != Tk
//    with either causal alignment.
//    q, k, v (dout, out) are read in place where their rows are contiguous (any
//    (b, h, t) strides), else copied so; the results are written in sdpa's
//    layout. Forward and backward route alike. Its numerics are the core's bf16
//    ones (P and dS rounded to bf16 where they enter a product), not the widened
//    path's bits.
//  - "AVX512-BF16": the kernels above (kernels::sdpa_forward / _backward) on
//    VDPBF16PS products, for every call the AMX kernel does not take, when
//    kernels::bf16_dot_engine_chosen() (attn/kernels.h): the path is
//    "AVX512-BF16" (AMD Zen 4/5, where VDPBF16PS runs at twice the FMA's
//    FLOPs), or "AMX" where VDPBF16PS measured as fast as the FMA. Every
//    option (masks, windows, ALiBi, softcap, grouped-query heads, Tq != Tk,
//    Dv != D; sdpa_varlen_* too), the AMX kernel's numerics.
//  - "bf16 tiles widened to fp32": the same kernels on fp32 products of tiles
//    widened exactly (every CPU, every option; the SIMD target is sdpa_target's):
//    the fp32 kernel's bits on the widened values.
// sdpa_bf16_path(): a summary for this CPU; sdpa_bf16_path(q, k, v, options): the
// path that call takes ("reference (fp32 on the widened values)" for the
// reference backend; checks the arguments as the call would).
const char* sdpa_bf16_path();
const char* sdpa_bf16_path(const Tensor& q, const Tensor& k, const Tensor& v,
                           const SdpaOptions& options = {});
// The path a raw bf16 problem takes in sdpa_forward_routed / sdpa_backward_routed
// below: "AMX", "AVX512-BF16" or "bf16 tiles widened to fp32", by the same rule
// as the Tensor entry points (a varlen problem never takes the AMX kernel).
const char* sdpa_bf16_path(const SdpaProblemBf16& p);
}  // namespace kernels

// ---- the raw layer, routed as the Tensor entry points route ---------------------------
// For callers that own their buffers (the Python binding): the same choice of
// path as scaled_dot_product_attention_forward / _backward with the fused
// backend, on the raw problem. fp32: kernels::sdpa_forward / _backward. bf16:
// the AMX kernel when kernels::sdpa_bf16_path(p) is "AMX", else
// kernels::sdpa_forward / _backward, reading and writing every tensor in place
// through its (b, h, t) strides where its rows have stride 1 along D
// (head-major, token-major, fused-qkv slices), else through packed token-major
// copies (a varlen problem: as given). lse (any strides).
void sdpa_forward_routed(const SdpaOutput& o, const SdpaProblem& p);
void sdpa_forward_routed(const SdpaOutputBf16& o, const SdpaProblemBf16& p);
void sdpa_backward_routed(const SdpaBackwardIO& io, const SdpaProblem& p);
void sdpa_backward_routed(const SdpaBackwardIOBf16& io, const SdpaProblemBf16& p);

}  // namespace attn
