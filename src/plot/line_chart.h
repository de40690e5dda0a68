// line_chart.h - line charts through cairo (attn_plot): the training loss curve
// of `attn plot loss` and of `attn train`'s output directory.
//
// A LineChart is one or more series of (x, y) points drawn as lines (with a dot
// on every point when a series has at most kMaxMarkedPoints) inside a plot area
// with axes, "nice" ticks (1, 2 or 5 times a power of ten), tick labels, axis
// labels, light grid lines and a legend in the plot area's top-right corner.
// The picture is always kChartWidth x kChartHeight px. As for the heatmaps, one
// drawing routine renders SVG and PNG (1 px per SVG unit), and chart_layout()
// gives the geometry it uses, so tests can find a point's pixel.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "plot/heatmap.h"

namespace attn::plot {

inline constexpr int kChartWidth = 720, kChartHeight = 440;
inline constexpr size_t kMaxMarkedPoints = 200;
// The loss curve's two colours (matplotlib's first two).
inline constexpr Rgb kTrainColour = {31, 119, 180};
inline constexpr Rgb kValidationColour = {255, 127, 14};

struct Series {
  std::string name;  // the legend's label
  Rgb colour;
  std::vector<double> x, y;  // the points, drawn in this order
  bool dash_dot = false;     // matplotlib's linestyle="-." (else solid)
};

// A second x axis along the top (matplotlib's ax1.twiny()): its own values,
// mapped linearly onto the bottom axis so that `from` sits at bottom value
// x_from and `to` at x_to (from != to, x_from != x_to). Its ticks are nice
// numbers within the visible range; the title is not drawn (the top is the
// axis's).
struct TopAxis {
  std::string label;
  double from = 0, to = 1;
  double x_from = 0, x_to = 1;
};

struct LineChart {
  std::string title, x_label, y_label;
  std::vector<Series> series;
  // The x ticks are whole numbers (iterations): the tick step is at least 1.
  bool integer_x = false;
  std::optional<TopAxis> top_axis;
};

// Throws std::invalid_argument naming the values when a chart cannot be drawn: no
// series, no point at all, x and y of different lengths, a non-finite value.
void check(const LineChart& chart);

// Where everything goes. The axes span [x_min, x_max] and [y_min, y_max] (the
// data's range widened to the outer ticks; a range of one value is widened by 1,
// or by a tenth of the value); a value maps to pixels linearly:
//   px(x) = plot.x + (x - x_min) / (x_max - x_min) * plot.w
//   py(y) = plot.y + plot.h - (y - y_min) / (y_max - y_min) * plot.h
struct ChartLayout {
  int width = 0, height = 0;
  Rect plot;  // the plot area, inside the axes
  double x_min = 0, x_max = 1, y_min = 0, y_max = 1;
  std::vector<double> x_ticks, y_ticks;
  Rect legend;
  // With a top axis: its values at x_min and x_max, and its ticks.
  double top_min = 0, top_max = 1;
  std::vector<double> top_ticks;
  double px(double x) const { return plot.x + (x - x_min) / (x_max - x_min) * plot.w; }
  double py(double y) const { return plot.y + plot.h - (y - y_min) / (y_max - y_min) * plot.h; }
  double top_px(double t) const { return plot.x + (t - top_min) / (top_max - top_min) * plot.w; }
};
ChartLayout chart_layout(const LineChart& chart);  // check()s the chart

std::string render_svg(const LineChart& chart);
std::string render_png(const LineChart& chart);

// ---- the loss curve -----------------------------------------------------------------

// One line of metrics.jsonl: a JSON object with at least "iter", "train_loss" and
// "val_loss" (numbers; val_loss may be null where no evaluation ran), and from
// the book's loop (`attn train --recipe book-ch5`) "tokens_seen" and
// "num_epochs". Other keys are ignored.
struct LossRecord {
  double iter = 0;
  double train_loss = 0;
  std::optional<double> val_loss;
  std::optional<double> tokens_seen;
  std::optional<double> num_epochs;
};

// Reads a metrics.jsonl file (blank lines are skipped). Throws std::runtime_error
// "cannot read 'PATH': REASON" when it cannot be opened, and std::invalid_argument
// "'PATH' line N: WHAT" for the first malformed line (not JSON, not an object, a
// key missing or not a (finite) number), or when the file holds no record.
std::vector<LossRecord> read_metrics(const std::string& path);

// The chart of the records in iteration order: "train" (kTrainColour) and
// "validation" (kValidationColour, the records with a val_loss) against
// "iteration", y labelled "loss". When every record has tokens_seen and
// num_epochs (the book's loop), the chart is the book's plot_losses:
// "Training loss" and "Validation loss" (dash-dot) against "Epochs", the n
// evaluations at torch.linspace(0, num_epochs, n), y labelled "Loss", and
// "Tokens seen" along the top (the first evaluation's tokens_seen at epoch 0,
// the last's at num_epochs).
LineChart loss_chart(std::vector<LossRecord> records);

// Reads metrics_path and writes its loss chart to out_path, SVG or PNG as the
// name ends (.svg or .png), atomically (temporary file, fsync, rename): a failure
// throws (the messages above, or picture_file.h's) and leaves no file at out_path.
// `attn train` calls it at its end:
//   attn::plot::write_loss_curve(out_dir + "/metrics.jsonl", out_dir + "/loss.svg");
void write_loss_curve(const std::string& metrics_path, const std::string& out_path);

}  // namespace attn::plot
