// attn/read_file.h - reading a whole file that attn takes as input (a config,
// a tokenizer, a text, an index): only a regular file, checked before it is
// opened (a FIFO would block for ever, /dev/zero never ends, a directory reads
// as nothing), and at most a size limit, so that no input costs unbounded time
// or memory; standard input (read_stream) under the same limit.
#pragma once

#include <cstdint>
#include <string>

namespace attn {

// The largest file read whole by default: 4 GiB.
inline constexpr uint64_t kMaxReadBytes = uint64_t{1} << 32;

// The bytes of the regular file `path`. Throws std::runtime_error, one line
// beginning "'PATH'" (escaped by attn::printable), for a missing file
// ("no such file"), a directory, a FIFO, a device or a socket (each named), a
// file over max_bytes (its size and the limit), or a read error.
std::string read_file(const std::string& path, uint64_t max_bytes = kMaxReadBytes);

// Everything the open descriptor fd gives until its end (a pipe, a terminal:
// standard input is STDIN_FILENO), at most max_bytes: beyond them
// std::runtime_error "NAME holds more than the limit of N bytes", so that an
// endless stream (`cat /dev/zero |`) stops at the limit instead of at the end
// of memory. `name` is how messages call it ("standard input").
std::string read_stream(int fd, const std::string& name, uint64_t max_bytes = kMaxReadBytes);

}  // namespace attn
