// The dispatcher of the attention modules (src/nn/attention_core.h): the
// reference-or-fused rule of attn/nn.h, applied once per forward.
#include "nn/attention_core.h"

#include <fmt/format.h>

#include <stdexcept>

#include "attn/kernels.h"

namespace attn::nn::detail {

AttentionBackend choose(AttentionBackend requested, const Dropout& dropout, bool exact_dropout,
                        bool kernel_can) {
  if (requested != AttentionBackend::kAuto) return requested;
  if (!kernel_can) return AttentionBackend::kReference;
  if (dropout.is_active() && (exact_dropout || dropout.options().p >= 1.0f))
    return AttentionBackend::kReference;
  return AttentionBackend::kFused;
}

void check_fused_request(const char* module, AttentionBackend backend, int64_t head_dim,
                         float dropout, int64_t softmax_dim) {
  if (backend != AttentionBackend::kFused) return;
  if (head_dim > kernels::kMaxHeadDim) {
    throw std::invalid_argument(
        fmt::format("{}: backend = kFused needs head_dim <= {}, got {}; use kAuto or kReference",
                    module, kernels::kMaxHeadDim, head_dim));
  }
  if (dropout >= 1.0f) {
    throw std::invalid_argument(
        fmt::format("{}: backend = kFused needs dropout < 1, got {}; use kAuto or kReference",
                    module, dropout));
  }
  if (softmax_dim != -1 && softmax_dim != 2) {
    throw std::invalid_argument(fmt::format(
        "{}: backend = kFused computes the softmax over the keys only, got softmax_dim = {}",
        module, softmax_dim));
  }
}

namespace {

// The kernel's softmax runs over the keys: the last axis of the weights,
// (B, T, T) or (B, H, T, T); its heads are at most kernels::kMaxHeadDim wide.
bool kernel_computes(const AttentionSpec& s) {
  const int64_t keys_axis = s.head_axis ? 3 : 2;
  const int64_t softmax_dim = s.attention.softmax_dim;
  return s.width / s.num_heads <= kernels::kMaxHeadDim &&
         (softmax_dim == -1 || softmax_dim == keys_axis);
}

}  // namespace

AttentionCore::AttentionCore(const AttentionSpec& spec)
    : spec_(spec),
      kernel_can_(kernel_computes(spec)),
      reference_(make_reference_path(spec)),
      fused_(make_fused_path(spec)) {
  if (spec.dtype == DType::kFloat32) return;
  if (spec.dtype != DType::kBFloat16) {
    throw std::invalid_argument(fmt::format("{}: dtype must be float32 or bfloat16, got {}",
                                            spec.module, dtype_name(spec.dtype)));
  }
  if (spec.backend == AttentionBackend::kReference || !kernel_can_) {
    throw std::invalid_argument(fmt::format(
        "{}: dtype = bfloat16 runs on the fused path only, which {} (head_dim {}, max {})",
        spec.module,
        spec.backend == AttentionBackend::kReference ? "backend = kReference excludes"
                                                     : "cannot compute this module",
        spec.width / spec.num_heads, kernels::kMaxHeadDim));
  }
}

AttentionPath& AttentionCore::path(AttentionBackend backend) {
  switch (backend) {
    case AttentionBackend::kFused:
      return *fused_;
    case AttentionBackend::kReference:
    case AttentionBackend::kAuto:  // not returned by choose()
      break;
  }
  return *reference_;
}

Tensor AttentionCore::forward(const Tensor& x) {
  AttentionPath& chosen =
      path(spec_.dtype == DType::kBFloat16
               ? AttentionBackend::kFused
               : choose(spec_.backend, *spec_.dropout, spec_.exact_dropout, kernel_can_));
  for (AttentionPath* other : {reference_.get(), fused_.get()})
    if (other != &chosen) other->release();
  last_ = &chosen;
  return chosen.forward(x);
}

Tensor AttentionCore::backward(const Tensor& dy) { return last_->backward(dy); }

AttentionBackend AttentionCore::last_backend() const {
  return last_ != nullptr ? last_->backend() : AttentionBackend::kAuto;
}

const Tensor& AttentionCore::attention_weights() const {
  return (last_ != nullptr ? last_ : reference_.get())->attention_weights();
}

}  // namespace attn::nn::detail
