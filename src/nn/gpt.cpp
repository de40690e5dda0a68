// The book's GPT model (attn/gpt.h): LayerNorm, GELU, FeedForward,
// TransformerBlock, GPTModel and the cross-entropy loss. The maths is in
// src/reference/functional_gpt.cpp (attn/functional_gpt.h); the modules own parameters and
// the state of the last forward, and run their children in the book's order.
#include "attn/gpt.h"

#include <fmt/format.h>

#include <cmath>
#include <stdexcept>

#include "attn/functional.h"
#include "attn/gemm.h"
#include "attn/layer_kernels.h"
#include "attn/linear_cross_entropy.h"
#include "attn/ops.h"
#include "nn/checks.h"

namespace attn::nn {
namespace {

const GPTConfig& checked(const GPTConfig& cfg) {
  detail::check_positive("GPTModel", "vocab_size", cfg.vocab_size);
  detail::check_positive("GPTModel", "context_length", cfg.context_length);
  detail::check_positive("GPTModel", "emb_dim", cfg.emb_dim);
  detail::check_positive("GPTModel", "n_heads", cfg.n_heads);
  detail::check_positive("GPTModel", "n_layers", cfg.n_layers);
  if (cfg.emb_dim % cfg.n_heads != 0) {
    throw std::invalid_argument(fmt::format(
        "GPTModel: emb_dim ({}) must be divisible by n_heads ({})", cfg.emb_dim, cfg.n_heads));
  }
  if (cfg.n_kv_groups < 0 || (cfg.n_kv_groups > 0 && cfg.n_heads % cfg.n_kv_groups != 0)) {
    throw std::invalid_argument(
        fmt::format("GPTModel: n_heads ({}) must be divisible by n_kv_groups ({}; 0: off)",
                    cfg.n_heads, cfg.n_kv_groups));
  }
  if (cfg.sliding_window_size < 0) {
    throw std::invalid_argument(fmt::format(
        "GPTModel: sliding_window_size must be >= 0 (0: off), got {}", cfg.sliding_window_size));
  }
  if (!(cfg.layer_norm_eps > 0.0f) || !std::isfinite(cfg.layer_norm_eps)) {
    throw std::invalid_argument(
        fmt::format("GPTModel: layer_norm_eps must be a finite number > 0, got {}",
                    cfg.layer_norm_eps));
  }
  if (!(cfg.drop_rate >= 0.0f && cfg.drop_rate <= 1.0f)) {
    throw std::invalid_argument(
        fmt::format("GPTModel: drop_rate must be in [0, 1], got {}", cfg.drop_rate));
  }
  if (cfg.rope && (cfg.emb_dim / cfg.n_heads) % 2 != 0) {
    throw std::invalid_argument(
        fmt::format("GPTModel: rope needs an even head_dim, got emb_dim {} / n_heads {} = {}",
                    cfg.emb_dim, cfg.n_heads, cfg.emb_dim / cfg.n_heads));
  }
  if (cfg.latent_dim < 0 || (cfg.latent_dim > 0 && cfg.rope)) {
    throw std::invalid_argument(fmt::format(
        "GPTModel: latent_dim must be >= 0 (0: no latent attention) and cannot go with rope, got "
        "latent_dim {}, rope {}",
        cfg.latent_dim, cfg.rope));
  }
  if ((cfg.n_kv_groups > 0 || cfg.sliding_window_size > 0) && (cfg.rope || cfg.latent_dim > 0)) {
    throw std::invalid_argument(fmt::format(
        "GPTModel: n_kv_groups / sliding_window_size (grouped-query, sliding-window attention) "
        "cannot go with rope or latent_dim, got n_kv_groups {}, sliding_window_size {}, rope {}, "
        "latent_dim {}",
        cfg.n_kv_groups, cfg.sliding_window_size, cfg.rope, cfg.latent_dim));
  }
  if (cfg.rope && (!(cfg.theta_base > 1.0f) || !std::isfinite(cfg.theta_base))) {
    throw std::invalid_argument(
        fmt::format("GPTModel: theta_base must be finite and > 1, got {}", cfg.theta_base));
  }
  return cfg;
}

// Draws for the unused pos_emb placeholder of a RoPE model, away from the model's generator.
Generator& placeholder_generator() {
  thread_local Generator gen(0);
  return gen;
}

// The GEMM of the layers' Linear maps: the fast one with the kernels, PyTorch's sums with the
// reference.
gemm::Engine engine_of(LayerImpl impl) {
  return impl == LayerImpl::kKernel ? gemm::Engine::kFast : gemm::Engine::kBlas;
}

// x ⊙ noise, or x itself when the noise is empty (dropout off).
Tensor apply_noise(const Tensor& x, const Tensor& noise) {
  return noise.empty() ? x : ref::dropout_forward(x, noise);
}

}  // namespace

// ---- LayerNorm ------------------------------------------------------------------------

namespace {
DType checked_out_dtype(const char* module, DType out_dtype) {
  if (out_dtype != DType::kFloat32 && out_dtype != DType::kBFloat16) {
    throw std::invalid_argument(fmt::format("{}: out_dtype must be float32 or bfloat16, got {}",
                                            module, dtype_name(out_dtype)));
  }
  return out_dtype;
}
}  // namespace

LayerNorm::LayerNorm(int64_t emb_dim, float eps, LayerImpl impl, DType out_dtype)
    : emb_dim_(emb_dim),
      eps_(eps),
      impl_(impl),
      out_dtype_(checked_out_dtype("LayerNorm", out_dtype)) {
  detail::check_positive("LayerNorm", "emb_dim", emb_dim);
  scale.value = Tensor::ones({emb_dim});   // (E)
  shift.value = Tensor::zeros({emb_dim});  // (E)
  register_parameter("scale", &scale);
  register_parameter("shift", &shift);
}

Tensor LayerNorm::forward(const Tensor& x) {
  if (x.dim() < 1 || x.size(-1) != emb_dim_) {
    throw std::invalid_argument(fmt::format("LayerNorm: input shape {} does not end in emb_dim {}",
                                            shape_str(x.shape()), emb_dim_));
  }
  x_ = x;
  has_forward_ = true;
  if (impl_ == LayerImpl::kReference) {
    const Tensor y = ref::layer_norm_forward(x, scale.value, shift.value, eps_, &saved_);
    return out_dtype_ == DType::kFloat32 ? y : y.to(out_dtype_);
  }
  if (x.dtype() != DType::kFloat32) {
    throw std::invalid_argument(fmt::format("LayerNorm: input must be float32, got {} of shape {}",
                                            dtype_name(x.dtype()), shape_str(x.shape())));
  }
  x_ = x.contiguous();
  const int64_t N = x.numel() / emb_dim_;
  Tensor y = Tensor::empty(x.shape(), out_dtype_);  // (..., E)
  saved_ = {Tensor({N}), Tensor({N})};              // mean, std (N)
  if (out_dtype_ == DType::kBFloat16) {
    kernels::layer_norm_forward_bf16(y.data_ptr<BFloat16>(), saved_.mean.data(), saved_.std.data(),
                                     x_.data(), scale.value.data(), shift.value.data(), N, emb_dim_,
                                     eps_);
  } else {
    kernels::layer_norm_forward(y.data(), saved_.mean.data(), saved_.std.data(), x_.data(),
                                scale.value.data(), shift.value.data(), N, emb_dim_, eps_);
  }
  return y;
}

RMSNorm::RMSNorm(int64_t dim, float eps, float weight_offset)
    : dim_(dim), eps_(eps), weight_offset_(weight_offset) {
  detail::check_positive("RMSNorm", "dim", dim);
  if (!(eps >= 0.0f) || !std::isfinite(eps))
    throw std::invalid_argument(fmt::format("RMSNorm: eps must be >= 0, got {}", eps));
  if (weight_offset != 0.0f && weight_offset != 1.0f)
    throw std::invalid_argument(fmt::format(
        "RMSNorm: weight_offset must be 0 (Llama, Qwen) or 1 (Gemma), got {}", weight_offset));
  // The scale starts at 1 either way: weight 1, or 1 + weight with weight 0.
  weight.value = weight_offset == 0.0f ? Tensor::ones({dim}) : Tensor::zeros({dim});  // (E)
  register_parameter("weight", &weight);
}

Tensor RMSNorm::forward(const Tensor& x) {
  if (x.dim() < 1 || x.size(-1) != dim_) {
    throw std::invalid_argument(
        fmt::format("RMSNorm: input shape {} does not end in dim {}", shape_str(x.shape()), dim_));
  }
  x_ = x;
  has_forward_ = true;
  if (x.dtype() != DType::kFloat32 || weight.value.dtype() != DType::kFloat32)
    return ref::rms_norm_forward(x, weight.value, eps_, weight_offset_, &saved_);  // its checks
  const Tensor xc = x.contiguous();
  const int64_t N = xc.numel() / dim_;
  Tensor y = Tensor::empty(xc.shape());  // (..., E), every element written
  saved_ = {Tensor::empty({N})};         // inv_rms (N)
  kernels::rms_norm_forward(y.data(), saved_.inv_rms.data(), xc.data(), weight.value.data(), N,
                            dim_, eps_, weight_offset_);
  return y;
}

Tensor RMSNorm::backward(const Tensor& dy) {
  require_forward(has_forward_, "RMSNorm");
  detail::check_grad("RMSNorm", dy, x_.shape());
  return ref::rms_norm_backward(dy, x_, weight.value, weight_offset_, saved_, weight.grad);
}

GatedFeedForward::GatedFeedForward(int64_t emb_dim, int64_t hidden_dim, GateActivation act,
                                   Generator& gen, gemm::Engine engine)
    : fc1({emb_dim, hidden_dim, false, engine}, gen),
      fc2({emb_dim, hidden_dim, false, engine}, gen),
      fc3({hidden_dim, emb_dim, false, engine}, gen),
      act_(act) {
  if (act != GateActivation::kSiLU && act != GateActivation::kGeluTanh)
    throw std::invalid_argument(fmt::format("GatedFeedForward: unknown activation {}", int(act)));
  register_module("fc1", &fc1);
  register_module("fc2", &fc2);
  register_module("fc3", &fc3);
}

Tensor gate_activation(const Tensor& h, GateActivation act) {
  if (act == GateActivation::kGeluTanh) return ref::gelu_forward(h);
  const Tensor hc = h.contiguous();
  Tensor a(hc.shape());  // silu(h) = h · σ(h), σ(h) = 1 / (1 + e^-h)
  const float* hp = hc.data();
  float* ap = a.data();
  for (int64_t i = 0; i < hc.numel(); ++i) ap[i] = hp[i] / (1.0f + std::exp(-hp[i]));
  return a;
}

Tensor gated_activation(const Tensor& g, const Tensor& u, GateActivation act) {
  const Tensor gc = g.contiguous().to(DType::kFloat32), uc = u.contiguous().to(DType::kFloat32);
  if (gc.shape() != uc.shape()) {
    throw std::invalid_argument(fmt::format("gated_activation: g {} and u {} differ in shape",
                                            shape_str(gc.shape()), shape_str(uc.shape())));
  }
  Tensor z = Tensor::empty(gc.shape());  // every element written
  kernels::gated_activation_forward(z.data(), nullptr, gc.data(), uc.data(), gc.numel(),
                                    act == GateActivation::kGeluTanh);
  return z;
}

Tensor GatedFeedForward::forward(const Tensor& x) {
  h1_ = fc1.forward(x).contiguous();  // (..., H), checks x
  h2_ = fc2.forward(x).contiguous();  // (..., H)
  has_forward_ = true;
  return fc3.forward(gated_activation(h1_, h2_, act_));
}

// z = a ⊙ u with a = act(h1), u = h2: dh1 = dz ⊙ u ⊙ act'(h1), dh2 = dz ⊙ a,
// dx = fc1's dx + fc2's dx (kernels::gated_activation_backward; the reference:
// silu'(h) = σ(h) · (1 + h · (1 − σ(h))), ref::gelu_backward's factor).
Tensor GatedFeedForward::backward(const Tensor& dy) {
  require_forward(has_forward_, "GatedFeedForward");
  const Tensor dz = fc3.backward(dy).contiguous();  // (..., H)
  Tensor dh1 = Tensor::empty(h1_.shape()), dh2 = Tensor::empty(h1_.shape());
  kernels::gated_activation_backward(dh1.data(), dh2.data(), dz.data(), h1_.data(), h2_.data(),
                                     h1_.numel(), act_ == GateActivation::kGeluTanh);
  const Tensor dx1 = fc1.backward(dh1);
  const Tensor dx2 = fc2.backward(dh2);
  return add(dx1, dx2);
}

Tensor LayerNorm::backward(const Tensor& dy) {
  require_forward(has_forward_, "LayerNorm");
  detail::check_grad("LayerNorm", dy, x_.shape());
  if (impl_ == LayerImpl::kReference) {
    return ref::layer_norm_backward(dy, x_, scale.value, saved_, scale.grad, shift.grad);
  }
  const Tensor dyc = dy.contiguous();
  Tensor dx = Tensor::empty(x_.shape());  // (..., E), every element written
  kernels::layer_norm_backward(dx.data(), scale.grad.data(), shift.grad.data(), dyc.data(),
                               x_.data(), scale.value.data(), saved_.mean.data(), saved_.std.data(),
                               x_.numel() / emb_dim_, emb_dim_);
  return dx;
}

Tensor LayerNorm::forward_add(const Tensor& a, const Tensor& r, Tensor* x1) {
  const bool fusable = impl_ == LayerImpl::kKernel && a.dtype() == DType::kFloat32 &&
                       r.dtype() == DType::kFloat32 && a.shape() == r.shape() && a.dim() >= 1 &&
                       a.size(-1) == emb_dim_;
  if (!fusable) {
    *x1 = add(a, r);
    return forward(*x1);
  }
  const Tensor ac = a.contiguous(), rc = r.contiguous();
  *x1 = Tensor::empty(a.shape());  // (..., E)
  x_ = *x1;
  has_forward_ = true;
  const int64_t N = a.numel() / emb_dim_;
  Tensor y = Tensor::empty(a.shape(), out_dtype_);  // (..., E)
  saved_ = {Tensor({N}), Tensor({N})};              // mean, std (N)
  if (out_dtype_ == DType::kBFloat16) {
    kernels::add_layer_norm_forward_bf16(x1->data(), y.data_ptr<BFloat16>(), saved_.mean.data(),
                                         saved_.std.data(), ac.data(), rc.data(),
                                         scale.value.data(), shift.value.data(), N, emb_dim_, eps_);
  } else {
    kernels::add_layer_norm_forward(x1->data(), y.data(), saved_.mean.data(), saved_.std.data(),
                                    ac.data(), rc.data(), scale.value.data(), shift.value.data(), N,
                                    emb_dim_, eps_);
  }
  return y;
}

Tensor LayerNorm::backward_add(const Tensor& dy, const Tensor& dresidual) {
  require_forward(has_forward_, "LayerNorm");
  detail::check_grad("LayerNorm", dy, x_.shape());
  if (impl_ == LayerImpl::kReference || dresidual.shape() != x_.shape() ||
      dresidual.dtype() != DType::kFloat32) {
    return add(dresidual, backward(dy));
  }
  const Tensor dyc = dy.contiguous(), drc = dresidual.contiguous();
  Tensor dx = Tensor::empty(x_.shape());  // (..., E), every element written
  kernels::layer_norm_backward_add(dx.data(), scale.grad.data(), shift.grad.data(), dyc.data(),
                                   drc.data(), x_.data(), scale.value.data(), saved_.mean.data(),
                                   saved_.std.data(), x_.numel() / emb_dim_, emb_dim_);
  return dx;
}

// ---- GELU ---------------------------------------------------------------------------------

GELU::GELU(LayerImpl impl, DType out_dtype)
    : impl_(impl), out_dtype_(checked_out_dtype("GELU", out_dtype)) {}

Tensor GELU::forward(const Tensor& x) {
  x_ = x;
  has_forward_ = true;
  if (impl_ == LayerImpl::kReference) {
    const Tensor y = ref::gelu_forward(x);
    return out_dtype_ == DType::kFloat32 ? y : y.to(out_dtype_);
  }
  if (x.dtype() != DType::kFloat32) {
    throw std::invalid_argument(fmt::format("GELU: input must be float32, got {} of shape {}",
                                            dtype_name(x.dtype()), shape_str(x.shape())));
  }
  x_ = x.contiguous();
  Tensor y = Tensor::empty(x.shape(), out_dtype_);
  if (out_dtype_ == DType::kBFloat16) {
    kernels::gelu_forward_bf16(y.data_ptr<BFloat16>(), x_.data(), x_.numel());
  } else {
    kernels::gelu_forward(y.data(), x_.data(), x_.numel());
  }
  return y;
}

Tensor GELU::backward(const Tensor& dy) {
  require_forward(has_forward_, "GELU");
  detail::check_grad("GELU", dy, x_.shape());
  if (impl_ == LayerImpl::kReference) return ref::gelu_backward(dy, x_);
  const Tensor dyc = dy.contiguous();
  Tensor dx = Tensor::empty(x_.shape());  // every element written
  kernels::gelu_backward(dx.data(), dyc.data(), x_.data(), x_.numel());
  return dx;
}

// ---- FeedForward ----------------------------------------------------------------------

FeedForward::FeedForward(const GPTConfig& cfg, Generator& gen, LayerImpl impl, DType dtype)
    : fc({cfg.emb_dim, 4 * cfg.emb_dim, true, engine_of(impl), dtype}, gen),
      gelu(impl, dtype),  // bf16 mode: bf16 out, proj's operand as it is
      proj({4 * cfg.emb_dim, cfg.emb_dim, true, engine_of(impl), dtype}, gen),
      impl_(impl),
      dtype_(dtype) {
  layers.append(&fc);
  layers.append(&gelu);
  layers.append(&proj);
  register_module("layers", &layers);
}

Tensor FeedForward::forward(const Tensor& x) {
  if (impl_ == LayerImpl::kKernel) return forward_fused(x, nullptr);
  fused_forward_ = false;
  return proj.forward(gelu.forward(fc.forward(x)));
}

Tensor FeedForward::forward_add(const Tensor& x, const Tensor& residual) {
  if (impl_ == LayerImpl::kKernel && residual.dtype() == DType::kFloat32 && x.dim() >= 1 &&
      residual.shape() == x.shape() && x.size(-1) == fc.options().in_features) {
    return forward_fused(x, &residual);
  }
  return add(forward(x), residual);
}

Tensor FeedForward::backward(const Tensor& dy) {
  if (fused_forward_) return backward_fused(dy);
  return fc.backward(gelu.backward(proj.backward(dy)));
}

// With N the rows of x, E = emb_dim, H = 4E (bf16 mode: the products' operands
// rounded to bf16, as Linear's bf16 mode; sums and everything else float32):
//   h = x W_fcᵀ                    (N, H)  a beta = 0 product
//   g = gelu(h + b_fc), h = gelu'(h + b_fc)   (N, H)  one pass, one tanh (g bf16
//                                  in bf16 mode; the slope h is what the backward needs)
//   y = [residual +] b_proj        (N, E)  then y += g W_projᵀ (beta = 1)
Tensor FeedForward::forward_fused(const Tensor& x, const Tensor* residual) {
  const int64_t E = fc.options().in_features, H = fc.options().out_features;
  if (x.dim() < 1 || x.size(-1) != E) {
    throw std::invalid_argument(
        fmt::format("FeedForward: input shape {} does not end in emb_dim {}", shape_str(x.shape()), E));
  }
  const bool bf16 = dtype_ == DType::kBFloat16;
  if (x.dtype() != DType::kFloat32 && !(bf16 && x.dtype() == DType::kBFloat16)) {
    throw std::invalid_argument(fmt::format("FeedForward: input must be float32{}, got {} of shape {}",
                                            bf16 ? " or bfloat16" : "", dtype_name(x.dtype()),
                                            shape_str(x.shape())));
  }
  const int64_t N = x.numel() / E;
  x_shape_ = x.shape();
  fused_forward_ = true;
  h_ = Tensor::empty({N, H});
  // (bf16 mode: g_ is the GELU kernel's bf16 output where operands are bf16;
  // where they are widened, g_b_ holds g in float32 and g_ stays empty.)
  g_ = bf16 ? Tensor() : Tensor::empty({N, H});
  Tensor y = Tensor::empty({N, E});
  const Tensor rc = residual != nullptr ? residual->contiguous() : Tensor();
  if (bf16) {
    x_ = Tensor();
    x_b_ = kernels::Bf16Operand::rounded(x, std::move(x_b_));
    w_fc_b_ = kernels::Bf16Operand::rounded(fc.weight.value, std::move(w_fc_b_));
    w_proj_b_ = kernels::Bf16Operand::rounded(proj.weight.value, std::move(w_proj_b_));
    kernels::gemm_bf16(gemm::Trans::kNo, gemm::Trans::kYes, N, H, E, 1.0f, x_b_, E, w_fc_b_, E,
                       0.0f, h_.data(), H);
    if (kernels::bf16_operands_widened()) {  // g's bf16 values written in float32
      Tensor g = kernels::Bf16Operand::widened_buffer(std::move(g_b_), {N, H});
      kernels::bias_gelu_forward_slope_bf16_values(h_.data(), g.data(), fc.bias.value.data(), N, H);
      g_b_ = kernels::Bf16Operand::widened_values(std::move(g));
    } else {
      g_ = Tensor::empty({N, H}, DType::kBFloat16);
      kernels::bias_gelu_forward_slope_bf16(h_.data(), g_.data_ptr<BFloat16>(),
                                            fc.bias.value.data(), N, H);
      g_b_ = kernels::Bf16Operand::of(g_);
    }
  } else {
    x_ = x.contiguous().reshape({N, E});
    gemm::sgemm(gemm::Trans::kNo, gemm::Trans::kYes, N, H, E, 1.0f, x_.data(), E,
                fc.weight.value.data(), E, 0.0f, h_.data(), H, gemm::Engine::kFast);
    kernels::bias_gelu_forward_slope(h_.data(), g_.data(), fc.bias.value.data(), N, H);
  }
  if (residual != nullptr) {
    kernels::fill_rows_add(y.data(), E, proj.bias.value.data(), rc.data(), E, N, E);
  } else {
    kernels::fill_rows(y.data(), E, proj.bias.value.data(), N, E);
  }
  if (bf16) {
    kernels::gemm_bf16(gemm::Trans::kNo, gemm::Trans::kYes, N, E, H, 1.0f, g_b_, H, w_proj_b_, H,
                       1.0f, y.data(), E);
  } else {
    gemm::sgemm(gemm::Trans::kNo, gemm::Trans::kYes, N, E, H, 1.0f, g_.data(), H,
                proj.weight.value.data(), H, 1.0f, y.data(), E, gemm::Engine::kFast);
  }
  return y.reshape(x_shape_);
}

//   dW_proj += dyᵀ g,  db_proj += Σ_rows dy,  dg = dy W_proj         (N, H)
//   dh = gelu'(h) ⊙ dg,  db_fc += Σ_rows dh    one pass (gelu'(h) kept by the forward)
//   dW_fc += dhᵀ x,    dx = dh W_fc                                  (N, E)
Tensor FeedForward::backward_fused(const Tensor& dy) {
  detail::check_grad("FeedForward", dy, x_shape_);
  const int64_t E = fc.options().in_features, H = fc.options().out_features;
  const int64_t N = h_.size(0);
  const Tensor dyc = dy.contiguous();
  Tensor dg = Tensor::empty({N, H});
  Tensor dx = Tensor::empty({N, E});
  using gemm::Trans;
  if (dtype_ == DType::kBFloat16) {
    // dy and dh rounded to bf16 once each for their two products.
    const kernels::Bf16Operand dyb = kernels::Bf16Operand::rounded(dyc);
    kernels::gemm_bf16(Trans::kYes, Trans::kNo, E, H, N, 1.0f, dyb, E, g_b_, H, 1.0f,
                       proj.weight.grad.data(), H);
    kernels::column_sums_accumulate(proj.bias.grad.data(), dyc.data(), E, N, E);
    kernels::gemm_bf16(Trans::kNo, Trans::kNo, N, H, E, 1.0f, dyb, E, w_proj_b_, H, 0.0f, dg.data(),
                       H);
    kernels::Bf16Operand dh;
    if (kernels::bf16_operands_widened()) {  // dh's bf16 values in float32, in place of dg
      kernels::slope_backward_bias_bf16_values(dg.data(), fc.bias.grad.data(), dg.data(), h_.data(),
                                               N, H);
      dh = kernels::Bf16Operand::widened_values(dg);
    } else {
      Tensor dhb = Tensor::empty({N, H}, DType::kBFloat16);
      kernels::slope_backward_bias_bf16(dhb.data_ptr<BFloat16>(), fc.bias.grad.data(), dg.data(),
                                        h_.data(), N, H);
      dh = kernels::Bf16Operand::of(dhb);
    }
    kernels::gemm_bf16(Trans::kYes, Trans::kNo, H, E, N, 1.0f, dh, H, x_b_, E, 1.0f,
                       fc.weight.grad.data(), E);
    kernels::gemm_bf16(Trans::kNo, Trans::kNo, N, E, H, 1.0f, dh, H, w_fc_b_, E, 0.0f, dx.data(),
                       E);
  } else {
    const gemm::Engine fast = gemm::Engine::kFast;
    gemm::sgemm(Trans::kYes, Trans::kNo, E, H, N, 1.0f, dyc.data(), E, g_.data(), H, 1.0f,
                proj.weight.grad.data(), H, fast);
    kernels::column_sums_accumulate(proj.bias.grad.data(), dyc.data(), E, N, E);
    gemm::sgemm(Trans::kNo, Trans::kNo, N, H, E, 1.0f, dyc.data(), E, proj.weight.value.data(), H,
                0.0f, dg.data(), H, fast);
    // dh in place of dg: each element is read before it is written.
    kernels::slope_backward_bias(dg.data(), fc.bias.grad.data(), dg.data(), h_.data(), N, H);
    gemm::sgemm(Trans::kYes, Trans::kNo, H, E, N, 1.0f, dg.data(), H, x_.data(), E, 1.0f,
                fc.weight.grad.data(), E, fast);
    gemm::sgemm(Trans::kNo, Trans::kNo, N, E, H, 1.0f, dg.data(), H, fc.weight.value.data(), E,
                0.0f, dx.data(), E, fast);
  }
  return dx.reshape(x_shape_);
}

// ---- TransformerBlock -----------------------------------------------------------------

namespace {

// The RoPE tables of cfg (rope_params_of), or null without cfg.rope.
std::shared_ptr<const RopeParams> rope_params_of(const GPTConfig& cfg) {
  if (!checked(cfg).rope) return nullptr;
  return std::make_shared<const RopeParams>(
      compute_rope_params(cfg.emb_dim / cfg.n_heads, cfg.theta_base, cfg.context_length));
}

}  // namespace

namespace {

// The book's MLA block's att (cfg.latent_dim > 0), or null.
std::unique_ptr<MultiHeadLatentAttention> latent_att_of(const GPTConfig& cfg,
                                                        const GPTOptions& options, Generator& gen) {
  if (checked(cfg).latent_dim == 0) return nullptr;
  if (options.dtype != DType::kFloat32) {
    throw std::invalid_argument(fmt::format(
        "GPTModel: latent_dim (multi-head latent attention) runs in float32 only, got dtype {}",
        dtype_name(options.dtype)));
  }
  return std::make_unique<MultiHeadLatentAttention>(
      MultiHeadLatentAttentionOptions{.d_in = cfg.emb_dim,
                                      .d_out = cfg.emb_dim,
                                      .dropout = cfg.drop_rate,
                                      .num_heads = cfg.n_heads,
                                      .qkv_bias = cfg.qkv_bias,
                                      .latent_dim = cfg.latent_dim},
      gen);
}

}  // namespace

TransformerBlock::TransformerBlock(const GPTConfig& cfg, const GPTOptions& options, Generator& gen,
                                   std::shared_ptr<const RopeParams> rope)
    : latent_att(latent_att_of(cfg, options, gen)),
      // With latent attention a one-wide placeholder, from a private generator.
      att({.d_in = latent_att ? 1 : cfg.emb_dim,
           .d_out = latent_att ? 1 : cfg.emb_dim,
           .context_length = latent_att ? 1 : cfg.context_length,
           .dropout = cfg.drop_rate,
           .num_heads = latent_att ? 1 : cfg.n_heads,
           .qkv_bias = cfg.qkv_bias,
           .backend = options.attention_backend,
           .exact_dropout = options.exact_dropout,
           .dtype = options.dtype,
           .rope = rope != nullptr ? std::move(rope) : rope_params_of(cfg),
           .variant = cfg.n_kv_groups > 0            ? AttentionVariant::kGroupedQuery
                      : cfg.sliding_window_size > 0 ? AttentionVariant::kSlidingWindow
                                                    : AttentionVariant::kChapter,
           .num_kv_groups = cfg.n_kv_groups,
           .sliding_window_size = cfg.sliding_window_size},
          latent_att ? placeholder_generator() : gen),
      ff(cfg, gen, options.layers, options.dtype),
      // bf16 mode: the norms hand bf16 to the products that read them.
      norm1(cfg.emb_dim, cfg.layer_norm_eps, options.layers, options.dtype),
      norm2(cfg.emb_dim, cfg.layer_norm_eps, options.layers, options.dtype),
      drop_shortcut({cfg.drop_rate}, gen) {
  if (latent_att) {
    register_module("att", latent_att.get());
  } else {
    register_module("att", &att);
  }
  register_module("ff", &ff);
  register_module("norm1", &norm1);
  register_module("norm2", &norm2);
  register_module("drop_shortcut", &drop_shortcut);
}

// The draws happen in the book's order: the attention's mask inside att, then
// drop_shortcut after att, then drop_shortcut after ff.
Tensor TransformerBlock::forward(const Tensor& x) {
  // x (B, T, E); att checks the shape and T <= context_length.
  const Tensor h = norm1.forward(x);
  const Tensor a = latent_att ? latent_att->forward(h) : att.forward(h);  // (B, T, E)
  if (!drop_shortcut.is_active()) {
    // No masks: the residual adds inside norm2's pass and ff's product.
    noise_att_ = Tensor();
    noise_ff_ = Tensor();
    Tensor x1;                                      // x + a (B, T, E)
    const Tensor h2 = norm2.forward_add(a, x, &x1);  // norm2(x1)
    has_forward_ = true;
    return ff.forward_add(h2, x1);  // x1 + ff(norm2(x1))
  }
  noise_att_ = drop_shortcut.sample_noise(a.shape());    // empty when off
  const Tensor x1 = add(apply_noise(a, noise_att_), x);  // (B, T, E)
  const Tensor f = ff.forward(norm2.forward(x1));        // (B, T, E)
  noise_ff_ = drop_shortcut.sample_noise(f.shape());
  has_forward_ = true;
  return add(apply_noise(f, noise_ff_), x1);
}

Tensor TransformerBlock::backward(const Tensor& dy) {
  require_forward(has_forward_, "TransformerBlock");
  if (noise_ff_.empty() && noise_att_.empty()) {  // the residual adds in the norms' passes
    const Tensor dx1 = norm2.backward_add(ff.backward(dy), dy);
    return norm1.backward_add(latent_att ? latent_att->backward(dx1) : att.backward(dx1), dx1);
  }
  // out = x1 + drop(ff(norm2(x1))): dx1 = dy + norm2ᵀ ffᵀ (dy ⊙ noise_ff)
  const Tensor dff = noise_ff_.empty() ? dy : ref::dropout_backward(dy, noise_ff_);
  const Tensor dx1 = add(dy, norm2.backward(ff.backward(dff)));
  // x1 = x + drop(att(norm1(x))): dx = dx1 + norm1ᵀ attᵀ (dx1 ⊙ noise_att)
  const Tensor datt = noise_att_.empty() ? dx1 : ref::dropout_backward(dx1, noise_att_);
  return add(dx1, norm1.backward(latent_att ? latent_att->backward(datt) : att.backward(datt)));
}

int64_t layer_sliding_window(const GPTConfig& cfg, int64_t layer) {
  if (cfg.sliding_window_size <= 0) return 0;
  const int64_t K = cfg.sliding_window_stride;  // K:1, K window layers then one full
  // K >= n_layers windows every layer (K + 1 is not formed: a checkpoint's K may be int64's
  // largest).
  const bool windowed = K <= 0 ? K < 0 : K >= cfg.n_layers || layer % (K + 1) < K;
  return windowed ? cfg.sliding_window_size : 0;
}

// ---- TransformerBlocks ----------------------------------------------------------------

TransformerBlocks::TransformerBlocks(const GPTConfig& cfg, const GPTOptions& options,
                                     Generator& gen) {
  const std::shared_ptr<const RopeParams> rope = rope_params_of(cfg);  // one table for all layers
  for (int64_t i = 0; i < cfg.n_layers; ++i) {
    blocks_.push_back(std::make_unique<TransformerBlock>(cfg, options, gen, rope));
    // The book's SWA GPT: blk.att.sliding_window_size = window_size if use_swa else None
    if (cfg.sliding_window_size > 0)
      blocks_.back()->att.set_sliding_window_size(layer_sliding_window(cfg, i));
    register_module(std::to_string(i), blocks_.back().get());
  }
}

Tensor TransformerBlocks::forward(const Tensor& x) {
  Tensor h = x;
  for (auto& block : blocks_) h = block->forward(h);
  return h;
}

Tensor TransformerBlocks::backward(const Tensor& dy) {
  Tensor d = dy;
  for (auto it = blocks_.rbegin(); it != blocks_.rend(); ++it) {
    d = (*it)->backward(d);
    if (backward_hook_) backward_hook_(static_cast<int64_t>(blocks_.rend() - it) - 1);
  }
  return d;
}

// ---- GPTModel -------------------------------------------------------------------------

GPTModel::GPTModel(const GPTConfig& cfg, const GPTOptions& options, Generator& gen)
    : tok_emb({checked(cfg).vocab_size, cfg.emb_dim}, gen),
      // With RoPE no position embedding: a placeholder drawn from a private generator.
      pos_emb({cfg.rope ? 1 : cfg.context_length, cfg.emb_dim},
              cfg.rope ? placeholder_generator() : gen),
      drop_emb({cfg.drop_rate}, gen),
      trf_blocks(cfg, options, gen),
      final_norm(cfg.emb_dim, cfg.layer_norm_eps, options.layers, options.dtype),
      out_head({cfg.emb_dim, cfg.vocab_size, false, engine_of(options.layers), options.dtype}, gen),
      cfg_(cfg),
      options_(options) {
  register_module("tok_emb", &tok_emb);
  if (!cfg.rope) register_module("pos_emb", &pos_emb);
  register_module("drop_emb", &drop_emb);
  register_module("trf_blocks", &trf_blocks);
  register_module("final_norm", &final_norm);
  register_module("out_head", &out_head);
  if (cfg.tie_embeddings) tie(out_head.weight, tok_emb.weight);
}

// in_idx (B, T) -> final_norm's output (B, T, E) (bf16 in bf16 mode).
Tensor GPTModel::forward_hidden(const Tensor& in_idx) {
  if (in_idx.dtype() != DType::kInt64 || in_idx.dim() != 2) {
    throw std::invalid_argument(
        fmt::format("GPTModel: expected token ids (B, T) of int64, got {} of shape {}",
                    dtype_name(in_idx.dtype()), shape_str(in_idx.shape())));
  }
  const int64_t B = in_idx.size(0), T = in_idx.size(1);
  if (B < 1 || T < 1) {
    throw std::invalid_argument(
        fmt::format("GPTModel: token ids of shape {} are empty", shape_str(in_idx.shape())));
  }
  if (T > cfg_.context_length) {
    throw std::invalid_argument(fmt::format(
        "GPTModel: input has {} tokens but context_length is {}", T, cfg_.context_length));
  }
  std::vector<int64_t> positions(static_cast<size_t>(T));
  for (int64_t t = 0; t < T; ++t) positions[static_cast<size_t>(t)] = t;  // torch.arange(T)
  const Tensor tok_embeds = tok_emb.forward(in_idx);                      // (B, T, E)
  // RoPE: positions enter in the attention layers, not here.
  Tensor x = drop_emb.forward(cfg_.rope ? tok_embeds : add(tok_embeds, pos_emb.forward(positions)));
  x = trf_blocks.forward(x);
  B_ = B;
  T_ = T;
  return final_norm.forward(x);
}

void GPTModel::backward_hidden(const Tensor& dx_in) {
  Tensor dx = final_norm.backward(dx_in);  // (B, T, E)
  dx = trf_blocks.backward(dx);
  dx = drop_emb.backward(dx);
  tok_emb.backward(dx);
  if (!cfg_.rope) pos_emb.backward(sum(dx, 0));  // the (T, E) positions were broadcast over B
}

Tensor GPTModel::forward(const Tensor& in_idx) {
  const Tensor x = forward_hidden(in_idx);  // (B, T, E)
  has_forward_ = true;
  loss_state_ = LossState::kNone;  // the head's saved input is this forward's now
  return out_head.forward(x);  // (B, T, V)
}

void GPTModel::backward(const Tensor& dlogits) {
  require_forward(has_forward_, "GPTModel");
  detail::check_grad("GPTModel", dlogits, {B_, T_, cfg_.vocab_size});
  backward_hidden(out_head.backward(dlogits));  // (B, T, E)
}

bool GPTModel::fused_loss() const {
  return options_.fused_loss && options_.layers == LayerImpl::kKernel;
}

float GPTModel::forward_loss(const Tensor& in_idx, const Tensor& targets) {
  if (targets.dtype() != DType::kInt64 || targets.shape() != in_idx.shape()) {
    throw std::invalid_argument(fmt::format(
        "GPTModel: targets must be int64 of the token ids' shape {}, got {} of shape {}",
        shape_str(in_idx.shape()), dtype_name(targets.dtype()), shape_str(targets.shape())));
  }
  loss_state_ = LossState::kNone;
  if (!fused_loss()) {
    const Tensor logits = forward(in_idx);  // (B, T, V)
    const float loss = plain_loss_.forward(logits, targets);
    loss_state_ = LossState::kPlain;
    return loss;
  }
  has_forward_ = false;  // out_head.forward does not run: backward(dlogits) has nothing to use
  const Tensor x = forward_hidden(in_idx);  // (B, T, E)
  const int64_t N = B_ * T_, E = cfg_.emb_dim, V = cfg_.vocab_size;
  const LinearCrossEntropyOptions o{.chunk_rows = options_.loss_chunk_rows, .dtype = options_.dtype};
  if (!is_training()) {
    loss_dh_ = Tensor();
    const float loss = linear_cross_entropy(x.reshape({N, E}), out_head.weight.value,
                                            targets.reshape({N}), o);
    loss_state_ = LossState::kFusedNoGrad;
    return loss;
  }
  if (loss_dW_.shape() != Shape{V, E}) loss_dW_ = Tensor({V, E});
  else loss_dW_.fill_(0.0f);
  Tensor dh;  // (N, E)
  const float loss = linear_cross_entropy(x.reshape({N, E}), out_head.weight.value,
                                          targets.reshape({N}), o, &dh, &loss_dW_);
  loss_dh_ = dh.reshape({B_, T_, E});
  loss_state_ = LossState::kFused;
  return loss;
}

void GPTModel::backward_loss(float dloss) {
  switch (loss_state_) {
    case LossState::kNone:
      throw std::logic_error("GPTModel: backward_loss() called before forward_loss()");
    case LossState::kFusedNoGrad:
      throw std::logic_error(
          "GPTModel: backward_loss() after a fused forward_loss() in evaluation mode, which "
          "computes no gradients (call train() before forward_loss())");
    case LossState::kPlain:
      backward(plain_loss_.backward(dloss));
      return;
    case LossState::kFused:
      break;
  }
  // The fused pass computed the gradients of the loss itself (dloss = 1).
  float* g = out_head.weight.grad.data();
  const float* dW = loss_dW_.data();
  const int64_t n = loss_dW_.numel();
#pragma omp parallel for simd schedule(static) if (n > (int64_t{1} << 16))
  for (int64_t i = 0; i < n; ++i) g[i] += dloss * dW[i];
  backward_hidden(dloss == 1.0f ? loss_dh_ : mul(loss_dh_, dloss));
}

// ---- CrossEntropyLoss -----------------------------------------------------------------

float CrossEntropyLoss::forward(const Tensor& logits, const Tensor& targets) {
  has_forward_ = true;
  return ref::cross_entropy_forward(logits, targets, &saved_, ignore_index_);
}

Tensor CrossEntropyLoss::backward(float dloss) {
  if (!has_forward_) throw std::logic_error("CrossEntropyLoss: backward() called before forward()");
  return ref::cross_entropy_backward(dloss, saved_);
}

}  // namespace attn::nn
