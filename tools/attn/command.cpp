// command.cpp - helpers the subcommands share.
#include "command.h"

#include <fmt/format.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <system_error>

namespace attn::cli {

void write_file_atomically(const std::string& path, const std::string& text) {
  const std::filesystem::path target(path);
  // The temporary file sits next to the target so that rename() stays on one file system.
  const std::filesystem::path tmp =
      target.parent_path() / fmt::format(".{}.tmp.{}", target.filename().string(), ::getpid());
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) {
      throw std::runtime_error(fmt::format("cannot write '{}': {}", path, std::strerror(errno)));
    }
    out << text;
    out.flush();
    if (!out) {
      const int err = errno;
      out.close();
      std::error_code ignored;
      std::filesystem::remove(tmp, ignored);
      throw std::runtime_error(fmt::format("cannot write '{}': {}", path, std::strerror(err)));
    }
  }
  std::error_code ec;
  std::filesystem::rename(tmp, target, ec);
  if (ec) {
    std::error_code ignored;
    std::filesystem::remove(tmp, ignored);
    throw std::runtime_error(fmt::format("cannot write '{}': {}", path, ec.message()));
  }
}

}  // namespace attn::cli
