// Chat templates (attn/chat_template.h): a model directory's Jinja template
// found and read as transformers reads it, and rendered by src/text/jinja.h
// with the variables transformers' apply_chat_template passes.
#include "attn/chat_template.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>
#include <string_view>
#include <vector>

#include "attn/utf8.h"
#include "text/jinja.h"

namespace attn::text {
namespace {

using Json = nlohmann::ordered_json;
using jinja::Value;

constexpr int kMaxJsonDepth = 100;

std::string named(std::string_view s) {
  std::string out = "'";  // (not "'" + ...: GCC 12's false -Wrestrict)
  out += printable(s);
  out += "'";
  return out;
}

Value from_json(const Json& j, int depth) {
  if (depth > kMaxJsonDepth) {
    throw std::invalid_argument(
        fmt::format("chat template: the JSON nests more than {} levels", kMaxJsonDepth));
  }
  switch (j.type()) {
    case Json::value_t::null:
      return Value::none();
    case Json::value_t::boolean:
      return Value(j.get<bool>());
    case Json::value_t::number_integer:
      return Value(j.get<int64_t>());
    case Json::value_t::number_unsigned: {
      const uint64_t u = j.get<uint64_t>();
      if (u > static_cast<uint64_t>(INT64_MAX)) return Value(static_cast<double>(u));
      return Value(static_cast<int64_t>(u));
    }
    case Json::value_t::number_float:
      return Value(j.get<double>());
    case Json::value_t::string:
      return Value(j.get<std::string>());
    case Json::value_t::array: {
      std::vector<Value> items;
      items.reserve(j.size());
      for (const Json& x : j) items.push_back(from_json(x, depth + 1));
      return Value::list(std::move(items));
    }
    case Json::value_t::object: {
      Value::Items items;
      items.reserve(j.size());
      for (const auto& [k, x] : j.items()) items.emplace_back(Value(k), from_json(x, depth + 1));
      return Value::dict(std::move(items));
    }
    default:
      throw std::invalid_argument("chat template: a JSON value of an unsupported type (binary)");
  }
}

Json parse_json(std::string_view text, const std::string& what) {
  try {
    return Json::parse(text);
  } catch (const Json::exception& e) {
    throw std::invalid_argument(fmt::format("{} is not valid JSON: {}", what, e.what()));
  }
}

void check_utf8(std::string_view s, const std::string& what) {
  for (size_t i = 0; i < s.size();) {
    char32_t cp = 0;
    const char* why = nullptr;
    const size_t n = utf8_sequence(s, i, cp, &why);
    if (n == 0) {
      throw std::invalid_argument(
          fmt::format("chat template: {} is not valid UTF-8 at byte {}: {}", what, i, why));
    }
    i += n;
  }
}

// transformers' _normalize_chat_messages and _alias_reasoning_fields: keys
// whose value is null dropped; a message's reasoning (under reasoning_content,
// thinking or reasoning) given as both `thinking` and `reasoning_content`.
Value::Items normalized_items(const Json& m, size_t index) {
  if (!m.is_object()) {
    throw std::invalid_argument(
        fmt::format("chat template: message {} must be a JSON object (role, content, ...), got {}",
                    index, m.type_name()));
  }
  Value::Items items;
  for (const auto& [k, x] : m.items())
    if (!x.is_null()) items.emplace_back(Value(k), from_json(x, 1));
  const Value* reasoning = nullptr;
  Value copy;
  for (const char* key : {"reasoning_content", "thinking", "reasoning"}) {
    for (const auto& [k, x] : items) {
      if (k.as_string() == key) {
        copy = x;
        reasoning = &copy;
        break;
      }
    }
    if (reasoning != nullptr) break;
  }
  if (reasoning == nullptr) return items;
  const auto find = [&](const char* key) {
    return std::find_if(items.begin(), items.end(),
                        [&](const auto& kv) { return kv.first.as_string() == key; });
  };
  Value::Items out;
  if (find("thinking") == items.end()) out.emplace_back(Value("thinking"), copy);
  for (auto& kv : items) out.push_back(kv);
  if (auto it =
          std::find_if(out.begin(), out.end(),
                       [](const auto& kv) { return kv.first.as_string() == "reasoning_content"; });
      it != out.end()) {
    it->second = copy;
  } else {
    out.emplace_back(Value("reasoning_content"), copy);
  }
  return out;
}

Value normalize_message(const Json& m, size_t index) {
  return Value::dict(normalized_items(m, index));
}

// transformers' mark of the text to continue (render_jinja_template).
constexpr std::string_view kContinueTag = "CONTINUE_FINAL_MESSAGE_TAG ";

// Python's str.strip() / rstrip() for the whitespace a template trims: ASCII
// whitespace and the ASCII separators \x1c-\x1f, which Python's isspace counts.
bool py_space(char c) { return c == ' ' || (c >= '\t' && c <= '\r') || (c >= 0x1c && c <= 0x1f); }
std::string_view py_rstrip(std::string_view s) {
  while (!s.empty() && py_space(s.back())) s.remove_suffix(1);
  return s;
}
std::string_view py_strip(std::string_view s) {
  s = py_rstrip(s);
  while (!s.empty() && py_space(s.front())) s.remove_prefix(1);
  return s;
}

// The last message with field `field` tagged, as transformers tags it; sets
// *final_text to the text being continued.
Value tagged_final_message(const Json& m, size_t index, const std::string& field,
                           const std::string& source, std::string* final_text) {
  static constexpr std::array<const char*, 3> kReasoning = {"reasoning_content", "thinking",
                                                            "reasoning"};
  const bool reasoning = std::find(kReasoning.begin(), kReasoning.end(), field) != kReasoning.end();
  Value::Items items = normalized_items(m, index);
  const auto find = [&](std::string_view key) {
    return std::find_if(items.begin(), items.end(),
                        [&](const auto& kv) { return kv.first.as_string() == key; });
  };
  const auto it = find(field);
  if (it == items.end() || it->second.is_none()) {
    throw std::invalid_argument(fmt::format(
        "continue_final_message is set but the final message has no \"{}\" to continue!",
        printable(field)));
  }
  // Reasoning is copied under several names: every copy holding the same text.
  std::vector<std::string> fields = {field};
  if (reasoning && it->second.is_string()) {
    fields.clear();
    for (const char* f : kReasoning) {
      const auto at = find(f);
      if (at != items.end() && at->second.is_string() &&
          at->second.as_string() == it->second.as_string())
        fields.push_back(f);
    }
  }
  if (std::none_of(fields.begin(), fields.end(),
                   [&](const std::string& f) { return source.find(f) != std::string::npos; })) {
    throw std::invalid_argument(fmt::format(
        "continue_final_message is set to \"{}\" but this is not an accepted field in the "
        "chat_template",
        printable(field)));
  }
  if (it->second.is_list()) {  // text parts: the last one with a "text"
    std::vector<Value> parts = it->second.as_list();
    for (auto p = parts.rbegin(); p != parts.rend(); ++p) {
      const Value* text = p->is_dict() ? p->find("text") : nullptr;
      if (text == nullptr) continue;
      if (!text->is_string()) break;
      *final_text = text->as_string();
      Value::Items part = p->as_items();
      for (auto& kv : part)
        if (kv.first.as_string() == "text")
          kv.second = Value(*final_text + std::string(kContinueTag));
      *p = Value::dict(std::move(part));
      it->second = Value::list(std::move(parts));
      return Value::dict(std::move(items));
    }
    throw std::invalid_argument(
        "continue_final_message is set but we could not find any text to continue in the final "
        "message!");
  }
  if (!it->second.is_string()) {
    throw std::invalid_argument(fmt::format(
        "continue_final_message: the final message's \"{}\" is not text", printable(field)));
  }
  *final_text = it->second.as_string();
  for (const std::string& f : fields) {
    auto at = find(f);
    at->second = Value(at->second.as_string() + std::string(kContinueTag));
  }
  return Value::dict(std::move(items));
}

std::string read_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::invalid_argument(fmt::format("cannot read {}", named(path.string())));
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// A special token's text: a string, or an AddedToken object's "content".
std::optional<std::string> token_text(const Json& v) {
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v["content"].is_string())
    return v["content"].get<std::string>();
  return std::nullopt;
}

}  // namespace

struct ChatTemplate::Impl {
  std::string source;
  jinja::Template tmpl;
  std::optional<jinja::Template>
      tool_use;  // a list's "tool_use" template, used when tools are given
  std::map<std::string, std::string> special_tokens;
  std::string tool_use_source = {};
};

ChatTemplate::ChatTemplate(std::string_view source,
                           std::map<std::string, std::string> special_tokens, std::string name)
    : impl_(
          std::make_shared<Impl>(Impl{std::string(source), jinja::Template(source, std::move(name)),
                                      std::nullopt, std::move(special_tokens)})) {}

namespace {

// DIR/tokenizer_config.json as a JSON object ({} when there is none).
Json tokenizer_config(const std::filesystem::path& root) {
  const std::filesystem::path config_path = root / "tokenizer_config.json";
  if (!std::filesystem::exists(config_path)) return Json::object();
  Json config = parse_json(read_file(config_path), named(config_path.string()));
  if (!config.is_object()) {
    throw std::invalid_argument(
        fmt::format("{} must hold a JSON object", named(config_path.string())));
  }
  return config;
}

// transformers' special_tokens_map: the seven named tokens and any other
// "*_token" the config sets (Gemma 3's boi_token, image_token, ...), then
// extra_special_tokens and the legacy special_tokens_map.json.
std::map<std::string, std::string> special_tokens_of(const std::filesystem::path& root,
                                                     const Json& config) {
  std::map<std::string, std::string> specials;
  for (const auto& [k, v] : config.items()) {
    if (k.size() > 6 && k.compare(k.size() - 6, 6, "_token") == 0) {
      if (auto t = token_text(v)) specials[k] = *t;
    }
  }
  if (config.contains("extra_special_tokens") && config["extra_special_tokens"].is_object()) {
    for (const auto& [k, v] : config["extra_special_tokens"].items())
      if (auto t = token_text(v)) specials.emplace(k, *t);
  }
  const std::filesystem::path legacy = root / "special_tokens_map.json";
  if (std::filesystem::exists(legacy)) {
    const Json m = parse_json(read_file(legacy), named(legacy.string()));
    if (m.is_object())
      for (const auto& [k, v] : m.items())
        if (auto t = token_text(v)) specials.emplace(k, *t);
  }
  return specials;
}

}  // namespace

ChatTemplate ChatTemplate::from_file(const std::string& path, const std::string& model_dir) {
  namespace fs = std::filesystem;
  if (!fs::is_regular_file(path))
    throw std::invalid_argument(fmt::format("chat template: {} is not a file", named(path)));
  std::map<std::string, std::string> specials;
  if (!model_dir.empty()) specials = special_tokens_of(model_dir, tokenizer_config(model_dir));
  std::string text = read_file(path);
  if (path.size() >= 5 && path.compare(path.size() - 5, 5, ".json") == 0) {
    const Json j = parse_json(text, named(path));
    const Json* t = j.is_object() && j.contains("chat_template") ? &j["chat_template"] : nullptr;
    if (t != nullptr && t->is_array()) {
      for (const Json& e : *t) {
        if (e.is_object() && e.value("name", "") == "default" && e.contains("template"))
          t = &e["template"];
      }
    }
    if (t == nullptr || !t->is_string()) {
      throw std::invalid_argument(fmt::format(
          "{} must hold {{\"chat_template\": ...}} (a string, or a list with a \"default\")",
          named(path)));
    }
    text = t->get<std::string>();
  }
  return ChatTemplate(text, std::move(specials), path);
}

std::optional<ChatTemplate> ChatTemplate::from_model_dir(const std::string& dir) {
  namespace fs = std::filesystem;
  const fs::path root(dir);
  if (!fs::is_directory(root))
    throw std::invalid_argument(fmt::format("chat template: {} is not a directory", named(dir)));
  const fs::path config_path = root / "tokenizer_config.json";
  const Json config = tokenizer_config(root);
  std::map<std::string, std::string> specials = special_tokens_of(root, config);

  std::string source, name;
  std::optional<std::string> tool_use_source;
  const fs::path jinja_path = root / "chat_template.jinja";
  const fs::path json_path = root / "chat_template.json";
  const fs::path extra_dir = root / "additional_chat_templates";
  if (fs::exists(jinja_path)) {
    source = read_file(jinja_path);
    name = jinja_path.string();
    if (fs::exists(extra_dir / "tool_use.jinja"))
      tool_use_source = read_file(extra_dir / "tool_use.jinja");
  } else if (config.contains("chat_template") && !config["chat_template"].is_null()) {
    const Json& t = config["chat_template"];
    name = config_path.string() + " chat_template";
    if (t.is_string()) {
      source = t.get<std::string>();
    } else if (t.is_array()) {
      bool found = false;
      for (const Json& entry : t) {
        if (!entry.is_object() || !entry.contains("name") || !entry.contains("template") ||
            !entry["name"].is_string() || !entry["template"].is_string()) {
          throw std::invalid_argument(fmt::format(
              "{}: chat_template must be a string or a list of {{\"name\", \"template\"}} objects",
              named(config_path.string())));
        }
        if (entry["name"] == "default") {
          source = entry["template"].get<std::string>();
          found = true;
        } else if (entry["name"] == "tool_use") {
          tool_use_source = entry["template"].get<std::string>();
        }
      }
      if (!found) {
        throw std::invalid_argument(
            fmt::format("{}: chat_template lists several templates but none named \"default\"",
                        named(config_path.string())));
      }
    } else {
      throw std::invalid_argument(
          fmt::format("{}: chat_template must be a string or a list of {{\"name\", \"template\"}} "
                      "objects, got {}",
                      named(config_path.string()), t.type_name()));
    }
  } else if (fs::exists(json_path)) {
    const Json j = parse_json(read_file(json_path), named(json_path.string()));
    if (!j.is_object() || !j.contains("chat_template") || !j["chat_template"].is_string()) {
      throw std::invalid_argument(
          fmt::format("{} must hold {{\"chat_template\": \"...\"}}", named(json_path.string())));
    }
    source = j["chat_template"].get<std::string>();
    name = json_path.string();
  } else {
    return std::nullopt;
  }
  ChatTemplate t(source, std::move(specials), name);
  if (tool_use_source) {
    auto impl = std::make_shared<Impl>(*t.impl_);
    impl->tool_use.emplace(*tool_use_source, name + " (tool_use)");
    impl->tool_use_source = *tool_use_source;
    return ChatTemplate(std::move(impl));
  }
  return t;
}

std::string ChatTemplate::apply(const std::vector<ChatMessage>& messages,
                                const ChatOptions& options) const {
  Json list = Json::array();
  for (size_t i = 0; i < messages.size(); ++i) {
    check_utf8(messages[i].role, fmt::format("message {}'s role", i));
    check_utf8(messages[i].content, fmt::format("message {}'s content", i));
    list.push_back(Json{{"role", messages[i].role}, {"content", messages[i].content}});
  }
  return apply_json(list.dump(), options);
}

std::string ChatTemplate::apply_json(std::string_view messages_json,
                                     const ChatOptions& options) const {
  const Json messages = parse_json(messages_json, "chat template: the messages");
  if (!messages.is_array()) {
    throw std::invalid_argument(
        fmt::format("chat template: the messages must be a JSON array of objects, got {}",
                    messages.type_name()));
  }
  if (messages.empty()) {
    throw std::invalid_argument(
        "Cannot apply chat template to an empty conversation. Provide at least one message.");
  }
  const bool cont = !options.continue_final_message.empty();
  if (cont && options.add_generation_prompt) {
    throw std::invalid_argument(
        "continue_final_message and add_generation_prompt are not compatible. Use "
        "continue_final_message when you want the model to continue the final message, and "
        "add_generation_prompt when you want to add a header that will prompt it to start a new "
        "assistant message instead.");
  }
  std::vector<Value> chat;
  for (size_t i = 0; i + (cont ? 1 : 0) < messages.size(); ++i)
    chat.push_back(normalize_message(messages[i], i));

  Value tools = Value::none(), documents = Value::none();
  Value::Items extra;
  if (!options.kwargs_json.empty()) {
    const Json kwargs = parse_json(options.kwargs_json, "chat template: the template kwargs");
    if (!kwargs.is_object()) {
      throw std::invalid_argument(fmt::format(
          "chat template: the template kwargs must be a JSON object, got {}", kwargs.type_name()));
    }
    for (const auto& [k, v] : kwargs.items()) {
      if (k == "messages" || k == "add_generation_prompt") {
        throw std::invalid_argument(fmt::format(
            "chat template: {} is an argument of its own, not a template kwarg", named(k)));
      }
      if (k == "tools") {
        tools = from_json(v, 1);
      } else if (k == "documents") {
        documents = from_json(v, 1);
      } else {
        extra.emplace_back(Value(k), from_json(v, 1));
      }
    }
  }
  const bool tool_use = impl_->tool_use && !tools.is_none();
  const jinja::Template& t = tool_use ? *impl_->tool_use : impl_->tmpl;
  std::string final_text;
  if (cont) {
    chat.push_back(
        tagged_final_message(messages.back(), messages.size() - 1, options.continue_final_message,
                             tool_use ? impl_->tool_use_source : impl_->source, &final_text));
  }
  Value::Items vars;
  vars.emplace_back(Value("messages"), Value::list(std::move(chat)));
  vars.emplace_back(Value("tools"), tools);
  vars.emplace_back(Value("documents"), documents);
  vars.emplace_back(Value("add_generation_prompt"), Value(options.add_generation_prompt));
  for (const auto& special : impl_->special_tokens) {
    const bool overridden = std::any_of(extra.begin(), extra.end(), [&](const auto& kv) {
      return kv.first.as_string() == special.first;
    });
    if (!overridden) vars.emplace_back(Value(special.first), Value(special.second));
  }
  for (auto& kv : extra) vars.push_back(std::move(kv));
  std::string text = t.render(Value::dict(std::move(vars)));
  if (!cont) return text;
  // Cut where the tag is; whitespace the template trimmed after the text stays trimmed.
  const std::string_view tag = py_strip(kContinueTag);
  const size_t at = text.rfind(tag);
  if (text.find(py_strip(final_text)) == std::string::npos || at == std::string::npos) {
    throw std::invalid_argument(
        "continue_final_message is set but the final message does not appear in the chat after "
        "applying the chat template! This can happen if the chat template deletes portions of "
        "the final message.");
  }
  if (std::string_view(text).substr(at, kContinueTag.size()) == kContinueTag) {
    text.resize(at);
  } else {
    text = std::string(py_rstrip(std::string_view(text).substr(0, at)));
  }
  return text;
}

std::optional<std::string> ChatTemplate::special_token(const std::string& name) const {
  const auto it = impl_->special_tokens.find(name);
  if (it == impl_->special_tokens.end()) return std::nullopt;
  return it->second;
}

const std::map<std::string, std::string>& ChatTemplate::special_tokens() const {
  return impl_->special_tokens;
}

const std::string& ChatTemplate::source() const { return impl_->source; }

}  // namespace attn::text
