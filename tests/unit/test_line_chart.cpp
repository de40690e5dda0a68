// The loss chart (src/plot/line_chart, attn_plot): its layout, metrics.jsonl
// reading and its errors, the SVG rendered by librsvg checked pixel by pixel
// (size, both series' colours, points at the pixels chart_layout() gives), the
// PNG against the SVG, and write_loss_curve's atomic, all-or-nothing writes.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <vector>

#include "cli.h"
#include "pictures.h"
#include "plot/line_chart.h"
#include "plot/picture_file.h"

namespace {

namespace fs = std::filesystem;
using attn::plot::LossRecord;
using attn::plot::Rgb;
using attn::test::Image;

std::string write_text(const std::string& stem, const std::string& text) {
  const std::string path = attn::test::temp_path(stem);
  FILE* f = std::fopen(path.c_str(), "wb");
  EXPECT_NE(f, nullptr) << path;
  if (f != nullptr) {
    std::fwrite(text.data(), 1, text.size(), f);
    std::fclose(f);
  }
  return path;
}

// A training run's metrics: train falls 4.2 -> 1.6, validation (evaluated every
// other line, null between) lies well above it, so the two curves never touch.
const char* const kMetrics =
    "{\"iter\": 0, \"train_loss\": 4.2, \"val_loss\": 4.6, \"lr\": 0.001}\n"
    "{\"iter\": 50, \"train_loss\": 3.3, \"val_loss\": null}\n"
    "{\"iter\": 100, \"train_loss\": 2.6, \"val_loss\": 3.5}\n"
    "{\"iter\": 150, \"train_loss\": 2.1, \"val_loss\": null}\n"
    "{\"iter\": 200, \"train_loss\": 1.6, \"val_loss\": 2.9}\n"
    "\n";

// The folder's entries other than `keep` (a temporary file left behind shows here).
std::vector<std::string> entries_of(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename().string());
  return names;
}

TEST(LineChart, ReadsMetricsSkippingBlankLinesWithNullValidation) {
  const auto records = attn::plot::read_metrics(write_text("metrics.jsonl", kMetrics));
  ASSERT_EQ(records.size(), 5u);
  EXPECT_EQ(records[2].iter, 100);
  EXPECT_DOUBLE_EQ(records[2].train_loss, 2.6);
  ASSERT_TRUE(records[2].val_loss.has_value());
  EXPECT_DOUBLE_EQ(*records[2].val_loss, 3.5);
  EXPECT_FALSE(records[1].val_loss.has_value());
  const auto chart = attn::plot::loss_chart(records);
  ASSERT_EQ(chart.series.size(), 2u);
  EXPECT_EQ(chart.series[0].x.size(), 5u);
  EXPECT_EQ(chart.series[1].x.size(), 3u);
}

// Each malformed line is refused naming the file and its line number.
TEST(LineChart, MalformedMetricsLinesAreRefusedNamingTheLine) {
  const std::string good = "{\"iter\": 0, \"train_loss\": 4.2, \"val_loss\": 4.6}\n";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"{\"iter\": 1, \"train_loss\": 4.0", "not valid JSON"},
      {"[1, 2, 3]", "not a JSON object"},
      {"{\"iter\": 1, \"val_loss\": 4.0}", "no \"train_loss\""},
      {"{\"iter\": 1, \"train_loss\": 4.0}", "no \"val_loss\""},
      {"{\"iter\": \"one\", \"train_loss\": 4.0, \"val_loss\": 4.1}", "\"iter\" is \"one\""},
      // Past a double's range: nlohmann's out_of_range, not a parse_error (issue 46).
      {"{\"iter\": 1, \"train_loss\": 1e400, \"val_loss\": 4.1}", "a number out of range"},
  };
  for (const auto& [line, what] : cases) {
    const std::string path = write_text("bad.jsonl", good + "\n" + line + "\n" + good);
    try {
      attn::plot::read_metrics(path);
      ADD_FAILURE() << "accepted: " << line;
    } catch (const std::invalid_argument& e) {
      const std::string message = e.what();
      EXPECT_NE(message.find("'" + path + "' line 3: "), std::string::npos) << message;
      EXPECT_NE(message.find(what), std::string::npos) << message;
    }
  }
  EXPECT_THROW(attn::plot::read_metrics(write_text("empty.jsonl", "\n\n")), std::invalid_argument);
  EXPECT_THROW(attn::plot::read_metrics(attn::test::temp_path("missing.jsonl")), std::runtime_error);
}

// The axes widen the data to nice ticks, and values map linearly into the plot area.
TEST(LineChart, LayoutHasNiceTicksAndMapsValuesLinearly) {
  const auto chart =
      attn::plot::loss_chart(attn::plot::read_metrics(write_text("metrics.jsonl", kMetrics)));
  const auto L = attn::plot::chart_layout(chart);
  EXPECT_EQ(L.width, attn::plot::kChartWidth);
  EXPECT_EQ(L.height, attn::plot::kChartHeight);
  EXPECT_DOUBLE_EQ(L.x_min, 0);
  EXPECT_DOUBLE_EQ(L.x_max, 200);
  EXPECT_NEAR(L.y_min, 1.5, 1e-9);
  EXPECT_NEAR(L.y_max, 5.0, 1e-9);
  ASSERT_EQ(L.y_ticks.size(), 8u);  // 1.5, 2.0, ..., 5.0
  EXPECT_NEAR(L.y_ticks[1] - L.y_ticks[0], 0.5, 1e-9);
  ASSERT_EQ(L.x_ticks.size(), 11u);  // 0, 20, ..., 200
  EXPECT_DOUBLE_EQ(L.x_ticks[1], 20);
  EXPECT_DOUBLE_EQ(L.px(0), L.plot.x);
  EXPECT_DOUBLE_EQ(L.px(200), L.plot.x + L.plot.w);
  EXPECT_DOUBLE_EQ(L.py(1.5), L.plot.y + L.plot.h);
  EXPECT_NEAR(L.py(5.0), L.plot.y, 1e-9);
  // One point: its range is widened, integer x ticks stay whole.
  attn::plot::LineChart one;
  one.integer_x = true;
  one.series.push_back({"train", attn::plot::kTrainColour, {7}, {2.0}});
  const auto L1 = attn::plot::chart_layout(one);
  EXPECT_LT(L1.x_min, 7);
  EXPECT_GT(L1.x_max, 7);
  for (double t : L1.x_ticks) EXPECT_EQ(t, std::round(t));
  EXPECT_LT(L1.y_min, 2.0);
  EXPECT_GT(L1.y_max, 2.0);
  attn::plot::LineChart bad;
  EXPECT_THROW(attn::plot::chart_layout(bad), std::invalid_argument);
  bad.series.push_back({"train", attn::plot::kTrainColour, {1, 2}, {1.0}});
  EXPECT_THROW(attn::plot::chart_layout(bad), std::invalid_argument);
}

int count_colour(const Image& image, Rgb c, int tolerance) {
  int n = 0;
  for (const Rgb& p : image.pixels) n += attn::test::colour_distance(p, c) <= tolerance ? 1 : 0;
  return n;
}

// Every record's point (a dot of radius 3.5 px) has its series' colour at the
// pixel chart_layout() maps it to; `what` names the picture.
void expect_points_at_layout(const Image& image, const std::vector<LossRecord>& records,
                             const std::string& what) {
  const auto chart = attn::plot::loss_chart(records);
  const auto L = attn::plot::chart_layout(chart);
  for (const auto& r : records) {
    const int x = static_cast<int>(L.px(r.iter)), y = static_cast<int>(L.py(r.train_loss));
    EXPECT_LE(attn::test::colour_distance(image.at(x, y), attn::plot::kTrainColour), 24)
        << what << ": train point (" << r.iter << ", " << r.train_loss << ") at pixel (" << x
        << ", " << y << ") is " << attn::test::rgb_str(image.at(x, y));
    if (r.val_loss) {
      const int vy = static_cast<int>(L.py(*r.val_loss));
      EXPECT_LE(attn::test::colour_distance(image.at(x, vy), attn::plot::kValidationColour), 24)
          << what << ": validation point (" << r.iter << ", " << *r.val_loss << ") at pixel ("
          << x << ", " << vy << ") is " << attn::test::rgb_str(image.at(x, vy));
    }
  }
  // And not somewhere else: halfway between the curves, just right of iteration
  // 100, is background (or a light grid line).
  const int x = static_cast<int>(L.px(100)) + 6, y = static_cast<int>(L.py((2.6 + 3.5) / 2));
  EXPECT_LE(attn::test::colour_distance(image.at(x, y), attn::plot::kBackground), 30)
      << what << " at (" << x << ", " << y << ") is " << attn::test::rgb_str(image.at(x, y));
}

TEST(LineChart, LossCurveSvgRenderedByRsvgHasBothSeriesAtTheirPixels) {
  const std::string metrics = write_text("metrics.jsonl", kMetrics);
  const std::string dir = attn::test::temp_path("loss_dir");
  fs::create_directory(dir);
  const std::string svg = dir + "/loss.svg";
  attn::plot::write_loss_curve(metrics, svg);
  EXPECT_EQ(entries_of(dir), std::vector<std::string>{"loss.svg"});
  EXPECT_EQ(attn::test::read_text(svg).rfind("<?xml", 0), 0u);
  const Image rendered = attn::test::render_svg_file(svg);
  ASSERT_EQ(rendered.width, attn::plot::kChartWidth);
  ASSERT_EQ(rendered.height, attn::plot::kChartHeight);
  // Both colours, each in the lines, dots and the legend's swatch: hundreds of pixels.
  EXPECT_GT(count_colour(rendered, attn::plot::kTrainColour, 8), 300);
  EXPECT_GT(count_colour(rendered, attn::plot::kValidationColour, 8), 200);
  const auto records = attn::plot::read_metrics(metrics);
  expect_points_at_layout(rendered, records, "rsvg-convert");

  // The PNG of the same chart: same size, the same points, and within anti-aliasing
  // of the rendered SVG everywhere else (text included).
  const std::string png_path = dir + "/loss.png";
  attn::plot::write_loss_curve(metrics, png_path);
  const Image png = attn::test::load_png(png_path);
  ASSERT_EQ(png.width, rendered.width);
  ASSERT_EQ(png.height, rendered.height);
  expect_points_at_layout(png, records, "png");
  size_t differ = 0;
  for (size_t k = 0; k < png.pixels.size(); ++k)
    differ += attn::test::colour_distance(png.pixels[k], rendered.pixels[k]) > 48 ? 1 : 0;
  EXPECT_LT(static_cast<double>(differ), 0.01 * static_cast<double>(png.pixels.size()))
      << differ << " of " << png.pixels.size() << " pixels differ between the PNG and the SVG";
  fs::remove_all(dir);
}

// A failure writes nothing: no picture, no temporary file beside it.
TEST(LineChart, WriteLossCurveFailuresLeaveNoFile) {
  const std::string dir = attn::test::temp_path("loss_fail");
  fs::create_directory(dir);
  const std::string good = write_text("metrics.jsonl", kMetrics);
  const std::string bad = write_text("bad.jsonl", std::string(kMetrics) + "{\"iter\": 3,\n");
  EXPECT_THROW(attn::plot::write_loss_curve(bad, dir + "/loss.svg"), std::invalid_argument);
  EXPECT_THROW(attn::plot::write_loss_curve(good, dir + "/loss.jpg"), std::invalid_argument);
  try {
    attn::plot::write_loss_curve(good, dir + "/no/such/folder/loss.png");
    ADD_FAILURE() << "wrote into a missing folder";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("cannot write '" + dir + "/no/such/folder/loss.png'"),
              std::string::npos)
        << e.what();
  }
  EXPECT_TRUE(entries_of(dir).empty());
  fs::remove_all(dir);
}

}  // namespace

// ---- the book's plot_losses (metrics.jsonl of `attn train --recipe book-ch5`) ----------

namespace {

// 4 evaluations of a 2-epoch run (tokens seen 512 per step, evaluated after
// steps 0, 5, 10, 15): the book draws them at torch.linspace(0, 2, 4).
const char* const kBookMetrics =
    "{\"iter\": 1, \"epoch\": 1, \"train_loss\": 9.8, \"val_loss\": 9.9, \"tokens_seen\": 512, "
    "\"num_epochs\": 2}\n"
    "{\"iter\": 6, \"epoch\": 1, \"train_loss\": 8.1, \"val_loss\": 8.3, \"tokens_seen\": 3072, "
    "\"num_epochs\": 2}\n"
    "{\"iter\": 11, \"epoch\": 2, \"train_loss\": 6.6, \"val_loss\": 7.0, \"tokens_seen\": 5632, "
    "\"num_epochs\": 2}\n"
    "{\"iter\": 16, \"epoch\": 2, \"train_loss\": 6.0, \"val_loss\": 6.6, \"tokens_seen\": 8192, "
    "\"num_epochs\": 2}\n";

}  // namespace

TEST(LineChart, BookMetricsDrawLossAgainstEpochsWithTokensSeenOnTop) {
  const auto records = attn::plot::read_metrics(write_text("book.jsonl", kBookMetrics));
  ASSERT_EQ(records.size(), 4u);
  ASSERT_TRUE(records[1].tokens_seen.has_value());
  EXPECT_EQ(*records[1].tokens_seen, 3072);
  const auto chart = attn::plot::loss_chart(records);
  EXPECT_EQ(chart.x_label, "Epochs");
  EXPECT_EQ(chart.y_label, "Loss");
  ASSERT_EQ(chart.series.size(), 2u);
  EXPECT_EQ(chart.series[0].name, "Training loss");
  EXPECT_EQ(chart.series[1].name, "Validation loss");
  EXPECT_FALSE(chart.series[0].dash_dot);
  EXPECT_TRUE(chart.series[1].dash_dot);  // linestyle="-."
  // torch.linspace(0, 2, 4) = [0, 2/3, 4/3, 2]
  ASSERT_EQ(chart.series[0].x.size(), 4u);
  EXPECT_DOUBLE_EQ(chart.series[0].x[0], 0.0);
  EXPECT_NEAR(chart.series[0].x[1], 2.0 / 3.0, 1e-15);
  EXPECT_NEAR(chart.series[0].x[2], 4.0 / 3.0, 1e-15);
  EXPECT_DOUBLE_EQ(chart.series[0].x[3], 2.0);
  EXPECT_EQ(chart.series[1].y, (std::vector<double>{9.9, 8.3, 7.0, 6.6}));
  ASSERT_TRUE(chart.top_axis.has_value());
  EXPECT_EQ(chart.top_axis->label, "Tokens seen");
  // The top axis: the first evaluation's tokens at epoch 0, the last's at epoch 2.
  const auto L = attn::plot::chart_layout(chart);
  EXPECT_NEAR(L.top_px(512), L.px(0.0), 1e-9);
  EXPECT_NEAR(L.top_px(8192), L.px(2.0), 1e-9);
  ASSERT_GE(L.top_ticks.size(), 3u);
  for (double t : L.top_ticks) {
    EXPECT_GE(L.top_px(t), L.plot.x - 1e-9) << t;
    EXPECT_LE(L.top_px(t), L.plot.x + L.plot.w + 1e-9) << t;
  }
  // The plot area starts lower than the nanoGPT chart's, under the top axis.
  const auto plain = attn::plot::chart_layout(
      attn::plot::loss_chart(attn::plot::read_metrics(write_text("m.jsonl", kMetrics))));
  EXPECT_GT(L.plot.y, plain.plot.y);
  // Rendered: both colours present, the validation's dash-dot leaves gaps (fewer pixels).
  const std::string dir = attn::test::temp_path("book_loss");
  fs::create_directory(dir);
  attn::plot::write_loss_curve(write_text("book2.jsonl", kBookMetrics), dir + "/loss.svg");
  const Image rendered = attn::test::render_svg_file(dir + "/loss.svg");
  ASSERT_EQ(rendered.width, attn::plot::kChartWidth);
  const int train_px = count_colour(rendered, attn::plot::kTrainColour, 8);
  const int val_px = count_colour(rendered, attn::plot::kValidationColour, 8);
  EXPECT_GT(train_px, 200);
  EXPECT_GT(val_px, 100);
  fs::remove_all(dir);
}

// Without tokens_seen and num_epochs on every line it is the iteration chart.
TEST(LineChart, MetricsWithoutTokensSeenKeepTheIterationChart) {
  const auto chart =
      attn::plot::loss_chart(attn::plot::read_metrics(write_text("m2.jsonl", kMetrics)));
  EXPECT_EQ(chart.x_label, "iteration");
  EXPECT_FALSE(chart.top_axis.has_value());
}
