// text_stream.cpp - TextStream (text_stream.h).
#include "text_stream.h"

#include <algorithm>

namespace attn::serve {
namespace {

// Bytes at the end of s that begin a UTF-8 character without finishing it.
size_t incomplete_tail(const std::string& s) {
  const size_t n = s.size();
  for (size_t back = 1; back <= std::min<size_t>(3, n); ++back) {
    const auto b = static_cast<unsigned char>(s[n - back]);
    if ((b & 0xC0) == 0x80) continue;  // a continuation byte: look further back
    const size_t len = b >= 0xF0 ? 4 : b >= 0xE0 ? 3 : b >= 0xC0 ? 2 : 1;
    return len > back ? back : 0;
  }
  return 0;
}

constexpr const char* kReplacement = "\xEF\xBF\xBD";  // U+FFFD

}  // namespace

TextStream::TextStream(Decode decode, std::vector<std::string> stop)
    : decode_(std::move(decode)), stop_(std::move(stop)) {}

std::string TextStream::push(int64_t id) {
  if (stopped_) return "";
  ids_.push_back(id);
  const std::string all = decode_(ids_);
  // A decoder may rewrite what it gave before (cleanup of spaces): wait until it grows past it.
  if (all.size() < sent_.size() || all.compare(0, sent_.size(), sent_) != 0) return "";
  // A stop string, searched where it could newly end.
  size_t longest = 0;
  for (const std::string& s : stop_) longest = std::max(longest, s.size());
  const size_t from = sent_.size() >= longest ? sent_.size() - longest + 1 : 0;
  size_t cut = std::string::npos;
  for (const std::string& s : stop_) cut = std::min(cut, all.find(s, from));
  if (cut != std::string::npos) {
    stopped_ = true;
    std::string out = cut > sent_.size() ? all.substr(sent_.size(), cut - sent_.size()) : "";
    sent_ += out;
    return out;
  }
  size_t ready = all.size();
  if (all.size() >= 3 && all.compare(all.size() - 3, 3, kReplacement) == 0) return "";
  ready -= incomplete_tail(all);
  // Hold back an end that begins a stop string.
  size_t hold = 0;
  for (const std::string& s : stop_) {
    for (size_t k = std::min(s.size() - 1, ready); k > hold; --k) {
      if (all.compare(ready - k, k, s, 0, k) == 0) {
        hold = k;
        break;
      }
    }
  }
  ready -= hold;
  if (ready <= sent_.size()) return "";
  std::string out = all.substr(sent_.size(), ready - sent_.size());
  sent_ += out;
  return out;
}

std::string TextStream::flush() {
  if (stopped_ || ids_.empty()) return "";
  const std::string all = decode_(ids_);
  if (all.size() <= sent_.size() || all.compare(0, sent_.size(), sent_) != 0) return "";
  std::string out = all.substr(sent_.size());
  sent_ += out;
  return out;
}

}  // namespace attn::serve
