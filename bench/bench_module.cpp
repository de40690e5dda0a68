// Benchmarks of the whole MultiHeadAttention module (attn/nn.h), forward and
// forward+backward, on the fused path (kAuto at p = 0) and on the reference
// path, beside OpenBLAS sgemm measured in the same run.
//
//   ./build/bench/bench_module --benchmark_min_time=1
//   ./build/bench/bench_module --benchmark_filter=fused
//
// Useful causal FLOPs (attn/fused.h):
//   projections     2 · B · T · d_in · d_out per linear (q, k, v, out_proj)
//   core forward    4 · B · H · T² · hd / 2;  core backward 2.5 × core forward
//   forward         projections + core forward
//   forward+backward 3 × projections + 3.5 × core forward
// Counters: GFLOP/s, pct_of_sgemm = that rate over the sgemm 4096³ rate and
// pct_of_peak = that rate over the fp32 FMA peak, both measured at start-up
// (bench/yardsticks.h).
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "attn/fused.h"
#include "attn/kernels.h"
#include "attn/nn.h"
#include "attn/random.h"
#include "yardsticks.h"

namespace {

using attn::Generator;
using attn::Tensor;
namespace nn = attn::nn;

struct Problem {
  std::unique_ptr<nn::MultiHeadAttention> m;
  Tensor x, dy;
  Problem(const benchmark::State& state, nn::AttentionBackend backend) {
    const int64_t B = state.range(0), T = state.range(1), d = state.range(2), H = state.range(3);
    Generator gen(0);
    m = std::make_unique<nn::MultiHeadAttention>(
        nn::MultiHeadAttentionOptions{
            .d_in = d, .d_out = d, .context_length = T, .num_heads = H, .backend = backend},
        gen);
    x = attn::randn({B, T, d}, gen);
    dy = attn::randn({B, T, d}, gen);
  }
};

double flops(const benchmark::State& state, bool backward) {
  const int64_t B = state.range(0), T = state.range(1), d = state.range(2);
  const double f = attn::fused::attention_block_forward_flops(B, T, d, d, true, true);
  return backward ? f + attn::fused::attention_block_backward_flops(B, T, d, d, true, true) : f;
}

void BM_ModuleForward(benchmark::State& state, nn::AttentionBackend backend) {
  Problem pr(state, backend);
  if (attn::has_non_finite(pr.m->forward(pr.x))) state.SkipWithError("non-finite output");
  for (auto _ : state) {
    Tensor y = pr.m->forward(pr.x);
    benchmark::DoNotOptimize(y.data());
  }
  attn::bench::add_rate_counters(state, flops(state, false));
}

void BM_ModuleForwardBackward(benchmark::State& state, nn::AttentionBackend backend) {
  Problem pr(state, backend);
  pr.m->forward(pr.x);
  if (attn::has_non_finite(pr.m->backward(pr.dy))) state.SkipWithError("non-finite gradient");
  for (auto _ : state) {
    Tensor y = pr.m->forward(pr.x);
    Tensor dx = pr.m->backward(pr.dy);
    benchmark::DoNotOptimize(dx.data());
  }
  attn::bench::add_rate_counters(state, flops(state, true));
}

// (B, T, d, H): the shapes, causal, plus head_dim 128.
void module_args(benchmark::internal::Benchmark* b) {
  b->ArgNames({"B", "T", "d", "H"});
  for (int64_t T : {256, 1024, 4096}) b->Args({1, T, 768, 12});
  b->Args({8, 1024, 768, 12});
  b->Args({1, 1024, 768, 6});
  b->Args({1, 4096, 768, 6});
  b->Unit(benchmark::kMillisecond)->UseRealTime();
}
// The reference path materialises (B, H, T, T): only the smaller shapes.
void reference_args(benchmark::internal::Benchmark* b) {
  b->ArgNames({"B", "T", "d", "H"});
  b->Args({1, 256, 768, 12});
  b->Args({1, 1024, 768, 12});
  b->Unit(benchmark::kMillisecond)->UseRealTime();
}

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  std::printf("flash attention SIMD target: %s\n", attn::kernels::flash_attention_target());
  attn::bench::measure_yardsticks();
  using enum nn::AttentionBackend;
  const auto stats = [](benchmark::internal::Benchmark* b) {
    b->Repetitions(5)->ReportAggregatesOnly(true);
    b->ComputeStatistics(
        "min", [](const std::vector<double>& v) { return *std::min_element(v.begin(), v.end()); });
  };
  stats(benchmark::RegisterBenchmark("module_forward/fused", BM_ModuleForward, kAuto)
            ->Apply(module_args));
  stats(
      benchmark::RegisterBenchmark("module_forward_backward/fused", BM_ModuleForwardBackward, kAuto)
          ->Apply(module_args));
  stats(benchmark::RegisterBenchmark("module_forward/reference", BM_ModuleForward, kReference)
            ->Apply(reference_args));
  stats(benchmark::RegisterBenchmark("module_forward_backward/reference", BM_ModuleForwardBackward,
                                     kReference)
            ->Apply(reference_args));
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
