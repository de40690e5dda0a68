// picture_file.cpp - picture formats from file names, atomic writes (picture_file.h).
#include "plot/picture_file.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <stdexcept>

namespace attn::plot {

PictureFormat picture_format(const std::string& path) {
  std::string ext = std::filesystem::path(path).extension().string();
  for (char& c : ext) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (ext == ".svg") return PictureFormat::kSvg;
  if (ext == ".png") return PictureFormat::kPng;
  throw std::invalid_argument(fmt::format(
      "'{}': unknown picture format '{}' (the name must end in .svg or .png)", path, ext));
}

void write_picture_atomically(const std::string& path, const std::string& bytes) {
  const std::filesystem::path target(path);
  // Beside the target, so that rename() stays on one file system.
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
  for (size_t done = 0; done < bytes.size();) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
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
  if (::rename(tmp.c_str(), target.c_str()) != 0) throw fail(errno);
}

}  // namespace attn::plot
