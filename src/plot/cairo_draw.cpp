// cairo_draw.cpp - the drawing helpers every attn picture shares (cairo_draw.h).
#include "plot/cairo_draw.h"

#include <cairo-svg.h>
#include <fmt/format.h>

#include <stdexcept>

namespace attn::plot::detail {
namespace {

const char* const kFontFamily = "DejaVu Sans";

cairo_status_t append_to_string(void* closure, const unsigned char* data, unsigned int length) {
  static_cast<std::string*>(closure)->append(reinterpret_cast<const char*>(data), length);
  return CAIRO_STATUS_SUCCESS;
}

void check_status(cairo_status_t status, const char* what) {
  if (status != CAIRO_STATUS_SUCCESS)
    throw std::runtime_error(fmt::format("{}: cairo: {}", what, cairo_status_to_string(status)));
}

}  // namespace

void set_font(cairo_t* cr, double size, bool bold) {
  cairo_select_font_face(cr, kFontFamily, CAIRO_FONT_SLANT_NORMAL,
                         bold ? CAIRO_FONT_WEIGHT_BOLD : CAIRO_FONT_WEIGHT_NORMAL);
  cairo_set_font_size(cr, size);
  cairo_font_options_t* options = cairo_font_options_create();
  cairo_font_options_set_hint_style(options, CAIRO_HINT_STYLE_NONE);
  cairo_font_options_set_hint_metrics(options, CAIRO_HINT_METRICS_OFF);
  cairo_font_options_set_antialias(options, CAIRO_ANTIALIAS_GRAY);
  cairo_set_font_options(cr, options);
  cairo_font_options_destroy(options);
}

double text_width(cairo_t* cr, const std::string& text) {
  cairo_text_extents_t e;
  cairo_text_extents(cr, text.c_str(), &e);
  return e.x_advance;
}

void set_colour(cairo_t* cr, Rgb c) { cairo_set_source_rgb(cr, c.r / 255.0, c.g / 255.0, c.b / 255.0); }

void draw_text(cairo_t* cr, const std::string& text, double x, double y, Align align) {
  const double w = text_width(cr, text);
  cairo_move_to(cr, align == Align::kLeft ? x : align == Align::kCentre ? x - w / 2 : x - w, y);
  cairo_show_text(cr, text.c_str());
}

Measure::Measure()
    : surface(cairo_image_surface_create(CAIRO_FORMAT_RGB24, 1, 1)), cr(cairo_create(surface)) {}
Measure::~Measure() {
  cairo_destroy(cr);
  cairo_surface_destroy(surface);
}

std::string render_svg(int width, int height, const std::function<void(cairo_t*)>& draw, const char* what) {
  std::string out;
  cairo_surface_t* surface = cairo_svg_surface_create_for_stream(append_to_string, &out, width, height);
  cairo_svg_surface_set_document_unit(surface, CAIRO_SVG_UNIT_PX);
  cairo_t* cr = cairo_create(surface);
  draw(cr);
  const cairo_status_t drawn = cairo_status(cr);
  cairo_destroy(cr);
  cairo_surface_finish(surface);  // writes the document
  const cairo_status_t finished = cairo_surface_status(surface);
  cairo_surface_destroy(surface);
  check_status(drawn, what);
  check_status(finished, what);
  return out;
}

std::string render_png(int width, int height, const std::function<void(cairo_t*)>& draw, const char* what) {
  cairo_surface_t* surface = cairo_image_surface_create(CAIRO_FORMAT_RGB24, width, height);
  cairo_t* cr = cairo_create(surface);
  draw(cr);
  const cairo_status_t drawn = cairo_status(cr);
  cairo_destroy(cr);
  std::string out;
  const cairo_status_t written = cairo_surface_write_to_png_stream(surface, append_to_string, &out);
  cairo_surface_destroy(surface);
  check_status(drawn, what);
  check_status(written, what);
  return out;
}

}  // namespace attn::plot::detail
