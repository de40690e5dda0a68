// tests/bits.h - equality of bits: the assertion of every test that pins them
// (the same bits for any thread count, for a path run twice, for bf16 against
// fp32 on the widened values). Safe for empty tensors and buffers: memcmp on a
// null pointer is undefined even for 0 bytes (UBSan reports it).
#pragma once

#include <cstddef>
#include <cstring>
#include <vector>

#include "attn/tensor.h"

namespace attn::test {

// n bytes at a and at b are the same (true for n = 0, whatever the pointers).
inline bool same_bytes(const void* a, const void* b, size_t n) {
  return n == 0 || std::memcmp(a, b, n) == 0;
}

inline bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && same_bytes(a.data(), b.data(), a.size() * sizeof(float));
}

// The same dtype, the same shape and the same bits (bf16 read through its
// exact widening to float32).
inline bool same_bits(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() && same_bits(a.to_vector(), b.to_vector());
}

}  // namespace attn::test
