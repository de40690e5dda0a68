// AdamW, gradient clipping and the learning-rate schedule (attn/optim.h).
#include "attn/optim.h"

#include <fmt/format.h>

#include <cmath>
#include <numbers>
#include <stdexcept>
#include <vector>

#include "attn/layer_kernels.h"

namespace attn::optim {

std::vector<ParamGroup> decay_groups(nn::Module& model, double weight_decay) {
  ParamGroup decay{.params = {}, .weight_decay = weight_decay};
  ParamGroup no_decay{.params = {}, .weight_decay = 0.0};
  for (auto& [name, p] : model.named_parameters())
    (p->value.dim() >= 2 ? decay : no_decay).params.push_back(p);
  return {decay, no_decay};
}

namespace {

const AdamWOptions& checked(const AdamWOptions& o) {
  if (!(o.lr >= 0.0))
    throw std::invalid_argument(fmt::format("AdamW: invalid learning rate: {}", o.lr));
  if (!(o.eps >= 0.0))
    throw std::invalid_argument(fmt::format("AdamW: invalid epsilon value: {}", o.eps));
  if (!(o.beta1 >= 0.0 && o.beta1 < 1.0))
    throw std::invalid_argument(
        fmt::format("AdamW: invalid beta parameter at index 0: {}", o.beta1));
  if (!(o.beta2 >= 0.0 && o.beta2 < 1.0))
    throw std::invalid_argument(
        fmt::format("AdamW: invalid beta parameter at index 1: {}", o.beta2));
  if (!(o.weight_decay >= 0.0))
    throw std::invalid_argument(
        fmt::format("AdamW: invalid weight_decay value: {}", o.weight_decay));
  return o;
}

}  // namespace

AdamW::AdamW(std::vector<ParamGroup> groups, const AdamWOptions& options)
    : groups_(std::move(groups)), options_(checked(options)) {
  for (const ParamGroup& g : groups_) {
    if (!(g.weight_decay >= 0.0))
      throw std::invalid_argument(
          fmt::format("AdamW: invalid weight_decay value: {}", g.weight_decay));
    std::vector<State> states;
    for (const nn::Parameter* p : g.params) {
      if (p->value.dtype() != DType::kFloat32 || !p->value.is_contiguous() ||
          p->grad.shape() != p->value.shape()) {
        throw std::invalid_argument(fmt::format(
            "AdamW: a parameter must be a contiguous float32 tensor with a gradient of its shape, "
            "got {} {} "
            "with gradient {}",
            dtype_name(p->value.dtype()), shape_str(p->value.shape()), shape_str(p->grad.shape())));
      }
      states.push_back({Tensor(p->value.shape()), Tensor(p->value.shape())});
    }
    state_.push_back(std::move(states));
  }
}

AdamW::AdamW(nn::Module& model, const AdamWOptions& options)
    : AdamW(decay_groups(model, options.weight_decay), options) {}

void AdamW::set_lr(double lr) {
  if (!(lr >= 0.0))
    throw std::invalid_argument(fmt::format("AdamW: invalid learning rate: {}", lr));
  options_.lr = lr;
}

void AdamW::set_steps(int64_t steps) {
  if (steps < 0) throw std::invalid_argument(fmt::format("AdamW: invalid step count: {}", steps));
  steps_ = steps;
}

void AdamW::zero_grad() {
  for (ParamGroup& g : groups_) {
    for (nn::Parameter* p : g.params) p->grad.fill_(0.0f);
  }
}

// torch/optim/adamw.py _single_tensor_adamw (1.13), one parameter at a time:
//   param.mul_(1 - lr * weight_decay)
//   exp_avg.mul_(beta1).add_(grad, alpha=1 - beta1)            fmadd(grad, alpha, exp_avg·beta1)
//   exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
//   denom = (exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(eps)
//   param.addcdiv_(exp_avg, denom, value=-step_size)             param + (−step_size·m) / denom
// The Python scalars are doubles; the kernels take them as float.
void AdamW::step() { step(1.0f, false); }

void AdamW::step(float grad_scale, bool zero_grad) {
  ++steps_;
  const double lr = options_.lr, beta1 = options_.beta1, beta2 = options_.beta2;
  const double t = static_cast<double>(steps_);
  const double bias_correction1 = 1.0 - std::pow(beta1, t);
  const double bias_correction2 = 1.0 - std::pow(beta2, t);
  const double step_size = lr / bias_correction1;
  const double bias_correction2_sqrt = std::sqrt(bias_correction2);

  const auto beta1_f = static_cast<float>(beta1), beta2_f = static_cast<float>(beta2);
  const auto one_minus_beta1 = static_cast<float>(1.0 - beta1);
  const auto one_minus_beta2 = static_cast<float>(1.0 - beta2);
  const auto eps = static_cast<float>(options_.eps);
  const auto neg_step_size = static_cast<float>(-step_size);
  const auto bc2_sqrt = static_cast<float>(bias_correction2_sqrt);
  std::vector<kernels::AdamWScalars> scalars;  // one per group
  for (const ParamGroup& g : groups_) {
    scalars.push_back({.decay = static_cast<float>(1.0 - lr * g.weight_decay),
                       .beta1 = beta1_f,
                       .beta2 = beta2_f,
                       .one_minus_beta1 = one_minus_beta1,
                       .one_minus_beta2 = one_minus_beta2,
                       .eps = eps,
                       .neg_step_size = neg_step_size,
                       .bias_correction2_sqrt = bc2_sqrt,
                       .grad_scale = grad_scale});
  }
  // With zero_grad, every parameter with a contiguous gradient in one pass on
  // the threads (one fork and join, not one per parameter); the others, and
  // all without zero_grad, one at a time. The same bits either way.
  std::vector<kernels::AdamWTensor> together;
  for (size_t gi = 0; gi < groups_.size(); ++gi) {
    for (size_t pi = 0; pi < groups_[gi].params.size(); ++pi) {
      nn::Parameter& p = *groups_[gi].params[pi];
      float* w = p.value.data();
      float* m = state_[gi][pi].exp_avg.data();
      float* v = state_[gi][pi].exp_avg_sq.data();
      if (zero_grad && p.grad.is_contiguous()) {
        together.push_back({w, m, v, p.grad.data(), p.value.numel(), &scalars[gi]});
        continue;
      }
      const Tensor grad = p.grad.contiguous();
      kernels::adamw_update(w, m, v, grad.data(), p.value.numel(), scalars[gi]);
      if (zero_grad) p.grad.fill_(0.0f);
    }
  }
  kernels::adamw_update_zero_grad(together.data(), static_cast<int64_t>(together.size()));
}

// torch.nn.utils.clip_grad_norm_ (1.13): total_norm = norm(stack([norm(g) for g])),
// clip_coef = max_norm / (total_norm + 1e-6), which Python evaluates as
// reciprocal(total_norm + 1e-6) * max_norm in float, clamped to 1.
// Each gradient's Σ g² in double (SIMD lanes, fixed chunks: kernels::sum_of_squares).
float clip_coefficient(const std::vector<nn::Parameter*>& params, double max_norm,
                       float* total_norm_out) {
  // Every gradient's Σ g² in one pass on the threads (kernels::sum_of_squares
  // over all of them: each one's bits as alone).
  std::vector<Tensor> grads;  // contiguous (the gradient itself when it is)
  std::vector<const float*> data;
  std::vector<int64_t> sizes;
  for (const nn::Parameter* p : params) {
    grads.push_back(p->grad.contiguous());
    data.push_back(grads.back().data());
    sizes.push_back(grads.back().numel());
  }
  std::vector<double> squares(params.size());
  kernels::sum_of_squares(squares.data(), data.data(), sizes.data(),
                          static_cast<int64_t>(params.size()));
  double total_sq = 0.0;
  for (const double sq : squares) {
    const auto norm = static_cast<float>(std::sqrt(sq));  // torch.norm(p.grad): a float
    total_sq += static_cast<double>(norm) * norm;
  }
  const auto total_norm = static_cast<float>(std::sqrt(total_sq));
  if (total_norm_out != nullptr) *total_norm_out = total_norm;
  if (params.empty()) return 1.0f;
  const float clip_coef = (1.0f / (total_norm + 1e-6f)) * static_cast<float>(max_norm);
  return clip_coef < 1.0f ? clip_coef : 1.0f;
}

float clip_grad_norm(const std::vector<nn::Parameter*>& params, double max_norm) {
  if (params.empty()) return 0.0f;
  float total_norm = 0.0f;
  const float clip_coef = clip_coefficient(params, max_norm, &total_norm);
  if (clip_coef < 1.0f) {
    for (nn::Parameter* p : params) {
      float* g = p->grad.data();
      const int64_t n = p->grad.numel();
#pragma omp parallel for simd schedule(static) if (n > (int64_t{1} << 16))
      for (int64_t i = 0; i < n; ++i) g[i] *= clip_coef;
    }
  }
  return total_norm;
}

float clip_grad_norm(nn::Module& model, double max_norm) {
  std::vector<nn::Parameter*> params;
  for (auto& [name, p] : model.named_parameters()) params.push_back(p);
  return clip_grad_norm(params, max_norm);
}

double get_lr(int64_t it, const CosineSchedule& s) {
  // 1) linear warm-up for warmup_iters steps
  if (it < s.warmup_iters)
    return s.learning_rate * static_cast<double>(it + 1) / static_cast<double>(s.warmup_iters + 1);
  // 2) after lr_decay_iters, min_lr
  if (it > s.lr_decay_iters) return s.min_lr;
  // 3) in between, cosine decay down to min_lr
  const double decay_ratio = static_cast<double>(it - s.warmup_iters) /
                             static_cast<double>(s.lr_decay_iters - s.warmup_iters);
  const double coeff = 0.5 * (1.0 + std::cos(std::numbers::pi * decay_ratio));  // 1 .. 0
  return s.min_lr + coeff * (s.learning_rate - s.min_lr);
}

}  // namespace attn::optim
