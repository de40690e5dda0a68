// walkthrough_sections.cpp - the notebook prints of `attn walkthrough` as text
// and as JSON (walkthrough_sections.h).
#include "walkthrough_sections.h"

#include <fmt/format.h>

#include <algorithm>
#include <stdexcept>

namespace attn::cli {

std::string printed_to_text(const std::string& header, const std::vector<Printed>& printed,
                            const std::vector<WalkthroughSection>& sections) {
  std::string out = header;
  std::string section;
  for (const Printed& p : printed) {
    if (p.section != section) {
      section = p.section;
      const auto info =
          std::find_if(sections.begin(), sections.end(),
                       [&](const WalkthroughSection& w) { return w.name == section; });
      if (info == sections.end())
        throw std::logic_error(fmt::format("walkthrough: no section '{}'", section));
      out += fmt::format("\n== {} ==\n   {}\n", info->title, info->intro);
    }
    out += fmt::format("\n# {}\n{}\n", p.explanation, p.text);
  }
  return out;
}

std::string printed_to_json(const std::vector<Printed>& printed) {
  std::string out = "[";
  for (size_t i = 0; i < printed.size(); ++i) {
    const Printed& p = printed[i];
    const nlohmann::json j = {{"section", p.section},
                              {"name", p.name},
                              {"explanation", p.explanation},
                              {"text", p.text},
                              {"value", p.value}};
    // Decoded text need not be valid UTF-8: invalid bytes become U+FFFD, as
    // Python's errors="replace" makes them.
    out +=
        (i == 0 ? "\n" : ",\n") + j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  }
  out += "\n]\n";
  return out;
}

}  // namespace attn::cli
