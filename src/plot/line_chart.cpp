// line_chart.cpp - line charts with cairo, and the loss curve (line_chart.h).
#include "plot/line_chart.h"

#include <cairo.h>
#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "attn/atomic_file.h"
#include "attn/utf8.h"
#include "plot/cairo_draw.h"
#include "plot/picture_file.h"

namespace attn::plot {
namespace {

using detail::Align;
using detail::draw_text;
using detail::Measure;
using detail::set_colour;
using detail::set_font;
using detail::text_width;

// Sizes in px.
constexpr double kPlotLeft = 76;    // y tick labels and the y axis label
constexpr double kPlotRight = 24;
constexpr double kTop = 44;     // the title
constexpr double kBottom = 60;  // x tick labels and the x axis label
constexpr double kTitleFont = 15, kTickFont = 11, kLabelFont = 12, kLegendFont = 12;
constexpr double kTickLength = 5;
constexpr double kTopAxisExtra = 14;  // the top axis's tick labels and label need more than a title
constexpr double kLineWidth = 2, kMarkerRadius = 3.5;
constexpr double kLegendSwatch = 24, kLegendRow = 18, kLegendPad = 8;
constexpr Rgb kText = {32, 32, 32};
constexpr Rgb kAxis = {64, 64, 64};
constexpr Rgb kGrid = {230, 230, 230};
constexpr Rgb kLegendBorder = {190, 190, 190};

// An axis over [lo, hi]: a step of 1, 2 or 5 times a power of ten giving about
// `target` intervals (at least min_step), the range widened to whole steps.
struct Axis {
  double min = 0, max = 1, step = 1;
  std::vector<double> ticks;
};
Axis nice_axis(double lo, double hi, int target, double min_step) {
  if (hi <= lo) {
    const double pad = lo == 0 ? 1.0 : std::max(std::abs(lo) * 0.1, min_step);
    lo -= pad;
    hi += pad;
  }
  const double raw = (hi - lo) / target;
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  const double f = raw / mag;
  double step = (f < 1.5 ? 1 : f < 3 ? 2 : f < 7 ? 5 : 10) * mag;
  step = std::max(step, min_step);
  Axis a;
  a.step = step;
  a.min = std::floor(lo / step + 1e-9) * step;
  a.max = std::ceil(hi / step - 1e-9) * step;
  if (a.max <= a.min) a.max = a.min + step;
  const auto n = static_cast<int64_t>(std::llround((a.max - a.min) / step));
  for (int64_t k = 0; k <= n; ++k) a.ticks.push_back(a.min + static_cast<double>(k) * step);
  return a;
}

std::string tick_text(double v, double step) {
  const int decimals = std::max(0, static_cast<int>(-std::floor(std::log10(step) + 1e-9)));
  if (std::abs(v) < step * 1e-6) v = 0;  // no "-0.0"
  return fmt::format("{:.{}f}", v, decimals);
}

struct Geometry {
  ChartLayout layout;
  double x_step = 1, y_step = 1, top_step = 1;
};

Geometry geometry(const LineChart& chart) {
  check(chart);
  double x_lo = INFINITY, x_hi = -INFINITY, y_lo = INFINITY, y_hi = -INFINITY;
  for (const Series& s : chart.series) {
    for (size_t k = 0; k < s.x.size(); ++k) {
      x_lo = std::min(x_lo, s.x[k]);
      x_hi = std::max(x_hi, s.x[k]);
      y_lo = std::min(y_lo, s.y[k]);
      y_hi = std::max(y_hi, s.y[k]);
    }
  }
  const Axis xa = nice_axis(x_lo, x_hi, 8, chart.integer_x ? 1.0 : 0.0);
  const Axis ya = nice_axis(y_lo, y_hi, 6, 0.0);
  Geometry g;
  ChartLayout& L = g.layout;
  L.width = kChartWidth;
  L.height = kChartHeight;
  L.plot = {kPlotLeft, kTop, kChartWidth - kPlotLeft - kPlotRight, kChartHeight - kTop - kBottom};
  if (chart.top_axis) {
    // The top axis's values at the bottom axis's ends, and nice ticks inside them.
    const TopAxis& t = *chart.top_axis;
    const double per_x = (t.to - t.from) / (t.x_to - t.x_from);
    L.top_min = t.from + (xa.min - t.x_from) * per_x;
    L.top_max = t.from + (xa.max - t.x_from) * per_x;
    const double lo = std::min(L.top_min, L.top_max), hi = std::max(L.top_min, L.top_max);
    const Axis ta = nice_axis(lo, hi, 6, 0.0);
    for (double v : ta.ticks) {
      if (v >= lo - 1e-9 * (hi - lo) && v <= hi + 1e-9 * (hi - lo)) L.top_ticks.push_back(v);
    }
    g.top_step = ta.step;
    L.plot.y += kTopAxisExtra;
    L.plot.h -= kTopAxisExtra;
  }
  L.x_min = xa.min;
  L.x_max = xa.max;
  L.y_min = ya.min;
  L.y_max = ya.max;
  L.x_ticks = xa.ticks;
  L.y_ticks = ya.ticks;
  g.x_step = xa.step;
  g.y_step = ya.step;
  Measure m;
  set_font(m.cr, kLegendFont);
  double widest = 0;
  for (const Series& s : chart.series) widest = std::max(widest, text_width(m.cr, s.name));
  const double w = std::ceil(kLegendPad * 3 + kLegendSwatch + widest);
  const double h = kLegendPad * 2 + kLegendRow * static_cast<double>(chart.series.size());
  L.legend = {L.plot.x + L.plot.w - w - 10, L.plot.y + 10, w, h};
  return g;
}

void draw(cairo_t* cr, const LineChart& chart, const Geometry& g) {
  const ChartLayout& L = g.layout;
  const Rect& P = L.plot;
  set_colour(cr, kBackground);
  cairo_paint(cr);

  if (!chart.title.empty() && !chart.top_axis) {
    set_font(cr, kTitleFont, true);
    set_colour(cr, kText);
    draw_text(cr, chart.title, P.x + P.w / 2, kTop - 16, Align::kCentre);
  }

  // Grid lines and ticks, on whole pixels (+0.5: crisp 1 px lines).
  cairo_set_line_width(cr, 1);
  set_font(cr, kTickFont);
  for (double t : L.x_ticks) {
    const double x = std::round(L.px(t)) + 0.5;
    set_colour(cr, kGrid);
    cairo_move_to(cr, x, P.y);
    cairo_line_to(cr, x, P.y + P.h);
    cairo_stroke(cr);
    set_colour(cr, kAxis);
    cairo_move_to(cr, x, P.y + P.h);
    cairo_line_to(cr, x, P.y + P.h + kTickLength);
    cairo_stroke(cr);
    set_colour(cr, kText);
    draw_text(cr, tick_text(t, g.x_step), x, P.y + P.h + kTickLength + 4 + kTickFont, Align::kCentre);
  }
  for (double t : L.y_ticks) {
    const double y = std::round(L.py(t)) + 0.5;
    set_colour(cr, kGrid);
    cairo_move_to(cr, P.x, y);
    cairo_line_to(cr, P.x + P.w, y);
    cairo_stroke(cr);
    set_colour(cr, kAxis);
    cairo_move_to(cr, P.x - kTickLength, y);
    cairo_line_to(cr, P.x, y);
    cairo_stroke(cr);
    set_colour(cr, kText);
    draw_text(cr, tick_text(t, g.y_step), P.x - kTickLength - 4, y + kTickFont * 0.35, Align::kRight);
  }
  // The axes: left and bottom.
  set_colour(cr, kAxis);
  cairo_move_to(cr, std::round(P.x) - 0.5, P.y);
  cairo_line_to(cr, std::round(P.x) - 0.5, P.y + P.h + 0.5);
  cairo_line_to(cr, P.x + P.w, P.y + P.h + 0.5);
  cairo_stroke(cr);
  if (chart.top_axis) {  // along the top: the axis line, its ticks upwards, labels, its label
    set_colour(cr, kAxis);
    cairo_move_to(cr, std::round(P.x) - 0.5, std::round(P.y) - 0.5);
    cairo_line_to(cr, P.x + P.w, std::round(P.y) - 0.5);
    cairo_stroke(cr);
    set_font(cr, kTickFont);
    for (double t : L.top_ticks) {
      const double x = std::round(L.top_px(t)) + 0.5;
      set_colour(cr, kAxis);
      cairo_move_to(cr, x, P.y);
      cairo_line_to(cr, x, P.y - kTickLength);
      cairo_stroke(cr);
      set_colour(cr, kText);
      draw_text(cr, tick_text(t, g.top_step), x, P.y - kTickLength - 4, Align::kCentre);
    }
    set_font(cr, kLabelFont);
    draw_text(cr, chart.top_axis->label, P.x + P.w / 2, P.y - kTickLength - 8 - kTickFont - 6,
              Align::kCentre);
  }
  // Axis labels.
  set_font(cr, kLabelFont);
  set_colour(cr, kText);
  draw_text(cr, chart.x_label, P.x + P.w / 2, L.height - 14, Align::kCentre);
  cairo_save(cr);
  cairo_translate(cr, 20, P.y + P.h / 2);
  cairo_rotate(cr, -M_PI / 2);
  draw_text(cr, chart.y_label, 0, 0, Align::kCentre);
  cairo_restore(cr);

  // The series, clipped to the plot area (a little outside, for the dots).
  cairo_save(cr);
  cairo_rectangle(cr, P.x - kMarkerRadius, P.y - kMarkerRadius, P.w + 2 * kMarkerRadius,
                  P.h + 2 * kMarkerRadius);
  cairo_clip(cr);
  cairo_set_line_join(cr, CAIRO_LINE_JOIN_ROUND);
  cairo_set_line_cap(cr, CAIRO_LINE_CAP_ROUND);
  for (const Series& s : chart.series) {
    if (s.x.empty()) continue;
    set_colour(cr, s.colour);
    cairo_set_line_width(cr, kLineWidth);
    if (s.dash_dot) {
      const double dashes[] = {9, 4, 1, 4};  // "-.": a dash, a gap, a dot, a gap
      cairo_set_dash(cr, dashes, 4, 0);
    }
    cairo_move_to(cr, L.px(s.x[0]), L.py(s.y[0]));
    for (size_t k = 1; k < s.x.size(); ++k) cairo_line_to(cr, L.px(s.x[k]), L.py(s.y[k]));
    if (s.x.size() == 1) cairo_rel_line_to(cr, 0, 0);  // one point: a round cap's dot
    cairo_stroke(cr);
    cairo_set_dash(cr, nullptr, 0, 0);
    if (s.x.size() <= kMaxMarkedPoints) {
      for (size_t k = 0; k < s.x.size(); ++k) {
        cairo_new_sub_path(cr);
        cairo_arc(cr, L.px(s.x[k]), L.py(s.y[k]), kMarkerRadius, 0, 2 * M_PI);
      }
      cairo_fill(cr);
    }
  }
  cairo_restore(cr);

  // The legend: a white box, a line swatch and the name of each series.
  const Rect& B = L.legend;
  set_colour(cr, kBackground);
  cairo_rectangle(cr, B.x, B.y, B.w, B.h);
  cairo_fill_preserve(cr);
  set_colour(cr, kLegendBorder);
  cairo_set_line_width(cr, 1);
  cairo_stroke(cr);
  set_font(cr, kLegendFont);
  for (size_t k = 0; k < chart.series.size(); ++k) {
    const Series& s = chart.series[k];
    const double cy = B.y + kLegendPad + (static_cast<double>(k) + 0.5) * kLegendRow;
    set_colour(cr, s.colour);
    cairo_set_line_width(cr, 3);
    if (s.dash_dot) {
      const double dashes[] = {9, 4, 1, 4};
      cairo_set_dash(cr, dashes, 4, 0);
    }
    cairo_move_to(cr, B.x + kLegendPad, cy);
    cairo_line_to(cr, B.x + kLegendPad + kLegendSwatch, cy);
    cairo_stroke(cr);
    cairo_set_dash(cr, nullptr, 0, 0);
    set_colour(cr, kText);
    draw_text(cr, s.name, B.x + kLegendPad * 2 + kLegendSwatch, cy + kLegendFont * 0.35,
              Align::kLeft);
  }
}

}  // namespace

void check(const LineChart& chart) {
  if (chart.series.empty()) throw std::invalid_argument("line chart: no series");
  size_t points = 0;
  for (const Series& s : chart.series) {
    if (s.x.size() != s.y.size())
      throw std::invalid_argument(fmt::format("line chart: series '{}' has {} x and {} y values",
                                              printable(s.name), s.x.size(), s.y.size()));
    for (size_t k = 0; k < s.x.size(); ++k) {
      if (!std::isfinite(s.x[k]) || !std::isfinite(s.y[k]))
        throw std::invalid_argument(fmt::format("line chart: series '{}' point {} is ({}, {})",
                                                printable(s.name), k, s.x[k], s.y[k]));
    }
    points += s.x.size();
  }
  if (points == 0) throw std::invalid_argument("line chart: no points");
}

ChartLayout chart_layout(const LineChart& chart) { return geometry(chart).layout; }

std::string render_svg(const LineChart& chart) {
  const Geometry g = geometry(chart);
  return detail::render_svg(g.layout.width, g.layout.height, [&](cairo_t* cr) { draw(cr, chart, g); },
                            "render_svg");
}

std::string render_png(const LineChart& chart) {
  const Geometry g = geometry(chart);
  return detail::render_png(g.layout.width, g.layout.height, [&](cairo_t* cr) { draw(cr, chart, g); },
                            "render_png");
}

std::vector<LossRecord> read_metrics(const std::string& path) {
  // A regular file only, checked before it is opened (a FIFO would wait for a
  // writer for ever, /dev/zero is one endless line), of a size a run writes.
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  if (st.type() != fs::file_type::regular && st.type() != fs::file_type::not_found) {
    const char* kind = st.type() == fs::file_type::directory   ? "a directory"
                       : st.type() == fs::file_type::fifo      ? "a FIFO (named pipe)"
                       : st.type() == fs::file_type::character ? "a character device"
                       : st.type() == fs::file_type::block     ? "a block device"
                       : st.type() == fs::file_type::socket    ? "a socket"
                                                               : "not a regular file";
    throw std::runtime_error(fmt::format("'{}' is {}, not a regular file", printable(path), kind));
  }
  constexpr uintmax_t kMaxMetricsBytes = uintmax_t{1} << 30;
  if (st.type() == fs::file_type::regular && fs::file_size(path, ec) > kMaxMetricsBytes && !ec) {
    throw std::runtime_error(
        fmt::format("'{}' has {} bytes, more than the {} a metrics file may have", printable(path),
                    fs::file_size(path, ec), kMaxMetricsBytes));
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error(fmt::format("cannot read '{}': {}", printable(path), std::strerror(errno)));
  std::vector<LossRecord> records;
  std::string line;
  for (int64_t n = 1; std::getline(in, line); ++n) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    auto bad = [&](const std::string& what) {
      return std::invalid_argument(fmt::format("'{}' line {}: {}", printable(path), n, what));
    };
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const nlohmann::json::parse_error& e) {
      throw bad(fmt::format("not valid JSON (at byte {})", e.byte));
    } catch (const nlohmann::json::out_of_range&) {  // a number past a double's range, 1e400
      throw bad("a number out of range");
    }
    if (!j.is_object()) throw bad("not a JSON object");
    auto number = [&](const char* key) {
      const auto it = j.find(key);
      if (it == j.end()) throw bad(fmt::format("no \"{}\"", key));
      if (!it->is_number() || !std::isfinite(it->get<double>()))
        throw bad(fmt::format("\"{}\" is {}, not a finite number", key, it->dump()));
      return it->get<double>();
    };
    LossRecord r;
    r.iter = number("iter");
    r.train_loss = number("train_loss");
    const auto val = j.find("val_loss");
    if (val == j.end()) throw bad("no \"val_loss\"");
    if (!val->is_null()) r.val_loss = number("val_loss");
    if (j.contains("tokens_seen")) r.tokens_seen = number("tokens_seen");
    if (j.contains("num_epochs")) r.num_epochs = number("num_epochs");
    records.push_back(r);
  }
  if (in.bad()) throw std::runtime_error(fmt::format("cannot read '{}': {}", printable(path), std::strerror(errno)));
  if (records.empty()) throw std::invalid_argument(fmt::format("'{}': no records", printable(path)));
  return records;
}

namespace {

// The book's plot_losses: epochs_seen = torch.linspace(0, num_epochs, n), both
// losses against it, tokens seen on ax1.twiny() (aligned by an invisible plot
// of the train loss against tokens_seen: its first and last values at the
// bottom axis's 0 and num_epochs).
LineChart book_loss_chart(const std::vector<LossRecord>& records) {
  const size_t n = records.size();
  const double num_epochs = *records.back().num_epochs;
  LineChart chart;
  chart.title = "loss";
  chart.x_label = "Epochs";
  chart.y_label = "Loss";
  chart.integer_x = true;  // MaxNLocator(integer=True)
  Series train{"Training loss", kTrainColour, {}, {}, false};
  Series val{"Validation loss", kValidationColour, {}, {}, true};
  for (size_t k = 0; k < n; ++k) {
    // torch.linspace(0, end, n): step = end / (n - 1), the second half counted from the end
    const double step = n > 1 ? num_epochs / static_cast<double>(n - 1) : 0.0;
    const double x = k < n / 2 ? step * static_cast<double>(k)
                               : num_epochs - step * static_cast<double>(n - 1 - k);
    train.x.push_back(x);
    train.y.push_back(records[k].train_loss);
    if (records[k].val_loss) {
      val.x.push_back(x);
      val.y.push_back(*records[k].val_loss);
    }
  }
  chart.series = {train, val};
  const double first = *records.front().tokens_seen, last = *records.back().tokens_seen;
  if (n > 1 && last != first)
    chart.top_axis = TopAxis{"Tokens seen", first, last, 0.0, num_epochs};
  return chart;
}

}  // namespace

LineChart loss_chart(std::vector<LossRecord> records) {
  std::stable_sort(records.begin(), records.end(),
                   [](const LossRecord& a, const LossRecord& b) { return a.iter < b.iter; });
  const bool book = !records.empty() &&
                    std::all_of(records.begin(), records.end(), [](const LossRecord& r) {
                      return r.tokens_seen && r.num_epochs && *r.num_epochs > 0;
                    });
  if (book) return book_loss_chart(records);
  LineChart chart;
  chart.title = "loss";
  chart.x_label = "iteration";
  chart.y_label = "loss";
  chart.integer_x = true;
  Series train{"train", kTrainColour, {}, {}, false};
  Series val{"validation", kValidationColour, {}, {}, false};
  for (const LossRecord& r : records) {
    train.x.push_back(r.iter);
    train.y.push_back(r.train_loss);
    if (r.val_loss) {
      val.x.push_back(r.iter);
      val.y.push_back(*r.val_loss);
    }
  }
  chart.series = {train, val};
  return chart;
}

void write_loss_curve(const std::string& metrics_path, const std::string& out_path) {
  const PictureFormat format = picture_format(out_path);
  const LineChart chart = loss_chart(read_metrics(metrics_path));
  io::write_file_atomically(out_path, format == PictureFormat::kSvg ? render_svg(chart) : render_png(chart));
}

}  // namespace attn::plot
