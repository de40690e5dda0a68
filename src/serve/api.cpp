// api.cpp - the requests' checks and the error object (api.h).
#include "api.h"

#include <fmt/format.h>

#include <limits>
#include <random>

#include "attn/utf8.h"

namespace attn::serve {

using nlohmann::json;

json ApiError::body() const {
  json e = {{"message", what()}, {"type", type}, {"param", nullptr}, {"code", nullptr}};
  if (!param.empty()) e["param"] = param;
  if (!code.empty()) e["code"] = code;
  return json{{"error", e}};
}

ApiError bad_param(const std::string& param, const std::string& message) {
  return ApiError(400, message, "invalid_request_error", param);
}

json parse_body(const std::string& body) {
  if (body.empty()) {
    throw ApiError(400, "the request has no body; send a JSON object", "invalid_request_error", "",
                   "invalid_json");
  }
  try {
    json j = json::parse(body);
    if (!j.is_object()) {
      throw ApiError(400, fmt::format("the body must be a JSON object, got {}", j.type_name()),
                     "invalid_request_error", "", "invalid_json");
    }
    return j;
  } catch (const json::parse_error& e) {
    // The parser's message quotes the last bytes read: only its position is given back.
    throw ApiError(
        400, fmt::format("the body is not valid JSON (UTF-8): parse error at byte {}", e.byte),
        "invalid_request_error", "", "invalid_json");
  } catch (const json::out_of_range&) {  // a number past a double's range, 1e400
    throw ApiError(400, "the body holds a number out of range", "invalid_request_error", "",
                   "invalid_json");
  }
}

std::string random_id(const std::string& prefix) {
  static thread_local std::mt19937_64 rng(std::random_device{}());
  return fmt::format("{}{:016x}{:08x}", prefix, rng(), static_cast<uint32_t>(rng()));
}

namespace {

// j[key] when present and not null.
const json* field(const json& j, const char* key) {
  const auto it = j.find(key);
  if (it == j.end() || it->is_null()) return nullptr;
  return &*it;
}

ApiError wrong_type(const char* key, const char* expected, const json& v) {
  return bad_param(key, fmt::format("'{}' must be {}, got {}", key, expected, v.type_name()));
}

std::optional<double> get_number(const json& j, const char* key) {
  const json* v = field(j, key);
  if (v == nullptr) return std::nullopt;
  if (!v->is_number()) throw wrong_type(key, "a number", *v);
  const double d = v->get<double>();
  if (!std::isfinite(d)) throw bad_param(key, fmt::format("'{}' must be finite", key));
  return d;
}

std::optional<int64_t> get_int(const json& j, const char* key) {
  const json* v = field(j, key);
  if (v == nullptr) return std::nullopt;
  if (!v->is_number_integer()) throw wrong_type(key, "an integer", *v);
  if (v->is_number_unsigned() &&
      v->get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
    throw bad_param(key, fmt::format("'{}' is out of range: {}", key, v->get<uint64_t>()));
  }
  return v->get<int64_t>();
}

std::optional<bool> get_bool(const json& j, const char* key) {
  const json* v = field(j, key);
  if (v == nullptr) return std::nullopt;
  if (!v->is_boolean()) throw wrong_type(key, "a boolean", *v);
  return v->get<bool>();
}

std::optional<std::string> get_string(const json& j, const char* key) {
  const json* v = field(j, key);
  if (v == nullptr) return std::nullopt;
  if (!v->is_string()) throw wrong_type(key, "a string", *v);
  return v->get<std::string>();
}

ApiError unsupported(const char* key, const std::string& what) {
  return bad_param(key, fmt::format("'{}': {} is not supported by attn serve", key, what));
}

// The fields both endpoints read.
void parse_common(const json& j, GenerationRequest& r) {
  r.model = get_string(j, "model").value_or("");
  if (const auto t = get_number(j, "temperature")) {
    if (*t < 0.0 || *t > 2.0)
      throw bad_param("temperature", fmt::format("'temperature' must be in [0, 2], got {}", *t));
    r.temperature = static_cast<float>(*t);
  }
  if (const auto p = get_number(j, "top_p")) {
    if (!(*p > 0.0 && *p <= 1.0))
      throw bad_param("top_p", fmt::format("'top_p' must be in (0, 1], got {}", *p));
    r.top_p = static_cast<float>(*p);
  }
  if (const auto k = get_int(j, "top_k")) {
    if (*k < -1)
      throw bad_param("top_k", fmt::format("'top_k' must be -1, 0 (off) or >= 1, got {}", *k));
    r.top_k = std::max<int64_t>(*k, 0);
  }
  if (const json* v = field(j, "seed")) {
    if (!v->is_number_integer()) throw wrong_type("seed", "an integer", *v);
    r.seed = v->is_number_unsigned() ? static_cast<int64_t>(v->get<uint64_t>()) : v->get<int64_t>();
  }
  if (const json* v = field(j, "stop")) {
    if (v->is_string()) {
      r.stop.push_back(v->get<std::string>());
    } else if (v->is_array()) {
      if (v->size() > 4)
        throw bad_param("stop", fmt::format("'stop' takes at most 4 strings, got {}", v->size()));
      for (const json& s : *v) {
        if (!s.is_string()) throw wrong_type("stop", "a string or an array of strings", s);
        r.stop.push_back(s.get<std::string>());
      }
    } else {
      throw wrong_type("stop", "a string or an array of strings", *v);
    }
    for (const std::string& s : r.stop) {
      if (s.empty()) throw bad_param("stop", "'stop' strings must not be empty");
    }
  }
  if (const auto n = get_int(j, "n"); n && *n != 1)
    throw bad_param("n", fmt::format("'n' must be 1 (one choice per request), got {}", *n));
  if (const auto b = get_int(j, "best_of"); b && *b != 1)
    throw bad_param("best_of", fmt::format("'best_of' must be 1, got {}", *b));
  for (const char* key : {"presence_penalty", "frequency_penalty"}) {
    if (const auto p = get_number(j, key); p && *p != 0.0)
      throw unsupported(key, "a penalty other than 0");
  }
  if (const json* v = field(j, "logit_bias"); v != nullptr && !(v->is_object() && v->empty()))
    throw unsupported("logit_bias", "a logit bias");
  r.stream = get_bool(j, "stream").value_or(false);
  if (const json* v = field(j, "stream_options")) {
    if (!v->is_object()) throw wrong_type("stream_options", "an object", *v);
    if (!r.stream)
      throw bad_param("stream_options", "'stream_options' is only allowed when 'stream' is true");
    r.include_usage = get_bool(*v, "include_usage").value_or(false);
  }
  r.ignore_eos = get_bool(j, "ignore_eos").value_or(false);
}

void set_max_tokens(const json& j, GenerationRequest& r, const char* key) {
  if (const auto m = get_int(j, key)) {
    if (*m < 1) throw bad_param(key, fmt::format("'{}' must be >= 1, got {}", key, *m));
    r.max_tokens = *m;
  }
}

std::vector<int64_t> token_ids(const json& a, const char* key) {
  std::vector<int64_t> ids;
  for (const json& t : a) {
    if (!t.is_number_integer()) throw wrong_type(key, "a string or token ids (integers)", t);
    if (t.is_number_unsigned() && t.get<uint64_t>() > (1ull << 62))
      throw bad_param(key, "a token id is out of range");
    ids.push_back(t.get<int64_t>());
  }
  return ids;
}

}  // namespace

GenerationRequest parse_completion_request(const json& j) {
  GenerationRequest r;
  parse_common(j, r);
  set_max_tokens(j, r, "max_tokens");
  const json* p = field(j, "prompt");
  if (p == nullptr) throw bad_param("prompt", "'prompt' is required");
  if (p->is_string()) {
    r.prompt_text = p->get<std::string>();
  } else if (p->is_array()) {
    if (p->empty()) throw bad_param("prompt", "'prompt' must not be empty");
    const json& first = (*p)[0];
    if (first.is_string() || first.is_array()) {  // a list of prompts: one only
      if (p->size() != 1)
        throw bad_param("prompt", fmt::format("one prompt per request, got {}", p->size()));
      if (first.is_string()) {
        r.prompt_text = first.get<std::string>();
      } else {
        r.prompt_ids = token_ids(first, "prompt");
      }
    } else {
      r.prompt_ids = token_ids(*p, "prompt");
    }
  } else {
    throw wrong_type("prompt", "a string or token ids", *p);
  }
  if ((r.prompt_text && r.prompt_text->empty()) || (!r.prompt_text && r.prompt_ids.empty()))
    throw bad_param("prompt", "'prompt' must not be empty");
  if (const auto e = get_bool(j, "echo"); e && *e) throw unsupported("echo", "echo = true");
  if (const auto s = get_string(j, "suffix"); s && !s->empty())
    throw unsupported("suffix", "a suffix");
  if (const json* v = field(j, "logprobs")) {
    if (!v->is_number_integer()) throw wrong_type("logprobs", "an integer (0..5)", *v);
    const int64_t n = v->get<int64_t>();
    if (n < 0 || n > 5)
      throw bad_param("logprobs", fmt::format("'logprobs' must be in [0, 5], got {}", n));
    r.top_logprobs = n;
  }
  return r;
}

GenerationRequest parse_chat_request(const json& j) {
  GenerationRequest r;
  parse_common(j, r);
  set_max_tokens(j, r, "max_tokens");
  set_max_tokens(j, r, "max_completion_tokens");
  const json* m = field(j, "messages");
  if (m == nullptr) throw bad_param("messages", "'messages' is required");
  if (!m->is_array()) throw wrong_type("messages", "an array", *m);
  if (m->empty()) throw bad_param("messages", "'messages' must not be empty");
  for (size_t i = 0; i < m->size(); ++i) {
    const json& msg = (*m)[i];
    const std::string where = fmt::format("messages[{}]", i);
    if (!msg.is_object())
      throw bad_param(where, fmt::format("'{}' must be an object, got {}", where, msg.type_name()));
    ChatMessage c;
    const json* role = field(msg, "role");
    if (role == nullptr || !role->is_string())
      throw bad_param(where + ".role", fmt::format("'{}.role' must be a string", where));
    c.role = role->get<std::string>();
    if (c.role != "system" && c.role != "user" && c.role != "assistant" && c.role != "developer" &&
        c.role != "tool") {
      throw bad_param(
          where + ".role",
          fmt::format("'{}.role' must be system, developer, user, assistant or tool, got '{}'",
                      where, printable(c.role, 40)));
    }
    const json* content = field(msg, "content");
    if (content == nullptr) {
      c.content = "";
    } else if (content->is_string()) {
      c.content = content->get<std::string>();
    } else if (content->is_array()) {
      for (const json& part : *content) {
        const json* type = part.is_object() ? field(part, "type") : nullptr;
        const json* text = part.is_object() ? field(part, "text") : nullptr;
        if (type == nullptr || *type != "text" || text == nullptr || !text->is_string()) {
          throw bad_param(
              where + ".content",
              fmt::format("'{}.content' parts must be {{\"type\": \"text\", \"text\": ...}} "
                          "(attn serve reads text only)",
                          where));
        }
        c.content += text->get<std::string>();
      }
    } else {
      throw bad_param(where + ".content",
                      fmt::format("'{}.content' must be a string or an array of text parts, got {}",
                                  where, content->type_name()));
    }
    r.messages.push_back(std::move(c));
  }
  if (const json* k = field(j, "chat_template_kwargs")) {
    if (!k->is_object()) throw wrong_type("chat_template_kwargs", "an object", *k);
    for (const char* reserved : {"messages", "add_generation_prompt"}) {
      if (k->contains(reserved))
        throw bad_param("chat_template_kwargs",
                        fmt::format("'chat_template_kwargs' cannot set '{}'", reserved));
    }
    r.chat_template_kwargs = k->dump();
  }
  r.add_generation_prompt = get_bool(j, "add_generation_prompt").value_or(true);
  r.continue_final_message = get_bool(j, "continue_final_message").value_or(false);
  if (r.add_generation_prompt && r.continue_final_message) {
    throw bad_param("continue_final_message",
                    "'continue_final_message' needs 'add_generation_prompt' set to false");
  }
  const bool logprobs = get_bool(j, "logprobs").value_or(false);
  const auto top = get_int(j, "top_logprobs");
  if (top && (*top < 0 || *top > 20))
    throw bad_param("top_logprobs", fmt::format("'top_logprobs' must be in [0, 20], got {}", *top));
  if (top && !logprobs)
    throw bad_param("top_logprobs", "'top_logprobs' needs 'logprobs' set to true");
  if (logprobs) r.top_logprobs = top.value_or(0);
  if (const json* t = field(j, "tools"); t != nullptr && !(t->is_array() && t->empty()))
    throw unsupported("tools", "tool calling");
  if (const json* f = field(j, "response_format")) {
    const json* type = f->is_object() ? field(*f, "type") : nullptr;
    if (type == nullptr || *type != "text")
      throw unsupported("response_format", "a format other than text");
  }
  return r;
}

}  // namespace attn::serve
