// Heatmaps (src/plot, attn_plot): the colour scale, the checks on a figure, the
// PNG and SVG pictures read back pixel by pixel (the SVG rendered by librsvg's
// rsvg-convert), and the terminal form.
#include <gtest/gtest-spi.h>
#include <gtest/gtest.h>

#include <cmath>
#include <stdexcept>
#include <string>

#include "cli.h"
#include "pictures.h"
#include "plot/heatmap.h"

namespace {

using attn::plot::Figure;
using attn::plot::Panel;
using attn::plot::Rgb;
using attn::test::Image;

// A causal 4x4 weight matrix with a known large weight at (0, 0), and a second
// panel (head) with different values, on the scale [0, 1].
Figure two_head_causal() {
  Figure f;
  f.title = "test figure";
  const std::vector<std::string> tokens = {"Your", "journey", "starts", "with"};
  for (int h = 0; h < 2; ++h) {
    Panel p;
    p.title = "head " + std::to_string(h);
    p.rows = p.cols = 4;
    p.row_labels = p.col_labels = tokens;
    for (int i = 0; i < 4; ++i) {
      for (int j = 0; j < 4; ++j) {
        const bool future = j > i;
        // Row i spreads its weight over keys 0..i; head 1 favours the last key.
        float v = 0.0f;
        if (!future)
          v = h == 0 ? (i == 0 ? 1.0f : (j == 0 ? 0.7f : 0.3f / static_cast<float>(i)))
                     : (j == i ? 0.9f : (i == 0 ? 0.1f : 0.1f / static_cast<float>(i)));
        if (i == 0 && j == 0) v = 1.0f;
        p.values.push_back(v);
        p.masked.push_back(future);
      }
    }
    f.panels.push_back(p);
  }
  f.vmin = 0.0;
  f.vmax = 1.0;
  return f;
}

std::string write_bytes(const std::string& stem, const std::string& bytes) {
  const std::string path = attn::test::temp_path(stem);
  FILE* f = std::fopen(path.c_str(), "wb");
  EXPECT_NE(f, nullptr) << path;
  if (f != nullptr) {
    std::fwrite(bytes.data(), 1, bytes.size(), f);
    std::fclose(f);
  }
  return path;
}

TEST(Heatmap, ScaleColourIsTheTableAtItsSamplesAndInterpolatesBetween) {
  for (int k = 0; k < 9; ++k)
    EXPECT_EQ(attn::plot::scale_colour(k / 8.0), attn::plot::kScaleTable[k]) << k;
  // Halfway between samples 0 (68, 1, 84) and 1 (71, 44, 122): rounded means.
  EXPECT_EQ(attn::plot::scale_colour(1.0 / 16), (Rgb{70, 23, 103}));
  EXPECT_EQ(attn::plot::scale_colour(-3.0), attn::plot::kScaleTable[0]);
  EXPECT_EQ(attn::plot::scale_colour(7.0), attn::plot::kScaleTable[8]);
  EXPECT_EQ(attn::plot::scale_colour(std::nan("")), attn::plot::kScaleTable[0]);
  // Monotone in lightness (viridis is): green + red rises from dark to light.
  int last = -1;
  for (int k = 0; k <= 64; ++k) {
    const Rgb c = attn::plot::scale_colour(k / 64.0);
    EXPECT_GE(c.r + c.g, last) << k;
    last = c.r + c.g;
  }
}

TEST(Heatmap, CellColourUsesTheFigureScaleAndTheMaskedColour) {
  Figure f = two_head_causal();
  f.vmin = -1.0;
  f.vmax = 3.0;  // 1.0 sits at t = 0.5: the middle sample
  EXPECT_EQ(attn::plot::cell_colour(f, 0, 0, 0), attn::plot::kScaleTable[4]);
  EXPECT_EQ(attn::plot::cell_colour(f, 0, 0, 1), attn::plot::kMaskedColour);
  EXPECT_NE(attn::plot::kMaskedColour, attn::plot::scale_colour(0.0));
}

TEST(Heatmap, BadFiguresAreRefusedNamingTheValues) {
  Figure f = two_head_causal();
  f.panels[1].values.pop_back();
  try {
    attn::plot::check(f);
    FAIL() << "a short panel was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("shape (4, 4) but 15 values"), std::string::npos)
        << e.what();
  }
  f = two_head_causal();
  f.vmin = f.vmax = 0.5;
  EXPECT_THROW(attn::plot::check(f), std::invalid_argument);
  f = two_head_causal();
  f.panels[0].values[1] = -INFINITY;  // masked: fine
  EXPECT_NO_THROW(attn::plot::check(f));
  f.panels[0].values[0] = NAN;  // not masked
  EXPECT_THROW(attn::plot::render_png(f), std::invalid_argument);
  f = two_head_causal();
  f.panels.clear();
  EXPECT_THROW(attn::plot::render_svg(f), std::invalid_argument);
}

TEST(Heatmap, FitScaleSpansTheUnmaskedFiniteValues) {
  Figure f = two_head_causal();
  f.panels[0].values[1] = 50.0f;  // masked: ignored
  f.panels[1].values[0] = -2.0f;
  attn::plot::fit_scale(f);
  EXPECT_EQ(f.vmin, -2.0);
  EXPECT_EQ(f.vmax, 1.0);
}

// The PNG attn draws: its size is the layout's, every cell has its colour, the
// known large weight is the top of the scale, masked cells are masked.
TEST(Heatmap, PngCellsHaveTheScaleColours) {
  const Figure f = two_head_causal();
  const attn::plot::Layout layout = attn::plot::layout(f);
  const Image png = attn::test::load_png(write_bytes("heatmap.png", attn::plot::render_png(f)));
  ASSERT_EQ(png.width, layout.width);
  ASSERT_EQ(png.height, layout.height);
  EXPECT_TRUE(layout.values_written);
  EXPECT_EQ(attn::test::wrong_cells(png, f, 0, "render_png"), 0);
  const attn::plot::Rect big = layout.cell_rect(0, 0, 0);
  EXPECT_EQ(png.at(static_cast<int>(big.x) + 4, static_cast<int>(big.y) + 4),
            attn::plot::kScaleTable[8]);
  const attn::plot::Rect future = layout.cell_rect(1, 0, 3);
  EXPECT_EQ(png.at(static_cast<int>(future.x) + 4, static_cast<int>(future.y) + 4),
            attn::plot::kMaskedColour);
  // The value is written at the cell's centre: the pixels there are not all the cell's colour.
  int other = 0;
  for (int dy = -6; dy <= 6; ++dy) {
    for (int dx = -14; dx <= 14; ++dx) {
      const Rgb c = png.at(static_cast<int>(big.x + big.w / 2) + dx,
                           static_cast<int>(big.y + big.h / 2) + dy);
      other += attn::test::colour_distance(c, attn::plot::kScaleTable[8]) > 60 ? 1 : 0;
    }
  }
  EXPECT_GT(other, 10) << "no value written in the cell of weight 1.00";
}

// The SVG rendered by librsvg: the layout's size, every cell its colour; and the
// PNG attn writes agrees with it (same size, same cells, text within anti-aliasing).
TEST(Heatmap, SvgRenderedByRsvgMatchesTheScaleAndThePng) {
  const Figure f = two_head_causal();
  const attn::plot::Layout layout = attn::plot::layout(f);
  const std::string svg = attn::plot::render_svg(f);
  EXPECT_EQ(svg.rfind("<?xml", 0), 0u);
  EXPECT_NE(svg.find("width=\"" + std::to_string(layout.width) + "px\""), std::string::npos);
  const Image rendered = attn::test::render_svg_file(write_bytes("heatmap.svg", svg));
  ASSERT_EQ(rendered.width, layout.width);
  ASSERT_EQ(rendered.height, layout.height);
  EXPECT_EQ(attn::test::wrong_cells(rendered, f, 1, "rsvg-convert"), 0);

  const Image png = attn::test::load_png(write_bytes("heatmap.png", attn::plot::render_png(f)));
  ASSERT_EQ(png.width, rendered.width);
  ASSERT_EQ(png.height, rendered.height);
  size_t differ = 0;
  for (size_t k = 0; k < png.pixels.size(); ++k) {
    differ += attn::test::colour_distance(png.pixels[k], rendered.pixels[k]) > 48 ? 1 : 0;
  }
  EXPECT_LT(static_cast<double>(differ), 0.01 * static_cast<double>(png.pixels.size()))
      << differ << " of " << png.pixels.size()
      << " pixels differ between attn's PNG and the rendered SVG";
}

// The pixel check itself: a picture drawn with another scale, or with a cell
// unmasked, is caught cell by cell.
TEST(Heatmap, TheCellCheckCatchesAWrongScaleAndAWrongMask) {
  const Figure f = two_head_causal();
  const Image png = attn::test::load_png(write_bytes("heatmap.png", attn::plot::render_png(f)));
  Figure other_scale = f;
  other_scale.vmax = 2.0;
  // Every unmasked cell but the zeros changes colour: 2 panels x 10 cells.
  EXPECT_EQ(attn::test::wrong_cells(png, other_scale, 1, "other scale", /*report=*/false), 20);
  Figure unmasked = f;
  unmasked.panels[1].masked[3] = false;  // head 1, query 0, key 3
  EXPECT_NONFATAL_FAILURE(EXPECT_EQ(attn::test::wrong_cells(png, unmasked, 1, "unmasked"), 1),
                          "panel 1, query 0, key 3");
}

TEST(Heatmap, LargeMatricesAreDrawnWithoutValues) {
  Figure f;
  Panel p;
  p.rows = p.cols = 40;
  for (int i = 0; i < 40; ++i) {
    p.row_labels.push_back(std::to_string(i));
    p.col_labels.push_back(std::to_string(i));
  }
  for (int k = 0; k < 1600; ++k) p.values.push_back(static_cast<float>(k) / 1600.0f);
  f.panels.push_back(p);
  attn::plot::fit_scale(f);
  const attn::plot::Layout layout = attn::plot::layout(f);
  EXPECT_FALSE(layout.values_written);
  const Image png = attn::test::load_png(write_bytes("large.png", attn::plot::render_png(f)));
  ASSERT_EQ(png.width, layout.width);
  EXPECT_EQ(attn::test::wrong_cells(png, f, 0, "large"), 0);
}

TEST(Heatmap, TerminalColourIsTruecolourBlocksAndPlainHasNoEscapes) {
  const Figure f = two_head_causal();
  const std::string colour = attn::plot::terminal_heatmap(f, true);
  EXPECT_NE(colour.find("\x1b[48;2;253;231;37m"), std::string::npos) << colour;  // weight 1.0
  EXPECT_NE(colour.find("\x1b[48;2;208;208;208m"), std::string::npos);           // masked
  const Rgb c = attn::plot::scale_colour(0.7);                                   // head 0, (1, 0)
  EXPECT_NE(colour.find("\x1b[48;2;" + std::to_string(c.r) + ";" + std::to_string(c.g) + ";" +
                        std::to_string(c.b) + "m"),
            std::string::npos);
  EXPECT_NE(colour.find("journ"), std::string::npos);
  const std::string plain = attn::plot::terminal_heatmap(f, false);
  EXPECT_EQ(plain.find('\x1b'), std::string::npos) << plain;
  EXPECT_NE(plain.find("journey   0.70  0.30     ·     ·"), std::string::npos) << plain;
  EXPECT_NE(plain.find("   Your   1.00     ·     ·     ·"), std::string::npos) << plain;
}

}  // namespace
