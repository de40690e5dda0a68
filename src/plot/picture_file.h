// picture_file.h - a picture's format from its file name (attn_plot; used by
// `attn plot` and write_loss_curve, which write the file with
// io::write_file_atomically, attn/atomic_file.h).
#pragma once

#include <string>

namespace attn::plot {

enum class PictureFormat { kSvg, kPng };

// The format named by path's extension: ".svg" or ".png" (any case). Throws
// std::invalid_argument naming the path and the extension otherwise.
PictureFormat picture_format(const std::string& path);

}  // namespace attn::plot
