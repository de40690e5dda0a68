// picture_file.h - where a picture goes: its format from the file name, and the
// file written atomically (attn_plot; used by `attn plot` and write_loss_curve).
#pragma once

#include <string>

namespace attn::plot {

enum class PictureFormat { kSvg, kPng };

// The format named by path's extension: ".svg" or ".png" (any case). Throws
// std::invalid_argument naming the path and the extension otherwise.
PictureFormat picture_format(const std::string& path);

// Writes bytes to path atomically: a temporary file beside it (".NAME.tmp.PID"),
// fsync, rename. On failure the temporary file is removed, nothing is left at
// path, and std::runtime_error says "cannot write 'PATH': REASON".
void write_picture_atomically(const std::string& path, const std::string& bytes);

}  // namespace attn::plot
