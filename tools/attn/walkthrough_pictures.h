// walkthrough_pictures.h - the walkthrough's attention matrices as pictures:
// `attn walkthrough --plot DIR` (SVG + PNG files and an index), `--html FILE`
// (one self-contained page: every step, its tensor and its heatmap) and
// `--heatmap` (truecolour blocks in the terminal).
//
// All three draw exactly the entries of run_walkthrough_ch3() that carry an
// AttentionMatrix, with src/plot (attn_plot).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "plot/heatmap.h"
#include "walkthrough_ch3.h"

namespace attn::cli {

// The figure of one entry (entry.attention must be set): one panel per head,
// tokens as labels, the causal future and -inf cells masked; weights on the
// scale [0, max(1, largest weight)], scores on the range of their unmasked values.
plot::Figure attention_figure(const Shown& entry);

// The file name stem of the n-th picture (n from 1): "07-causal-attn_weights_causal".
std::string picture_stem(size_t n, const Shown& entry);

// Writes NN-section-name.svg and .png for every attention matrix, and index.html
// listing them, into dir (created if missing). Everything is drawn before the
// first file is written, and each file is written atomically. Returns the paths.
std::vector<std::string> write_plots(const std::vector<Shown>& shown, const std::string& dir);

// The whole walkthrough as one HTML page with no external resource: styles,
// script and pictures (SVG as data: URIs) inline. Every tensor is a
// <pre class="tensor">, every attention matrix a <figure class="heatmap"> whose
// cells show their value, query and key when hovered (or tapped).
std::string walkthrough_html(const std::vector<Shown>& shown, const std::optional<uint64_t>& seed);

// The attention matrices as terminal heatmaps under their section headers and
// explanations (plot::terminal_heatmap; colour or plain).
std::string walkthrough_heatmaps(const std::vector<Shown>& shown, bool colour);

// Colour on stdout: a terminal, and NO_COLOR unset or empty (no-color.org).
bool stdout_wants_colour();

}  // namespace attn::cli
