// `attn plot attention` and `attn plot loss` (plot.h).
#include "plot.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "attn/checkpoint.h"
#include "attn/utf8.h"
#include "flag_checks.h"
#include "plot/line_chart.h"
#include "plot/mask_figure.h"
#include "plot/picture_file.h"

namespace attn::cli {

std::vector<int64_t> encode_characters(const std::vector<std::string>& characters,
                                       const std::vector<std::string>& vocab) {
  std::vector<int64_t> ids;
  for (size_t i = 0; i < characters.size(); ++i) {
    const auto it = std::find(vocab.begin(), vocab.end(), characters[i]);
    if (it == vocab.end()) {
      throw std::invalid_argument(fmt::format(
          "character {} ({} at position {}) is not in the checkpoint's vocabulary of {}",
          nlohmann::json(characters[i]).dump(), plot::visible_label(characters[i]), i,
          vocab.size()));
    }
    ids.push_back(static_cast<int64_t>(it - vocab.begin()));
  }
  return ids;
}

std::vector<plot::LayerAttention> model_attention(LoadedModel& loaded,
                                                  const std::vector<std::string>& characters,
                                                  std::optional<int64_t> layer) {
  nn::GPTModel& model = *loaded.model;
  const nn::GPTConfig& cfg = model.config();
  if (layer && (*layer < 0 || *layer >= cfg.n_layers))
    throw std::invalid_argument(fmt::format("unknown layer {}: the model has {} layers (0 to {})",
                                            *layer, cfg.n_layers, cfg.n_layers - 1));
  const auto T = static_cast<int64_t>(characters.size());
  if (T == 0) throw std::invalid_argument("the text is empty");
  if (T > cfg.context_length)
    throw std::invalid_argument(fmt::format(
        "the text is {} characters long, longer than the model's context of {}", T,
        cfg.context_length));
  const std::vector<int64_t> ids = encode_characters(characters, loaded.vocab);
  model.eval();
  model.forward(Tensor::from_int64({1, T}, ids));
  std::vector<plot::LayerAttention> out;
  for (int64_t l = 0; l < cfg.n_layers; ++l) {
    if (layer && l != *layer) continue;
    const Tensor w = model.trf_blocks[l].att.attention_weights().contiguous();  // (1, H, T, T)
    const auto v = w.values();
    out.push_back({l, cfg.n_heads, T, std::vector<float>(v.begin(), v.end())});
  }
  return out;
}

Command add_plot_command(CLI::App& app) {
  struct Flags {
    std::string checkpoint, text, out, metrics, loss_out;
    int64_t layer = 0;
    std::string mask_kind, mask_out;
    plot::MaskFigureOptions mask;
    int64_t sliding_window_size = 4;  // --kind window: the book's W (window_left = W - 1)
  };
  auto flags = std::make_shared<Flags>();
  CLI::App* cmd = app.add_subcommand("plot", "Draw a trained model's attention or loss curve, or an attention mask");
  cmd->require_subcommand(1);
  cmd->footer(
      "Examples:\n  attn plot attention --checkpoint run/ --text 'to be' --out att.svg\n"
      "  attn plot loss run/metrics.jsonl --out loss.png\n"
      "  attn plot mask --kind causal-bottom-right --tq 4 --tk 10 --out mask.svg");

  CLI::App* att = cmd->add_subcommand(
      "attention",
      "Draw every head of a layer (or of all layers) for a text, from a checkpoint of `attn train`");
  add_option(att, "-m,--model,--checkpoint", flags->checkpoint,
             "The folder holding checkpoint.safetensors")
      ->required()
      ->type_name("DIR");
  add_option(att, "--text", flags->text, "The text, at most the model's context long")
      ->required()
      ->type_name("TEXT");
  CLI::Option* layer_opt =
      add_option(att, "--layer", flags->layer, "Only this layer (0-based; default: all layers)")
          ->type_name("L");
  add_option(att, "--out", flags->out, "The picture: a .svg or .png file")
      ->required()
      ->type_name("FILE");

  CLI::App* loss = cmd->add_subcommand(
      "loss",
      "Draw train and validation loss against iterations from a metrics.jsonl; from the "
      "metrics of `attn train --recipe book-ch5` (lines with tokens_seen and num_epochs), the "
      "book's plot_losses: loss against epochs, tokens seen on a second axis along the top");
  add_option(loss, "metrics", flags->metrics, "The metrics.jsonl of a training run")
      ->required()
      ->type_name("METRICS");
  add_option(loss, "--out", flags->loss_out, "The picture: a .svg or .png file")
      ->required()
      ->type_name("FILE");

  CLI::App* mask = cmd->add_subcommand(
      "mask",
      "Draw which keys each query may attend to under one of scaled_dot_product_attention's "
      "rules (docs/sdpa.md), read off the reference implementation: the softmax weights when "
      "every score is equal (masked cells grey), ALiBi's bias, or GQA's head sharing");
  add_option(mask, "--kind", flags->mask_kind,
             "causal (top-left, PyTorch's is_causal), causal-bottom-right (FlashAttention "
             "2's, a KV cache's), window (sliding window), alibi (one panel per head), "
             "varlen (packed sequences, cu_seqlens) or gqa (query heads against kv heads)")
      ->required()
      ->type_name("KIND");
  add_option(mask, "--tq", flags->mask.tq, "Queries (1..64)")->capture_default_str();
  add_option(mask, "--tk", flags->mask.tk, "Keys (1..64)")->capture_default_str();
  add_option(mask, "--sliding-window-size", flags->sliding_window_size,
             "window: each query sees W keys, itself and the W - 1 before it (the book's "
             "sliding window; window_left = W - 1)")
      ->type_name("W")
      ->capture_default_str();
  add_option(mask, "--heads", flags->mask.heads, "alibi: heads; gqa: query heads")
      ->capture_default_str();
  add_option(mask, "--kv-heads", flags->mask.kv_heads, "gqa: key/value heads")
      ->capture_default_str();
  add_option(mask, "--seqlens", flags->mask.seqlens,
             "varlen: the packed sequences' lengths, comma-separated (default 3,5,2)")
      ->delimiter(',')
      ->type_name("LIST");
  add_option(mask, "--out", flags->mask_out,
             "The picture: a .svg or .png file (default: the terminal, in colour when it "
             "is one and NO_COLOR is unset)")
      ->type_name("FILE");

  auto run = [flags, att, loss, mask, layer_opt]() -> int {
    if (mask->parsed()) {
      flags->mask.kind = plot::mask_kind_from_name(flags->mask_kind);
      if (flags->mask.seqlens.empty()) flags->mask.seqlens = {3, 5, 2};  // --seqlens's default
      if (flags->sliding_window_size < 1)
        throw UsageError(fmt::format("plot mask: --sliding-window-size must be >= 1, got {}",
                                     flags->sliding_window_size));
      flags->mask.window_left = flags->sliding_window_size - 1;  // the one conversion
      const plot::Figure figure = plot::mask_figure(flags->mask);
      if (flags->mask_out.empty()) {
        const char* no_colour = std::getenv("NO_COLOR");
        const bool colour =
            ::isatty(STDOUT_FILENO) == 1 && (no_colour == nullptr || no_colour[0] == '\0');
        std::cout << figure.title << "\n" << plot::terminal_heatmap(figure, colour);
        return 0;
      }
      const plot::PictureFormat format = plot::picture_format(flags->mask_out);
      write_file_atomically(flags->mask_out, format == plot::PictureFormat::kSvg
                                                 ? plot::render_svg(figure)
                                                 : plot::render_png(figure));
      return 0;
    }
    if (att->parsed()) {
      const plot::PictureFormat format = plot::picture_format(flags->out);
      LoadedModel loaded;  // the reader `attn generate` uses, format and all (attn/generate.h)
      loaded.vocab = nn::load_checkpoint(flags->checkpoint, loaded.model).vocab;
      const std::vector<std::string> characters = attn::utf8_characters(flags->text);
      std::optional<int64_t> layer;
      if (layer_opt->count() > 0) layer = flags->layer;
      const auto layers = model_attention(loaded, characters, layer);
      const std::string title =
          layer ? fmt::format("attention weights, layer {}", *layer)
                : fmt::format("attention weights, {} layers", layers.size());
      const plot::Figure figure = plot::model_attention_figure(layers, characters, title);
      write_file_atomically(flags->out, format == plot::PictureFormat::kSvg ? plot::render_svg(figure)
                                                                            : plot::render_png(figure));
      return 0;
    }
    if (loss->parsed()) {
      plot::write_loss_curve(flags->metrics, flags->loss_out);
      return 0;
    }
    throw UsageError("plot: give 'attention', 'loss' or 'mask'");
  };
  return Command{cmd, run};
}

}  // namespace attn::cli
