// bench_decode.h - `attn bench --kind decode`: one decoding step's attention,
// kernels::decode_attention_forward[_bf16] (attn/decode_attention.h), over a
// full cache of each length: time per step, the key/value bytes it reads, GB/s,
// and GB/s over the read bandwidth (kernels::read_bandwidth_gbs over twice the
// last-level cache, the same threads) measured in the run. bench.cpp parses the
// flags and hands them over here.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "attn/decode_attention.h"

namespace attn::cli {

struct DecodeBenchOptions {
  std::vector<int64_t> caches;  // cache lengths (keys per sequence)
  std::vector<std::string> dtypes;  // "float32", "bfloat16"
  int64_t batch = 1, heads = 12, kv_heads = 12, head_dim = 64, queries = 1;
  int64_t window_left = -1;  // the kernels' (--sliding-window-size W gives W - 1; -1: none)
  int repeats = 20;
  // The probe's buffer, MiB, and the least the copies of the caches cycled
  // through span; 0: twice the last-level cache, 256 MiB at least.
  int64_t bandwidth_mib = 0;
  bool json = false;
};
struct DecodeBenchResult {
  double ms_median = 0, ms_min = 0;
  int64_t kv_bytes = 0;  // per step
  double gbs = 0;        // kv_bytes / median
  int64_t copies = 1;    // caches cycled through so that each step reads from memory
};
// footprint: bytes the copies of the caches that the steps cycle through span.
DecodeBenchResult run_decode_case(const DecodeProblem& p, bool bf16, int repeats,
                                  int64_t footprint);
// "4096" or "4k" (x1024); throws UsageError otherwise.
int64_t parse_cache_length(const std::string& text);
// Prints the table (or JSON rows); returns the exit code.
int run_decode_bench(const DecodeBenchOptions& options);

}  // namespace attn::cli
