// heatmap.h - pictures of attention matrices (library attn_plot, used by the CLI).
//
// A Figure is one or more panels (one per head) that share one colour scale.
// Each panel is a (rows, cols) matrix, queries down and keys across, drawn as
// coloured cells with the tokens as labels, the value written in each cell when
// the matrix is small enough to read (at most kMaxWrittenSide on each side), a
// colour bar with its ticks on the right, and masked cells (a causal mask's
// future, or -inf scores) in kMaskedColour with a "masked" legend swatch, never
// as the colour of zero.
//
// One drawing routine renders through cairo to SVG (vector, glyphs as paths)
// and to PNG (the same picture rasterised at 1 px per SVG unit), so the two
// agree pixel for pixel up to anti-aliasing. layout() gives the geometry the
// drawing uses (every cell's rectangle), so tests can find a cell's pixels.
//
// The terminal form (terminal_heatmap) draws the same figure as truecolour
// blocks, or as plain numbers without escape sequences.
//
// This lives apart from the library attn so that attn's own dependencies stay
// BLAS, OpenMP, fmt and Highway; attn_plot adds cairo, privately.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace attn::plot {

struct Rgb {
  uint8_t r = 0, g = 0, b = 0;
  bool operator==(const Rgb&) const = default;
};

// The colour scale: viridis (dark purple -> blue -> green -> yellow), sampled at
// nine evenly spaced points (kScaleTable) and interpolated linearly per channel
// between the two nearest samples, rounding to the nearest integer. t is clamped
// to [0, 1]; 0 is the figure's vmin, 1 its vmax.
inline constexpr Rgb kScaleTable[9] = {{68, 1, 84},    {71, 44, 122},  {59, 81, 139},
                                       {44, 113, 142}, {33, 144, 141}, {39, 173, 129},
                                       {92, 200, 99},  {170, 220, 50}, {253, 231, 37}};
Rgb scale_colour(double t);

// Masked cells, and the legend swatch that names them.
inline constexpr Rgb kMaskedColour = {208, 208, 208};
inline constexpr Rgb kBackground = {255, 255, 255};

// Values are written in the cells of panels at most this many cells on a side.
inline constexpr int64_t kMaxWrittenSide = 12;

// One matrix: values row-major (rows * cols), masked[i * cols + j] true where
// the cell is masked (its value is then not drawn); row_labels are the queries,
// col_labels the keys.
struct Panel {
  std::string title;
  int64_t rows = 0, cols = 0;
  std::vector<float> values;            // (rows, cols)
  std::vector<bool> masked;             // (rows, cols); empty: nothing masked
  std::vector<std::string> row_labels;  // rows
  std::vector<std::string> col_labels;  // cols
  bool is_masked(int64_t i, int64_t j) const {
    return !masked.empty() && masked[static_cast<size_t>(i * cols + j)];
  }
};

// Panels side by side (or in rows, panels_per_row) on one scale [vmin, vmax] (vmin < vmax).
struct Figure {
  std::string title;
  std::vector<Panel> panels;
  double vmin = 0.0, vmax = 1.0;
  // Panels per row: 0 puts them all in one row; n > 0 wraps them into rows of n
  // (e.g. one row per layer, one panel per head), the colour bar beside the first.
  int64_t panels_per_row = 0;
};

// Throws std::invalid_argument naming the values when a figure cannot be drawn:
// no panels, a panel without cells, values/masked/labels of the wrong length,
// vmin >= vmax or non-finite, a non-finite value in an unmasked cell.
void check(const Figure& figure);

// [vmin, vmax] spanning the finite values of the unmasked cells; widened by 0.5
// on each side when they are all equal, [0, 1] when there are none.
void fit_scale(Figure& figure);

// The position of v on the figure's scale, clamped to [0, 1], and its colour.
double scale_position(const Figure& figure, float v);
// The colour of cell (i, j) of panel p: kMaskedColour if masked, else the scale's.
Rgb cell_colour(const Figure& figure, int64_t p, int64_t i, int64_t j);

struct Rect {
  double x = 0, y = 0, w = 0, h = 0;  // in pixels (SVG px), from the top left
};

// Where everything goes. Cells are squares of side `cell`; cell (i, j) of panel p
// is {grids[p].x + j * cell, grids[p].y + i * cell, cell, cell}.
struct Layout {
  int width = 0, height = 0;  // the whole picture
  double cell = 0;
  bool values_written = false;  // values drawn in the cells
  std::vector<Rect> grids;      // one per panel
  Rect colour_bar;              // vmax at the top, vmin at the bottom
  Rect masked_swatch;           // w == 0 when no cell is masked
  Rect cell_rect(int64_t p, int64_t i, int64_t j) const;
};
Layout layout(const Figure& figure);  // check()s the figure

// The picture as an SVG document (px units, width x height) and as PNG bytes.
std::string render_svg(const Figure& figure);
std::string render_png(const Figure& figure);

// The figure for a terminal: with colour, each cell two spaces on a truecolour
// background (ESC[48;2;r;g;bm), masked cells as a dim "··"; without, each cell
// its value to two decimals and masked cells as "·". Rows are labelled with the
// row labels, columns with the first characters of the column labels; a scale
// line follows. No escape sequence at all when colour is false.
std::string terminal_heatmap(const Figure& figure, bool colour);

}  // namespace attn::plot
