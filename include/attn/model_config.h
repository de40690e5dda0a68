// attn/model_config.h - a GPTConfig as the JSON object a checkpoint's metadata
// "config" holds (docs/generation.md, "Checkpoints"), and back: the one writer
// (`attn train`, `attn export`) and the one reader (load_checkpoint, resuming a
// run, `attn inspect`) of that JSON.
//
//   {"vocab_size": 65, "context_length": 64, "emb_dim": 128, "n_heads": 4,
//    "n_layers": 4, "drop_rate": 0.0, "qkv_bias": false}
//
// The seven keys above are always written, in that order. The others are written
// only when they differ from the book's chapter-4 model, so that its checkpoints
// keep their bytes: "layer_norm_eps" (when not 1e-5), "tie_embeddings" (true),
// "rope" with "theta_base", "latent_dim" (> 0), "n_kv_groups" (!= 0),
// "sliding_window_size" (!= 0) with "sliding_window_stride". A reader takes an
// absent key as the book's value (GPTConfig's default).
#pragma once

#include <string>

#include "attn/gpt.h"

namespace attn::nn {

// The compact JSON text of config (nlohmann's dump(), keys as above).
std::string config_to_json(const GPTConfig& config);

// The GPTConfig of that JSON text; `file` names where it was read from in the
// messages. Throws std::invalid_argument naming the file, the key and the
// value for text that is not a JSON object, a missing required key
// (vocab_size, context_length, emb_dim, n_heads, n_layers, drop_rate,
// qkv_bias), or a key of the wrong type (an integer, a number or a boolean as
// GPTConfig has it). It does not check that the values make a model: GPTModel's
// constructor does.
GPTConfig config_from_json(const std::string& json, const std::string& file);

}  // namespace attn::nn
