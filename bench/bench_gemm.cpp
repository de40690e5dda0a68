// The two GEMM engines of attn/gemm.h side by side: the BLAS (OpenBLAS) and
// the fast engine (oneDNN's sgemm when built with it), and gemm_bf16 (bf16
// operands, fp32 result; engine 2), on the products one
// training step of the Shakespeare GPTs makes (docs/performance.md, "Matrix
// products"), and on a square 2048³.
//
//   ./build/bench/bench_gemm --benchmark_min_time=0.5
//   OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 ./build/bench/bench_gemm
//
// Shapes (M, N, K, transposes) as the Linear layers call them, rows = B·T tokens:
//   forward    y (rows, out)  = x (rows, in) · Wᵀ            NT
//   dweight    dW (out, in)  += dyᵀ (out, rows) · x          TN
//   dx         dx (rows, in)  = dy (rows, out) · W           NN
// small: rows 768 (batch 12 × 64), E 128, FF 512; large: rows 16384 (64 × 256), E 384, FF 1536;
// the head: vocabulary 65 (tinyshakespeare's characters).
// Counter: GFLOP/s (2·M·N·K per product).
#include <benchmark/benchmark.h>

#include <cstdint>
#include <vector>

#include "attn/gemm.h"
#include "attn/random.h"
#include "attn/tensor.h"

namespace {

using attn::gemm::Engine;
using attn::gemm::Trans;

// engine 0: Engine::kBlas, 1: Engine::kFast, 2: gemm_bf16 (bf16 A, B; fp32 C).
void BM_Sgemm(benchmark::State& state) {
  const bool bf16 = state.range(0) == 2;
  const auto engine = bf16 ? Engine::kFast : static_cast<Engine>(state.range(0));
  const int64_t M = state.range(1), N = state.range(2), K = state.range(3);
  const auto ta = static_cast<Trans>(state.range(4)), tb = static_cast<Trans>(state.range(5));
  attn::Generator gen(1);
  const attn::Tensor A = attn::randn({M * K}, gen), B = attn::randn({K * N}, gen);
  // The bf16 operands: A and B rounded (what gemm_bf16 reads).
  const attn::Tensor A16 = A.to(attn::DType::kBFloat16), B16 = B.to(attn::DType::kBFloat16);
  std::vector<float> C(static_cast<size_t>(M * N));
  const int64_t lda = ta == Trans::kNo ? K : M, ldb = tb == Trans::kNo ? N : K;
  for (auto _ : state) {
    if (bf16) {
      attn::gemm::gemm_bf16(ta, tb, M, N, K, 1.0f, A16.data_ptr<attn::BFloat16>(), lda,
                            B16.data_ptr<attn::BFloat16>(), ldb, 0.0f, C.data(), N);
    } else {
      attn::gemm::sgemm(ta, tb, M, N, K, 1.0f, A.data(), lda, B.data(), ldb, 0.0f, C.data(), N,
                        engine);
    }
    benchmark::DoNotOptimize(C.data());
  }
  state.counters["GFLOP/s"] = benchmark::Counter(2.0 * double(M) * double(N) * double(K),
                                                 benchmark::Counter::kIsIterationInvariantRate,
                                                 benchmark::Counter::kIs1000);
  state.SetLabel(bf16                      ? attn::gemm::gemm_bf16_name()
                 : engine == Engine::kBlas ? attn::gemm::blas_name()
                                           : attn::gemm::fast_gemm_name());
}

constexpr int64_t kNo = static_cast<int64_t>(Trans::kNo), kYes = static_cast<int64_t>(Trans::kYes);

void Shapes(benchmark::internal::Benchmark* b) {
  b->ArgNames({"engine", "M", "N", "K", "ta", "tb"});
  const std::vector<std::vector<int64_t>> shapes = {// small recipe: rows 768, E 128, FF 512
                                                    {768, 128, 128, kNo, kYes},
                                                    {768, 512, 128, kNo, kYes},
                                                    {768, 128, 512, kNo, kYes},
                                                    {128, 128, 768, kYes, kNo},
                                                    {512, 128, 768, kYes, kNo},
                                                    {768, 128, 128, kNo, kNo},
                                                    // large recipe: rows 16384, E 384, FF 1536
                                                    {16384, 384, 384, kNo, kYes},
                                                    {16384, 1536, 384, kNo, kYes},
                                                    {16384, 384, 1536, kNo, kYes},
                                                    {384, 384, 16384, kYes, kNo},
                                                    {1536, 384, 16384, kYes, kNo},
                                                    {16384, 384, 384, kNo, kNo},
                                                    {16384, 384, 1536, kNo, kNo},
                                                    // the output head: vocabulary 65
                                                    {16384, 65, 384, kNo, kYes},
                                                    {65, 384, 16384, kYes, kNo},
                                                    {16384, 384, 65, kNo, kNo},
                                                    {2048, 2048, 2048, kNo, kNo},
                                                    // GPT-2 small (E 768), x · Wᵀ: QKV of 256
                                                    // tokens, fc and proj of 1024, and the
                                                    // product the fast engine is chosen on
                                                    {256, 2304, 768, kNo, kYes},
                                                    {1024, 3072, 768, kNo, kYes},
                                                    {1024, 768, 3072, kNo, kYes},
                                                    {512, 2304, 768, kNo, kNo}};
  for (const auto& s : shapes) {
    for (const int64_t engine : {0, 1, 2}) b->Args({engine, s[0], s[1], s[2], s[3], s[4]});
  }
}

BENCHMARK(BM_Sgemm)->Apply(Shapes)->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
