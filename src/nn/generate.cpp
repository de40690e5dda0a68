// Generation with the chapter-4 GPT (attn/generate.h): the whole model's
// key/value cache and the book's sampler.
#include "attn/generate.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <stdexcept>

#include "attn/decode_attention.h"
#include "attn/decode_kernels.h"
#include "attn/functional.h"
#include "attn/functional_gpt.h"
#include "attn/gemm.h"
#include "attn/kernels.h"
#include "attn/layer_kernels.h"
#include "attn/ops.h"
#include "attn/utf8.h"
#include "nn/checks.h"

namespace attn::nn {
namespace {

const Tensor* bias_or_null(const Linear& layer) {
  return layer.options().bias ? &layer.bias.value : nullptr;
}

// tok_emb.weight[ids[b, t]] + pos_emb.weight[start + t] -> (B, T, E), as
// GPTModel::forward's add(tok_embeds, pos_embeds) rounds it.
Tensor embed(GPTModel& model, const std::vector<int64_t>& ids, int64_t B, int64_t T,
             int64_t start) {
  const int64_t E = model.config().emb_dim;
  const Tensor tok = model.tok_emb.weight.value.contiguous();  // (V, E)
  const Tensor pos = model.pos_emb.weight.value.contiguous();  // (context_length, E)
  Tensor x = Tensor::empty({B, T, E});                         // (B, T, E)
  float* out = x.data();
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t t = 0; t < T; ++t) {
      const float* tr = tok.data() + ids[static_cast<size_t>(b * T + t)] * E;
      float* o = out + (b * T + t) * E;
      if (model.config().rope) {  // no position embedding: positions enter as RoPE
        std::copy_n(tr, E, o);
        continue;
      }
      const float* pr = pos.data() + (start + t) * E;
      for (int64_t e = 0; e < E; ++e) o[e] = tr[e] + pr[e];
    }
  }
  return x;
}

// The last-position logits (B, V) of logits (B, T, V).
Tensor last_position(const Tensor& logits) {
  return logits.select(1, logits.size(1) - 1).contiguous();
}

// ids (B, n) of the last n tokens of every row.
Tensor tail_ids(const std::vector<std::vector<int64_t>>& rows, int64_t n) {
  std::vector<int64_t> flat;
  for (const auto& r : rows) flat.insert(flat.end(), r.end() - n, r.end());
  return Tensor::from_int64({static_cast<int64_t>(rows.size()), n}, flat);
}

// Token rows up to which a product is a GEMV per weight row (decoding),
// beyond which the GEMM of the engine runs.
constexpr int64_t kGemvRows = 4;

const float* data_or_null(const Tensor* t) { return t != nullptr ? t->data() : nullptr; }

// y (M, N) float32 = x (M, K) bf16 · W (N, K)ᵀ bf16 + bias (N, or null).
void linear_bf16(float* y, const BFloat16* x, const Tensor& W, const float* bias, int64_t M) {
  const int64_t N = W.size(0), K = W.size(1);
  const BFloat16* w = W.data_ptr<BFloat16>();
  if (M <= kGemvRows) {
    kernels::gemv_forward_bf16(y, N, x, K, w, bias, M, N, K);
    return;
  }
  float beta = 0.0f;
  if (bias != nullptr) {
    for (int64_t m = 0; m < M; ++m) std::copy_n(bias, N, y + m * N);
    beta = 1.0f;
  }
  gemm::gemm_bf16(gemm::Trans::kNo, gemm::Trans::kYes, M, N, K, 1.0f, x, K, w, K, beta, y, N);
}

// forward_cached on a bf16 cache (attn/generate.h): the bf16 model's forward,
// block by block, on the cache's bf16 weights. x is the fp32 residual stream
// (M = B·T rows); h the LayerNorm outputs in bf16.
Tensor forward_cached_bf16(GPTModel& model, const GPTWeightsBf16& w,
                           const std::vector<int64_t>& ids, int64_t B, int64_t T, GPTKVCache& cache,
                           bool all_logits) {
  const GPTConfig& cfg = model.config();
  const int64_t E = cfg.emb_dim, H = cfg.n_heads, hd = E / H, V = cfg.vocab_size, M = B * T;
  const int64_t start = cache.length(), cap = cache.context_length;
  const float eps = cfg.layer_norm_eps, scale = 1.0f / std::sqrt(float(hd));
  Tensor x = embed(model, ids, B, T, start);           // (B, T, E) float32
  Tensor h = Tensor::empty({M, E}, DType::kBFloat16);  // LayerNorm outputs
  Tensor qkv({M, 3 * E});                              // q | k | v, float32 sums
  Tensor qkv_b = Tensor::empty({M, 3 * E}, DType::kBFloat16);
  Tensor ctx = Tensor::empty({M, E}, DType::kBFloat16);    // attention context
  Tensor a({M, E});                                        // a block's branch output
  Tensor u({M, 4 * E});                                    // fc's output
  Tensor g = Tensor::empty({M, 4 * E}, DType::kBFloat16);  // GELU's
  Tensor stats({2, M});                                    // LayerNorm's mean, std (unused)
  float* xp = x.data();
  const auto norm = [&](BFloat16* out, const float* in, const LayerNorm& ln, int64_t rows) {
    kernels::layer_norm_forward_bf16(out, stats.data(), stats.data() + M, in, ln.scale.value.data(),
                                     ln.shift.value.data(), rows, E, eps);
  };
  const auto add_to_x = [&] {
    const float* ap = a.data();
    for (int64_t i = 0; i < M * E; ++i) xp[i] = ap[i] + xp[i];  // add(a, x)
  };
  for (int64_t i = 0; i < model.trf_blocks.size(); ++i) {
    const GPTWeightsBf16::Block& bw = w.blocks[static_cast<size_t>(i)];
    TransformerBlock& block = model.trf_blocks[i];
    KVCache& kv = cache.layers[static_cast<size_t>(i)];
    BFloat16* qkvp = qkv_b.data_ptr<BFloat16>();
    norm(h.data_ptr<BFloat16>(), xp, block.norm1, M);
    linear_bf16(qkv.data(), h.data_ptr<BFloat16>(), bw.qkv,
                bw.qkv_bias.empty() ? nullptr : bw.qkv_bias.data(), M);
    kernels::round_to_bf16(qkvp, qkv.data(), M * 3 * E);
    if (const RopeParams* rope = block.att.options().rope.get(); rope != nullptr) {
      // RoPE of q and k in place, the new tokens at positions start .. start + T - 1.
      const RopeRows r{.B = B,
                       .H = H,
                       .T = T,
                       .hd = hd,
                       .stride_b = T * 3 * E,
                       .stride_h = hd,
                       .stride_t = 3 * E,
                       .position_offset = start,
                       .cos = rope->cos.data(),
                       .sin = rope->sin.data()};
      kernels::rope_rows(qkvp, r);      // q
      kernels::rope_rows(qkvp + E, r);  // k
    }
    // The new keys and values into rows start .. start + T of the cache.
    BFloat16* keys = kv.keys.data_ptr<BFloat16>();
    BFloat16* values = kv.values.data_ptr<BFloat16>();
    for (int64_t b = 0; b < B; ++b) {
      for (int64_t t = 0; t < T; ++t) {
        const BFloat16* row = qkvp + (b * T + t) * 3 * E;
        for (int64_t hh = 0; hh < H; ++hh) {
          const int64_t at = ((b * H + hh) * cap + start + t) * hd;
          std::copy_n(row + E + hh * hd, hd, keys + at);
          std::copy_n(row + 2 * E + hh * hd, hd, values + at);
        }
      }
    }
    BFloat16* ctxp = ctx.data_ptr<BFloat16>();
    if (start == 0 && T > 1) {
      // A prefill of an empty cache: causal attention over the new tokens,
      // the bf16 flash kernel reading q, k, v in place.
      Tensor lse({B, H, T});
      kernels::flash_attention_forward_bf16(ctxp, lse.data(), qkvp, qkvp + E, qkvp + 2 * E,
                                            {.B = B,
                                             .T = T,
                                             .H = H,
                                             .hd = hd,
                                             .causal = true,
                                             .q_stride = 3 * E,
                                             .k_stride = 3 * E,
                                             .v_stride = 3 * E,
                                             .o_stride = E});
    } else {
      // After a filled cache: the flash-decoding kernel, q read in place from
      // the qkv rows, in blocks of up to kMaxDecodeQueries new tokens, each
      // block the last tokens so far (bottom-right causal: the query at
      // position start + t sees keys 0 .. start + t).
      for (int64_t t0 = 0; t0 < T; t0 += kMaxDecodeQueries) {
        const int64_t n = std::min(kMaxDecodeQueries, T - t0);
        kernels::decode_attention_forward_bf16(ctxp + t0 * E, qkvp + t0 * 3 * E, keys, values,
                                               {.B = B,
                                                .Hq = H,
                                                .Hkv = H,
                                                .Tq = n,
                                                .length = start + t0 + n,
                                                .capacity = cap,
                                                .D = hd,
                                                .scale = scale,
                                                .q_stride = 3 * E,
                                                .o_stride = E,
                                                .q_batch_stride = T * 3 * E,
                                                .o_batch_stride = T * E});
      }
    }
    linear_bf16(a.data(), ctxp, bw.out_proj, data_or_null(bias_or_null(block.att.out_proj)), M);
    add_to_x();  // x1 = att + x
    norm(h.data_ptr<BFloat16>(), xp, block.norm2, M);
    linear_bf16(u.data(), h.data_ptr<BFloat16>(), bw.fc, data_or_null(bias_or_null(block.ff.fc)),
                M);
    kernels::gelu_forward_bf16(g.data_ptr<BFloat16>(), u.data(), M * 4 * E);
    linear_bf16(a.data(), g.data_ptr<BFloat16>(), bw.proj,
                data_or_null(bias_or_null(block.ff.proj)), M);
    add_to_x();  // x = ff + x1
  }
  for (KVCache& kv : cache.layers) kv.length = start + T;
  // The logits of every position, or of each sequence's last.
  const int64_t rows = all_logits ? M : B;
  if (!all_logits) {
    for (int64_t b = 0; b < B; ++b) std::copy_n(xp + (b * T + T - 1) * E, E, xp + b * E);
  }
  norm(h.data_ptr<BFloat16>(), xp, model.final_norm, rows);
  Tensor logits({B, all_logits ? T : 1, V});
  linear_bf16(logits.data(), h.data_ptr<BFloat16>(), w.out_head, nullptr, rows);
  return logits;
}

std::string character_name(const std::string& ch) {
  const auto cp = static_cast<uint32_t>(decode_utf8(ch).front());  // ch: one character
  if (cp < 0x20 || cp == 0x7f) return fmt::format("U+{:04X}", cp);
  return fmt::format("'{}' (U+{:04X})", ch, cp);
}

}  // namespace

// ---- the whole model's cache ------------------------------------------------------

void GPTKVCache::reset() {
  for (KVCache& layer : layers) layer.reset();
  for (LatentKVCache& layer : latent_layers) layer.reset();
}

GPTWeightsBf16 round_weights_bf16(GPTModel& model) {
  // Every matrix a view into one bf16 arena: one allocation, so the weights a
  // token streams lie on huge pages end to end (src/tensor/storage_cache.cpp).
  std::vector<Tensor> sources;  // (out, in) float32, in the order they are read
  for (int64_t i = 0; i < model.trf_blocks.size(); ++i) {
    TransformerBlock& block = model.trf_blocks[i];
    MultiHeadAttention& att = block.att;
    sources.push_back(
        cat({att.W_query.weight.value, att.W_key.weight.value, att.W_value.weight.value},
            0));  // (3E, E)
    sources.push_back(att.out_proj.weight.value.contiguous());
    sources.push_back(block.ff.fc.weight.value.contiguous());
    sources.push_back(block.ff.proj.weight.value.contiguous());
  }
  sources.push_back(model.out_head.weight.value.contiguous());
  int64_t total = 0;
  for (const Tensor& t : sources) total += t.numel();
  const Tensor arena = Tensor::empty({total}, DType::kBFloat16);
  std::vector<Tensor> views;
  int64_t offset = 0;
  for (const Tensor& t : sources) {
    Tensor v = arena.slice(0, offset, offset + t.numel()).view(t.shape());
    kernels::round_to_bf16(v.data_ptr<BFloat16>(), t.data(), t.numel());
    views.push_back(v);
    offset += t.numel();
  }
  GPTWeightsBf16 w;
  for (int64_t i = 0; i < model.trf_blocks.size(); ++i) {
    MultiHeadAttention& att = model.trf_blocks[i].att;
    GPTWeightsBf16::Block b;
    const auto at = static_cast<size_t>(4 * i);
    b.qkv = views[at];
    if (att.W_query.options().bias) {
      b.qkv_bias = cat({att.W_query.bias.value, att.W_key.bias.value, att.W_value.bias.value}, 0)
                       .contiguous();  // (3E)
    }
    b.out_proj = views[at + 1];
    b.fc = views[at + 2];
    b.proj = views[at + 3];
    w.blocks.push_back(std::move(b));
  }
  w.out_head = views.back();
  return w;
}

GPTKVCache make_gpt_kv_cache(GPTModel& model, int64_t batch) {
  detail::check_positive("make_gpt_kv_cache", "batch", batch);
  GPTKVCache cache;
  cache.batch = batch;
  cache.context_length = model.config().context_length;
  // bf16 caches compute with the kernels; a bf16 model on attn::ref's layers
  // (LayerImpl::kReference) keeps a float32 cache.
  cache.dtype =
      model.options().dtype == DType::kBFloat16 && model.options().layers == LayerImpl::kKernel
          ? DType::kBFloat16
          : DType::kFloat32;
  for (int64_t i = 0; i < model.trf_blocks.size(); ++i) {
    if (const auto& mla = model.trf_blocks[i].latent_att; mla != nullptr) {  // float32 only
      cache.latent_layers.push_back(make_latent_kv_cache(*mla, batch, cache.context_length));
      continue;
    }
    KVCache layer = make_kv_cache(model.trf_blocks[i].att, batch);
    if (cache.dtype == DType::kBFloat16) {  // (B, H, context_length, hd) in bf16
      layer.keys = Tensor::zeros(layer.keys.shape(), DType::kBFloat16);
      layer.values = Tensor::zeros(layer.values.shape(), DType::kBFloat16);
    }
    cache.layers.push_back(std::move(layer));
  }
  if (cache.dtype == DType::kBFloat16) {
    cache.bf16_weights = std::make_shared<const GPTWeightsBf16>(round_weights_bf16(model));
  }
  return cache;
}

Tensor forward_cached(GPTModel& model, const Tensor& ids, GPTKVCache& cache, bool all_logits) {
  const GPTConfig& cfg = model.config();
  if (ids.dtype() != DType::kInt64 || ids.dim() != 2 || ids.size(0) < 1 || ids.size(1) < 1) {
    throw std::invalid_argument(
        fmt::format("forward_cached: expected token ids (B, T_new) of int64 with B, T_new >= 1, "
                    "got {} of shape {}",
                    dtype_name(ids.dtype()), shape_str(ids.shape())));
  }
  const int64_t B = ids.size(0), T = ids.size(1), start = cache.length();
  if (static_cast<int64_t>(cache.layers.size() + cache.latent_layers.size()) !=
          model.trf_blocks.size() ||
      (cfg.latent_dim > 0 ? cache.layers.size() : cache.latent_layers.size()) != 0 ||
      cache.context_length != cfg.context_length) {
    throw std::invalid_argument(fmt::format(
        "forward_cached: cache made for {} layers and context_length {} but the model has {} "
        "and {}",
        cache.layers.size(), cache.context_length, model.trf_blocks.size(), cfg.context_length));
  }
  const auto check_length = [&](int64_t length) {
    if (length != start) {
      throw std::invalid_argument(fmt::format(
          "forward_cached: the layers' caches hold different lengths ({} and {})", start, length));
    }
  };
  for (const KVCache& layer : cache.layers) check_length(layer.length);
  for (const LatentKVCache& layer : cache.latent_layers) check_length(layer.length);
  if (B != cache.batch) {
    throw std::invalid_argument(fmt::format(
        "forward_cached: input batch {} does not match the cache's batch {}", B, cache.batch));
  }
  if (start + T > cfg.context_length) {
    throw std::invalid_argument(fmt::format(
        "forward_cached: {} new token{} at positions {}..{} would exceed context_length {} (the "
        "cache holds {})",
        T, T == 1 ? "" : "s", start, start + T - 1, cfg.context_length, start));
  }
  if (model.is_training() && cfg.drop_rate > 0.0f) {
    throw std::invalid_argument(
        fmt::format("forward_cached: the model is in training mode with drop_rate {}; call "
                    "eval() first (generation applies no dropout)",
                    cfg.drop_rate));
  }
  const std::vector<int64_t> id_values = ids.to_int64_vector();
  for (int64_t id : id_values) {
    if (id < 0 || id >= cfg.vocab_size) {
      throw std::invalid_argument(fmt::format(
          "forward_cached: token id {} is out of range for vocab_size {}", id, cfg.vocab_size));
    }
  }

  // The layers as the model's options say (GPTOptions::layers): the SIMD
  // kernels and the fast GEMM, or attn::ref's loops and PyTorch's sums.
  const bool kernels = model.options().layers == LayerImpl::kKernel;
  const float kLayerNormEps = cfg.layer_norm_eps;  // every LayerNorm of the model uses it
  const gemm::Engine engine = kernels ? gemm::Engine::kFast : gemm::Engine::kBlas;
  const auto layer_norm = [&](const Tensor& in, const LayerNorm& ln) {
    if (!kernels)
      return ref::layer_norm_forward(in, ln.scale.value, ln.shift.value, kLayerNormEps, nullptr);
    const int64_t C = in.size(-1), N = in.numel() / C;
    Tensor y(in.shape()), mean({N}), std({N});  // (..., C); the statistics are not kept
    const Tensor xc = in.contiguous();
    kernels::layer_norm_forward(y.data(), mean.data(), std.data(), xc.data(), ln.scale.value.data(),
                                ln.shift.value.data(), N, C, kLayerNormEps);
    return y;
  };
  const auto gelu = [&](const Tensor& in) {
    if (!kernels) return ref::gelu_forward(in);
    Tensor y(in.shape());
    kernels::gelu_forward(y.data(), in.data(), in.numel());  // in: a fresh contiguous Linear output
    return y;
  };
  if (cache.dtype == DType::kBFloat16) {
    if (cache.bf16_weights == nullptr || !kernels) {
      throw std::invalid_argument(
          "forward_cached: a bf16 cache needs its bf16 weights (make_gpt_kv_cache) and a model "
          "with LayerImpl::kKernel");
    }
    return forward_cached_bf16(model, *cache.bf16_weights, id_values, B, T, cache, all_logits);
  }
  // Products: one GEMV per weight matrix when the batch of tokens is small
  // (decoding), else the engine's GEMM.
  const auto linear = [&](const Tensor& in, const Linear& layer) {
    const int64_t M = in.numel() / in.size(-1);
    if (!kernels || M > kGemvRows) {
      return ref::linear_forward(in, layer.weight.value, bias_or_null(layer), engine);
    }
    const Tensor xc = in.contiguous(), w = layer.weight.value.contiguous();
    const int64_t N = w.size(0), K = w.size(1);
    Shape shape = in.shape();
    shape.back() = N;
    Tensor y(shape);
    const Tensor* bias = bias_or_null(layer);
    kernels::gemv_forward(y.data(), N, xc.data(), K, w.data(),
                          bias != nullptr ? bias->data() : nullptr, M, N, K);
    return y;
  };
  Tensor x = embed(model, id_values, B, T, start);  // (B, T, E)
  for (int64_t i = 0; i < model.trf_blocks.size(); ++i) {
    TransformerBlock& block = model.trf_blocks[i];
    const Tensor h1 = layer_norm(x, block.norm1);
    const Tensor a =
        block.latent_att != nullptr
            ? forward_cached(*block.latent_att, h1, cache.latent_layers[static_cast<size_t>(i)])
            : forward_cached(block.att, h1, cache.layers[static_cast<size_t>(i)], engine);
    const Tensor x1 = add(a, x);  // (B, T, E)
    const Tensor h2 = layer_norm(x1, block.norm2);
    const Tensor u = linear(h2, block.ff.fc);
    const Tensor f = linear(gelu(u), block.ff.proj);  // (B, T, E)
    x = add(f, x1);
  }
  if (!all_logits && T > 1) x = x.slice(1, T - 1, T).contiguous();  // (B, 1, E)
  x = layer_norm(x, model.final_norm);
  return linear(x, model.out_head);  // (B, T, V), or (B, 1, V)
}

// ---- sampling -------------------------------------------------------------------------

std::vector<int64_t> sample_next(const Tensor& logits, float temperature, int64_t top_k,
                                 Generator& gen) {
  return sample_next(logits, temperature, top_k, 1.0f, gen);
}

std::vector<int64_t> sample_next(const Tensor& logits_in, float temperature, int64_t top_k,
                                 float top_p, Generator& gen) {
  if (!(top_p > 0.0f && top_p <= 1.0f)) {
    throw std::invalid_argument(
        fmt::format("sample_next: top_p must be in (0, 1], got {}", top_p));
  }
  if (top_p < 1.0f && temperature == 0.0f) {
    throw std::invalid_argument(fmt::format(
        "sample_next: top_p {} needs a temperature > 0 (temperature 0 takes the argmax)", top_p));
  }
  if (logits_in.dtype() != DType::kFloat32 || logits_in.dim() != 2 || logits_in.size(1) < 1) {
    throw std::invalid_argument(
        fmt::format("sample_next: expected logits (B, V) of float32, got {} of shape {}",
                    dtype_name(logits_in.dtype()), shape_str(logits_in.shape())));
  }
  const int64_t B = logits_in.size(0), V = logits_in.size(1);
  if (!(temperature >= 0.0f) || !std::isfinite(temperature)) {
    throw std::invalid_argument(
        fmt::format("sample_next: temperature must be a finite number >= 0, got {}", temperature));
  }
  if (top_k < 0 || top_k > V) {
    throw std::invalid_argument(
        fmt::format("sample_next: top_k must be in 1..{} (the vocabulary size), got {}", V, top_k));
  }
  Tensor logits = logits_in.contiguous().clone();  // (B, V), filtered in place
  float* l = logits.data();
  if (top_k > 0) {
    // top_logits, _ = torch.topk(logits, top_k); min_val = top_logits[:, -1]
    // logits = torch.where(logits < min_val, -inf, logits)
    std::vector<float> row(static_cast<size_t>(V));
    for (int64_t b = 0; b < B; ++b) {
      float* r = l + b * V;
      std::copy(r, r + V, row.begin());
      std::nth_element(row.begin(), row.begin() + (top_k - 1), row.end(), std::greater<float>());
      const float min_val = row[static_cast<size_t>(top_k - 1)];
      for (int64_t v = 0; v < V; ++v) {
        if (r[v] < min_val) r[v] = -std::numeric_limits<float>::infinity();
      }
    }
  }
  std::vector<int64_t> next(static_cast<size_t>(B));
  if (temperature > 0.0f) {
    // probs = torch.softmax(logits / temperature, dim=-1)
    Tensor probs = softmax(div(logits, temperature), -1);  // (B, V)
    if (top_p < 1.0f) {
      // sorted_probs, order = probs.sort(descending=True); keep order[j] while
      // the probability before it, cumsum - p_j, is below top_p.
      float* pr = probs.data();
      std::vector<int64_t> order(static_cast<size_t>(V));
      for (int64_t b = 0; b < B; ++b) {
        float* r = pr + b * V;
        for (int64_t v = 0; v < V; ++v) order[static_cast<size_t>(v)] = v;
        std::stable_sort(order.begin(), order.end(),
                         [&](int64_t x, int64_t y) { return r[x] > r[y]; });
        double before = 0.0;
        size_t j = 0;
        for (; j < order.size() && (j == 0 || before < top_p); ++j) before += r[order[j]];
        for (; j < order.size(); ++j) r[order[j]] = 0.0f;
      }
    }
    // torch.multinomial(probs, num_samples=1) on the CPU (PyTorch 1.13): with one
    // sample it draws q = empty_like(probs).exponential_(1), row-major, each
    // -1/lambda * log(1 - u) from one double uniform, rounded to float, and takes
    // argmax(probs / q) per row.
    const float* p = probs.data();
    for (int64_t b = 0; b < B; ++b) {
      float best = -std::numeric_limits<float>::infinity();
      int64_t best_v = 0;
      for (int64_t v = 0; v < V; ++v) {
        const double u = gen.uniform_double();
        const auto q = static_cast<float>(-1.0 / 1.0 * std::log(1.0 - u));
        const float score = p[b * V + v] / q;
        if (score > best || v == 0) {
          best = score;
          best_v = v;
        }
      }
      next[static_cast<size_t>(b)] = best_v;
    }
  } else {
    // idx_next = torch.argmax(logits, dim=-1): the first maximum.
    for (int64_t b = 0; b < B; ++b) {
      const float* r = l + b * V;
      next[static_cast<size_t>(b)] = std::max_element(r, r + V) - r;
    }
  }
  return next;
}

Tensor generate(GPTModel& model, const Tensor& idx, const GenerateOptions& options, Generator& gen,
                const std::function<void(int64_t, const Tensor&)>& on_step) {
  if (idx.dtype() != DType::kInt64 || idx.dim() != 2 || idx.size(0) < 1 || idx.size(1) < 1) {
    throw std::invalid_argument(fmt::format(
        "generate: expected token ids (B, T) of int64 with B, T >= 1, got {} of shape {}",
        dtype_name(idx.dtype()), shape_str(idx.shape())));
  }
  if (options.max_new_tokens < 0) {
    throw std::invalid_argument(
        fmt::format("generate: max_new_tokens must be >= 0, got {}", options.max_new_tokens));
  }
  const int64_t V = model.config().vocab_size, C = model.config().context_length;
  if (!(options.temperature >= 0.0f) || !std::isfinite(options.temperature)) {
    throw std::invalid_argument(fmt::format(
        "generate: temperature must be a finite number >= 0, got {}", options.temperature));
  }
  if (options.top_k < 0 || options.top_k > V) {
    throw std::invalid_argument(fmt::format(
        "generate: top_k must be in 1..{} (the vocabulary size), got {}", V, options.top_k));
  }
  const int64_t B = idx.size(0), T0 = idx.size(1);
  const std::vector<int64_t> flat = idx.to_int64_vector();
  std::vector<std::vector<int64_t>> rows(static_cast<size_t>(B));
  for (int64_t b = 0; b < B; ++b) {
    rows[static_cast<size_t>(b)].assign(flat.begin() + b * T0, flat.begin() + (b + 1) * T0);
  }
  GPTKVCache cache;
  if (options.use_cache) cache = make_gpt_kv_cache(model, B);
  for (int64_t step = 0; step < options.max_new_tokens; ++step) {
    const int64_t len = static_cast<int64_t>(rows.front().size());
    Tensor last;  // (B, V)
    if (!options.use_cache) {
      // idx_cond = idx[:, -context_size:]; logits = model(idx_cond)[:, -1, :]
      last = last_position(model.forward(tail_ids(rows, std::min(len, C))));
    } else if (step > 0 && cache.length() < C) {
      last = last_position(forward_cached(model, tail_ids(rows, 1), cache, false));  // one token
    } else {
      // The prompt, or a sliding window once the sequence no longer fits:
      // re-fill the cache from the last context_length tokens (positions from 0).
      cache.reset();
      last = last_position(forward_cached(model, tail_ids(rows, std::min(len, C)), cache, false));
    }
    if (on_step) on_step(step, last);
    const std::vector<int64_t> next =
        sample_next(last, options.temperature, options.top_k, options.top_p, gen);
    // if idx_next == eos_id: break
    if (options.eos_id &&
        std::all_of(next.begin(), next.end(), [&](int64_t id) { return id == *options.eos_id; })) {
      break;
    }
    for (int64_t b = 0; b < B; ++b)
      rows[static_cast<size_t>(b)].push_back(next[static_cast<size_t>(b)]);
    if (options.on_token) options.on_token(next);
  }
  std::vector<int64_t> out;
  for (const auto& r : rows) out.insert(out.end(), r.begin(), r.end());
  return Tensor::from_int64({B, static_cast<int64_t>(rows.front().size())}, out);
}

// ---- character vocabularies -----------------------------------------------------------

std::vector<int64_t> encode_text(const std::vector<std::string>& vocab, const std::string& text) {
  std::map<std::string, int64_t> index;
  for (size_t i = 0; i < vocab.size(); ++i) index.emplace(vocab[i], static_cast<int64_t>(i));
  std::vector<int64_t> ids;
  for (const std::string& ch : utf8_characters(text)) {
    const auto it = index.find(ch);
    if (it == index.end()) {
      throw std::invalid_argument(
          fmt::format("the character {} at position {} is not in the vocabulary ({} characters)",
                      character_name(ch), ids.size(), vocab.size()));
    }
    ids.push_back(it->second);
  }
  return ids;
}

std::string decode_ids(const std::vector<std::string>& vocab, const std::vector<int64_t>& ids) {
  std::string text;
  for (int64_t id : ids) {
    if (id < 0 || id >= static_cast<int64_t>(vocab.size())) {
      throw std::invalid_argument(
          fmt::format("decode: token id {} is out of range for {} tokens", id, vocab.size()));
    }
    text += vocab[static_cast<size_t>(id)];
  }
  return text;
}

// ---- continuous batching: the paged cache -------------------------------------------------

namespace {

void check_paged_gpt(const GPTModel& model) {
  const GPTConfig& cfg = model.config();
  if (model.options().dtype != DType::kFloat32 || model.options().layers != LayerImpl::kKernel ||
      cfg.rope || cfg.latent_dim > 0 || cfg.n_kv_groups > 0 || cfg.sliding_window_size > 0) {
    throw std::invalid_argument(fmt::format(
        "forward_paged: the paged GPT path runs float32 models with the kernel layers, learned "
        "positions and the chapter's multi-head attention (GPT-2); this one has dtype {}, rope "
        "{}, latent_dim {}, n_kv_groups {}, sliding_window_size {}",
        dtype_name(model.options().dtype), cfg.rope, cfg.latent_dim, cfg.n_kv_groups,
        cfg.sliding_window_size));
  }
}

// in (M, K) -> (M, N) with the layer's weight and bias: GEMV rows for a few
// tokens, the fast GEMM above (forward_cached's products).
Tensor paged_linear(const Tensor& in, const Linear& layer) {
  const int64_t M = in.numel() / in.size(-1);
  if (M > kGemvRows) {
    return ref::linear_forward(in, layer.weight.value, bias_or_null(layer), gemm::Engine::kFast);
  }
  const Tensor xc = in.contiguous(), w = layer.weight.value.contiguous();
  const int64_t N = w.size(0), K = w.size(1);
  Shape shape = in.shape();
  shape.back() = N;
  Tensor y(shape);
  kernels::gemv_forward(y.data(), N, xc.data(), K, w.data(), data_or_null(bias_or_null(layer)), M,
                        N, K);
  return y;
}

Tensor paged_layer_norm(const Tensor& in, const LayerNorm& ln, float eps) {
  const int64_t C = in.size(-1), N = in.numel() / C;
  Tensor y(in.shape()), mean({N}), std({N});  // the statistics are not kept
  const Tensor xc = in.contiguous();
  kernels::layer_norm_forward(y.data(), mean.data(), std.data(), xc.data(), ln.scale.value.data(),
                              ln.shift.value.data(), N, C, eps);
  return y;
}

}  // namespace

PagedKVCache make_paged_kv_cache(const GPTModel& model, int64_t block_size, int64_t num_blocks,
                                 DType dtype) {
  check_paged_gpt(model);
  const GPTConfig& cfg = model.config();
  return PagedKVCache({.num_layers = cfg.n_layers,
                       .num_kv_heads = cfg.n_heads,
                       .head_dim = cfg.emb_dim / cfg.n_heads,
                       .block_size = block_size,
                       .num_blocks = num_blocks,
                       .dtype = dtype});
}

Tensor forward_paged(GPTModel& model, std::span<const int64_t> ids,
                     std::span<const PagedSequence> seqs, PagedKVCache& cache) {
  check_paged_gpt(model);
  const GPTConfig& cfg = model.config();
  const int64_t H = cfg.n_heads, E = cfg.emb_dim, hd = E / H;
  const PagedKVCacheOptions& co = cache.options();
  if (co.num_layers != cfg.n_layers || co.num_kv_heads != H || co.head_dim != hd) {
    throw std::invalid_argument(fmt::format(
        "forward_paged: the cache was made for {} layers of {} heads of width {}, the model has "
        "{}, {}, {}",
        co.num_layers, co.num_kv_heads, co.head_dim, cfg.n_layers, H, hd));
  }
  const int64_t N = check_paged_step(cache, seqs, "forward_paged");
  if (static_cast<int64_t>(ids.size()) != N) {
    throw std::invalid_argument(
        fmt::format("forward_paged: {} token ids for a step of {} new tokens", ids.size(), N));
  }
  for (size_t s = 0; s < seqs.size(); ++s) {
    const int64_t e = seqs[s].table->length + seqs[s].count;
    if (e > cfg.context_length) {
      throw std::invalid_argument(
          fmt::format("forward_paged: sequence {} would reach position {}, past context_length {}",
                      s, e - 1, cfg.context_length));
    }
  }
  for (const int64_t id : ids) {
    if (id < 0 || id >= cfg.vocab_size) {
      throw std::invalid_argument(fmt::format(
          "forward_paged: token id {} is out of range for vocab_size {}", id, cfg.vocab_size));
    }
  }
  // tok_emb[id] + pos_emb[its own position] -> (1, N, E)
  const Tensor tok = model.tok_emb.weight.value.contiguous();  // (V, E)
  const Tensor pos = model.pos_emb.weight.value.contiguous();  // (context_length, E)
  Tensor x = Tensor::empty({1, N, E});
  {
    int64_t n = 0;
    for (const PagedSequence& s : seqs) {
      for (int64_t t = 0; t < s.count; ++t, ++n) {
        const float* tr = tok.data() + ids[static_cast<size_t>(n)] * E;
        const float* pr = pos.data() + (s.table->length + t) * E;
        float* o = x.data() + n * E;
        for (int64_t e = 0; e < E; ++e) o[e] = tr[e] + pr[e];
      }
    }
  }
  const float eps = cfg.layer_norm_eps;
  const PagedAttentionOptions po{.num_heads = H, .scale = 1.0f / std::sqrt(static_cast<float>(hd))};
  for (int64_t i = 0; i < model.trf_blocks.size(); ++i) {
    TransformerBlock& block = model.trf_blocks[i];
    const Tensor h1 = paged_layer_norm(x, block.norm1, eps);
    const Tensor q = paged_linear(h1, block.att.W_query);  // (1, N, E) = (N, H, hd)
    const Tensor k = paged_linear(h1, block.att.W_key);
    const Tensor v = paged_linear(h1, block.att.W_value);
    paged_store(cache, i, seqs, k.data(), v.data());
    Tensor ctx = Tensor::empty({1, N, E});  // (N, H, hd)
    paged_attention_forward(ctx.data(), q.data(), cache, i, seqs, po);
    const Tensor x1 = add(paged_linear(ctx, block.att.out_proj), x);  // (1, N, E)
    const Tensor h2 = paged_layer_norm(x1, block.norm2, eps);
    const Tensor u = paged_linear(h2, block.ff.fc);
    Tensor g(u.shape());
    kernels::gelu_forward(g.data(), u.data(), u.numel());
    x = add(paged_linear(g, block.ff.proj), x1);
  }
  const Tensor last = paged_last_rows(x, seqs);  // each sequence's last row (1, S, E)
  paged_advance(seqs);
  return paged_linear(paged_layer_norm(last, model.final_norm, eps), model.out_head)
      .view({last.size(1), cfg.vocab_size});
}

}  // namespace attn::nn
