// A regular file memory-mapped read-only (attn/mapped_file.h).
#include "attn/mapped_file.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <utility>

#include "base/file_kind.h"

namespace attn::io {

namespace {

using detail::file_kind;

}  // namespace

MappedFile::MappedFile(const std::string& path, const std::string& label)
    : MappedFile(path, label, false) {}

MappedFile::MappedFile(const std::string& path, const std::string& label, bool copy_on_write)
    : writable_(copy_on_write) {
  // O_NONBLOCK: a FIFO opens at once (and is refused below) instead of
  // waiting for a writer for ever; it changes nothing for a regular file.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) throw std::runtime_error(fmt::format("{}: cannot open: {}", label, std::strerror(errno)));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    throw std::runtime_error(fmt::format("{}: cannot stat: {}", label, std::strerror(err)));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    throw std::runtime_error(
        fmt::format("{}: not a regular file: {}", label, file_kind(st.st_mode)));
  }
  size_ = static_cast<size_t>(st.st_size);
  if (size_ > 0) {
    void* m = copy_on_write ? ::mmap(nullptr, size_, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0)
                            : ::mmap(nullptr, size_, PROT_READ, MAP_SHARED, fd, 0);
    if (m == MAP_FAILED) {
      const int err = errno;
      ::close(fd);
      throw std::runtime_error(
          fmt::format("{}: cannot mmap {} bytes: {}", label, size_, std::strerror(err)));
    }
    data_ = static_cast<const std::byte*>(m);
  }
  ::close(fd);  // the mapping keeps the file
}

MappedFile::~MappedFile() {
  if (data_ != nullptr) ::munmap(const_cast<std::byte*>(data_), size_);
}

MappedFile::MappedFile(MappedFile&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)),
      writable_(std::exchange(other.writable_, false)) {}

MappedFile& MappedFile::operator=(MappedFile&& other) noexcept {
  if (this != &other) {
    if (data_ != nullptr) ::munmap(const_cast<std::byte*>(data_), size_);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
    writable_ = std::exchange(other.writable_, false);
  }
  return *this;
}

void MappedFile::advise_random() const {
  if (data_ != nullptr) ::madvise(const_cast<std::byte*>(data_), size_, MADV_RANDOM);
}

}  // namespace attn::io
