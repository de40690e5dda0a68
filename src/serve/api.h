// api.h - the OpenAI HTTP API's requests and errors as attn serve reads them:
// JSON bodies checked field by field into structs (a wrong type or a value out
// of range is an ApiError naming the field), and the error object every
// failure answers with:
//   {"error": {"message": ..., "type": ..., "param": ..., "code": ...}}
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace attn::serve {

class ApiError : public std::runtime_error {
 public:
  ApiError(int status_code, const std::string& message,
           std::string error_type = "invalid_request_error", std::string error_param = "",
           std::string error_code = "")
      : std::runtime_error(message),
        status(status_code),
        type(std::move(error_type)),
        param(std::move(error_param)),
        code(std::move(error_code)) {}
  int status;
  std::string type, param, code;
  // The OpenAI error object.
  nlohmann::json body() const;
};

// 400 invalid_request_error naming the parameter.
ApiError bad_param(const std::string& param, const std::string& message);

struct ChatMessage {
  std::string role;     // "system", "user", "assistant", "developer", "tool"
  std::string content;  // a string, or the text parts of an array joined
};

// What /v1/completions and /v1/chat/completions share.
struct GenerationRequest {
  std::string model;  // "" when not given
  // Completions: the prompt as text or as token ids; chat: messages.
  std::optional<std::string> prompt_text;
  std::vector<int64_t> prompt_ids;
  std::vector<ChatMessage> messages;
  std::string chat_template_kwargs;   // chat: a JSON object's text (vLLM's extension), "" for none
  bool add_generation_prompt = true;  // chat (vLLM's): the assistant's header after the messages
  bool continue_final_message = false;  // chat (vLLM's): continue the last (assistant) message
  std::optional<int64_t> max_tokens;  // max_tokens or max_completion_tokens
  float temperature = 1.0f;
  float top_p = 1.0f;
  int64_t top_k = 0;
  std::optional<int64_t> seed;
  std::vector<std::string> stop;
  bool stream = false;
  bool include_usage = false;
  // Completions: logprobs (an int, 0..5) -> top_logprobs = it; chat: logprobs
  // true -> top_logprobs (0..20). -1: none.
  int64_t top_logprobs = -1;
  bool ignore_eos = false;  // an extension (vLLM's): keep going past end ids
};

// Parse errors of the body are 400 with the parser's position, never the bytes.
nlohmann::json parse_body(const std::string& body);
GenerationRequest parse_completion_request(const nlohmann::json& body);
GenerationRequest parse_chat_request(const nlohmann::json& body);

// A random id: prefix + 24 hex digits.
std::string random_id(const std::string& prefix);

}  // namespace attn::serve
