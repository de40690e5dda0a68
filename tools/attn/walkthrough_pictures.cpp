// walkthrough_pictures.cpp - --plot, --html and --heatmap of `attn walkthrough`.
#include "walkthrough_pictures.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <stdexcept>
#include <system_error>

#include "attn/print.h"
#include "attn/utf8.h"
#include "command.h"

namespace attn::cli {
namespace {

std::string escape_html(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

std::string base64(const std::string& bytes) {
  static const char* const kDigits =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  out.reserve((bytes.size() + 2) / 3 * 4);
  for (size_t i = 0; i < bytes.size(); i += 3) {
    const size_t n = std::min<size_t>(3, bytes.size() - i);
    uint32_t v = 0;
    for (size_t k = 0; k < 3; ++k) {
      v = (v << 8) | (k < n ? static_cast<unsigned char>(bytes[i + k]) : 0u);
    }
    for (size_t k = 0; k < 4; ++k) {
      out += k <= n ? kDigits[(v >> (18 - 6 * k)) & 63u] : '=';
    }
  }
  return out;
}

// "dropout(attn_weights)" -> "dropout_attn_weights".
std::string slug(const std::string& name) {
  std::string out;
  for (char c : name) {
    const bool keep = std::isalnum(static_cast<unsigned char>(c)) != 0;
    if (keep) {
      out += c;
    } else if (!out.empty() && out.back() != '_') {
      out += '_';
    }
  }
  while (!out.empty() && out.back() == '_') out.pop_back();
  return out;
}

const WalkthroughSection& section_info(const std::string& name) {
  for (const auto& s : walkthrough_ch3_sections()) {
    if (s.name == name) return s;
  }
  throw std::logic_error(fmt::format("no walkthrough section '{}'", printable(name)));
}

// The figure's title: what it is and where it comes from.
std::string figure_title(const Shown& entry) {
  return fmt::format("{}   [{}]", printable(entry.name), entry.section);
}

// A value as the hover text gives it.
std::string value_text(float v) {
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  return fmt::format("{:.4f}", v);
}

}  // namespace

plot::Figure attention_figure(const Shown& entry) {
  if (!entry.attention) {
    throw std::invalid_argument(fmt::format("'{}' is not an attention matrix", printable(entry.name)));
  }
  const AttentionMatrix& a = *entry.attention;
  const Tensor& w = a.weights;
  if (w.dim() != 2 && w.dim() != 3) {
    throw std::invalid_argument(
        fmt::format("attention matrix '{}': shape {} is not (T_q, T_k) or (H, T_q, T_k)",
                    printable(entry.name), shape_str(w.shape())));
  }
  const int64_t heads = w.dim() == 3 ? w.size(0) : 1;
  const int64_t rows = w.size(-2), cols = w.size(-1);
  const std::vector<float> values = w.to_vector();  // (H, T_q, T_k) row-major
  plot::Figure f;
  f.title = figure_title(entry);
  float largest = 0.0f;
  for (int64_t h = 0; h < heads; ++h) {
    plot::Panel p;
    p.title = heads > 1 ? fmt::format("head {}", h) : "";
    p.rows = rows;
    p.cols = cols;
    p.row_labels = a.queries;
    p.col_labels = a.keys;
    p.values.assign(values.begin() + h * rows * cols, values.begin() + (h + 1) * rows * cols);
    p.masked.assign(static_cast<size_t>(rows * cols), false);
    for (int64_t i = 0; i < rows; ++i) {
      for (int64_t j = 0; j < cols; ++j) {
        const auto k = static_cast<size_t>(i * cols + j);
        const float v = p.values[k];
        p.masked[k] = (a.causal && j > i) || !std::isfinite(v);
        if (!p.masked[k]) largest = std::max(largest, v);
      }
    }
    f.panels.push_back(std::move(p));
  }
  if (a.scores) {
    plot::fit_scale(f);
  } else {
    f.vmin = 0.0;
    f.vmax = std::max(1.0, static_cast<double>(largest));
  }
  plot::check(f);
  return f;
}

std::string picture_stem(size_t n, const Shown& entry) {
  return fmt::format("{:02}-{}-{}", n, entry.section, slug(entry.name));
}

std::vector<std::string> write_plots(const std::vector<Shown>& shown, const std::string& dir) {
  // Draw everything first: a failure leaves no file behind.
  struct Picture {
    std::string stem, svg, png;
    const Shown* entry;
  };
  std::vector<Picture> pictures;
  for (const Shown& s : shown) {
    if (!s.attention) continue;
    const plot::Figure f = attention_figure(s);
    pictures.push_back(
        {picture_stem(pictures.size() + 1, s), plot::render_svg(f), plot::render_png(f), &s});
  }
  std::string index = fmt::format(
      "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
      "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n"
      "<title>attn walkthrough: {} attention matrices</title>\n"
      "<style>body{{font-family:sans-serif;max-width:60rem;margin:1rem auto;padding:0 1rem}}"
      "img{{max-width:100%;height:auto}}li{{margin:0 0 2rem}}</style>\n</head>\n<body>\n"
      "<h1>attn walkthrough: the attention matrices</h1>\n<ol>\n",
      pictures.size());
  for (const Picture& p : pictures) {
    index += fmt::format(
        "<li id=\"{0}\"><p><code>{1}</code> ({2}): {3}{4}<br><a href=\"{0}.svg\">{0}.svg</a> "
        "<a href=\"{0}.png\">{0}.png</a></p><img src=\"{0}.svg\" alt=\"{1}\"></li>\n",
        p.stem, escape_html(p.entry->name), escape_html(p.entry->section),
        escape_html(p.entry->what),
        p.entry->attention->note.empty() ? ""
                                         : " &mdash; " + escape_html(p.entry->attention->note));
  }
  index += "</ol>\n</body>\n</html>\n";

  const std::filesystem::path folder(dir);
  std::error_code ec;
  std::filesystem::create_directories(folder, ec);
  if (ec || !std::filesystem::is_directory(folder)) {
    throw std::runtime_error(fmt::format("cannot create the folder '{}': {}", printable(dir),
                                         ec ? ec.message() : "a file of that name exists"));
  }
  std::vector<std::string> written;
  for (const Picture& p : pictures) {
    for (const auto& [ext, bytes] : {std::pair{".svg", &p.svg}, std::pair{".png", &p.png}}) {
      const std::string path = (folder / (p.stem + ext)).string();
      write_file_atomically(path, *bytes);
      written.push_back(path);
    }
  }
  const std::string index_path = (folder / "index.html").string();
  write_file_atomically(index_path, index);
  written.push_back(index_path);
  return written;
}

// ---- the HTML page ---------------------------------------------------------------------

namespace {

const char* const kStyle = R"(
:root{--fg:#1f2328;--muted:#59636e;--bg:#fff;--code:#f3f4f6;--line:#d8dee4;--accent:#3b528b}
*{box-sizing:border-box}
body{margin:0;background:var(--bg);color:var(--fg);font:16px/1.5 system-ui,-apple-system,"Segoe UI",Roboto,"DejaVu Sans",sans-serif}
main{max-width:62rem;margin:0 auto;padding:1rem 1rem 4rem}
h1{font-size:1.6rem;line-height:1.25;margin:.5rem 0}
h2{font-size:1.3rem;margin:2.5rem 0 .25rem;padding-top:.5rem;border-top:2px solid var(--line)}
h3{font-size:1rem;margin:1.5rem 0 .25rem}
p{margin:.25rem 0}
.intro{color:var(--muted)}
nav ol{columns:2 20rem;column-gap:2rem;padding-left:1.6rem;margin:.5rem 0}
pre{background:var(--code);border-radius:6px;padding:.5rem .75rem;overflow-x:auto;margin:.4rem 0;font:13px/1.45 ui-monospace,"DejaVu Sans Mono",monospace}
pre.torch{border-left:3px solid var(--accent);white-space:pre-wrap;overflow-wrap:anywhere}
.shape{color:var(--muted);font-size:.9rem}
figure{margin:.75rem 0}
figcaption{color:var(--muted);font-size:.9rem}
.plot{position:relative;display:inline-block;max-width:100%}
.plot img{display:block;max-width:100%;height:auto}
.cells{position:absolute;display:grid}
.cells span{cursor:crosshair}
.cells span:hover,.cells span.on{outline:2px solid #fff;outline-offset:-2px}
#tip{position:fixed;z-index:10;pointer-events:none;background:#1f2328;color:#fff;font:13px/1.4 ui-monospace,"DejaVu Sans Mono",monospace;padding:.3rem .5rem;border-radius:4px;display:none;white-space:nowrap}
@media (max-width:40rem){body{font-size:15px}main{padding:.5rem .6rem 3rem}pre{font-size:12px}}
)";

// Shows a cell's value, query and key next to the pointer (hover) or the finger (tap).
const char* const kScript = R"(
(function () {
  var tip = document.getElementById('tip');
  var on = null;
  function show(cell, x, y) {
    if (on) on.classList.remove('on');
    on = cell;
    cell.classList.add('on');
    tip.textContent = 'query ' + cell.dataset.q + ', key ' + cell.dataset.k + ': ' + cell.dataset.v;
    tip.style.display = 'block';
    var w = tip.offsetWidth, h = tip.offsetHeight;
    tip.style.left = Math.max(4, Math.min(x + 12, window.innerWidth - w - 4)) + 'px';
    tip.style.top = Math.max(4, y - h - 12) + 'px';
  }
  function hide() {
    if (on) on.classList.remove('on');
    on = null;
    tip.style.display = 'none';
  }
  document.addEventListener('pointermove', function (e) {
    var cell = e.target.closest ? e.target.closest('.cells span') : null;
    if (cell) show(cell, e.clientX, e.clientY); else if (e.pointerType === 'mouse') hide();
  });
  document.addEventListener('click', function (e) {
    var cell = e.target.closest ? e.target.closest('.cells span') : null;
    if (cell) show(cell, e.clientX, e.clientY); else hide();
  });
  window.addEventListener('scroll', hide, {passive: true});
})();
)";

std::string percent(double part, double whole) {
  return fmt::format("{:.4f}%", 100.0 * part / whole);
}

std::string heatmap_html(const Shown& entry) {
  const plot::Figure f = attention_figure(entry);
  const plot::Layout L = plot::layout(f);
  const std::string svg = plot::render_svg(f);
  std::string cells;
  for (size_t p = 0; p < f.panels.size(); ++p) {
    const plot::Panel& panel = f.panels[p];
    const plot::Rect& g = L.grids[p];
    cells += fmt::format(
        "<div class=\"cells\" style=\"left:{};top:{};width:{};height:{};"
        "grid-template-columns:repeat({},1fr);grid-template-rows:repeat({},1fr)\">",
        percent(g.x, L.width), percent(g.y, L.height), percent(g.w, L.width),
        percent(g.h, L.height), panel.cols, panel.rows);
    const std::string head = f.panels.size() > 1 ? fmt::format("head {}, ", p) : "";
    for (int64_t i = 0; i < panel.rows; ++i) {
      for (int64_t j = 0; j < panel.cols; ++j) {
        const float v = panel.values[static_cast<size_t>(i * panel.cols + j)];
        cells += fmt::format("<span data-q=\"{}{}\" data-k=\"{}\" data-v=\"{}\"></span>", head,
                             escape_html(panel.row_labels[static_cast<size_t>(i)]),
                             escape_html(panel.col_labels[static_cast<size_t>(j)]),
                             panel.is_masked(i, j) ? "masked" : value_text(v));
      }
    }
    cells += "</div>";
  }
  const AttentionMatrix& a = *entry.attention;
  const std::string caption =
      (a.note.empty() ? std::string("the matrix above") : a.note) +
      fmt::format(": queries down, keys across{}; colour scale {:.2f} to {:.2f}",
                  a.causal ? ", the future masked" : "", f.vmin, f.vmax);
  return fmt::format(
      "<figure class=\"heatmap\"><div class=\"plot\"><img src=\"data:image/svg+xml;base64,{}\" "
      "width=\"{}\" height=\"{}\" alt=\"heatmap of "
      "{}\">{}</div><figcaption>{}</figcaption></figure>\n",
      base64(svg), L.width, L.height, escape_html(entry.name), cells, escape_html(caption));
}

}  // namespace

std::string walkthrough_html(const std::vector<Shown>& shown, const std::optional<uint64_t>& seed) {
  std::string body;
  std::string nav;
  std::string section;
  for (size_t n = 0; n < shown.size(); ++n) {
    const Shown& s = shown[n];
    if (s.section != section) {
      section = s.section;
      const WalkthroughSection& info = section_info(section);
      body += fmt::format("<section id=\"{}\">\n<h2>{}</h2>\n<p class=\"intro\">{}</p>\n",
                          info.name, escape_html(info.title), escape_html(info.intro));
      nav += fmt::format("<li><a href=\"#{}\">{}</a></li>", info.name,
                         escape_html(info.title.substr(3)));
    }
    body += fmt::format(
        "<article class=\"step\" id=\"step-{}\">\n<h3><code>{}</code></h3>\n<p>{} "
        "<span class=\"shape\">shape {}</span></p>\n<pre class=\"torch\"><code>{}</code></pre>\n"
        "<pre class=\"tensor\">{}</pre>\n",
        n + 1, escape_html(s.name), escape_html(s.what), escape_html(shape_str(s.value.shape())),
        escape_html(s.torch_line), escape_html(to_string(s.value)));
    if (s.attention) body += heatmap_html(s);
    body += "</article>\n";
    if (n + 1 == shown.size() || shown[n + 1].section != section) body += "</section>\n";
  }
  return fmt::format(
      "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
      "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n"
      "<title>attn walkthrough: attention on \"Your journey starts with one step\"</title>\n"
      "<style>{}</style>\n</head>\n<body>\n<main>\n"
      "<h1>Attention on \"Your journey starts with one step\"</h1>\n"
      "<p>The attention chapter's worked examples, computed by attn. Every tensor is printed as "
      "PyTorch 1.13 prints it, under the PyTorch line it mirrors; every attention matrix is also "
      "drawn (queries down, keys across; hover or tap a cell for its value). {}</p>\n"
      "<nav><ol>{}</ol></nav>\n{}</main>\n<div id=\"tip\" role=\"tooltip\"></div>\n"
      "<script>{}</script>\n</body>\n</html>\n",
      kStyle,
      seed ? fmt::format("Every torch.manual_seed uses {}.", *seed)
           : std::string("Seeds as in the book."),
      nav, body, kScript);
}

// ---- the terminal ----------------------------------------------------------------------

std::string walkthrough_heatmaps(const std::vector<Shown>& shown, bool colour) {
  std::string out;
  std::string section;
  for (const Shown& s : shown) {
    if (!s.attention) continue;
    if (s.section != section) {
      section = s.section;
      out += fmt::format("{}== {} ==\n", out.empty() ? "" : "\n", section_info(section).title);
    }
    out += fmt::format("\n# {}\n", s.explanation);
    if (!s.attention->note.empty()) out += fmt::format("# drawn: {}\n", s.attention->note);
    out += plot::terminal_heatmap(attention_figure(s), colour);
  }
  return out;
}

bool stdout_wants_colour() {
  const char* no_colour = std::getenv("NO_COLOR");
  if (no_colour != nullptr && no_colour[0] != '\0') return false;
  return ::isatty(STDOUT_FILENO) == 1;
}

}  // namespace attn::cli
