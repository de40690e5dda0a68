// The allocator behind attn::Storage (attn/tensor.h): 64-byte-aligned blocks
// from the C library, with the freed large ones kept for reuse (the storage
// cache, whose public controls attn/tensor.h declares).
#pragma once

#include <cstddef>

namespace attn::detail {

struct Block {
  std::byte* data = nullptr;
  size_t bytes = 0;  // the block's size, >= the size asked for
};

// A block of at least `bytes` bytes (a 64-byte one for 0), 64-byte aligned;
// throws std::bad_alloc when the C library has none.
Block allocate_block(size_t bytes);
// Gives back a block from allocate_block (kept in the cache when it is large).
void free_block(Block block);

}  // namespace attn::detail
