// src/nn/checks.h - the input checks the modules share, with messages that
// name the module and the values.
#pragma once

#include <fmt/format.h>

#include <cstdint>
#include <stdexcept>
#include <string>

#include "attn/tensor.h"

namespace attn::nn::detail {

// A size option and the name the module's constructor gives it.
struct NamedSize {
  const char* name;
  int64_t value;
};

// A batched input (B, T, width) with B, T >= 1 and, when limit.value > 0,
// T <= limit ("CausalAttention: input has 7 tokens but context_length is 6").
inline void check_btd(const char* module, const Tensor& x, NamedSize width,
                      NamedSize limit = {"context_length", 0}) {
  if (x.dim() != 3) {
    throw std::invalid_argument(fmt::format("{}: expected input of shape (B, T, {}), got {}",
                                            module, width.name, shape_str(x.shape())));
  }
  if (x.size(2) != width.value) {
    throw std::invalid_argument(fmt::format("{}: input last dim {} does not match {} {}", module,
                                            x.size(2), width.name, width.value));
  }
  if (x.size(0) < 1)
    throw std::invalid_argument(fmt::format("{}: input has batch size {}", module, x.size(0)));
  if (x.size(1) < 1)
    throw std::invalid_argument(fmt::format("{}: input has {} tokens", module, x.size(1)));
  if (limit.value > 0 && x.size(1) > limit.value) {
    throw std::invalid_argument(fmt::format("{}: input has {} tokens but {} is {}", module,
                                            x.size(1), limit.name, limit.value));
  }
}

// A size option that must be >= 1.
inline void check_positive(const char* module, const char* name, int64_t value) {
  if (value < 1)
    throw std::invalid_argument(
        fmt::format("{}: {} must be positive, got {}", module, name, value));
}

// A dropout probability: Dropout's own check, which the attention modules run
// before their Linear layers draw ("Dropout: p must be in [0, 1], got 1.5").
inline void check_dropout(float p) {
  if (!(p >= 0.0f && p <= 1.0f))
    throw std::invalid_argument(fmt::format("Dropout: p must be in [0, 1], got {}", p));
}

// An output gradient of the shape the last forward produced.
inline void check_grad(const char* module, const Tensor& dy, const Shape& expected) {
  if (dy.shape() != expected) {
    throw std::invalid_argument(fmt::format("{}: gradient shape {} does not match output shape {}",
                                            module, shape_str(dy.shape()), shape_str(expected)));
  }
}

}  // namespace attn::nn::detail
