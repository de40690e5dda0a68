// `attn plot attention` and `attn plot loss` end to end: a tiny 2-layer, 2-head
// GPT with a 10-character vocabulary is written as a checkpoint of `attn train`
// (state_dict + optim.* tensors + metadata), the CLI draws it, and the picture is
// checked cell by cell against the weights the test computes by running the same
// model; bad inputs give one line on stderr, a non-zero exit and no file.
#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "attn/gpt.h"
#include "attn/random.h"
#include "attn/safetensors.h"
#include "attn/utf8.h"
#include "cli.h"
#include "pictures.h"
#include "plot/attention_figure.h"
#include "plot/heatmap.h"

namespace {

namespace fs = std::filesystem;
using attn::test::Image;
using attn::test::run_cli;

constexpr int64_t kLayers = 2, kHeads = 2, kContext = 8;
const std::vector<std::string> kVocab = {"\n", " ", "a", "b", "d", "e", "h", "l", "o", "x"};
// 7 characters with a space and a newline (passed inside single quotes).
const std::string kText = "he l\nlo";

attn::nn::GPTConfig tiny_config() {
  return {.vocab_size = 10, .context_length = kContext, .emb_dim = 8, .n_heads = kHeads,
          .n_layers = kLayers, .drop_rate = 0.1f, .qkv_bias = false};
}

std::vector<std::string> entries_of(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename().string());
  return names;
}

// A checkpoint directory as `attn train` writes it (/tmp/ckpt_format.txt): the
// model's state_dict, one optimizer tensor pair, the metadata.
struct Checkpoint {
  std::string dir;
  attn::Generator gen{1234};
  attn::nn::GPTModel model{tiny_config(), {}, gen};

  Checkpoint() : dir(attn::test::temp_path("ckpt")) {
    fs::create_directory(dir);
    auto tensors = model.state_dict();
    const attn::Tensor& w = tensors.front().second;
    tensors.emplace_back("optim." + tensors.front().first + ".exp_avg", w.clone());
    tensors.emplace_back("optim." + tensors.front().first + ".exp_avg_sq", w.clone());
    const attn::nn::GPTConfig c = tiny_config();
    const nlohmann::json config = {{"vocab_size", c.vocab_size}, {"context_length", c.context_length},
                                   {"emb_dim", c.emb_dim},       {"n_heads", c.n_heads},
                                   {"n_layers", c.n_layers},     {"drop_rate", c.drop_rate},
                                   {"qkv_bias", c.qkv_bias}};
    attn::io::write_safetensors(dir + "/checkpoint.safetensors", tensors,
                                {{"format", "attn-checkpoint-1"},
                                 {"config", config.dump()},
                                 {"vocab", nlohmann::json(kVocab).dump()},
                                 {"iter", "100"}});
  }
  ~Checkpoint() { fs::remove_all(dir); }

  // The weights of every layer (or one) for the text, computed here in eval mode.
  std::vector<attn::plot::LayerAttention> attention(const std::string& text, int64_t only = -1) {
    const auto chars = attn::utf8_characters(text);
    std::vector<int64_t> ids;
    for (const auto& c : chars)
      ids.push_back(std::find(kVocab.begin(), kVocab.end(), c) - kVocab.begin());
    const auto T = static_cast<int64_t>(chars.size());
    model.eval();
    model.forward(attn::Tensor::from_int64({1, T}, ids));
    std::vector<attn::plot::LayerAttention> out;
    for (int64_t l = 0; l < kLayers; ++l) {
      if (only >= 0 && l != only) continue;
      const auto v = model.trf_blocks[l].att.attention_weights().contiguous().to_vector();
      out.push_back({l, kHeads, T, v});
    }
    return out;
  }
};

// The text's characters (UTF-8 code points) and their visible labels.
TEST(PlotCli, CharactersSplitByCodePointAndLabelledVisibly) {
  EXPECT_EQ(attn::utf8_characters("a\u00e9\u2423\U0001F600b"),
            (std::vector<std::string>{"a", "\u00e9", "\u2423", "\U0001F600", "b"}));
  EXPECT_THROW(attn::utf8_characters("ab\xC3"), std::invalid_argument);  // cut short
  EXPECT_THROW(attn::utf8_characters("ab\xC3"
                                     "a"),
               std::invalid_argument);  // bad continuation
  EXPECT_THROW(attn::utf8_characters("\xFF"), std::invalid_argument);
  EXPECT_EQ(attn::plot::visible_label(" "), "\u2423");
  EXPECT_EQ(attn::plot::visible_label("\n"), "\u23CE");
  EXPECT_EQ(attn::plot::visible_label("\t"), "\u21E5");
  EXPECT_EQ(attn::plot::visible_label(std::string(1, '\0')), "\u2400");
  EXPECT_EQ(attn::plot::visible_label("\x1b"), "\u241B");
  EXPECT_EQ(attn::plot::visible_label("\x7f"), "\u2421");
  EXPECT_EQ(attn::plot::visible_label("x"), "x");
  EXPECT_EQ(attn::plot::visible_label("\u00e9"), "\u00e9");
}

TEST(PlotCli, AttentionOfAllLayersHasEveryHeadWithTheModelsWeights) {
  ATTN_REQUIRE_CLI();
  Checkpoint ck;
  const std::string svg = attn::test::temp_path("attention.svg");
  const auto r =
      run_cli("plot attention --checkpoint '" + ck.dir + "' --text '" + kText + "' --out '" + svg + "'");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.err, "");

  // The figure the CLI draws (its title: "attention weights, 2 layers"), from the
  // weights computed here: layers x heads panels, one row per layer.
  const auto layers = ck.attention(kText);
  const auto chars = attn::utf8_characters(kText);
  const attn::plot::Figure f =
      attn::plot::model_attention_figure(layers, chars, "attention weights, 2 layers");
  ASSERT_EQ(f.panels.size(), static_cast<size_t>(kLayers * kHeads));
  EXPECT_EQ(f.panels[3].title, "layer 1 head 1");
  EXPECT_EQ(f.panels[0].row_labels[2], "\u2423");  // the space
  EXPECT_EQ(f.panels[0].row_labels[4], "\u23CE");  // the newline
  const attn::plot::Layout layout = attn::plot::layout(f);
  EXPECT_EQ(layout.grids[2].x, layout.grids[0].x);  // layer 1 starts a row below layer 0
  EXPECT_GT(layout.grids[2].y, layout.grids[0].y + layout.grids[0].h);

  const Image image = attn::test::render_svg_file(svg);
  ASSERT_EQ(image.width, layout.width);
  ASSERT_EQ(image.height, layout.height);
  // Every cell of every panel: the scale's colour of the model's weight, or masked.
  EXPECT_EQ(attn::test::wrong_cells(image, f, 2, "plot attention"), 0);
  // One cell of a known weight, spelled out: layer 1, head 1, query 6, key 3.
  const float w = layers[1].weights[static_cast<size_t>((1 * 7 + 6) * 7 + 3)];
  EXPECT_GT(w, 0.0f);
  const attn::plot::Rect cell = layout.cell_rect(3, 6, 3);
  const auto got = image.at(static_cast<int>(cell.x) + 4, static_cast<int>(cell.y) + 4);
  EXPECT_LE(attn::test::colour_distance(got, attn::plot::scale_colour(w)), 2)
      << "weight " << w << " drawn as " << attn::test::rgb_str(got);
  // A future cell (query 2, key 5 of layer 0 head 1) is the masked colour.
  const attn::plot::Rect masked = layout.cell_rect(1, 2, 5);
  EXPECT_EQ(image.at(static_cast<int>(masked.x) + 4, static_cast<int>(masked.y) + 4),
            attn::plot::kMaskedColour);
  // The check is not vacuous: the same picture read as another layer's weights fails.
  attn::plot::Figure swapped = f;
  std::swap(swapped.panels[0].values, swapped.panels[3].values);
  EXPECT_GT(attn::test::wrong_cells(image, swapped, 2, "swapped", false), 0);
  fs::remove(svg);
}

TEST(PlotCli, AttentionOfOneLayerAsPng) {
  ATTN_REQUIRE_CLI();
  Checkpoint ck;
  const std::string png = attn::test::temp_path("attention.png");
  const auto r = run_cli("plot attention --checkpoint '" + ck.dir + "' --text 'hello' --layer 1 --out '" +
                         png + "'");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const attn::plot::Figure f = attn::plot::model_attention_figure(
      ck.attention("hello", 1), attn::utf8_characters("hello"), "attention weights, layer 1");
  ASSERT_EQ(f.panels.size(), static_cast<size_t>(kHeads));
  EXPECT_EQ(f.panels[0].title, "layer 1 head 0");
  const Image image = attn::test::load_png(png);
  const attn::plot::Layout layout = attn::plot::layout(f);
  ASSERT_EQ(image.width, layout.width);
  ASSERT_EQ(image.height, layout.height);
  EXPECT_EQ(attn::test::wrong_cells(image, f, 2, "plot attention --layer 1 (png)"), 0);
  fs::remove(png);
}

// Each bad input: one line on stderr naming the problem, a non-zero exit, and
// nothing in the output folder (no picture, no temporary file).
TEST(PlotCli, BadInputsGiveOneLineAndNoFile) {
  ATTN_REQUIRE_CLI();
  Checkpoint ck;
  const std::string out_dir = attn::test::temp_path("plot_out");
  fs::create_directory(out_dir);
  const std::string out = out_dir + "/picture.svg";
  const std::string metrics = out_dir + "/../" + fs::path(attn::test::temp_path("m.jsonl")).filename().string();
  {
    std::ofstream m(metrics);
    m << "{\"iter\": 0, \"train_loss\": 4.0, \"val_loss\": 4.1}\n{\"iter\": 1, \"train_loss\": }\n";
  }
  const std::string att = "plot attention --checkpoint '" + ck.dir + "' ";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {att + "--text 'hello' --layer 2 --out '" + out + "'", "unknown layer 2"},
      {att + "--text 'hellohello' --out '" + out + "'", "longer than the model's context of 8"},
      {att + "--text 'hez' --out '" + out + "'", "character \"z\""},
      {att + "--text 'hello' --out '" + out_dir + "/missing/picture.svg'", "cannot write"},
      {att + "--text 'hello' --out '" + out_dir + "/picture.jpg'", "unknown picture format '.jpg'"},
      {"plot attention --checkpoint '" + out_dir + "/nothing' --text 'hello' --out '" + out + "'",
       "checkpoint directory '" + out_dir + "/nothing' does not exist"},
      {"plot loss '" + metrics + "' --out '" + out + "'", "line 2: not valid JSON"},
      {"plot loss '" + metrics + "' --out '" + out_dir + "/missing/loss.png'", "line 2"},
  };
  for (const auto& [args, what] : cases) {
    const auto r = run_cli(args);
    EXPECT_NE(r.exit_code, 0) << args;
    const auto lines = attn::test::lines_of(r.err);
    ASSERT_EQ(lines.size(), 1u) << args << ": " << r.err;
    EXPECT_EQ(lines[0].rfind("attn: plot: ", 0), 0u) << lines[0];
    EXPECT_NE(lines[0].find(what), std::string::npos) << args << ": " << lines[0];
    EXPECT_TRUE(entries_of(out_dir).empty()) << args << " left a file behind";
  }
  fs::remove_all(out_dir);
  fs::remove(metrics);
}

}  // namespace
