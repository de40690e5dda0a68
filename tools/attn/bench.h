// bench.h - `attn bench`: times the fused attention core and the whole
// MultiHeadAttention module, forward and forward+backward, on GPT-2-like
// shapes, beside the machine's sgemm rate measured in the same run.
//
// What is timed (one repeat):
//   core    kernels::flash_attention_forward [+ flash_attention_backward] on
//           packed q, k, v (B, T, H, hd), causal
//   module  nn::MultiHeadAttention(d, d, T, 0.0, H).forward(x) [+ backward(dy)]
//           (training mode, p = 0: the fused path unless --backend says otherwise)
// Useful FLOPs (causal):
//   core forward      4·B·H·T²·hd / 2             (Q Kᵀ and P V, only j <= i)
//   core backward     2.5 × core forward          (five T×T×hd products instead of two)
//   projections       2·B·T·d_in·d_out per linear (4 linears: q, k, v, out_proj)
//   module forward    projections + core forward
//   module fwd+bwd    3 × projections + 3.5 × core forward
// GFLOP/s = useful FLOPs / median time; % sgemm = that rate over the rate of
// one sgemm of n³ (attn/gemm.h) (n = 4096, --quick 2048) timed at the start of the run;
// % peak = that rate over the CPU's fp32 multiply-add peak on the kernel's SIMD
// target (kernels::fma_peak_gflops), timed at the start too: no fp32 code
// here can exceed it, and sgemm itself reaches 85-95% of it.
// The module alternates OpenBLAS's threads (projections) and OpenMP's (the
// kernel); on a machine with few cores, idle OpenMP threads that spin slow
// the next sgemm down, so the header prints GOMP_SPINCOUNT / OMP_WAIT_POLICY
// (GOMP_SPINCOUNT=0 is usually faster for the module there).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "command.h"

namespace attn::cli {

struct BenchCase {
  std::string kind = "core";  // or "module"
  std::string mode = "fwd";   // or "fwdbwd"
  int64_t B = 1, T = 1, d_model = 768, heads = 12;
};

struct BenchResult {
  BenchCase c;
  std::string backend;  // the path the module took ("fused", "reference"); "fused" for core
  double ms_median = 0, ms_min = 0;
  double flops = 0;       // useful FLOPs of one repeat
  double gflops = 0;      // flops / median
  double pct_sgemm = -1;  // < 0 when sgemm was not measured
  double pct_peak = -1;   // < 0 when the FMA peak was not measured
};

// Parses "BxTxDxH" (e.g. "1x1024x768x12"); throws UsageError naming the text.
BenchCase parse_bench_shape(const std::string& text);

// Runs one case: warm-up repeats for at least 250 ms (the first one's outputs
// checked to be finite, std::runtime_error otherwise), then `repeats` timed
// repeats.
BenchResult run_bench_case(const BenchCase& c, int repeats, const std::string& backend);

// Registers the `bench` subcommand on the app.
Command add_bench_command(CLI::App& app);

}  // namespace attn::cli
