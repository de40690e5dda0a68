// libFuzzer target for the CLI's integer flags (tools/attn/flag_values.cpp and
// the CLI11 check flag_checks.h puts in front of every integer flag), built
// with clang -fsanitize=fuzzer,address,undefined by tests/fuzz/CMakeLists.txt.
//
// Input: a first byte choosing the flag, then its text.
//   kind 0: an attn train flag, the next byte choosing which (its range from
//           attn/train_flags.h, the table the CLI uses);
//   kind 1: an int64_t flag with any range, MIN and MAX from the next 16 bytes;
//   kind 2: a uint64_t flag of 0..2^64 - 1 (--seed);
//   kind 3: an int flag of int's whole range (-t/--threads before its own check);
//   kind 4: a comma-separated list of int64_t in 1..1048576 (bench --seqlens),
//           CLI11's list syntax (empty entries dropped, [a,b] a list too).
// The rest is the text as typed. Each text is judged twice: by
// parse_whole_number / parse_unsigned_number directly, and by a CLI11 App
// holding one option added by attn::cli::add_option and in_range, parsed
// from "--n=TEXT" as main() parses argv. A finding is
//   - a crash or a sanitizer report;
//   - a value accepted outside the range, or one std::from_chars (the
//     independent reference, base 10) does not read from the whole text as
//     the same number;
//   - a text refused although std::from_chars reads it whole as a number in
//     the range;
//   - a refusal that is not std::invalid_argument, or whose message is not
//     clean (attn::printable's promise: no control character, valid UTF-8) or
//     does not name the range and the text as typed (escaped);
//   - CLI11 storing another value than the check accepted, failing to
//     convert a text the check passed, or any other error than the check's
//     ValidationError for a text that is not empty.
#include <CLI/CLI.hpp>
#include <charconv>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
#include <type_traits>
#include <utility>
#include <vector>

#include "attn/train_flags.h"
#include "attn/utf8.h"
#include "flag_checks.h"
#include "flag_values.h"
#include "fuzz_common.h"

namespace {

using attn::fuzz::clean_message;
using attn::fuzz::finding;

// TEXT read whole by std::from_chars in base 10; "-0" is 0 for an unsigned T
// too (from_chars takes no sign there), which the CLI accepts.
template <typename T>
bool reference_value(std::string_view text, T& v) {
  if constexpr (std::is_unsigned_v<T>) {
    if (text == "-0" || (text.size() > 1 && text[0] == '-' &&
                         text.find_first_not_of('0', 1) == std::string_view::npos)) {
      v = 0;
      return true;
    }
  }
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  return ec == std::errc() && end == text.data() + text.size();
}

// A list's entries as CLI11 2.1 takes them: comma-separated, empty entries
// dropped, and an entry in [ ] itself a list.
void list_pieces(const std::string& text, std::vector<std::string>& pieces) {
  if (text.size() >= 2 && text.front() == '[' && text.back() == ']') {
    for (const std::string& p : CLI::detail::split(text.substr(1, text.size() - 2), ','))
      if (!p.empty()) list_pieces(p, pieces);
    return;
  }
  if (text.find(',') == std::string::npos) {
    pieces.push_back(text);
    return;
  }
  for (const std::string& p : CLI::detail::split(text, ','))
    if (!p.empty()) pieces.push_back(p);
}

// The message the refusal must carry: the range, and the text as typed
// through attn::printable (its first 64 bytes).
template <typename T>
void check_refusal(const std::string& message, std::string_view text, T min, T max) {
  if (!clean_message(message)) finding("a message with raw bytes");
  if (message.find(std::to_string(min) + ".." + std::to_string(max)) == std::string::npos)
    finding("a refusal that does not name the range");
  if (message.find("'" + attn::printable(text, 64) + "'") == std::string::npos)
    finding("a refusal that does not name the text as typed");
}

// parse_whole_number or parse_unsigned_number on TEXT, against the reference.
template <typename T>
void check_direct(std::string_view text, T min, T max) {
  T ref{};
  const bool in_range = reference_value(text, ref) && ref >= min && ref <= max;
  try {
    T v;
    if constexpr (std::is_signed_v<T>) {
      v = static_cast<T>(attn::cli::parse_whole_number(text, min, max));
    } else {
      v = static_cast<T>(attn::cli::parse_unsigned_number(text, min, max));
    }
    if (v < min || v > max) finding("a value accepted outside the range");
    if (!in_range || v != ref) finding("a value the reference reads differently");
  } catch (const std::invalid_argument& e) {
    if (in_range) finding("a number in the range refused");
    check_refusal(e.what(), text, min, max);
  } catch (...) {
    finding("an exception other than std::invalid_argument");
  }
}

// One option added as the CLI adds it, parsed from "--n=TEXT". VALUE is a T,
// or a std::vector<T> for a list.
template <typename Value, typename T>
void check_cli(const std::string& text, T min, T max, bool ranged, bool list) {
  CLI::App app{"fuzz"};
  Value value{};
  CLI::Option* option = attn::cli::add_option(&app, "--n", value, "a number");
  if (list) option->delimiter(',');
  if (ranged) attn::cli::in_range(option, min, max);
  std::vector<std::string> pieces;
  if (list) {
    list_pieces(text, pieces);
  } else {
    pieces.push_back(text);
  }
  std::vector<std::string> args{"--n=" + text};  // CLI11 takes them last first
  try {
    app.parse(args);
  } catch (const CLI::ValidationError& e) {
    if (!clean_message(e.what())) finding("CLI11's message with raw bytes");
    if (std::string_view(e.what()).substr(0, 5) != "--n: ")
      finding("CLI11's message does not name the flag");
    return;
  } catch (const CLI::ConversionError&) {
    finding("CLI11 could not convert a text the check passed");
  } catch (const CLI::ParseError& e) {
    // (CLI11's own: no value at all, "--n=" or an empty list.)
    if (!text.empty() && !pieces.empty())
      finding("CLI11 refused a text for another reason than the check");
    if (!clean_message(e.what())) finding("CLI11's message with raw bytes");
    return;
  }
  // Accepted: every piece of the text reads as the stored value.
  std::vector<T> stored;
  if constexpr (std::is_same_v<Value, std::vector<T>>) {
    stored = value;
  } else {
    stored = {value};
  }
  if (stored.size() != pieces.size()) finding("CLI11 stored another number of values");
  for (size_t i = 0; i < stored.size() && i < pieces.size(); ++i) {
    T ref{};
    if (!reference_value(pieces[i], ref) || ref != stored[i])
      finding("CLI11 stored another value than the text says");
    if (stored[i] < min || stored[i] > max) finding("CLI11 stored a value outside the range");
  }
}

uint64_t read_u64(const uint8_t* p) {
  uint64_t v = 0;
  std::memcpy(&v, p, sizeof v);
  return v;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const int kind = data[0] % 5;
  size_t head = 1;
  int64_t min = std::numeric_limits<int64_t>::min(), max = std::numeric_limits<int64_t>::max();
  bool ranged = false;
  if (kind == 0) {
    if (size < 2) return 0;
    const auto& ranges = attn::train::integer_flag_ranges();
    const attn::train::FlagRange& r = ranges[data[1] % ranges.size()];
    min = r.min, max = r.max, ranged = true, head = 2;
  } else if (kind == 1) {
    if (size < 17) return 0;
    min = static_cast<int64_t>(read_u64(data + 1));
    max = static_cast<int64_t>(read_u64(data + 9));
    if (min > max) std::swap(min, max);
    ranged = true, head = 17;
  }
  const std::string text(reinterpret_cast<const char*>(data) + head, size - head);
  switch (kind) {
    case 0:
    case 1:
      check_direct<int64_t>(text, min, max);
      check_cli<int64_t, int64_t>(text, min, max, ranged, false);
      break;
    case 2:
      check_direct<uint64_t>(text, 0, std::numeric_limits<uint64_t>::max());
      check_cli<uint64_t, uint64_t>(text, 0, std::numeric_limits<uint64_t>::max(), false, false);
      break;
    case 3:
      check_direct<int64_t>(text, std::numeric_limits<int>::min(), std::numeric_limits<int>::max());
      check_cli<int, int>(text, std::numeric_limits<int>::min(), std::numeric_limits<int>::max(),
                          false, false);
      break;
    default:
      check_cli<std::vector<int64_t>, int64_t>(text, 1, int64_t{1} << 20, true, true);
      break;
  }
  return 0;
}
