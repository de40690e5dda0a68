// weights.cpp - checks on a model's weights (weights.h).
#include "weights.h"

#include <fmt/format.h>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <stdexcept>
#include <system_error>

#include "attn/bfloat16.h"
#include "attn/tensor.h"
#include "attn/utf8.h"

namespace attn::cli {
namespace {

// The index of the first NaN or infinity of t (row-major), -1 when none.
int64_t first_non_finite(const Tensor& t) {
  const Tensor c = t.contiguous();
  const int64_t n = c.numel();
  if (n == 0) return -1;
  if (c.dtype() == DType::kFloat32) {
    const float* p = c.data_ptr<float>();
    for (int64_t i = 0; i < n; ++i)
      if (!std::isfinite(p[i])) return i;
  } else if (c.dtype() == DType::kBFloat16) {
    const BFloat16* p = c.data_ptr<BFloat16>();
    for (int64_t i = 0; i < n; ++i)
      if ((p[i].bits & 0x7F80u) == 0x7F80u) return i;  // exponent all ones: inf or NaN
  }
  return -1;
}

}  // namespace

std::string non_finite_weight(nn::Module& model) {
  for (const auto& [name, p] : model.named_parameters()) {
    const int64_t i = first_non_finite(p->value);
    if (i < 0) continue;
    const Tensor c = p->value.contiguous();
    const float v =
        c.dtype() == DType::kFloat32 ? c.data_ptr<float>()[i] : to_float(c.data_ptr<BFloat16>()[i]);
    return fmt::format("the weight '{}' holds {} at index {}", printable(name), v, i);
  }
  return {};
}

void require_model_dir(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::exists(path, ec)) return;
  throw std::runtime_error(fmt::format(
      "model directory '{}' does not exist. Models come from the Hugging Face Hub (GPT-2 is "
      "openai-community/gpt2: git clone https://huggingface.co/openai-community/gpt2, or any tool "
      "that downloads a model repository; Llama 3, Qwen3 and Gemma 3 the same way) or from attn "
      "train --out; tests/fixtures/hf_gpt2/fp32 in attn's checkout is a tiny GPT-2 for trying "
      "every command offline (README.md, \"Where models come from\")",
      printable(path)));
}

}  // namespace attn::cli
