// picture_file.cpp - picture formats from file names (picture_file.h).
#include "attn/utf8.h"
#include "plot/picture_file.h"

#include <fmt/format.h>

#include <cctype>
#include <filesystem>
#include <stdexcept>

namespace attn::plot {

PictureFormat picture_format(const std::string& path) {
  std::string ext = std::filesystem::path(path).extension().string();
  for (char& c : ext) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (ext == ".svg") return PictureFormat::kSvg;
  if (ext == ".png") return PictureFormat::kPng;
  throw std::invalid_argument(fmt::format(
      "'{}': unknown picture format '{}' (the name must end in .svg or .png)", printable(path), printable(ext)));
}

}  // namespace attn::plot
