// src/text/gpt2_data.h - GPT-2's vocabulary files as they are in data/gpt2/,
// embedded in the library (gpt2_data.cpp).
#pragma once

#include <string_view>

namespace attn::text {

std::string_view gpt2_encoder_json();  // data/gpt2/encoder.json, 1,042,301 bytes
std::string_view gpt2_vocab_bpe();     // data/gpt2/vocab.bpe, 456,318 bytes

}  // namespace attn::text
