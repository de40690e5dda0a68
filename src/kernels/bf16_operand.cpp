// attn/bf16_operand.h: operands of bf16 products in their route's form.
#include "attn/bf16_operand.h"

#include <fmt/format.h>

#include <stdexcept>
#include <string_view>
#include <vector>

#include "attn/layer_kernels.h"

namespace attn::kernels {
namespace {

// The float32 or bf16 tensor of this shape to write an operand into: reuse's
// when it fits and nothing else holds it, else a new one.
Tensor buffer(Bf16Operand& reuse, const Shape& shape, DType dtype) {
  const Tensor& t = reuse.tensor();
  if (!reuse.empty() && t.shape() == shape && t.dtype() == dtype && t.is_contiguous() &&
      t.storage_use_count() == 1) {
    Tensor out = t;
    reuse = Bf16Operand();
    return out;
  }
  reuse = Bf16Operand();
  return Tensor::empty(shape, dtype);
}

// op(X) is rows_op x cols_op at leading dimension ld from element at.offset:
// X must hold the elements [offset, offset + (rows - 1)·ld + cols).
void check_extent(const char* name, const Bf16At& at, gemm::Trans t, int64_t rows_op,
                  int64_t cols_op, int64_t ld) {
  const int64_t rows = t == gemm::Trans::kNo ? rows_op : cols_op;
  const int64_t cols = t == gemm::Trans::kNo ? cols_op : rows_op;
  if (rows <= 0 || cols <= 0) return;
  const int64_t n = at.operand.numel();
  if (at.offset < 0 || ld < cols || at.offset > n || (rows - 1) * ld + cols > n - at.offset) {
    throw std::invalid_argument(fmt::format(
        "kernels::gemm_bf16: operand {} of {} elements cannot hold {} rows of {} at leading "
        "dimension {} from element {}",
        name, n, rows, cols, ld, at.offset));
  }
}

}  // namespace

bool bf16_operands_widened() { return std::string_view(gemm::gemm_bf16_route()) == "widened"; }

Bf16Operand Bf16Operand::widened_values(Tensor x) {
  if (x.dtype() != DType::kFloat32 || !x.is_contiguous()) {
    throw std::invalid_argument(
        fmt::format("Bf16Operand::widened_values: x must be contiguous float32, got {}{}",
                    x.is_contiguous() ? "" : "strided ", dtype_name(x.dtype())));
  }
  return Bf16Operand(std::move(x), true);
}

Tensor Bf16Operand::widened_buffer(Bf16Operand reuse, const Shape& shape) {
  return buffer(reuse, shape, DType::kFloat32);
}

Bf16Operand Bf16Operand::rounded(const Tensor& x, Bf16Operand reuse) {
  if (x.dtype() == DType::kBFloat16) return of(x, std::move(reuse));
  if (x.dtype() != DType::kFloat32) {
    throw std::invalid_argument(fmt::format(
        "Bf16Operand::rounded: x must be float32 or bfloat16, got {}", dtype_name(x.dtype())));
  }
  const Tensor src = x.contiguous();
  if (bf16_operands_widened()) {
    Tensor out = buffer(reuse, src.shape(), DType::kFloat32);
    round_to_bf16_values(out.data(), src.data(), src.numel());
    return Bf16Operand(std::move(out), true);
  }
  Tensor out = buffer(reuse, src.shape(), DType::kBFloat16);
  round_to_bf16(out.data_ptr<BFloat16>(), src.data(), src.numel());
  return Bf16Operand(std::move(out), false);
}

Bf16Operand Bf16Operand::of(const Tensor& x, Bf16Operand reuse) {
  if (x.dtype() != DType::kBFloat16) {
    throw std::invalid_argument(
        fmt::format("Bf16Operand::of: x must be bfloat16, got {}", dtype_name(x.dtype())));
  }
  const Tensor src = x.contiguous();
  if (!bf16_operands_widened()) return Bf16Operand(src, false);
  Tensor out = buffer(reuse, src.shape(), DType::kFloat32);
  gemm::widen_bf16(out.data(), src.data_ptr<BFloat16>(), src.numel());
  return Bf16Operand(std::move(out), true);
}

void gemm_bf16(gemm::Trans ta, gemm::Trans tb, int64_t M, int64_t N, int64_t K, float alpha,
               Bf16At A, int64_t lda, Bf16At B, int64_t ldb, float beta, float* C, int64_t ldc) {
  check_extent("A", A, ta, M, K, lda);
  check_extent("B", B, tb, K, N, ldb);
  const Bf16Operand &a_op = A.operand, &b_op = B.operand;
  if (!a_op.widened() && !b_op.widened()) {
    // (An empty operand: nullptr, and no element is read.)
    const auto bf16 = [](const Bf16At& X) -> const BFloat16* {
      return X.operand.empty() ? nullptr : X.operand.tensor().data_ptr<BFloat16>() + X.offset;
    };
    gemm::gemm_bf16(ta, tb, M, N, K, alpha, bf16(A), lda, bf16(B), ldb, beta, C, ldc);
    return;
  }
  // One of each: the bf16 one widened for this call.
  std::vector<float> a_wide, b_wide;
  const auto values = [](const Bf16At& X, std::vector<float>& wide) -> const float* {
    const Tensor& t = X.operand.tensor();
    if (X.operand.empty()) return nullptr;
    if (X.operand.widened()) return t.data() + X.offset;
    wide.resize(static_cast<size_t>(t.numel()));
    gemm::widen_bf16(wide.data(), t.data_ptr<BFloat16>(), t.numel());
    return wide.data() + X.offset;
  };
  const float* a = values(A, a_wide);
  const float* b = values(B, b_wide);
  gemm::sgemm(ta, tb, M, N, K, alpha, a, lda, b, ldb, beta, C, ldc, gemm::Engine::kFast);
}

}  // namespace attn::kernels
