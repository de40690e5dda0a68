// The BLAS behind attn/gemm.h: CBLAS calls and the BLAS's thread setting, and
// oneDNN's sgemm for Engine::kFast; the only place in attn that names them. Linked against OpenBLAS
// (CMake's find_package(BLAS)); with another CBLAS the thread calls fall back to "the BLAS has one
// thread as far as attn can tell".
#include "attn/gemm.h"

#include <cblas.h>
#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif
#include <fmt/format.h>
#include <omp.h>

#ifdef ATTN_HAVE_ONEDNN
#include <dnnl.h>
#endif

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "attn/bfloat16.h"
#include "attn/utf8.h"

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

// "oneDNN 2.6.3".
std::string onednn_version() {
  const dnnl_version_t* v = dnnl_version();
  return fmt::format("oneDNN {}.{}.{}", v->major, v->minor, v->patch);
}

// "oneDNN 2.6.3 sgemm (avx512_core)": the version and the ISA its JIT kernels use.
std::string onednn_name() {
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
  return fmt::format("{} sgemm ({})", onednn_version(), isa);
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

// sgemm_rows_parallel's BLAS path: the rows of C split over OpenMP threads,
// one single-threaded BLAS call each (arguments checked).
void blas_rows_parallel(Trans ta, Trans tb, const GemmArgs& g, float alpha, const float* A,
                        const float* B, float beta, float* C) {
  const int64_t M = g.M, lda = g.lda, ldc = g.ldc;
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

// ---- choices forced by name (the fast engine, the bf16 route) ----------------------------
// `names` lists every value of the choice's enum in order; `available` those
// this build and CPU can take. The enum value of `name`, -1 for "auto", -2
// for a name that is not available.
template <size_t N>
int named_choice(const std::string& name, const std::vector<std::string>& available,
                 const char* const (&names)[N]) {
  if (name == "auto") return -1;
  if (std::find(available.begin(), available.end(), name) == available.end()) return -2;
  for (size_t i = 0; i < N; ++i)
    if (name == names[i]) return static_cast<int>(i);
  return -2;
}

// What the environment variable `var` forces: -1 unset or empty, else as named_choice.
template <size_t N>
int environment_choice(const char* var, const std::vector<std::string>& available,
                       const char* const (&names)[N]) {
  const char* value = std::getenv(var);
  if (value == nullptr || *value == '\0') return -1;
  return named_choice(value, available, names);
}

// forced, unless it is -2: then an exception naming the variable's value, what
// it is not ("an engine of this build") and the valid names.
int checked_choice(int forced, const char* var, const char* what,
                   const std::vector<std::string>& available) {
  if (forced != -2) return forced;
  std::string valid;
  for (const std::string& name : available) valid += name + ", ";
  throw std::invalid_argument(fmt::format("gemm: {}='{}' is not {}; valid: {}auto", var,
                                          printable(std::getenv(var)), what, valid));
}

// gemm::fast_gemm_use and gemm_bf16_use: force `name` into `forced` (nullptr
// or "auto": the automatic choice again); false for a name not available.
template <size_t N>
bool use_choice(std::atomic<int>& forced, const char* name,
                const std::vector<std::string>& available, const char* const (&names)[N]) {
  const int choice = name == nullptr ? -1 : named_choice(name, available, names);
  if (choice == -2) return false;
  forced = choice;
  return true;
}

// ---- Engine::kFast: which library ---------------------------------------------------
// kOneDnn only with oneDNN built in. g_forced: -1 automatic, else a FastLib.
enum FastLib : int { kOneDnn = 0, kBlasLib = 1 };
constexpr const char* kFastLibNames[] = {"onednn", "blas"};
std::atomic<int> g_forced{-1};

// The product both engines' rates are measured on (for attn bench): a GPT-2 small layer's QKV projection
// of 512 tokens, (512, 768) · (768, 2304), 1.8 GFLOP: a few ms per run on a
// laptop's cores. (On the Xeon of this project's tests OpenBLAS's SkylakeX
// sgemm beats oneDNN's at 2048³; at GPT-2's shapes the two were within noise
// of each other under load; docs/gemm.md.)
constexpr int64_t kProbeM = 512, kProbeN = 2304, kProbeK = 768;

#ifdef ATTN_HAVE_ONEDNN
// The GFLOP/s of oneDNN and of the BLAS on the probe's product: one warm-up
// run of each (oneDNN's JIT, the threads), then three rounds of one run of
// each, in turn, so that a busy machine slows both alike; the best run counts.
std::pair<double, double> probe_rates() {
  std::vector<float> a(size_t(kProbeM * kProbeK)), b(size_t(kProbeK * kProbeN)),
      c(size_t(kProbeM * kProbeN));
  for (size_t i = 0; i < a.size(); ++i) a[i] = 0.01f * float(int(i % 13) - 6);
  for (size_t i = 0; i < b.size(); ++i) b[i] = 0.01f * float(int(i % 11) - 5);
  const GemmArgs g{kProbeM, kProbeN, kProbeK, kProbeK, kProbeN, kProbeN};
  // GFLOP/s of one run of `lib`.
  const auto rate = [&](FastLib lib) {
    const auto t0 = std::chrono::steady_clock::now();
    if (lib == kOneDnn) {
      onednn_sgemm("gemm::fast_gemm_engine", Trans::kNo, Trans::kNo, kProbeM, kProbeN, kProbeK,
                   1.0f, a.data(), kProbeK, b.data(), kProbeN, 0.0f, c.data(), kProbeN);
    } else {
      blas_rows_parallel(Trans::kNo, Trans::kNo, g, 1.0f, a.data(), b.data(), 0.0f, c.data());
    }
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return 2.0 * kProbeM * kProbeN * kProbeK / s * 1e-9;
  };
  rate(kOneDnn), rate(kBlasLib);
  double onednn = 0, blas = 0;
  for (int round = 0; round < 3; ++round) {
    onednn = std::max(onednn, rate(kOneDnn));
    blas = std::max(blas, rate(kBlasLib));
  }
  return {onednn, blas};
}
#endif

// The automatic choice is fixed, not measured: a choice by timing could
// differ between two runs of the same command (the engines are within noise
// of each other at GPT-2's shapes on some CPUs), and the bits of every kFast
// product, so training's losses and --resume's exactness, with it. oneDNN
// JITs its kernels for the running CPU and cannot be pinned to an old core as
// a BLAS can (OPENBLAS_CORETYPE); the BLAS runs kFast only when asked for.
#ifdef ATTN_HAVE_ONEDNN
constexpr FastLib kDefaultLib = kOneDnn;
constexpr const char* kDefaultReason =
    "oneDNN unless ATTN_GEMM_ENGINE=blas: the same engine in every run, so the same bits";
#else
constexpr FastLib kDefaultLib = kBlasLib;
constexpr const char* kDefaultReason = "built without oneDNN";
#endif

// Both engines' rates on the probe's product, measured once when first asked
// (attn bench reports them and warns about an engine far below the peak).
const FastGemmRates& measured_rates() {
  static const FastGemmRates r = [] {
    FastGemmRates m;
#ifdef ATTN_HAVE_ONEDNN
    std::tie(m.onednn_gflops, m.blas_gflops) = probe_rates();
#endif
    return m;
  }();
  return r;
}

// ATTN_GEMM_ENGINE, read once: -1 unset, empty or "auto"; else a FastLib (an
// invalid name is reported by every use).
int environment_engine() {
  static const int forced =
      environment_choice("ATTN_GEMM_ENGINE", fast_gemm_engines(), kFastLibNames);
  return checked_choice(forced, "ATTN_GEMM_ENGINE", "an engine of this build",
                        fast_gemm_engines());
}

// The library Engine::kFast runs now.
FastLib fast_lib() {
  const int forced = g_forced.load(std::memory_order_relaxed);
  if (forced >= 0) return FastLib(forced);
  const int env = environment_engine();
  if (env >= 0) return FastLib(env);
  return kDefaultLib;
}

}  // namespace

void sgemm(Trans ta, Trans tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
           int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc,
           Engine engine) {
  const GemmArgs g = check_gemm("gemm::sgemm", ta, tb, M, N, K, lda, ldb, ldc);
  if (empty_product(g, beta, C)) return;
  if (engine == Engine::kFast) {
#ifdef ATTN_HAVE_ONEDNN
    if (fast_lib() == kOneDnn) {
      onednn_sgemm("gemm::sgemm", ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
      return;
    }
#endif
    // The BLAS as the fast engine: on OpenMP's threads too (one pool for
    // the kernels and the products; two would take turns spinning).
    blas_rows_parallel(ta, tb, g, alpha, A, B, beta, C);
    return;
  }
  cblas_sgemm(CblasRowMajor, cblas_trans(ta), cblas_trans(tb), g.M, g.N, g.K, alpha, A, g.lda, B,
              g.ldb, beta, C, g.ldc);
}

void sgemm_rows_parallel(Trans ta, Trans tb, int64_t M, int64_t N, int64_t K, float alpha,
                         const float* A, int64_t lda, const float* B, int64_t ldb, float beta,
                         float* C, int64_t ldc, Engine engine) {
  const GemmArgs g = check_gemm("gemm::sgemm_rows_parallel", ta, tb, M, N, K, lda, ldb, ldc);
  if (empty_product(g, beta, C)) return;
#ifdef ATTN_HAVE_ONEDNN
  if (engine == Engine::kFast && fast_lib() == kOneDnn) {  // oneDNN splits the product itself
    onednn_sgemm("gemm::sgemm_rows_parallel", ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    return;
  }
#else
  (void)engine;
#endif
  blas_rows_parallel(ta, tb, g, alpha, A, B, beta, C);
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

// ---- bf16 ------------------------------------------------------------------------------
namespace {

// A buffer of n floats for widened operands (slot 0: A, 1: B), kept per
// thread from one call to the next up to kWidenKeptFloats (fresh pages cost a
// fault per 4 KB: the buffers of a GPT-2 layer's products, allocated per call,
// were most of the widening's time); larger ones live for the call. 16 MB a
// slot holds GPT-2 small's largest layer weight (768 x 3072) and 5,000 rows of 768.
constexpr size_t kWidenKeptFloats = size_t{4} << 20;
float* widen_buffer(int slot, size_t n, std::vector<float>& transient) {
  thread_local std::vector<float> kept[2];
  if (n > kWidenKeptFloats) {
    transient.resize(n);
    return transient.data();
  }
  if (kept[slot].size() < n) kept[slot].resize(n);
  return kept[slot].data();
}

// A matrix to widen: dst (rows, cols) = src (rows, cols; ld), exactly.
struct WidenJob {
  float* dst;
  const BFloat16* src;
  int64_t rows, cols, ld;
};

// The elements [e0, e1) of the jobs, in row-major order across them.
void widen_range(const WidenJob* jobs, int n_jobs, int64_t e0, int64_t e1) {
  for (int j = 0; j < n_jobs && e0 < e1; ++j) {
    const WidenJob& w = jobs[j];
    const int64_t size = w.rows * w.cols;
    if (e0 >= size) {
      e0 -= size;
      e1 -= size;
      continue;
    }
    const int64_t end = std::min(e1, size);
    for (int64_t e = e0; e < end;) {
      const int64_t i = e / w.cols, c = e % w.cols, n = std::min(w.cols - c, end - e);
      to_float(w.src + i * w.ld + c, w.dst + i * w.cols + c, static_cast<size_t>(n));
      e += n;
    }
    e0 = 0;
    e1 -= size;
  }
}

// Every job widened in one parallel region, the threads splitting the
// elements evenly, when there are enough of them to pay for the threads (one
// region for both operands of a product: each region is a fork and a join,
// and a bf16 training step of the small recipe makes about a hundred).
void widen_all(const WidenJob* jobs, int n_jobs) {
  int64_t total = 0;
  for (int j = 0; j < n_jobs; ++j) total += jobs[j].rows * jobs[j].cols;
  if (total < (int64_t{1} << 15) || omp_in_parallel()) {
    widen_range(jobs, n_jobs, 0, total);
    return;
  }
#pragma omp parallel
  {
    const int64_t t = omp_get_thread_num(), nt = omp_get_num_threads();
    widen_range(jobs, n_jobs, total * t / nt, total * (t + 1) / nt);
  }
}

// A and B widened to float32 (exact), then sgemm on the fast engine; arguments checked.
void widened_gemm_bf16(Trans ta, Trans tb, int64_t M, int64_t N, int64_t K, float alpha,
                       const BFloat16* A, int64_t lda, const BFloat16* B, int64_t ldb, float beta,
                       float* C, int64_t ldc) {
  const int64_t a_rows = ta == Trans::kNo ? M : K, a_cols = ta == Trans::kNo ? K : M;
  const int64_t b_rows = tb == Trans::kNo ? K : N, b_cols = tb == Trans::kNo ? N : K;
  std::vector<float> a_transient, b_transient;
  float* a = widen_buffer(0, static_cast<size_t>(a_rows * a_cols), a_transient);
  float* b = widen_buffer(1, static_cast<size_t>(b_rows * b_cols), b_transient);
  const WidenJob jobs[2] = {{a, A, a_rows, a_cols, lda}, {b, B, b_rows, b_cols, ldb}};
  widen_all(jobs, 2);
  sgemm(ta, tb, M, N, K, alpha, a, a_cols, b, b_cols, beta, C, ldc, Engine::kFast);
}

#ifdef ATTN_HAVE_ONEDNN
void check_dnnl(dnnl_status_t status, const char* what) {
  if (status != dnnl_success) {
    throw std::runtime_error(fmt::format("gemm::gemm_bf16: oneDNN's {} failed with status {}", what,
                                         static_cast<int>(status)));
  }
}

// One oneDNN matmul primitive for one shape, layout and (alpha, beta); made
// once (its JIT code is the expensive part) and kept for the process.
class Bf16Matmul {
 public:
  using Key =
      std::tuple<int, int, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, float, float>;

  // nullptr when oneDNN has no bf16 matmul for this CPU.
  static Bf16Matmul* get(const Key& key) {
    static std::mutex mutex;
    static std::map<Key, std::unique_ptr<Bf16Matmul>> cache;
    const std::lock_guard<std::mutex> lock(mutex);
    auto it = cache.find(key);
    if (it == cache.end()) it = cache.emplace(key, make(key)).first;
    return it->second.get();
  }

  void run(const BFloat16* A, const BFloat16* B, float* C) {
    const std::lock_guard<std::mutex> lock(run_mutex_);  // one set of memory objects per primitive
    check_dnnl(dnnl_memory_set_data_handle(a_, const_cast<BFloat16*>(A)), "memory_set_data_handle");
    check_dnnl(dnnl_memory_set_data_handle(b_, const_cast<BFloat16*>(B)), "memory_set_data_handle");
    check_dnnl(dnnl_memory_set_data_handle(c_, C), "memory_set_data_handle");
    const dnnl_exec_arg_t args[3] = {
        {DNNL_ARG_SRC, a_}, {DNNL_ARG_WEIGHTS, b_}, {DNNL_ARG_DST, c_}};
    check_dnnl(dnnl_primitive_execute(primitive_, stream(), 3, args), "primitive_execute");
    check_dnnl(dnnl_stream_wait(stream()), "stream_wait");
  }

  ~Bf16Matmul() {
    dnnl_memory_destroy(a_);
    dnnl_memory_destroy(b_);
    dnnl_memory_destroy(c_);
    dnnl_primitive_destroy(primitive_);
  }
  Bf16Matmul(const Bf16Matmul&) = delete;
  Bf16Matmul& operator=(const Bf16Matmul&) = delete;

 private:
  Bf16Matmul() = default;

  static dnnl_engine_t engine() {
    static const dnnl_engine_t e = [] {
      dnnl_engine_t made = nullptr;
      check_dnnl(dnnl_engine_create(&made, dnnl_cpu, 0), "engine_create");
      return made;
    }();
    return e;
  }
  static dnnl_stream_t stream() {
    static const dnnl_stream_t s = [] {
      dnnl_stream_t made = nullptr;
      check_dnnl(dnnl_stream_create(&made, engine(), dnnl_stream_default_flags), "stream_create");
      return made;
    }();
    return s;
  }

  static std::unique_ptr<Bf16Matmul> make(const Key& key) {
    const auto [ta, tb, M, N, K, lda, ldb, ldc, alpha, beta] = key;
    // Row-major (M, K) A is strides (lda, 1); stored transposed, (1, lda).
    const dnnl_dims_t a_dims = {M, K}, b_dims = {K, N}, c_dims = {M, N};
    const dnnl_dims_t a_strides = {ta == 0 ? lda : 1, ta == 0 ? 1 : lda};
    const dnnl_dims_t b_strides = {tb == 0 ? ldb : 1, tb == 0 ? 1 : ldb};
    const dnnl_dims_t c_strides = {ldc, 1};
    dnnl_memory_desc_t a_md, b_md, c_md;
    check_dnnl(dnnl_memory_desc_init_by_strides(&a_md, 2, a_dims, dnnl_bf16, a_strides),
               "memory_desc");
    check_dnnl(dnnl_memory_desc_init_by_strides(&b_md, 2, b_dims, dnnl_bf16, b_strides),
               "memory_desc");
    check_dnnl(dnnl_memory_desc_init_by_strides(&c_md, 2, c_dims, dnnl_f32, c_strides),
               "memory_desc");
    dnnl_matmul_desc_t desc;
    check_dnnl(dnnl_matmul_desc_init(&desc, &a_md, &b_md, nullptr, &c_md), "matmul_desc_init");
    dnnl_primitive_attr_t attr = nullptr;
    check_dnnl(dnnl_primitive_attr_create(&attr), "primitive_attr_create");
    dnnl_post_ops_t post_ops = nullptr;
    if (alpha != 1.0f) {
      check_dnnl(dnnl_primitive_attr_set_output_scales(attr, 1, 0, &alpha), "set_output_scales");
    }
    if (beta != 0.0f) {  // C = alpha·AB + beta·C: a sum post-op
      check_dnnl(dnnl_post_ops_create(&post_ops), "post_ops_create");
      check_dnnl(dnnl_post_ops_append_sum(post_ops, beta), "post_ops_append_sum");
      check_dnnl(dnnl_primitive_attr_set_post_ops(attr, post_ops), "set_post_ops");
    }
    dnnl_primitive_desc_t pd = nullptr;
    const dnnl_status_t made = dnnl_primitive_desc_create(&pd, &desc, attr, engine(), nullptr);
    if (post_ops != nullptr) dnnl_post_ops_destroy(post_ops);
    dnnl_primitive_attr_destroy(attr);
    if (made == dnnl_unimplemented) return nullptr;  // no bf16 kernel on this CPU
    check_dnnl(made, "primitive_desc_create");
    std::unique_ptr<Bf16Matmul> m(new Bf16Matmul());
    const dnnl_status_t prim = dnnl_primitive_create(&m->primitive_, pd);
    dnnl_primitive_desc_destroy(pd);
    check_dnnl(prim, "primitive_create");
    check_dnnl(dnnl_memory_create(&m->a_, &a_md, engine(), DNNL_MEMORY_NONE), "memory_create");
    check_dnnl(dnnl_memory_create(&m->b_, &b_md, engine(), DNNL_MEMORY_NONE), "memory_create");
    check_dnnl(dnnl_memory_create(&m->c_, &c_md, engine(), DNNL_MEMORY_NONE), "memory_create");
    return m;
  }

  dnnl_primitive_t primitive_ = nullptr;
  dnnl_memory_t a_ = nullptr, b_ = nullptr, c_ = nullptr;
  std::mutex run_mutex_;
};

// Whether oneDNN has a bf16 matmul for this CPU (asked once, on a small product).
bool onednn_has_bf16() {
  static const bool has = Bf16Matmul::get({0, 0, 16, 16, 16, 16, 16, 16, 1.0f, 0.0f}) != nullptr;
  return has;
}
#endif

// ---- gemm_bf16: which route -----------------------------------------------------------
// kMatmul: oneDNN's bf16 matmul (with oneDNN, where it has a bf16 kernel);
// kWidened: widened_gemm_bf16. g_bf16_forced: -1 automatic, else a Bf16Route.
enum Bf16Route : int { kMatmul = 0, kWidenedRoute = 1 };
constexpr const char* kBf16RouteNames[] = {"matmul", "widened"};
std::atomic<int> g_bf16_forced{-1};

bool matmul_available() {
#ifdef ATTN_HAVE_ONEDNN
  return onednn_has_bf16();
#else
  return false;
#endif
}

bool cpu_is_amd() {
#if defined(__x86_64__) || defined(__i386__)
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (__get_cpuid(0, &eax, &ebx, &ecx, &edx) == 0) return false;
  return ebx == 0x68747541u && edx == 0x69746e65u && ecx == 0x444d4163u;  // "AuthenticAMD"
#else
  return false;
#endif
}

// The automatic route and why. oneDNN's bf16 matmul runs on AMX tiles where
// it has them, else on AVX512-BF16's VDPBF16PS: two products a lane, at the
// FMA's instruction rate on AMD Zen 4/5 (twice fp32's products) but at half
// of it on Intel cores, so that there bf16 products come no faster than
// fp32's, and oneDNN's bf16 matmul ran a GPT-2 layer's projections 1.3-1.6x
// slower than fp32 sgemm (Xeon with AMX off through ONEDNN_MAX_CPU_ISA,
// docs/gemm.md). Widening both operands (exact) and running the fp32 sgemm
// costs a pass over them instead. A fixed rule, not a timing: the same route
// in every run, so the same bits.
std::pair<Bf16Route, const char*> decide_bf16_route() {
  if (!matmul_available())
    return {kWidenedRoute, "no bf16 matmul in this build or for this CPU: widened"};
#ifdef ATTN_HAVE_ONEDNN
  const dnnl_cpu_isa_t isa = dnnl_get_effective_cpu_isa();
  if ((isa & dnnl_cpu_isa_avx512_core_amx) == dnnl_cpu_isa_avx512_core_amx)
    return {kMatmul, "oneDNN's bf16 matmul runs on AMX"};
  if ((isa & dnnl_cpu_isa_avx512_core_bf16) == dnnl_cpu_isa_avx512_core_bf16 && cpu_is_amd())
    return {kMatmul, "AVX512-BF16 at the FMA's rate (AMD): oneDNN's bf16 matmul"};
#endif
  return {kWidenedRoute,
          "no AMX, and bf16 dot products no faster than fp32 FMA here: widened to fp32, then the "
          "fast sgemm"};
}

// The automatic route and its reason, decided once.
const std::pair<Bf16Route, const char*>& automatic_bf16_route() {
  static const std::pair<Bf16Route, const char*> route = decide_bf16_route();
  return route;
}

// ATTN_BF16_GEMM, read once: -1 unset, empty or "auto"; else a Bf16Route (an
// invalid name is reported by every use).
int environment_bf16_route() {
  static const int forced =
      environment_choice("ATTN_BF16_GEMM", gemm_bf16_routes(), kBf16RouteNames);
  return checked_choice(forced, "ATTN_BF16_GEMM", "a bf16 route of this build and CPU",
                        gemm_bf16_routes());
}

Bf16Route bf16_route() {
  const int forced = g_bf16_forced.load(std::memory_order_relaxed);
  if (forced >= 0) return Bf16Route(forced);
  const int env = environment_bf16_route();
  if (env >= 0) return Bf16Route(env);
  return automatic_bf16_route().first;
}

}  // namespace

void gemm_bf16(Trans ta, Trans tb, int64_t M, int64_t N, int64_t K, float alpha, const BFloat16* A,
               int64_t lda, const BFloat16* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  const GemmArgs g = check_gemm("gemm::gemm_bf16", ta, tb, M, N, K, lda, ldb, ldc);
  if (empty_product(g, beta, C)) return;
#ifdef ATTN_HAVE_ONEDNN
  // (alpha and beta are part of a primitive's key; a NaN would break the cache's ordering.)
  const bool finite_scalars = std::isfinite(alpha) && std::isfinite(beta);
  if (Bf16Matmul* m = !finite_scalars || bf16_route() != kMatmul
                          ? nullptr
                          : Bf16Matmul::get({ta == Trans::kNo ? 0 : 1, tb == Trans::kNo ? 0 : 1, M,
                                             N, K, lda, ldb, ldc, alpha, beta})) {
    m->run(A, B, C);
    return;
  }
#endif
  widened_gemm_bf16(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

void widen_bf16(float* dst, const BFloat16* src, int64_t n) {
  check_size("gemm::widen_bf16", "n", n);
  const WidenJob job{dst, src, 1, n, n};  // one row of n
  widen_all(&job, 1);
}

void gemm_bf16_widened(Trans ta, Trans tb, int64_t M, int64_t N, int64_t K, float alpha,
                       const BFloat16* A, int64_t lda, const BFloat16* B, int64_t ldb, float beta,
                       float* C, int64_t ldc) {
  const GemmArgs g = check_gemm("gemm::gemm_bf16_widened", ta, tb, M, N, K, lda, ldb, ldc);
  if (empty_product(g, beta, C)) return;
  widened_gemm_bf16(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

const char* gemm_bf16_name() {
  static const std::string kWidenedBlas = std::string("bf16 widened to fp32, then ") + blas_name();
#ifdef ATTN_HAVE_ONEDNN
  static const std::string kMatmulName = onednn_version() + " matmul, bf16";
  static const std::string kWidenedOneDnn =
      std::string("bf16 widened to fp32, then ") + onednn_name();
  if (bf16_route() == kMatmul) return kMatmulName.c_str();
  if (fast_lib() == kOneDnn) return kWidenedOneDnn.c_str();
#endif
  return kWidenedBlas.c_str();
}

std::vector<std::string> gemm_bf16_routes() {
  if (matmul_available()) return {"matmul", "widened"};
  return {"widened"};
}

const char* gemm_bf16_route() { return kBf16RouteNames[bf16_route()]; }

std::string gemm_bf16_reason() {
  if (g_bf16_forced.load() >= 0) return "forced by gemm::gemm_bf16_use";
  if (environment_bf16_route() >= 0)
    return fmt::format("ATTN_BF16_GEMM={}", kBf16RouteNames[environment_bf16_route()]);
  return automatic_bf16_route().second;
}

bool gemm_bf16_use(const char* name) {
  return use_choice(g_bf16_forced, name, gemm_bf16_routes(), kBf16RouteNames);
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
  static const std::string kOneDnnName = onednn_name();
  if (fast_lib() == kOneDnn) return kOneDnnName.c_str();
#endif
  return blas_name();
}

std::vector<std::string> fast_gemm_engines() {
#ifdef ATTN_HAVE_ONEDNN
  return {"onednn", "blas"};
#else
  return {"blas"};
#endif
}

const char* fast_gemm_engine() { return kFastLibNames[fast_lib()]; }

std::string fast_gemm_reason() {
  if (g_forced.load() >= 0) return "forced by gemm::fast_gemm_use";
  if (environment_engine() >= 0)
    return fmt::format("ATTN_GEMM_ENGINE={}", kFastLibNames[environment_engine()]);
  return kDefaultReason;
}

FastGemmRates fast_gemm_rates() { return measured_rates(); }

bool fast_gemm_use(const char* name) {
  return use_choice(g_forced, name, fast_gemm_engines(), kFastLibNames);
}

}  // namespace attn::gemm
