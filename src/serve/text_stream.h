// text_stream.h - generated ids to the text a client receives, as it comes,
// with the request's stop strings: the ids decoded whole after each one and
// only the new end handed out, held back while it ends in an incomplete UTF-8
// character (or U+FFFD, a Hugging Face decoder's stand-in for one) or in the
// beginning of a stop string. A stop string found ends the text before it.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

namespace attn::serve {

class TextStream {
 public:
  using Decode = std::function<std::string(std::span<const int64_t>)>;
  TextStream(Decode decode, std::vector<std::string> stop);
  // The text ready after one more id ("" while held back). Once a stop string
  // is found, stopped() is true and the text before it is complete.
  std::string push(int64_t id);
  // What is left at the end (held-back text, a split character's bytes as they are).
  std::string flush();
  bool stopped() const { return stopped_; }
  // The whole text handed out so far.
  const std::string& text() const { return sent_; }

 private:
  Decode decode_;
  std::vector<std::string> stop_;
  std::vector<int64_t> ids_;
  std::string sent_;
  bool stopped_ = false;
};

}  // namespace attn::serve
