// attn/optim.h - training a model: AdamW, gradient clipping by global norm and
// the warm-up + cosine learning-rate schedule, with PyTorch's (and nanoGPT's)
// semantics.
//
//   optim::AdamW opt(model, {.lr = 6e-4, .beta1 = 0.9, .beta2 = 0.95, .weight_decay = 0.1});
//   for (int64_t it = 0; it < iters; ++it) {
//     opt.set_lr(optim::get_lr(it, schedule));
//     model.zero_grad();
//     Tensor logits = model.forward(x);
//     float loss = loss_fn.forward(logits, y);
//     model.backward(loss_fn.backward());
//     optim::clip_grad_norm(model, 1.0);
//     opt.step();
//   }
//
// Scalars (lr, betas, bias corrections) are computed in double, as Python
// computes them, and enter the float32 element-wise updates rounded to float,
// as PyTorch's kernels take them.
#pragma once

#include <cstdint>
#include <vector>

#include "attn/nn.h"
#include "attn/tensor.h"

namespace attn::optim {

// torch.optim.AdamW's constructor arguments and defaults.
struct AdamWOptions {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 1e-2;
};

// A parameter group: its own weight decay (the other options are shared).
struct ParamGroup {
  std::vector<nn::Parameter*> params;
  double weight_decay = 0.0;
};

// nanoGPT's configure_optimizers: parameters of dim >= 2 (weights,
// embeddings) decay with weight_decay, the others (biases, LayerNorm scale and
// shift) do not. Two groups, in named_parameters() order.
std::vector<ParamGroup> decay_groups(nn::Module& model, double weight_decay);

// torch.optim.AdamW (torch 1.13, foreach=False), for each parameter p with
// gradient g, at step t = 1, 2, ...:
//   p ← p · (1 − lr·wd)                          (decoupled weight decay, first)
//   m ← β1·m + (1 − β1)·g,   v ← β2·v + (1 − β2)·g²
//   p ← p − (lr / (1 − β1ᵗ)) · m / (√v / √(1 − β2ᵗ) + eps)
// in the float operations and order of PyTorch's single-tensor loop.
class AdamW {
 public:
  // Throws std::invalid_argument naming a value outside PyTorch's accepted
  // ranges (lr, eps, weight_decay >= 0, betas in [0, 1)).
  AdamW(std::vector<ParamGroup> groups, const AdamWOptions& options);
  // decay_groups(model, options.weight_decay).
  AdamW(nn::Module& model, const AdamWOptions& options);
  // One update of every parameter from its gradient.
  void step();
  // The same update from grad_scale · gradient (clip_coefficient's value: the
  // bits of clip_grad_norm's g *= coefficient, without writing g), and with
  // zero_grad each gradient set to zero once read (the next step's zero_grad,
  // in the same pass over the parameters).
  void step(float grad_scale, bool zero_grad);
  // Sets every parameter's gradient to zero.
  void zero_grad();
  // The learning rate of every group (param_group["lr"] = lr).
  void set_lr(double lr);
  double lr() const { return options_.lr; }
  int64_t steps() const { return steps_; }
  // The state, for checkpoints: the moments of parameter `param` of group
  // `group` (m and v, the parameter's shape; handles on the optimizer's own
  // storage, so copy_ into them to restore) and the step count t.
  Tensor& exp_avg(size_t group, size_t param) { return state_.at(group).at(param).exp_avg; }
  Tensor& exp_avg_sq(size_t group, size_t param) { return state_.at(group).at(param).exp_avg_sq; }
  // Throws std::invalid_argument for steps < 0.
  void set_steps(int64_t steps);
  const std::vector<ParamGroup>& groups() const { return groups_; }

 private:
  struct State {
    Tensor exp_avg;     // m, shape of the parameter
    Tensor exp_avg_sq;  // v
  };
  std::vector<ParamGroup> groups_;
  std::vector<std::vector<State>> state_;  // [group][param]
  AdamWOptions options_;
  int64_t steps_ = 0;
};

// torch.nn.utils.clip_grad_norm_(params, max_norm): the L2 norm of all
// gradients together, total = √(Σ_p ‖g_p‖²); when max_norm / (total + 1e-6) < 1
// every gradient is multiplied by it. Returns total (before clipping).
float clip_grad_norm(const std::vector<nn::Parameter*>& params, double max_norm);
float clip_grad_norm(nn::Module& model, double max_norm);
// The same total norm without touching the gradients: the coefficient that
// clip_grad_norm multiplies them by (1 when it leaves them), for
// AdamW::step(grad_scale, ...). total_norm (may be null) receives the norm.
float clip_coefficient(const std::vector<nn::Parameter*>& params, double max_norm,
                       float* total_norm = nullptr);

// nanoGPT's get_lr: linear warm-up for warmup_iters iterations,
// learning_rate · (it + 1) / (warmup_iters + 1); then cosine decay to min_lr at
// lr_decay_iters, min_lr + ½ (1 + cos(π · (it − warmup_iters) /
// (lr_decay_iters − warmup_iters))) · (learning_rate − min_lr); min_lr after.
struct CosineSchedule {
  double learning_rate = 6e-4;
  double min_lr = 6e-5;
  int64_t warmup_iters = 2000;
  int64_t lr_decay_iters = 600000;
};
double get_lr(int64_t it, const CosineSchedule& schedule);

}  // namespace attn::optim
