// Reading a whole input file with its kind checked and its size bounded
// (attn/read_file.h).
#include "attn/read_file.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>

#include "attn/utf8.h"
#include "base/file_kind.h"

namespace attn {
namespace {

using detail::file_kind;

// Appends what fd gives until its end; std::runtime_error naming `what` past max_bytes.
void read_all(int fd, const std::string& what, uint64_t max_bytes, std::string& out) {
  char buf[1 << 16];
  while (true) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0)
      throw std::runtime_error(fmt::format("{}: read error: {}", what, std::strerror(errno)));
    if (n == 0) return;
    if (out.size() + static_cast<uint64_t>(n) > max_bytes) {
      throw std::runtime_error(
          fmt::format("{} holds more than the limit of {} bytes", what, max_bytes));
    }
    out.append(buf, static_cast<size_t>(n));
  }
}

}  // namespace

std::string read_file(const std::string& path, uint64_t max_bytes) {
  const std::string what = fmt::format("'{}'", printable(path));
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    if (errno == ENOENT || errno == ENOTDIR) throw std::runtime_error(what + ": no such file");
    throw std::runtime_error(fmt::format("{}: cannot be read: {}", what, std::strerror(errno)));
  }
  if (!S_ISREG(st.st_mode)) {
    throw std::runtime_error(
        fmt::format("{} is {}, not a regular file", what, file_kind(st.st_mode)));
  }
  if (static_cast<uint64_t>(st.st_size) > max_bytes) {
    throw std::runtime_error(
        fmt::format("{} has {} bytes, more than the limit of {}", what, st.st_size, max_bytes));
  }
  // O_NONBLOCK: should the path have become a FIFO since stat, open does not wait.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0)
    throw std::runtime_error(fmt::format("{}: cannot be read: {}", what, std::strerror(errno)));
  struct stat again {};
  if (::fstat(fd, &again) != 0 || !S_ISREG(again.st_mode)) {
    ::close(fd);
    throw std::runtime_error(fmt::format("{}: changed while being opened", what));
  }
  std::string out;
  out.reserve(static_cast<size_t>(again.st_size));
  try {
    read_all(fd, what, max_bytes, out);
  } catch (...) {
    ::close(fd);
    throw;
  }
  ::close(fd);
  return out;
}

std::string read_stream(int fd, const std::string& name, uint64_t max_bytes) {
  std::string out;
  read_all(fd, name, max_bytes, out);
  return out;
}

}  // namespace attn
