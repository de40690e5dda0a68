// attn/decode_kernels.h - the kernels of generating one token at a time:
// matrix-vector products that read each weight once (GEMV), the attention of
// one new query over a key/value cache, and the machine's memory read
// bandwidth, which bounds both.
//
// Decoding is memory-bound: a token of GPT-2 small multiplies ~124M weights
// by one activation row each, two FLOPs per weight byte read in fp32 (four in
// bf16), far below what the cores could do with the bytes. So the products
// are written to stream the weights once, row after row, with fp32
// accumulators in vector lanes, split over OpenMP threads by blocks of output
// rows (each thread reads its own rows of W, never another's).
//
// Maths (W is a Linear's weight, (N, K) row-major, y = x Wᵀ + b):
//   y[m, n] = Σ_k x[m, k] · W[n, k] + bias[n]        m < M, n < N
// M is the batch of tokens (1 when decoding one sequence); each block of rows
// of W is read from memory once and reused from cache for every m.
// bf16: x and W are bf16, every product x·w is exact in fp32 and the sums are
// fp32 (as gemm::gemm_bf16 and torch's bf16 matmul accumulate); y is fp32.
// The sums run in vector lanes, then across lanes: a different order from
// sgemm's, so results agree with it to a few fp32 ulps of the row's size.
// Determinism: each y[m, n] is summed by one thread in a fixed order, so the
// bits do not depend on the thread count.
//
// SIMD: Highway dynamic dispatch (AVX-512, AVX2, SSE4, scalar; forced with
// flash_attention_use_target, attn/kernels.h, which sets Highway's
// process-wide choice). The bf16 product has two paths, chosen at run time:
// "AVX512-BF16" (VDPBF16PS: pairs of bf16 products summed into fp32 lanes,
// where the CPU has AVX512-BF16: AMD Zen 4 and later, Intel Cooper Lake,
// Sapphire Rapids and later) and "widened" (each bf16 widened to fp32,
// exactly, and fused multiply-adds; every CPU); gemv_bf16_use_path (or
// ATTN_GEMV_BF16_PATH, read by kernels::apply_path_environment) forces one.
// A forced SIMD target below AVX-512 chooses "widened", as on a CPU without it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace attn {
struct BFloat16;  // attn/bfloat16.h
}  // namespace attn

namespace attn::kernels {

// y (M, N) = x (M, K) · W (N, K)ᵀ + bias (N) (bias may be null). ldx, ldy: the
// floats between rows of x and of y (>= K, >= N). M, N, K >= 0; K == 0 gives
// y = bias (or 0).
void gemv_forward(float* y, int64_t ldy, const float* x, int64_t ldx, const float* W,
                  const float* bias, int64_t M, int64_t N, int64_t K);
// Several independent products (each as gemv_forward) in one parallel
// region: their row blocks are split over the threads together, so the
// threads meet once instead of once per product (decoding's q, k and v).
struct GemvProblem {
  float* y;
  int64_t ldy;
  const float* x;
  int64_t ldx;
  const float* W;
  const float* bias;  // or null
  int64_t M, N, K;
};
void gemv_forward_batch(const GemvProblem* problems, int64_t count);
// The same with bf16 x and W, fp32 sums and y.
void gemv_forward_bf16(float* y, int64_t ldy, const BFloat16* x, int64_t ldx, const BFloat16* W,
                       const float* bias, int64_t M, int64_t N, int64_t K);
// The bf16 path that runs ("AVX512-BF16" or "widened"); the paths this CPU can
// run, best first; and, for tests and benchmarks, forcing one (false for a name
// not in the list; nullptr restores the automatic choice; not while kernels run).
const char* gemv_bf16_path();
std::vector<std::string> gemv_bf16_paths();
bool gemv_bf16_use_path(const char* name);

// The attention of one new query per (b, h) over a key/value cache laid out
// (B, H, capacity, hd), rows [0, length) filled (the new token's key and value
// included): for each b < B, h < H
//   s_j = scale · q[b, h] · keys[b, h, j]      j < length
//   out[b, h] = Σ_j softmax(s)_j · values[b, h, j]
// q and out are token-major (B, H·hd): head h at column h·hd, as the
// projections write them and out_proj reads them. fp32 throughout. length >= 1.
// Flash-decoding with one new query (attn/decode_attention.h, which also takes
// up to 16 queries, grouped-query heads and windows): keys split in fixed
// chunks over OpenMP threads, combined by log-sum-exp in a fixed order.
void decode_attention(float* out, const float* q, const float* keys, const float* values, int64_t B,
                      int64_t H, int64_t length, int64_t capacity, int64_t hd, float scale);
// The same over a bf16 cache with a bf16 query: the products take the bf16
// values exactly and sum in fp32, the softmax and the weighted sum of values
// are fp32, and out is rounded to bf16 once, at the end (it is out_proj's bf16
// operand).
void decode_attention_bf16(BFloat16* out, const BFloat16* q, const BFloat16* keys,
                           const BFloat16* values, int64_t B, int64_t H, int64_t length,
                           int64_t capacity, int64_t hd, float scale);

// The machine's memory read bandwidth in GB/s (1e9 bytes/s) with `threads`
// OpenMP threads (0: omp_get_max_threads()): every thread sums its own part of
// a buffer of `bytes` (far larger than the caches: 256 MiB is the default of
// `attn bench --bandwidth`) in vector lanes, as the GEMV streams weights; the
// median of `repeats` passes after one untimed pass. Throws
// std::invalid_argument for repeats < 1, threads < 0 or bytes < 1 MiB.
double read_bandwidth_gbs(int64_t bytes, int threads = 0, int repeats = 5);

}  // namespace attn::kernels
