// The paged key/value cache and its attention (attn/paged_kv_cache.h).
#include "attn/paged_kv_cache.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <unordered_set>
#include <vector>

#include "attn/decode_attention.h"
#include "attn/layer_kernels.h"

namespace attn::nn {

PagedKVCache::PagedKVCache(const PagedKVCacheOptions& options) : options_(options) {
  const PagedKVCacheOptions& o = options;
  if (o.num_layers < 1 || o.num_kv_heads < 1 || o.head_dim < 1 || o.block_size < 1 ||
      o.num_blocks < 1 || o.num_blocks > std::numeric_limits<int32_t>::max()) {
    throw std::invalid_argument(fmt::format(
        "PagedKVCache: num_layers, num_kv_heads, head_dim, block_size and num_blocks must be >= 1 "
        "(num_blocks < 2^31), got {}, {}, {}, {}, {}",
        o.num_layers, o.num_kv_heads, o.head_dim, o.block_size, o.num_blocks));
  }
  if (o.dtype != DType::kFloat32 && o.dtype != DType::kBFloat16) {
    throw std::invalid_argument(fmt::format(
        "PagedKVCache: the pool holds float32 or bfloat16, got {}", dtype_name(o.dtype)));
  }
  for (int64_t l = 0; l < o.num_layers; ++l) {
    keys_.push_back(
        Tensor::zeros({o.num_blocks, o.block_size, o.num_kv_heads, o.head_dim}, o.dtype));
    values_.push_back(
        Tensor::zeros({o.num_blocks, o.block_size, o.num_kv_heads, o.head_dim}, o.dtype));
  }
  holds_.assign(static_cast<size_t>(o.num_blocks), 0);
  free_.reserve(static_cast<size_t>(o.num_blocks));
  for (int64_t b = o.num_blocks - 1; b >= 0; --b) free_.push_back(static_cast<int32_t>(b));
}

int64_t PagedKVCache::blocks_for(int64_t tokens) const {
  return tokens <= 0 ? 0 : (tokens + options_.block_size - 1) / options_.block_size;
}

bool PagedKVCache::reserve(BlockTable& table, int64_t tokens) {
  const int64_t need = blocks_for(tokens) - static_cast<int64_t>(table.blocks.size());
  if (need <= 0) return true;
  if (need > free_blocks()) return false;
  for (int64_t i = 0; i < need; ++i) {
    table.blocks.push_back(free_.back());
    holds_[static_cast<size_t>(free_.back())] = 1;
    free_.pop_back();
  }
  return true;
}

void PagedKVCache::hold(int32_t block) {
  if (block < 0 || block >= num_blocks() || holds_[static_cast<size_t>(block)] < 1) {
    throw std::invalid_argument(fmt::format(
        "PagedKVCache::hold: block {} is not in use (pool of {})", block, num_blocks()));
  }
  ++holds_[static_cast<size_t>(block)];
}

void PagedKVCache::drop(int32_t block) {
  if (block < 0 || block >= num_blocks() || holds_[static_cast<size_t>(block)] < 1) {
    throw std::invalid_argument(fmt::format(
        "PagedKVCache::drop: block {} is not in use (pool of {})", block, num_blocks()));
  }
  if (--holds_[static_cast<size_t>(block)] == 0) free_.push_back(block);
}

void PagedKVCache::share(BlockTable& table, std::span<const int32_t> blocks, int64_t tokens) {
  if (!table.blocks.empty() || tokens != static_cast<int64_t>(blocks.size()) * block_size()) {
    throw std::invalid_argument(fmt::format(
        "PagedKVCache::share: an empty table takes whole blocks, got a table of {} blocks, {} "
        "blocks for {} tokens",
        table.blocks.size(), blocks.size(), tokens));
  }
  for (const int32_t b : blocks) {
    if (b < 0 || b >= num_blocks() || holds_[static_cast<size_t>(b)] < 1) {
      throw std::invalid_argument(
          fmt::format("PagedKVCache::share: block {} is not in use (pool of {})", b, num_blocks()));
    }
  }
  for (const int32_t b : blocks) ++holds_[static_cast<size_t>(b)];
  table.blocks.assign(blocks.begin(), blocks.end());
  table.length = tokens;
}

void PagedKVCache::copy_rows(int32_t from, int32_t to, int64_t rows) {
  auto in_use = [&](int32_t b) {
    return b >= 0 && b < num_blocks() && holds_[static_cast<size_t>(b)] >= 1;
  };
  if (!in_use(from) || !in_use(to) || from == to || rows < 0 || rows > block_size()) {
    throw std::invalid_argument(fmt::format(
        "PagedKVCache::copy_rows: blocks {} -> {} (pool of {}, both in use and apart), rows {} "
        "(0..{})",
        from, to, num_blocks(), rows, block_size()));
  }
  // A block is (block_size, Hkv, hd) contiguous elements of each layer's pool.
  const int64_t row = options_.num_kv_heads * options_.head_dim * element_size(options_.dtype);
  const int64_t block = block_size() * row;
  for (size_t l = 0; l < keys_.size(); ++l) {
    for (Tensor* t : {&keys_[l], &values_[l]}) {
      auto* base = options_.dtype == DType::kFloat32
                       ? reinterpret_cast<std::byte*>(t->data_ptr<float>())
                       : reinterpret_cast<std::byte*>(t->data_ptr<BFloat16>());
      std::memcpy(base + to * block, base + from * block, static_cast<size_t>(rows * row));
    }
  }
}

void PagedKVCache::release(BlockTable& table) {
  for (auto it = table.blocks.rbegin(); it != table.blocks.rend(); ++it) drop(*it);
  table.blocks.clear();
  table.length = 0;
}

int64_t PagedKVCache::bytes() const {
  int64_t n = 0;
  const int64_t size = element_size(options_.dtype);
  for (size_t l = 0; l < keys_.size(); ++l) n += size * (keys_[l].numel() + values_[l].numel());
  return n;
}

int64_t check_paged_step(const PagedKVCache& cache, std::span<const PagedSequence> seqs,
                         const char* who) {
  if (seqs.empty()) throw std::invalid_argument(fmt::format("{}: the step has no sequences", who));
  int64_t rows = 0;
  std::unordered_set<const BlockTable*> seen;
  for (size_t s = 0; s < seqs.size(); ++s) {
    const PagedSequence& q = seqs[s];
    if (q.table == nullptr || q.count < 1) {
      throw std::invalid_argument(fmt::format(
          "{}: sequence {} needs a block table and count >= 1, got count {}", who, s, q.count));
    }
    if (!seen.insert(q.table).second) {
      throw std::invalid_argument(
          fmt::format("{}: sequence {}'s block table is given twice", who, s));
    }
    const int64_t end = q.table->length + q.count;
    const int64_t held = static_cast<int64_t>(q.table->blocks.size()) * cache.block_size();
    if (q.table->length < 0 || end > held) {
      throw std::invalid_argument(fmt::format(
          "{}: sequence {} has {} new tokens at position {} but blocks for {} positions (reserve "
          "them first)",
          who, s, q.count, q.table->length, held));
    }
    for (const int32_t b : q.table->blocks) {
      if (b < 0 || b >= cache.num_blocks()) {
        throw std::invalid_argument(fmt::format("{}: sequence {} names block {} of a pool of {}",
                                                who, s, b, cache.num_blocks()));
      }
    }
    rows += q.count;
  }
  return rows;
}

void paged_store(PagedKVCache& cache, int64_t layer, std::span<const PagedSequence> seqs,
                 const float* k, const float* v) {
  const int64_t bs = cache.block_size();
  const int64_t row = cache.options().num_kv_heads * cache.options().head_dim;  // Hkv·hd
  const bool bf16 = cache.options().dtype == DType::kBFloat16;
  Tensor& K = cache.keys(layer);
  Tensor& V = cache.values(layer);
  int64_t n = 0;
  for (const PagedSequence& s : seqs) {
    for (int64_t t = 0; t < s.count; ++t, ++n) {
      const int64_t p = s.table->length + t;
      const int64_t slot =
          static_cast<int64_t>(s.table->blocks[static_cast<size_t>(p / bs)]) * bs + p % bs;
      if (bf16) {
        kernels::round_to_bf16(K.data_ptr<BFloat16>() + slot * row, k + n * row, row);
        kernels::round_to_bf16(V.data_ptr<BFloat16>() + slot * row, v + n * row, row);
      } else {
        std::copy_n(k + n * row, row, K.data() + slot * row);
        std::copy_n(v + n * row, row, V.data() + slot * row);
      }
    }
  }
}

Tensor paged_last_rows(const Tensor& h, std::span<const PagedSequence> seqs) {
  const Tensor hc = h.contiguous();
  const int64_t S = static_cast<int64_t>(seqs.size()), E = hc.size(-1);
  Tensor last = Tensor::empty({1, S, E});
  int64_t row = 0;
  for (int64_t s = 0; s < S; ++s) {
    row += seqs[static_cast<size_t>(s)].count;
    std::copy_n(hc.data() + (row - 1) * E, E, last.data() + s * E);
  }
  return last;
}

void paged_advance(std::span<const PagedSequence> seqs) {
  for (const PagedSequence& s : seqs) s.table->length += s.count;
}

void paged_attention_forward(float* out, const float* q, const PagedKVCache& cache, int64_t layer,
                             std::span<const PagedSequence> seqs,
                             const PagedAttentionOptions& options) {
  const int64_t H = options.num_heads, Hkv = cache.options().num_kv_heads,
                hd = cache.options().head_dim;
  if (H < 1 || H % Hkv != 0) {
    throw std::invalid_argument(fmt::format(
        "paged_attention_forward: num_heads ({}) must be a multiple of num_kv_heads ({})", H, Hkv));
  }
  // The step as sequences of their own lengths over their block tables
  // (FlashAttention 2's flash_attn_with_kvcache): sequence s's queries are the
  // rows cu[s] .. cu[s + 1] of q, the last of its length + count positions.
  const int64_t S = static_cast<int64_t>(seqs.size());
  std::vector<int64_t> cu(static_cast<size_t>(S + 1), 0), lengths(static_cast<size_t>(S));
  int64_t pages = 1;
  for (int64_t s = 0; s < S; ++s) {
    const PagedSequence& seq = seqs[static_cast<size_t>(s)];
    cu[size_t(s + 1)] = cu[size_t(s)] + seq.count;
    lengths[size_t(s)] = seq.table->length + seq.count;
    pages = std::max(pages, static_cast<int64_t>(seq.table->blocks.size()));
  }
  std::vector<int32_t> table(static_cast<size_t>(S * pages), 0);
  for (int64_t s = 0; s < S; ++s) {
    const std::vector<int32_t>& blocks = seqs[static_cast<size_t>(s)].table->blocks;
    std::copy(blocks.begin(), blocks.end(), table.begin() + s * pages);
  }
  DecodeProblem p;
  p.B = S;
  p.Hq = H;
  p.Hkv = Hkv;
  p.D = hd;
  p.scale = options.scale;
  p.window_left = options.window > 0 ? options.window - 1 : -1;
  p.softcap = options.softcap;
  p.cu_seqlens_q = cu.data();
  p.cache_seqlens = lengths.data();
  p.block_table = table.data();
  p.block_table_stride = pages;
  p.page_block_size = cache.block_size();
  p.num_pages = cache.num_blocks();
  const Tensor& K = cache.keys(layer);
  const Tensor& V = cache.values(layer);
  if (cache.options().dtype == DType::kBFloat16) {
    kernels::decode_attention_forward(out, q, K.data_ptr<BFloat16>(), V.data_ptr<BFloat16>(), p);
  } else {
    kernels::decode_attention_forward(out, q, K.data(), V.data(), p);
  }
}

}  // namespace attn::nn
