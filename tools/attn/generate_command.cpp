// generate_command.cpp - `attn generate` (generate_command.h): parses the
// flags, loads the checkpoint (or builds GPT_CONFIG_124M with random weights
// for --benchmark) and calls nn::generate; the benchmark times
// nn::forward_cached and GPTModel::forward directly (--json: the cached path,
// repeated, for bench/compare_generate.py).
#include "generate_command.h"

#include <fmt/format.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <iostream>
#include <limits>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "attn/decode_kernels.h"
#include "attn/decoder.h"
#include "attn/generate.h"
#include "attn/gpt.h"
#include "attn/hf_decoder.h"
#include "attn/hf_gpt2.h"
#include "attn/kernels.h"
#include "attn/random.h"
#include "attn/utf8.h"
#include "flag_checks.h"
#include "hf_text.h"
#include "input_file.h"
#include "model_text.h"
#include "weights.h"

namespace attn::cli {
namespace {

struct Flags {
  std::string checkpoint;  // --model, or its alias --checkpoint
  std::string config;
  std::string prompt;
  std::string prompt_file;
  std::string prompt_ids;
  bool print_ids = false;
  bool allow_special = false;  // GPT-2: "<|endoftext|>" in the prompt is the token 50256
  int64_t max_new_tokens = 50;
  std::optional<float> temperature;
  bool greedy = false;
  std::optional<int64_t> top_k;
  std::optional<float> top_p;
  std::string dtype = "float32";
  std::string kv_dtype = "auto";  // Llama / Qwen / Gemma: the cache's element type
  uint64_t seed = 123;
  // --config 124m: the book's bonus attention (nn::GPTConfig's keys).
  std::optional<int64_t> n_kv_groups, sliding_window_size, sliding_window_stride;
  bool no_cache = false;
  bool benchmark = false;
  bool json = false;
  int repeats = 1;
  int64_t prompt_tokens = 32;
  bool mmap = false;  // Llama / Qwen / Gemma: weights viewed in the file's mapping
  // --chat: --prompt as a user message in the directory's chat template
  bool chat = false;
  std::optional<std::string> system;
  std::string chat_template_kwargs;
  std::string chat_template_file;
};

// The sampling the flags ask for, read as transformers and llama.cpp read
// them (docs/generation.md, "Sampling"): --top-k or --top-p alone sample at
// temperature 1 (transformers' do_sample with its default temperature);
// --temperature 0 or --greedy takes the argmax, whatever filters are given
// (the argmax survives every filter, so they change nothing); --top-k 0 and
// --top-p 1 are off; no sampling flag at all is the book's default, the
// argmax. The filters apply in one order: top-k, then temperature, then top-p
// (nn::sample_next; top-k and temperature commute, as in transformers' order).
struct Sampling {
  float temperature = 0.0f;
  int64_t top_k = 0;
  float top_p = 1.0f;
};

Sampling sampling_of(const Flags& f) {
  if (f.temperature && (!(*f.temperature >= 0.0f) || !std::isfinite(*f.temperature))) {
    throw UsageError(fmt::format("generate: --temperature must be a finite number >= 0, got {}",
                                 *f.temperature));
  }
  if (f.greedy && f.temperature && *f.temperature != 0.0f) {
    throw UsageError(
        fmt::format("generate: --greedy is --temperature 0; it cannot go with --temperature {}",
                    *f.temperature));
  }
  if (f.top_p && !(*f.top_p > 0.0f && *f.top_p <= 1.0f)) {
    throw UsageError(fmt::format("generate: --top-p must be in (0, 1] (1: off), got {}", *f.top_p));
  }
  Sampling s;
  if (f.greedy) {
    s.temperature = 0.0f;
  } else if (f.temperature) {
    s.temperature = *f.temperature;
  } else if (f.top_k || f.top_p) {
    s.temperature = 1.0f;
  }
  if (s.temperature > 0.0f) {
    s.top_k = f.top_k.value_or(0);
    s.top_p = f.top_p.value_or(1.0f);
  }
  return s;
}

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// "1, 2,3 4" -> {1, 2, 3, 4}: ids separated by commas and/or spaces, each in [0, vocab).
std::vector<int64_t> parse_ids(const std::string& text, int64_t vocab) {
  std::vector<int64_t> ids;
  size_t i = 0;
  while (i < text.size()) {
    if (text[i] == ',' || text[i] == ' ') {
      ++i;
      continue;
    }
    size_t j = i;
    while (j < text.size() && text[j] >= '0' && text[j] <= '9') ++j;
    if (j == i || j - i > 18) {
      throw UsageError(fmt::format(
          "generate: --prompt-ids must be token ids separated by commas or spaces, got '{}'",
          printable(text)));
    }
    const int64_t id = std::stoll(text.substr(i, j - i));
    if (id >= vocab) {
      throw UsageError(fmt::format(
          "generate: --prompt-ids: token id {} is out of range for vocab_size {}", id, vocab));
    }
    ids.push_back(id);
    i = j;
  }
  if (ids.empty()) throw UsageError("generate: --prompt-ids must give at least one token id");
  return ids;
}

// The prompt's ids: the text through the vocabulary, or prompt_tokens random ids
// (a model without a vocabulary).
std::vector<int64_t> benchmark_prompt(const Flags& f, const io::ModelDir* md, int64_t vocab,
                                      Generator& gen) {
  if (!f.prompt_ids.empty()) return parse_ids(f.prompt_ids, vocab);
  if (md != nullptr && !f.prompt.empty())
    return ModelText(*md).encode(f.prompt, "the prompt", f.allow_special);
  std::vector<int64_t> ids;
  for (int64_t i = 0; i < f.prompt_tokens; ++i)
    ids.push_back(static_cast<int64_t>(gen.random() % static_cast<uint64_t>(vocab)));
  return ids;
}

// One greedy run of n tokens after the prompt, timed in two parts: the prompt
// (one prefill, or one full forward) and the n - 1 forwards of the generated
// tokens (the first came from the prompt's logits; the last needs none).
struct BenchRun {
  double t_prompt = 0, t_gen = 0;
  int64_t steps = 0;
  std::vector<int64_t> tokens;
};

BenchRun bench_once(nn::GPTModel& model, const std::vector<int64_t>& prompt, int64_t n,
                    bool use_cache) {
  Generator unused(0);
  auto argmax_last = [&](const Tensor& logits) {
    const Tensor last = logits.select(1, logits.size(1) - 1).contiguous();  // (1, V)
    return nn::sample_next(last, 0.0f, 0, unused)[0];
  };
  const int64_t T0 = static_cast<int64_t>(prompt.size());
  BenchRun r;
  r.tokens = prompt;
  nn::GPTKVCache cache;
  if (use_cache) cache = nn::make_gpt_kv_cache(model, 1);  // a bf16 model's rounds its weights
  auto start = std::chrono::steady_clock::now();
  const Tensor prompt_ids = Tensor::from_int64({1, T0}, prompt);
  int64_t next = argmax_last(use_cache ? nn::forward_cached(model, prompt_ids, cache, false)
                                       : model.forward(prompt_ids));
  r.t_prompt = seconds_since(start);
  start = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < n; ++i) {
    r.tokens.push_back(next);
    if (i + 1 == n) break;  // the last token needs no forward
    next = argmax_last(
        use_cache ? nn::forward_cached(model, Tensor::from_int64({1, 1}, {next}), cache, false)
                  : model.forward(
                        Tensor::from_int64({1, static_cast<int64_t>(r.tokens.size())}, r.tokens)));
  }
  r.t_gen = seconds_since(start);
  r.steps = n > 0 ? n - 1 : 0;
  return r;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t m = v.size() / 2;
  return v.size() % 2 == 1 ? v[m] : 0.5 * (v[m - 1] + v[m]);
}

// Greedy decoding of n tokens after the prompt. The table: with and without
// the cache, once each. --json: the cached path `repeats` times, one JSON
// object with each run's rates and their medians.
void run_benchmark(nn::GPTModel& model, const std::vector<int64_t>& prompt, int64_t n, bool json,
                   int repeats, const std::string& dtype) {
  const int64_t T0 = static_cast<int64_t>(prompt.size());
  const int64_t C = model.config().context_length;
  if (T0 + n > C) {
    throw UsageError(fmt::format(
        "--benchmark: the prompt ({} tokens) plus --max-new-tokens {} exceed context_length {}", T0,
        n, C));
  }
  if (json) {
    nlohmann::json runs = nlohmann::json::array();
    std::vector<double> pp, tg;
    for (int rep = 0; rep < repeats; ++rep) {
      const BenchRun r = bench_once(model, prompt, n, true);
      pp.push_back(static_cast<double>(T0) / r.t_prompt);
      tg.push_back(r.steps > 0 ? static_cast<double>(r.steps) / r.t_gen : 0.0);
      runs.push_back({{"prompt_s", r.t_prompt},
                      {"decode_s", r.t_gen},
                      {"prompt_tok_s", pp.back()},
                      {"decode_tok_s", tg.back()}});
    }
    const nlohmann::json out = {{"dtype", dtype},
                                {"prompt_tokens", T0},
                                {"new_tokens", n},
                                {"decode_steps", n > 0 ? n - 1 : 0},
                                {"threads", omp_get_max_threads()},
                                {"gemv_bf16_path", kernels::gemv_bf16_path()},
                                {"simd_target", kernels::flash_attention_target()},
                                {"prompt_tok_s_median", median(pp)},
                                {"decode_tok_s_median", median(tg)},
                                {"prompt_tok_s_best", *std::max_element(pp.begin(), pp.end())},
                                {"decode_tok_s_best", *std::max_element(tg.begin(), tg.end())},
                                {"runs", runs}};
    std::cout << out.dump() << '\n';
    return;
  }
  std::cout << fmt::format(
      "model: vocab_size {}, context_length {}, emb_dim {}, n_heads {}, n_layers {}\n"
      "prompt: {} tokens, then {} generated tokens (greedy), batch 1\n",
      model.config().vocab_size, C, model.config().emb_dim, model.config().n_heads,
      model.config().n_layers, T0, n);
  std::vector<int64_t> cached_tokens, full_tokens;
  for (bool use_cache : {true, false}) {
    const BenchRun r = bench_once(model, prompt, n, use_cache);
    std::cout << fmt::format(
        "{:<9} prompt processing {:8.1f} tokens/s ({:.3f} s)   generation {:8.2f} tokens/s "
        "({} tokens in {:.3f} s)\n",
        use_cache ? "cache:" : "no cache:", static_cast<double>(T0) / r.t_prompt, r.t_prompt,
        r.steps > 0 ? static_cast<double>(r.steps) / r.t_gen : 0.0, r.steps, r.t_gen);
    (use_cache ? cached_tokens : full_tokens) = r.tokens;
  }
  std::cout << fmt::format("same tokens with and without the cache: {}\n",
                           cached_tokens == full_tokens ? "yes" : "NO");
}

// A model whose weights hold a NaN or an infinity (a diverged run) would
// print NaN logits' tokens: refused, naming the weight.
void refuse_non_finite(nn::Module& model, const std::string& dir) {
  if (const std::string bad = non_finite_weight(model); !bad.empty()) {
    throw std::runtime_error(
        fmt::format("'{}': {}, not a finite number; attn generates only from "
                    "finite weights",
                    printable(dir), bad));
  }
}

}  // namespace

// A Llama 3 / Qwen / Gemma directory (attn/hf_decoder.h): its tokenizer.json
// (or ids in and out), stopping at the family's end ids; --benchmark times the
// prompt and the cached decode.
int run_decoder(const Flags& f, const Sampling& sampling) {
  if (f.dtype != "float32" && f.dtype != "bfloat16") {
    throw UsageError(
        fmt::format("generate: --dtype must be float32 or bfloat16, got '{}'", printable(f.dtype)));
  }
  if (f.no_cache)
    throw UsageError("generate: --no-cache is GPT-2's; this model always uses its cache");
  if (f.kv_dtype != "auto" && f.kv_dtype != "float32" && f.kv_dtype != "bfloat16") {
    throw UsageError(fmt::format("generate: --kv-dtype must be auto, float32 or bfloat16, got '{}'",
                                 printable(f.kv_dtype)));
  }
  const DType kv_dtype = (f.kv_dtype == "auto" ? f.dtype : f.kv_dtype) == "bfloat16"
                             ? DType::kBFloat16
                             : DType::kFloat32;
  if (f.allow_special) {
    throw UsageError(
        "generate: --allow-special is GPT-2's; a tokenizer.json's added tokens are always matched");
  }
  std::unique_ptr<nn::DecoderLM> model;
  const io::HfDecoderInfo info = io::load_hf_decoder(
      f.checkpoint, model, f.dtype == "bfloat16" ? DType::kBFloat16 : DType::kFloat32, f.mmap);
  refuse_non_finite(*model, f.checkpoint);
  const int64_t V = model->config().vocab_size;
  if (f.top_k && *f.top_k > V) {
    throw UsageError(fmt::format("generate: --top-k must be at most the vocabulary size {}, got {}",
                                 V, *f.top_k));
  }
  // The tokenizer only when text goes in or comes out.
  std::optional<text::HfTokenizer> tok;
  if (!f.prompt.empty() || (!f.print_ids && !f.benchmark)) tok = load_hf_tokenizer(f.checkpoint);
  Generator gen(f.seed);
  std::vector<int64_t> ids;
  std::vector<int64_t> stop_ids = info.hf.eos_token_ids;
  if (f.chat) {
    // The template writes the BOS itself: encoded without the post-processor, as
    // transformers' apply_chat_template(tokenize=True) encodes it.
    const ChatPrompt chat = render_chat_prompt("generate", f.checkpoint, f.chat_template_file,
                                               f.system, f.prompt, f.chat_template_kwargs);
    ids = tok->encode(chat.text, false);
    if (chat.eos) {  // the reply ends at the template's eos_token too (Qwen's <|im_end|>)
      if (const auto eos = tok->token_to_id(*chat.eos);
          eos && std::find(stop_ids.begin(), stop_ids.end(), *eos) == stop_ids.end())
        stop_ids.push_back(*eos);
    }
    for (const int64_t id : ids) {
      if (id >= V) {
        throw std::invalid_argument(fmt::format(
            "generate: the tokenizer gives id {}, past the model's vocab_size {}", id, V));
      }
    }
  } else if (!f.prompt_ids.empty()) {
    ids = parse_ids(f.prompt_ids, V);
  } else if (!f.prompt.empty()) {
    ids = tok->encode(f.prompt);  // with the BOS its post-processor adds, as transformers does
    for (const int64_t id : ids) {
      if (id >= V) {
        throw std::invalid_argument(fmt::format(
            "generate: the tokenizer gives id {}, past the model's vocab_size {}", id, V));
      }
    }
  } else if (f.benchmark) {
    for (int64_t i = 0; i < f.prompt_tokens; ++i) {
      ids.push_back(static_cast<int64_t>(gen.random64() % static_cast<uint64_t>(V)));
    }
  } else {
    throw UsageError("generate: give --prompt TEXT or --prompt-ids IDS");
  }
  if (ids.empty())
    throw UsageError(fmt::format("generate: the prompt '{}' has no tokens", printable(f.prompt)));
  const int64_t T0 = static_cast<int64_t>(ids.size());
  const Tensor prompt = Tensor::from_int64({1, T0}, ids);
  if (f.benchmark) {
    if (T0 + f.max_new_tokens > model->config().context_length) {
      throw UsageError(fmt::format("generate: {} prompt and {} new tokens pass context_length {}",
                                   T0, f.max_new_tokens, model->config().context_length));
    }
    // Each run: an empty cache, the prompt (logits of its last position), then
    // max_new_tokens greedy steps of one token.
    std::vector<double> prompt_rates, decode_rates;
    int64_t cache_bytes = 0;
    for (int run = 0; run < (f.json ? f.repeats : 1); ++run) {
      nn::DecoderKVCache cache =
          nn::make_kv_cache(*model, 1, T0 + std::max<int64_t>(1, f.max_new_tokens), kv_dtype);
      auto start = std::chrono::steady_clock::now();
      Tensor logits = nn::forward_cached(*model, prompt, cache, true);
      prompt_rates.push_back(static_cast<double>(T0) / seconds_since(start));
      start = std::chrono::steady_clock::now();
      for (int64_t i = 0; i < f.max_new_tokens; ++i) {
        const int64_t next = nn::sample_next(logits.select(1, 0).contiguous(), 0.0f, 0, gen)[0];
        logits = nn::forward_cached(*model, Tensor::from_int64({1, 1}, {next}), cache, true);
      }
      decode_rates.push_back(static_cast<double>(f.max_new_tokens) /
                             std::max(seconds_since(start), 1e-9));
      cache_bytes = cache.bytes();
    }
    if (f.json) {
      nlohmann::ordered_json j;
      j["model_type"] = info.hf.model_type;
      j["file_dtype"] = info.file_dtype;
      j["dtype"] = f.dtype;
      j["kv_dtype"] = dtype_name(kv_dtype);
      j["threads"] = omp_get_max_threads();
      j["prompt_tokens"] = T0;
      j["new_tokens"] = f.max_new_tokens;
      j["prompt_tokens_per_s"] = prompt_rates;
      j["decode_tokens_per_s"] = decode_rates;
      j["prompt_median"] = median(prompt_rates);
      j["decode_median"] = median(decode_rates);
      j["kv_cache_bytes"] = cache_bytes;
      std::cout << j.dump() << '\n';
    } else {
      std::cout << fmt::format(
          "{} ({} layers, {} heads, {} KV heads, {} file, {} weights, {} threads)\n"
          "prompt {} tokens: {:.1f} tokens/s\ndecode {} tokens: {:.1f} tokens/s\nKV cache {:.1f} "
          "MiB {}\n",
          info.hf.model_type, model->config().num_layers, model->config().num_heads,
          model->config().num_kv_heads, info.file_dtype, f.dtype, omp_get_max_threads(), T0,
          prompt_rates[0], f.max_new_tokens, decode_rates[0],
          static_cast<double>(cache_bytes) / (1 << 20), dtype_name(kv_dtype));
    }
    std::cout.flush();
    return std::cout ? 0 : 1;
  }
  std::optional<HfStreamText> stream;
  if (f.print_ids) {
    for (size_t i = 0; i < ids.size(); ++i) std::cout << (i ? " " : "") << ids[i];
  } else {
    // --chat prints the reply only; otherwise the prompt, then its continuation.
    if (!f.chat) std::cout << (f.prompt.empty() ? tok->decode(ids, true) : f.prompt);
    stream.emplace(*tok);
  }
  std::cout.flush();
  nn::GenerateOptions gopt{.max_new_tokens = f.max_new_tokens,
                           .temperature = sampling.temperature,
                           .top_k = sampling.top_k,
                           .top_p = sampling.top_p,
                           .kv_dtype = kv_dtype};
  gopt.on_token = [&](const std::vector<int64_t>& next) {
    if (stream) {
      std::cout << stream->push(next[0]);
    } else {
      std::cout << ' ' << next[0];
    }
    std::cout.flush();
  };
  nn::generate(*model, prompt, gopt, gen, stop_ids);
  if (stream) std::cout << stream->flush();
  std::cout << '\n';
  std::cout.flush();
  return std::cout ? 0 : 1;
}

Command add_generate_command(CLI::App& app) {
  auto flags = std::make_shared<Flags>();
  CLI::App* cmd = app.add_subcommand(
      "generate",
      "Generate text from a model directory (a Hugging Face GPT-2 directory or an attn "
      "checkpoint) one token at a time with a key/value cache per layer, printing each token as "
      "it comes; sampling as transformers and llama.cpp read the flags (top-k, then "
      "temperature, then top-p; --top-k or --top-p alone samples at temperature 1; "
      "--temperature 0 or --greedy is the argmax, the default); stops at <|endoftext|>");
  cmd->footer(
      "Past context_length the model sees the last context_length tokens (the book's sliding "
      "window): the cache is re-filled from them for every further token.\n"
      "Each new token attends over the cache with flash-decoding (attn/decode_attention.h, "
      "docs/decode.md): the keys in fixed chunks over the threads, combined by log-sum-exp in a "
      "fixed order, so the tokens do not depend on the thread count.\n\n"
      "Examples:\n"
      "  attn generate --model run1 --prompt 'To be' --max-new-tokens 200 --temperature 0.8 "
      "--top-k 10 --seed 1\n"
      "  attn generate --model gpt2 --prompt 'Every effort moves you' --top-k 50 --top-p 0.95 "
      "--temperature 0.8\n"
      "  attn generate --model gpt2 --prompt-ids 6109,3626,6100,345 --print-ids --greedy\n"
      "  attn generate --config 124m --benchmark --prompt-tokens 32 --max-new-tokens 32\n"
      "  attn generate --model Qwen3-0.6B --chat --system 'Be brief.' --prompt 'Why is the sky "
      "blue?' --chat-template-kwargs '{\"enable_thinking\": false}'");
  add_option(cmd, "-m,--model,--checkpoint", flags->checkpoint,
             "Model directory: Hugging Face GPT-2 (config.json + model.safetensors) or an "
             "attn checkpoint (DIR/checkpoint.safetensors)")
      ->type_name("DIR");

  add_option(cmd, "--config", flags->config,
             "Instead of a checkpoint: GPT_CONFIG_124M with random weights (manual_seed "
             "--seed); only with --benchmark")
      ->type_name("124m");
  add_option(cmd, "--n-kv-groups", flags->n_kv_groups,
             "With --config: grouped-query attention with this many key/value heads (the "
             "book's ch04/04_gqa; must divide the 12 heads). A checkpoint stores its own")
      ->type_name("G");
  add_option(cmd, "--sliding-window-size", flags->sliding_window_size,
             "With --config: sliding-window attention over the last W tokens (the book's "
             "ch04/06_swa). A checkpoint stores its own")
      ->type_name("W");
  add_option(cmd, "--sliding-window-stride", flags->sliding_window_stride,
             "With --sliding-window-size: the book's K:1 schedule, K window layers then one "
             "full (0: none, -1 every layer, the default)")
      ->type_name("K");
  add_option(cmd, "-p,--prompt", flags->prompt,
             "The text to continue (through the model's tokenizer)")
      ->type_name("TEXT");
  add_option(cmd, "--prompt-file", flags->prompt_file,
             "Instead of --prompt: the text of FILE (UTF-8, read whole)")
      ->type_name("FILE");
  add_option(cmd, "--prompt-ids", flags->prompt_ids,
             "Instead of --prompt: token ids, separated by commas or spaces")
      ->type_name("IDS");
  cmd->add_flag("--allow-special", flags->allow_special,
                "GPT-2 models: encode \"<|endoftext|>\" in the prompt as the special token 50256 "
                "(else a prompt holding it is refused, as tiktoken refuses it)");
  cmd->add_flag("--print-ids", flags->print_ids,
                "Print the prompt's and the new token ids on one line instead of text");
  add_option(cmd, "-n,--max-new-tokens", flags->max_new_tokens, "Tokens to generate (default 50)")
      ->type_name("N");
  add_option(cmd, "--temperature", flags->temperature,
             "Softmax temperature; 0 takes the argmax. Default: 1 when --top-k or --top-p "
             "is given, else 0")
      ->type_name("T");
  cmd->add_flag("--greedy", flags->greedy, "Take the argmax (= --temperature 0)");
  add_option(cmd, "--top-k", flags->top_k,
             "Sample among the K largest logits only (0: off; 1..vocab); alone, it samples "
             "at temperature 1")
      ->type_name("K");
  add_option(cmd, "--top-p", flags->top_p,
             "Nucleus sampling after the temperature: the most probable tokens whose "
             "probabilities reach P (0 < P <= 1; 1 is off); alone, it samples at temperature 1")
      ->type_name("P");
  add_option(cmd, "--dtype", flags->dtype,
             "Compute dtype: float32 (default) or bfloat16 (bf16 products summed in float32, "
             "as torch.autocast; the cache holds bf16 keys, values and weights)")
      ->type_name("DTYPE");
  add_option(cmd, "--kv-dtype", flags->kv_dtype,
             "A Llama / Qwen / Gemma directory's key/value cache: auto (the default: as "
             "--dtype), float32 or bfloat16 (half the memory and the bytes each step reads)")
      ->type_name("DTYPE");
  add_option(cmd, "--seed", flags->seed, "Seed of the sampling generator (default 123)")
      ->type_name("S");
  cmd->add_flag("--no-cache", flags->no_cache,
                "Recompute the whole prefix every step instead of using the cache");
  cmd->add_flag("--benchmark", flags->benchmark,
                "Print prompt-processing and generation tokens/s with and without the cache "
                "(greedy)");
  cmd->add_flag("--json", flags->json,
                "With --benchmark: the cached path only, --repeats times, as one JSON object "
                "(each run's prompt and decode tokens/s and their medians)");
  add_option(cmd, "--repeats", flags->repeats, "With --benchmark --json: runs (default 1)")
      ->type_name("N");
  cmd->add_flag("--mmap", flags->mmap,
                "Llama, Qwen, Gemma: weights the file holds in the compute dtype are read in place "
                "(a copy-on-write mapping: starts at once, no copy; decoding through small pages "
                "may be slower) instead of copied");
  cmd->add_flag("--chat", flags->chat,
                "Llama, Qwen, Gemma: --prompt as the user's message in the directory's chat "
                "template (tokenizer_config.json's chat_template, chat_template.jinja or "
                "chat_template.json), as transformers' apply_chat_template(messages, "
                "add_generation_prompt=True) renders it; prints the reply only, which also stops "
                "at the template's eos_token");
  add_option(cmd, "--system", flags->system, "With --chat: a system message before the prompt")
      ->type_name("TEXT");
  add_option(cmd, "--chat-template-kwargs", flags->chat_template_kwargs,
             "With --chat: more template variables as a JSON object, e.g. "
             "'{\"enable_thinking\": false}' (Qwen3 without thinking)")
      ->type_name("JSON");
  add_option(cmd, "--chat-template", flags->chat_template_file,
             "With --chat: the template of FILE (Jinja; or JSON holding \"chat_template\") "
             "instead of the directory's")
      ->type_name("FILE");
  add_option(cmd, "--prompt-tokens", flags->prompt_tokens,
             "--benchmark without --prompt: this many random token ids (default 32)")
      ->type_name("N");
  // Sizes beyond any context a model has are refused as they are parsed, before anything is
  // drawn or allocated.
  constexpr int64_t kMaxTokens = int64_t{1} << 20;
  in_range(cmd->get_option("--prompt-tokens"), int64_t{1}, kMaxTokens);
  in_range(cmd->get_option("--max-new-tokens"), int64_t{0}, kMaxTokens);
  in_range(cmd->get_option("--sliding-window-size"), int64_t{1}, kMaxTokens);
  in_range(cmd->get_option("--repeats"), 1, 1000000);
  // 0: off; at most the model's vocabulary, checked when the model is read.
  in_range(cmd->get_option("--top-k"), int64_t{0}, std::numeric_limits<int64_t>::max());

  auto run = [flags]() -> int {
    if (!flags->prompt_file.empty()) {
      if (!flags->prompt.empty())
        throw UsageError("generate: give either --prompt or --prompt-file, not both");
      flags->prompt = read_input_file(flags->prompt_file, "--prompt-file");
      if (flags->prompt.empty()) {
        throw UsageError(
            fmt::format("generate: --prompt-file '{}' is empty", printable(flags->prompt_file)));
      }
    }
    const Flags& f = *flags;
    if (!f.checkpoint.empty() && !f.config.empty()) {
      throw UsageError("generate: give either --model or --config, not both");
    }
    if (!f.config.empty() && f.config != "124m") {
      throw UsageError(fmt::format("generate: --config must be 124m, got '{}'", printable(f.config)));
    }
    if (f.checkpoint.empty() && f.config.empty()) {
      throw UsageError("generate: give --model DIR (or --config 124m with --benchmark)");
    }
    if (!f.config.empty() && !f.benchmark) {
      throw UsageError(
          "generate: --config 124m makes a random-weight model without a vocabulary; use it with "
          "--benchmark");
    }
    if ((f.n_kv_groups || f.sliding_window_size || f.sliding_window_stride) && f.config.empty()) {
      throw UsageError(
          "generate: --n-kv-groups, --sliding-window-size and --sliding-window-stride go with "
          "--config 124m (a checkpoint stores its own in its config)");
    }
    if (f.n_kv_groups && (*f.n_kv_groups < 1 || nn::GPT_CONFIG_124M.n_heads % *f.n_kv_groups != 0)) {
      throw UsageError(fmt::format("generate: --n-kv-groups must divide n_heads {}, got {}",
                                   nn::GPT_CONFIG_124M.n_heads, *f.n_kv_groups));
    }
    if (f.sliding_window_stride && !f.sliding_window_size) {
      throw UsageError("generate: --sliding-window-stride needs --sliding-window-size");
    }
    if ((f.n_kv_groups || f.sliding_window_size) && f.dtype != "float32") {
      throw UsageError(fmt::format(
          "generate: --n-kv-groups and --sliding-window-size run in float32 only, got --dtype {}",
          printable(f.dtype)));
    }
    const Sampling sampling = sampling_of(f);
    if (f.json && !f.benchmark) throw UsageError("generate: --json goes with --benchmark");
    if (!f.prompt.empty() && !f.prompt_ids.empty()) {
      throw UsageError("generate: give either --prompt or --prompt-ids, not both");
    }
    if (!f.chat && (f.system || !f.chat_template_kwargs.empty() || !f.chat_template_file.empty())) {
      throw UsageError(
          "generate: --system, --chat-template-kwargs and --chat-template go with --chat");
    }
    if (f.chat) {
      if (f.prompt.empty())
        throw UsageError("generate: --chat needs --prompt TEXT (the user's message)");
      if (f.benchmark) throw UsageError("generate: --chat does not go with --benchmark");
      if (f.checkpoint.empty() || !io::is_hf_decoder_dir(f.checkpoint)) {
        throw UsageError(fmt::format(
            "generate: --chat needs a Llama, Qwen or Gemma directory with a chat template; '{}' is "
            "a GPT-2 model, which has none",
            printable(f.checkpoint.empty() ? f.config : f.checkpoint)));
      }
    }
    if (!f.checkpoint.empty()) require_model_dir(f.checkpoint);
    if (!f.checkpoint.empty() && io::is_hf_decoder_dir(f.checkpoint))
      return run_decoder(f, sampling);
    nn::GPTOptions options;
    if (f.dtype == "bfloat16") {
      options.dtype = DType::kBFloat16;
    } else if (f.dtype == "float16") {
      throw UsageError(
          "generate: --dtype float16 is not a compute dtype of attn (a float16 file is read into "
          "float32 weights); use --dtype float32 or bfloat16");
    } else if (f.dtype != "float32") {
      throw UsageError(fmt::format("generate: --dtype must be float32 or bfloat16, got '{}'",
                                   printable(f.dtype)));
    }

    std::unique_ptr<nn::GPTModel> model;
    std::optional<io::ModelDir> md;
    if (!f.checkpoint.empty()) {
      md = io::load_model_dir(f.checkpoint, model, options);
      refuse_non_finite(*model, f.checkpoint);
    } else {
      manual_seed(f.seed);
      nn::GPTConfig cfg = nn::GPT_CONFIG_124M;
      cfg.n_kv_groups = f.n_kv_groups.value_or(0);
      cfg.sliding_window_size = f.sliding_window_size.value_or(0);
      cfg.sliding_window_stride = f.sliding_window_stride.value_or(-1);
      model = std::make_unique<nn::GPTModel>(cfg, options);
      model->eval();
    }
    const int64_t V = model->config().vocab_size;
    if (f.top_k && *f.top_k > V) {
      throw UsageError(fmt::format(
          "generate: --top-k must be at most the vocabulary size {}, got {}", V, *f.top_k));
    }
    if (f.benchmark) {
      Generator gen(f.seed);
      run_benchmark(*model, benchmark_prompt(f, md ? &*md : nullptr, V, gen), f.max_new_tokens,
                    f.json, f.repeats, f.dtype);
      return std::cout ? 0 : 1;
    }
    if (f.prompt.empty() && f.prompt_ids.empty()) {
      throw UsageError("generate: --prompt must have at least one character");
    }
    const std::vector<int64_t> given_ids =
        f.prompt_ids.empty() ? std::vector<int64_t>{} : parse_ids(f.prompt_ids, V);
    // The tokenizer only when text goes in or comes out.
    std::unique_ptr<ModelText> text;
    if (!f.prompt.empty() || !f.print_ids) text = std::make_unique<ModelText>(*md);
    const std::vector<int64_t> ids =
        f.prompt.empty() ? given_ids : text->encode(f.prompt, "the prompt", f.allow_special);
    if (ids.empty()) {
      throw UsageError(fmt::format("generate: the prompt '{}' has no tokens", printable(f.prompt)));
    }
    // <|endoftext|> ends the text: the tokenizer's, or GPT-2's id 50256 for ids.
    std::optional<int64_t> eos = text ? text->end_of_text() : std::nullopt;
    if (!text && md && md->tokenizer == "gpt2" && V > 50256) eos = 50256;

    if (f.print_ids) {
      for (size_t i = 0; i < ids.size(); ++i) std::cout << (i ? " " : "") << ids[i];
    } else if (!f.prompt.empty()) {
      std::cout << f.prompt;
    } else {
      for (int64_t id : ids) std::cout << text->push(id);
    }
    std::cout.flush();
    Generator gen(f.seed);
    nn::GenerateOptions gopt{.max_new_tokens = f.max_new_tokens,
                             .temperature = sampling.temperature,
                             .top_k = sampling.top_k,
                             .use_cache = !f.no_cache,
                             .eos_id = eos,
                             .top_p = sampling.top_p};
    gopt.on_token = [&](const std::vector<int64_t>& next) {
      if (f.print_ids) {
        std::cout << ' ' << next[0];
      } else {
        std::cout << text->push(next[0]);
      }
      std::cout.flush();
    };
    nn::generate(*model, Tensor::from_int64({1, static_cast<int64_t>(ids.size())}, ids), gopt,
                 gen);
    if (text && !f.print_ids) std::cout << text->flush();
    std::cout << '\n';
    std::cout.flush();
    return std::cout ? 0 : 1;
  };
  return Command{cmd, run};
}

}  // namespace attn::cli
