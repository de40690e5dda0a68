// The storage cache (attn/tensor.h, src/tensor/storage_cache.h): freed blocks
// of kStorageCacheMinBytes or more wait here, in order of freeing, for the
// next request of their size.
#include "tensor/storage_cache.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <iterator>
#include <list>
#include <map>
#include <mutex>
#include <new>
#include <stdexcept>

#if defined(__linux__)
#include <sys/mman.h>
#endif

#include "attn/tensor.h"

namespace attn {
namespace detail {
namespace {

// Under AddressSanitizer the cache starts off: a block handed out again would
// hide a use after free from it.
#if defined(__SANITIZE_ADDRESS__)
constexpr bool kAddressSanitizer = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
constexpr bool kAddressSanitizer = true;
#else
constexpr bool kAddressSanitizer = false;
#endif
#else
constexpr bool kAddressSanitizer = false;
#endif

constexpr size_t kAlignment = 64;     // a cache line, and an AVX-512 register
constexpr size_t kLargeRound = 4096;  // a page: large sizes round up to this

size_t round_up(size_t n, size_t to) { return (n + to - 1) / to * to; }

// Blocks from this size on start on a 2 MiB boundary and ask the kernel for
// transparent huge pages (Linux, where THP is "madvise"): a GPT's weight
// matrices, streamed once per generated token, then cost one TLB entry per
// 2 MiB instead of one per 4 KiB page (docs/performance.md, "What moved the figures"). The
// alignment costs address space, not memory: only touched pages are backed.
constexpr size_t kHugePage = size_t{2} << 20;

std::byte* allocate_from_libc(size_t bytes) {
  void* p = nullptr;
  if (bytes >= kHugePage) {
    if (posix_memalign(&p, kHugePage, bytes) != 0) throw std::bad_alloc();
#ifdef MADV_HUGEPAGE
    madvise(p, bytes, MADV_HUGEPAGE);  // a hint: where it fails, small pages serve
#endif
    return static_cast<std::byte*>(p);
  }
  // aligned_alloc wants a size that is a multiple of the alignment (bytes is one).
  p = std::aligned_alloc(kAlignment, bytes);
  if (p == nullptr) throw std::bad_alloc();
  return static_cast<std::byte*>(p);
}

class Cache {
 public:
  // A cached block of exactly this size, or nullptr.
  std::byte* take(size_t bytes) {
    std::lock_guard lock(mutex_);
    const auto it = by_size_.find(bytes);
    if (it == by_size_.end()) {
      ++misses_;
      return nullptr;
    }
    ++hits_;
    std::byte* p = it->second->data;
    cached_bytes_ -= bytes;
    freed_.erase(it->second);
    by_size_.erase(it);
    return p;
  }

  // Keeps the block, releasing the least recently freed ones to stay within
  // the limit (or the block itself when it alone passes the limit).
  void put(Block block) {
    std::unique_lock lock(mutex_);
    if (block.bytes > limit_) {
      lock.unlock();
      std::free(block.data);
      return;
    }
    freed_.push_back(block);
    by_size_.emplace(block.bytes, std::prev(freed_.end()));
    cached_bytes_ += block.bytes;
    trim_to(limit_);
  }

  void set_limit(size_t bytes) {
    std::lock_guard lock(mutex_);
    limit_ = bytes;
    trim_to(limit_);
  }

  void release() {
    std::lock_guard lock(mutex_);
    trim_to(0);
  }

  StorageCacheStats stats() {
    std::lock_guard lock(mutex_);
    return {static_cast<int64_t>(cached_bytes_), static_cast<int64_t>(freed_.size()),
            static_cast<int64_t>(limit_), hits_, misses_};
  }

 private:
  // Releases the oldest blocks until at most `bytes` are cached.
  void trim_to(size_t bytes) {
    while (cached_bytes_ > bytes) {
      const Block oldest = freed_.front();
      auto range = by_size_.equal_range(oldest.bytes);
      for (auto it = range.first; it != range.second; ++it) {
        if (it->second == freed_.begin()) {
          by_size_.erase(it);
          break;
        }
      }
      freed_.pop_front();
      cached_bytes_ -= oldest.bytes;
      std::free(oldest.data);
    }
  }

  std::mutex mutex_;
  std::list<Block> freed_;                                     // oldest first
  std::multimap<size_t, std::list<Block>::iterator> by_size_;  // into freed_
  size_t cached_bytes_ = 0;
  size_t limit_ = kAddressSanitizer ? 0 : static_cast<size_t>(kStorageCacheDefaultLimit);
  int64_t hits_ = 0, misses_ = 0;
};

// Never destroyed: storages freed by other static destructors at exit still
// find it, and the blocks it holds stay reachable (no leak report).
Cache& cache() {
  static Cache* c = new Cache;
  return *c;
}

bool is_large(size_t bytes) { return bytes >= static_cast<size_t>(kStorageCacheMinBytes); }

}  // namespace

Block allocate_block(size_t bytes) {
  if (!is_large(bytes)) {
    const size_t rounded = std::max(round_up(bytes, kAlignment), kAlignment);
    return {allocate_from_libc(rounded), rounded};
  }
  const size_t rounded = round_up(bytes, kLargeRound);
  if (std::byte* p = cache().take(rounded)) return {p, rounded};
  return {allocate_from_libc(rounded), rounded};
}

void free_block(Block block) {
  if (block.data == nullptr) return;
  if (!is_large(block.bytes)) {
    std::free(block.data);
    return;
  }
  cache().put(block);
}

}  // namespace detail

StorageCacheStats storage_cache_stats() { return detail::cache().stats(); }

void set_storage_cache_limit(int64_t bytes) {
  if (bytes < 0) {
    throw std::invalid_argument(
        fmt::format("set_storage_cache_limit: the limit must be >= 0 bytes, got {}", bytes));
  }
  detail::cache().set_limit(static_cast<size_t>(bytes));
}

void release_cached_storage() { detail::cache().release(); }

}  // namespace attn
