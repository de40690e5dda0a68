// src/kernels/bf16_dot.h - the AVX512-BF16 product engine of the attention
// schedule (sdpa_kernel.cpp): its operand layouts, their packing, and its
// micro-kernels. The schedule is the fp32 one; on this engine its products
// multiply bf16 pairs with VDPBF16PS (two bf16 products summed into each fp32
// lane) instead of fp32 FMAs, at twice the FLOPs on AMD Zen 4/5 and Intel
// Cooper Lake and later.
//
// VDPBF16PS multiplies pairs along the reduction axis, so
//   C[r, 0:W] (+)= Σ_p word(A[r, 2p], A[r, 2p+1]) · word(B[2p, 0:W], B[2p+1, 0:W])
// where a "word" is two bf16 side by side in 32 bits (the even index in the
// low half). A is read as words through two strides (any layout whose pairs
// lie along the reduction axis); B must be "pair interleaved": row p holds,
// for each output column w, the word (B[2p, w], B[2p+1, w]). The bf16 inputs
// are packed into those layouts once per tile; the fp32 weights P and dS are
// rounded to bf16 (nearest even) into them.
//
// The functions here are compiled for AVX512-BF16 (bf16_dot.cpp) and may be
// called only where the CPU has it (cpu::has_avx512_bf16()); they are plain
// calls, so a caller compiled for any target (Highway's AVX3 code of the
// schedule) runs them. The micro-kernels' vectors are 16 fp32 (kN), a row of
// C kNV = 4 of them, kMR = 6 rows.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

namespace attn::kernels::bf16dot {

constexpr size_t kN = 16;  // fp32 lanes of a 512-bit vector
constexpr size_t kNV = 4;  // vectors per micro-kernel row
constexpr size_t kMR = 6;  // micro-kernel rows: 6·4 accumulators + 6 broadcasts + 1 load

inline size_t Pairs(size_t n) { return (n + 1) / 2; }

// C[r, 0:V·N] = init + Σ_{p<K} A[r·ars + p·aks] · B[p·bs + 0:V·N] (words) for
// r < R; init is 0, C, or c_scale[r]·C (the table's mode).
using MicroFn = void (*)(const uint32_t* A, size_t ars, size_t aks, const uint32_t* B, size_t bs,
                         size_t K, float* C, size_t cs, const float* c_scale);
// Index (R - 1)·kNV + (V - 1).
using MicroTable = std::array<MicroFn, kMR * kNV>;
// By mode: 0 overwrite, 1 accumulate, 2 scale and accumulate (the fp32 micro-kernel's Mode).
const MicroTable& micro_table(int mode);

// Rows r < n of a head (hd bf16 each, `stride` apart) as words: dst (rows,
// Pairs(hd)), word p of row r = (x[r][2p], x[r][2p+1]); zero past hd and for
// rows past n. Nothing past a row's hd values is read.
void pack_rows(uint32_t* dst, const uint16_t* x, size_t stride, size_t n, size_t rows, size_t hd);

// The same words transposed: dst (Pairs(hd), cols), dst[p · cols + r] =
// (x[r][2p], x[r][2p+1]); zero for r >= n.
void pack_rows_t(uint32_t* dst, const uint16_t* x, size_t stride, size_t n, size_t cols, size_t hd);

// Pairs of rows interleaved: dst (Pairs(rows), hdp), dst[p · hdp + d] =
// (x[2p][d], x[2p+1][d]); zero past hd and for rows past n. hdp a multiple of kN.
void pack_row_pairs(uint32_t* dst, const uint16_t* x, size_t stride, size_t n, size_t rows,
                    size_t hd, size_t hdp);

// fp32 rows rounded to bf16, pairs of rows interleaved: dst (Pairs(rows), W),
// dst[p · W + w] = (x[2p][w], x[2p+1][w]); row 2p + 1 >= n is zero. W a
// multiple of kN; x's rows `stride` floats apart.
void round_row_pairs(uint32_t* dst, const float* x, size_t stride, size_t n, size_t rows, size_t W);

// fp32 rows rounded to bf16 as words along each row: dst (n, W / 2), word p of
// row r = (x[r][2p], x[r][2p+1]). W a multiple of 2·kN.
void round_rows(uint32_t* dst, const float* x, size_t stride, size_t n, size_t W);

// out[r] = Σ_p word(a[p · kN + r]) · word(b[p · kN + r]) for the kN lanes r,
// summed from 0 pair after pair by VDPBF16PS (a times b, as the micro-kernels
// multiply A's broadcast word by B's): lane r holds the micro-kernel's
// C[·, w] for a row of A whose words are a's lane r and a column of B whose
// words are b's lane r, bit for bit (the backward's row term: kernels/sdpa_kernel.cpp).
void lane_dots(float* out, const uint32_t* a, const uint32_t* b, size_t pairs);

}  // namespace attn::kernels::bf16dot
