// libFuzzer target for Hugging Face GPT-2's config.json reader
// (src/io/hf_gpt2_config.cpp, io::parse_hf_gpt2_config), built with clang
// -fsanitize=fuzzer,address,undefined by tests/fuzz/CMakeLists.txt.
//
// Input: the text of a config.json. Any input must end in one of two ways: a
// std::invalid_argument whose message holds no control byte and no byte that
// is not valid UTF-8 (outside bytes reach it only through attn::printable),
// or a config attn can build: every size in [1, 2^31), n_embd divisible by
// n_head, q|k|v bias on, a finite layer_norm_eps > 0, and a tanh GELU. A
// crash, a sanitizer report, another exception or a config breaking these is a
// finding.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <string_view>

#include "attn/hf_gpt2.h"
#include "attn/utf8.h"
#include "fuzz_common.h"

namespace {

using attn::fuzz::clean_message;
using attn::fuzz::finding;

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  attn::io::HfGpt2Config hf;
  try {
    hf = attn::io::parse_hf_gpt2_config(text, "fuzz/config.json");
  } catch (const std::invalid_argument& e) {
    if (!clean_message(e.what())) finding("a message with raw bytes");
    return 0;
  } catch (...) {
    finding("an exception other than std::invalid_argument");
  }
  const auto& c = hf.config;
  constexpr int64_t kMax = (int64_t{1} << 31) - 1;
  for (const int64_t v : {c.emb_dim, c.n_layers, c.n_heads, c.context_length, c.vocab_size}) {
    if (v < 1 || v > kMax) finding("a size outside [1, 2^31)");
  }
  if (c.emb_dim % c.n_heads != 0) finding("n_embd not divisible by n_head");
  if (!c.qkv_bias) finding("no q|k|v bias");
  if (!(c.layer_norm_eps > 0.0f) || !std::isfinite(c.layer_norm_eps)) finding("a bad layer_norm_eps");
  if (hf.activation_function != "gelu_new" && hf.activation_function != "gelu_pytorch_tanh")
    finding("an activation attn does not compute");
  return 0;
}
