// attn/fnv1a.h - FNV-1a, 64 bits: the checksum of token shards and their
// manifest, and the hash data-parallel ranks compare their settings by.
#pragma once

#include <cstddef>
#include <cstdint>

namespace attn {

// FNV-1a over `size` bytes (offset basis 14695981039346656037, prime
// 1099511628211), continued from `hash`: pass the previous result to hash a
// sequence in pieces.
inline constexpr uint64_t kFnv1a64Basis = 14695981039346656037ULL;
uint64_t fnv1a64(const void* data, size_t size, uint64_t hash = kFnv1a64Basis);

}  // namespace attn
