// attn/decode_attention.h - flash-decoding: the attention of a few new queries
// per sequence (one generated token, a short draft, or a prompt's chunk) over a
// key/value cache of up to context_length tokens (128k and more), with
// grouped-query heads, a sliding window, softcap and ALiBi, value heads of
// their own width, sequences of their own lengths (continuous batching), and a
// dense or paged cache, fp32 or bf16.
//
// Shapes (token-major q and out, as the projections write them and out_proj
// reads them):
//   q      row (b, t) at q + b·q_batch_stride + t·q_stride (varlen: row
//          cu_seqlens_q[b] + t at q + row·q_stride), head h at column h·D
//          (packed: q_stride = Hq·D, q_batch_stride = Tq·q_stride)
//   out    likewise with o_stride, o_batch_stride and head h at column h·Dv
//   keys   row j of kv head g of sequence b (values likewise, Dv wide) at
//            dense: keys + b·k.batch + g·k.head + j·k.row
//                   (default (B, Hkv, capacity, D): row D, head capacity·D)
//            paged: keys + block_table[b·block_table_stride + j / page_block_size]·k.block
//                        + (j % page_block_size)·k.row + g·k.head
//                   (default (num_blocks, page_block_size, Hkv, D): row Hkv·D, head D,
//                   block page_block_size·Hkv·D; vLLM's and attn::nn::PagedKVCache's)
// Query head h reads key/value head h / G, G = Hq / Hkv (grouped-query
// attention; G = 1 is multi-head attention, Hkv = 1 multi-query).
//
// Maths, for sequence b with L_b keys (cache_seqlens[b], else length) and Tq_b
// new queries (cu_seqlens_q[b + 1] - cu_seqlens_q[b], else Tq), query head h,
// new query t < Tq_b and key j < L_b. The new queries are the last Tq_b tokens
// of the sequence (bottom-right causal alignment, FlashAttention 2's): query t
// sits at position p_t = L_b - Tq_b + t and sees the keys
//   j <= p_t                                   (causal)
//   j >= p_t - window_left  when window_left >= 0 (a sliding window of
//                                               window_left + 1 keys, itself included)
//   s_j = scale · q[b, t, h] · keys[b, h / G, j]
//   s_j = softcap · tanh(s_j / softcap)        when softcap > 0 (Gemma 2)
//   s_j += -alibi_slopes[h] · (p_t - j)        when ALiBi slopes are given
//   out[b, t, h] = Σ_j softmax(s)_j · values[b, h / G, j]     over the visible j
// which is attn::sdpa's is_causal with CausalAlignment::kBottomRight,
// window_left, softcap and alibi_slopes (attn/sdpa.h, the same order) on k, v =
// the cache's first L_b rows. Every query sees at least itself, so no row is
// empty.
//
// How the kernel splits and combines (flash-decoding; docs/decode.md):
//   - A sequence's queries are taken kMaxDecodeQueries at a time (a query
//     tile); a tile's keys are cut into chunks of kDecodeChunk at fixed
//     absolute positions [c·kDecodeChunk, (c + 1)·kDecodeChunk), clipped to the
//     keys some query of the tile can see: only those keys are read. The cut
//     does not depend on the thread count.
//   - One work item is (tile, kv head, chunk): it serves all G·Tq query rows of
//     its group, its chunk's key and value rows read from memory once (for the
//     first row; from L2 for the others), and writes for each row a partial
//     result: m (the chunk's largest visible score), l (Σ of exp(s - m)) and o
//     (Σ of exp(s - m) · v, not yet divided). The items are split over OpenMP
//     threads.
//   - Each output row then combines its chunks' partials by log-sum-exp in
//     chunk order: M = max_c m_c, L = Σ_c exp(m_c - M)·l_c,
//     out = Σ_c exp(m_c - M)·o_c / L.
// So every output is the same sequence of float operations for any thread
// count: the results are bit-identical with 1, 2 or 64 threads, and a
// sequence's outputs do not depend on the other sequences of the call.
//
// Element types: q and out fp32 or bf16, keys and values fp32 or bf16 (a bf16
// cache under fp32 queries halves the bytes a step reads). bf16 rows are
// widened to fp32 exactly as they are loaded; every product is exact in fp32,
// scores, softmax and sums are fp32, and a bf16 out is rounded once.
//
// SIMD: Highway dynamic dispatch (AVX-512, AVX2, SSE4, scalar), forced with
// kernels::flash_attention_use_target (attn/kernels.h). ref:: beside it is the
// plain specification: one query row at a time over all its visible keys, no
// chunks.
#pragma once

#include <cstdint>

namespace attn {
struct BFloat16;  // attn/bfloat16.h
}  // namespace attn

namespace attn {

// Query rows per sequence in one work item (a longer run of new queries is
// taken in tiles of this many), and the most the decoders send to this kernel
// rather than to the tiled SDPA kernel.
constexpr int64_t kMaxDecodeQueries = 16;
// Keys per chunk (a work item's share of one kv head): 256 rows of 64 fp32 are
// 64 KiB of keys and 64 KiB of values, read from memory once and reused from L2
// for every query row of the group.
constexpr int64_t kDecodeChunk = 256;

// Where the rows of a key (or value) cache lie, in elements; 0: the default
// of the layout (above).
struct DecodeCacheStrides {
  int64_t row = 0;    // between rows j, j + 1 (within a page when paged)
  int64_t head = 0;   // between kv heads g, g + 1
  int64_t batch = 0;  // dense: between sequences b, b + 1
  int64_t block = 0;  // paged: between pages (blocks) of the pool
};

struct DecodeProblem {
  int64_t B = 1;             // sequences
  int64_t Hq = 1;            // query heads
  int64_t Hkv = 1;           // key/value heads; Hq a multiple of it
  int64_t Tq = 1;            // new queries per sequence (>= 1); unused with cu_seqlens_q
  int64_t length = 1;        // keys in the cache (the new ones included), Tq <= length <= capacity;
                             // unused with cache_seqlens
  int64_t capacity = 1;      // dense: rows per (b, kv head); paged: unused
  int64_t D = 1;             // head dim of q and keys
  int64_t Dv = 0;            // head dim of values and out; 0: D
  float scale = 1.0f;        // usually 1 / sqrt(D)
  int64_t window_left = -1;  // -1: unbounded; >= 0: keys j >= p_t - window_left only
  float softcap = 0.0f;      // > 0: scores become softcap · tanh(s / softcap)
  const float* alibi_slopes = nullptr;  // Hq slopes, or nullptr: no ALiBi
  int64_t q_stride = 0;                 // elements between the query rows t, t + 1; 0: Hq·D
  int64_t o_stride = 0;                 // elements between output rows; 0: Hq·Dv
  int64_t q_batch_stride = 0;  // elements between sequences b, b + 1 of q; 0: Tq·q_stride
  int64_t o_batch_stride = 0;  // of out; 0: Tq·o_stride
  // Sequences of their own sizes (FlashAttention 2's flash_attn_with_kvcache):
  const int64_t* cu_seqlens_q = nullptr;   // B + 1 row offsets of q and out, from 0, increasing
  const int64_t* cache_seqlens = nullptr;  // B lengths L_b >= Tq_b
  // The cache's rows.
  DecodeCacheStrides k_strides = {}, v_strides = {};
  const int32_t* block_table = nullptr;  // paged: (B, block_table_stride) page ids
  int64_t block_table_stride = 0;        // pages per sequence in the table; L_b <= it · page size
  int64_t page_block_size = 0;           // rows per page
  int64_t num_pages = 0;                 // pages in the pool: every id read is checked below it
};

// Throws std::invalid_argument naming the values (sizes < 1, Hq not a multiple
// of Hkv, Tq < 1 or above length, length above capacity, cu_seqlens_q not
// increasing from 0, a cache length below its queries or past the cache,
// window_left < -1, a softcap negative or not finite, a row stride below Hq·D
// (Hq·Dv), a batch stride below Tq·row stride, a cache stride that lets rows
// or heads overlap, a page size < 1, a scale not finite); returns p with the
// defaults filled in. Called by every function below.
DecodeProblem validated(const DecodeProblem& p);

// Where things lie, for p = validated(...): sequence b's new queries and keys,
// the offsets (in elements) of its query row t, output row t, and of row j of
// kv head g in a cache with strides c (p.k_strides or p.v_strides).
inline int64_t decode_queries(const DecodeProblem& p, int64_t b) {
  return p.cu_seqlens_q ? p.cu_seqlens_q[b + 1] - p.cu_seqlens_q[b] : p.Tq;
}
inline int64_t decode_keys(const DecodeProblem& p, int64_t b) {
  return p.cache_seqlens ? p.cache_seqlens[b] : p.length;
}
inline int64_t decode_q_offset(const DecodeProblem& p, int64_t b, int64_t t) {
  return p.cu_seqlens_q ? (p.cu_seqlens_q[b] + t) * p.q_stride
                        : b * p.q_batch_stride + t * p.q_stride;
}
inline int64_t decode_o_offset(const DecodeProblem& p, int64_t b, int64_t t) {
  return p.cu_seqlens_q ? (p.cu_seqlens_q[b] + t) * p.o_stride
                        : b * p.o_batch_stride + t * p.o_stride;
}
inline int64_t decode_cache_offset(const DecodeProblem& p, const DecodeCacheStrides& c, int64_t b,
                                   int64_t g, int64_t j) {
  if (p.block_table == nullptr) return b * c.batch + g * c.head + j * c.row;
  const int64_t page = p.block_table[b * p.block_table_stride + j / p.page_block_size];
  return page * c.block + (j % p.page_block_size) * c.row + g * c.head;
}

namespace ref {
// The specification: for each (b, t, h) the scores of the visible keys in
// fp32, their softmax and the weighted sum of values, in key order. bf16
// operands widened to fp32 exactly; a bf16 out rounded once.
void decode_attention_forward(float* out, const float* q, const float* keys, const float* values,
                              const DecodeProblem& p);
void decode_attention_forward(float* out, const float* q, const BFloat16* keys,
                              const BFloat16* values, const DecodeProblem& p);
void decode_attention_forward_bf16(BFloat16* out, const BFloat16* q, const BFloat16* keys,
                                   const BFloat16* values, const DecodeProblem& p);
}  // namespace ref

namespace kernels {
// The flash-decoding kernel (above); pointers as in the shapes; out may not
// overlap the inputs. fp32 queries over an fp32 or a bf16 cache; bf16 queries
// and out over a bf16 cache.
void decode_attention_forward(float* out, const float* q, const float* keys, const float* values,
                              const DecodeProblem& p);
void decode_attention_forward(float* out, const float* q, const BFloat16* keys,
                              const BFloat16* values, const DecodeProblem& p);
void decode_attention_forward_bf16(BFloat16* out, const BFloat16* q, const BFloat16* keys,
                                   const BFloat16* values, const DecodeProblem& p);
// Bytes of keys and values one call reads: for each (b, kv head) the rows some
// query can see, once (what `attn bench --kind decode` divides by the time).
int64_t decode_attention_kv_bytes(const DecodeProblem& p, int64_t element_bytes);
}  // namespace kernels

}  // namespace attn
