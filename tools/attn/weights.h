// weights.h - checks on a model's weights before they are used or written.
#pragma once

#include <string>

#include "attn/nn.h"

namespace attn::cli {

// "" when every parameter of the model is finite; else the first one holding
// a NaN or an infinity, as "the weight 'NAME' holds nan at index I": a
// diverged run must not be written, and a model whose weights are not finite
// generates nothing but NaN logits.
std::string non_finite_weight(nn::Module& model);

// Throws std::runtime_error when `path` (a command's --model) does not exist,
// saying where models come from (README.md, "Where models come from"): the
// Hugging Face Hub's repositories (GPT-2 is openai-community/gpt2), attn
// train's --out, or the tiny GPT-2 that ships for trying commands offline.
void require_model_dir(const std::string& path);

}  // namespace attn::cli
