// The kernels of decoding one token at a time (attn/decode_kernels.h states the
// maths): GEMV over a Linear's weight rows in fp32 and bf16, the attention of
// one query over a key/value cache (flash-decoding with Tq = 1,
// src/kernels/decode_attention.cpp), and the memory read-bandwidth probe.
// Highway dynamic dispatch for the vector code; OpenMP over blocks of output
// rows (GEMV). The bf16 GEMV's AVX512-BF16
// path is in gemv_bf16_avx512.cpp (VDPBF16PS is not among Highway 1.0.3's
// targets); this file picks it at run time.
#include "attn/decode_kernels.h"

#include "attn/cpu.h"
#include "attn/decode_attention.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "attn/kernels.h"
#include "attn/tensor.h"

#ifdef _OPENMP
#include <omp.h>
#endif

#include "cpu/hwy_targets.h"
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/decode_kernels.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>
// After highway.h: the -inl header is compiled once per target.
#include <hwy/contrib/math/math-inl.h>  // NOLINT(build/include_order)
#include "kernels/bf16_load-inl.h"

HWY_BEFORE_NAMESPACE();
namespace attn::kernels {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using DF = hn::ScalableTag<float>;
using VF = hn::Vec<DF>;
inline float Widen(uint16_t bits) { return to_float(BFloat16{bits}); }

HWY_INLINE float Sum(DF d, VF v) { return hn::GetLane(hn::SumOfLanes(d, v)); }

// y[n] = Σ_k x[k] · W[n, k] + bias[n] for n in [n0, n1): one row after the
// other, so the weights are read in memory order (one sequential stream per
// thread, what the hardware prefetcher follows best), each row in four
// independent vector chains over k (columns k, k + L, k + 2L, k + 3L), then a
// scalar tail. Row(w, k) loads Lanes floats of a weight row at column k (fp32
// or widened bf16), Scalar(w, k) one of them.
template <class T, class LoadRow, class ScalarOf>
void RowsT(float* y, const float* x, const T* W, const float* bias, size_t n0, size_t n1, size_t K,
           const LoadRow& load_row, const ScalarOf& scalar) {
  const DF d;
  const size_t L = hn::Lanes(d);
  const size_t K4 = K / (4 * L) * (4 * L), Kv = K / L * L;
  for (size_t n = n0; n < n1; ++n) {
    const T* w = W + n * K;
    VF a0 = hn::Zero(d), a1 = hn::Zero(d), a2 = hn::Zero(d), a3 = hn::Zero(d);
    size_t k = 0;
    for (; k < K4; k += 4 * L) {
      a0 = hn::MulAdd(load_row(d, w + k), hn::LoadU(d, x + k), a0);
      a1 = hn::MulAdd(load_row(d, w + k + L), hn::LoadU(d, x + k + L), a1);
      a2 = hn::MulAdd(load_row(d, w + k + 2 * L), hn::LoadU(d, x + k + 2 * L), a2);
      a3 = hn::MulAdd(load_row(d, w + k + 3 * L), hn::LoadU(d, x + k + 3 * L), a3);
    }
    for (; k < Kv; k += L) a0 = hn::MulAdd(load_row(d, w + k), hn::LoadU(d, x + k), a0);
    float s = Sum(d, hn::Add(hn::Add(a0, a1), hn::Add(a2, a3)));
    for (; k < K; ++k) s += scalar(w[k]) * x[k];
    y[n] = s + (bias != nullptr ? bias[n] : 0.0f);
  }
}

void RowsF32(float* y, const float* x, const float* W, const float* bias, size_t n0, size_t n1,
             size_t K) {
  RowsT(
      y, x, W, bias, n0, n1, K, [](DF d, const float* p) { return hn::LoadU(d, p); },
      [](float v) { return v; });
}

// x: the bf16 operand already widened to fp32 (exact).
void RowsBf16Widened(float* y, const float* x, const uint16_t* W, const float* bias, size_t n0,
                     size_t n1, size_t K) {
  RowsT(
      y, x, W, bias, n0, n1, K, [](DF d, const uint16_t* p) { return LoadBf16(d, p); },
      [](uint16_t v) { return Widen(v); });
}

// Σ of n floats at p in four vector chains (the bandwidth probe's read).
float SumStream(const float* p, size_t n) {
  const DF d;
  const size_t L = hn::Lanes(d);
  VF a0 = hn::Zero(d), a1 = hn::Zero(d), a2 = hn::Zero(d), a3 = hn::Zero(d);
  size_t i = 0;
  for (; i + 4 * L <= n; i += 4 * L) {
    a0 = hn::Add(a0, hn::LoadU(d, p + i));
    a1 = hn::Add(a1, hn::LoadU(d, p + i + L));
    a2 = hn::Add(a2, hn::LoadU(d, p + i + 2 * L));
    a3 = hn::Add(a3, hn::LoadU(d, p + i + 3 * L));
  }
  float s = Sum(d, hn::Add(hn::Add(a0, a1), hn::Add(a2, a3)));
  for (; i < n; ++i) s += p[i];
  return s;
}

// NOLINTNEXTLINE(google-readability-namespace-comments)
}  // namespace HWY_NAMESPACE
}  // namespace attn::kernels
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace attn::kernels {

// gemv_bf16_avx512.cpp: RowsBf16Widened's rows on VDPBF16PS, x as bf16.
namespace detail {
void gemv_bf16_rows_avx512(float* y, const uint16_t* x, const uint16_t* W, const float* bias,
                           size_t n0, size_t n1, size_t K);
}  // namespace detail

HWY_EXPORT(RowsF32);
HWY_EXPORT(RowsBf16Widened);
HWY_EXPORT(SumStream);

namespace {

// Output rows per block: 32 rows of 768 fp32 are 96 KiB, reused from L2 for
// each of the M tokens while the next block streams in.
constexpr int64_t kBlockRows = 32;
// Below this many weights one thread does it all (a parallel region costs a
// few microseconds; 2^15 weights take about that to stream).
constexpr int64_t kParallelWeights = int64_t{1} << 15;

void check_gemv(const char* fn, int64_t ldy, int64_t ldx, int64_t M, int64_t N, int64_t K) {
  if (M < 0 || N < 0 || K < 0 || ldx < K || ldy < N) {
    throw std::invalid_argument(fmt::format(
        "{}: need M, N, K >= 0, ldx >= K, ldy >= N; got M = {}, N = {}, K = {}, ldx = {}, ldy = {}",
        fn, M, N, K, ldx, ldy));
  }
}

// rows(m, n0, n1) computes y[m, n0..n1) for every block of output rows, the
// blocks split over OpenMP threads in contiguous runs (schedule(static)).
template <class Rows>
void parallel_rows(int64_t M, int64_t N, int64_t K, const Rows& rows) {
  const int64_t blocks = (N + kBlockRows - 1) / kBlockRows;
#pragma omp parallel for schedule(static) if (N * K >= kParallelWeights && blocks > 1)
  for (int64_t blk = 0; blk < blocks; ++blk) {
    const int64_t n0 = blk * kBlockRows, n1 = std::min(N, n0 + kBlockRows);
    for (int64_t m = 0; m < M; ++m) rows(m, size_t(n0), size_t(n1));
  }
}

enum class Bf16Path { kAuto, kAvx512Bf16, kWidened };
Bf16Path g_forced = Bf16Path::kAuto;

// AVX512-BF16 where the CPU has it, unless a forced SIMD target below AVX-512
// (ATTN_SIMD_TARGET=AVX2) stands for a CPU without it.
bool avx512_bf16_first() { return cpu::has_avx512_bf16() && simd_target_has_avx512(); }
Bf16Path chosen_path() {
  if (g_forced != Bf16Path::kAuto) return g_forced;
  return avx512_bf16_first() ? Bf16Path::kAvx512Bf16 : Bf16Path::kWidened;
}
const char* path_name(Bf16Path p) { return p == Bf16Path::kAvx512Bf16 ? "AVX512-BF16" : "widened"; }

}  // namespace

void gemv_forward(float* y, int64_t ldy, const float* x, int64_t ldx, const float* W,
                  const float* bias, int64_t M, int64_t N, int64_t K) {
  const GemvProblem p{y, ldy, x, ldx, W, bias, M, N, K};
  gemv_forward_batch(&p, 1);
}

void gemv_forward_batch(const GemvProblem* problems, int64_t count) {
  // (problem, first row) of every block of every problem.
  std::vector<std::pair<int64_t, int64_t>> blocks;
  int64_t weights = 0;
  for (int64_t i = 0; i < count; ++i) {
    const GemvProblem& p = problems[i];
    check_gemv("gemv_forward", p.ldy, p.ldx, p.M, p.N, p.K);
    for (int64_t n0 = 0; n0 < p.N; n0 += kBlockRows) blocks.emplace_back(i, n0);
    weights += p.N * p.K;
  }
  const auto n_blocks = static_cast<int64_t>(blocks.size());
#pragma omp parallel for schedule(static) if (weights >= kParallelWeights && n_blocks > 1)
  for (int64_t b = 0; b < n_blocks; ++b) {
    const GemvProblem& p = problems[blocks[size_t(b)].first];
    const int64_t n0 = blocks[size_t(b)].second, n1 = std::min(p.N, n0 + kBlockRows);
    for (int64_t m = 0; m < p.M; ++m) {
      HWY_DYNAMIC_DISPATCH(RowsF32)
      (p.y + m * p.ldy, p.x + m * p.ldx, p.W, p.bias, size_t(n0), size_t(n1), size_t(p.K));
    }
  }
}

void gemv_forward_bf16(float* y, int64_t ldy, const BFloat16* x, int64_t ldx, const BFloat16* W,
                       const float* bias, int64_t M, int64_t N, int64_t K) {
  check_gemv("gemv_forward_bf16", ldy, ldx, M, N, K);
  const auto* w16 = reinterpret_cast<const uint16_t*>(W);
  if (chosen_path() == Bf16Path::kAvx512Bf16) {
    const auto* x16 = reinterpret_cast<const uint16_t*>(x);
    parallel_rows(M, N, K, [&](int64_t m, size_t n0, size_t n1) {
      detail::gemv_bf16_rows_avx512(y + m * ldy, x16 + m * ldx, w16, bias, n0, n1, size_t(K));
    });
    return;
  }
  std::vector<float> xf(size_t(M * K));  // x widened once (exact)
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t k = 0; k < K; ++k) xf[size_t(m * K + k)] = to_float(x[m * ldx + k]);
  }
  parallel_rows(M, N, K, [&](int64_t m, size_t n0, size_t n1) {
    HWY_DYNAMIC_DISPATCH(RowsBf16Widened)
    (y + m * ldy, xf.data() + m * K, w16, bias, n0, n1, size_t(K));
  });
}

const char* gemv_bf16_path() { return path_name(chosen_path()); }

std::vector<std::string> gemv_bf16_paths() {
  std::vector<std::string> names;
  if (avx512_bf16_first()) names.emplace_back(path_name(Bf16Path::kAvx512Bf16));
  names.emplace_back(path_name(Bf16Path::kWidened));
  if (cpu::has_avx512_bf16() && !avx512_bf16_first())
    names.emplace_back(path_name(Bf16Path::kAvx512Bf16));
  return names;
}

bool gemv_bf16_use_path(const char* name) {
  g_forced = Bf16Path::kAuto;
  if (name == nullptr) return true;
  for (Bf16Path p : {Bf16Path::kAvx512Bf16, Bf16Path::kWidened}) {
    if (std::string(name) != path_name(p)) continue;
    if (p == Bf16Path::kAvx512Bf16 && !cpu::has_avx512_bf16()) return false;
    g_forced = p;
    return true;
  }
  return false;
}

namespace {
void check_attention(const char* fn, int64_t B, int64_t H, int64_t length, int64_t capacity,
                     int64_t hd) {
  if (B < 1 || H < 1 || hd < 1 || length < 1 || length > capacity) {
    throw std::invalid_argument(fmt::format(
        "{}: need B, H, hd >= 1 and 1 <= length <= capacity; got B = {}, H = {}, hd = {}, "
        "length = {}, capacity = {}",
        fn, B, H, hd, length, capacity));
  }
}
}  // namespace

// One query per (b, h): flash-decoding (attn/decode_attention.h) with Tq = 1
// and Hq = Hkv = H.
void decode_attention(float* out, const float* q, const float* keys, const float* values, int64_t B,
                      int64_t H, int64_t length, int64_t capacity, int64_t hd, float scale) {
  check_attention("decode_attention", B, H, length, capacity, hd);
  decode_attention_forward(out, q, keys, values,
                           {.B = B, .Hq = H, .Hkv = H, .Tq = 1, .length = length,
                            .capacity = capacity, .D = hd, .scale = scale});
}

void decode_attention_bf16(BFloat16* out, const BFloat16* q, const BFloat16* keys,
                           const BFloat16* values, int64_t B, int64_t H, int64_t length,
                           int64_t capacity, int64_t hd, float scale) {
  check_attention("decode_attention_bf16", B, H, length, capacity, hd);
  decode_attention_forward_bf16(out, q, keys, values,
                                {.B = B, .Hq = H, .Hkv = H, .Tq = 1, .length = length,
                                 .capacity = capacity, .D = hd, .scale = scale});
}

double read_bandwidth_gbs(int64_t bytes, int threads, int repeats) {
  if (repeats < 1 || threads < 0 || bytes < (int64_t{1} << 20)) {
    throw std::invalid_argument(fmt::format(
        "read_bandwidth_gbs: need repeats >= 1, threads >= 0, bytes >= 1 MiB; got repeats = {}, "
        "threads = {}, bytes = {}",
        repeats, threads, bytes));
  }
#ifdef _OPENMP
  const int n_threads = threads > 0 ? threads : omp_get_max_threads();
#else
  const int n_threads = 1;
#endif
  const int64_t n = bytes / int64_t(sizeof(float));
  // attn's own storage, as the weights are held (2 MiB-aligned, huge pages
  // where the kernel grants them: src/tensor/storage_cache.cpp).
  Tensor buf = Tensor::full({n}, 1.0f);
  using Clock = std::chrono::steady_clock;
  double sink = 0;
  const auto pass = [&] {
    const auto t0 = Clock::now();
    double s = 0;
#pragma omp parallel num_threads(n_threads) reduction(+ : s)
    {
#ifdef _OPENMP
      const int64_t t = omp_get_thread_num(), nt = omp_get_num_threads();
#else
      const int64_t t = 0, nt = 1;
#endif
      const int64_t i0 = n * t / nt, i1 = n * (t + 1) / nt;
      s += double(HWY_DYNAMIC_DISPATCH(SumStream)(buf.data() + i0, size_t(i1 - i0)));
    }
    sink += s;
    return std::chrono::duration<double>(Clock::now() - t0).count();
  };
  pass();  // warm-up: pages touched, threads started
  std::vector<double> rates;
  for (int r = 0; r < repeats; ++r) rates.push_back(double(n) * sizeof(float) / pass() * 1e-9);
  const double expected = double(n) * (repeats + 1);  // the buffer holds ones
  if (!(std::abs(sink - expected) <= 1e-3 * expected)) {
    throw std::runtime_error("read_bandwidth_gbs: the probe's sums are wrong");
  }
  std::sort(rates.begin(), rates.end());
  return rates[rates.size() / 2];
}

}  // namespace attn::kernels
#endif  // HWY_ONCE
