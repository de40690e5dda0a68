// attn/hf_gpt2.h - GPT-2 checkpoints as Hugging Face stores them, in and out.
//
// A Hugging Face GPT-2 directory (what `GPT2LMHeadModel.save_pretrained`
// writes, and what the hub serves as openai-community/gpt2 ... gpt2-xl):
//
//   DIR/config.json         n_embd, n_layer, n_head, n_positions, vocab_size,
//                           layer_norm_epsilon (1e-5), activation_function
//                           ("gelu_new"), tie_word_embeddings (true)
//   DIR/model.safetensors   the weights, F32, F16 or BF16
//   DIR/vocab.json, DIR/merges.txt   its tokenizer (optional here)
//
// GPT-2 is the book's GPTModel with qkv_bias = true, out_head tied to tok_emb
// (unless tie_word_embeddings is false and lm_head.weight is stored), the
// LayerNorm eps of the config and GELU's tanh approximation. The names, each
// optionally prefixed "transformer.", map onto attn's (the book's) names as the
// book's ch. 5 load_weights_into_gpt maps them (E = n_embd):
//
//   wte.weight (V, E)                      tok_emb.weight
//   wpe.weight (n_positions, E)            pos_emb.weight
//   h.i.ln_1.weight, .bias (E)             trf_blocks.i.norm1.scale, .shift
//   h.i.attn.c_attn.weight (E, 3E)         W_query | W_key | W_value, each the
//                                          transpose of a (E, E) column block
//   h.i.attn.c_attn.bias (3E)              q | k | v biases
//   h.i.attn.c_proj.weight (E, E), .bias   att.out_proj (transposed)
//   h.i.ln_2.weight, .bias                 norm2.scale, .shift
//   h.i.mlp.c_fc.weight (E, 4E), .bias     ff.layers.0 (transposed)
//   h.i.mlp.c_proj.weight (4E, E), .bias   ff.layers.2 (transposed)
//   ln_f.weight, .bias                     final_norm.scale, .shift
//   lm_head.weight (V, E)                  out_head.weight (optional: tied)
//
// GPT-2's Conv1D stores its weight as (in, out), attn's Linear as (out, in):
// hence the transposes. The buffers h.i.attn.bias (the causal mask) and
// h.i.attn.masked_bias, which older files carry, are accepted and ignored.
//
// Reading memory-maps model.safetensors (io::MappedSafetensors) and converts
// each tensor straight into the model's parameter (F16 and BF16 widened to
// float32), so the file is never copied whole. Every problem is an exception
// naming the file and the key (through attn::printable): a missing, unknown or
// misshapen tensor, a config value attn cannot run, a pickle file
// (pytorch_model.bin, the book's model.pth) with the Python line that converts
// it.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "attn/gpt.h"
#include "attn/tensor.h"

namespace attn::io {

// What config.json says, with the GPTConfig it gives.
struct HfGpt2Config {
  nn::GPTConfig config;  // qkv_bias = true, drop_rate 0 (evaluation), eps, tie from the file
  std::string activation_function;  // "gelu_new" or "gelu_pytorch_tanh"
};

// Reads and checks DIR/config.json. Throws std::invalid_argument naming the
// file and the key for a missing or mistyped required key (n_embd, n_layer,
// n_head, n_positions, vocab_size), an activation other than gelu_new /
// gelu_pytorch_tanh, or a variant attn does not compute (n_inner other than
// 4 n_embd, scale_attn_weights false, scale_attn_by_inverse_layer_idx,
// reorder_and_upcast_attn); std::runtime_error when it cannot be read.
HfGpt2Config read_hf_gpt2_config(const std::string& dir);
// The same checks on config.json's text; `file` names it in the messages.
HfGpt2Config parse_hf_gpt2_config(std::string_view text, const std::string& file = "config.json");

// True when DIR holds config.json (a Hugging Face model directory).
bool is_hf_gpt2_dir(const std::string& dir);

// What loading found in the file.
struct HfGpt2Info {
  HfGpt2Config hf;
  std::string weights_path;     // DIR/model.safetensors
  std::string file_dtype;       // "F32", "F16", "BF16" (the weights' dtype; "mixed" if several)
  bool prefixed = false;        // names start with "transformer."
  bool lm_head_stored = false;  // the file has lm_head.weight
  int64_t ignored_buffers = 0;  // h.i.attn.bias / masked_bias seen and skipped
};

// Builds a GPTModel from DIR (config.json + model.safetensors) with `options`
// (e.g. GPTOptions::dtype for bf16 compute) and loads every weight; the model
// is in eval() mode. Throws std::invalid_argument / std::runtime_error as the
// file comment says, before the model is returned.
HfGpt2Info load_hf_gpt2(const std::string& dir, std::unique_ptr<nn::GPTModel>& model,
                        const nn::GPTOptions& options = {});

// The weights' dtype in the written file.
enum class HfDType { kFloat32, kBFloat16, kFloat16 };
// "float32" | "bfloat16" | "float16"; std::invalid_argument otherwise.
HfDType hf_dtype_from_name(const std::string& name);

// Writes DIR/config.json and DIR/model.safetensors (names with the
// "transformer." prefix, as save_pretrained writes them) for the model, each
// file atomically; creates DIR. A model without q|k|v bias gets zero c_attn
// biases (the same function); an untied model is written with
// tie_word_embeddings false and lm_head.weight. F16 rounds to nearest even
// (float_to_half), BF16 as PyTorch rounds (to_bfloat16). Throws
// std::runtime_error naming the path when a file cannot be written.
void save_hf_gpt2(nn::GPTModel& model, const std::string& dir, HfDType dtype = HfDType::kFloat32);

// The model's tensors under GPT-2's names (float32, contiguous, Conv1D
// layout), without the prefix: what save_hf_gpt2 writes before the dtype.
// Tensors in the model's own layout share its storage (no copy of the
// embeddings and lm_head); the Conv1D weights and c_attn are new tensors.
std::vector<std::pair<std::string, Tensor>> hf_gpt2_state_dict(nn::GPTModel& model);

// ---- any model directory ---------------------------------------------------------------------

// A model directory as `attn generate`, `eval`, `export` and `inspect` take it:
// a Hugging Face GPT-2 directory (config.json), or an attn checkpoint directory
// (checkpoint.safetensors, as `attn train` writes it).
struct ModelDir {
  enum class Kind { kHuggingFace, kAttnCheckpoint };
  Kind kind = Kind::kHuggingFace;
  std::string dir;
  nn::GPTConfig config;
  // "gpt2" (GPT-2's byte-level BPE: every HF directory, and attn checkpoints
  // whose metadata says "tokenizer": "gpt2"), or "char" (attn's
  // character-level vocabulary in `vocab`).
  std::string tokenizer;
  std::vector<std::string> vocab;           // "char": id -> one character
  std::map<std::string, std::string> metadata;  // attn checkpoints: the file's metadata
  HfGpt2Info hf;                            // kHuggingFace: what loading found
};

// Loads DIR whichever kind it is: config.json makes it a Hugging Face
// directory, anything else is read as an attn checkpoint directory
// (nn::load_checkpoint's errors name what it lacks). A pickle (DIR itself, or
// a *.pth / *.pt / pytorch_model.bin in a DIR without checkpoint.safetensors)
// is an std::invalid_argument with the Python line that converts it.
ModelDir load_model_dir(const std::string& dir, std::unique_ptr<nn::GPTModel>& model,
                        const nn::GPTOptions& options = {});

}  // namespace attn::io
