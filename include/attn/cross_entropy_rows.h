// attn/cross_entropy_rows.h - the cross-entropy of rows of logits in place: the
// kernel under the fused output head and loss (attn/linear_cross_entropy.h,
// which runs it on each chunk of rows' logits). The specification is
// ref::cross_entropy_forward / _backward (attn/functional_gpt.h). Per row a
// SIMD max, a SIMD sum of exp(x − max) (Highway's Exp, dynamic dispatch), the
// log-sum-exp in double, the row's loss, and optionally the row overwritten by
// its gradient.
#pragma once

#include <cstdint>

namespace attn::kernels {

// The cross-entropy of M rows of logits (M, V; ld) float32 in place: for row r
// with lse_r = max_r + log Σ_v exp(logits[r, v] − max_r), loss[r] =
// lse_r − logits[r, t_r] (0 for t_r == ignore_index), and with write_grad the
// row becomes grad_scale · (exp(logits[r] − lse_r) − onehot(t_r)) (zeros for
// an ignored row). Targets must be in range (not checked here). Rows are split
// over the OpenMP threads; each row's sums are the same for any thread count.
void cross_entropy_rows(double* loss, float* logits, int64_t ld, const int64_t* targets, int64_t M,
                        int64_t V, int64_t ignore_index, bool write_grad, float grad_scale);

}  // namespace attn::kernels
