// attn walkthrough --plot, --html and --heatmap: the pictures of the chapter's
// attention matrices, checked pixel by pixel after librsvg renders them, the page
// loaded in headless Chromium, the terminal form in a pseudo-terminal and a pipe,
// and bad output paths.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include "cli.h"
#include "pictures.h"
#include "plot/heatmap.h"

namespace {

namespace fs = std::filesystem;
using attn::plot::Figure;
using attn::plot::Panel;
using attn::plot::Rgb;
using attn::test::Image;
using attn::test::run_cli;

const std::vector<std::string> kTokens = {"Your", "journey", "starts", "with", "one", "step"};

// The 19 attention matrices of the walkthrough, in order, as --plot names them.
const std::vector<std::string> kPictures = {"01-simplified-attn_weights_2",
                                            "02-simplified-attn_scores_loops",
                                            "03-simplified-attn_scores",
                                            "04-simplified-attn_weights",
                                            "05-trainable-attn_weights_2",
                                            "06-self-attention-sa_v1_inputs",
                                            "07-self-attention-sa_v2_inputs",
                                            "08-causal-attn_weights",
                                            "09-causal-masked_simple",
                                            "10-causal-masked_simple_norm",
                                            "11-causal-masked",
                                            "12-causal-attn_weights_causal",
                                            "13-dropout-dropout_attn_weights",
                                            "14-multihead-ca_batch",
                                            "15-multihead-mha_wrapper_batch",
                                            "16-multihead-mha_batch",
                                            "17-averaging-wei",
                                            "18-averaging-wei_0",
                                            "19-embedding-attention_weights_2"};

// The walkthrough's tensors as --json gives them.
nlohmann::json walkthrough_json() {
  const attn::test::CliResult r = run_cli("walkthrough --json");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  return nlohmann::json::parse(r.out);
}

const nlohmann::json& entry(const nlohmann::json& all, const std::string& section,
                            const std::string& name) {
  for (const auto& e : all) {
    if (e["section"] == section && e["name"] == name) return e;
  }
  throw std::runtime_error("no walkthrough tensor " + section + "/" + name);
}

float json_float(const nlohmann::json& v) {
  if (v.is_string()) return v == "-inf" ? -INFINITY : v == "inf" ? INFINITY : NAN;
  return v.get<float>();
}

// The figure the test expects for a (T, T) matrix of the walkthrough: tokens on
// both axes, the future masked when causal, -inf masked; weights on [0, max(1,
// largest)], scores on the range of their unmasked values.
Figure expected_figure(const nlohmann::json& e, bool causal, bool scores) {
  Figure f;
  f.title = e["name"].get<std::string>() + "   [" + e["section"].get<std::string>() + "]";
  Panel p;
  p.rows = p.cols = 6;
  p.row_labels = p.col_labels = kTokens;
  float largest = 0.0f;
  for (int i = 0; i < 6; ++i) {
    for (int j = 0; j < 6; ++j) {
      const float v = json_float(e["values"][static_cast<size_t>(i * 6 + j)]);
      const bool masked = (causal && j > i) || !std::isfinite(v);
      p.values.push_back(v);
      p.masked.push_back(masked);
      if (!masked) largest = std::max(largest, v);
    }
  }
  f.panels.push_back(p);
  if (scores) {
    attn::plot::fit_scale(f);
  } else {
    f.vmax = std::max(1.0f, largest);
  }
  return f;
}

std::string plot_dir() {
  static const std::string dir = [] {
    const std::string d = attn::test::temp_path("plots");
    const attn::test::CliResult r = run_cli("walkthrough --plot '" + d + "'");
    EXPECT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(r.out, "wrote 39 files to " + d + " (index.html lists them)\n");
    return d;
  }();
  return dir;
}

// Checks one picture of --plot against the expected figure: the SVG rendered by
// rsvg-convert has the layout's size and every cell's colour; the PNG attn wrote
// agrees with it.
void check_picture(const std::string& stem, const Figure& expected) {
  SCOPED_TRACE(stem);
  const attn::plot::Layout layout = attn::plot::layout(expected);
  const Image svg = attn::test::render_svg_file(plot_dir() + "/" + stem + ".svg");
  ASSERT_EQ(svg.width, layout.width);
  ASSERT_EQ(svg.height, layout.height);
  EXPECT_EQ(attn::test::wrong_cells(svg, expected, 1, stem + ".svg"), 0);
  const Image png = attn::test::load_png(plot_dir() + "/" + stem + ".png");
  ASSERT_EQ(png.width, svg.width);
  ASSERT_EQ(png.height, svg.height);
  EXPECT_EQ(attn::test::wrong_cells(png, expected, 1, stem + ".png"), 0);
  // Glyphs are anti-aliased a little differently by the two rasterisers: a few
  // per cent of the pixels (the edges of the written values) may differ.
  size_t differ = 0;
  double total = 0;
  for (size_t k = 0; k < png.pixels.size(); ++k) {
    const int d = attn::test::colour_distance(png.pixels[k], svg.pixels[k]);
    differ += d > 48 ? 1 : 0;
    total += d;
  }
  const auto n = static_cast<double>(png.pixels.size());
  EXPECT_LT(static_cast<double>(differ), 0.03 * n)
      << differ << " pixels differ between the PNG and the rendered SVG";
  EXPECT_LT(total / n, 3.0) << "mean difference between the PNG and the rendered SVG";
}

TEST(WalkthroughPictures, PlotWritesEveryAttentionMatrixAndAnIndex) {
  ATTN_REQUIRE_CLI();
  std::set<std::string> files;
  for (const auto& f : fs::directory_iterator(plot_dir()))
    files.insert(f.path().filename().string());
  std::set<std::string> want = {"index.html"};
  for (const auto& stem : kPictures) want.insert({stem + ".svg", stem + ".png"});
  EXPECT_EQ(files, want);
  const std::string index = attn::test::read_text(plot_dir() + "/index.html");
  for (const auto& stem : kPictures) {
    EXPECT_NE(index.find("<img src=\"" + stem + ".svg\""), std::string::npos) << stem;
    EXPECT_NE(index.find("href=\"" + stem + ".png\""), std::string::npos) << stem;
  }
}

TEST(WalkthroughPictures, CausalWeightsAreDrawnWithTheScaleAndTheMask) {
  ATTN_REQUIRE_CLI();
  const nlohmann::json all = walkthrough_json();
  const nlohmann::json& e = entry(all, "causal", "attn_weights_causal");
  ASSERT_EQ(json_float(e["values"][0]), 1.0f);  // the known large weight: "Your" sees only itself
  const Figure f = expected_figure(e, /*causal=*/true, /*scores=*/false);
  check_picture("12-causal-attn_weights_causal", f);
  const Image svg = attn::test::render_svg_file(plot_dir() + "/12-causal-attn_weights_causal.svg");
  const attn::plot::Rect big = attn::plot::layout(f).cell_rect(0, 0, 0);
  EXPECT_EQ(attn::test::rgb_str(svg.at(static_cast<int>(big.x) + 4, static_cast<int>(big.y) + 4)),
            attn::test::rgb_str(attn::plot::kScaleTable[8]));
}

TEST(WalkthroughPictures, BothMaskingRoutesAndDropoutAreDrawn) {
  ATTN_REQUIRE_CLI();
  const nlohmann::json all = walkthrough_json();
  check_picture("08-causal-attn_weights",
                expected_figure(entry(all, "causal", "attn_weights"), false, false));
  check_picture("10-causal-masked_simple_norm",
                expected_figure(entry(all, "causal", "masked_simple_norm"), true, false));
  // -inf scores: masked, and the scale spans the finite scores.
  const Figure masked = expected_figure(entry(all, "causal", "masked"), true, true);
  check_picture("11-causal-masked", masked);
  // Dropout doubles the kept weights: the scale reaches 2.
  const Figure dropped =
      expected_figure(entry(all, "dropout", "dropout(attn_weights)"), true, false);
  EXPECT_EQ(dropped.vmax, 2.0);
  check_picture("13-dropout-dropout_attn_weights", dropped);
  check_picture("04-simplified-attn_weights",
                expected_figure(entry(all, "simplified", "attn_weights"), false, false));
}

// The heads of MultiHeadAttention: --json prints the module's output, not its
// weights, so this checks the layout of two panels, the masked future of each
// head, weight 1.0 for the first query, and every other cell a colour of the scale.
TEST(WalkthroughPictures, EachHeadIsAPanelOnOneScale) {
  ATTN_REQUIRE_CLI();
  Figure f;
  f.title = "mha(batch)   [multihead]";
  for (int h = 0; h < 2; ++h) {
    Panel p;
    p.title = "head " + std::to_string(h);
    p.rows = p.cols = 6;
    p.row_labels = p.col_labels = kTokens;
    for (int i = 0; i < 6; ++i) {
      for (int j = 0; j < 6; ++j) {
        p.values.push_back(j > i ? 0.0f : 0.5f);
        p.masked.push_back(j > i);
      }
    }
    f.panels.push_back(p);
  }
  const attn::plot::Layout layout = attn::plot::layout(f);
  const Image svg = attn::test::render_svg_file(plot_dir() + "/16-multihead-mha_batch.svg");
  ASSERT_EQ(svg.width, layout.width);
  ASSERT_EQ(svg.height, layout.height);
  for (int h = 0; h < 2; ++h) {
    for (int i = 0; i < 6; ++i) {
      for (int j = 0; j < 6; ++j) {
        const attn::plot::Rect r = layout.cell_rect(h, i, j);
        const Rgb got = svg.at(static_cast<int>(r.x) + 4, static_cast<int>(r.y) + 4);
        if (j > i) {
          EXPECT_LE(attn::test::colour_distance(got, attn::plot::kMaskedColour), 1) << h << i << j;
        } else if (i == 0) {
          EXPECT_LE(attn::test::colour_distance(got, attn::plot::kScaleTable[8]), 1) << h << i << j;
        } else {
          int best = 255;
          for (int k = 0; k <= 2048; ++k) {
            best = std::min(best,
                            attn::test::colour_distance(got, attn::plot::scale_colour(k / 2048.0)));
          }
          EXPECT_LE(best, 2) << "head " << h << " cell (" << i << ", " << j << ") is "
                             << attn::test::rgb_str(got) << ", not a colour of the scale";
        }
      }
    }
  }
}

// ---- the HTML page in headless Chromium -----------------------------------------------

std::string chromium() {
#ifdef ATTN_CHROMIUM
  const std::string path = ATTN_CHROMIUM;
#else
  const std::string path;
#endif
  if (path.empty() || path.find("NOTFOUND") != std::string::npos) {
    ADD_FAILURE()
        << "chromium was not found when the build was configured: run ./scripts/bootstrap "
           "(it installs Debian's chromium), then cmake again";
    return "";
  }
  return path;
}

struct PageLoad {
  int exit_code = -1;
  std::vector<std::string> console;   // console messages (errors, logs) the page produced
  std::vector<std::string> requests;  // network requests the page made
  std::string dom;                    // with dump_dom
  Image screenshot;                   // without dump_dom
};

// Loads a local page in headless Chromium, offline: every host name resolves to
// nothing, background services are off, and the net log records every request.
PageLoad load_page(const std::string& html_path, bool dump_dom, int width = 1280,
                   int height = 2400) {
  PageLoad load;
  const std::string browser = chromium();
  if (browser.empty()) return load;
  const std::string profile = attn::test::temp_path("chromium-profile");
  const std::string netlog = attn::test::temp_path("netlog.json");
  const std::string shot = attn::test::temp_path("screenshot.png");
  const std::string dom = attn::test::temp_path("dom.html");
  std::string command = "timeout 120 '" + browser +
                        "' --headless --no-sandbox --disable-gpu --no-first-run --hide-scrollbars "
                        "--user-data-dir='" +
                        profile +
                        "' --enable-logging=stderr --v=0 "
                        "--host-resolver-rules='MAP * ~NOTFOUND' --disable-background-networking "
                        "--disable-component-update --disable-sync --disable-default-apps "
                        "--disable-features=Translate,OptimizationHints,MediaRouter,SpellCheck "
                        "--log-net-log='" +
                        netlog + "' --window-size=" + std::to_string(width) + "," +
                        std::to_string(height) + " ";
  command += dump_dom ? "--dump-dom" : "--screenshot='" + shot + "'";
  command += " 'file://" + html_path + "'";
  if (dump_dom) command = "( " + command + " >'" + dom + "' )";
  std::string log;
  load.exit_code = attn::test::run_shell(command, &log);
  for (const auto& line : attn::test::lines_of(log)) {
    if (line.find(":CONSOLE") != std::string::npos) load.console.push_back(line);
  }
  // Requests of the page (its network isolation key is the file:// site), not
  // the browser's own.
  try {
    const nlohmann::json events = nlohmann::json::parse(attn::test::read_text(netlog))["events"];
    for (const auto& e : events) {
      if (!e.contains("params")) continue;
      const auto& p = e["params"];
      if (p.contains("url") && p.contains("network_isolation_key") &&
          p["network_isolation_key"].get<std::string>().rfind("file://", 0) == 0) {
        load.requests.push_back(p["url"].get<std::string>());
      }
    }
  } catch (const std::exception& ex) {
    ADD_FAILURE() << "cannot read Chromium's net log " << netlog << ": " << ex.what();
  }
  if (dump_dom)
    load.dom = attn::test::read_text(dom);
  else
    load.screenshot = attn::test::load_png(shot);
  std::error_code ignored;
  fs::remove_all(profile, ignored);
  fs::remove(netlog, ignored);
  fs::remove(shot, ignored);
  fs::remove(dom, ignored);
  return load;
}

size_t count_of(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

// A page that breaks both rules is caught: the checks below can fail.
TEST(WalkthroughHtml, ChromiumCatchesConsoleErrorsAndNetworkRequests) {
  const std::string page = attn::test::temp_path("bad.html");
  {
    std::ofstream out(page);
    out << "<!DOCTYPE html><html><body><p>bad</p><img src=\"https://example.com/x.png\">"
           "<script>missing_function();</script></body></html>\n";
  }
  const PageLoad load = load_page(page, /*dump_dom=*/false, 800, 600);
  EXPECT_EQ(load.exit_code, 0);
  EXPECT_EQ(load.console.size(), 1u);
  ASSERT_EQ(load.requests.empty(), false);
  EXPECT_EQ(load.requests.front(), "https://example.com/x.png");
}

TEST(WalkthroughHtml, LoadsOfflineWithoutErrorsAndShowsEveryTensorAndHeatmap) {
  ATTN_REQUIRE_CLI();
  const std::string page = attn::test::temp_path("walkthrough.html");
  const attn::test::CliResult r = run_cli("walkthrough --html '" + page + "'");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "wrote " + page + "\n");
  const std::string html = attn::test::read_text(page);
  const size_t tensors = walkthrough_json().size();

  const PageLoad shot = load_page(page, /*dump_dom=*/false);
  EXPECT_EQ(shot.exit_code, 0);
  EXPECT_TRUE(shot.console.empty())
      << "console: " << (shot.console.empty() ? "" : shot.console.front());
  EXPECT_TRUE(shot.requests.empty())
      << "the page requested " << (shot.requests.empty() ? "" : shot.requests.front());
  ASSERT_EQ(shot.screenshot.width, 1280);
  // Not blank: many pixels are not the background, and the heatmaps' colours are there.
  size_t ink = 0, on_scale = 0;
  std::vector<Rgb> scale;
  for (int k = 0; k <= 256; ++k) scale.push_back(attn::plot::scale_colour(k / 256.0));
  for (int y = 0; y < shot.screenshot.height; ++y) {
    for (int x = 0; x < shot.screenshot.width; ++x) {
      const Rgb c = shot.screenshot.at(x, y);
      ink += attn::test::colour_distance(c, {255, 255, 255}) > 40 ? 1 : 0;
      if (x % 4 != 0 || y % 4 != 0) continue;
      int best = 255;
      for (const Rgb& s : scale) best = std::min(best, attn::test::colour_distance(c, s));
      on_scale += best <= 3 ? 1 : 0;
    }
  }
  EXPECT_GT(ink, shot.screenshot.pixels.size() / 50) << "the screenshot is nearly blank";
  // The first heatmap on the first screen: hundreds of (sampled) pixels of the scale's colours.
  EXPECT_GT(on_scale, 500u) << "no heatmap on the first screen";

  // The DOM after the page's script ran: one <pre class="tensor"> per tensor and
  // one heatmap per attention matrix, each with one hover cell per matrix cell.
  const PageLoad dom = load_page(page, /*dump_dom=*/true);
  EXPECT_TRUE(dom.console.empty()) << (dom.console.empty() ? "" : dom.console.front());
  EXPECT_EQ(count_of(dom.dom, "<pre class=\"tensor\">"), tensors);
  EXPECT_EQ(count_of(dom.dom, "<figure class=\"heatmap\">"), kPictures.size());
  // Three (1, 6) rows, twelve (6, 6) matrices, two modules of two (6, 6) heads, two (8, 8).
  EXPECT_EQ(count_of(dom.dom, "<span data-q="), 3u * 6 + 12 * 36 + 2 * 72 + 2 * 64);
  EXPECT_NE(dom.dom.find("data-q=\"journey\" data-k=\"Your\" data-v=\""), std::string::npos);
  EXPECT_NE(dom.dom.find("data-v=\"masked\""), std::string::npos);
  // Self-contained: no address outside the page.
  EXPECT_EQ(html.find("http://"), std::string::npos);
  EXPECT_EQ(html.find("https://"), std::string::npos);
}

TEST(WalkthroughHtml, FitsAPhoneScreen) {
  ATTN_REQUIRE_CLI();
  const std::string page = attn::test::temp_path("phone.html");
  ASSERT_EQ(run_cli("walkthrough --section causal --html '" + page + "'").exit_code, 0);
  const std::string html = attn::test::read_text(page);
  EXPECT_NE(html.find("<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"),
            std::string::npos);
  EXPECT_NE(html.find(".plot img{display:block;max-width:100%;height:auto}"), std::string::npos);
  const PageLoad shot = load_page(page, /*dump_dom=*/false, 390, 844);
  EXPECT_TRUE(shot.console.empty());
  ASSERT_EQ(shot.screenshot.width, 390);
  size_t ink = 0;
  for (const Rgb& c : shot.screenshot.pixels)
    ink += attn::test::colour_distance(c, {255, 255, 255}) > 40 ? 1 : 0;
  EXPECT_GT(ink, shot.screenshot.pixels.size() / 50);
}

// ---- the terminal ----------------------------------------------------------------------

TEST(WalkthroughHeatmap, PseudoTerminalGetsTruecolourPipeAndNoColorGetPlainText) {
  ATTN_REQUIRE_CLI();
  const nlohmann::json all = walkthrough_json();
  const float w = json_float(entry(all, "causal", "attn_weights")["values"][0]);
  const Rgb c = attn::plot::scale_colour(w);  // unmasked weights, scale [0, 1]
  const std::string cell = "\x1b[48;2;" + std::to_string(c.r) + ";" + std::to_string(c.g) + ";" +
                           std::to_string(c.b) + "m";
  const std::string cli = ATTN_CLI_PATH;
  std::string tty;
  ASSERT_EQ(attn::test::run_shell("env -u NO_COLOR script -qec \"'" + cli +
                                      "' walkthrough --heatmap --section causal\" /dev/null",
                                  &tty),
            0)
      << tty;
  EXPECT_NE(tty.find(cell), std::string::npos) << "no cell of colour " << attn::test::rgb_str(c);
  EXPECT_NE(tty.find("\x1b[48;2;253;231;37m"), std::string::npos);   // weight 1.0
  EXPECT_NE(tty.find("\x1b[48;2;208;208;208m"), std::string::npos);  // masked
  EXPECT_NE(tty.find("journey"), std::string::npos);
  EXPECT_EQ(count_of(tty, "# "), 5u);  // the causal section's five matrices

  std::string no_color;
  ASSERT_EQ(attn::test::run_shell("NO_COLOR=1 script -qec \"'" + cli +
                                      "' walkthrough --heatmap --section causal\" /dev/null",
                                  &no_color),
            0);
  EXPECT_EQ(no_color.find('\x1b'), std::string::npos);

  const attn::test::CliResult piped = run_cli("walkthrough --heatmap --section causal");
  EXPECT_EQ(piped.exit_code, 0);
  EXPECT_EQ(piped.out.find('\x1b'), std::string::npos);
  EXPECT_NE(piped.out.find("   Your   1.00     ·     ·     ·     ·     ·"), std::string::npos)
      << piped.out;
  // The same text as NO_COLOR in a terminal, apart from the terminal's line ends.
  std::string crlf = no_color;
  crlf.erase(std::remove(crlf.begin(), crlf.end(), '\r'), crlf.end());
  EXPECT_EQ(crlf, piped.out);
}

// ---- bad output paths: one line, non-zero exit, nothing half-written ---------------------

TEST(WalkthroughPictures, UnwritablePathsFailInOneLineAndWriteNothing) {
  ATTN_REQUIRE_CLI();
  const std::string dir = attn::test::temp_path("bad-paths");
  fs::create_directories(dir);
  const std::string file = dir + "/a-file";
  { std::ofstream(file) << "x"; }

  // --plot under a regular file: the folder cannot be created.
  attn::test::CliResult r = run_cli("walkthrough --plot '" + file + "/plots'");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(attn::test::lines_of(r.err).size(), 1u) << r.err;
  EXPECT_NE(r.err.find(file + "/plots"), std::string::npos) << r.err;
  // --plot onto a regular file.
  r = run_cli("walkthrough --plot '" + file + "'");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(attn::test::lines_of(r.err).size(), 1u) << r.err;
  EXPECT_NE(r.err.find("cannot create the folder '" + file + "'"), std::string::npos) << r.err;
  // --html into a folder that does not exist, and onto a folder.
  r = run_cli("walkthrough --html '" + dir + "/missing/page.html'");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(attn::test::lines_of(r.err).size(), 1u) << r.err;
  EXPECT_NE(r.err.find("cannot write '" + dir + "/missing/page.html'"), std::string::npos) << r.err;
  fs::create_directories(dir + "/folder.html");
  r = run_cli("walkthrough --html '" + dir + "/folder.html'");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(attn::test::lines_of(r.err).size(), 1u) << r.err;
  // Empty paths and --heatmap with --json are usage errors.
  EXPECT_EQ(run_cli("walkthrough --html ''").exit_code, 2);
  EXPECT_EQ(run_cli("walkthrough --plot ''").exit_code, 2);
  r = run_cli("walkthrough --heatmap --json");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(attn::test::lines_of(r.err).size(), 1u) << r.err;

  // Nothing else was left behind: no temporary file, no partial output.
  std::set<std::string> left;
  for (const auto& f : fs::recursive_directory_iterator(dir))
    left.insert(f.path().lexically_relative(dir).string());
  EXPECT_EQ(left, (std::set<std::string>{"a-file", "folder.html"}));
  EXPECT_EQ(attn::test::read_text(file), "x");
}

}  // namespace
