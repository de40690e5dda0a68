// The cost of the next token: forward_cached with a key/value cache holding
// T - 1 tokens, against recomputing MultiHeadAttention::forward on all T tokens
// (what a decoder without a cache does for every token). One GPT-2 small
// attention layer: d_in = d_out = 768, 12 heads of 64, context_length 1024, B = 1.
//   ./build/bench/bench_kv_cache --benchmark_repetitions=5 --benchmark_report_aggregates_only
// (median and min of the repetitions)
// Each benchmark first checks that the cached output equals forward()'s row T-1
// (within 1e-5) and refuses to time a wrong result.
// FLOPs (multiply-adds counted as 2):
//   cached:    projections 3 * 2 * d_in * d_out + out_proj 2 * d_out^2
//              + attention 2 * 2 * T * d_out (scores and weighted sum over T keys)
//   recompute: T * (6 * d_in * d_out + 2 * d_out^2) + 2 * 2 * T^2 * d_out
//              (the reference computes the full T x T scores, masked)
#include <benchmark/benchmark.h>

#include <algorithm>
#include <memory>
#include <vector>

#include "attn/kv_cache.h"
#include "attn/nn.h"
#include "attn/ops.h"
#include "attn/random.h"

namespace {

using namespace attn;
using namespace attn::nn;

constexpr int64_t kDModel = 768, kHeads = 12, kContext = 1024;
constexpr float kCheckTolerance = 1e-5f;

struct Setup {
  std::unique_ptr<MultiHeadAttention> mha;
  Tensor x;  // (1, T, d_in)
  KVCache cache;
};

// A module, T tokens, and a cache holding the first T - 1 of them.
Setup make_setup(int64_t T) {
  manual_seed(123);
  Setup s{std::make_unique<MultiHeadAttention>(MultiHeadAttentionOptions{
              .d_in = kDModel, .d_out = kDModel, .context_length = kContext, .num_heads = kHeads}),
          randn({1, T, kDModel}),
          {}};
  s.mha->eval();
  s.cache = make_kv_cache(*s.mha, 1);
  if (T > 1) forward_cached(*s.mha, slice(s.x, 1, 0, T - 1), s.cache);
  return s;
}

// The next token's output through the cache equals forward()'s last row.
bool check(Setup& s, int64_t T) {
  KVCache cache = s.cache;
  const Tensor y_cached = forward_cached(*s.mha, slice(s.x, 1, T - 1, T), cache);  // (1, 1, d_out)
  const Tensor y_full = s.mha->forward(s.x);                                       // (1, T, d_out)
  return max_abs_diff(y_cached, slice(y_full, 1, T - 1, T)) <= kCheckTolerance;
}

double cached_flops(int64_t T) {
  const double d = static_cast<double>(kDModel);
  return 8.0 * d * d + 4.0 * static_cast<double>(T) * d;
}
double recompute_flops(int64_t T) {
  const double d = static_cast<double>(kDModel), t = static_cast<double>(T);
  return t * 8.0 * d * d + 4.0 * t * t * d;
}

void BM_NextTokenCached(benchmark::State& state) {
  const int64_t T = state.range(0);
  Setup s = make_setup(T);
  if (!check(s, T)) {
    state.SkipWithError("cached output differs from forward()");
    return;
  }
  const Tensor x_next = slice(s.x, 1, T - 1, T);  // (1, 1, d_in)
  for (auto _ : state) {
    s.cache.length = T - 1;  // drop the token the previous iteration appended
    benchmark::DoNotOptimize(forward_cached(*s.mha, x_next, s.cache));
  }
  state.counters["GFLOP/s"] =
      benchmark::Counter(cached_flops(T) * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}

void BM_NextTokenRecompute(benchmark::State& state) {
  const int64_t T = state.range(0);
  Setup s = make_setup(T);
  if (!check(s, T)) {
    state.SkipWithError("cached output differs from forward()");
    return;
  }
  for (auto _ : state) benchmark::DoNotOptimize(s.mha->forward(s.x));
  state.counters["GFLOP/s"] =
      benchmark::Counter(recompute_flops(T) * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}

double minimum(const std::vector<double>& v) { return *std::min_element(v.begin(), v.end()); }

BENCHMARK(BM_NextTokenCached)
    ->Arg(64)
    ->Arg(256)
    ->Arg(1024)
    ->Unit(benchmark::kMicrosecond)
    ->ComputeStatistics("min", minimum);
BENCHMARK(BM_NextTokenRecompute)
    ->Arg(64)
    ->Arg(256)
    ->Arg(1024)
    ->Unit(benchmark::kMillisecond)
    ->ComputeStatistics("min", minimum);

}  // namespace

BENCHMARK_MAIN();
