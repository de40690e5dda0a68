// libFuzzer target for an attn checkpoint's metadata (issue 46):
// nn::read_checkpoint_metadata (src/model/checkpoint_metadata.cpp) with the
// model config it reads (nn::config_from_json, src/model/model_config.cpp),
// built with clang -fsanitize=fuzzer,address,undefined by
// tests/fuzz/CMakeLists.txt.
//
// Input: the metadata strings of a checkpoint.safetensors header as
// key NUL value NUL key NUL value ... (a NUL-free tail is a key with an empty
// value; a later key replaces an earlier one, as in a std::map). Any input
// must end in one of two ways: a std::invalid_argument whose message holds no
// control byte and no byte that is not valid UTF-8 (outside bytes reach it
// only through attn::printable), or a checkpoint attn can use: tokenizer
// "char" or "gpt2", at most 4096 layers, for "char" vocab_size distinct
// one-character strings; and a config whose values a GPTModel takes (finite
// floats, latent_dim, n_kv_groups and sliding_window_size >= 0), written by
// config_to_json, reads back equal. A crash, a sanitizer report, another
// exception or a result breaking these is a finding.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <set>
#include <stdexcept>
#include <string>

#include "attn/checkpoint.h"
#include "attn/model_config.h"
#include "attn/utf8.h"
#include "fuzz_common.h"

namespace {

using attn::fuzz::clean_message;
using attn::fuzz::finding;

bool same(const attn::nn::GPTConfig& a, const attn::nn::GPTConfig& b) {
  return a.vocab_size == b.vocab_size && a.context_length == b.context_length &&
         a.emb_dim == b.emb_dim && a.n_heads == b.n_heads && a.n_layers == b.n_layers &&
         a.drop_rate == b.drop_rate && a.qkv_bias == b.qkv_bias &&
         a.layer_norm_eps == b.layer_norm_eps && a.tie_embeddings == b.tie_embeddings &&
         a.rope == b.rope && (!a.rope || a.theta_base == b.theta_base) &&
         a.latent_dim == b.latent_dim && a.n_kv_groups == b.n_kv_groups &&
         a.sliding_window_size == b.sliding_window_size &&
         (a.sliding_window_size == 0 || a.sliding_window_stride == b.sliding_window_stride);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  std::map<std::string, std::string> metadata;
  for (size_t at = 0; at < bytes.size();) {
    size_t end = bytes.find('\0', at);
    if (end == std::string::npos) end = bytes.size();
    const std::string key = bytes.substr(at, end - at);
    at = end + 1;
    std::string value;
    if (at < bytes.size()) {
      end = bytes.find('\0', at);
      if (end == std::string::npos) end = bytes.size();
      value = bytes.substr(at, end - at);
      at = end + 1;
    }
    metadata[key] = value;
  }
  attn::nn::Checkpoint ck;
  try {
    ck = attn::nn::read_checkpoint_metadata(metadata, "fuzz/checkpoint.safetensors");
  } catch (const std::invalid_argument& e) {
    if (!clean_message(e.what())) finding("a message with raw bytes");
    return 0;
  } catch (...) {
    finding("an exception other than std::invalid_argument");
  }
  const attn::nn::GPTConfig& c = ck.config;
  if (ck.tokenizer != "char" && ck.tokenizer != "gpt2") finding("a tokenizer not char or gpt2");
  if (c.n_layers > 4096) finding("more than 4096 layers");
  if (ck.tokenizer == "char") {
    if (static_cast<int64_t>(ck.vocab.size()) != c.vocab_size)
      finding("a vocabulary whose size is not vocab_size");
    std::set<std::string> seen;
    for (const std::string& ch : ck.vocab) {
      if (attn::utf8_characters(ch).size() != 1) finding("a vocabulary entry not one character");
      if (!seen.insert(ch).second) finding("a vocabulary entry twice");
    }
  }
  const bool model_values = std::isfinite(c.drop_rate) && std::isfinite(c.layer_norm_eps) &&
                            (!c.rope || std::isfinite(c.theta_base)) && c.latent_dim >= 0 &&
                            c.n_kv_groups >= 0 && c.sliding_window_size >= 0;
  if (!model_values) return 0;  // GPTModel's constructor refuses them, naming the value
  attn::nn::GPTConfig again;
  try {
    again = attn::nn::config_from_json(attn::nn::config_to_json(c), "fuzz/again");
  } catch (...) {
    finding("config_to_json's text does not read back");
  }
  if (!same(c, again)) finding("config_to_json's text reads back different");
  return 0;
}
