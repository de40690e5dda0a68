// attention_figure.cpp - the figure of `attn plot attention` (attention_figure.h).
#include "plot/attention_figure.h"

#include <fmt/format.h>

#include <stdexcept>

namespace attn::plot {

std::string visible_label(const std::string& c) {
  if (c == " ") return "\u2423";   // ␣
  if (c == "\n") return "\u23CE";  // ⏎
  if (c == "\t") return "\u21E5";  // ⇥
  if (c.size() == 1) {
    const auto u = static_cast<unsigned char>(c[0]);
    if (u < 0x20) {  // the Control Pictures block: U+2400 + u, as UTF-8 E2 90 (80 + u)
      return std::string{'\xE2', '\x90', static_cast<char>(0x80 + u)};
    }
    if (u == 0x7F) return "\u2421";  // ␡
  }
  return c;
}

Figure model_attention_figure(const std::vector<LayerAttention>& layers,
                              const std::vector<std::string>& characters, const std::string& title) {
  if (layers.empty()) throw std::invalid_argument("model_attention_figure: no layers");
  std::vector<std::string> labels;
  for (const auto& c : characters) labels.push_back(visible_label(c));
  const auto T = static_cast<int64_t>(characters.size());
  Figure f;
  f.title = title;
  f.vmin = 0.0;
  f.vmax = 1.0;
  for (const LayerAttention& l : layers) {
    if (l.tokens != T || l.heads < 1 ||
        l.weights.size() != static_cast<size_t>(l.heads * l.tokens * l.tokens))
      throw std::invalid_argument(fmt::format(
          "model_attention_figure: layer {} has {} heads of {} tokens and {} weights, for {} "
          "characters",
          l.layer, l.heads, l.tokens, l.weights.size(), T));
    for (int64_t h = 0; h < l.heads; ++h) {
      Panel p;
      p.title = fmt::format("layer {} head {}", l.layer, h);
      p.rows = p.cols = T;
      const auto begin = l.weights.begin() + static_cast<std::ptrdiff_t>(h * T * T);
      p.values.assign(begin, begin + static_cast<std::ptrdiff_t>(T * T));
      p.masked.resize(static_cast<size_t>(T * T));
      for (int64_t i = 0; i < T; ++i)
        for (int64_t j = 0; j < T; ++j) p.masked[static_cast<size_t>(i * T + j)] = j > i;
      p.row_labels = labels;
      p.col_labels = labels;
      f.panels.push_back(std::move(p));
    }
  }
  if (layers.size() > 1) f.panels_per_row = layers.front().heads;
  return f;
}

}  // namespace attn::plot
