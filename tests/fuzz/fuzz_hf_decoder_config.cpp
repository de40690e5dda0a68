// libFuzzer target for the config.json reader of Llama / Qwen / Gemma
// directories (src/model/hf_decoder_config.cpp, io::parse_hf_decoder_config)
// and its writer (io::hf_decoder_config_json), built with clang
// -fsanitize=fuzzer,address,undefined by tests/fuzz/CMakeLists.txt (issue 46).
//
// Input: the text of a config.json. Any input must end in one of two ways: a
// std::invalid_argument whose message holds no control byte and no byte that
// is not valid UTF-8 (outside bytes reach it only through attn::printable),
// or a config attn can build: DecoderConfig::check() passes, every size in
// [1, 2^31), at most 4096 layers, one sliding flag per layer or none, token
// ids >= 0; and written by hf_decoder_config_json it reads back as the same
// model. A crash, a sanitizer report, another exception, or a config breaking
// these is a finding.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <string_view>

#include "attn/hf_decoder.h"
#include "attn/utf8.h"
#include "fuzz_common.h"

namespace {

using attn::fuzz::clean_message;
using attn::fuzz::finding;

bool same_rope(const attn::nn::RopeScaling& a, const attn::nn::RopeScaling& b) {
  return a.type == b.type && a.theta == b.theta && a.factor == b.factor &&
         a.low_freq_factor == b.low_freq_factor && a.high_freq_factor == b.high_freq_factor &&
         a.original_context_length == b.original_context_length;
}

// The same model: every field the decoder is built from. attention_scale goes
// through query_pre_attn_scalar (scale^-2 and back), so it is compared to a
// float's rounding; every other value must come back exactly.
bool same_model(const attn::io::HfDecoderConfig& x, const attn::io::HfDecoderConfig& y) {
  const attn::nn::DecoderConfig &a = x.config, &b = y.config;
  for (int64_t i = 0; i < a.num_layers; ++i) {
    if (a.layer_window(i) != b.layer_window(i)) return false;
  }
  const bool scale_same =
      std::fabs(a.attention_scale - b.attention_scale) <= 4e-7f * std::fabs(a.attention_scale);
  return x.model_type == y.model_type && a.vocab_size == b.vocab_size &&
         a.hidden_size == b.hidden_size && a.intermediate_size == b.intermediate_size &&
         a.num_layers == b.num_layers && a.num_heads == b.num_heads &&
         a.num_kv_heads == b.num_kv_heads && a.head_dim == b.head_dim &&
         a.context_length == b.context_length && a.norm_eps == b.norm_eps &&
         a.norm_weight_offset == b.norm_weight_offset && a.qk_norm == b.qk_norm &&
         a.qkv_bias == b.qkv_bias && a.o_bias == b.o_bias && a.sandwich_norms == b.sandwich_norms &&
         a.scale_embeddings == b.scale_embeddings && a.activation == b.activation && scale_same &&
         same_rope(a.rope, b.rope) && same_rope(a.rope_local, b.rope_local) &&
         a.attn_softcap == b.attn_softcap && a.final_softcap == b.final_softcap &&
         a.tie_embeddings == b.tie_embeddings && a.pad_token_id == b.pad_token_id &&
         x.eos_token_ids == y.eos_token_ids && x.bos_token_id == y.bos_token_id &&
         x.unapplied_attn_softcap == y.unapplied_attn_softcap;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  attn::io::HfDecoderConfig hf;
  try {
    hf = attn::io::parse_hf_decoder_config(text, "fuzz/config.json");
  } catch (const std::invalid_argument& e) {
    if (!clean_message(e.what())) finding("a message with raw bytes");
    return 0;
  } catch (...) {
    finding("an exception other than std::invalid_argument");
  }
  const auto& c = hf.config;
  try {
    c.check();
  } catch (...) {
    finding("a config DecoderConfig::check() refuses");
  }
  constexpr int64_t kMax = (int64_t{1} << 31) - 1;
  for (const int64_t v : {c.vocab_size, c.hidden_size, c.intermediate_size, c.num_layers,
                          c.num_heads, c.num_kv_heads, c.head_dim, c.context_length}) {
    if (v < 1 || v > kMax) finding("a size outside [1, 2^31)");
  }
  if (c.num_layers > 4096) finding("more than 4096 layers");
  if (!c.layer_sliding.empty() && static_cast<int64_t>(c.layer_sliding.size()) != c.num_layers)
    finding("layer_sliding not one flag per layer");
  for (const int64_t id : hf.eos_token_ids) {
    if (id < 0) finding("a negative eos id");
  }
  if (c.pad_token_id >= c.vocab_size) finding("a pad id outside the vocabulary");
  std::string json;
  try {
    json = attn::io::hf_decoder_config_json(hf);
  } catch (const std::invalid_argument& e) {
    if (!clean_message(e.what())) finding("a writer message with raw bytes");
    finding("a config read that hf_decoder_config_json cannot write");
  }
  attn::io::HfDecoderConfig again;
  try {
    again = attn::io::parse_hf_decoder_config(json, "fuzz/again.json");
  } catch (...) {
    finding("hf_decoder_config_json's text does not read back");
  }
  if (!same_model(hf, again)) finding("hf_decoder_config_json's text reads back as another model");
  return 0;
}
