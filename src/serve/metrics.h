// metrics.h - the server's counters, gauges and histograms, written in
// Prometheus' text format (version 0.0.4) for GET /metrics.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

namespace attn::serve {

// A Prometheus histogram: cumulative counts of observations <= each bound.
class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds);
  void observe(double value);
  // The histogram's lines (_bucket{le=...}, _sum, _count) under `name`.
  std::string text(const std::string& name) const;

 private:
  std::vector<double> bounds_;
  mutable std::mutex mu_;
  std::vector<uint64_t> counts_;  // per bound, then +Inf
  double sum_ = 0.0;
  uint64_t count_ = 0;
};

struct Metrics {
  Metrics();
  std::atomic<uint64_t> requests_total{0};  // generation requests finished
  std::atomic<uint64_t> prompt_tokens_total{0};
  std::atomic<uint64_t> generated_tokens_total{0};
  std::atomic<int64_t> slots_busy{0};
  std::atomic<int64_t> requests_waiting{0};
  std::atomic<int64_t> kv_blocks_free{0};
  std::atomic<int64_t> kv_blocks_cached{0};  // prefix caching's blocks
  std::atomic<uint64_t> prefix_cache_hit_tokens_total{0};
  int64_t kv_blocks_total = 0;
  Histogram time_to_first_token;    // seconds
  Histogram time_per_output_token;  // seconds, per request: (last - first) / (n - 1)
  // HTTP responses by status code.
  void count_response(int status);
  std::string text() const;

 private:
  mutable std::mutex mu_;
  std::map<int, uint64_t> responses_;
};

}  // namespace attn::serve
