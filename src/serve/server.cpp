// server.cpp - the HTTP endpoints (server.h) on cpp-httplib.
#include "server.h"

#include <fmt/format.h>
#include <httplib.h>
#include <sys/socket.h>

#include <chrono>
#include <ctime>
#include <iostream>
#include <mutex>
#include <random>
#include <thread>

#include "attn/utf8.h"
#include "text_stream.h"

namespace attn::serve {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

namespace {

std::string dump(const json& j) {
  return j.dump(-1, ' ', false, json::error_handler_t::replace);  // invalid UTF-8 -> U+FFFD
}

void send_error(httplib::Response& res, const ApiError& e) {
  res.status = e.status;
  res.set_content(dump(e.body()), "application/json");
}

// Constant-time equality: every byte of the longer is read whatever the first difference.
bool same_secret(const std::string& a, const std::string& b) {
  const size_t n = std::max(a.size(), b.size());
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < n; ++i) {
    const unsigned char x = i < a.size() ? static_cast<unsigned char>(a[i]) : 0;
    const unsigned char y = i < b.size() ? static_cast<unsigned char>(b[i]) : 0;
    diff |= static_cast<unsigned char>(x ^ y);
  }
  return diff == 0;
}

// What one request's log line says; each connection's thread fills its own.
struct RequestRecord {
  Clock::time_point start = Clock::now();
  int64_t prompt_tokens = -1, completion_tokens = -1;
  std::string finish, prompt;
};
thread_local RequestRecord tl_record;

int64_t unix_now() { return static_cast<int64_t>(std::time(nullptr)); }

}  // namespace

// cpp-httplib as Debian builds it listens with a backlog of 5 connections;
// a burst of clients would then wait for the kernel's SYN retries, or be reset.
constexpr int kListenBacklog = 1024;  // the kernel caps it at net.core.somaxconn

class HttpServer : public httplib::Server {
 public:
  void widen_backlog(int backlog) { ::listen(svr_sock_.load(), backlog); }
};

struct Server::Impl {
  ServedModel& model;
  Engine& engine;
  Metrics& metrics;
  ServerOptions options;
  ChatRenderer chat;
  std::string chat_missing;
  HttpServer http;
  std::atomic<bool> shutting_down{false};
  std::once_flag shutdown_once;

  Impl(ServedModel& m, Engine& e, Metrics& mt, const ServerOptions& o, ChatRenderer c,
       std::string missing)
      : model(m),
        engine(e),
        metrics(mt),
        options(o),
        chat(std::move(c)),
        chat_missing(std::move(missing)) {}

  void routes();
  void generate(const httplib::Request& req, httplib::Response& res, bool is_chat);
  std::vector<int64_t> prompt_ids(const GenerationRequest& g, bool is_chat);
  json logprob_entry(const TokenEvent& e, bool is_chat) const;
  std::string token_text(int64_t id) const {
    const int64_t one[] = {id};
    return model.decode(one);
  }
};

// ---- the prompt, its checks, the sampling ------------------------------------------------

std::vector<int64_t> Server::Impl::prompt_ids(const GenerationRequest& g, bool is_chat) {
  std::vector<int64_t> ids;
  if (is_chat) {
    if (!chat)
      throw ApiError(400, chat_missing, "invalid_request_error", "messages", "no_chat_template");
    std::string text;
    try {
      text = chat(g.messages, {.kwargs_json = g.chat_template_kwargs,
                               .add_generation_prompt = g.add_generation_prompt,
                               .continue_final_message = g.continue_final_message});
    } catch (const std::exception& e) {
      throw ApiError(400, fmt::format("the chat template failed: {}", printable(e.what(), 300)),
                     "invalid_request_error", "messages");
    }
    if (options.log_prompts) tl_record.prompt = text;
    try {
      ids = model.encode(text, false);
    } catch (const std::exception& e) {
      throw bad_param("messages", printable(e.what(), 300));
    }
  } else if (g.prompt_text) {
    if (options.log_prompts) tl_record.prompt = *g.prompt_text;
    try {
      ids = model.encode(*g.prompt_text, true);
    } catch (const std::exception& e) {
      throw bad_param("prompt", printable(e.what(), 300));
    }
  } else {
    ids = g.prompt_ids;
    for (const int64_t id : ids) {
      if (id < 0 || id >= model.vocab_size())
        throw bad_param("prompt", fmt::format("token id {} is outside the vocabulary of {} tokens",
                                              id, model.vocab_size()));
    }
  }
  if (ids.empty()) throw bad_param(is_chat ? "messages" : "prompt", "the prompt has no tokens");
  return ids;
}

json Server::Impl::logprob_entry(const TokenEvent& e, bool is_chat) const {
  const auto bytes_of = [](const std::string& s) {
    json b = json::array();
    for (const char c : s) b.push_back(static_cast<int>(static_cast<unsigned char>(c)));
    return b;
  };
  const std::string tok = token_text(e.id);
  if (is_chat) {
    json top = json::array();
    for (const auto& [id, lp] : e.top) {
      const std::string t = token_text(id);
      top.push_back({{"token", t}, {"logprob", lp}, {"bytes", bytes_of(t)}});
    }
    return {
        {"token", tok}, {"logprob", e.logprob}, {"bytes", bytes_of(tok)}, {"top_logprobs", top}};
  }
  json top = json::object();
  for (const auto& [id, lp] : e.top) top[token_text(id)] = lp;
  return {{"token", tok}, {"logprob", e.logprob}, {"top", top}};
}

namespace {

// Completions' logprobs object from per-token entries.
json completion_logprobs(const std::vector<json>& entries, size_t text_start) {
  json tokens = json::array(), lps = json::array(), tops = json::array(), offsets = json::array();
  size_t offset = text_start;
  for (const json& e : entries) {
    tokens.push_back(e["token"]);
    lps.push_back(e["logprob"]);
    tops.push_back(e["top"]);
    offsets.push_back(offset);
    offset += e["token"].get<std::string>().size();
  }
  return {{"tokens", tokens},
          {"token_logprobs", lps},
          {"top_logprobs", tops},
          {"text_offset", offsets}};
}

}  // namespace

// ---- generation ----------------------------------------------------------------------------

void Server::Impl::generate(const httplib::Request& req, httplib::Response& res, bool is_chat) {
  if (shutting_down)
    throw ApiError(503, "the server is shutting down", "server_error", "", "shutting_down");
  const json body = parse_body(req.body);
  const GenerationRequest g = is_chat ? parse_chat_request(body) : parse_completion_request(body);
  if (!g.model.empty() && g.model != model.name()) {
    throw ApiError(404,
                   fmt::format("the model '{}' does not exist; this server serves '{}'",
                               printable(g.model, 100), model.name()),
                   "invalid_request_error", "model", "model_not_found");
  }
  const std::vector<int64_t> ids = prompt_ids(g, is_chat);
  const int64_t P = static_cast<int64_t>(ids.size()), ctx = options.ctx_size;
  tl_record.prompt_tokens = P;
  if (P >= ctx) {
    throw ApiError(
        400,
        fmt::format("this model's maximum context length is {} tokens; the prompt has {}", ctx, P),
        "invalid_request_error", is_chat ? "messages" : "prompt", "context_length_exceeded");
  }
  const int64_t max_tokens =
      g.max_tokens.value_or(is_chat ? ctx - P : std::min<int64_t>(16, ctx - P));
  if (P + max_tokens > ctx) {
    throw ApiError(400,
                   fmt::format("this model's maximum context length is {} tokens; you requested {} "
                               "({} in the prompt, {} for the completion): reduce the prompt or "
                               "max_tokens",
                               ctx, P + max_tokens, P, max_tokens),
                   "invalid_request_error", "max_tokens", "context_length_exceeded");
  }
  if (P + max_tokens > engine.max_fit_tokens()) {
    throw ApiError(400,
                   fmt::format("the request needs {} positions of the key/value cache, which holds "
                               "{} (--kv-cache-mb)",
                               P + max_tokens, engine.max_fit_tokens()),
                   "invalid_request_error", "max_tokens", "context_length_exceeded");
  }
  SamplingParams sp;
  sp.temperature = g.temperature;
  sp.top_p = g.top_p;
  sp.top_k = g.top_k;
  sp.seed =
      g.seed ? static_cast<uint64_t>(*g.seed) : std::random_device{}() * 0x9E3779B97F4A7C15ull;
  sp.max_tokens = max_tokens;
  sp.top_logprobs = g.top_logprobs;
  sp.ignore_eos = g.ignore_eos;
  if (is_chat) sp.end_ids = options.chat_end_ids;
  std::shared_ptr<Sequence> seq;
  try {
    seq = engine.submit(ids, sp);
  } catch (const QueueFull& e) {
    res.set_header("Retry-After", "1");
    throw ApiError(503, e.what(), "server_error", "", "server_overloaded");
  } catch (const std::runtime_error& e) {
    throw ApiError(503, e.what(), "server_error", "", "shutting_down");
  }

  const std::string id = random_id(is_chat ? "chatcmpl-" : "cmpl-");
  const int64_t created = unix_now();
  const std::string object = is_chat ? "chat.completion" : "text_completion";
  const bool logprobs = g.top_logprobs >= 0;

  if (!g.stream) {
    TextStream ts([this](std::span<const int64_t> x) { return model.decode(x); }, g.stop);
    std::vector<json> entries;
    int64_t n = 0;
    Finish f = Finish::kNone;
    while (f == Finish::kNone && !ts.stopped()) {
      std::vector<TokenEvent> events;
      f = seq->wait(events, std::chrono::milliseconds(200));
      for (const TokenEvent& e : events) {
        ++n;
        ts.push(e.id);
        if (logprobs) entries.push_back(logprob_entry(e, is_chat));
        if (ts.stopped()) break;
      }
    }
    if (ts.stopped()) seq->cancel();
    tl_record.completion_tokens = n;
    if (f == Finish::kError)
      throw ApiError(500, "generation failed: " + printable(seq->error(), 300), "server_error");
    if (f == Finish::kCancelled && !ts.stopped())
      throw ApiError(503, "the server is shutting down", "server_error", "", "shutting_down");
    ts.flush();
    const std::string reason = ts.stopped() || f == Finish::kStop ? "stop" : "length";
    tl_record.finish = reason;
    json choice = {{"index", 0}, {"finish_reason", reason}, {"logprobs", nullptr}};
    if (is_chat) {
      choice["message"] = {{"role", "assistant"}, {"content", ts.text()}};
      if (logprobs) {
        json content = json::array();
        for (const json& e : entries) content.push_back(e);
        choice["logprobs"] = {{"content", content}};
      }
    } else {
      choice["text"] = ts.text();
      if (logprobs) choice["logprobs"] = completion_logprobs(entries, 0);
    }
    const json out = {
        {"id", id},
        {"object", object},
        {"created", created},
        {"model", model.name()},
        {"system_fingerprint", "attn"},
        {"choices", json::array({choice})},
        {"usage", {{"prompt_tokens", P}, {"completion_tokens", n}, {"total_tokens", P + n}}}};
    res.set_content(dump(out), "application/json");
    return;
  }

  // Server-sent events: one chunk per piece of text, the finish, the usage, [DONE].
  struct Stream {
    std::shared_ptr<Sequence> seq;
    std::unique_ptr<TextStream> ts;
    int64_t n = 0;
    size_t offset = 0;
    bool role_sent = false;
  };
  auto st = std::make_shared<Stream>();
  st->seq = seq;
  st->ts = std::make_unique<TextStream>(
      [this](std::span<const int64_t> x) { return model.decode(x); }, g.stop);
  const std::string chunk_object = is_chat ? "chat.completion.chunk" : "text_completion";
  const bool include_usage = g.include_usage;
  // One server-sent event holding one choice.
  const auto event = [=, this](const json& choice) {
    json c = {{"id", id},
              {"object", chunk_object},
              {"created", created},
              {"model", model.name()},
              {"system_fingerprint", "attn"},
              {"choices", json::array({choice})}};
    if (include_usage) c["usage"] = nullptr;
    return "data: " + dump(c) + "\n\n";
  };
  const auto chunk = [=](const std::string& text, const json& lp, const json& reason) {
    json choice = {{"index", 0}, {"finish_reason", reason}, {"logprobs", nullptr}};
    if (is_chat) {
      choice["delta"] = reason.is_null() ? json{{"content", text}} : json::object();
      if (!lp.is_null()) choice["logprobs"] = {{"content", lp}};
    } else {
      choice["text"] = text;
      if (!lp.is_null()) choice["logprobs"] = lp;
    }
    return event(choice);
  };
  res.set_header("Cache-Control", "no-cache");
  res.set_chunked_content_provider(
      "text/event-stream",
      [=, this](size_t, httplib::DataSink& sink) -> bool {
        try {
          const auto write = [&](const std::string& s) {
            if (!sink.write(s.data(), s.size())) {
              st->seq->cancel();
              return false;
            }
            return true;
          };
          if (is_chat && !st->role_sent) {
            st->role_sent = true;
            return write(event({{"index", 0},
                                {"delta", {{"role", "assistant"}, {"content", ""}}},
                                {"logprobs", nullptr},
                                {"finish_reason", nullptr}}));
          }
          std::vector<TokenEvent> events;
          const Finish f = st->seq->wait(events, std::chrono::milliseconds(100));
          for (const TokenEvent& e : events) {
            if (st->ts->stopped()) break;
            ++st->n;
            const std::string piece = st->ts->push(e.id);
            json lp = nullptr;
            if (logprobs) {
              const json entry = logprob_entry(e, is_chat);
              lp = is_chat ? json::array({entry}) : completion_logprobs({entry}, st->offset);
            }
            st->offset += piece.size();
            if ((!piece.empty() || logprobs) && !write(chunk(piece, lp, nullptr))) return false;
          }
          tl_record.completion_tokens = st->n;
          if (f == Finish::kNone && !st->ts->stopped()) {
            if (sink.is_writable()) return true;
            st->seq->cancel();
            return false;
          }
          if (st->ts->stopped()) st->seq->cancel();
          if ((f == Finish::kError || f == Finish::kCancelled) && !st->ts->stopped()) {
            const ApiError e =
                f == Finish::kError
                    ? ApiError(500, "generation failed: " + printable(st->seq->error(), 300),
                               "server_error")
                    : ApiError(503, "the server is shutting down", "server_error", "",
                               "shutting_down");
            tl_record.finish = finish_name(f);
            if (!write("data: " + dump(e.body()) + "\n\n") || !write("data: [DONE]\n\n"))
              return false;
            sink.done();
            return true;
          }
          const std::string rest = st->ts->flush();
          if (!rest.empty() && !write(chunk(rest, nullptr, nullptr))) return false;
          const std::string reason = st->ts->stopped() || f == Finish::kStop ? "stop" : "length";
          tl_record.finish = reason;
          if (!write(chunk("", nullptr, reason))) return false;
          if (include_usage) {
            const json u = {{"id", id},
                            {"object", chunk_object},
                            {"created", created},
                            {"model", model.name()},
                            {"system_fingerprint", "attn"},
                            {"choices", json::array()},
                            {"usage",
                             {{"prompt_tokens", P},
                              {"completion_tokens", st->n},
                              {"total_tokens", P + st->n}}}};
            if (!write("data: " + dump(u) + "\n\n")) return false;
          }
          if (!write("data: [DONE]\n\n")) return false;
          sink.done();
          return true;
        } catch (const std::exception& e) {  // nothing may leave a connection's thread
          st->seq->cancel();
          std::cerr << "attn serve: a stream failed: " + printable(e.what(), 300) + "\n";
          return false;
        }
      },
      [st](bool success) {
        if (!success) st->seq->cancel();  // the client went away: free its slot
      });
}

// ---- the routes --------------------------------------------------------------------------

void Server::Impl::routes() {
  const auto guarded = [this](auto fn) {
    return [this, fn](const httplib::Request& req, httplib::Response& res) {
      try {
        fn(req, res);
      } catch (const ApiError& e) {
        send_error(res, e);
      } catch (const std::exception& e) {
        send_error(res, ApiError(500, printable(e.what(), 300), "server_error"));
      }
    };
  };
  http.Post("/v1/completions", guarded([this](const httplib::Request& q, httplib::Response& r) {
              generate(q, r, false);
            }));
  http.Post(
      "/v1/chat/completions",
      guarded([this](const httplib::Request& q, httplib::Response& r) { generate(q, r, true); }));
  const auto model_object = [this] {
    return json{{"id", model.name()},
                {"object", "model"},
                {"created", unix_now()},
                {"owned_by", "attn"},
                {"max_model_len", options.ctx_size}};
  };
  http.Get("/v1/models",
           guarded([this, model_object](const httplib::Request&, httplib::Response& r) {
             r.set_content(dump({{"object", "list"}, {"data", json::array({model_object()})}}),
                           "application/json");
           }));
  http.Get(R"(/v1/models/(.+))",
           guarded([this, model_object](const httplib::Request& q, httplib::Response& r) {
             const std::string id = q.matches[1];
             if (id != model.name()) {
               throw ApiError(404,
                              fmt::format("the model '{}' does not exist; this server serves '{}'",
                                          printable(id, 100), model.name()),
                              "invalid_request_error", "model", "model_not_found");
             }
             r.set_content(dump(model_object()), "application/json");
           }));
  http.Get("/health", [this](const httplib::Request&, httplib::Response& r) {
    if (shutting_down) {
      r.status = 503;
      r.set_content(R"({"status":"shutting down"})", "application/json");
    } else {
      r.set_content(R"({"status":"ok"})", "application/json");
    }
  });
  http.Get("/metrics", [this](const httplib::Request&, httplib::Response& r) {
    r.set_content(metrics.text(), "text/plain; version=0.0.4");
  });
  http.Post(
      "/tokenize", guarded([this](const httplib::Request& q, httplib::Response& r) {
        const json body = parse_body(q.body);
        const json* p = body.contains("prompt")    ? &body["prompt"]
                        : body.contains("content") ? &body["content"]
                                                   : nullptr;
        if (p == nullptr || !p->is_string()) throw bad_param("prompt", "'prompt' must be a string");
        bool special = true;
        if (body.contains("add_special_tokens")) {
          if (!body["add_special_tokens"].is_boolean())
            throw bad_param("add_special_tokens", "'add_special_tokens' must be a boolean");
          special = body["add_special_tokens"].get<bool>();
        }
        std::vector<int64_t> ids;
        try {
          ids = model.encode(p->get<std::string>(), special);
        } catch (const std::exception& e) {
          throw bad_param("prompt", printable(e.what(), 300));
        }
        r.set_content(
            dump({{"tokens", ids}, {"count", ids.size()}, {"max_model_len", options.ctx_size}}),
            "application/json");
      }));
  http.Post(
      "/detokenize", guarded([this](const httplib::Request& q, httplib::Response& r) {
        const json body = parse_body(q.body);
        if (!body.contains("tokens") || !body["tokens"].is_array())
          throw bad_param("tokens", "'tokens' must be an array of token ids");
        std::vector<int64_t> ids;
        for (const json& t : body["tokens"]) {
          if (!t.is_number_integer()) throw bad_param("tokens", "'tokens' must hold integers");
          const int64_t id =
              t.is_number_unsigned() && t.get<uint64_t>() > (1ull << 62) ? -1 : t.get<int64_t>();
          if (id < 0 || id >= model.vocab_size())
            throw bad_param("tokens", fmt::format("token id {} is outside the vocabulary of {} "
                                                  "tokens",
                                                  t.dump(), model.vocab_size()));
          ids.push_back(id);
        }
        r.set_content(dump({{"prompt", model.decode(ids)}}), "application/json");
      }));

  http.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    tl_record = RequestRecord{};
    if (options.api_key.empty() || req.path == "/health")
      return httplib::Server::HandlerResponse::Unhandled;
    const std::string auth = req.get_header_value("Authorization");
    const std::string prefix = "Bearer ";
    const std::string given = auth.rfind(prefix, 0) == 0 ? auth.substr(prefix.size()) : "";
    if (!same_secret(given, options.api_key)) {
      send_error(res, ApiError(401, "a valid API key is required: send 'Authorization: Bearer KEY'",
                               "invalid_request_error", "", "invalid_api_key"));
      return httplib::Server::HandlerResponse::Handled;
    }
    return httplib::Server::HandlerResponse::Unhandled;
  });
  http.set_error_handler([this](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return;
    if (res.status == 404) {
      send_error(
          res, ApiError(404, fmt::format("no endpoint {} {}", req.method, printable(req.path, 200)),
                        "invalid_request_error", "", "unknown_url"));
    } else if (res.status == 413) {
      send_error(res, ApiError(413,
                               fmt::format("the body is over the limit of {} bytes",
                                           options.max_body_bytes),
                               "invalid_request_error", "", "request_too_large"));
    } else {
      send_error(res, ApiError(res.status, fmt::format("HTTP error {}", res.status),
                               res.status >= 500 ? "server_error" : "invalid_request_error"));
    }
  });
  http.set_exception_handler(
      [](const httplib::Request&, httplib::Response& res, std::exception_ptr) {
        send_error(res, ApiError(500, "internal error", "server_error"));
      });
  http.set_logger([this](const httplib::Request& req, const httplib::Response& res) {
    metrics.count_response(res.status);
    const RequestRecord& r = tl_record;
    std::string line = fmt::format("attn serve: {} {} {} {}", req.remote_addr, req.method,
                                   printable(req.path, 200), res.status);
    if (r.prompt_tokens >= 0) line += fmt::format(" prompt_tokens={}", r.prompt_tokens);
    if (r.completion_tokens >= 0) line += fmt::format(" completion_tokens={}", r.completion_tokens);
    if (!r.finish.empty()) line += " finish=" + r.finish;
    line += fmt::format(" {:.3f}s", std::chrono::duration<double>(Clock::now() - r.start).count());
    if (options.log_prompts && !r.prompt.empty())
      line += " prompt=\"" + printable(r.prompt, 2000) + "\"";
    std::cerr << (line + "\n") << std::flush;
    tl_record = RequestRecord{};
  });
}

// ---- Server --------------------------------------------------------------------------------

Server::Server(ServedModel& model, Engine& engine, Metrics& metrics, const ServerOptions& options,
               ChatRenderer chat, std::string chat_missing_reason)
    : impl_(std::make_unique<Impl>(model, engine, metrics, options, std::move(chat),
                                   std::move(chat_missing_reason))) {
  Impl& s = *impl_;
  const int threads = options.http_threads;
  s.http.new_task_queue = [threads] {
    return new httplib::ThreadPool(static_cast<size_t>(threads));
  };
  s.http.set_payload_max_length(options.max_body_bytes);
  s.http.set_read_timeout(options.read_timeout_s, 0);
  s.http.set_write_timeout(options.read_timeout_s, 0);
  s.http.set_keep_alive_timeout(2);
  s.http.set_keep_alive_max_count(1000);  // cpp-httplib's default closes after 5 requests
  s.http.set_tcp_nodelay(true);
  s.routes();
}

Server::~Server() = default;

void Server::bind() {
  Impl& s = *impl_;
  if (s.options.port == 0) {
    port_ = s.http.bind_to_any_port(s.options.host);
    if (port_ <= 0)
      throw std::runtime_error(
          fmt::format("cannot bind {} on any port", printable(s.options.host)));
  } else {
    if (!s.http.bind_to_port(s.options.host, s.options.port))
      throw std::runtime_error(
          fmt::format("cannot bind {}:{} (in use, or not an address of this "
                      "machine?)",
                      printable(s.options.host), s.options.port));
    port_ = s.options.port;
  }
  s.http.widen_backlog(kListenBacklog);
}

void Server::listen() { impl_->http.listen_after_bind(); }

void Server::shutdown() {
  Impl& s = *impl_;
  std::call_once(s.shutdown_once, [&] {
    s.shutting_down = true;
    const auto deadline =
        Clock::now() + std::chrono::duration_cast<Clock::duration>(
                           std::chrono::duration<double>(s.options.shutdown_grace_s));
    while (Clock::now() < deadline &&
           (s.metrics.slots_busy.load() > 0 || s.metrics.requests_waiting.load() > 0)) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    s.engine.stop();  // cancels what is left: its clients get an error event or a 503
    s.http.stop();
  });
}

}  // namespace attn::serve
