// attn/atomic_file.h - writing a file so that nobody ever sees half of it.
//
// Every file attn writes (checkpoints, metrics, pictures, pages, JSON) goes
// through here: the bytes go to a temporary file beside the target
// (".NAME.tmp.PID.N", so that rename() stays on one file system), which is
// fsynced, renamed over the target, and then the folder is fsynced so that the
// rename itself is durable. A reader sees the old file or the whole new one,
// and so does anyone after a crash or a SIGKILL at any moment.
#pragma once

#include <cstddef>
#include <functional>
#include <string>
#include <string_view>

namespace attn::io {

// Called by a producer once per piece of the file, in order.
using ByteSink = std::function<void(const void* data, size_t size)>;

// Writes `bytes` to path atomically. On failure the temporary file is removed,
// path is left as it was, and std::runtime_error says
// "cannot write 'PATH': REASON".
void write_file_atomically(const std::string& path, std::string_view bytes);
// The same for a file made piece by piece (a large checkpoint is not first
// assembled in memory): produce(sink) calls sink(data, size) for each piece.
// An exception thrown by produce removes the temporary file and propagates.
void write_file_atomically(const std::string& path, const std::function<void(const ByteSink&)>& produce);

}  // namespace attn::io
