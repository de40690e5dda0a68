// server.h - attn serve's HTTP side (cpp-httplib): the OpenAI endpoints over
// one Engine, authentication, limits, request logs and shutdown.
//
//   POST /v1/completions        POST /v1/chat/completions   (stream: server-sent events)
//   GET  /v1/models             GET  /health                GET /metrics (Prometheus)
//   POST /tokenize              POST /detokenize
//
// Every failure is an OpenAI error object with its status: 400 (malformed
// JSON, a field of the wrong type or out of range, a prompt past the context),
// 401 (--api-key set and no matching "Authorization: Bearer"; /health is
// exempt), 404 (unknown path or model), 413 (a body over --max-body-bytes),
// 503 with Retry-After (the queue is full, or the server is shutting down).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "api.h"
#include "engine.h"
#include "metrics.h"
#include "served_model.h"

namespace attn::serve {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8080;       // 0: any free port (bound_port() says which)
  std::string api_key;   // "": no authentication
  int64_t ctx_size = 0;  // prompt + max_tokens of one request
  size_t max_body_bytes = 8 << 20;
  int http_threads = 64;          // connections served at once
  int read_timeout_s = 10;        // a request's headers and body must come within it
  bool log_prompts = false;       // request logs show the prompt text
  double shutdown_grace_s = 5.0;  // running requests may finish within it
  std::vector<int64_t> chat_end_ids;  // chat replies also end at these (the template's eos_token)
};

// The request's chat options (vLLM's extensions of the chat request).
struct ChatRenderOptions {
  std::string kwargs_json;  // chat_template_kwargs: a JSON object's text, or ""
  bool add_generation_prompt = true;
  bool continue_final_message = false;  // the text ends inside the last message's content
};
// Messages -> the prompt text, as transformers' apply_chat_template(messages,
// tokenize=False, add_generation_prompt=..., continue_final_message=...,
// **kwargs); empty when the model has none.
using ChatRenderer =
    std::function<std::string(const std::vector<ChatMessage>&, const ChatRenderOptions&)>;

class Server {
 public:
  Server(ServedModel& model, Engine& engine, Metrics& metrics, const ServerOptions& options,
         ChatRenderer chat, std::string chat_missing_reason);
  ~Server();
  // Binds the socket; throws std::runtime_error naming host and port when it cannot.
  void bind();
  int bound_port() const { return port_; }
  // Serves until shutdown(); returns when the listener has stopped.
  void listen();
  // Refuses new generations (503), lets running ones finish within the grace,
  // cancels the rest, stops the listener. Safe from any thread, once or more.
  void shutdown();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  int port_ = 0;
};

}  // namespace attn::serve
