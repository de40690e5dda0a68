// serve_command.cpp - `attn serve` (serve_command.h): flags, the model, the
// engine and the server, and the signals that stop them.
#include "serve_command.h"

#include <fmt/format.h>
#include <omp.h>
#include <pthread.h>
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <ctime>
#include <iostream>
#include <limits>
#include <memory>
#include <string>
#include <thread>

#include "attn/chat_template.h"
#include "attn/utf8.h"
#include "flag_checks.h"
#include "serve/engine.h"
#include "serve/metrics.h"
#include "serve/served_model.h"
#include "serve/server.h"
#include "weights.h"

namespace attn::cli {
namespace {

struct Flags {
  std::string model;
  std::string name;
  std::string host = "127.0.0.1";
  int port = 8080;
  std::string api_key;
  int64_t parallel = 4;
  int64_t ctx_size = 0;
  int64_t kv_cache_mb = 0;
  int64_t block_size = 16;
  int64_t queue_size = 64;
  int64_t step_tokens = 256;
  std::string dtype = "float32";
  std::string kv_dtype = "auto";
  int64_t max_body_bytes = 8 << 20;
  int http_threads = 0;
  int timeout_s = 10;
  double shutdown_grace_s = 5.0;
  bool log_prompts = false;
  bool no_prefix_caching = false;
  std::string chat_template;
};

// The chat template: --chat-template FILE, else the directory's (a Llama /
// Qwen / Gemma directory's tokenizer_config.json, chat_template.jinja or
// chat_template.json); none for GPT-2. Sets the reply's extra end id (the
// template's eos_token, Qwen's <|im_end|>) when the tokenizer has it as one id.
serve::ChatRenderer load_chat(const Flags& f, const serve::ServedModel& model,
                              std::vector<int64_t>& end_ids, std::string& missing) {
  std::optional<text::ChatTemplate> chat;
  if (!f.chat_template.empty()) {
    chat = text::ChatTemplate::from_file(f.chat_template, f.model);
  } else if (model.family() != "gpt2" && model.family() != "gpt-char") {
    chat = text::ChatTemplate::from_model_dir(f.model);
  }
  if (!chat) {
    missing = fmt::format(
        "the model '{}' ({}) has no chat template{}: use /v1/completions, or start the server with "
        "--chat-template FILE",
        model.name(), model.family(),
        model.family() == "gpt2" || model.family() == "gpt-char"
            ? ""
            : " (no chat_template in tokenizer_config.json, chat_template.jinja or "
              "chat_template.json)");
    return nullptr;
  }
  if (const auto eos = chat->special_token("eos_token")) {
    const std::vector<int64_t> ids = model.encode(*eos, false);
    if (ids.size() == 1) end_ids = ids;
  }
  auto shared = std::make_shared<const text::ChatTemplate>(std::move(*chat));
  return [shared](const std::vector<serve::ChatMessage>& messages,
                  const serve::ChatRenderOptions& o) {
    std::vector<text::ChatMessage> m;
    m.reserve(messages.size());
    for (const serve::ChatMessage& x : messages) m.push_back({x.role, x.content});
    return shared->apply(m, {.add_generation_prompt = o.add_generation_prompt,
                             .kwargs_json = o.kwargs_json,
                             .continue_final_message = o.continue_final_message ? "content" : ""});
  };
}

int run_serve(const Flags& f) {
  require_model_dir(f.model);
  if (f.step_tokens < f.parallel)
    throw UsageError(fmt::format("serve: --step-tokens ({}) must be at least --parallel ({})",
                                 f.step_tokens, f.parallel));
  if (!(f.shutdown_grace_s >= 0.0))
    throw UsageError(
        fmt::format("serve: --shutdown-grace must be >= 0, got {}", f.shutdown_grace_s));
  if (f.dtype != "float32" && f.dtype != "bfloat16")
    throw UsageError(
        fmt::format("serve: --dtype must be float32 or bfloat16, got '{}'", printable(f.dtype)));
  if (f.kv_dtype != "auto" && f.kv_dtype != "float32" && f.kv_dtype != "bfloat16") {
    throw UsageError(fmt::format("serve: --kv-dtype must be auto, float32 or bfloat16, got '{}'",
                                 printable(f.kv_dtype)));
  }
  const std::string kv_dtype = f.kv_dtype == "auto" ? f.dtype : f.kv_dtype;
  std::string api_key = f.api_key;
  if (api_key.empty()) {
    const char* env = std::getenv("ATTN_API_KEY");
    if (env != nullptr) api_key = env;
  }

  // Signals go to one thread (sigwait below): block them before any thread starts.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  signal(SIGPIPE, SIG_IGN);  // a client gone mid-write is an error return, not a signal

  const auto start = std::chrono::steady_clock::now();
  std::unique_ptr<serve::ServedModel> model = serve::ServedModel::load(
      {.dir = f.model,
       .name = f.name,
       .dtype = f.dtype == "bfloat16" ? DType::kBFloat16 : DType::kFloat32,
       .kv_dtype = kv_dtype == "bfloat16" ? DType::kBFloat16 : DType::kFloat32});
  const int64_t ctx = f.ctx_size > 0 ? f.ctx_size : model->context_length();
  if (ctx < 2 || ctx > model->context_length()) {
    throw UsageError(
        fmt::format("serve: --ctx-size must be in [2, {}] (the model's context length), got {}",
                    model->context_length(), f.ctx_size));
  }
  serve::EngineOptions eo;
  eo.parallel = f.parallel;
  eo.queue_size = f.queue_size;
  eo.block_size = f.block_size;
  eo.step_tokens = f.step_tokens;
  eo.prefix_caching = !f.no_prefix_caching;
  const int64_t per_block = model->kv_bytes_per_token() * f.block_size;
  eo.num_blocks = f.kv_cache_mb > 0 ? (f.kv_cache_mb << 20) / per_block
                                    : (ctx + f.block_size - 1) / f.block_size * f.parallel;
  if (eo.num_blocks < 1) {
    throw UsageError(fmt::format("serve: --kv-cache-mb {} holds no block of {} bytes",
                                 f.kv_cache_mb, per_block));
  }
  serve::Metrics metrics;
  serve::Engine engine(*model, eo, metrics);
  serve::ServerOptions so;
  so.host = f.host;
  so.port = f.port;
  so.api_key = api_key;
  so.ctx_size = ctx;
  so.max_body_bytes = static_cast<size_t>(f.max_body_bytes);
  so.http_threads =
      f.http_threads > 0
          ? f.http_threads
          : static_cast<int>(std::clamp<int64_t>(2 * (f.parallel + f.queue_size), 32, 512));
  so.read_timeout_s = f.timeout_s;
  so.log_prompts = f.log_prompts;
  so.shutdown_grace_s = f.shutdown_grace_s;
  std::string no_chat;
  serve::ChatRenderer chat = load_chat(f, *model, so.chat_end_ids, no_chat);
  serve::Server server(*model, engine, metrics, so, chat, no_chat);
  server.bind();
  std::cerr << fmt::format(
                   "attn serve: listening on http://{}:{} (model '{}', {}; {} slots, context {}, "
                   "KV cache {} blocks of {} = {:.1f} MiB; {} threads; loaded in {:.2f} s)\n",
                   printable(f.host), server.bound_port(), printable(model->name()),
                   model->family(), f.parallel, ctx, eo.num_blocks, f.block_size,
                   static_cast<double>(eo.num_blocks * per_block) / (1 << 20),
                   omp_get_max_threads(),
                   std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count())
            << std::flush;

  std::atomic<bool> done{false};
  std::thread signals([&] {
    const timespec tick{0, 200'000'000};
    while (!done.load()) {
      const int sig = sigtimedwait(&stop_signals, nullptr, &tick);
      if (sig == SIGTERM || sig == SIGINT) {
        std::cerr << fmt::format("attn serve: {}: finishing the running requests, then stopping\n",
                                 sig == SIGTERM ? "SIGTERM" : "SIGINT")
                  << std::flush;
        server.shutdown();
        return;
      }
    }
  });
  server.listen();
  done = true;
  signals.join();
  server.shutdown();  // when the listener stopped on its own
  std::cerr << "attn serve: stopped\n" << std::flush;
  return 0;
}

}  // namespace

Command add_serve_command(CLI::App& app) {
  auto flags = std::make_shared<Flags>();
  CLI::App* cmd = app.add_subcommand(
      "serve",
      "Serve a model over HTTP with OpenAI's API (/v1/completions, /v1/chat/completions, "
      "/v1/models, /health, /metrics, /tokenize, /detokenize): continuous batching of up to "
      "--parallel requests over a paged key/value cache, each step one batched forward");
  cmd->footer(
      "Stops on SIGTERM or SIGINT: new requests get 503, running ones may finish within "
      "--shutdown-grace seconds, the rest are cancelled; exit code 0.\n"
      "docs/serve.md describes the endpoints and the request fields.\n\n"
      "Examples:\n"
      "  attn serve --model Qwen3-0.6B --parallel 8\n"
      "  attn serve --model gpt2 --port 0 --api-key secret\n"
      "  curl http://127.0.0.1:8080/v1/completions -H 'Content-Type: application/json' \\\n"
      "       -d '{\"prompt\": \"Every effort moves you\", \"max_tokens\": 20}'");
  add_option(cmd, "-m,--model", flags->model,
             "Model directory: Hugging Face GPT-2 (or an attn checkpoint), or a Llama 3 / Qwen2 / "
             "Qwen3 / Gemma directory with its tokenizer.json")
      ->required()
      ->type_name("DIR");
  add_option(cmd, "--model-name", flags->name,
             "The model's id in requests and /v1/models (default: the directory's name)")
      ->type_name("NAME");
  add_option(cmd, "--host", flags->host, "Address to bind (default 127.0.0.1: this machine only)")
      ->type_name("ADDR");
  add_option(cmd, "--port", flags->port, "TCP port (default 8080; 0: any free port, printed)")
      ->type_name("PORT");
  add_option(cmd, "--api-key", flags->api_key,
             "Require 'Authorization: Bearer KEY' on every endpoint but /health (default: the "
             "ATTN_API_KEY variable; none when both are empty)")
      ->type_name("KEY");
  add_option(cmd, "--parallel", flags->parallel, "Requests decoded together (slots; default 4)")
      ->type_name("N");
  add_option(cmd, "--ctx-size", flags->ctx_size,
             "The most tokens (prompt + completion) of one request (default: the model's context "
             "length)")
      ->type_name("N");
  add_option(cmd, "--kv-cache-mb", flags->kv_cache_mb,
             "Size of the paged key/value cache's pool (default: --ctx-size x --parallel "
             "positions)")
      ->type_name("MB");
  add_option(cmd, "--block-size", flags->block_size, "Positions per cache block (default 16)")
      ->type_name("N");
  add_option(cmd, "--queue-size", flags->queue_size,
             "Requests that may wait for a slot; more get 503 with Retry-After (default 64)")
      ->type_name("N");
  add_option(cmd, "--step-tokens", flags->step_tokens,
             "Token rows of one batched step: decoding rows first, prompt chunks fill the rest "
             "(default 256)")
      ->type_name("N");
  add_option(cmd, "--dtype", flags->dtype,
             "float32 (default) or bfloat16 (Llama / Qwen / Gemma: bf16 weights)")
      ->type_name("DTYPE");
  add_option(cmd, "--kv-dtype", flags->kv_dtype,
             "The paged KV cache's keys and values: auto (the default: as --dtype), float32 "
             "or bfloat16 (half the memory per token)")
      ->type_name("DTYPE");
  add_option(cmd, "--max-body-bytes", flags->max_body_bytes,
             "Largest request body; larger ones get 413 (default 8 MiB)")
      ->type_name("N");
  add_option(cmd, "--http-threads", flags->http_threads,
             "Connections served at once (default 2 x (parallel + queue-size), 32..512)")
      ->type_name("N");
  add_option(cmd, "--timeout", flags->timeout_s,
             "Seconds a client may take to send its request, or to take a response (default 10)")
      ->type_name("S");
  add_option(cmd, "--shutdown-grace", flags->shutdown_grace_s,
             "On SIGTERM/SIGINT, seconds running requests may take to finish (default 5)")
      ->type_name("S");
  add_option(cmd, "--chat-template", flags->chat_template,
             "The chat template for /v1/chat/completions: a Jinja file (or a JSON file's "
             "\"chat_template\"), instead of the directory's")
      ->type_name("FILE");
  cmd->add_flag("--no-prefix-caching", flags->no_prefix_caching,
                "Compute every prompt in full (by default the blocks of finished prompts stay "
                "cached, and a prompt that begins with the same tokens reads them)");
  cmd->add_flag("--log-prompts", flags->log_prompts,
                "Request logs (stderr, one line each) show the prompt text (escaped)");
  // Ranges checked as the flags are parsed (issue 46); the others are checked by run_serve.
  in_range(cmd->get_option("--parallel"), int64_t{1}, int64_t{1024});
  in_range(cmd->get_option("--port"), 0, 65535);
  in_range(cmd->get_option("--block-size"), int64_t{1}, int64_t{1024});
  constexpr int64_t kInt64Max = std::numeric_limits<int64_t>::max();
  in_range(cmd->get_option("--queue-size"), int64_t{0}, kInt64Max);
  in_range(cmd->get_option("--kv-cache-mb"), int64_t{0}, kInt64Max);
  in_range(cmd->get_option("--max-body-bytes"), int64_t{1024}, kInt64Max);
  in_range(cmd->get_option("--timeout"), 1, std::numeric_limits<int>::max());
  return Command{cmd, [flags] { return run_serve(*flags); }};
}

}  // namespace attn::cli
