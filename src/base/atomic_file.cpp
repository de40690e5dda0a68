// Atomic file writes (attn/atomic_file.h): temporary file, fsync, rename,
// fsync of the folder.
#include "attn/atomic_file.h"
#include "attn/utf8.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <stdexcept>

namespace attn::io {
namespace {

std::runtime_error cannot_write(const std::string& path, int err) {
  return std::runtime_error(fmt::format("cannot write '{}': {}", printable(path), std::strerror(err)));
}

}  // namespace

void write_file_atomically(const std::string& path, const std::function<void(const ByteSink&)>& produce) {
  const std::filesystem::path target(path);
  const std::filesystem::path folder = target.parent_path().empty() ? "." : target.parent_path();
  static std::atomic<int> counter{0};
  const std::filesystem::path tmp =
      folder / fmt::format(".{}.tmp.{}.{}", target.filename().string(), ::getpid(), counter++);
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) throw cannot_write(path, errno);
  bool fd_open = true;
  try {
    produce([&](const void* data, size_t n) {
      const auto* p = static_cast<const char*>(data);
      while (n > 0) {
        const ssize_t put = ::write(fd, p, n);
        if (put < 0 && errno == EINTR) continue;
        if (put < 0) throw cannot_write(path, errno);
        p += put;
        n -= static_cast<size_t>(put);
      }
    });
    if (::fsync(fd) != 0) throw cannot_write(path, errno);
    fd_open = false;  // close() releases the descriptor even when it reports an error
    if (::close(fd) != 0) throw cannot_write(path, errno);
    if (::rename(tmp.c_str(), target.c_str()) != 0) throw cannot_write(path, errno);
  } catch (...) {
    if (fd_open) ::close(fd);
    ::unlink(tmp.c_str());
    throw;
  }
  // The rename itself is durable once the folder is synced.
  const int dir = ::open(folder.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir < 0 || ::fsync(dir) != 0) {
    const int err = errno;
    if (dir >= 0) ::close(dir);
    throw std::runtime_error(fmt::format("wrote '{}' but cannot fsync its folder '{}': {}", printable(path), printable(folder.string()),
                                         std::strerror(err)));
  }
  ::close(dir);
}

void write_file_atomically(const std::string& path, std::string_view bytes) {
  write_file_atomically(path, [&](const ByteSink& sink) { sink(bytes.data(), bytes.size()); });
}

}  // namespace attn::io
