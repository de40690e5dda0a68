// Benchmarks of the fused attention kernel (attn/kernels.h) beside BLAS
// sgemm (attn/gemm.h), measured in the same run so the ratio can be read off directly.
//
//   ./build/bench/bench_attention --benchmark_min_time=1
//   ./build/bench/bench_attention --memory_check    (T = 16384: time and peak extra memory)
//   ATTN_FLASH_TARGET=AVX2 ./build/bench/bench_attention    (another SIMD target)
//
// FLOPs counted (the usual "useful" attention FLOPs, as FlashAttention reports):
//   forward  = 4 · B · H · T² · hd    (Q Kᵀ and P V, 2 FLOPs per multiply-add),
//              halved when causal (only j <= i is useful work);
//   backward = 2.5 · forward          (five T×T×hd products instead of two);
//   forward + backward = 3.5 · forward.
//   sgemm    = 2 · M · N · K.
// Counters (Google Benchmark prints rates with a "/s" suffix): GFLOP, the rate
// in GFLOP/s, pct_of_sgemm, that rate as a percentage of the sgemm rate
// measured at start-up by this program (median of 5 runs of 4096³, threads as
// the BLAS chooses; the kernels use OpenMP's), and pct_of_peak, the same
// against the CPU's fp32 FMA peak (bench/yardsticks.h). Each case runs 5 repetitions and
// reports mean, median, stddev, cv and min; the min row holds the fastest time
// but, for the rate counters, the slowest repetition's rate.
// Before any timing, the kernels are checked against the plain reference and
// every benchmark checks its outputs are finite.
#include <benchmark/benchmark.h>
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <random>
#include <string>
#include <vector>

#include "attn/functional.h"
#include "attn/gemm.h"
#include "attn/kernels.h"
#include "yardsticks.h"

namespace {

namespace kn = attn::kernels;

std::vector<float> randn(size_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> x(n);
  for (auto& e : x) e = dist(gen);
  return x;
}

double forward_flops(const kn::FlashAttentionParams& p) {
  const double f = 4.0 * double(p.B) * double(p.H) * double(p.T) * double(p.T) * double(p.hd);
  return p.causal ? f / 2.0 : f;
}

struct Problem {
  kn::FlashAttentionParams p;
  std::vector<float> q, k, v, out, lse, dout, dq, dk, dv;
  explicit Problem(const kn::FlashAttentionParams& params) : p(params) {
    const size_t n = size_t(p.B * p.T * p.H * p.hd);
    q = randn(n, 1), k = randn(n, 2), v = randn(n, 3), dout = randn(n, 4);
    out.resize(n), dq.resize(n), dk.resize(n), dv.resize(n);
    lse.resize(size_t(p.B * p.H * p.T));
  }
  void forward() {
    kn::flash_attention_forward(out.data(), lse.data(), q.data(), k.data(), v.data(), p);
  }
  void backward() {
    kn::flash_attention_backward(dq.data(), dk.data(), dv.data(), dout.data(), q.data(), k.data(),
                                 v.data(), out.data(), lse.data(), p);
  }
  bool finite() const {
    for (const auto* buf : {&out, &lse, &dq, &dk, &dv})
      for (float x : *buf)
        if (!std::isfinite(x)) return false;
    return true;
  }
};

kn::FlashAttentionParams params_of(const benchmark::State& state) {
  kn::FlashAttentionParams p;
  p.B = state.range(0), p.H = state.range(1), p.T = state.range(2), p.hd = state.range(3);
  p.causal = state.range(4) != 0;
  p.dropout_p = float(state.range(5)) / 100.0f;
  p.dropout_seed = 2024;
  return p;
}

void BM_FlashForward(benchmark::State& state) {
  Problem pr(params_of(state));
  pr.forward();  // warm-up and check
  if (!pr.finite()) state.SkipWithError("non-finite output");
  for (auto _ : state) {
    pr.forward();
    benchmark::DoNotOptimize(pr.out.data());
  }
  attn::bench::add_rate_counters(state, forward_flops(pr.p));
}

void BM_FlashBackward(benchmark::State& state) {
  Problem pr(params_of(state));
  pr.forward();
  pr.backward();
  if (!pr.finite()) state.SkipWithError("non-finite output");
  for (auto _ : state) {
    pr.backward();
    benchmark::DoNotOptimize(pr.dq.data());
  }
  attn::bench::add_rate_counters(state, 2.5 * forward_flops(pr.p));
}

void BM_FlashForwardBackward(benchmark::State& state) {
  Problem pr(params_of(state));
  pr.forward();
  pr.backward();
  if (!pr.finite()) state.SkipWithError("non-finite output");
  for (auto _ : state) {
    pr.forward();
    pr.backward();
    benchmark::DoNotOptimize(pr.dq.data());
  }
  attn::bench::add_rate_counters(state, 3.5 * forward_flops(pr.p));
}

void BM_Sgemm(benchmark::State& state) {
  const int n = int(state.range(0));
  const auto a = randn(size_t(n) * n, 5), b = randn(size_t(n) * n, 6);
  std::vector<float> c(size_t(n) * n);
  for (auto _ : state) {
    attn::gemm::sgemm(attn::gemm::Trans::kNo, attn::gemm::Trans::kNo, n, n, n, 1.0f, a.data(), n,
                      b.data(), n, 0.0f, c.data(), n, attn::gemm::Engine::kFast);
    benchmark::DoNotOptimize(c.data());
  }
  attn::bench::add_rate_counters(state, 2.0 * double(n) * n * n);
}

// (B, H, T, hd, causal, dropout in percent)
void attention_args(benchmark::internal::Benchmark* b) {
  b->ArgNames({"B", "H", "T", "hd", "causal", "drop%"});
  for (int64_t T : {256, 1024, 4096}) b->Args({1, 12, T, 64, 1, 0});
  b->Args({1, 6, 1024, 128, 1, 0});
  b->Args({1, 6, 4096, 128, 1, 0});
  b->Args({8, 12, 1024, 64, 1, 0});
  b->Args({1, 12, 1024, 64, 0, 0});
  b->Args({1, 12, 1024, 64, 1, 10});  // dropout 0.1 inside the kernel
  b->Args({1, 1, 4096, 64, 1, 0});    // one head: backward splits it over key and query tiles
  b->Unit(benchmark::kMillisecond)->UseRealTime();
}

double median_min_stat(const std::vector<double>& v, bool median) {
  std::vector<double> s = v;
  std::sort(s.begin(), s.end());
  return median ? s[s.size() / 2] : s.front();
}

void register_all() {
  auto stats = [](benchmark::internal::Benchmark* b) {
    b->Repetitions(5)->ReportAggregatesOnly(true);
    b->ComputeStatistics("min",
                         [](const std::vector<double>& v) { return median_min_stat(v, false); });
  };
  stats(benchmark::RegisterBenchmark("sgemm", BM_Sgemm)
            ->Arg(4096)
            ->Unit(benchmark::kMillisecond)
            ->UseRealTime());
  stats(benchmark::RegisterBenchmark("flash_forward", BM_FlashForward)->Apply(attention_args));
  stats(benchmark::RegisterBenchmark("flash_backward", BM_FlashBackward)->Apply(attention_args));
  stats(benchmark::RegisterBenchmark("flash_forward_backward", BM_FlashForwardBackward)
            ->Apply(attention_args));
}

// The fused kernel against the plain loops on a small case, before any timing.
bool check_against_reference() {
  kn::FlashAttentionParams p;
  p.B = 2, p.T = 77, p.H = 3, p.hd = 64, p.causal = true;
  Problem pr(p);
  pr.forward();
  pr.backward();
  std::vector<float> out(pr.out.size()), lse(pr.lse.size()), dq(pr.dq.size()), dk(dq.size()),
      dv(dq.size());
  attn::ref::strided_attention_forward(out.data(), lse.data(), pr.q.data(), pr.k.data(), pr.v.data(),
                                  nullptr, p);
  attn::ref::strided_attention_backward(dq.data(), dk.data(), dv.data(), pr.dout.data(), pr.q.data(),
                                   pr.k.data(), pr.v.data(), nullptr, p);
  auto rel = [](const std::vector<float>& a, const std::vector<float>& b) {
    double diff = 0, ref = 0;
    for (size_t n = 0; n < a.size(); ++n) {
      diff = std::max(diff, double(std::abs(a[n] - b[n])));
      ref = std::max(ref, double(std::abs(b[n])));
    }
    return diff / ref;
  };
  const double worst = std::max({rel(pr.out, out), rel(pr.dq, dq), rel(pr.dk, dk), rel(pr.dv, dv)});
  std::printf("check vs reference (B=2 T=77 H=3 hd=64 causal): max rel err %.2e\n", worst);
  return std::isfinite(worst) && worst <= 2e-5;
}

double max_rss_mb() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return double(usage.ru_maxrss) / 1024.0;  // ru_maxrss is in KiB on Linux
}

// --memory_check: B=1, T=16384, 12 heads of 64, causal, forward + backward once.
// The extra memory is the growth of the peak resident set while the kernels
// run, after every input and output has been written (run first, so no earlier
// peak hides it). Passes when it is under 64 MB.
int memory_check() {
  kn::FlashAttentionParams p;
  p.B = 1, p.T = 16384, p.H = 12, p.hd = 64, p.causal = true;
  Problem pr(p);
  const double before = max_rss_mb();
  const auto t0 = std::chrono::steady_clock::now();
  const std::clock_t c0 = std::clock();
  pr.forward();
  const auto t1 = std::chrono::steady_clock::now();
  const std::clock_t c1 = std::clock();
  pr.backward();
  const auto t2 = std::chrono::steady_clock::now();
  const std::clock_t c2 = std::clock();
  // CPU seconds of all threads: with one thread, a time that excludes waiting for the core.
  const double fwd_cpu = double(c1 - c0) / CLOCKS_PER_SEC,
               bwd_cpu = double(c2 - c1) / CLOCKS_PER_SEC;
  const double extra = max_rss_mb() - before;
  const double fwd_s = std::chrono::duration<double>(t1 - t0).count();
  const double bwd_s = std::chrono::duration<double>(t2 - t1).count();
  std::printf(
      "T=16384 B=1 H=12 hd=64 causal: inputs+outputs %.0f MB resident\n"
      "  forward  %.2f s (%.1f GFLOP/s), CPU %.2f s\n"
      "  backward %.2f s (%.1f GFLOP/s), CPU %.2f s\n"
      "  peak extra memory %.1f MB (limit 64 MB); finite: %s\n",
      before, fwd_s, forward_flops(p) / fwd_s * 1e-9, fwd_cpu, bwd_s,
      2.5 * forward_flops(p) / bwd_s * 1e-9, bwd_cpu, extra, pr.finite() ? "yes" : "NO");
  return extra < 64.0 && pr.finite() ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  for (int a = 1; a < argc; ++a)
    if (std::string(argv[a]) == "--memory_check") return memory_check();
  // ATTN_FLASH_TARGET=AVX2 (or SSE4, SCALAR) times another compiled-in SIMD target.
  if (const char* target = std::getenv("ATTN_FLASH_TARGET")) {
    if (!kn::flash_attention_use_target(target)) {
      std::fprintf(stderr, "SIMD target %s is not available here\n", target);
      return 1;
    }
  }
  std::printf("flash attention SIMD target: %s\n", kn::flash_attention_target());
  if (!check_against_reference()) {
    std::fprintf(stderr, "fused kernel disagrees with the reference; not timing it\n");
    return 1;
  }
  attn::bench::measure_yardsticks();
  register_all();
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
