// attn/decode_attention.h - flash-decoding: the attention of a few new queries
// (Tq = 1 .. 16: one generated token, or a short draft) over a key/value cache
// of up to context_length tokens (128k and more), with grouped-query heads and
// a sliding window, in fp32 or over a bf16 cache.
//
// Shapes (the KV cache's layout, attn/kv_cache.h; token-major q and out, as the
// projections write them and out_proj reads them):
//   q      (B, Tq, Hq·D)  row (b, t) at q + b·q_batch_stride + t·q_stride, head h at
//                         column h·D (packed: q_stride = Hq·D, q_batch_stride = Tq·q_stride)
//   keys   (B, Hkv, capacity, D)   rows [0, length) filled (the new tokens' included)
//   values (B, Hkv, capacity, D)
//   out    (B, Tq, Hq·D)  row (b, t) at out + b·o_batch_stride + t·o_stride, head h at
//                         column h·D (packed likewise)
// Query head h reads key/value head h / G, G = Hq / Hkv (grouped-query
// attention; G = 1 is multi-head attention, Hkv = 1 multi-query).
//
// Maths, for batch b, query head h, new query t < Tq and key j < length. The
// Tq new queries are the last Tq tokens of the sequence (bottom-right causal
// alignment, FlashAttention 2's): query t sits at position p_t = length - Tq + t
// and sees the keys
//   j <= p_t                                   (causal)
//   j >= p_t - window_left  when window_left >= 0 (a sliding window of
//                                               window_left + 1 keys, itself included)
//   s_j = scale · q[b, t, h] · keys[b, h / G, j]
//   out[b, t, h] = Σ_j softmax(s)_j · values[b, h / G, j]     over the visible j
// which is attn::sdpa's is_causal with CausalAlignment::kBottomRight and
// window_left (attn/sdpa.h) on k, v = the cache's first `length` rows. Every
// query sees at least itself, so no row is empty.
//
// How the kernel splits and combines (flash-decoding; docs/decode.md):
//   - The keys are cut into chunks of kDecodeChunk at fixed absolute positions
//     [c·kDecodeChunk, (c + 1)·kDecodeChunk), clipped to the keys some query of
//     the call can see ([max(0, length - Tq - window_left), length)): only those
//     keys are read. The cut does not depend on the thread count.
//   - One work item is (b, kv head, chunk): it serves all G·Tq query rows of
//     its group, its chunk's key and value rows read from memory once (for the
//     first row; from L2 for the others), and writes for each row a partial
//     result: m (the chunk's largest visible score), l (Σ of exp(s - m)) and o
//     (Σ of exp(s - m) · v, not yet divided). The items are split over OpenMP
//     threads.
//   - Each output row then combines its chunks' partials by log-sum-exp in
//     chunk order: M = max_c m_c, L = Σ_c exp(m_c - M)·l_c,
//     out = Σ_c exp(m_c - M)·o_c / L.
// So every output is the same sequence of float operations for any thread
// count: the results are bit-identical with 1, 2 or 64 threads.
//
// fp32: q, keys, values and out fp32. bf16: q, keys, values bf16, every product
// exact in fp32, scores, softmax and sums fp32, out rounded to bf16 once.
//
// SIMD: Highway dynamic dispatch (AVX-512, AVX2, SSE4, scalar), forced with
// kernels::flash_attention_use_target (attn/kernels.h); a bf16 row is widened to
// fp32 (exactly) as it is loaded. ref:: beside it is the plain specification:
// one query row at a time over all its visible keys, no chunks.
#pragma once

#include <cstdint>

namespace attn {
struct BFloat16;  // attn/bfloat16.h
}  // namespace attn

namespace attn {

// The most new queries one call takes.
constexpr int64_t kMaxDecodeQueries = 16;
// Keys per chunk (a work item's share of one kv head): 256 rows of 64 fp32 are
// 64 KiB of keys and 64 KiB of values, read from memory once and reused from L2
// for every query row of the group.
constexpr int64_t kDecodeChunk = 256;

struct DecodeProblem {
  int64_t B = 1;             // sequences
  int64_t Hq = 1;            // query heads
  int64_t Hkv = 1;           // key/value heads; Hq a multiple of it
  int64_t Tq = 1;            // new queries per sequence, 1 .. kMaxDecodeQueries
  int64_t length = 1;        // keys in the cache (the new ones included), Tq <= length <= capacity
  int64_t capacity = 1;      // rows per (b, kv head) in keys and values
  int64_t D = 1;             // head dim of q, k, v and out
  float scale = 1.0f;        // usually 1 / sqrt(D)
  int64_t window_left = -1;  // -1: unbounded; >= 0: keys j >= p_t - window_left only
  int64_t q_stride = 0;      // elements between the query rows t, t + 1; 0: Hq·D
  int64_t o_stride = 0;      // elements between output rows; 0: Hq·D
  int64_t q_batch_stride = 0;  // elements between sequences b, b + 1 of q; 0: Tq·q_stride
  int64_t o_batch_stride = 0;  // of out; 0: Tq·o_stride
};

// Throws std::invalid_argument naming the values (sizes < 1, Hq not a multiple
// of Hkv, Tq outside 1 .. kMaxDecodeQueries or above length, length above
// capacity, window_left < -1, a row stride below Hq·D, a batch stride below
// Tq·row stride, a scale not finite); returns
// p with the strides filled in. Called by every function below.
DecodeProblem validated(const DecodeProblem& p);

namespace ref {
// The specification: for each (b, t, h) the scores of the visible keys in
// fp32, their softmax and the weighted sum of values, in key order.
void decode_attention_forward(float* out, const float* q, const float* keys, const float* values,
                              const DecodeProblem& p);
// bf16 inputs widened to fp32, the same maths, out rounded to bf16.
void decode_attention_forward_bf16(BFloat16* out, const BFloat16* q, const BFloat16* keys,
                                   const BFloat16* values, const DecodeProblem& p);
}  // namespace ref

namespace kernels {
// The flash-decoding kernel (above); pointers as in the shapes; out may not
// overlap the inputs.
void decode_attention_forward(float* out, const float* q, const float* keys, const float* values,
                              const DecodeProblem& p);
void decode_attention_forward_bf16(BFloat16* out, const BFloat16* q, const BFloat16* keys,
                                   const BFloat16* values, const DecodeProblem& p);
// Bytes of keys and values one call reads: for each (b, kv head) the rows some
// query can see, once (what `attn bench --kind decode` divides by the time).
int64_t decode_attention_kv_bytes(const DecodeProblem& p, int64_t element_bytes);
}  // namespace kernels

}  // namespace attn
