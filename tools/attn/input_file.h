// input_file.h - reading a file a command takes as input (--text, --file):
// only a regular file, checked before it is opened (a FIFO would block for
// ever, /dev/zero never ends, a directory reads as nothing), and at most a
// size limit: attn::read_file (attn/read_file.h) with the flag in front of its messages.
#pragma once

#include <cstdint>
#include <string>

#include "attn/read_file.h"

namespace attn::cli {

// The largest input file read whole: 4 GiB.
inline constexpr uint64_t kMaxInputBytes = kMaxReadBytes;

// The bytes of the regular file `path`. Throws std::runtime_error, one line
// beginning "FLAG 'PATH'" (escaped), for a missing file, a directory, a FIFO,
// a device or a socket (each named), a file over max_bytes, or a read error.
std::string read_input_file(const std::string& path, const std::string& flag,
                            uint64_t max_bytes = kMaxInputBytes);

}  // namespace attn::cli
