// attn/checkpoint.h - reading a GPT checkpoint directory, as `attn train`
// writes it and `attn generate`, `eval`, `export` and `plot` read it.
//
// A GPT checkpoint directory (docs/generation.md, "Checkpoints"):
// DIR/checkpoint.safetensors with the model's state_dict (F32), metadata
// "format" = "attn-checkpoint-1", "config" (JSON object of the GPTConfig
// fields, attn/model_config.h; layer_norm_eps and tie_embeddings optional, the
// book's values when absent), "tokenizer" (optional: "char", the default, or
// "gpt2") and, for "char", "vocab" (JSON array of one-character strings, in id
// order); optim.* tensors of a training checkpoint are ignored.
//
//   std::unique_ptr<nn::GPTModel> model;
//   nn::Checkpoint ck = nn::load_checkpoint("out", model);  // model in eval() mode
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "attn/gpt.h"

namespace attn::nn {

// The metadata "format" of a checkpoint file.
inline constexpr const char* kCheckpointFormat = "attn-checkpoint-1";

struct Checkpoint {
  GPTConfig config;
  std::string tokenizer = "char";  // "char" or "gpt2" (GPT-2's BPE; no vocab)
  std::vector<std::string> vocab;  // "char": id -> one UTF-8 character
  std::map<std::string, std::string> metadata;
};
// The checkpoint a safetensors file's metadata describes (`path` names the
// file in messages): "format" must be kCheckpointFormat, "config" a
// config_from_json object, "tokenizer" absent, "char" or "gpt2", and for
// "char" "vocab" a JSON array of vocab_size distinct one-character strings.
// Throws std::invalid_argument naming the file, the key and the value
// (attn::printable) otherwise. Reads no weight.
Checkpoint read_checkpoint_metadata(const std::map<std::string, std::string>& metadata,
                                    const std::string& path);
// Reads the metadata and loads the weights into a new model (returned through
// `model`, made from the checkpoint's config and `options`). Throws
// std::invalid_argument or std::runtime_error naming the file and what is wrong.
Checkpoint load_checkpoint(const std::string& dir, std::unique_ptr<GPTModel>& model,
                           const GPTOptions& options = {});

}  // namespace attn::nn
