// bench.h - `attn bench`: times the fused attention core and the whole
// MultiHeadAttention module, forward and forward+backward, on GPT-2-like
// shapes, beside the machine's sgemm rate measured in the same run.
//
// What is timed (one repeat):
//   core    kernels::flash_attention_forward [+ flash_attention_backward] on
//           packed q, k, v (B, T, H, hd), causal
//   module  nn::MultiHeadAttention(d, d, T, 0.0, H).forward(x) [+ backward(dy)]
//           (training mode, p = 0: the fused path unless --backend says otherwise)
//   sdpa    scaled_dot_product_attention_forward [+ _backward] (attn/sdpa.h) on the
//           core's values viewed as (B, H, T, hd), is_causal; float32 or bfloat16; the fused
//           kernel, or the plain reference with --backend reference (only with
//           --kind sdpa: --kind all is core and module); --sliding-window-size W
//           adds a sliding window (keys i - W + 1 .. i) to the sdpa rows;
//           --alibi and --softcap CAP their score modifiers; --mask bool|float
//           passes the causal pattern as a dense (Tq, Tk) mask instead;
//           --no-causal attends to every key; --kv-heads G shares each key/value
//           head among H / G query heads (enable_gqa); --query-tokens Tq makes
//           Tq queries against the T keys (top-left causal alignment);
//           --dtype bfloat16: bf16 q, k, v, dout (the bf16 path's engine)
//   sdpa-varlen  sdpa_varlen_forward [+ _backward] (attn/sdpa.h): one packed
//           (total, H, hd) batch of the --seqlens lengths (default: the shape's
//           B sequences of T), is_causal, --sliding-window-size, --alibi and --softcap too; float32
//           or bfloat16; its shape column reads NsTOTALxDxH (N sequences, TOTAL tokens)
//   decode  one decoding step's attention over KV caches (--kind decode, alone):
//           bench_decode.h
// Useful FLOPs (causal):
//   core forward      4·B·H·T²·hd / 2             (Q Kᵀ and P V, only j <= i; sdpa:
//                     4·B·H·hd·(query-key pairs it may attend), e.g. with a window W
//                     4·B·H·hd·Σ_i min(i + 1, W); a dense mask counts as is_causal;
//                     sdpa-varlen: the sum over its sequences)
//   core backward     2.5 × core forward          (five T×T×hd products instead of two)
//   projections       2·B·T·d_in·d_out per linear (4 linears: q, k, v, out_proj)
//   module forward    projections + core forward
//   module fwd+bwd    3 × projections + 3.5 × core forward
// GFLOP/s = useful FLOPs / median time. Two yardsticks, measured at the start
// of the run (always for the table; with --json only when --sgemm is given,
// otherwise pct_sgemm and pct_peak are null):
//   % sgemm  that rate over the median rate of one sgemm of n³ (gemm::sgemm, attn/gemm.h) (n =
//   4096,
//            --quick 2048, or --sgemm-n; median of 5 timings, --quick 3)
//   % peak   that rate over the CPU's fp32 multiply-add peak on the kernel's
//            SIMD target (cpu::fma_peak_probe, median of 5; bf16 rows on
//            the AVX512-BF16 path: the VDPBF16PS peak, on the AMX path the AMX
//            peak): no code here can exceed it, and a row above 100% is
//            reported as a wrong probe. sgemm does not reach it either: the
//            header prints sgemm's own share of the peak, measured in the same
//            run (80% on the machine of docs/performance.md).
// The header (bench_machine.h) also names the CPU, the SIMD target, the core
// clock, each peak in FLOP/cycle/core with its plausibility, and every path
// chosen (docs/gemm.md); --target and --bf16-path (or ATTN_SIMD_TARGET,
// ATTN_BF16_PATH) force one.
// Threads (--threads n sets both OpenMP's and OpenBLAS's count): the core and
// the fused module run on OpenMP's threads only: the flash kernel, and the
// module's four projections too, each thread calling a single-threaded sgemm
// on its own block of rows (src/kernels/fused.cpp). The sgemm
// yardstick and the reference path (--backend reference) use OpenBLAS's own
// threads. Those spin for a while after a call (and right after start-up), so
// the run sleeps 500 ms after the yardsticks and warms each case up for at
// least 250 ms before timing it. The header prints GOMP_SPINCOUNT and
// OMP_WAIT_POLICY, which decide whether idle OpenMP threads spin between the
// kernel's parallel regions.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "command.h"

namespace attn::cli {

struct BenchCase {
  std::string kind = "core";      // or "module", "sdpa"
  std::string mode = "fwd";       // or "fwdbwd"
  std::string dtype = "float32";  // or "bfloat16" (core, sdpa, sdpa-varlen)
  int64_t B = 1, T = 1, d_model = 768, heads = 12;
  // sdpa and sdpa-varlen: a sliding window, the kernels' window_left (-1: none;
  // --sliding-window-size W gives W - 1)
  int64_t window_left = -1;
  // sdpa only, the cases of docs/performance.md's "SDPA against PyTorch 2.x SDPA":
  std::string mask = "none";  // "bool" or "float": the causal pattern as a dense (Tq, Tk) mask
                              // instead of is_causal (the kernel skips the tiles it hides)
  bool causal = true;         // is_causal (off: every key; cross-attention)
  int64_t kv_heads = 0;       // 0: heads; else grouped-query attention with this many kv heads
  int64_t query_tokens = 0;   // 0: T; else Tq (keys stay T): cross-attention, a KV cache's prefill
  bool alibi = false;         // sdpa and sdpa-varlen: ALiBi slopes 2^(-8(h+1)/H) on the scores
  float softcap = 0.0f;       // sdpa and sdpa-varlen: a softcap on the scores (0: none)
  // sdpa-varlen only: the packed sequences' lengths (empty: B sequences of T tokens).
  std::vector<int64_t> seqlens = {};
};

struct BenchResult {
  BenchCase c;
  std::string backend;  // the path the module took ("fused", "reference"); "fused" for core
  // sdpa rows: the bf16 path this call takes (kernels::sdpa_bf16_path(q, k, v, options);
  // fp32 rows: the summary kernels::sdpa_bf16_path()); empty for the other kinds.
  std::string bf16_path;
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
