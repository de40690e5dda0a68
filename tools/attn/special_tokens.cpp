// special_tokens.cpp - tiktoken's rule for "<|endoftext|>" (special_tokens.h).
#include "special_tokens.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <vector>

#include "attn/utf8.h"

namespace attn::cli {
namespace {

[[noreturn]] void refuse(const std::string& what, size_t offset) {
  throw std::invalid_argument(
      fmt::format("{} holds \"<|endoftext|>\" at byte {}: GPT-2's special token is refused unless "
                  "--allow-special (then it is the token 50256), as tiktoken's encode refuses it",
                  what, offset));
}

}  // namespace

void refuse_special_tokens(std::string_view text, const std::string& what, bool allowed) {
  if (allowed) return;
  if (const size_t at = text.find(kEndOfText); at != std::string_view::npos) refuse(what, at);
}

void refuse_special_tokens_in_file(const std::string& path, bool allowed) {
  if (allowed) return;
  // Only a regular file: a FIFO would block here, /dev/zero never end (the
  // reader that follows refuses them by kind).
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) return;
  std::ifstream in(path, std::ios::binary);
  if (!in) return;  // the reader that follows names the error
  // Blocks of 1 MiB, each after the last 12 bytes of the one before, so that a
  // token across a block boundary is found.
  constexpr size_t kBlock = size_t{1} << 20;
  const size_t keep = kEndOfText.size() - 1;
  std::vector<char> buf(keep + kBlock);
  size_t have = 0;    // bytes in buf
  uint64_t base = 0;  // the file offset of buf[0]
  while (in) {
    in.read(buf.data() + have, static_cast<std::streamsize>(kBlock));
    const auto got = static_cast<size_t>(in.gcount());
    if (got == 0) break;
    have += got;
    const std::string_view view(buf.data(), have);
    if (const size_t at = view.find(kEndOfText); at != std::string_view::npos) {
      refuse(fmt::format("'{}'", printable(path)), static_cast<size_t>(base + at));
    }
    const size_t tail = std::min(keep, have);
    std::copy(buf.begin() + static_cast<std::ptrdiff_t>(have - tail),
              buf.begin() + static_cast<std::ptrdiff_t>(have), buf.begin());
    base += have - tail;
    have = tail;
  }
}

}  // namespace attn::cli
