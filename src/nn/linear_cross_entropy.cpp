// The output head and the mean cross-entropy fused, chunk by chunk over the
// rows (attn/linear_cross_entropy.h states the maths and the contract; the
// plain path, out_head then ref::cross_entropy_forward / _backward, is the
// specification). Per chunk of C rows (shape comments for a chunk of m <= C):
//   logits = h[r0 : r0+m] Wᵀ                       (m, V)   one GEMM
//   loss[r], logits := dlogits                      kernels::cross_entropy_rows
//   dh[r0 : r0+m] = dlogits W                       (m, E)   one GEMM
//   dW += dlogitsᵀ h[r0 : r0+m]                     (V, E)   one GEMM (beta = 1)
#include "attn/linear_cross_entropy.h"

#include <fmt/format.h>

#include <algorithm>
#include <limits>
#include <stdexcept>
#include <string_view>
#include <vector>

#include "attn/cross_entropy_rows.h"
#include "attn/gemm.h"
#include "attn/layer_kernels.h"

namespace attn::nn {
namespace {

constexpr const char* kWhat = "linear_cross_entropy";

// t rounded to bf16 (contiguous), or t itself when it is bf16 already.
Tensor to_bf16(const Tensor& t) {
  if (t.dtype() == DType::kBFloat16) return t.contiguous();
  const Tensor src = t.contiguous();
  Tensor out = Tensor::empty(t.shape(), DType::kBFloat16);
  kernels::round_to_bf16(out.data_ptr<BFloat16>(), src.data(), src.numel());
  return out;
}

void check_inputs(const Tensor& h, const Tensor& W, const Tensor& targets,
                  const LinearCrossEntropyOptions& o, const Tensor* dW) {
  const bool bf16 = o.dtype == DType::kBFloat16;
  if (o.dtype != DType::kFloat32 && !bf16) {
    throw std::invalid_argument(
        fmt::format("{}: dtype must be float32 or bfloat16, got {}", kWhat, dtype_name(o.dtype)));
  }
  if (o.chunk_rows < 0) {
    throw std::invalid_argument(fmt::format("{}: chunk_rows must be >= 0 (0: {}), got {}", kWhat,
                                            kDefaultChunkRows, o.chunk_rows));
  }
  if (h.dim() != 2 || W.dim() != 2 || h.size(1) != W.size(1) || W.size(0) < 1) {
    throw std::invalid_argument(
        fmt::format("{}: expected h (N, E) and W (V, E) with V >= 1, got h {} and W {}", kWhat,
                    shape_str(h.shape()), shape_str(W.shape())));
  }
  if (h.dtype() != DType::kFloat32 && !(bf16 && h.dtype() == DType::kBFloat16)) {
    throw std::invalid_argument(fmt::format("{}: h must be float32{}, got {}", kWhat,
                                            bf16 ? " or bfloat16" : "", dtype_name(h.dtype())));
  }
  if (W.dtype() != DType::kFloat32) {
    throw std::invalid_argument(
        fmt::format("{}: W must be float32, got {}", kWhat, dtype_name(W.dtype())));
  }
  if (targets.dtype() != DType::kInt64 || targets.shape() != Shape{h.size(0)}) {
    throw std::invalid_argument(fmt::format(
        "{}: targets must be int64 of shape {}, got {} of shape {}", kWhat, shape_str({h.size(0)}),
        dtype_name(targets.dtype()), shape_str(targets.shape())));
  }
  if (dW != nullptr &&
      (dW->dtype() != DType::kFloat32 || dW->shape() != W.shape() || !dW->is_contiguous())) {
    throw std::invalid_argument(fmt::format(
        "{}: dW must be a contiguous float32 tensor of W's shape {}, got {} of shape {}", kWhat,
        shape_str(W.shape()), dtype_name(dW->dtype()), shape_str(dW->shape())));
  }
}

}  // namespace

float linear_cross_entropy(const Tensor& h_in, const Tensor& W_in, const Tensor& targets,
                           const LinearCrossEntropyOptions& o, Tensor* dh, Tensor* dW) {
  check_inputs(h_in, W_in, targets, o, dW);
  const int64_t N = h_in.size(0), E = h_in.size(1), V = W_in.size(0);
  const std::vector<int64_t> t = targets.to_int64_vector();
  int64_t counted = 0;
  for (int64_t r = 0; r < N; ++r) {
    const int64_t target = t[static_cast<size_t>(r)];
    if (target == o.ignore_index) continue;
    if (target < 0 || target >= V) {
      throw std::invalid_argument(fmt::format(
          "{}: target {} at position {} is out of range for {} classes", kWhat, target, r, V));
    }
    ++counted;
  }
  const bool grads = dh != nullptr || dW != nullptr;
  if (dh != nullptr) *dh = Tensor::empty({N, E});  // (N, E)
  if (N == 0) return std::numeric_limits<float>::quiet_NaN();
  // dlogits = (softmax − onehot) / counted: the plain path's per-row factor.
  const float scale = counted > 0 ? 1.0f / static_cast<float>(counted) : 0.0f;
  const int64_t C = std::min(N, o.chunk_rows > 0 ? o.chunk_rows : kDefaultChunkRows);
  Tensor logits = Tensor::empty({C, V});  // (C, V): the chunk's logits, then its dlogits
  std::vector<double> row_loss(static_cast<size_t>(N));
  const bool bf16 = o.dtype == DType::kBFloat16;
  // bf16 on gemm_bf16's widened route (a CPU without a fast bf16 product): h
  // and W widened once, each chunk's bf16(dlogits) widened back in place, then
  // the fp32 products below. The route's bits, without widening W (V, E) and
  // the chunk's dlogits once per product and chunk (GPT-2's W: 38.6M values).
  const bool widened = bf16 && std::string_view(gemm::gemm_bf16_route()) == "widened";
  using gemm::Trans;
  if (bf16 && !widened) {
    const Tensor hb = to_bf16(h_in), Wb = to_bf16(W_in);                      // (N, E), (V, E)
    Tensor dlb = grads ? Tensor::empty({C, V}, DType::kBFloat16) : Tensor();  // bf16(dlogits)
    const BFloat16 *h = hb.data_ptr<BFloat16>(), *Wp = Wb.data_ptr<BFloat16>();
    for (int64_t r0 = 0; r0 < N; r0 += C) {
      const int64_t m = std::min(C, N - r0);
      gemm::gemm_bf16(Trans::kNo, Trans::kYes, m, V, E, 1.0f, h + r0 * E, E, Wp, E, 0.0f,
                      logits.data(), V);
      kernels::cross_entropy_rows(row_loss.data() + r0, logits.data(), V, t.data() + r0, m, V,
                                  o.ignore_index, grads, scale);
      if (!grads) continue;
      kernels::round_to_bf16(dlb.data_ptr<BFloat16>(), logits.data(), m * V);
      const BFloat16* dl = dlb.data_ptr<BFloat16>();
      if (dh != nullptr)
        gemm::gemm_bf16(Trans::kNo, Trans::kNo, m, E, V, 1.0f, dl, V, Wp, E, 0.0f,
                        dh->data() + r0 * E, E);
      if (dW != nullptr)
        gemm::gemm_bf16(Trans::kYes, Trans::kNo, V, E, m, 1.0f, dl, V, h + r0 * E, E, 1.0f,
                        dW->data(), E);
    }
  } else {
    Tensor hc, Wc, dlb;
    if (widened) {
      hc = Tensor::empty({N, E}), Wc = Tensor::empty({V, E});
      gemm::widen_bf16(hc.data(), to_bf16(h_in).data_ptr<BFloat16>(), N * E);
      gemm::widen_bf16(Wc.data(), to_bf16(W_in).data_ptr<BFloat16>(), V * E);
      if (grads) dlb = Tensor::empty({C, V}, DType::kBFloat16);
    } else {
      hc = h_in.contiguous(), Wc = W_in.contiguous();
    }
    const float *h = hc.data(), *Wp = Wc.data();
    constexpr auto fast = gemm::Engine::kFast;
    for (int64_t r0 = 0; r0 < N; r0 += C) {
      const int64_t m = std::min(C, N - r0);
      gemm::sgemm(Trans::kNo, Trans::kYes, m, V, E, 1.0f, h + r0 * E, E, Wp, E, 0.0f, logits.data(),
                  V, fast);
      kernels::cross_entropy_rows(row_loss.data() + r0, logits.data(), V, t.data() + r0, m, V,
                                  o.ignore_index, grads, scale);
      if (!grads) continue;
      if (widened) {  // dlogits as the bf16 products take them: rounded to bf16, widened
        kernels::round_to_bf16(dlb.data_ptr<BFloat16>(), logits.data(), m * V);
        gemm::widen_bf16(logits.data(), dlb.data_ptr<BFloat16>(), m * V);
      }
      if (dh != nullptr)
        gemm::sgemm(Trans::kNo, Trans::kNo, m, E, V, 1.0f, logits.data(), V, Wp, E, 0.0f,
                    dh->data() + r0 * E, E, fast);
      if (dW != nullptr)
        gemm::sgemm(Trans::kYes, Trans::kNo, V, E, m, 1.0f, logits.data(), V, h + r0 * E, E, 1.0f,
                    dW->data(), E, fast);
    }
  }
  if (counted == 0) return std::numeric_limits<float>::quiet_NaN();
  double total = 0.0;  // rows in order: the same sum for any chunk size and thread count
  for (const double l : row_loss) total += l;
  return static_cast<float>(total / static_cast<double>(counted));
}

}  // namespace attn::nn
