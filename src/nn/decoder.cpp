// The configurable decoder of attn/decoder.h: Llama 3, Qwen2/3 and Gemma 3
// blocks from one config, forward, backward and a key/value cache whose
// sliding-window layers keep only their window.
#include "attn/decoder.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "attn/bfloat16.h"
#include "attn/decode_attention.h"
#include "attn/decode_kernels.h"
#include "attn/gemm.h"
#include "attn/layer_kernels.h"
#include "attn/ops.h"
#include "attn/sdpa.h"

namespace attn::nn {

// ---- configuration ----------------------------------------------------------------------------

const char* rope_type_name(RopeScaling::Type type) {
  switch (type) {
    case RopeScaling::Type::kDefault:
      return "default";
    case RopeScaling::Type::kLinear:
      return "linear";
    case RopeScaling::Type::kLlama3:
      return "llama3";
  }
  return "?";
}

Tensor rope_frequencies(int64_t head_dim, const RopeScaling& rope) {
  switch (rope.type) {
    case RopeScaling::Type::kDefault:
      return attn::rope_inverse_frequencies(head_dim, rope.theta);
    case RopeScaling::Type::kLinear: {
      if (!(rope.factor > 0.0f) || !std::isfinite(rope.factor)) {
        throw std::invalid_argument(
            fmt::format("rope linear: factor must be finite and > 0, got {}", rope.factor));
      }
      Tensor inv = attn::rope_inverse_frequencies(head_dim, rope.theta);
      float* p = inv.data();
      for (int64_t i = 0; i < inv.numel(); ++i) p[i] = p[i] / rope.factor;  // inv_freq /= factor
      return inv;
    }
    case RopeScaling::Type::kLlama3:
      return attn::rope_inverse_frequencies(
          head_dim, rope.theta,
          RopeFreqConfig{rope.factor, rope.low_freq_factor, rope.high_freq_factor,
                         rope.original_context_length});
  }
  throw std::invalid_argument("rope: unknown type");
}

int64_t DecoderConfig::layer_window(int64_t layer) const {
  if (layer_sliding.empty() || sliding_window <= 0) return 0;
  return layer_sliding.at(static_cast<size_t>(layer)) ? sliding_window : 0;
}

void DecoderConfig::check() const {
  const auto positive = [](const char* name, int64_t v) {
    if (v < 1)
      throw std::invalid_argument(fmt::format("DecoderConfig: {} must be >= 1, got {}", name, v));
  };
  positive("vocab_size", vocab_size);
  positive("hidden_size", hidden_size);
  positive("intermediate_size", intermediate_size);
  positive("num_layers", num_layers);
  positive("num_heads", num_heads);
  positive("num_kv_heads", num_kv_heads);
  positive("context_length", context_length);
  if (num_heads % num_kv_heads != 0) {
    throw std::invalid_argument(
        fmt::format("DecoderConfig: num_heads {} must be a multiple of num_kv_heads {}", num_heads,
                    num_kv_heads));
  }
  if (head_dim < 2 || head_dim % 2 != 0) {
    throw std::invalid_argument(
        fmt::format("DecoderConfig: head_dim must be even and >= 2, got {}", head_dim));
  }
  if (!(norm_eps >= 0.0f) || !std::isfinite(norm_eps)) {
    throw std::invalid_argument(
        fmt::format("DecoderConfig: norm_eps must be >= 0, got {}", norm_eps));
  }
  if (!(attention_scale >= 0.0f) || !std::isfinite(attention_scale)) {
    throw std::invalid_argument(
        fmt::format("DecoderConfig: attention_scale must be >= 0, got {}", attention_scale));
  }
  for (const float c : {attn_softcap, final_softcap}) {
    if (!(c >= 0.0f) || !std::isfinite(c)) {
      throw std::invalid_argument(fmt::format("DecoderConfig: a softcap must be >= 0, got {}", c));
    }
  }
  if (!layer_sliding.empty() && static_cast<int64_t>(layer_sliding.size()) != num_layers) {
    throw std::invalid_argument(
        fmt::format("DecoderConfig: layer_sliding has {} entries for num_layers {}",
                    layer_sliding.size(), num_layers));
  }
  const bool any_sliding =
      std::find(layer_sliding.begin(), layer_sliding.end(), true) != layer_sliding.end();
  if (any_sliding && sliding_window < 1) {
    throw std::invalid_argument(fmt::format(
        "DecoderConfig: sliding layers need sliding_window >= 1, got {}", sliding_window));
  }
  rope_frequencies(head_dim, rope);  // throws naming a bad theta or scaling
  if (any_sliding) rope_frequencies(head_dim, rope_local);
}

namespace {

const DecoderConfig& checked(const DecoderConfig& cfg) {
  cfg.check();
  return cfg;
}

// (B, T, H·hd) -> (B, H, T, hd) view (token-major storage read head-major).
Tensor heads_view(const Tensor& x, int64_t heads, int64_t hd) {
  return x.view({x.size(0), x.size(1), heads, hd}).transpose(1, 2);
}

// (B, H, T, hd) any layout -> (B, T, H·hd) contiguous.
Tensor merge_heads(const Tensor& x) {
  return x.transpose(1, 2).contiguous().view({x.size(0), x.size(2), x.size(1) * x.size(3)});
}

// Evaluation's products: with at most kGemvRows rows (decoding a token or a
// few), matrix-vector products that stream each weight once
// (attn/decode_kernels.h), several in one parallel region; else the Linear.
constexpr int64_t kGemvRows = 16;

// x (M, K) float32 -> bf16, rounded to nearest even.
Tensor to_bf16(const Tensor& x) {
  const Tensor xc = x.contiguous();
  Tensor out = Tensor::empty(xc.shape(), DType::kBFloat16);
  kernels::round_to_bf16(out.data_ptr<BFloat16>(), xc.data(), xc.numel());
  return out;
}

std::vector<Tensor> linear_eval(const std::vector<Linear*>& layers, const Tensor& x) {
  const int64_t in = layers[0]->options().in_features;
  const int64_t M = x.numel() / in;
  const bool bf16 = layers[0]->weight.value.dtype() == DType::kBFloat16;
  std::vector<Tensor> ys;
  if (!bf16 && M > kGemvRows) {
    for (Linear* l : layers) ys.push_back(l->forward(x));
    return ys;
  }
  const Tensor xc = x.contiguous();
  const Tensor xb = bf16 ? to_bf16(xc) : Tensor();  // bf16 weights: bf16 operands, fp32 sums
  std::vector<kernels::GemvProblem> problems;
  for (Linear* l : layers) {
    const int64_t out = l->options().out_features;
    Shape shape = x.shape();
    shape.back() = out;
    ys.push_back(Tensor::empty(shape));
    float* y = ys.back().data();
    const float* bias = l->bias.value.empty() ? nullptr : l->bias.value.data();
    if (!bf16) {
      problems.push_back({y, out, xc.data(), in, l->weight.value.data(), bias, M, out, in});
    } else if (M <= kGemvRows) {
      kernels::gemv_forward_bf16(y, out, xb.data_ptr<BFloat16>(), in,
                                 l->weight.value.data_ptr<BFloat16>(), bias, M, out, in);
    } else {  // y = x Wᵀ (+ bias)
      gemm::gemm_bf16(gemm::Trans::kNo, gemm::Trans::kYes, M, out, in, 1.0f,
                      xb.data_ptr<BFloat16>(), in, l->weight.value.data_ptr<BFloat16>(), in, 0.0f,
                      y, out);
      if (bias != nullptr) {
        for (int64_t m = 0; m < M; ++m) {
          for (int64_t n = 0; n < out; ++n) y[m * out + n] += bias[n];
        }
      }
    }
  }
  if (!problems.empty())
    kernels::gemv_forward_batch(problems.data(), static_cast<int64_t>(problems.size()));
  return ys;
}

Tensor linear_eval(Linear& layer, const Tensor& x) { return linear_eval({&layer}, x)[0]; }

}  // namespace

// ---- attention --------------------------------------------------------------------------------

DecoderAttention::DecoderAttention(const DecoderConfig& cfg, Generator& gen)
    : q_proj({cfg.hidden_size, cfg.num_heads * cfg.head_dim, cfg.qkv_bias, gemm::Engine::kFast},
             gen),
      k_proj({cfg.hidden_size, cfg.num_kv_heads * cfg.head_dim, cfg.qkv_bias, gemm::Engine::kFast},
             gen),
      v_proj({cfg.hidden_size, cfg.num_kv_heads * cfg.head_dim, cfg.qkv_bias, gemm::Engine::kFast},
             gen),
      o_proj({cfg.num_heads * cfg.head_dim, cfg.hidden_size, cfg.o_bias, gemm::Engine::kFast}, gen),
      cfg_(cfg) {
  register_module("q_proj", &q_proj);
  register_module("k_proj", &k_proj);
  register_module("v_proj", &v_proj);
  register_module("o_proj", &o_proj);
  if (cfg.qk_norm) {
    q_norm = std::make_unique<RMSNorm>(cfg.head_dim, cfg.norm_eps, cfg.norm_weight_offset);
    k_norm = std::make_unique<RMSNorm>(cfg.head_dim, cfg.norm_eps, cfg.norm_weight_offset);
    register_module("q_norm", q_norm.get());
    register_module("k_norm", k_norm.get());
  }
}

SdpaOptions DecoderAttention::sdpa_options(int64_t window) const {
  SdpaOptions o;
  o.is_causal = true;
  o.causal_alignment = CausalAlignment::kBottomRight;
  if (cfg_.attention_scale > 0.0f) o.scale = cfg_.attention_scale;
  o.enable_gqa = cfg_.num_kv_heads != cfg_.num_heads;
  o.window_left = window > 0 ? window - 1 : -1;
  o.softcap = cfg_.attn_softcap;
  return o;
}

DecoderAttention::Qkv DecoderAttention::project(const Tensor& x, const RopeParams& rope,
                                                int64_t offset, bool eval) {
  const int64_t B = x.size(0), T = x.size(1), H = cfg_.num_heads, Hkv = cfg_.num_kv_heads,
                hd = cfg_.head_dim;
  std::vector<Tensor> qkv;
  if (eval) {
    qkv = linear_eval({&q_proj, &k_proj, &v_proj}, x);
  } else {
    qkv = {q_proj.forward(x), k_proj.forward(x), v_proj.forward(x)};
  }
  Tensor q = qkv[0].view({B, T, H, hd});  // (B, T, H, hd)
  Tensor k = qkv[1].view({B, T, Hkv, hd});
  Tensor v = qkv[2];  // (B, T, Hkv·hd)
  if (q_norm) {
    q = q_norm->forward(q);
    k = k_norm->forward(k);
  }
  const RopeOptions ro{.position_offset = offset};
  Qkv r;
  r.q = apply_rope(q.transpose(1, 2), rope.cos, rope.sin, ro);  // (B, H, T, hd) contiguous
  r.k = apply_rope(k.transpose(1, 2), rope.cos, rope.sin, ro);  // (B, Hkv, T, hd)
  r.v = heads_view(v, Hkv, hd);                                 // (B, Hkv, T, hd) view
  return r;
}

Tensor DecoderAttention::forward(const Tensor& x, const RopeParams& rope, int64_t window) {
  Qkv p = project(x, rope, 0, false);
  const SdpaOptions o = sdpa_options(window);
  if (bf16_attention_) {  // mixed precision: the attention's operands rounded to bf16
    p.q = p.q.to(DType::kBFloat16);
    p.k = p.k.to(DType::kBFloat16);
    p.v = p.v.to(DType::kBFloat16);
  }
  SdpaForward f = scaled_dot_product_attention_forward(p.q, p.k, p.v, o);
  q_ = p.q;
  k_ = p.k;
  v_ = p.v;
  out_ = f.out;
  lse_ = f.lse;
  cos_ = rope.cos;
  sin_ = rope.sin;
  window_ = window;
  has_forward_ = true;
  return o_proj.forward(merge_heads(f.out.to(DType::kFloat32)));  // (B, T, E)
}

Tensor DecoderAttention::backward(const Tensor& dy) {
  require_forward(has_forward_, "DecoderAttention");
  has_forward_ = false;
  const int64_t H = cfg_.num_heads, Hkv = cfg_.num_kv_heads, hd = cfg_.head_dim;
  const Tensor dmerged = o_proj.backward(dy);  // (B, T, H·hd)
  const Tensor dout = heads_view(dmerged, H, hd).contiguous().to(q_.dtype());
  SdpaGrads g =
      scaled_dot_product_attention_backward(dout, q_, k_, v_, out_, lse_, sdpa_options(window_));
  g.dq = g.dq.to(DType::kFloat32), g.dk = g.dk.to(DType::kFloat32), g.dv = g.dv.to(DType::kFloat32);
  Tensor dq = apply_rope_backward(g.dq, cos_, sin_).transpose(1, 2).contiguous();  // (B, T, H, hd)
  Tensor dk = apply_rope_backward(g.dk, cos_, sin_).transpose(1, 2).contiguous();
  if (q_norm) {
    dq = q_norm->backward(dq);
    dk = k_norm->backward(dk);
  }
  const int64_t B = dq.size(0), T = dq.size(1);
  Tensor dx = q_proj.backward(dq.view({B, T, H * hd}));
  dx = add(dx, k_proj.backward(dk.view({B, T, Hkv * hd})));
  dx = add(dx, v_proj.backward(merge_heads(g.dv)));
  q_ = k_ = v_ = out_ = lse_ = Tensor();
  return dx;
}

Tensor DecoderAttention::forward_with(
    const Tensor& x_new, const RopeParams& rope, int64_t offset,
    const std::function<Tensor(const Tensor&, const Tensor&, const Tensor&)>& attend) {
  Qkv p = project(x_new, rope, offset, true);
  return linear_eval(o_proj, merge_heads(attend(p.q, p.k, p.v)));
}

Tensor DecoderAttention::forward_paged(
    const Tensor& x_new, const RopeParams& rope, std::span<const PagedSequence> seqs,
    const std::function<Tensor(const Tensor&, const Tensor&, const Tensor&)>& attend) {
  const int64_t N = x_new.size(1), H = cfg_.num_heads, Hkv = cfg_.num_kv_heads, hd = cfg_.head_dim;
  const std::vector<Tensor> qkv = linear_eval({&q_proj, &k_proj, &v_proj}, x_new);
  Tensor q = qkv[0].view({1, N, H, hd});  // (1, N, H, hd)
  Tensor k = qkv[1].view({1, N, Hkv, hd});
  if (q_norm) {
    q = q_norm->forward(q);
    k = k_norm->forward(k);
  }
  q = q.contiguous();
  k = k.contiguous();
  int64_t row = 0;
  for (const PagedSequence& s : seqs) {  // each sequence's rows rotated at its own positions
    const RopeOptions ro{.position_offset = s.table->length};
    Tensor qs = q.slice(1, row, row + s.count).transpose(1, 2);  // (1, H, count, hd) view
    Tensor ks = k.slice(1, row, row + s.count).transpose(1, 2);
    apply_rope_(qs, rope.cos, rope.sin, ro);
    apply_rope_(ks, rope.cos, rope.sin, ro);
    row += s.count;
  }
  const Tensor out = attend(q.view({N, H, hd}), k.view({N, Hkv, hd}),
                            qkv[2].contiguous().view({N, Hkv, hd}));  // (N, H, hd)
  return linear_eval(o_proj, out.contiguous().view({1, N, H * hd}));
}

// ---- layer ------------------------------------------------------------------------------------

DecoderLayer::DecoderLayer(const DecoderConfig& cfg, int64_t index, Generator& gen)
    : input_layernorm(cfg.hidden_size, cfg.norm_eps, cfg.norm_weight_offset),
      self_attn(cfg, gen),
      post_attention_layernorm(cfg.hidden_size, cfg.norm_eps, cfg.norm_weight_offset),
      mlp(cfg.hidden_size, cfg.intermediate_size, cfg.activation, gen, gemm::Engine::kFast),
      window_(cfg.layer_window(index)),
      sandwich_(cfg.sandwich_norms) {
  register_module("input_layernorm", &input_layernorm);
  register_module("self_attn", &self_attn);
  register_module("post_attention_layernorm", &post_attention_layernorm);
  if (sandwich_) {
    pre_feedforward_layernorm =
        std::make_unique<RMSNorm>(cfg.hidden_size, cfg.norm_eps, cfg.norm_weight_offset);
    post_feedforward_layernorm =
        std::make_unique<RMSNorm>(cfg.hidden_size, cfg.norm_eps, cfg.norm_weight_offset);
    register_module("pre_feedforward_layernorm", pre_feedforward_layernorm.get());
    register_module("post_feedforward_layernorm", post_feedforward_layernorm.get());
  }
  register_module("mlp", &mlp);
}

Tensor DecoderLayer::forward_with(const Tensor& x,
                                  const std::function<Tensor(const Tensor&)>& attention,
                                  bool eval) {
  Tensor o = attention(input_layernorm.forward(x));
  if (sandwich_) o = post_attention_layernorm.forward(o);
  const Tensor h = add(x, o);  // (B, T, E)
  const Tensor f_in =
      sandwich_ ? pre_feedforward_layernorm->forward(h) : post_attention_layernorm.forward(h);
  Tensor f;
  if (eval) {  // mlp's maths without what backward keeps, on evaluation's products
    const std::vector<Tensor> gu = linear_eval({&mlp.fc1, &mlp.fc2}, f_in);
    f = linear_eval(mlp.fc3, gated_activation(gu[0], gu[1], mlp.activation()));
  } else {
    f = mlp.forward(f_in);
  }
  if (sandwich_) f = post_feedforward_layernorm->forward(f);
  return add(h, f);
}

Tensor DecoderLayer::forward(const Tensor& x, const RopeParams& rope) {
  return forward_with(
      x, [&](const Tensor& a) { return self_attn.forward(a, rope, window_); }, false);
}

Tensor DecoderLayer::backward(const Tensor& dy) {
  Tensor df = sandwich_ ? post_feedforward_layernorm->backward(dy) : dy;
  df = mlp.backward(df);
  const Tensor dh = add(dy, sandwich_ ? pre_feedforward_layernorm->backward(df)
                                      : post_attention_layernorm.backward(df));
  Tensor dout = sandwich_ ? post_attention_layernorm.backward(dh) : dh;
  return add(dh, input_layernorm.backward(self_attn.backward(dout)));
}

// ---- the model ----------------------------------------------------------------------------------

DecoderBody::DecoderBody(const DecoderConfig& cfg, Generator& gen)
    : embed_tokens({cfg.vocab_size, cfg.hidden_size}, gen),
      norm(cfg.hidden_size, cfg.norm_eps, cfg.norm_weight_offset) {
  register_module("embed_tokens", &embed_tokens);
  for (int64_t i = 0; i < cfg.num_layers; ++i) {
    layers.push_back(std::make_unique<DecoderLayer>(cfg, i, gen));
    layers_list.append(layers.back().get());
  }
  register_module("layers", &layers_list);
  register_module("norm", &norm);
}

DecoderLM::DecoderLM(const DecoderConfig& cfg, Generator& gen)
    : model(checked(cfg), gen),
      lm_head({cfg.hidden_size, cfg.vocab_size, false, gemm::Engine::kFast}, gen),
      cfg_(cfg) {
  register_module("model", &model);
  register_module("lm_head", &lm_head);
  if (cfg.tie_embeddings) tie(lm_head.weight, model.embed_tokens.weight);
}

void DecoderLM::init_weights(Generator& gen, float std) {
  for (auto& [name, p] : named_parameters()) {
    if (p->value.dtype() != DType::kFloat32)
      throw std::logic_error("DecoderLM::init_weights: the weights are bf16 (inference only)");
    if (p->value.dim() >= 2) {
      normal_(p->value, 0.0f, std, gen);
    } else if (name.ends_with(".bias")) {
      p->value.fill_(0.0f);
    } else {  // a norm's scale: 1, or Gemma's 1 + 0
      p->value.fill_(cfg_.norm_weight_offset != 0.0f ? 0.0f : 1.0f);
    }
  }
  if (cfg_.pad_token_id >= 0) {
    Tensor& e = model.embed_tokens.weight.value;
    std::fill_n(e.data() + cfg_.pad_token_id * cfg_.hidden_size, cfg_.hidden_size, 0.0f);
  }
}

const RopeParams& DecoderLM::rope_tables(bool sliding, int64_t positions) {
  RopeParams& r = sliding ? rope_sliding_ : rope_full_;
  if (r.cos.empty() || r.cos.size(0) < positions) {
    // Grow by doubling (at least 256 rows), never past context_length.
    const int64_t have = r.cos.empty() ? 0 : r.cos.size(0);
    const int64_t rows =
        std::min(cfg_.context_length, std::max({positions, 2 * have, int64_t{256}}));
    r = attn::rope_tables(rope_frequencies(cfg_.head_dim, sliding ? cfg_.rope_local : cfg_.rope),
                          rows);
  }
  return r;
}

Tensor DecoderLM::embed(const Tensor& ids) {
  if (ids.dtype() != DType::kInt64 || ids.dim() != 2 || ids.size(1) < 1) {
    throw std::invalid_argument(
        fmt::format("DecoderLM: ids must be (B, T) int64 with T >= 1, got {} {}",
                    dtype_name(ids.dtype()), shape_str(ids.shape())));
  }
  Tensor h;
  if (weights_dtype() == DType::kBFloat16) {  // the rows widened (exactly)
    const int64_t E = cfg_.hidden_size, n = ids.numel();
    const Tensor idc = ids.contiguous();
    const int64_t* id_of = idc.data_ptr<int64_t>();
    h = Tensor::empty({ids.size(0), ids.size(1), E});
    const BFloat16* w = model.embed_tokens.weight.value.data_ptr<BFloat16>();
    for (int64_t i = 0; i < n; ++i) {
      const int64_t id = id_of[i];
      if (id < 0 || id >= cfg_.vocab_size) {
        throw std::invalid_argument(fmt::format(
            "DecoderLM: token id {} is out of range for vocab_size {}", id, cfg_.vocab_size));
      }
      to_float(w + id * E, h.data() + i * E, static_cast<size_t>(E));
    }
  } else {
    h = model.embed_tokens.forward(ids);  // (B, T, E); checks the ids' range
  }
  if (cfg_.scale_embeddings) {
    h = mul(h, static_cast<float>(std::sqrt(static_cast<double>(cfg_.hidden_size))));
  }
  return h;
}

Tensor DecoderLM::head(const Tensor& h, bool save) {
  const Tensor n = model.norm.forward(h);
  Tensor logits = save ? lm_head.forward(n) : linear_eval(lm_head, n);  // (B, T, V)
  if (cfg_.final_softcap > 0.0f) {
    const float c = cfg_.final_softcap;
    Tensor t = Tensor::empty(logits.shape());
    float* z = logits.data();
    float* tz = t.data();
    for (int64_t i = 0; i < logits.numel(); ++i) {
      tz[i] = std::tanh(z[i] / c);
      z[i] = tz[i] * c;
    }
    if (save) softcap_tanh_ = t;
  }
  return logits;
}

void DecoderLM::make_grads() {
  for (auto& [name, p] : named_parameters()) {
    if (p->grad.shape() != p->value.shape()) p->grad = Tensor(p->value.shape());
  }
  if (cfg_.tie_embeddings) lm_head.weight.grad = model.embed_tokens.weight.grad;
}

DType DecoderLM::weights_dtype() const { return model.embed_tokens.weight.value.dtype(); }

void DecoderLM::set_compute_dtype(DType dtype) {
  if ((dtype != DType::kFloat32 && dtype != DType::kBFloat16) ||
      weights_dtype() != DType::kFloat32) {
    throw std::invalid_argument(fmt::format(
        "DecoderLM: mixed precision takes float32 or bfloat16 over float32 weights, got {} over "
        "{}",
        dtype_name(dtype), dtype_name(weights_dtype())));
  }
  for (auto& layer : model.layers) {
    DecoderAttention& a = layer->self_attn;
    for (Linear* l : {&a.q_proj, &a.k_proj, &a.v_proj, &a.o_proj, &layer->mlp.fc1, &layer->mlp.fc2,
                      &layer->mlp.fc3})
      l->set_compute_dtype(dtype);
    a.set_bf16_attention(dtype == DType::kBFloat16);
  }
  lm_head.set_compute_dtype(dtype);
  compute_dtype_ = dtype;
}

void DecoderLM::use_bf16_weights() {
  for (auto& [name, p] : named_parameters()) {
    if (p->value.dim() == 2 && p->value.dtype() == DType::kFloat32) {
      p->value = to_bf16(p->value);
      p->grad = Tensor();
    }
  }
  if (cfg_.tie_embeddings) tie(lm_head.weight, model.embed_tokens.weight);
}

Tensor DecoderLM::forward(const Tensor& ids) {
  const int64_t T = ids.dim() == 2 ? ids.size(1) : 0;
  if (T > cfg_.context_length) {
    throw std::invalid_argument(
        fmt::format("DecoderLM: {} tokens pass context_length {}", T, cfg_.context_length));
  }
  if (is_training() && weights_dtype() == DType::kFloat32) make_grads();
  if (weights_dtype() == DType::kBFloat16) {  // inference: the cached path on an empty cache
    if (is_training()) {
      throw std::logic_error(
          "DecoderLM: bf16 weights are for inference; load float32 weights to train");
    }
    DecoderKVCache cache = make_kv_cache(*this, ids.size(0), std::max<int64_t>(T, 1));
    return forward_cached(*this, ids, cache);
  }
  Tensor h = embed(ids);
  for (auto& layer : model.layers) h = layer->forward(h, rope_tables(layer->window() > 0, T));
  ids_ = ids.contiguous();
  has_forward_ = true;
  return head(h, true);
}

void DecoderLM::backward(const Tensor& dlogits) {
  require_forward(has_forward_, "DecoderLM");
  has_forward_ = false;
  Tensor d = dlogits.contiguous();
  if (cfg_.final_softcap > 0.0f) {  // d/dz c·tanh(z / c) = 1 - tanh²
    d = d.clone();
    float* g = d.data();
    const float* t = softcap_tanh_.data();
    for (int64_t i = 0; i < d.numel(); ++i) g[i] = g[i] * (1.0f - t[i] * t[i]);
  }
  Tensor dh = model.norm.backward(lm_head.backward(d));
  for (int64_t i = static_cast<int64_t>(model.layers.size()) - 1; i >= 0; --i) {
    dh = model.layers[static_cast<size_t>(i)]->backward(dh);
    if (backward_hook_) backward_hook_(i);
  }
  if (cfg_.scale_embeddings) {
    dh = mul(dh, static_cast<float>(std::sqrt(static_cast<double>(cfg_.hidden_size))));
  }
  if (cfg_.pad_token_id >= 0) {  // padding_idx: the pad rows' gradients are dropped
    dh = dh.contiguous();
    const int64_t* id = ids_.data_ptr<int64_t>();
    const int64_t E = cfg_.hidden_size;
    for (int64_t n = 0; n < ids_.numel(); ++n) {
      if (id[n] == cfg_.pad_token_id) std::fill_n(dh.data() + n * E, E, 0.0f);
    }
  }
  model.embed_tokens.backward(dh);
}

float DecoderLM::forward_loss(const Tensor& ids) {
  const Tensor logits = forward(ids);
  const int64_t B = ids.size(0), T = ids.size(1);
  Tensor targets = Tensor::empty({B, T}, DType::kInt64);
  const Tensor idc = ids.contiguous();
  const int64_t* src = idc.data_ptr<int64_t>();
  int64_t* dst = targets.data_ptr<int64_t>();
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t t = 0; t < T; ++t)
      dst[b * T + t] = t + 1 < T ? src[b * T + t + 1] : ref::kIgnoreIndex;
  }
  has_loss_ = true;
  return loss_.forward(logits, targets);
}

float DecoderLM::forward_loss(const Tensor& ids, const Tensor& targets) {
  if (targets.dtype() != DType::kInt64 || targets.shape() != ids.shape()) {
    throw std::invalid_argument(fmt::format(
        "DecoderLM::forward_loss: targets must be int64 of the ids' shape {}, got {} {}",
        shape_str(ids.shape()), dtype_name(targets.dtype()), shape_str(targets.shape())));
  }
  const Tensor logits = forward(ids);
  has_loss_ = true;
  return loss_.forward(logits, targets);
}

void DecoderLM::backward_loss(float dloss) {
  if (!has_loss_) throw std::logic_error("DecoderLM: backward_loss() called before forward_loss()");
  has_loss_ = false;
  backward(loss_.backward(dloss));
}

// ---- the cache --------------------------------------------------------------------------------

int64_t DecoderKVCache::bytes() const {
  int64_t n = 0;
  for (const Layer& l : layers) {
    n += element_size(l.keys.dtype()) * l.keys.numel() +
         element_size(l.values.dtype()) * l.values.numel();
  }
  return n;
}

DecoderKVCache make_kv_cache(const DecoderLM& model, int64_t batch, int64_t capacity, DType dtype) {
  const DecoderConfig& cfg = model.config();
  if (batch < 1 || capacity < 1 || capacity > cfg.context_length) {
    throw std::invalid_argument(fmt::format(
        "make_kv_cache: batch must be >= 1 and capacity in [1, context_length {}], got batch {}, "
        "capacity {}",
        cfg.context_length, batch, capacity));
  }
  if (dtype != DType::kFloat32 && dtype != DType::kBFloat16) {
    throw std::invalid_argument(fmt::format(
        "make_kv_cache: the cache holds float32 or bfloat16, got {}", dtype_name(dtype)));
  }
  DecoderKVCache c;
  c.batch = batch;
  c.capacity = capacity;
  for (int64_t i = 0; i < cfg.num_layers; ++i) {
    DecoderKVCache::Layer l;
    l.window = cfg.layer_window(i);
    const int64_t rows = l.window > 0 ? std::min(l.window, capacity) : capacity;
    l.keys = Tensor::zeros({batch, cfg.num_kv_heads, rows, cfg.head_dim}, dtype);
    l.values = Tensor::zeros({batch, cfg.num_kv_heads, rows, cfg.head_dim}, dtype);
    c.layers.push_back(std::move(l));
  }
  return c;
}

namespace {

// Rows [p0, p0 + n) of a ring of R rows as views, in position order (at most two runs).
std::vector<std::pair<int64_t, int64_t>> ring_runs(int64_t p0, int64_t n, int64_t R) {
  std::vector<std::pair<int64_t, int64_t>> runs;  // (first slot, count)
  while (n > 0) {
    const int64_t slot = p0 % R, count = std::min(n, R - slot);
    runs.emplace_back(slot, count);
    p0 += count;
    n -= count;
  }
  return runs;
}

// Writes src (B, Hkv, n, hd) at positions p0 .. p0 + n - 1 of the layer's rows
// (a ring when the layer is windowed; only the last `rows` positions kept).
void store(Tensor& dst, const Tensor& src, int64_t p0) {
  const int64_t R = dst.size(2), n = src.size(2);
  const int64_t skip = std::max<int64_t>(0, n - R);  // positions a ring drops at once
  int64_t at = skip;
  for (const auto& [slot, count] : ring_runs(p0 + skip, n - skip, R)) {
    Tensor view = dst.slice(2, slot, slot + count);
    view.copy_(src.slice(2, at, at + count));
    at += count;
  }
}

// Positions [p0, p0 + n) of a ring in position order (B, Hkv, n, hd) float32.
Tensor gather(const Tensor& ring, int64_t p0, int64_t n) {
  std::vector<Tensor> parts;
  for (const auto& [slot, count] : ring_runs(p0, n, ring.size(2)))
    parts.push_back(ring.slice(2, slot, slot + count).to(DType::kFloat32));
  return parts.size() == 1 ? parts[0] : cat(parts, 2);
}

// Rows [0, n) of a layer's keys or values as float32 (bf16 widened exactly).
Tensor rows_f32(const Tensor& x, int64_t n) { return x.slice(2, 0, n).to(DType::kFloat32); }

}  // namespace

Tensor forward_cached(DecoderLM& model, const Tensor& ids_new, DecoderKVCache& cache,
                      bool last_only) {
  const DecoderConfig& cfg = model.config();
  if (ids_new.dim() != 2 || ids_new.size(0) != cache.batch || ids_new.size(1) < 1 ||
      ids_new.dtype() != DType::kInt64) {
    throw std::invalid_argument(fmt::format(
        "forward_cached: ids must be (B, T_new) int64 with B = {} and T_new >= 1, got {} {}",
        cache.batch, dtype_name(ids_new.dtype()), shape_str(ids_new.shape())));
  }
  if (cache.layers.size() != model.model.layers.size()) {
    throw std::invalid_argument("forward_cached: the cache was made for another model");
  }
  const int64_t p0 = cache.length, T = ids_new.size(1);
  if (T > cache.remaining()) {
    throw std::invalid_argument(
        fmt::format("forward_cached: {} new tokens at position {} pass the cache's capacity {}", T,
                    p0, cache.capacity));
  }
  Tensor h = model.embed(ids_new);
  for (size_t i = 0; i < model.model.layers.size(); ++i) {
    DecoderLayer& layer = *model.model.layers[i];
    DecoderKVCache::Layer& cl = cache.layers[i];
    const RopeParams& rope = model.rope_tables(cl.window > 0, p0 + T);
    const SdpaOptions full = layer.self_attn.sdpa_options(cl.window);
    h = layer.forward_with(
        h,
        [&](const Tensor& a) {
          return layer.self_attn.forward_with(
              a, rope, p0, [&](const Tensor& q, const Tensor& k, const Tensor& v) {
                const int64_t R = cl.keys.size(2);
                // Up to 16 new queries over every cached row they see: flash-decoding
                // (attn/decode_attention.h), its output token-major.
                const bool decode = T <= kMaxDecodeQueries && (cl.window == 0 || T == 1);
                if (decode) {
                  store(cl.keys, k, p0);
                  store(cl.values, v, p0);
                  const int64_t H = cfg.num_heads, hd = cfg.head_dim;
                  DecodeProblem dp;
                  dp.B = q.size(0);
                  dp.Hq = H;
                  dp.Hkv = cfg.num_kv_heads;
                  dp.Tq = T;
                  // A ring's rows are all visible to its one query, in any order.
                  dp.length = cl.window == 0 ? p0 + T : std::min(p0 + 1, R);
                  dp.capacity = R;
                  dp.D = hd;
                  dp.scale = cfg.attention_scale > 0.0f ? cfg.attention_scale
                                                        : 1.0f / std::sqrt(static_cast<float>(hd));
                  dp.softcap = cfg.attn_softcap;
                  const Tensor qt = q.transpose(1, 2).contiguous();  // (B, T, H, hd)
                  Tensor out = Tensor::empty({dp.B, T, H, hd});
                  if (cl.keys.dtype() == DType::kBFloat16) {
                    kernels::decode_attention_forward(out.data(), qt.data(),
                                                      cl.keys.data_ptr<BFloat16>(),
                                                      cl.values.data_ptr<BFloat16>(), dp);
                  } else {
                    kernels::decode_attention_forward(out.data(), qt.data(), cl.keys.data(),
                                                      cl.values.data(), dp);
                  }
                  return out.transpose(1, 2);  // (B, H, T, hd), a view of token-major rows
                }
                if (cl.window == 0) {  // rows [0, p0 + T): causal, aligned bottom right
                  store(cl.keys, k, p0);
                  store(cl.values, v, p0);
                  return scaled_dot_product_attention(q, rows_f32(cl.keys, p0 + T),
                                                      rows_f32(cl.values, p0 + T), full);
                }
                if (T == 1) {  // the ring holds exactly the window's keys once this one is in
                  store(cl.keys, k, p0);
                  store(cl.values, v, p0);
                  SdpaOptions o = full;
                  o.is_causal = false;
                  o.window_left = -1;
                  const int64_t n = std::min(p0 + 1, R);
                  return scaled_dot_product_attention(q, rows_f32(cl.keys, n),
                                                      rows_f32(cl.values, n), o);
                }
                // Several tokens: the earlier keys the window reaches, in order, then the new ones.
                const int64_t m = std::min({p0, cl.window - 1, R});
                Tensor K = k, V = v;
                if (cl.keys.dtype() == DType::kBFloat16) {  // as the cache will hold them
                  K = k.to(DType::kBFloat16).to(DType::kFloat32);
                  V = v.to(DType::kBFloat16).to(DType::kFloat32);
                }
                if (m > 0) {
                  K = cat({gather(cl.keys, p0 - m, m), K.contiguous()}, 2);
                  V = cat({gather(cl.values, p0 - m, m), V.contiguous()}, 2);
                }
                const Tensor out = scaled_dot_product_attention(q, K, V, full);
                store(cl.keys, k, p0);
                store(cl.values, v, p0);
                return out;
              });
        },
        true);
  }
  cache.length += T;
  if (last_only && T > 1) h = h.slice(1, T - 1, T).contiguous();  // (B, 1, E)
  return model.head(h, false);
}

PagedKVCache make_paged_kv_cache(const DecoderLM& model, int64_t block_size, int64_t num_blocks,
                                 DType dtype) {
  const DecoderConfig& cfg = model.config();
  return PagedKVCache({.num_layers = cfg.num_layers,
                       .num_kv_heads = cfg.num_kv_heads,
                       .head_dim = cfg.head_dim,
                       .block_size = block_size,
                       .num_blocks = num_blocks,
                       .dtype = dtype});
}

Tensor forward_paged(DecoderLM& model, std::span<const int64_t> ids,
                     std::span<const PagedSequence> seqs, PagedKVCache& cache) {
  const DecoderConfig& cfg = model.config();
  const PagedKVCacheOptions& co = cache.options();
  if (co.num_layers != cfg.num_layers || co.num_kv_heads != cfg.num_kv_heads ||
      co.head_dim != cfg.head_dim) {
    throw std::invalid_argument(fmt::format(
        "forward_paged: the cache was made for {} layers of {} key/value heads of width {}, the "
        "model has {}, {}, {}",
        co.num_layers, co.num_kv_heads, co.head_dim, cfg.num_layers, cfg.num_kv_heads,
        cfg.head_dim));
  }
  const int64_t N = check_paged_step(cache, seqs, "forward_paged");
  if (static_cast<int64_t>(ids.size()) != N) {
    throw std::invalid_argument(
        fmt::format("forward_paged: {} token ids for a step of {} new tokens", ids.size(), N));
  }
  int64_t end = 0;  // the furthest position the step reaches, + 1
  for (size_t s = 0; s < seqs.size(); ++s) {
    const int64_t e = seqs[s].table->length + seqs[s].count;
    if (e > cfg.context_length) {
      throw std::invalid_argument(
          fmt::format("forward_paged: sequence {} would reach position {}, past context_length {}",
                      s, e - 1, cfg.context_length));
    }
    end = std::max(end, e);
  }
  const int64_t H = cfg.num_heads, hd = cfg.head_dim;
  const float scale =
      cfg.attention_scale > 0.0f ? cfg.attention_scale : 1.0f / std::sqrt(static_cast<float>(hd));
  Tensor h = model.embed(Tensor::from_int64({1, N}, std::vector<int64_t>(ids.begin(), ids.end())));
  for (size_t i = 0; i < model.model.layers.size(); ++i) {
    DecoderLayer& layer = *model.model.layers[i];
    const int64_t layer_index = static_cast<int64_t>(i);
    const RopeParams& rope = model.rope_tables(layer.window() > 0, end);
    const PagedAttentionOptions po{
        .num_heads = H, .scale = scale, .window = layer.window(), .softcap = cfg.attn_softcap};
    h = layer.forward_with(
        h,
        [&](const Tensor& a) {
          return layer.self_attn.forward_paged(
              a, rope, seqs, [&](const Tensor& q, const Tensor& k, const Tensor& v) {
                paged_store(cache, layer_index, seqs, k.data(), v.data());
                Tensor out = Tensor::empty({N, H, hd});  // (N, H, hd)
                paged_attention_forward(out.data(), q.data(), cache, layer_index, seqs, po);
                return out;
              });
        },
        true);
  }
  // Each sequence's last row -> (1, S, E), then the head once over them.
  const Tensor last = paged_last_rows(h, seqs);
  paged_advance(seqs);
  return model.head(last, false).view({last.size(1), cfg.vocab_size});  // (S, V)
}

Tensor generate(DecoderLM& model, const Tensor& prompt, const GenerateOptions& options,
                Generator& gen, const std::vector<int64_t>& stop_ids) {
  const DecoderConfig& cfg = model.config();
  if (prompt.dim() != 2 || prompt.dtype() != DType::kInt64 || prompt.size(1) < 1) {
    throw std::invalid_argument(fmt::format("generate: the prompt must be (B, T) int64, got {} {}",
                                            dtype_name(prompt.dtype()), shape_str(prompt.shape())));
  }
  if (options.max_new_tokens < 0) {
    throw std::invalid_argument(
        fmt::format("generate: max_new_tokens must be >= 0, got {}", options.max_new_tokens));
  }
  const int64_t B = prompt.size(0), T0 = prompt.size(1);
  if (T0 + options.max_new_tokens > cfg.context_length) {
    throw std::invalid_argument(
        fmt::format("generate: a prompt of {} tokens and {} new ones pass context_length {}", T0,
                    options.max_new_tokens, cfg.context_length));
  }
  model.eval();
  DecoderKVCache cache =
      make_kv_cache(model, B, std::max<int64_t>(1, T0 + options.max_new_tokens), options.kv_dtype);
  const Tensor pc = prompt.contiguous();
  std::vector<std::vector<int64_t>> rows(static_cast<size_t>(B));
  for (int64_t b = 0; b < B; ++b) {
    rows[b].assign(pc.data_ptr<int64_t>() + b * T0, pc.data_ptr<int64_t>() + (b + 1) * T0);
  }
  const auto is_stop = [&](int64_t id) {
    return (options.eos_id && id == *options.eos_id) ||
           std::find(stop_ids.begin(), stop_ids.end(), id) != stop_ids.end();
  };
  Tensor step_ids = pc;
  for (int64_t step = 0; step < options.max_new_tokens; ++step) {
    const Tensor logits = forward_cached(model, step_ids, cache, true);  // (B, 1, V)
    const Tensor last = logits.select(1, 0).contiguous();                // (B, V)
    const std::vector<int64_t> next =
        sample_next(last, options.temperature, options.top_k, options.top_p, gen);
    if (std::all_of(next.begin(), next.end(), is_stop)) break;
    Tensor ids = Tensor::empty({B, 1}, DType::kInt64);
    for (int64_t b = 0; b < B; ++b) {
      rows[b].push_back(next[b]);
      ids.data_ptr<int64_t>()[b] = next[b];
    }
    if (options.on_token) options.on_token(next);
    step_ids = ids;
  }
  const int64_t T = static_cast<int64_t>(rows[0].size());
  Tensor out = Tensor::empty({B, T}, DType::kInt64);
  for (int64_t b = 0; b < B; ++b)
    std::copy(rows[b].begin(), rows[b].end(), out.data_ptr<int64_t>() + b * T);
  return out;
}

}  // namespace attn::nn
