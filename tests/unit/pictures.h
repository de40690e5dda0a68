// tests/unit/pictures.h - reading pictures back in the picture tests: PNG pixels
// through cairo, SVG rendered by librsvg's rsvg-convert, commands run through
// the shell.
#pragma once

#include <cairo.h>
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "cli.h"
#include "plot/heatmap.h"

namespace attn::test {

// An RGB picture read from a PNG file (opaque: alpha is ignored).
struct Image {
  int width = 0, height = 0;
  std::vector<plot::Rgb> pixels;  // (height, width)
  plot::Rgb at(int x, int y) const { return pixels[static_cast<size_t>(y) * width + x]; }
};

// Reads a PNG with cairo; width 0 when the file is missing or not a PNG.
inline Image load_png(const std::string& path) {
  Image image;
  cairo_surface_t* s = cairo_image_surface_create_from_png(path.c_str());
  if (cairo_surface_status(s) == CAIRO_STATUS_SUCCESS) {
    const cairo_format_t format = cairo_image_surface_get_format(s);
    if (format == CAIRO_FORMAT_ARGB32 || format == CAIRO_FORMAT_RGB24) {
      cairo_surface_flush(s);
      image.width = cairo_image_surface_get_width(s);
      image.height = cairo_image_surface_get_height(s);
      const int stride = cairo_image_surface_get_stride(s);
      const unsigned char* data = cairo_image_surface_get_data(s);
      for (int y = 0; y < image.height; ++y) {
        const auto* row =
            reinterpret_cast<const uint32_t*>(data + static_cast<ptrdiff_t>(y) * stride);
        for (int x = 0; x < image.width; ++x) {
          const uint32_t p = row[x];  // premultiplied ARGB; our pictures are opaque
          image.pixels.push_back({static_cast<uint8_t>(p >> 16), static_cast<uint8_t>(p >> 8),
                                  static_cast<uint8_t>(p)});
        }
      }
    }
  }
  cairo_surface_destroy(s);
  return image;
}

inline int colour_distance(plot::Rgb a, plot::Rgb b) {
  return std::max({std::abs(a.r - b.r), std::abs(a.g - b.g), std::abs(a.b - b.b)});
}

inline std::string rgb_str(plot::Rgb c) {
  // (std::string("(") + ...: "(" + std::string(...) trips GCC 12's false -Wrestrict at -O3.)
  return std::string("(") + std::to_string(c.r) + ", " + std::to_string(c.g) + ", " +
         std::to_string(c.b) + ")";
}

// Runs a shell command; returns its exit status (-1 if it did not exit) and its
// stdout and stderr together in *output.
inline int run_shell(const std::string& command, std::string* output = nullptr) {
  const std::string log = temp_path("shell.log");
  const int status = std::system((command + " >'" + log + "' 2>&1").c_str());
  if (output != nullptr) *output = read_text(log);
  std::remove(log.c_str());
  return status != -1 && WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

// rsvg-convert, as the build found it (scripts/bootstrap installs librsvg2-bin).
inline std::string rsvg_convert() {
#ifdef ATTN_RSVG_CONVERT
  const std::string path = ATTN_RSVG_CONVERT;
#else
  const std::string path;
#endif
  if (path.empty() || path.find("NOTFOUND") != std::string::npos) {
    ADD_FAILURE() << "rsvg-convert was not found when the build was configured: run "
                     "./scripts/bootstrap (it installs librsvg2-bin), then cmake again";
    return "";
  }
  return path;
}

// Renders an SVG file to PNG with librsvg at its own size (1 px per px unit).
inline Image render_svg_file(const std::string& svg_path) {
  const std::string rsvg = rsvg_convert();
  if (rsvg.empty()) return {};
  const std::string png = temp_path("rendered.png");
  std::string output;
  const int rc = run_shell("'" + rsvg + "' -f png -o '" + png + "' '" + svg_path + "'", &output);
  EXPECT_EQ(rc, 0) << "rsvg-convert failed on " << svg_path << ": " << output;
  Image image = load_png(png);
  std::remove(png.c_str());
  return image;
}

// Checks every cell of a figure drawn in `image`: a pixel 4 px inside the cell's
// top-left corner (clear of the value written at its centre) has the colour the
// scale gives for the cell's value, or the masked colour. Returns the number of
// cells that are wrong (each one reported as a test failure when report is true).
inline int wrong_cells(const Image& image, const plot::Figure& figure, int tolerance,
                       const std::string& what, bool report = true) {
  const plot::Layout layout = plot::layout(figure);
  int wrong = 0;
  for (size_t p = 0; p < figure.panels.size(); ++p) {
    const plot::Panel& panel = figure.panels[p];
    for (int64_t i = 0; i < panel.rows; ++i) {
      for (int64_t j = 0; j < panel.cols; ++j) {
        const plot::Rect r = layout.cell_rect(static_cast<int64_t>(p), i, j);
        const int x = static_cast<int>(r.x) + 4, y = static_cast<int>(r.y) + 4;
        const plot::Rgb want = plot::cell_colour(figure, static_cast<int64_t>(p), i, j);
        if (x >= image.width || y >= image.height) {
          ADD_FAILURE() << what << ": cell (" << p << ", " << i << ", " << j << ") at (" << x
                        << ", " << y << ") lies outside the " << image.width << "x" << image.height
                        << " picture";
          ++wrong;
          continue;
        }
        const plot::Rgb got = image.at(x, y);
        if (colour_distance(got, want) > tolerance) {
          if (report)
            ADD_FAILURE() << what << ": cell (panel " << p << ", query " << i << ", key " << j
                          << ") at (" << x << ", " << y << ") is " << rgb_str(got)
                          << ", the scale gives " << rgb_str(want)
                          << (panel.is_masked(i, j) ? " (masked)" : "");
          ++wrong;
        }
      }
    }
  }
  return wrong;
}

}  // namespace attn::test
