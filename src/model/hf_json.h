// hf_json.h - what the readers of a Hugging Face model directory's JSON files
// (hf_decoder_config.cpp, hf_decoder.cpp) share: a name quoted for a message
// and the parse of a file that must hold one JSON object.
#pragma once

#include <fmt/format.h>

#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <string_view>

#include "attn/utf8.h"

namespace attn::io::hf {

// 'NAME', escaped by attn::printable. (Appended piece by piece: "'" + a
// temporary trips GCC 12's false -Wrestrict at -O3.)
inline std::string named(const std::string& s) {
  std::string out = "'";
  out += printable(s);
  out += "'";
  return out;
}

// The JSON object of `text`; std::invalid_argument naming `file` otherwise.
inline nlohmann::json parse_json_object(std::string_view text, const std::string& file) {
  try {
    nlohmann::json j = nlohmann::json::parse(text);
    if (!j.is_object())
      throw std::invalid_argument(fmt::format("{}: not a JSON object", named(file)));
    return j;
  } catch (const nlohmann::json::exception& e) {
    throw std::invalid_argument(
        fmt::format("{}: not valid JSON: {}", named(file), printable(e.what(), 4096)));
  }
}

}  // namespace attn::io::hf
