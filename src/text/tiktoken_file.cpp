// Llama 3's original/tokenizer.model, tiktoken's rank file, as the
// tokenizer.json transformers' TikTokenConverter makes of it
// (attn/hf_tokenizer.h: HfTokenizer::tiktoken_to_json).
#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <string_view>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "attn/hf_tokenizer.h"
#include "attn/utf8.h"

namespace attn::text {
namespace {

// Llama 3's pre-tokenizer pattern (Meta's tokenizer.py, the Split regex of the Hub's
// tokenizer.json).
constexpr const char* kLlama3Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// Meta's special tokens (llama-models, Llama 3.1 and later): 11 named, then
// reserved ones up to 256, numbered from the rank file's size.
std::vector<std::string> llama3_special_tokens() {
  std::vector<std::string> s = {"<|begin_of_text|>",
                                "<|end_of_text|>",
                                "<|reserved_special_token_0|>",
                                "<|reserved_special_token_1|>",
                                "<|finetune_right_pad_id|>",
                                "<|step_id|>",
                                "<|start_header_id|>",
                                "<|end_header_id|>",
                                "<|eom_id|>",
                                "<|eot_id|>",
                                "<|python_tag|>"};
  for (int i = 2; s.size() < 256; ++i) s.push_back(fmt::format("<|reserved_special_token_{}|>", i));
  return s;
}

int base64_value(char c) {
  if (c >= 'A' && c <= 'Z') return c - 'A';
  if (c >= 'a' && c <= 'z') return c - 'a' + 26;
  if (c >= '0' && c <= '9') return c - '0' + 52;
  if (c == '+') return 62;
  if (c == '/') return 63;
  return -1;
}

// Standard base64 with padding; nullopt-like empty flag for malformed input.
bool decode_base64(std::string_view in, std::string& out) {
  out.clear();
  if (in.empty() || in.size() % 4 != 0) return false;
  for (size_t i = 0; i < in.size(); i += 4) {
    int v[4];
    int pad = 0;
    for (int k = 0; k < 4; ++k) {
      const char c = in[i + static_cast<size_t>(k)];
      if (c == '=' && i + 4 == in.size() && k >= 2) {
        v[k] = 0;
        ++pad;
      } else {
        if (pad > 0) return false;
        v[k] = base64_value(c);
        if (v[k] < 0) return false;
      }
    }
    const uint32_t n = (static_cast<uint32_t>(v[0]) << 18) | (static_cast<uint32_t>(v[1]) << 12) |
                       (static_cast<uint32_t>(v[2]) << 6) | static_cast<uint32_t>(v[3]);
    out.push_back(static_cast<char>((n >> 16) & 0xFF));
    if (pad < 2) out.push_back(static_cast<char>((n >> 8) & 0xFF));
    if (pad < 1) out.push_back(static_cast<char>(n & 0xFF));
  }
  return true;
}

// GPT-2's bytes_to_unicode: each byte as the character byte-level BPE spells it with.
const std::vector<std::string>& byte_to_unicode() {
  static const std::vector<std::string> table = [] {
    std::vector<std::string> t(256);
    int n = 0;
    for (int b = 0; b < 256; ++b) {
      const bool printable =
          (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      t[static_cast<size_t>(b)] =
          encode_utf8(printable ? static_cast<char32_t>(b) : static_cast<char32_t>(256 + n++));
    }
    return t;
  }();
  return table;
}

std::string spelled(const std::string& bytes) {
  std::string s;
  for (const unsigned char b : bytes) s += byte_to_unicode()[b];
  return s;
}

}  // namespace

std::string HfTokenizer::tiktoken_to_json(std::string_view text, const std::string& name) {
  auto where = [&](size_t line) {
    return fmt::format("tokenizer '{}', line {}", printable(name), line);
  };
  // The ranks, in the file's order.
  std::unordered_map<std::string, int64_t> rank_of;
  std::vector<std::string> by_rank;
  size_t line_no = 0;
  for (size_t at = 0; at < text.size();) {
    size_t eol = text.find('\n', at);
    if (eol == std::string_view::npos) eol = text.size();
    std::string_view line = text.substr(at, eol - at);
    at = eol + 1;
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty()) continue;
    const size_t space = line.find(' ');
    std::string token;
    int64_t rank = -1;
    if (space != std::string_view::npos && decode_base64(line.substr(0, space), token)) {
      const std::string_view num = line.substr(space + 1);
      if (!num.empty() && num.size() <= 9 &&
          std::all_of(num.begin(), num.end(), [](char c) { return c >= '0' && c <= '9'; }))
        rank = std::stoll(std::string(num));
    }
    if (rank < 0 || token.empty())
      throw std::invalid_argument(fmt::format("{}: expected \"base64 rank\", got '{}'",
                                              where(line_no), printable(line, 80)));
    if (rank != static_cast<int64_t>(by_rank.size()))
      throw std::invalid_argument(
          fmt::format("{}: rank {} where {} comes next (ranks run 0, 1, 2, ...)", where(line_no),
                      rank, by_rank.size()));
    if (!rank_of.emplace(token, rank).second)
      throw std::invalid_argument(fmt::format("{}: a token ranked twice", where(line_no)));
    by_rank.push_back(std::move(token));
  }
  if (by_rank.empty())
    throw std::invalid_argument(fmt::format("tokenizer '{}': no ranks", printable(name)));
  for (int b = 0; b < 256; ++b) {  // every byte must be a token, or some text has no ids
    if (!rank_of.count(std::string(1, static_cast<char>(b))))
      throw std::invalid_argument(
          fmt::format("tokenizer '{}': byte 0x{:02X} has no rank (a tiktoken file ranks all 256)",
                      printable(name), b));
  }

  // Merges as TikTokenConverter extracts them: for each token, every split
  // into two ranked halves, ordered by the halves' ranks; all of them by the
  // token's rank.
  std::vector<std::tuple<int64_t, int64_t, int64_t>> merges;  // (rank of token, left, right)
  for (int64_t r = 0; r < static_cast<int64_t>(by_rank.size()); ++r) {
    const std::string& t = by_rank[static_cast<size_t>(r)];
    std::vector<std::pair<int64_t, int64_t>> local;
    for (size_t k = 1; k < t.size(); ++k) {
      const auto l = rank_of.find(t.substr(0, k)), rr = rank_of.find(t.substr(k));
      if (l != rank_of.end() && rr != rank_of.end()) local.emplace_back(l->second, rr->second);
    }
    std::sort(local.begin(), local.end());
    for (const auto& [l, rr] : local) merges.emplace_back(r, l, rr);
  }
  std::stable_sort(merges.begin(), merges.end(),
                   [](const auto& a, const auto& b) { return std::get<0>(a) < std::get<0>(b); });

  using Json = nlohmann::ordered_json;
  Json vocab = Json::object();
  for (size_t r = 0; r < by_rank.size(); ++r) vocab[spelled(by_rank[r])] = r;
  Json merge_list = Json::array();
  for (const auto& [r, l, rr] : merges)
    merge_list.push_back(Json::array(
        {spelled(by_rank[static_cast<size_t>(l)]), spelled(by_rank[static_cast<size_t>(rr)])}));
  const std::vector<std::string> specials = llama3_special_tokens();
  const int64_t first = static_cast<int64_t>(by_rank.size());
  Json added = Json::array();
  for (size_t i = 0; i < specials.size(); ++i) {
    added.push_back(Json{{"id", first + static_cast<int64_t>(i)},
                         {"content", specials[i]},
                         {"single_word", false},
                         {"lstrip", false},
                         {"rstrip", false},
                         {"normalized", false},
                         {"special", true}});
  }
  Json j;
  j["version"] = "1.0";
  j["truncation"] = nullptr;
  j["padding"] = nullptr;
  j["added_tokens"] = added;
  j["normalizer"] = nullptr;
  j["pre_tokenizer"] =
      Json{{"type", "Sequence"},
           {"pretokenizers", Json::array({Json{{"type", "Split"},
                                               {"pattern", {{"Regex", kLlama3Pattern}}},
                                               {"behavior", "Isolated"},
                                               {"invert", false}},
                                          Json{{"type", "ByteLevel"},
                                               {"add_prefix_space", false},
                                               {"trim_offsets", true},
                                               {"use_regex", false}}})}};
  const std::string& bos = specials[0];
  j["post_processor"] =
      Json{{"type", "TemplateProcessing"},
           {"single", Json::array({Json{{"SpecialToken", {{"id", bos}, {"type_id", 0}}}},
                                   Json{{"Sequence", {{"id", "A"}, {"type_id", 0}}}}})},
           {"pair", Json::array({Json{{"SpecialToken", {{"id", bos}, {"type_id", 0}}}},
                                 Json{{"Sequence", {{"id", "A"}, {"type_id", 0}}}},
                                 Json{{"SpecialToken", {{"id", bos}, {"type_id", 1}}}},
                                 Json{{"Sequence", {{"id", "B"}, {"type_id", 1}}}}})},
           {"special_tokens",
            {{bos, {{"id", bos}, {"ids", Json::array({first})}, {"tokens", Json::array({bos})}}}}}};
  j["decoder"] = Json{{"type", "ByteLevel"},
                      {"add_prefix_space", true},
                      {"trim_offsets", true},
                      {"use_regex", true}};
  j["model"] = Json{{"type", "BPE"},
                    {"dropout", nullptr},
                    {"unk_token", nullptr},
                    {"continuing_subword_prefix", nullptr},
                    {"end_of_word_suffix", nullptr},
                    {"fuse_unk", false},
                    {"byte_fallback", false},
                    {"ignore_merges", true},
                    {"vocab", vocab},
                    {"merges", merge_list}};
  return j.dump();
}

}  // namespace attn::text
