// attention_figure.h - the figure of `attn plot attention`: every head of one or
// more layers of a trained model, for one text (attn_plot; no model code here:
// the caller runs the model and hands over the weights).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "plot/heatmap.h"

namespace attn::plot {

// A character as a label that can be seen: ' ' -> "␣", '\n' -> "⏎", '\t' -> "⇥",
// '\r' -> "␍", another control character c < 0x20 -> U+2400 + c ("␀".."␟"),
// DEL -> "␡"; anything else as it is.
std::string visible_label(const std::string& character);

// One layer's softmax weights for one sequence: (heads, T, T), row-major.
struct LayerAttention {
  int64_t layer = 0;  // the block's index (trf_blocks.N), as labelled
  int64_t heads = 0, tokens = 0;
  std::vector<float> weights;  // (heads, tokens, tokens)
};

// One panel per head per layer, titled "layer L head H", in layer order and head
// order within a layer; with more than one layer each layer is a row of panels
// (Figure::panels_per_row = heads). Rows and columns are labelled with the
// characters (visible_label); the future (key after query) is masked; the scale
// is [0, 1]. characters.size() must equal every layer's tokens.
Figure model_attention_figure(const std::vector<LayerAttention>& layers,
                              const std::vector<std::string>& characters, const std::string& title);

}  // namespace attn::plot
