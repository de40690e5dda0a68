// command.cpp - helpers the subcommands share.
#include "command.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <system_error>

namespace attn::cli {

void write_file_atomically(const std::string& path, const std::string& text) {
  const std::filesystem::path target(path);
  // The temporary file sits next to the target so that rename() stays on one file system.
  const std::filesystem::path tmp =
      target.parent_path() / fmt::format(".{}.tmp.{}", target.filename().string(), ::getpid());
  auto fail = [&](int err) {
    std::error_code ignored;
    std::filesystem::remove(tmp, ignored);
    return std::runtime_error(fmt::format("cannot write '{}': {}", path, std::strerror(err)));
  };
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0)
    throw std::runtime_error(fmt::format("cannot write '{}': {}", path, std::strerror(errno)));
  // Write it all, then fsync: after the rename the file is whole, even after a crash.
  for (size_t done = 0; done < text.size();) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int err = errno;
      ::close(fd);
      throw fail(err);
    }
    done += static_cast<size_t>(n);
  }
  if (::fsync(fd) != 0) {
    const int err = errno;
    ::close(fd);
    throw fail(err);
  }
  if (::close(fd) != 0) throw fail(errno);
  std::error_code ec;
  std::filesystem::rename(tmp, target, ec);
  if (ec) {
    std::error_code ignored;
    std::filesystem::remove(tmp, ignored);
    throw std::runtime_error(fmt::format("cannot write '{}': {}", path, ec.message()));
  }
}

}  // namespace attn::cli
