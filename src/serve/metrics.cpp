// metrics.cpp - Metrics and Histogram (metrics.h).
#include "metrics.h"

#include <fmt/format.h>

#include <algorithm>

namespace attn::serve {

Histogram::Histogram(std::vector<double> bounds)
    : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {}

void Histogram::observe(double value) {
  const size_t i = static_cast<size_t>(std::lower_bound(bounds_.begin(), bounds_.end(), value) -
                                       bounds_.begin());
  std::lock_guard<std::mutex> lock(mu_);
  ++counts_[i];
  sum_ += value;
  ++count_;
}

std::string Histogram::text(const std::string& name) const {
  std::lock_guard<std::mutex> lock(mu_);
  std::string out;
  uint64_t cumulative = 0;
  for (size_t i = 0; i < bounds_.size(); ++i) {
    cumulative += counts_[i];
    out += fmt::format("{}_bucket{{le=\"{}\"}} {}\n", name, bounds_[i], cumulative);
  }
  cumulative += counts_.back();
  out += fmt::format("{}_bucket{{le=\"+Inf\"}} {}\n{}_sum {}\n{}_count {}\n", name, cumulative,
                     name, sum_, name, count_);
  return out;
}

Metrics::Metrics()
    : time_to_first_token({0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30}),
      time_per_output_token({0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1}) {}

void Metrics::count_response(int status) {
  std::lock_guard<std::mutex> lock(mu_);
  ++responses_[status];
}

std::string Metrics::text() const {
  std::string out;
  const auto counter = [&](const char* name, const char* help, uint64_t v) {
    out += fmt::format("# HELP {} {}\n# TYPE {} counter\n{} {}\n", name, help, name, name, v);
  };
  const auto gauge = [&](const char* name, const char* help, int64_t v) {
    out += fmt::format("# HELP {} {}\n# TYPE {} gauge\n{} {}\n", name, help, name, name, v);
  };
  counter("attn_requests_total", "Generation requests finished (completions and chat).",
          requests_total.load());
  counter("attn_prompt_tokens_total", "Prompt tokens processed.", prompt_tokens_total.load());
  counter("attn_generated_tokens_total", "Tokens generated.", generated_tokens_total.load());
  gauge("attn_slots_busy", "Requests being decoded now.", slots_busy.load());
  gauge("attn_requests_waiting", "Requests queued for a slot.", requests_waiting.load());
  gauge("attn_kv_cache_blocks_free", "Free blocks of the paged key/value cache.",
        kv_blocks_free.load());
  gauge("attn_kv_cache_blocks_total", "Blocks of the paged key/value cache.", kv_blocks_total);
  gauge("attn_kv_cache_blocks_cached",
        "Blocks of finished prompts kept for prefix caching (freed when room is needed).",
        kv_blocks_cached.load());
  counter("attn_prefix_cache_hit_tokens_total",
          "Prompt tokens read from the prefix cache instead of computed.",
          prefix_cache_hit_tokens_total.load());
  out +=
      "# HELP attn_time_to_first_token_seconds From queueing to the first generated token.\n"
      "# TYPE attn_time_to_first_token_seconds histogram\n";
  out += time_to_first_token.text("attn_time_to_first_token_seconds");
  out +=
      "# HELP attn_time_per_output_token_seconds A request's mean time between its tokens.\n"
      "# TYPE attn_time_per_output_token_seconds histogram\n";
  out += time_per_output_token.text("attn_time_per_output_token_seconds");
  out +=
      "# HELP attn_http_responses_total HTTP responses by status code.\n"
      "# TYPE attn_http_responses_total counter\n";
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& [status, n] : responses_)
    out += fmt::format("attn_http_responses_total{{code=\"{}\"}} {}\n", status, n);
  return out;
}

}  // namespace attn::serve
