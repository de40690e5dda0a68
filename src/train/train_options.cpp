// The flags of `attn train` (attn/train.h): TrainOptions' checks, and its JSON
// (a checkpoint's "train_args").
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <type_traits>

#include "attn/train.h"
#include "attn/train_flags.h"
#include "attn/utf8.h"

namespace attn::train {

using nlohmann::json;

namespace {

constexpr int64_t kMaxBatchTokens = int64_t{1} << 24;      // tokens in one micro-batch
constexpr int64_t kMaxBlockParameters = int64_t{1} << 36;  // ~69 billion

// A path into train_args: bytes that are not UTF-8 as KEY (with U+FFFD) and
// KEY_hex (lossless), as attn/utf8.h says; UTF-8 as KEY alone.
template <typename J>
void put_bytes(J& j, const char* key, const std::string& bytes) {
  if (is_utf8(bytes)) {
    j[key] = bytes;
    return;
  }
  j[key] = utf8_replacing_invalid(bytes);
  j[std::string(key) + "_hex"] = hex_of(bytes);
}

}  // namespace

void TrainOptions::validate() const {
  // Each integer flag in its range (attn/train_flags.h; the CLI checks the
  // same as it parses), before anything is allocated (issue 46).
  for (const FlagRange& r : integer_flag_ranges()) {
    const int64_t v = this->*r.field;
    if (v < r.min)
      throw std::invalid_argument(fmt::format("--{} must be >= {}, got {}", r.flag, r.min, v));
    if (v > r.max)
      throw std::invalid_argument(fmt::format("--{} must be at most {}, got {}", r.flag, r.max, v));
  }
  // What the sizes imply: the tokens of a micro-batch, and the parameters of
  // the blocks (about 4·emb·attention width + 3·emb·feed-forward width each).
  if (batch_size * context_length > kMaxBatchTokens)
    throw std::invalid_argument(fmt::format(
        "--batch-size {} x --context-length {} = {} tokens per micro-batch, more than {}",
        batch_size, context_length, batch_size * context_length, kMaxBatchTokens));
  const double width = static_cast<double>(head_dim > 0 ? n_heads * head_dim : emb_dim);
  const double ffn = static_cast<double>(ffn_dim > 0 ? ffn_dim : 4 * emb_dim);
  const double params = static_cast<double>(n_layers) * static_cast<double>(emb_dim) *
                        (4.0 * std::max(width, static_cast<double>(emb_dim)) + 3.0 * ffn);
  if (params > static_cast<double>(kMaxBlockParameters))
    throw std::invalid_argument(fmt::format(
        "--n-layers {}, --emb-dim {}{}{}: blocks of about {:.3g} parameters, more than attn trains "
        "({})",
        n_layers, emb_dim, head_dim > 0 ? fmt::format(", --head-dim {}", head_dim) : "",
        ffn_dim > 0 ? fmt::format(", --ffn-dim {}", ffn_dim) : "", params, kMaxBlockParameters));
  const bool gpt = arch == "gpt";
  if (!gpt && arch != "llama3" && arch != "qwen3" && arch != "gemma3")
    throw std::invalid_argument(
        fmt::format("--arch must be gpt, llama3, qwen3 or gemma3, got '{}'", printable(arch)));
  if (!init_from.empty() && !gpt)
    throw std::invalid_argument(fmt::format(
        "--init-from takes the architecture from the directory's config.json; drop --arch {}",
        printable(arch)));
  if ((head_dim > 0 || ffn_dim > 0) && gpt)
    throw std::invalid_argument(
        "--head-dim and --ffn-dim size a decoder built by --arch llama3, qwen3 or gemma3");
  if (emb_dim % n_heads != 0 && (gpt || head_dim == 0))
    throw std::invalid_argument(
        fmt::format("--n-heads {} must divide --emb-dim {}", n_heads, emb_dim));
  if (!gpt || !init_from.empty()) {
    // A Llama / Qwen / Gemma decoder (attn/decoder.h): no dropout, its own RoPE; float32 or
    // mixed precision (--dtype bfloat16, DecoderLM::set_compute_dtype).
    const std::string what = init_from.empty() ? "--arch " + arch : std::string("--init-from");
    if (drop_rate != 0.0 || exact || rope || latent_dim > 0)
      throw std::invalid_argument(
          fmt::format("{} trains a decoder without dropout on the fused kernels: it takes none of "
                      "--drop-rate {} --exact --rope --latent-dim (got --drop-rate {}{}{}{})",
                      what, 0, drop_rate, exact ? " --exact" : "", rope ? " --rope" : "",
                      latent_dim > 0 ? fmt::format(" --latent-dim {}", latent_dim) : ""));
    if (!(theta_base > 1.0 && std::isfinite(theta_base)))
      throw std::invalid_argument(fmt::format("--theta-base must be > 1, got {}", theta_base));
  }
  if (!init_from.empty() && tokenizer != "hf")
    throw std::invalid_argument(
        fmt::format("--init-from fine-tunes with the model's own tokenizer (--tokenizer hf, its "
                    "tokenizer.json or --tokenizer-file), got --tokenizer {}",
                    printable(tokenizer)));
  if (tokenizer == "hf" && tokenizer_file.empty() && init_from.empty())
    throw std::invalid_argument(
        "--tokenizer hf reads a tokenizer.json: give --tokenizer-file PATH (or --init-from DIR)");
  if (tokenizer != "hf" && !tokenizer_file.empty())
    throw std::invalid_argument(fmt::format(
        "--tokenizer-file is for --tokenizer hf, got --tokenizer {}", printable(tokenizer)));
  if (!(lr > 0.0 && std::isfinite(lr)))
    throw std::invalid_argument(fmt::format("--lr must be > 0, got {}", lr));
  if (!(min_lr >= 0.0 && min_lr <= lr))
    throw std::invalid_argument(
        fmt::format("--min-lr must be in [0, --lr = {}], got {}", lr, min_lr));
  if (!(weight_decay >= 0.0 && std::isfinite(weight_decay)))
    throw std::invalid_argument(fmt::format("--weight-decay must be >= 0, got {}", weight_decay));
  if (!(grad_clip >= 0.0 && std::isfinite(grad_clip)))
    throw std::invalid_argument(
        fmt::format("--grad-clip must be >= 0 (0: off), got {}", grad_clip));
  if (!(drop_rate >= 0.0 && drop_rate < 1.0))
    throw std::invalid_argument(fmt::format("--drop-rate must be in [0, 1), got {}", drop_rate));
  if (!(beta1 >= 0.0 && beta1 < 1.0 && beta2 >= 0.0 && beta2 < 1.0))
    throw std::invalid_argument(fmt::format("betas must be in [0, 1), got ({}, {})", beta1, beta2));
  if (dtype != "float32" && dtype != "bfloat16")
    throw std::invalid_argument(
        fmt::format("--dtype must be float32 or bfloat16, got '{}'", printable(dtype)));
  if (tokenizer != "char" && tokenizer != "gpt2" && tokenizer != "hf")
    throw std::invalid_argument(
        fmt::format("--tokenizer must be char, gpt2 or hf, got '{}'", printable(tokenizer)));
  if (lr_schedule != "cosine" && lr_schedule != "constant")
    throw std::invalid_argument(
        fmt::format("--lr-schedule must be cosine or constant, got '{}'", printable(lr_schedule)));
  if (decay != "matrices" && decay != "all")
    throw std::invalid_argument(
        fmt::format("--decay must be matrices or all, got '{}'", printable(decay)));
  if (n_kv_groups > 0 && n_heads % n_kv_groups != 0)
    throw std::invalid_argument(
        fmt::format("--n-kv-groups {} must divide --n-heads {}", n_kv_groups, n_heads));
  if (gpt && init_from.empty() && (n_kv_groups > 0 || sliding_window_size > 0) &&
      dtype != "float32")
    throw std::invalid_argument(
        fmt::format("--n-kv-groups and --sliding-window-size run in float32 only, got --dtype {}",
                    printable(dtype)));
  if ((n_kv_groups > 0 || sliding_window_size > 0) && exact && drop_rate > 0.0)
    throw std::invalid_argument(fmt::format(
        "--exact with --n-kv-groups or --sliding-window-size needs --drop-rate 0 (their "
        "attention dropout masks are not PyTorch's), got --drop-rate {}",
        drop_rate));
  if (exact && dtype != "float32")
    throw std::invalid_argument(fmt::format(
        "--exact runs the float32 reference path; it cannot be combined with --dtype {}",
        printable(dtype)));
  if (!gpt && (head_dim > 0 ? head_dim : emb_dim / n_heads) % 2 != 0)
    throw std::invalid_argument(
        fmt::format("--arch {} rotates its heads (RoPE): the head size must be even, got {}",
                    printable(arch), head_dim > 0 ? head_dim : emb_dim / n_heads));
  if (rope && (emb_dim / n_heads) % 2 != 0)
    throw std::invalid_argument(
        fmt::format("--rope needs an even head size, got --emb-dim {} / --n-heads {} = {}", emb_dim,
                    n_heads, emb_dim / n_heads));
  if (rope && !(theta_base > 1.0 && std::isfinite(theta_base)))
    throw std::invalid_argument(fmt::format("--theta-base must be > 1, got {}", theta_base));
  if (latent_dim > 0 && (rope || exact || dtype != "float32"))
    throw std::invalid_argument(fmt::format(
        "--latent-dim (multi-head latent attention) runs in float32 on the fused kernel, without "
        "--rope, --exact or --dtype bfloat16; got --latent-dim {}{}{}{}",
        latent_dim, rope ? " --rope" : "", exact ? " --exact" : "",
        dtype != "float32" ? " --dtype " + printable(dtype) : ""));
  if ((n_kv_groups > 0 || sliding_window_size > 0) && (rope || latent_dim > 0))
    throw std::invalid_argument(fmt::format(
        "--n-kv-groups and --sliding-window-size cannot be combined with --rope or --latent-dim "
        "(got --n-kv-groups {} --sliding-window-size {}{}{})",
        n_kv_groups, sliding_window_size, rope ? " --rope" : "",
        latent_dim > 0 ? fmt::format(" --latent-dim {}", latent_dim) : ""));
}

std::string TrainOptions::to_json() const {
  nlohmann::ordered_json j;
  j["n_layers"] = n_layers;
  j["n_heads"] = n_heads;
  j["emb_dim"] = emb_dim;
  j["context_length"] = context_length;
  j["batch_size"] = batch_size;
  j["max_iters"] = max_iters;
  j["lr"] = lr;
  j["min_lr"] = min_lr;
  j["warmup_iters"] = warmup_iters;
  j["weight_decay"] = weight_decay;
  j["grad_clip"] = grad_clip;
  j["drop_rate"] = drop_rate;
  j["eval_interval"] = eval_interval;
  j["eval_iters"] = eval_iters;
  j["seed"] = seed;
  j["beta1"] = beta1;
  j["beta2"] = beta2;
  j["dtype"] = dtype;
  j["fused_loss"] = fused_loss;
  j["tokenizer"] = tokenizer;
  j["stride"] = stride;
  j["epochs"] = epochs;
  j["lr_schedule"] = lr_schedule;
  j["decay"] = decay;
  j["exact"] = exact;
  if (rope) {  // only when on: the other runs' train_args keep their bytes
    j["rope"] = rope;
    j["theta_base"] = theta_base;
  }
  if (latent_dim > 0) j["latent_dim"] = latent_dim;
  j["n_kv_groups"] = n_kv_groups;
  j["sliding_window_size"] = sliding_window_size;
  j["sliding_window_stride"] = sliding_window_stride;
  if (grad_accum_steps != 1)
    j["grad_accum_steps"] = grad_accum_steps;  // the others keep their bytes
  if (arch != "gpt" || !init_from.empty()) {   // a decoder run: GPT runs keep their bytes
    j["arch"] = arch;
    put_bytes(j, "init_from", init_from);
    j["head_dim"] = head_dim;
    j["ffn_dim"] = ffn_dim;
    j["theta_base"] = theta_base;
  }
  if (tokenizer == "hf") put_bytes(j, "tokenizer_file", tokenizer_file);
  return j.dump();
}

TrainOptions TrainOptions::from_json(const std::string& text, TrainOptions o) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    throw std::invalid_argument(fmt::format("train_args: not JSON: {}", printable(e.what())));
  }
  if (!j.is_object()) throw std::invalid_argument("train_args: expected a JSON object");
  try {
    auto get = [&](const char* key, auto& field) {
      if (j.contains(key)) field = j.at(key).get<std::remove_reference_t<decltype(field)>>();
    };
    // A path: KEY_hex, its bytes, when it is not UTF-8 (put_bytes).
    auto get_bytes = [&](const char* key, std::string& field) {
      get(key, field);
      const std::string hex = std::string(key) + "_hex";
      if (j.contains(hex)) field = bytes_of_hex(j.at(hex).get<std::string>());
    };
    get("n_layers", o.n_layers);
    get("n_heads", o.n_heads);
    get("emb_dim", o.emb_dim);
    get("context_length", o.context_length);
    get("batch_size", o.batch_size);
    get("max_iters", o.max_iters);
    get("lr", o.lr);
    get("min_lr", o.min_lr);
    get("warmup_iters", o.warmup_iters);
    get("weight_decay", o.weight_decay);
    get("grad_clip", o.grad_clip);
    get("drop_rate", o.drop_rate);
    get("eval_interval", o.eval_interval);
    get("eval_iters", o.eval_iters);
    get("seed", o.seed);
    get("beta1", o.beta1);
    get("beta2", o.beta2);
    get("dtype", o.dtype);
    get("fused_loss", o.fused_loss);
    get("tokenizer", o.tokenizer);
    get("stride", o.stride);
    get("epochs", o.epochs);
    get("lr_schedule", o.lr_schedule);
    get("decay", o.decay);
    get("exact", o.exact);
    get("rope", o.rope);
    get("theta_base", o.theta_base);
    get("latent_dim", o.latent_dim);
    get("n_kv_groups", o.n_kv_groups);
    get("sliding_window_size", o.sliding_window_size);
    get("sliding_window_stride", o.sliding_window_stride);
    get("grad_accum_steps", o.grad_accum_steps);
    get("arch", o.arch);
    get_bytes("init_from", o.init_from);
    get("head_dim", o.head_dim);
    get("ffn_dim", o.ffn_dim);
    get_bytes("tokenizer_file", o.tokenizer_file);
  } catch (const json::exception& e) {
    throw std::invalid_argument(fmt::format("train_args: {}", printable(e.what())));
  }
  return o;
}

TrainOptions TrainOptions::from_json(const std::string& text) {
  return from_json(text, TrainOptions{});
}

}  // namespace attn::train
