// walkthrough_sections.h - what the chapters of `attn walkthrough` share: the
// section a chapter's table names (--section takes its name, the text prints its
// title and intro), the lookups on such a table, and the notebook prints of
// chapters 4 and 5 (Printed) with their text and JSON forms.
//
// Each chapter (walkthrough_ch3.h, walkthrough_ch4.h, walkthrough_ch5.h) keeps
// its own table of entries, each with an `.info` WalkthroughSection and what
// runs it; walkthrough.h, the command, dispatches to the chapters. Nothing here
// knows a chapter.
#pragma once

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <functional>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <vector>

#include "attn/utf8.h"

namespace attn::cli {

struct WalkthroughSection {
  std::string name;   // what --section takes, e.g. "causal"
  std::string title;  // one line for the header
  std::string intro;  // one line: the idea of the step
};

// What each chapter's file needs of its section table (entries with an `.info`
// WalkthroughSection, in the notebook's order): the names joined by ", ", the
// infos alone, and the entry called `name` (std::invalid_argument otherwise:
// "unknown section 'NAME'<which> (known: ...)", e.g. which = " for chapter 4").
template <class Entry>
std::string section_names(const std::vector<Entry>& table) {
  std::vector<std::string> names;
  for (const auto& e : table) names.push_back(e.info.name);
  return fmt::format("{}", fmt::join(names, ", "));
}
template <class Entry>
std::vector<WalkthroughSection> section_infos(const std::vector<Entry>& table) {
  std::vector<WalkthroughSection> infos;
  for (const auto& e : table) infos.push_back(e.info);
  return infos;
}
template <class Entry>
const Entry& find_section_entry(const std::vector<Entry>& table, const std::string& name,
                                const char* which) {
  for (const auto& e : table) {
    if (e.info.name == name) return e;
  }
  throw std::invalid_argument(fmt::format("unknown section '{}'{} (known: {})", printable(name),
                                          which, section_names(table)));
}

// One print() of a notebook (chapters 4 and 5).
struct Printed {
  std::string section;
  std::string name;         // the notebook's expression, e.g. "model.tok_emb.weight.shape"
  std::string explanation;  // "<what it is>: <the notebook's code>"
  std::string text;         // what print() writes, without its final newline
  nlohmann::json value;     // a tensor's {"shape", "values"}, a list, a number or a string
};

// Receives one line of progress (the GPT-124M parts take seconds).
using ProgressFn = std::function<void(const std::string&)>;

// The prints as text: `header`, then each section's title and intro (from
// `sections`, by name) before its first print, and each print under its "# "
// explanation. std::logic_error for a print whose section is not in `sections`.
std::string printed_to_text(const std::string& header, const std::vector<Printed>& printed,
                            const std::vector<WalkthroughSection>& sections);

// The prints as JSON: an array, one object per print and line (section, name,
// explanation, text, value); bytes of decoded text that are not UTF-8 become U+FFFD.
std::string printed_to_json(const std::vector<Printed>& printed);

}  // namespace attn::cli
