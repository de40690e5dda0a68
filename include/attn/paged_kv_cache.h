// attn/paged_kv_cache.h - a key/value cache for many sequences, each at its
// own position: what continuous batching (`attn serve`) decodes with.
//
// DecoderKVCache and GPTKVCache (attn/decoder.h, attn/generate.h) advance B
// sequences together at one shared position. A server's sequences start and
// end at any step, so here each sequence owns a block table instead, as in
// vLLM's PagedAttention: the keys and values of every layer live in one pool
// of fixed-size blocks, and position p of a sequence lives in row
// p % block_size of block table.blocks[p / block_size]. Blocks are taken from
// the pool's free list as a sequence grows (reserve) and returned when it ends
// (release); no sequence holds memory for tokens it never reaches.
//
//   nn::PagedKVCache cache = nn::make_paged_kv_cache(model, /*block_size=*/16,
//                                                    /*num_blocks=*/256);
//   nn::BlockTable a, b;
//   cache.reserve(a, 7);  cache.reserve(b, 1);          // room for the new tokens
//   std::vector<nn::PagedSequence> step = {{&a, 7}, {&b, 1}};
//   Tensor logits = nn::forward_paged(model, ids, step, cache);  // (2, V): one
//   //   batched pass over 8 token rows; a.length 0 -> 7, b.length (say) 40 -> 41
//   cache.release(a);
//
// Layout: per layer, keys and values (num_blocks, block_size, Hkv, hd) float32
// or bfloat16 (rounded as stored: half the memory and the bytes a step reads),
// rotated keys for RoPE models (as DecoderKVCache holds them). A windowed
// (sliding) layer keeps every position too; its attention reads only the
// window. The attention (paged_attention_forward) is the flash-decoding kernel
// (attn/decode_attention.h) reading each sequence's rows through its block
// table: each new query over its own sequence's cached keys up to its
// position, the same maths as SDPA's causal rows; ref::decode_attention_forward
// is its plain specification.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "attn/tensor.h"

namespace attn::nn {

struct PagedKVCacheOptions {
  int64_t num_layers = 0;
  int64_t num_kv_heads = 0;  // Hkv
  int64_t head_dim = 0;      // hd
  int64_t block_size = 16;   // tokens per block
  int64_t num_blocks = 0;    // blocks in the pool
  DType dtype = DType::kFloat32;  // of the keys and values: float32 or bfloat16
};

// One sequence's blocks: position p in blocks[p / block_size], row p % block_size.
struct BlockTable {
  std::vector<int32_t> blocks;
  int64_t length = 0;  // tokens cached: the next token's position
};

class PagedKVCache {
 public:
  // Throws std::invalid_argument naming a size < 1.
  explicit PagedKVCache(const PagedKVCacheOptions& options);
  const PagedKVCacheOptions& options() const { return options_; }
  int64_t block_size() const { return options_.block_size; }
  int64_t num_blocks() const { return options_.num_blocks; }
  int64_t free_blocks() const { return static_cast<int64_t>(free_.size()); }
  // Blocks that hold `tokens` positions: ceil(tokens / block_size).
  int64_t blocks_for(int64_t tokens) const;
  // Grows the table to hold positions [0, tokens); false, the table unchanged,
  // when the pool has too few free blocks.
  bool reserve(BlockTable& table, int64_t tokens);
  // Drops the table's hold on its blocks (a block returns to the pool when
  // nothing holds it any more); the table becomes empty.
  void release(BlockTable& table);
  // Blocks are counted holds: reserve takes free blocks with one hold each;
  // share appends blocks another table filled (their first `tokens`
  // positions, a multiple of block_size) to an empty table, one more hold
  // each, so that two sequences with the same prefix read the same blocks
  // (prefix caching). A shared block must not be written again.
  void share(BlockTable& table, std::span<const int32_t> blocks, int64_t tokens);
  void hold(int32_t block);
  void drop(int32_t block);  // a block nothing holds goes back to the free list
  // Copies the keys and values of the first `rows` positions of block `from`
  // into block `to`, every layer (a cached prefix that ends inside a block,
  // taken into a sequence's own block). Both in use, from != to, rows <= block_size.
  void copy_rows(int32_t from, int32_t to, int64_t rows);
  int32_t holds(int32_t block) const { return holds_.at(static_cast<size_t>(block)); }
  // (num_blocks, block_size, Hkv, hd) of layer `layer`, of options().dtype.
  Tensor& keys(int64_t layer) { return keys_.at(static_cast<size_t>(layer)); }
  Tensor& values(int64_t layer) { return values_.at(static_cast<size_t>(layer)); }
  const Tensor& keys(int64_t layer) const { return keys_.at(static_cast<size_t>(layer)); }
  const Tensor& values(int64_t layer) const { return values_.at(static_cast<size_t>(layer)); }
  int64_t bytes() const;  // the keys and values of the pool

 private:
  PagedKVCacheOptions options_;
  std::vector<Tensor> keys_, values_;
  std::vector<int32_t> free_;  // a stack: the last released block is taken first
  std::vector<int32_t> holds_;  // per block
};

// A sequence's share of one batched step: `count` new tokens at positions
// table->length .. table->length + count - 1. A step's token rows are the
// sequences' new tokens one sequence after another, in the order given.
struct PagedSequence {
  BlockTable* table = nullptr;
  int64_t count = 0;
};

// Checks a step against the cache: every table non-null, count >= 1, blocks
// reserved for length + count positions, each block id in the pool, and no
// table twice. Returns the step's token rows (the sum of the counts). Throws
// std::invalid_argument naming the sequence and the values; `who` begins the
// message.
int64_t check_paged_step(const PagedKVCache& cache, std::span<const PagedSequence> seqs,
                         const char* who);

// Writes the step's new keys and values k, v (N, Hkv, hd) contiguous float32
// into layer `layer` at each sequence's positions (lengths are not advanced;
// rounded to bf16 in a bf16 pool).
void paged_store(PagedKVCache& cache, int64_t layer, std::span<const PagedSequence> seqs,
                 const float* k, const float* v);

// The step's hidden rows h (1, N, E) float32 -> each sequence's last new row
// (1, S, E), what the head turns into the step's logits.
Tensor paged_last_rows(const Tensor& h, std::span<const PagedSequence> seqs);

// Ends a step: every table's length += its count.
void paged_advance(std::span<const PagedSequence> seqs);

struct PagedAttentionOptions {
  int64_t num_heads = 0;  // H, a multiple of Hkv (query head h reads kv head h / (H / Hkv))
  float scale = 0.0f;     // the scores' scale
  int64_t window = 0;     // > 0: the query at p sees positions p - window + 1 .. p
  float softcap = 0.0f;   // > 0: scores become softcap · tanh(s / softcap)
};

// out (N, H, hd) = the causal attention of the step's queries q (N, H, hd),
// each over its own sequence's cached keys and values of layer `layer` at
// positions 0 .. its own (paged_store has written the step's). Flash-decoding
// over the block tables (kernels::decode_attention_forward); a sequence's
// result does not depend on the other sequences of the step or on the thread
// count.
void paged_attention_forward(float* out, const float* q, const PagedKVCache& cache, int64_t layer,
                             std::span<const PagedSequence> seqs,
                             const PagedAttentionOptions& options);

}  // namespace attn::nn
