// `attn plot mask` (src/plot/mask_figure.h): the pictures read off the sdpa
// reference agree with the rules of docs/sdpa.md written out here by hand, and
// the CLI draws them or refuses bad input with one line.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

#include "cli.h"
#include "plot/mask_figure.h"

namespace {

using attn::plot::Figure;
using attn::plot::MaskFigureOptions;
using attn::plot::MaskKind;

// Options of kind k with some fields set (designated initializers would have to name all).
MaskFigureOptions opts(MaskKind k, int64_t tq = 8, int64_t tk = 8, int64_t window_left = 3,
                       int64_t heads = 4, int64_t kv_heads = 2) {
  MaskFigureOptions o;
  o.kind = k, o.tq = tq, o.tk = tk, o.window_left = window_left, o.heads = heads,
  o.kv_heads = kv_heads;
  return o;
}

// Whether query i may see key j: j <= i + delta (and j >= i + delta - w when w >= 0).
bool allowed(int64_t i, int64_t j, int64_t delta, int64_t w = -1) {
  return j <= i + delta && (w < 0 || j >= i + delta - w);
}

void expect_uniform_band(const Figure& f, int64_t tq, int64_t tk, int64_t delta, int64_t w = -1) {
  ASSERT_EQ(f.panels.size(), 1u);
  const auto& p = f.panels[0];
  ASSERT_EQ(p.rows, tq);
  ASSERT_EQ(p.cols, tk);
  for (int64_t i = 0; i < tq; ++i) {
    int64_t n = 0;
    for (int64_t j = 0; j < tk; ++j) n += allowed(i, j, delta, w) ? 1 : 0;
    for (int64_t j = 0; j < tk; ++j) {
      SCOPED_TRACE(testing::Message() << "i=" << i << " j=" << j);
      EXPECT_EQ(p.is_masked(i, j), !allowed(i, j, delta, w));
      if (allowed(i, j, delta, w)) {
        EXPECT_NEAR(p.values[size_t(i * tk + j)], 1.0 / double(n), 1e-6);
      }
    }
  }
}

TEST(MaskFigure, CausalTopLeftIsTrilOfTqByTk) {
  const Figure f = attn::plot::mask_figure(opts(MaskKind::kCausal, 3, 5));
  expect_uniform_band(f, 3, 5, 0);
}

TEST(MaskFigure, CausalBottomRightShiftsTheDiagonalByTkMinusTq) {
  expect_uniform_band(
      attn::plot::mask_figure(opts(MaskKind::kCausalBottomRight, 3, 5)), 3, 5, 2);
  // More queries than keys: the first Tq - Tk rows see no key at all.
  const Figure f = attn::plot::mask_figure(opts(MaskKind::kCausalBottomRight, 5, 3));
  expect_uniform_band(f, 5, 3, -2);
  for (int64_t j = 0; j < 3; ++j) EXPECT_TRUE(f.panels[0].is_masked(0, j));
}

TEST(MaskFigure, WindowKeepsWindowLeftKeysBeforeTheDiagonal) {
  expect_uniform_band(
      attn::plot::mask_figure(opts(MaskKind::kWindow, 7, 7, 2)), 7,
      7, 0, 2);
  expect_uniform_band(
      attn::plot::mask_figure(opts(MaskKind::kWindow, 3, 8, 0)), 3,
      8, 5, 0);
}

TEST(MaskFigure, AlibiPanelsAreTheBiasOfEachHeadsSlope) {
  const Figure f =
      attn::plot::mask_figure(opts(MaskKind::kAlibi, 4, 6, 3, 4));
  ASSERT_EQ(f.panels.size(), 4u);
  for (int64_t h = 0; h < 4; ++h) {
    const double slope = std::exp2(-8.0 * double(h + 1) / 4.0);  // Press et al.
    const auto& p = f.panels[size_t(h)];
    for (int64_t i = 0; i < 4; ++i) {
      for (int64_t j = 0; j < 6; ++j) {
        SCOPED_TRACE(testing::Message() << "h=" << h << " i=" << i << " j=" << j);
        ASSERT_EQ(p.is_masked(i, j), j > i + 2);
        if (j <= i + 2) {
          EXPECT_NEAR(p.values[size_t(i * 6 + j)], -slope * double(i + 2 - j), 2e-5);
        }
      }
    }
  }
  EXPECT_LT(f.vmin, f.vmax);
}

TEST(MaskFigure, GqaRowsNameEachQueryHeadsKvHead) {
  const Figure f =
      attn::plot::mask_figure(opts(MaskKind::kGqa, 8, 8, 3, 8, 2));
  ASSERT_EQ(f.panels.size(), 1u);
  const auto& p = f.panels[0];
  ASSERT_EQ(p.rows, 8);
  ASSERT_EQ(p.cols, 2);
  for (int64_t h = 0; h < 8; ++h)
    for (int64_t g = 0; g < 2; ++g) {
      EXPECT_EQ(p.values[size_t(h * 2 + g)], g == h / 4 ? 1.0f : 0.0f);
      EXPECT_EQ(p.is_masked(h, g), g != h / 4);
    }
}

TEST(MaskFigure, VarlenIsCausalBlocksOnTheDiagonal) {
  MaskFigureOptions o = opts(MaskKind::kVarlen);
  o.seqlens = {3, 1, 4};
  const Figure f = attn::plot::mask_figure(o);
  ASSERT_EQ(f.panels.size(), 1u);
  const auto& p = f.panels[0];
  ASSERT_EQ(p.rows, 8);
  ASSERT_EQ(p.cols, 8);
  const int64_t start[8] = {0, 0, 0, 3, 4, 4, 4, 4};  // each token's sequence start
  for (int64_t i = 0; i < 8; ++i)
    for (int64_t j = 0; j < 8; ++j) {
      SCOPED_TRACE(testing::Message() << "i=" << i << " j=" << j);
      const bool seen = j >= start[i] && j <= i;
      EXPECT_EQ(p.is_masked(i, j), !seen);
      if (seen) {
        EXPECT_NEAR(p.values[size_t(i * 8 + j)], 1.0 / double(i - start[i] + 1), 1e-6);
      }
    }
  o.seqlens = {};
  EXPECT_THROW(attn::plot::mask_figure(o), std::invalid_argument);
  o.seqlens = {3, 0};
  EXPECT_THROW(attn::plot::mask_figure(o), std::invalid_argument);
  o.seqlens = {40, 30};
  EXPECT_THROW(attn::plot::mask_figure(o), std::invalid_argument);
}

TEST(MaskFigure, BadOptionsAreRefusedNamingTheValues) {
  auto message = [](const MaskFigureOptions& o) {
    try {
      attn::plot::mask_figure(o);
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message(opts(MaskKind::kGqa, 8, 8, 3, 6, 4)).find("6 is not a multiple of --kv-heads 4"),
            std::string::npos);
  EXPECT_NE(message(opts(MaskKind::kCausal, 0)).find("got 0"), std::string::npos);
  EXPECT_NE(message(opts(MaskKind::kCausal, 8, 65)).find("got 65"), std::string::npos);
  EXPECT_NE(message(opts(MaskKind::kWindow, 8, 8, -2)).find("got -2"), std::string::npos);
  EXPECT_THROW(attn::plot::mask_kind_from_name("diagonal"), std::invalid_argument);
  EXPECT_EQ(attn::plot::mask_kind_from_name("causal-bottom-right"), MaskKind::kCausalBottomRight);
}

TEST(PlotMaskCli, DrawsEachKindOnTheTerminalAndToFiles) {
  for (const char* kind : {"causal", "causal-bottom-right", "window", "alibi", "varlen", "gqa"}) {
    SCOPED_TRACE(kind);
    const auto r = attn::test::run_cli(std::string("plot mask --kind ") + kind + " --tq 4 --tk 6");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(r.out.find('\x1b'), std::string::npos);  // not a terminal: numbers, no escapes
    EXPECT_NE(r.out.find("\n"), std::string::npos);
  }
  const auto t = attn::test::run_cli("plot mask --kind causal --tq 2 --tk 3");
  EXPECT_NE(t.out.find("top-left"), std::string::npos) << t.out;
  EXPECT_NE(t.out.find("0.50"), std::string::npos) << t.out;  // row 1 sees 2 keys
  const std::string svg = attn::test::temp_path("mask.svg");
  const auto w = attn::test::run_cli(
      "plot mask --kind window --tq 8 --tk 8 --sliding-window-size 3 --out '" + svg + "'");
  ASSERT_EQ(w.exit_code, 0) << w.err;
  EXPECT_NE(attn::test::read_text(svg).find("<svg"), std::string::npos);
}

TEST(PlotMaskCli, BadInputIsOneLineOnStderr) {
  for (const char* args :
       {"plot mask --kind diagonal", "plot mask --kind gqa --heads 6 --kv-heads 4",
        "plot mask --kind causal --tq 100", "plot mask --kind causal --out m.gif",
        "plot mask --kind window --sliding-window-size 0"}) {
    SCOPED_TRACE(args);
    const auto r = attn::test::run_cli(args);
    EXPECT_NE(r.exit_code, 0);
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  }
}

}  // namespace
