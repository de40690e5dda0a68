// attn/bf16_operand.h - an operand of several bf16 products, made once in the
// form the products take.
//
// gemm::gemm_bf16 has two routes (attn/gemm.h). On the "matmul" route oneDNN
// multiplies bf16 directly; on the "widened" route (a CPU without a fast bf16
// product: AVX2-only, Intel without AMX) each product widens both operands to
// float32 (exact) and runs sgemm. A bf16 training step uses most operands
// twice (a weight in the forward and for dx; dy for dW and dx), and each
// operand was rounded from float32 first, so on the widened route one value
// went float32 -> bf16 -> float32 twice: those passes were most of what bf16
// training cost over float32 there.
//
// A Bf16Operand holds the operand in the route's form: bf16 on the matmul
// route; on the widened route float32 holding the bf16 values (rounded from
// float32 in one pass, or widened once). Products of Bf16Operands give
// gemm_bf16's bits on either route. The route is read when the operand is
// made; a product of operands of both forms (the route forced between them)
// widens the bf16 one for the call.
#pragma once

#include <cstdint>

#include "attn/gemm.h"
#include "attn/tensor.h"

namespace attn::kernels {

class Bf16Operand {
 public:
  Bf16Operand() = default;  // empty: no product takes it

  // bf16(x) (round to nearest even, as kernels::round_to_bf16), x float32 or
  // already bf16 (then as of). Shape kept. The storage of `reuse` is written
  // when it has the size and form and nothing else holds it (a step's operand
  // in the last step's buffer: a fresh buffer of tens of MB costs a page
  // fault per 4 KB).
  static Bf16Operand rounded(const Tensor& x, Bf16Operand reuse);
  static Bf16Operand rounded(const Tensor& x) { return rounded(x, Bf16Operand()); }
  // x (bf16) itself: on the matmul route shares x's storage, on the widened
  // route widened once into float32 of its own (or reuse's, as above).
  static Bf16Operand of(const Tensor& x, Bf16Operand reuse);
  static Bf16Operand of(const Tensor& x) { return of(x, Bf16Operand()); }

  // x (float32) taken as it is as the widened route's form: every element must
  // already be a bf16 value (as round_to_bf16_values and the kernels'
  // _bf16_values variants write them; not checked). For a caller that has
  // the values in float32 already (bf16_operands_widened()).
  static Bf16Operand widened_values(Tensor x);
  // A float32 tensor of this shape to write such values into: reuse's storage
  // when it is a widened operand of this shape that nothing else holds.
  static Tensor widened_buffer(Bf16Operand reuse, const Shape& shape);

  bool empty() const { return t_.numel() == 0; }
  // true: float32 holding bf16 values (the widened route's form); false: bf16
  // (or empty).
  bool widened() const { return widened_; }
  int64_t numel() const { return t_.numel(); }
  const Shape& shape() const { return t_.shape(); }
  // The storage: a bf16 tensor, or a float32 one holding bf16 values.
  const Tensor& tensor() const { return t_; }

 private:
  Bf16Operand(Tensor t, bool widened) : t_(std::move(t)), widened_(widened) {}
  Tensor t_;
  bool widened_ = false;
};

// Whether operands are made in float32 (gemm_bf16's widened route), so that a
// producer can write bf16 values in float32 (Bf16Operand::widened_values)
// instead of bf16 that would be widened.
bool bf16_operands_widened();

// An operand from its element `offset` on: a block of columns of a wider
// matrix (q, k or v of a (N, 3·d) qkv, at leading dimension 3·d). A view for
// one call: it refers to the operand, which must outlive it.
struct Bf16At {
  Bf16At(const Bf16Operand& op, int64_t at = 0) : operand(op), offset(at) {}
  const Bf16Operand& operand;
  int64_t offset;
};

// C (M, N; ldc) = alpha · op(A) · op(B) + beta · C: gemm::gemm_bf16 on
// operands made once (same conventions and checks, with the leading
// dimensions lda and ldb as gemm_bf16 takes them; an operand too small for
// its rows at its leading dimension throws std::invalid_argument). Both bf16:
// gemm_bf16; both widened: sgemm on the fast engine, the widened route's own
// product; one of each: the bf16 one widened for this call, then that sgemm.
void gemm_bf16(gemm::Trans ta, gemm::Trans tb, int64_t M, int64_t N, int64_t K, float alpha,
               Bf16At A, int64_t lda, Bf16At B, int64_t ldb, float beta, float* C, int64_t ldc);

}  // namespace attn::kernels
