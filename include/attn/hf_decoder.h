// attn/hf_decoder.h - Llama 3, Qwen2, Qwen3 and Gemma 3 checkpoints as the
// Hugging Face Hub publishes them, read into attn/decoder.h's DecoderLM.
//
// A model directory (what `save_pretrained` writes):
//
//   DIR/config.json                    model_type "llama", "qwen2", "qwen3", "gemma2" or
//   "gemma3_text" DIR/model.safetensors              the weights, F32, F16 or BF16; or
//   DIR/model.safetensors.index.json   {"weight_map": {name: shard file}} and its shards
//   DIR/generation_config.json         end-of-sequence ids (optional)
//
// config.json in both forms the Hub has: today's "rope_parameters" (Gemma 3:
// one entry per layer type, "full_attention" and "sliding_attention") and
// "layer_types", and the older "rope_theta" / "rope_scaling" /
// "rope_local_base_freq" / "sliding_window_pattern" keys that the published
// Llama 3.2, Qwen3 and Gemma 3 files carry. RoPE types: default, linear,
// llama3. What each family sets:
//
//   llama        SiLU; attention_bias: q, k, v and o biases; rope default or llama3
//   qwen2        SiLU; q, k, v biases
//   qwen3        SiLU; QK-norm; attention_bias as llama
//   gemma2       GELU tanh; norms 1 + w and four per layer; embeddings × sqrt(E);
//                scale query_pre_attn_scalar^-0.5; sliding layers by layer_types
//                (or every other layer); attn_logit_softcapping (default 50) on
//                the scores, final_logit_softcapping (default 30) on the logits
//   gemma3_text  as gemma2, with QK-norm; every sliding_window_pattern-th (6th)
//                layer full; local and global RoPE; no softcaps by default, and
//                attn_logit_softcapping not applied (transformers' Gemma 3
//                attention does not apply it either)
//
// Every family's pad_token_id row of embed_tokens gets no gradient (torch's
// padding_idx, which transformers sets from it).
//
// Weight names are transformers' ("model.layers.0.self_attn.q_proj.weight");
// the decoder's own are the same but for the feed-forward's, which are the
// book's (mlp.gate_proj, up_proj, down_proj = mlp.fc1, fc2, fc3). Reading
// memory-maps each file and widens each tensor straight into its parameter.
//
// Everything else is refused before a model is returned, by an exception whose
// one line names the file, the key or tensor and the value (attn::printable):
// another model_type, a rope type not listed, a missing, unknown or misshapen
// tensor, a shard outside DIR, a config value attn does not compute.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "attn/decoder.h"
#include "attn/tensor.h"

namespace attn::io {

// What config.json (and generation_config.json) say.
struct HfDecoderConfig {
  nn::DecoderConfig config;
  std::string model_type;              // "llama", "qwen2", "qwen3", "gemma3_text"
  std::string config_form;             // "rope_parameters" (today's keys) or "rope_theta" (older)
  std::string torch_dtype;             // the file's "dtype" / "torch_dtype", "" if absent
  std::vector<int64_t> eos_token_ids;  // config.json's, then generation_config.json's
  std::optional<int64_t> bos_token_id;
  // gemma3_text's attn_logit_softcapping, which transformers' Gemma 3 reads
  // but does not apply (0: none set); attn follows transformers.
  float unapplied_attn_softcap = 0.0f;
};

// The model_types attn reads, for messages: "llama, qwen2, qwen3, gemma3_text".
const char* hf_decoder_types();
// True when DIR/config.json names one of them.
bool is_hf_decoder_dir(const std::string& dir);

// config.json's text -> the decoder's config; `file` names it in messages.
// Throws std::invalid_argument as the file comment says.
HfDecoderConfig parse_hf_decoder_config(std::string_view text,
                                        const std::string& file = "config.json");
// DIR/config.json and DIR/generation_config.json (its eos_token_id added).
HfDecoderConfig read_hf_decoder_config(const std::string& dir);

// transformers' name of a DecoderLM parameter and back ("mlp.fc1" <-> "mlp.gate_proj").
std::string hf_decoder_name(const std::string& attn_name);
std::string attn_decoder_name(const std::string& hf_name);

// The safetensors files of DIR: model.safetensors, or the shards
// model.safetensors.index.json names (each a plain file name inside DIR; with
// weight_map, tensor name -> shard file). Throws std::invalid_argument naming
// a missing index, a malformed one or a shard outside DIR.
std::vector<std::string> hf_decoder_weight_files(
    const std::string& dir, std::map<std::string, std::string>* weight_map = nullptr);

struct HfDecoderInfo {
  HfDecoderConfig hf;
  std::vector<std::string> weight_files;  // the safetensors files read, in order
  std::string file_dtype;                 // "F32", "F16", "BF16", or "mixed"
  int64_t tensors = 0;                    // tensors loaded
  int64_t ignored = 0;                    // buffers skipped (rotary_emb.inv_freq, a tied lm_head)
  int64_t mapped = 0;                     // tensors read in place from the files (no copy)
};

// Builds the DecoderLM of DIR and loads every weight; the model is in eval()
// mode. dtype kBFloat16: every matrix is read straight into bf16 (a BF16 file
// copied, F32/F16 rounded to nearest even; DecoderLM::use_bf16_weights), so
// no float32 copy of them is ever made: inference at half the memory.
// The weights are copied into memory of the process's own (huge pages where
// the system gives them), each file page dropped from the process once read,
// so the peak stays near the weights' size. in_place_weights: a tensor the
// file holds in the compute dtype (F32; BF16 for a bf16 matrix) is not copied
// but viewed in a private, copy-on-write mapping of the file (as llama.cpp
// maps its GGUF): loading costs no copy and no memory beyond the page cache,
// and training still writes them (a written page becomes the process's own);
// decoding reads them through small pages, which measured ~20% slower on a
// 2-core Zen 5 (docs/open-models.md). Throws std::invalid_argument /
// std::runtime_error before returning.
HfDecoderInfo load_hf_decoder(const std::string& dir, std::unique_ptr<nn::DecoderLM>& model,
                              DType dtype = DType::kFloat32, bool in_place_weights = false);

// ---- writing: the Hub layout --------------------------------------------------------------

// config.json of a decoder as transformers 5 writes it (today's form:
// "rope_parameters", "layer_types"), so that parse_hf_decoder_config, and
// transformers' from_pretrained, read back the same model. `dtype` is the
// weights' ("float32" or "bfloat16"). Throws std::invalid_argument when the
// config has something its model_type cannot say (a sliding window for llama,
// q/k/v biases without o's for anything but qwen2, an unknown family).
std::string hf_decoder_config_json(const HfDecoderConfig& hf, const std::string& dtype = "float32");

// What save_hf_decoder writes besides the weights.
struct HfDecoderSaveOptions {
  DType dtype = DType::kFloat32;  // of model.safetensors: F32, or BF16 (rounded to nearest even)
  // The tokenizer.json (its text) to write beside, "" for none; and
  // tokenizer_config.json's text (its chat template, special tokens), "" for none.
  std::string tokenizer_json;
  std::string tokenizer_config_json;
};

// Writes the model into dir as save_pretrained does: config.json
// (hf_decoder_config_json of hf.model_type with the model's config),
// generation_config.json (bos and eos ids), model.safetensors (transformers'
// names; a tied lm_head not stored) and the tokenizer files given; each file
// atomically, dir made when missing. The result loads with load_hf_decoder
// (and transformers) into the same logits. Throws std::invalid_argument as
// hf_decoder_config_json, std::runtime_error naming a file it cannot write.
void save_hf_decoder(nn::DecoderLM& model, const HfDecoderConfig& hf, const std::string& dir,
                     const HfDecoderSaveOptions& options = {});

}  // namespace attn::io
