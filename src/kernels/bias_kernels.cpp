// A Linear layer's bias on the fast path (attn/layer_kernels.h): every row of
// a product's C set to b (or to a residual row + b) before the product adds onto
// it, and db += the column sums of dy. Plain loops the compiler vectorises;
// memory-bound, so what matters is that both cores stream. Below
// kRowsParallelElements elements one thread does it all.
#include <algorithm>
#include <cstdint>

#include "attn/bfloat16.h"
#include "attn/layer_kernels.h"

#ifdef _OPENMP
#include <omp.h>
#endif

namespace attn::kernels {
namespace {
constexpr int64_t kRowsParallelElements = int64_t{1} << 15;

float as_float(float v) { return v; }
float as_float(BFloat16 v) { return to_float(v); }

// Columns [N·t/n, N·(t+1)/n) for thread t of n, so that each column is summed
// by one thread over all rows in row order: the serial loop's bits for any n.
template <class T>
void column_sums(float* db, const T* A, int64_t lda, int64_t M, int64_t N) {
#pragma omp parallel if (M * N >= kRowsParallelElements)
  {
    int64_t t = 0, n = 1;
#ifdef _OPENMP
    t = omp_get_thread_num();
    n = omp_get_num_threads();
#endif
    const int64_t j0 = N * t / n, j1 = N * (t + 1) / n;
    for (int64_t r = 0; r < M; ++r) {
      const T* row = A + r * lda;
      for (int64_t j = j0; j < j1; ++j) db[j] += as_float(row[j]);
    }
  }
}
}  // namespace

void fill_rows(float* C, int64_t ldc, const float* b, int64_t M, int64_t N) {
#pragma omp parallel for schedule(static) if (M * N >= kRowsParallelElements)
  for (int64_t r = 0; r < M; ++r) std::copy_n(b, N, C + r * ldc);
}

void fill_rows_add(float* C, int64_t ldc, const float* b, const float* R, int64_t ldr, int64_t M,
                   int64_t N) {
#pragma omp parallel for schedule(static) if (M * N >= kRowsParallelElements)
  for (int64_t r = 0; r < M; ++r) {
    float* c = C + r * ldc;
    const float* x = R + r * ldr;
    for (int64_t j = 0; j < N; ++j) c[j] = x[j] + b[j];
  }
}

void column_sums_accumulate(float* db, const float* A, int64_t lda, int64_t M, int64_t N) {
  column_sums(db, A, lda, M, N);
}

void column_sums_accumulate(float* db, const BFloat16* A, int64_t lda, int64_t M, int64_t N) {
  column_sums(db, A, lda, M, N);
}

}  // namespace attn::kernels
