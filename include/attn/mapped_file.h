// attn/mapped_file.h - a regular file memory-mapped read-only, whole.
//
// The readers of large files (safetensors checkpoints, token shards) map them
// instead of reading them: the kernel pages in what is touched, and a file
// larger than memory is still read by position. One class does the open,
// stat, map and unmap for all of them.
#pragma once

#include <cstddef>
#include <span>
#include <string>

namespace attn::io {

class MappedFile {
 public:
  // Maps the file at `path`. `label` is how messages name it (e.g. "token
  // shard 'data/train.bin'", already made printable): std::runtime_error
  // "LABEL: cannot open: REASON", "LABEL: cannot stat: REASON", "LABEL: not a
  // regular file" (a folder, a FIFO, a device) or "LABEL: cannot mmap N bytes:
  // REASON". An empty file maps to no bytes.
  MappedFile(const std::string& path, const std::string& label);
  // copy_on_write: mapped private and writable (MAP_PRIVATE): a page written
  // becomes this process's own copy; the file never changes. What weights read
  // in place from a checkpoint need, so that training can update them.
  MappedFile(const std::string& path, const std::string& label, bool copy_on_write);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;

  const std::byte* data() const { return data_; }
  // The bytes, writable: a copy_on_write mapping only (nullptr otherwise).
  std::byte* writable_data() const { return writable_ ? const_cast<std::byte*>(data_) : nullptr; }
  size_t size() const { return size_; }
  std::span<const std::byte> bytes() const { return {data_, size_}; }
  // Tells the kernel that reads will jump about (madvise MADV_RANDOM): no
  // read-ahead around each page touched.
  void advise_random() const;

 private:
  const std::byte* data_ = nullptr;
  size_t size_ = 0;
  bool writable_ = false;
};

}  // namespace attn::io
