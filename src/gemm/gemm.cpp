// The BLAS behind attn/gemm.h: CBLAS calls and the BLAS's thread setting, and
// oneDNN's sgemm for Engine::kFast; the only place in attn that names them. Linked against OpenBLAS
// (CMake's find_package(BLAS)); with another CBLAS the thread calls fall back to "the BLAS has one
// thread as far as attn can tell".
#include "attn/gemm.h"

#include <cblas.h>
#include <fmt/format.h>
#include <omp.h>

#ifdef ATTN_HAVE_ONEDNN
#include <dnnl.h>
#endif

#include <algorithm>
#include <limits>
#include <sstream>
#include <stdexcept>
#include <string>

namespace attn::gemm {
namespace {

// ---- the BLAS: which one, and its threads ----------------------------------------
// OpenBLAS's cblas.h includes its openblas_config.h, which defines OPENBLAS_VERSION.
#ifdef OPENBLAS_VERSION
int get_threads() { return openblas_get_num_threads(); }
void set_threads(int n) { openblas_set_num_threads(n); }
std::string name() {
  // openblas_get_config(): "OpenBLAS 0.3.21 NO_LAPACKE DYNAMIC_ARCH ... Haswell MAX_THREADS=64".
  std::istringstream config(openblas_get_config());
  std::string product, version;
  config >> product >> version;
  return fmt::format("{} {}, {} kernels", product, version, openblas_get_corename());
}
#else
int get_threads() { return 1; }
void set_threads(int) {}
std::string name() { return "CBLAS"; }
#endif

// ---- oneDNN: Engine::kFast ------------------------------------------------------------
#ifdef ATTN_HAVE_ONEDNN
void onednn_sgemm(const char* fn, Trans ta, Trans tb, int64_t M, int64_t N, int64_t K, float alpha,
                  const float* A, int64_t lda, const float* B, int64_t ldb, float beta, float* C,
                  int64_t ldc) {
  // dnnl_sgemm is row-major, as attn's convention.
  const dnnl_status_t status =
      dnnl_sgemm(ta == Trans::kNo ? 'N' : 'T', tb == Trans::kNo ? 'N' : 'T', M, N, K, alpha, A, lda,
                 B, ldb, beta, C, ldc);
  if (status != dnnl_success) {
    throw std::runtime_error(
        fmt::format("{}: oneDNN's dnnl_sgemm failed with status {} (M = {}, N = {}, K = {})", fn,
                    static_cast<int>(status), M, N, K));
  }
}

std::string onednn_name() {
  const dnnl_version_t* v = dnnl_version();
  const char* isa = "";
  switch (dnnl_get_effective_cpu_isa()) {
    case dnnl_cpu_isa_sse41:
      isa = "sse41";
      break;
    case dnnl_cpu_isa_avx:
      isa = "avx";
      break;
    case dnnl_cpu_isa_avx2:
      isa = "avx2";
      break;
    case dnnl_cpu_isa_avx512_core:
      isa = "avx512_core";
      break;
    case dnnl_cpu_isa_avx512_core_vnni:
      isa = "avx512_core_vnni";
      break;
    case dnnl_cpu_isa_avx512_core_bf16:
      isa = "avx512_core_bf16";
      break;
    case dnnl_cpu_isa_avx512_core_amx:
      isa = "avx512_core_amx";
      break;
    default:
      isa = "other ISA";
      break;
  }
  return fmt::format("oneDNN {}.{}.{} sgemm ({})", v->major, v->minor, v->patch, isa);
}
#endif

// ---- argument checks ----------------------------------------------------------------

const char* trans_text(Trans t) { return t == Trans::kNo ? "" : ", transposed"; }

void check_size(const char* fn, const char* what, int64_t v) {
  if (v < 0) throw std::invalid_argument(fmt::format("{}: {} = {} is negative", fn, what, v));
}

// A row-major matrix stored (rows, cols; ld) needs ld >= cols. (BLAS also asks
// ld >= 1; only a matrix with no columns can miss that, and its ld is never read.)
// `shape` names the dims, e.g. "(K, M)" with cols_name "M".
void check_ld(const char* fn, const char* ld_name, int64_t ld, const char* matrix,
              const char* shape, int64_t rows, int64_t cols, const char* cols_name, Trans t) {
  if (ld < cols) {
    throw std::invalid_argument(fmt::format("{}: {} = {} < {} = {} ({} is {} = ({}, {}){})", fn,
                                            ld_name, ld, cols_name, cols, matrix, shape, rows, cols,
                                            trans_text(t)));
  }
}

blasint to_blas(const char* fn, const char* what, int64_t v) {
  if (v > std::numeric_limits<blasint>::max()) {
    throw std::invalid_argument(fmt::format("{}: {} = {} does not fit the BLAS's {}-bit integer",
                                            fn, what, v, 8 * sizeof(blasint)));
  }
  return static_cast<blasint>(v);
}

CBLAS_TRANSPOSE cblas_trans(Trans t) { return t == Trans::kNo ? CblasNoTrans : CblasTrans; }

// The checked arguments of one sgemm, in the BLAS's integer.
struct GemmArgs {
  blasint M, N, K, lda, ldb, ldc;
};

GemmArgs check_gemm(const char* fn, Trans ta, Trans tb, int64_t M, int64_t N, int64_t K,
                    int64_t lda, int64_t ldb, int64_t ldc) {
  check_size(fn, "M", M);
  check_size(fn, "N", N);
  check_size(fn, "K", K);
  // A is (M, K; lda), or (K, M; lda) transposed; B is (K, N; ldb), or (N, K; ldb).
  if (ta == Trans::kNo) {
    check_ld(fn, "lda", lda, "A", "(M, K)", M, K, "K", ta);
  } else {
    check_ld(fn, "lda", lda, "A", "(K, M)", K, M, "M", ta);
  }
  if (tb == Trans::kNo) {
    check_ld(fn, "ldb", ldb, "B", "(K, N)", K, N, "N", tb);
  } else {
    check_ld(fn, "ldb", ldb, "B", "(N, K)", N, K, "K", tb);
  }
  check_ld(fn, "ldc", ldc, "C", "(M, N)", M, N, "N", Trans::kNo);
  return {to_blas(fn, "M", M),     to_blas(fn, "N", N),     to_blas(fn, "K", K),
          to_blas(fn, "lda", lda), to_blas(fn, "ldb", ldb), to_blas(fn, "ldc", ldc)};
}

// y[0, n) = beta · y, with beta == 0 overwriting (BLAS's rule).
void scale(float* y, int64_t n, float beta) {
  if (beta == 0.0f) {
    std::fill(y, y + n, 0.0f);
  } else if (beta != 1.0f) {
    for (int64_t i = 0; i < n; ++i) y[i] *= beta;
  }
}

// sgemm on checked arguments; true when it is done (an empty product), false
// when the caller still has to run the BLAS on M, N, K >= 1.
bool empty_product(const GemmArgs& g, float beta, float* C) {
  if (g.M == 0 || g.N == 0) return true;
  if (g.K == 0) {  // C = beta·C
    for (int64_t i = 0; i < g.M; ++i) scale(C + i * int64_t{g.ldc}, g.N, beta);
    return true;
  }
  return false;
}

// Row blocks smaller than this are not worth a thread of their own.
constexpr int64_t kMinRowsPerThread = 64;

}  // namespace

void sgemm(Trans ta, Trans tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
           int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc,
           Engine engine) {
  const GemmArgs g = check_gemm("gemm::sgemm", ta, tb, M, N, K, lda, ldb, ldc);
  if (empty_product(g, beta, C)) return;
#ifdef ATTN_HAVE_ONEDNN
  if (engine == Engine::kFast) {
    onednn_sgemm("gemm::sgemm", ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    return;
  }
#else
  (void)engine;
#endif
  cblas_sgemm(CblasRowMajor, cblas_trans(ta), cblas_trans(tb), g.M, g.N, g.K, alpha, A, g.lda, B,
              g.ldb, beta, C, g.ldc);
}

void sgemm_rows_parallel(Trans ta, Trans tb, int64_t M, int64_t N, int64_t K, float alpha,
                         const float* A, int64_t lda, const float* B, int64_t ldb, float beta,
                         float* C, int64_t ldc, Engine engine) {
  const GemmArgs g = check_gemm("gemm::sgemm_rows_parallel", ta, tb, M, N, K, lda, ldb, ldc);
  if (empty_product(g, beta, C)) return;
#ifdef ATTN_HAVE_ONEDNN
  if (engine == Engine::kFast) {  // oneDNN splits the product over OpenMP's threads itself
    onednn_sgemm("gemm::sgemm_rows_parallel", ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    return;
  }
#else
  (void)engine;
#endif
  // Rows [r0, r1) of C = rows [r0, r1) of op(A) times op(B): those rows start
  // at row r0 of A, or at column r0 of A when A is stored transposed.
  const auto block = [&](int64_t r0, int64_t r1) {
    const float* A_rows = ta == Trans::kNo ? A + r0 * lda : A + r0;
    cblas_sgemm(CblasRowMajor, cblas_trans(ta), cblas_trans(tb), static_cast<blasint>(r1 - r0), g.N,
                g.K, alpha, A_rows, g.lda, B, g.ldb, beta, C + r0 * ldc, g.ldc);
  };
  const int64_t max_threads = std::max<int64_t>(1, omp_get_max_threads());
  const int64_t n = std::clamp<int64_t>(M / kMinRowsPerThread, 1, max_threads);
  if (n == 1 || omp_in_parallel()) {
    block(0, M);
    return;
  }
  const int saved_blas_threads = get_threads();
  set_threads(1);
#pragma omp parallel for num_threads(static_cast <int>(n)) schedule(static)
  for (int64_t i = 0; i < n; ++i) block(M * i / n, M * (i + 1) / n);
  set_threads(saved_blas_threads);
}

void sgemv(Trans ta, int64_t M, int64_t N, float alpha, const float* A, int64_t lda, const float* x,
           float beta, float* y) {
  const char* fn = "gemm::sgemv";
  check_size(fn, "M", M);
  check_size(fn, "N", N);
  check_ld(fn, "lda", lda, "A", "(M, N)", M, N, "N", Trans::kNo);
  const blasint m = to_blas(fn, "M", M), n = to_blas(fn, "N", N), ld = to_blas(fn, "lda", lda);
  const int64_t y_len = ta == Trans::kNo ? M : N, x_len = ta == Trans::kNo ? N : M;
  if (y_len == 0) return;
  if (x_len == 0) {  // an empty sum: y = beta·y
    scale(y, y_len, beta);
    return;
  }
  cblas_sgemv(CblasRowMajor, cblas_trans(ta), m, n, alpha, A, ld, x, 1, beta, y, 1);
}

float sdot(int64_t n, const float* x, const float* y) {
  check_size("gemm::sdot", "n", n);
  const blasint bn = to_blas("gemm::sdot", "n", n);
  if (n == 0) return 0.0f;
  return cblas_sdot(bn, x, 1, y, 1);
}

int blas_threads() { return get_threads(); }

void set_blas_threads(int n) {
  if (n < 1) {
    throw std::invalid_argument(fmt::format("gemm::set_blas_threads: n = {} is less than 1", n));
  }
  set_threads(n);
}

const char* blas_name() {
  static const std::string kName = name();
  return kName.c_str();
}

const char* fast_gemm_name() {
#ifdef ATTN_HAVE_ONEDNN
  static const std::string kName = onednn_name();
  return kName.c_str();
#else
  return blas_name();
#endif
}

}  // namespace attn::gemm
