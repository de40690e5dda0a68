// attn/gemm.h - the one seam between attn and a BLAS. Every matrix product of
// the library (ops' matmul and dot, Linear, the fused attention block), of the
// CLI and of the benchmarks goes through here, and so do the BLAS's thread
// count and name. Which libraries are linked (OpenBLAS through CBLAS, and
// oneDNN's sgemm) and how their threads are set is known only to
// src/gemm/gemm.cpp.
//
// Two engines multiply (Engine below):
// - kBlas, the system BLAS (OpenBLAS): the library Debian's PyTorch 1.13 calls,
//   so the reference path sums in PyTorch's order and prints PyTorch's digits.
// - kFast, the fast engine: oneDNN's sgemm (Debian's libdnnl, JIT kernels
//   for the running CPU's widest vectors; when attn is built with
//   ATTN_WITH_ONEDNN, on by default when found), else the BLAS. The choice is
//   fixed, not timed, so two runs of one command multiply with the same
//   engine and give the same bits (training's losses, --resume). oneDNN
//   cannot be pinned to an old core as a BLAS can (OPENBLAS_CORETYPE, e.g.
//   Prescott kernels at 20% of the peak); on AMD Zen 4/5, whose AVX-512
//   OpenBLAS 0.3.21 does not use, it is about twice as fast. fast_gemm_rates()
//   measures both on a GPT-sized product (512x768x2304) for attn bench, which
//   warns about an engine far below the peak. ATTN_GEMM_ENGINE=onednn|blas|auto
//   (read once) or fast_gemm_use() forces the choice; fast_gemm_name() and
//   fast_gemm_reason() say what runs and why. Either way it runs on OpenMP's
//   threads (omp_get_max_threads()): the BLAS as kFast runs one
//   single-threaded call per block of rows, as sgemm_rows_parallel does. The
//   fused attention block, the GPT's layers (LayerImpl::kKernel), training,
//   generation and the benchmarks use it.
//
// Conventions:
// - Row-major throughout. A matrix X of r rows and c columns "(r, c; ldx)"
//   has element (i, j) at X[i·ldx + j], with ldx >= c.
// - op(X) = X for Trans::kNo, Xᵀ for Trans::kYes. The sizes M, N, K are those
//   of the product: op(A) is (M, K), op(B) is (K, N), C is (M, N). So A is
//   stored (M, K; lda) when not transposed and (K, M; lda) when transposed.
// - beta == 0 overwrites C without reading it (NaN or Inf there do not
//   survive), as BLAS does; K == 0 makes the product empty: C = beta·C.
// - M, N or K == 0 are valid and touch nothing they need not.
// - Arguments are checked before anything runs: a negative size, a leading
//   dimension shorter than its matrix's rows, or a value too large for the
//   BLAS's integer throws std::invalid_argument naming the function and the
//   values, e.g. "gemm::sgemm: lda = 3 < K = 4 (A is (M, K) = (2, 4))".
//   The pointers are not checked; they must cover the matrices described.
// - The same call gives the same bits: each wrapper is one CBLAS call (or one
//   per row block) with exactly the arguments given. The BLAS's thread count
//   can change the last bits (OpenBLAS splits a product by rows too).
//
// bf16: gemm_bf16 takes bf16 A and B with an fp32 C (and fp32 alpha, beta),
// the same (Trans, M, N, K, ld) conventions and checks. It runs on oneDNN's
// matmul (OpenBLAS's cblas_sbgemm needs a build with BUILD_BFLOAT16: Debian's
// 0.3.21 declares it in cblas.h but its library does not export it).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace attn {
struct BFloat16;  // attn/bfloat16.h: the high half of a float32's bits
}  // namespace attn

namespace attn::gemm {

enum class Trans { kNo, kYes };
enum class Engine { kBlas, kFast };

// C (M, N; ldc) = alpha · op(A) · op(B) + beta · C, op(A) (M, K), op(B) (K, N),
// i.e. C[i, j] = alpha · Σ_k op(A)[i, k] · op(B)[k, j] + beta · C[i, j].
// One call of the engine's library: the BLAS on its own threads
// (set_blas_threads), oneDNN on OpenMP's.
void sgemm(Trans ta, Trans tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
           int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc,
           Engine engine = Engine::kBlas);

// The same product, with the rows of C split over OpenMP threads: a new
// parallel region of up to omp_get_max_threads() threads, thread t computing
// the rows [M·t/n, M·(t+1)/n) of C with one single-threaded BLAS call (the
// BLAS's thread count is set to 1 meanwhile and restored after; a process-wide
// setting, so BLAS calls made concurrently from other threads run
// single-threaded meanwhile). Each thread gets at least 64 rows; with fewer, or
// when called inside a parallel region already, it is exactly sgemm().
// For code whose other work runs on OpenMP threads (the flash kernel): handing
// the product to the BLAS's own thread pool instead makes two pools take turns
// on the same cores, each spinning while the other works.
// Bits: exactly those of sgemm called on each row block in turn, so they are
// fixed by M and the thread count; they can differ from one sgemm over all M
// rows in the last place (a BLAS may sum a row in another order depending on
// where it falls in M: OpenBLAS's Haswell kernels do for the rows of an M
// remainder).
// With Engine::kFast and oneDNN it is one oneDNN call, which splits the work
// over the OpenMP threads itself (inside a parallel region: one thread).
void sgemm_rows_parallel(Trans ta, Trans tb, int64_t M, int64_t N, int64_t K, float alpha,
                         const float* A, int64_t lda, const float* B, int64_t ldb, float beta,
                         float* C, int64_t ldc, Engine engine = Engine::kBlas);

// y = alpha · op(A) · x + beta · y with A stored (M, N; lda), x and y
// contiguous: op = kNo: x (N), y (M), y[i] = alpha · Σ_j A[i, j] · x[j] + beta · y[i];
//               kYes: x (M), y (N), y[j] = alpha · Σ_i A[i, j] · x[i] + beta · y[j].
// An empty sum (x of length 0) gives y = beta·y. One BLAS call.
void sgemv(Trans ta, int64_t M, int64_t N, float alpha, const float* A, int64_t lda, const float* x,
           float beta, float* y);

// Σ_i x[i] · y[i] over n contiguous floats (0 for n == 0), in the BLAS's order.
float sdot(int64_t n, const float* x, const float* y);

// The BLAS's own thread count (what sgemm runs on), and setting it for the
// whole process. set_blas_threads throws std::invalid_argument for n < 1.
// A BLAS without a thread setting reports 1 and ignores the call.
int blas_threads();
void set_blas_threads(int n);

// The BLAS and its kernels, for benchmarks to print, e.g.
// "OpenBLAS 0.3.21, Haswell kernels". A static string.
const char* blas_name();

// C (M, N; ldc) = alpha · op(A) · op(B) + beta · C with A and B in bfloat16,
// C in float32: the products of bf16 values are exact in float32 and are
// summed in float32 (as PyTorch's bf16 matmul accumulates before it rounds;
// here C stays float32). Conventions and argument checks as sgemm.
// Two routes (gemm_bf16_route() says which runs, gemm_bf16_name() names it):
// - "matmul": oneDNN's matmul primitive (one per shape, made on first use and
//   kept), on AMX tiles or AVX512-BF16 dot products. Taken where oneDNN runs
//   it on AMX, or on AVX512-BF16 of an AMD core (Zen 4/5: VDPBF16PS at the
//   FMA's rate).
// - "widened": A and B widened to float32 (exact) and multiplied by the fast
//   sgemm (the same sums up to order). Taken elsewhere: on Intel cores without
//   AMX VDPBF16PS runs at half the FMA's rate, and the matmul was 1.3-1.6x
//   slower than the widened product (docs/gemm.md); and without a bf16 matmul.
// ATTN_BF16_GEMM=matmul|widened|auto (read once; another value makes every
// bf16 product throw std::invalid_argument naming it) or gemm_bf16_use force one.
void gemm_bf16(Trans ta, Trans tb, int64_t M, int64_t N, int64_t K, float alpha, const BFloat16* A,
               int64_t lda, const BFloat16* B, int64_t ldb, float beta, float* C, int64_t ldc);
const char* gemm_bf16_name();
// The routes gemm_bf16 can take here ({"matmul", "widened"}, or {"widened"}
// without a bf16 matmul), the one it takes, and why: the automatic rule's
// reason, "ATTN_BF16_GEMM=..." or "forced by gemm::gemm_bf16_use".
std::vector<std::string> gemm_bf16_routes();
const char* gemm_bf16_route();
std::string gemm_bf16_reason();
// For tests and benchmarks: force a route of gemm_bf16_routes() (false for
// another name), or nullptr / "auto" for the automatic one. Not while products run.
bool gemm_bf16_use(const char* name);
// The portable product gemm_bf16 falls back to: op(A), op(B) widened to
// float32 (exact), then sgemm on Engine::kFast. Same contract.
void gemm_bf16_widened(Trans ta, Trans tb, int64_t M, int64_t N, int64_t K, float alpha,
                       const BFloat16* A, int64_t lda, const BFloat16* B, int64_t ldb, float beta,
                       float* C, int64_t ldc);
// dst[0:n) = src[0:n) widened to float32 (exact; on the OpenMP threads when n
// is large): the widened route's first step, for a caller that multiplies one
// bf16 operand in several products. Widened once, then sgemm on Engine::kFast,
// it gives the widened route's bits without widening it per product. Throws
// std::invalid_argument for n < 0.
void widen_bf16(float* dst, const BFloat16* src, int64_t n);

// What Engine::kFast runs on, e.g. "oneDNN 2.6.3 sgemm (avx512_core)", or the
// BLAS's name (blas_name()). A static string. Throws std::invalid_argument,
// as every kFast product does, when ATTN_GEMM_ENGINE names no engine.
const char* fast_gemm_name();
// The engines kFast can run here: {"onednn", "blas"} (or {"blas"} without
// oneDNN); the one it runs ("onednn" or "blas"); why: the default ("oneDNN
// unless ATTN_GEMM_ENGINE=blas: ..."), "ATTN_GEMM_ENGINE=blas", "forced by
// gemm::fast_gemm_use" or "built without oneDNN".
std::vector<std::string> fast_gemm_engines();
const char* fast_gemm_engine();
std::string fast_gemm_reason();
// Both engines' GFLOP/s on the 512x768x2304 product with the OpenMP threads
// (measured on the first call, a few ms, then kept; 0 for an engine not built
// in). Reported by attn bench; the choice above does not depend on it.
struct FastGemmRates {
  double onednn_gflops = 0, blas_gflops = 0;
};
FastGemmRates fast_gemm_rates();
// For tests and benchmarks: force kFast onto an engine of fast_gemm_engines()
// (false for another name), or nullptr / "auto" for the automatic choice
// (ATTN_GEMM_ENGINE, else oneDNN). Not for use while products run.
bool fast_gemm_use(const char* name);

}  // namespace attn::gemm
