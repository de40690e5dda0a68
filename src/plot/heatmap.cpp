// heatmap.cpp - drawing attention matrices with cairo (SVG and PNG from one
// routine) and as terminal text.
#include "attn/utf8.h"
#include "plot/heatmap.h"

#include <cairo.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <stdexcept>

#include "plot/cairo_draw.h"

namespace attn::plot {
namespace {

using detail::Align;
using detail::draw_text;
using detail::Measure;
using detail::set_colour;
using detail::set_font;
using detail::text_width;

// Sizes in px.
constexpr double kMargin = 16;
constexpr double kGap = 28;        // between panels, and before the colour bar
constexpr double kCaption = 16;    // the "keys" / "queries" captions
constexpr double kTitleBand = 26;  // the figure's title
constexpr double kPanelTitleBand = 20;
constexpr double kWrittenCell = 48;  // a cell with its value written in it
constexpr double kGridSpan = 480;    // a larger matrix fills about this much
constexpr double kBarWidth = 16;
constexpr double kBarMinHeight = 150;
constexpr double kSwatch = 16;
constexpr double kTitleFont = 15, kLabelFont = 12, kValueFont = 11, kCaptionFont = 11;
constexpr Rgb kText = {32, 32, 32};
constexpr Rgb kCaptionText = {110, 110, 110};

std::string tick_text(double v) { return fmt::format("{:.2f}", v); }
std::string value_text(float v) { return fmt::format("{:.2f}", v); }

// Text centred vertically on y: the baseline sits a third of the font size below.
double baseline_for(double y_centre, double font_size) { return y_centre + font_size * 0.35; }

// What layout() measures once and draw() needs again.
struct Geometry {
  Layout layout;
  double row_label_width = 0;  // the widest row label
  bool vertical_col_labels = false;
  double col_label_band = 0;
  double tick_width = 0;
};

Geometry geometry(const Figure& f) {
  check(f);
  Measure m;
  Geometry g;
  int64_t side = 1, max_rows = 1;
  for (const Panel& p : f.panels) {
    side = std::max({side, p.rows, p.cols});
    max_rows = std::max(max_rows, p.rows);
  }
  Layout& L = g.layout;
  L.values_written = side <= kMaxWrittenSide;
  L.cell = L.values_written ? kWrittenCell
                            : std::max(4.0, std::floor(kGridSpan / static_cast<double>(side)));

  set_font(m.cr, kLabelFont);
  double max_col_label = 0;
  for (const Panel& p : f.panels) {
    for (const auto& s : p.row_labels)
      g.row_label_width = std::max(g.row_label_width, text_width(m.cr, s));
    for (const auto& s : p.col_labels) max_col_label = std::max(max_col_label, text_width(m.cr, s));
  }
  g.row_label_width = std::ceil(g.row_label_width);
  g.vertical_col_labels = max_col_label > L.cell - 4;
  g.col_label_band = g.vertical_col_labels ? std::ceil(max_col_label) + 8 : kLabelFont + 8;
  set_font(m.cr, kCaptionFont);
  g.tick_width = std::ceil(
      std::max({text_width(m.cr, tick_text(f.vmin)), text_width(m.cr, tick_text(f.vmax)),
                text_width(m.cr, tick_text((f.vmin + f.vmax) / 2)), text_width(m.cr, "masked")}));

  bool any_panel_title = false, any_masked = false;
  for (const Panel& p : f.panels) {
    any_panel_title = any_panel_title || !p.title.empty();
    for (int64_t i = 0; i < p.rows; ++i)
      for (int64_t j = 0; j < p.cols; ++j) any_masked = any_masked || p.is_masked(i, j);
  }
  const double grid_top = kMargin + (f.title.empty() ? 0 : kTitleBand) +
                          (any_panel_title ? kPanelTitleBand : 0) + kCaption + g.col_label_band;
  // Panels left to right, panels_per_row to a row (all in one row when 0); each
  // further row starts below the previous one's grids, with its own title band.
  const size_t per_row = f.panels_per_row > 0 ? static_cast<size_t>(f.panels_per_row)
                                               : f.panels.size();
  const double grid_height = static_cast<double>(max_rows) * L.cell;
  const double row_stride = grid_height + kGap + (any_panel_title ? kPanelTitleBand : 0) +
                            kCaption + g.col_label_band;
  double x = kMargin, x_max = kMargin, top = grid_top;
  for (size_t n = 0; n < f.panels.size(); ++n) {
    const Panel& p = f.panels[n];
    if (n > 0 && n % per_row == 0) {
      x = kMargin;
      top += row_stride;
    }
    x += kCaption + g.row_label_width + 8;
    L.grids.push_back(
        {x, top, static_cast<double>(p.cols) * L.cell, static_cast<double>(p.rows) * L.cell});
    x += static_cast<double>(p.cols) * L.cell + kGap;
    x_max = std::max(x_max, x);
  }
  x = x_max;
  L.colour_bar = {x, grid_top, kBarWidth, std::max(grid_height, kBarMinHeight)};
  double bottom = std::max(top + grid_height, L.colour_bar.y + L.colour_bar.h);
  if (any_masked) {
    L.masked_swatch = {x, L.colour_bar.y + L.colour_bar.h + 12, kSwatch, kSwatch};
    bottom = std::max(bottom, L.masked_swatch.y + L.masked_swatch.h);
  }
  double right = x + kBarWidth + 6 + g.tick_width;
  if (!f.title.empty()) {
    set_font(m.cr, kTitleFont, true);
    right = std::max(right, kMargin + text_width(m.cr, f.title));
  }
  L.width = static_cast<int>(std::ceil(right + kMargin));
  L.height = static_cast<int>(std::ceil(bottom + kMargin));
  return g;
}

void draw(cairo_t* cr, const Figure& f, const Geometry& g) {
  const Layout& L = g.layout;
  set_colour(cr, kBackground);
  cairo_paint(cr);

  if (!f.title.empty()) {
    set_font(cr, kTitleFont, true);
    set_colour(cr, kText);
    draw_text(cr, f.title, kMargin, kMargin + kTitleFont, Align::kLeft);
  }

  for (size_t p = 0; p < f.panels.size(); ++p) {
    const Panel& panel = f.panels[p];
    const Rect& grid = L.grids[p];
    const double label_top = grid.y - g.col_label_band;
    // Panel title and the "keys" caption above the column labels.
    if (!panel.title.empty()) {
      set_font(cr, kLabelFont, true);
      set_colour(cr, kText);
      draw_text(cr, panel.title, grid.x + grid.w / 2, label_top - kCaption - 6, Align::kCentre);
    }
    set_font(cr, kCaptionFont);
    set_colour(cr, kCaptionText);
    draw_text(cr, "keys", grid.x + grid.w / 2, label_top - 4, Align::kCentre);
    // "queries", reading upwards, left of the row labels.
    cairo_save(cr);
    cairo_translate(cr, grid.x - g.row_label_width - 8 - 4, grid.y + grid.h / 2);
    cairo_rotate(cr, -M_PI / 2);
    draw_text(cr, "queries", 0, 0, Align::kCentre);
    cairo_restore(cr);

    set_font(cr, kLabelFont);
    set_colour(cr, kText);
    for (int64_t j = 0; j < panel.cols; ++j) {
      const double cx = grid.x + (static_cast<double>(j) + 0.5) * L.cell;
      const std::string& label = panel.col_labels[static_cast<size_t>(j)];
      if (g.vertical_col_labels) {
        cairo_save(cr);
        cairo_translate(cr, baseline_for(cx, kLabelFont), grid.y - 6);
        cairo_rotate(cr, -M_PI / 2);
        draw_text(cr, label, 0, 0, Align::kLeft);
        cairo_restore(cr);
      } else {
        draw_text(cr, label, cx, grid.y - 6, Align::kCentre);
      }
    }
    for (int64_t i = 0; i < panel.rows; ++i) {
      const double cy = grid.y + (static_cast<double>(i) + 0.5) * L.cell;
      draw_text(cr, panel.row_labels[static_cast<size_t>(i)], grid.x - 8,
                baseline_for(cy, kLabelFont), Align::kRight);
    }

    // The cells, then the values on them.
    for (int64_t i = 0; i < panel.rows; ++i) {
      for (int64_t j = 0; j < panel.cols; ++j) {
        const Rect r = L.cell_rect(static_cast<int64_t>(p), i, j);
        set_colour(cr, cell_colour(f, static_cast<int64_t>(p), i, j));
        cairo_rectangle(cr, r.x, r.y, r.w, r.h);
        cairo_fill(cr);
      }
    }
    if (L.values_written) {
      set_font(cr, kValueFont);
      for (int64_t i = 0; i < panel.rows; ++i) {
        for (int64_t j = 0; j < panel.cols; ++j) {
          if (panel.is_masked(i, j)) continue;
          const Rect r = L.cell_rect(static_cast<int64_t>(p), i, j);
          const Rgb c = cell_colour(f, static_cast<int64_t>(p), i, j);
          const double luminance = (0.2126 * c.r + 0.7152 * c.g + 0.0722 * c.b) / 255.0;
          set_colour(cr, luminance > 0.45 ? Rgb{0, 0, 0} : Rgb{255, 255, 255});
          draw_text(cr, value_text(panel.values[static_cast<size_t>(i * panel.cols + j)]),
                    r.x + r.w / 2, baseline_for(r.y + r.h / 2, kValueFont), Align::kCentre);
        }
      }
    }
  }

  // The colour bar: the scale's nine samples as gradient stops (cairo interpolates
  // linearly between stops, as scale_colour does), vmax at the top.
  const Rect& bar = L.colour_bar;
  cairo_pattern_t* gradient = cairo_pattern_create_linear(0, bar.y + bar.h, 0, bar.y);
  constexpr int kStops = static_cast<int>(std::size(kScaleTable));
  for (int k = 0; k < kStops; ++k) {
    const Rgb c = kScaleTable[k];
    cairo_pattern_add_color_stop_rgb(gradient, k / double(kStops - 1), c.r / 255.0, c.g / 255.0,
                                     c.b / 255.0);
  }
  cairo_set_source(cr, gradient);
  cairo_rectangle(cr, bar.x, bar.y, bar.w, bar.h);
  cairo_fill(cr);
  cairo_pattern_destroy(gradient);
  set_font(cr, kCaptionFont);
  set_colour(cr, kText);
  cairo_set_line_width(cr, 1);
  for (int k = 0; k <= 2; ++k) {
    const double y = bar.y + bar.h - bar.h * k / 2.0;  // vmin, middle, vmax
    const double v = f.vmin + (f.vmax - f.vmin) * k / 2.0;
    cairo_move_to(cr, bar.x + bar.w, std::round(y) + 0.5);
    cairo_line_to(cr, bar.x + bar.w + 4, std::round(y) + 0.5);
    cairo_stroke(cr);
    const double text_y =
        std::clamp(baseline_for(y, kCaptionFont), bar.y + kCaptionFont, bar.y + bar.h);
    draw_text(cr, tick_text(v), bar.x + bar.w + 6, text_y, Align::kLeft);
  }
  if (L.masked_swatch.w > 0) {
    const Rect& s = L.masked_swatch;
    set_colour(cr, kMaskedColour);
    cairo_rectangle(cr, s.x, s.y, s.w, s.h);
    cairo_fill(cr);
    set_colour(cr, kText);
    draw_text(cr, "masked", s.x + s.w + 6, baseline_for(s.y + s.h / 2, kCaptionFont), Align::kLeft);
  }
}

}  // namespace

Rgb scale_colour(double t) {
  if (!(t > 0)) t = 0;  // also NaN
  if (t > 1) t = 1;
  constexpr int kLast = static_cast<int>(std::size(kScaleTable)) - 1;
  const double x = t * kLast;
  const int k = std::min(static_cast<int>(x), kLast - 1);
  const double f = x - k;
  const Rgb a = kScaleTable[k], b = kScaleTable[k + 1];
  auto mix = [f](uint8_t u, uint8_t v) {
    return static_cast<uint8_t>(std::lround(u + (static_cast<double>(v) - u) * f));
  };
  return {mix(a.r, b.r), mix(a.g, b.g), mix(a.b, b.b)};
}

void check(const Figure& f) {
  if (f.panels.empty())
    throw std::invalid_argument(fmt::format("heatmap '{}': no panels", printable(f.title)));
  if (!std::isfinite(f.vmin) || !std::isfinite(f.vmax) || !(f.vmin < f.vmax)) {
    throw std::invalid_argument(
        fmt::format("heatmap '{}': the scale [{}, {}] must be finite with vmin < vmax", printable(f.title),
                    f.vmin, f.vmax));
  }
  for (size_t p = 0; p < f.panels.size(); ++p) {
    const Panel& panel = f.panels[p];
    const auto n = static_cast<size_t>(panel.rows * panel.cols);
    if (panel.rows <= 0 || panel.cols <= 0) {
      throw std::invalid_argument(fmt::format("heatmap '{}' panel {}: shape ({}, {}) has no cells",
                                              printable(f.title), p, panel.rows, panel.cols));
    }
    if (panel.values.size() != n || (!panel.masked.empty() && panel.masked.size() != n) ||
        panel.row_labels.size() != static_cast<size_t>(panel.rows) ||
        panel.col_labels.size() != static_cast<size_t>(panel.cols)) {
      throw std::invalid_argument(
          fmt::format("heatmap '{}' panel {}: shape ({}, {}) but {} values, {} mask entries, {} "
                      "row labels, {} column labels",
                      printable(f.title), p, panel.rows, panel.cols, panel.values.size(), panel.masked.size(),
                      panel.row_labels.size(), panel.col_labels.size()));
    }
    for (int64_t i = 0; i < panel.rows; ++i) {
      for (int64_t j = 0; j < panel.cols; ++j) {
        const float v = panel.values[static_cast<size_t>(i * panel.cols + j)];
        if (!panel.is_masked(i, j) && !std::isfinite(v)) {
          throw std::invalid_argument(fmt::format(
              "heatmap '{}' panel {}: cell ({}, {}) is {} and not masked", printable(f.title), p, i, j, v));
        }
      }
    }
  }
}

void fit_scale(Figure& f) {
  double lo = INFINITY, hi = -INFINITY;
  for (const Panel& p : f.panels) {
    for (int64_t i = 0; i < p.rows; ++i) {
      for (int64_t j = 0; j < p.cols; ++j) {
        const float v = p.values[static_cast<size_t>(i * p.cols + j)];
        if (p.is_masked(i, j) || !std::isfinite(v)) continue;
        lo = std::min(lo, static_cast<double>(v));
        hi = std::max(hi, static_cast<double>(v));
      }
    }
  }
  if (lo > hi) {
    lo = 0, hi = 1;
  } else if (lo == hi) {
    lo -= 0.5, hi += 0.5;
  }
  f.vmin = lo;
  f.vmax = hi;
}

double scale_position(const Figure& f, float v) {
  return std::clamp((static_cast<double>(v) - f.vmin) / (f.vmax - f.vmin), 0.0, 1.0);
}

Rgb cell_colour(const Figure& f, int64_t p, int64_t i, int64_t j) {
  const Panel& panel = f.panels[static_cast<size_t>(p)];
  if (panel.is_masked(i, j)) return kMaskedColour;
  return scale_colour(scale_position(f, panel.values[static_cast<size_t>(i * panel.cols + j)]));
}

Rect Layout::cell_rect(int64_t p, int64_t i, int64_t j) const {
  const Rect& g = grids[static_cast<size_t>(p)];
  return {g.x + static_cast<double>(j) * cell, g.y + static_cast<double>(i) * cell, cell, cell};
}

Layout layout(const Figure& figure) { return geometry(figure).layout; }

std::string render_svg(const Figure& figure) {
  const Geometry g = geometry(figure);
  return detail::render_svg(g.layout.width, g.layout.height, [&](cairo_t* cr) { draw(cr, figure, g); },
                            "render_svg");
}

std::string render_png(const Figure& figure) {
  const Geometry g = geometry(figure);
  return detail::render_png(g.layout.width, g.layout.height, [&](cairo_t* cr) { draw(cr, figure, g); },
                            "render_png");
}

// ---- the terminal ----------------------------------------------------------------------

namespace {

// The first n characters of s (UTF-8 aware), padded with spaces to n.
std::string fit(const std::string& s, size_t n) {
  std::string out;
  size_t chars = 0;
  for (size_t k = 0; k < s.size() && chars < n;) {
    size_t len = 1;
    const auto c = static_cast<unsigned char>(s[k]);
    if (c >= 0xF0)
      len = 4;
    else if (c >= 0xE0)
      len = 3;
    else if (c >= 0xC0)
      len = 2;
    out += s.substr(k, len);
    k += len;
    ++chars;
  }
  out.append(n - chars, ' ');
  return out;
}

std::string background(Rgb c) { return fmt::format("\x1b[48;2;{};{};{}m", c.r, c.g, c.b); }
const char* const kReset = "\x1b[0m";

}  // namespace

std::string terminal_heatmap(const Figure& f, bool colour) {
  check(f);
  const size_t cell = colour ? 5 : 6;  // characters per cell
  size_t label_width = 0;
  for (const Panel& p : f.panels) {
    for (const auto& s : p.row_labels) label_width = std::max(label_width, s.size());
  }
  std::string out;
  for (size_t p = 0; p < f.panels.size(); ++p) {
    const Panel& panel = f.panels[p];
    if (!panel.title.empty()) out += panel.title + "\n";
    out += std::string(label_width + 1, ' ');
    // Column labels: their first cell - 1 characters, over the cell (right-aligned
    // over the numbers, left-aligned over the blocks).
    std::string header;
    for (int64_t j = 0; j < panel.cols; ++j) {
      const std::string label = fit(panel.col_labels[static_cast<size_t>(j)], cell - 1);
      header += colour ? label + " " : " " + label;
    }
    if (!colour) {  // move each label's padding to its left
      header.clear();
      for (int64_t j = 0; j < panel.cols; ++j) {
        std::string label = fit(panel.col_labels[static_cast<size_t>(j)], cell - 1);
        size_t pad = 0;
        while (!label.empty() && label.back() == ' ') label.pop_back(), ++pad;
        header += std::string(pad + 1, ' ') + label;
      }
    }
    out += header;
    while (!out.empty() && out.back() == ' ') out.pop_back();
    out += "\n";
    for (int64_t i = 0; i < panel.rows; ++i) {
      const std::string& label = panel.row_labels[static_cast<size_t>(i)];
      out += std::string(label_width - std::min(label_width, label.size()), ' ') + label + " ";
      for (int64_t j = 0; j < panel.cols; ++j) {
        const bool masked = panel.is_masked(i, j);
        if (colour) {
          out += background(cell_colour(f, static_cast<int64_t>(p), i, j));
          out += masked ? "\x1b[2m ··  " : "     ";
          out += kReset;
        } else {
          out += masked ? std::string(cell - 1, ' ') + "·"
                        : fmt::format("{:>{}.2f}",
                                      panel.values[static_cast<size_t>(i * panel.cols + j)], cell);
        }
      }
      out += "\n";
    }
  }
  // The scale: ten steps from vmin to vmax, and the masked mark.
  out += std::string(label_width + 1, ' ');
  if (colour) {
    out += tick_text(f.vmin) + " ";
    for (int k = 0; k < 10; ++k) out += background(scale_colour(k / 9.0)) + "  ";
    out += std::string(kReset) + " " + tick_text(f.vmax) + "   " + background(kMaskedColour) +
           "\x1b[2m ·· " + kReset + " masked\n";
  } else {
    out += fmt::format("scale {} .. {}; · masked\n", tick_text(f.vmin), tick_text(f.vmax));
  }
  return out;
}

}  // namespace attn::plot
