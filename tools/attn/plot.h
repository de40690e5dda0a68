// plot.h - `attn plot attention` and `attn plot loss`: pictures of a trained model.
//
//   attn plot attention --checkpoint DIR --text TEXT [--layer L] --out FILE
//       Loads DIR/checkpoint.safetensors (the format of `attn train`: the
//       GPTModel's state_dict, optional optim.* tensors that are ignored, and the
//       metadata "config" and "vocab"), encodes TEXT character by character, runs
//       the model in evaluation mode on (1, T) and draws every head of layer L
//       (0-based, as trf_blocks.L), or of every layer (one row per layer), as a
//       heatmap with the characters as labels and the future masked.
//   attn plot loss METRICS --out FILE
//       Draws train and validation loss of a metrics.jsonl against iterations
//       (plot::write_loss_curve).
//
// FILE ends in .svg or .png. Everything is computed and drawn before FILE is
// written, atomically; a bad input (no checkpoint, an unknown layer or character,
// a text longer than the context, a malformed metrics line, an unwritable FILE)
// is one line on stderr and exit code 1, and leaves no FILE behind.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "attn/gpt.h"
#include "command.h"
#include "plot/attention_figure.h"

namespace attn::cli {

// A model read from DIR/checkpoint.safetensors by nn::load_checkpoint
// (attn/checkpoint.h), and its vocabulary (id order).
struct LoadedModel {
  std::unique_ptr<nn::GPTModel> model;
  std::vector<std::string> vocab;
};

// The token ids of the characters; throws naming the first character not in vocab.
std::vector<int64_t> encode_characters(const std::vector<std::string>& characters,
                                       const std::vector<std::string>& vocab);

// Runs the model (evaluation mode) on the characters and returns the attention
// weights of `layer`, or of every layer when it is empty.
std::vector<plot::LayerAttention> model_attention(LoadedModel& loaded,
                                                  const std::vector<std::string>& characters,
                                                  std::optional<int64_t> layer);

// Registers `plot` with its subcommands `attention` and `loss`.
Command add_plot_command(CLI::App& app);

}  // namespace attn::cli
