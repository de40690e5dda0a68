// Chat templates (attn/chat_template.h) and the Jinja interpreter under them
// (src/text/jinja.h) against transformers 5.24 with jinja2 3.1.6
// (tests/fixtures/make_chat_template_fixtures.py): the published templates of
// Qwen3, Llama 3.1/3.2, Gemma 2/3, Qwen2.5 and eight others over a table of
// conversations and options, and small templates for the language itself,
// each byte for byte (or the same error); model directories; hostile templates.
#include <gtest/gtest.h>

#include <chrono>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "attn/chat_template.h"
#include "attn/hf_tokenizer.h"
#include "cli.h"
#include "text/jinja.h"

namespace {

using attn::text::ChatMessage;
using attn::text::ChatOptions;
using attn::text::ChatTemplate;
using Json = nlohmann::ordered_json;

const std::string kFixtures = std::string(ATTN_TESTS_DIR) + "/fixtures";
const std::string kTemplates = kFixtures + "/chat_templates";

void parse(const std::string& source) { attn::text::jinja::Template t(source, "t"); }

const Json& expected() {
  static const Json j = Json::parse(attn::test::read_text(kTemplates + "/expected.json"));
  return j;
}

std::string template_source(const std::string& file) {
  return attn::test::read_text(kTemplates + "/" + file);
}

std::map<std::string, std::string> specials_of(const Json& j) {
  std::map<std::string, std::string> m;
  for (const auto& [k, v] : j.items()) m[k] = v.get<std::string>();
  return m;
}

// Every (template, conversation, options) of the fixture: the same text, or an
// error where transformers raises one (with its message for raise_exception).
TEST(ChatTemplate, PublishedTemplatesMatchTransformers) {
  const Json& cases = expected()["cases"];
  ASSERT_GE(cases.size(), 150u);
  size_t rendered = 0, errors = 0;
  for (const Json& c : cases) {
    SCOPED_TRACE(c["name"].get<std::string>());
    const ChatTemplate chat(template_source(c["template"]), specials_of(c["special_tokens"]),
                            c["template"].get<std::string>());
    ChatOptions options{.add_generation_prompt = c["add_generation_prompt"].get<bool>(),
                        .kwargs_json = c["kwargs"].dump()};
    if (c.contains("continue_final_message")) {  // transformers' True or a field's name
      const Json& cont = c["continue_final_message"];
      options.continue_final_message = cont.is_boolean() ? "content" : cont.get<std::string>();
    }
    if (c.contains("expected")) {
      EXPECT_EQ(chat.apply_json(c["messages"].dump(), options), c["expected"].get<std::string>());
      ++rendered;
    } else {
      try {
        const std::string text = chat.apply_json(c["messages"].dump(), options);
        ADD_FAILURE() << "rendered where transformers raised: " << text;
      } catch (const std::runtime_error& e) {
        if (c["error_type"] == "TemplateError") {
          EXPECT_NE(std::string(e.what()).find(c["error"].get<std::string>()), std::string::npos)
              << e.what();
          EXPECT_NE(std::string(e.what()).find(" line "), std::string::npos) << e.what();
        }
      } catch (const std::invalid_argument& e) {  // transformers' own ValueError, word for word
        EXPECT_TRUE(c.contains("continue_final_message")) << e.what();
        EXPECT_EQ(c["error_type"], "ValueError");
        EXPECT_EQ(std::string(e.what()), c["error"].get<std::string>());
      }
      ++errors;
    }
  }
  EXPECT_GE(rendered, 150u);
  EXPECT_GE(errors, 10u);
}

// continue_final_message's own refusals, as transformers words them.
TEST(ChatTemplate, ContinueFinalMessageRefusals) {
  const ChatTemplate chat(
      "{% for m in messages %}<{{ m.role }}>{{ m.content }}</{{ m.role }}>{% endfor %}");
  const std::vector<attn::text::ChatMessage> reply = {{"user", "Hi"}, {"assistant", "Hel"}};
  EXPECT_EQ(
      chat.apply(reply, {.add_generation_prompt = false, .continue_final_message = "content"}),
      "<user>Hi</user><assistant>Hel");
  EXPECT_THROW(
      chat.apply(reply, {.add_generation_prompt = true, .continue_final_message = "content"}),
      std::invalid_argument);  // not with a generation prompt
  EXPECT_THROW(
      chat.apply(reply, {.add_generation_prompt = false, .continue_final_message = "name"}),
      std::invalid_argument);  // the message has no such field
  const ChatTemplate drops("{% for m in messages %}{{ m.role }};{% endfor %}");
  EXPECT_THROW(
      drops.apply(reply, {.add_generation_prompt = false, .continue_final_message = "content"}),
      std::invalid_argument);  // the template never reads content
  const ChatTemplate cuts("{% for m in messages %}{{ m.content[:2] }}|{% endfor %}content");
  EXPECT_THROW(
      cuts.apply(reply, {.add_generation_prompt = false, .continue_final_message = "content"}),
      std::invalid_argument);  // the rendered text lost the message
}

// The language: each small template renders as jinja2 renders it, or fails
// where it fails (a syntax error at construction, the others when rendering).
TEST(Jinja, SnippetsMatchJinja2) {
  const Json& snippets = expected()["snippets"];
  ASSERT_GE(snippets.size(), 30u);
  for (const Json& s : snippets) {
    const std::string source = s["template"];
    SCOPED_TRACE(source);
    Json vars = s["variables"];
    // Through ChatTemplate's conversion of JSON values; `messages` is required there, so
    // render the template directly from the same JSON.
    attn::text::jinja::Value::Items items;
    std::function<attn::text::jinja::Value(const Json&)> conv = [&](const Json& j) {
      using attn::text::jinja::Value;
      if (j.is_null()) return Value::none();
      if (j.is_boolean()) return Value(j.get<bool>());
      if (j.is_number_integer()) return Value(j.get<int64_t>());
      if (j.is_number_float()) return Value(j.get<double>());
      if (j.is_string()) return Value(j.get<std::string>());
      if (j.is_array()) {
        std::vector<Value> v;
        for (const Json& x : j) v.push_back(conv(x));
        return Value::list(std::move(v));
      }
      Value::Items d;
      for (const auto& [k, x] : j.items()) d.emplace_back(Value(k), conv(x));
      return Value::dict(std::move(d));
    };
    for (const auto& [k, x] : vars.items())
      items.emplace_back(attn::text::jinja::Value(k), conv(x));
    const attn::text::jinja::Value variables = attn::text::jinja::Value::dict(std::move(items));
    if (s.contains("expected")) {
      const attn::text::jinja::Template t(source, "snippet");
      EXPECT_EQ(t.render(variables), s["expected"].get<std::string>());
    } else if (s["error_type"] == "TemplateSyntaxError") {
      EXPECT_THROW(attn::text::jinja::Template(source, "snippet"), std::invalid_argument);
    } else {
      const attn::text::jinja::Template t(source, "snippet");
      try {
        t.render(variables);
        ADD_FAILURE() << "rendered where jinja2 raised " << s["error"];
      } catch (const std::runtime_error& e) {
        EXPECT_EQ(std::string(e.what()).rfind("snippet line ", 0), 0u) << e.what();
      }
    }
  }
}

TEST(Jinja, ErrorsNameTheLine) {
  try {
    parse("line 1\n{% if x %}\nline 3\n{% endfor %}");
    FAIL() << "no syntax error";
  } catch (const std::invalid_argument& e) {
    EXPECT_EQ(std::string(e.what()).rfind("t line 4: ", 0), 0u) << e.what();
  }
  const attn::text::jinja::Template t("a\nb\n{{ x.y }}", "t");
  try {
    t.render(attn::text::jinja::Value::dict({}));
    FAIL() << "no error";
  } catch (const std::runtime_error& e) {
    EXPECT_EQ(std::string(e.what()), "t line 3: 'x' is undefined");
  }
  EXPECT_THROW(parse("{% include 'x' %}"), std::invalid_argument);
  EXPECT_THROW(parse("{{ x|nosuchfilter }}"), std::invalid_argument);
  EXPECT_THROW(parse("{{ 'a' \xff }}"), std::invalid_argument);
  EXPECT_THROW(attn::text::jinja::Template("{% for x in y recursive %}{% endfor %}"),
               std::invalid_argument);
}

// Hostile templates end in an error, not a crash or a hang.
TEST(Jinja, HostileTemplatesAreBounded) {
  const auto empty = attn::text::jinja::Value::dict({});
  std::string deep;
  for (int i = 0; i < 5000; ++i) deep += "(";
  EXPECT_THROW(parse("{{ " + deep + " }}"), std::invalid_argument);
  std::string nested;
  for (int i = 0; i < 5000; ++i) nested += "{% if true %}";
  EXPECT_THROW(parse(nested), std::invalid_argument);
  EXPECT_THROW(
      attn::text::jinja::Template("{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}").render(empty),
      std::runtime_error);
  EXPECT_THROW(
      attn::text::jinja::Template(
          "{% set ns = namespace(s='x') %}{% for i in range(100) %}{% set ns.s = ns.s ~ ns.s %}"
          "{% endfor %}")
          .render(empty),
      std::runtime_error);
  EXPECT_THROW(
      attn::text::jinja::Template("{% for i in range(100000) %}{% for j in range(100000) %}"
                                  "{% endfor %}{% endfor %}")
          .render(empty),
      std::runtime_error);
  EXPECT_THROW(attn::text::jinja::Template("{{ 9223372036854775807 + 1 }}").render(empty),
               std::runtime_error);
  EXPECT_THROW(attn::text::jinja::Template("{{ 'x' * 10000000000 }}").render(empty),
               std::runtime_error);
  EXPECT_THROW(
      attn::text::jinja::Template("{% set ns = namespace() %}{% set ns.a = ns %}{{ ns|tojson }}")
          .render(empty),
      std::runtime_error);
  // No namespace inside a namespace (so no chains or cycles of them), no value nested past 200.
  for (const char* deep_value :
       {"{% set ns = namespace() %}{% set t = namespace() %}{% set ns.t = t %}",
        "{% set ns = namespace() %}{% set ns.me = [ns] %}",
        "{% set ns = namespace(x=[]) %}{% for i in range(1000) %}{% set ns.x = [ns.x] %}{% endfor "
        "%}",
        "{% set ns = namespace(x=[]) %}{% set t = namespace(ns=ns) %}"}) {
    EXPECT_THROW(attn::text::jinja::Template(deep_value).render(empty), std::runtime_error)
        << deep_value;
  }
  for (const char* cut :
       {"{{", "{%", "{#", "{{ 'a", "{% if x", "{{ (", "{% raw %}x", "{{ x[1:", "{{ 0x"}) {
    EXPECT_THROW(parse(cut), std::invalid_argument) << cut;
  }
}

// Llama 3.2 without date_string: today's date through strftime_now, as transformers does.
TEST(ChatTemplate, Llama32DateFromTheClock) {
  const ChatTemplate chat(template_source("meta-llama-Llama-3.2-3B-Instruct.jinja"),
                          {{"bos_token", "<|begin_of_text|>"}});
  const std::string text = chat.apply({{"user", "hi"}});
  char day[64];
  const std::time_t now = std::time(nullptr);
  std::tm local{};
  localtime_r(&now, &local);
  std::strftime(day, sizeof day, "%d %b %Y", &local);
  EXPECT_NE(text.find(std::string("Today Date: ") + day + "\n"), std::string::npos) << text;
}

TEST(ChatTemplate, ApplyAndOptions) {
  const ChatTemplate chat(template_source("Qwen-Qwen3-0.6B.jinja"), {{"eos_token", "<|im_end|>"}},
                          "qwen3");
  EXPECT_EQ(chat.apply({{"user", "hi"}}),
            "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n");
  EXPECT_EQ(chat.apply({{"user", "hi"}}, {.add_generation_prompt = true,
                                          .kwargs_json = R"({"enable_thinking": false})"}),
            "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n");
  EXPECT_EQ(chat.apply({{"user", "hi"}}, {.add_generation_prompt = false, .kwargs_json = ""}),
            "<|im_start|>user\nhi<|im_end|>\n");
  EXPECT_EQ(chat.special_token("eos_token"), "<|im_end|>");
  EXPECT_EQ(chat.special_token("bos_token"), std::nullopt);
  EXPECT_THROW(chat.apply({}), std::invalid_argument);
  EXPECT_THROW(chat.apply({{"user", "\xff"}}), std::invalid_argument);
  EXPECT_THROW(chat.apply({{"user", "hi"}}, {.add_generation_prompt = true, .kwargs_json = "[1]"}),
               std::invalid_argument);
  EXPECT_THROW(chat.apply({{"user", "hi"}}, {.add_generation_prompt = true, .kwargs_json = "{"}),
               std::invalid_argument);
  EXPECT_THROW(chat.apply({{"user", "hi"}},
                          {.add_generation_prompt = true, .kwargs_json = R"({"messages": []})"}),
               std::invalid_argument);
  EXPECT_THROW(chat.apply_json(R"({"role": "user"})"), std::invalid_argument);
  EXPECT_THROW(ChatTemplate("{% if %}"), std::invalid_argument);
}

namespace fs = std::filesystem;

void write(const fs::path& p, const std::string& text) {
  std::ofstream out(p, std::ios::binary);
  out << text;
}

// Where a directory keeps its template, in transformers' order of preference.
TEST(ChatTemplate, FromModelDir) {
  // The fixtures' Qwen3 directory: tokenizer_config.json with the template and specials.
  const auto qwen = ChatTemplate::from_model_dir(kFixtures + "/open_models/qwen3");
  ASSERT_TRUE(qwen.has_value());
  EXPECT_EQ(qwen->special_token("eos_token"), "<|im_end|>");
  EXPECT_EQ(qwen->source(), template_source("Qwen-Qwen3-0.6B.jinja"));
  // A directory without any template.
  EXPECT_FALSE(ChatTemplate::from_model_dir(kFixtures + "/open_models/gemma3").has_value());
  EXPECT_THROW(ChatTemplate::from_model_dir(kFixtures + "/no_such_dir"), std::invalid_argument);

  const fs::path dir = attn::test::temp_path("chat_dir");
  fs::create_directories(dir);
  write(dir / "tokenizer_config.json",
        R"({"bos_token": {"content": "<B>"}, "eos_token": "<E>", "boi_token": "<I>",
            "chat_template": [{"name": "default", "template": "D{{ bos_token }}{{ boi_token }}"},
                              {"name": "tool_use", "template": "T{{ tools|length }}"}]})");
  auto t = ChatTemplate::from_model_dir(dir.string());
  ASSERT_TRUE(t.has_value());
  EXPECT_EQ(t->apply({{"user", "x"}}), "D<B><I>");
  EXPECT_EQ(t->apply({{"user", "x"}},
                     {.add_generation_prompt = true, .kwargs_json = R"({"tools": [{}, {}]})"}),
            "T2");
  EXPECT_EQ(t->apply({{"user", "x"}},
                     {.add_generation_prompt = true, .kwargs_json = R"({"bos_token": "<b2>"})"}),
            "D<b2><I>");
  write(dir / "chat_template.jinja", "J{{ eos_token }}\n");  // the .jinja file comes first
  EXPECT_EQ(ChatTemplate::from_model_dir(dir.string())->apply({{"user", "x"}}), "J<E>");
  fs::remove(dir / "chat_template.jinja");
  write(dir / "tokenizer_config.json", R"({"chat_template": [{"name": "rag", "template": "R"}]})");
  EXPECT_THROW(ChatTemplate::from_model_dir(dir.string()), std::invalid_argument);
  write(dir / "tokenizer_config.json", R"({"eos_token": "<E>"})");
  EXPECT_FALSE(ChatTemplate::from_model_dir(dir.string()).has_value());
  write(dir / "chat_template.json", R"({"chat_template": "P{{ messages[0].content }}"})");
  EXPECT_EQ(ChatTemplate::from_model_dir(dir.string())->apply({{"user", "x"}}), "Px");
  write(dir / "tokenizer_config.json", "{not json");
  EXPECT_THROW(ChatTemplate::from_model_dir(dir.string()), std::invalid_argument);
  write(dir / "tokenizer_config.json", R"({"chat_template": "{% for %}"})");
  EXPECT_THROW(ChatTemplate::from_model_dir(dir.string()), std::invalid_argument);
  fs::remove_all(dir);
}

// The rendered prompt tokenized without the post-processor gives transformers'
// apply_chat_template(tokenize=True) ids for the fixtures' directories.
TEST(ChatTemplate, PromptIdsMatchTransformers) {
  for (const Json& m : expected()["model_dirs"]) {
    const std::string dir = kFixtures + "/" + m["dir"].get<std::string>();
    SCOPED_TRACE(dir + " " + m["kwargs"].dump());
    const auto chat = ChatTemplate::from_model_dir(dir);
    ASSERT_TRUE(chat.has_value());
    std::vector<ChatMessage> messages;
    if (!m["system"].is_null()) messages.push_back({"system", m["system"]});
    messages.push_back({"user", m["prompt"]});
    const std::string text =
        chat->apply(messages, {.add_generation_prompt = true, .kwargs_json = m["kwargs"].dump()});
    EXPECT_EQ(text, m["text"].get<std::string>());
    const auto tok = attn::text::HfTokenizer::from_file(dir + "/tokenizer.json");
    EXPECT_EQ(tok.encode(text, false), m["ids"].get<std::vector<int64_t>>());
    EXPECT_EQ(tok.token_to_id(*chat->special_token("eos_token")), m["eos_id"].get<int64_t>());
  }
}

}  // namespace
