// libFuzzer target for the chat templates' Jinja interpreter
// (src/text/jinja.cpp), built with clang -fsanitize=fuzzer,address,undefined by
// tests/fuzz/CMakeLists.txt.
//
// Input: a template's source. It is parsed and, when it parses, rendered with
// the variables a chat template sees (messages with text and content parts, a
// tool, add_generation_prompt, bos_token, enable_thinking). Any input must end
// in one of three ways: rendered text that is valid UTF-8, a
// std::invalid_argument (a syntax error) or a std::runtime_error (an error
// while rendering), each with a message holding no control byte and no byte
// that is not valid UTF-8 (outside text reaches messages only through
// attn::printable). A crash, a sanitizer report, a hang (-timeout), another
// exception or a broken message is a finding.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <string_view>

#include "attn/utf8.h"
#include "fuzz_common.h"
#include "text/jinja.h"

namespace {

using attn::fuzz::clean_message;
using attn::fuzz::finding;
using attn::fuzz::valid_utf8;

using attn::text::jinja::Value;

Value message(const char* role, Value content) {
  return Value::dict({{Value("role"), Value(role)}, {Value("content"), std::move(content)}});
}

const Value& variables() {
  static const Value v = [] {
    const Value parts = Value::list({Value::dict({{Value("type"), Value("text")},
                                                  {Value("text"), Value(" part ")}})});
    const Value tool = Value::dict(
        {{Value("type"), Value("function")},
         {Value("function"),
          Value::dict({{Value("name"), Value("f")}, {Value("parameters"), Value::dict({})}})}});
    return Value::dict({
        {Value("messages"),
         Value::list({message("system", Value("Be brief.")), message("user", Value("Hi <|x|>")),
                      message("assistant", Value("<think>\nr\n</think>\n\nA")),
                      message("user", parts)})},
        {Value("tools"), Value::list({tool})},
        {Value("documents"), Value::none()},
        {Value("add_generation_prompt"), Value(true)},
        {Value("bos_token"), Value("<s>")},
        {Value("eos_token"), Value("</s>")},
        {Value("enable_thinking"), Value(false)},
        {Value("n"), Value(int64_t{3})},
        {Value("f"), Value(1.5)},
    });
  }();
  return v;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view source(reinterpret_cast<const char*>(data), size);
  try {
    const attn::text::jinja::Template t(source, "fuzz");
    const std::string out = t.render(variables());
    if (!valid_utf8(out)) finding("the rendered text is not valid UTF-8");
  } catch (const std::invalid_argument& e) {
    if (!clean_message(e.what())) finding("a syntax error's message holds raw bytes");
  } catch (const std::runtime_error& e) {
    if (!clean_message(e.what())) finding("a render error's message holds raw bytes");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fuzz_jinja: %s\n", e.what());
    finding("an exception other than std::invalid_argument or std::runtime_error");
  }
  return 0;
}
