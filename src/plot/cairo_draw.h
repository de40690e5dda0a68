// cairo_draw.h - what every attn picture draws with (attn_plot, internal):
// DejaVu Sans at unhinted metrics, colours, aligned text, a scratch context
// for measuring, and one drawing routine rendered to an SVG document or PNG
// bytes, so that both formats come from the same code.
#pragma once

#include <cairo.h>

#include <functional>
#include <string>

#include "plot/heatmap.h"  // Rgb

namespace attn::plot::detail {

// Text is laid out with unhinted metrics so that the SVG and the PNG (and any
// renderer of the SVG) put every glyph in the same place.
void set_font(cairo_t* cr, double size, bool bold = false);
double text_width(cairo_t* cr, const std::string& text);
void set_colour(cairo_t* cr, Rgb c);

// Text with its baseline centre, left end or right end at (x, y).
enum class Align { kLeft, kCentre, kRight };
void draw_text(cairo_t* cr, const std::string& text, double x, double y, Align align);

// A cairo context on a 1x1 image, for measuring text.
struct Measure {
  Measure();
  ~Measure();
  Measure(const Measure&) = delete;
  Measure& operator=(const Measure&) = delete;
  cairo_surface_t* surface;
  cairo_t* cr;
};

// draw(cr) on a width x height surface, as an SVG document (px units) or as
// PNG bytes. Throws std::runtime_error naming `what` and cairo's status if
// cairo fails.
std::string render_svg(int width, int height, const std::function<void(cairo_t*)>& draw, const char* what);
std::string render_png(int width, int height, const std::function<void(cairo_t*)>& draw, const char* what);

}  // namespace attn::plot::detail
