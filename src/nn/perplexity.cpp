// Sliding-window perplexity (attn/generate.h), as transformers' perplexity
// guide computes it for GPT-2.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "attn/generate.h"

namespace attn::nn {

PerplexityResult sliding_window_perplexity(GPTModel& model, const std::vector<int64_t>& ids,
                                           int64_t context, int64_t stride) {
  const bool was_training = model.is_training();
  model.eval();
  const PerplexityResult r = sliding_window_perplexity(
      [&](const Tensor& window) { return model.forward(window); }, model.config().vocab_size,
      model.config().context_length, ids, context, stride);
  if (was_training) model.train();
  return r;
}

PerplexityResult sliding_window_perplexity(const std::function<Tensor(const Tensor&)>& logits_of,
                                           int64_t vocab_size, int64_t context_length,
                                           const std::vector<int64_t>& ids, int64_t context,
                                           int64_t stride) {
  const auto n = static_cast<int64_t>(ids.size());
  const struct { int64_t vocab_size, context_length; } cfg{vocab_size, context_length};
  if (n < 2) {
    throw std::invalid_argument(
        fmt::format("perplexity: needs at least 2 tokens, got {}", n));
  }
  if (context < 2 || context > cfg.context_length) {
    throw std::invalid_argument(fmt::format(
        "perplexity: context must be in 2..{} (the model's context_length), got {}",
        cfg.context_length, context));
  }
  if (stride < 1 || stride > context) {
    throw std::invalid_argument(
        fmt::format("perplexity: stride must be in 1..{} (the context), got {}", context, stride));
  }
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || ids[i] >= cfg.vocab_size) {
      throw std::invalid_argument(fmt::format(
          "perplexity: token {} (position {}) is out of range for vocab_size {}", ids[i], i,
          cfg.vocab_size));
    }
  }
  const int64_t V = cfg.vocab_size;
  double nll_sum = 0.0;
  int64_t scored = 0, prev_end = 0;
  for (int64_t begin = 0; begin < n; begin += stride) {
    const int64_t end = std::min(begin + context, n);
    const std::vector<int64_t> window(ids.begin() + begin, ids.begin() + end);
    const Tensor logits =
        logits_of(Tensor::from_int64({1, end - begin}, window)).contiguous();  // (1, T, V)
    const float* l = logits.data();
    // Targets: positions j in [max(begin + 1, prev_end), end), predicted by row j - 1 - begin.
    for (int64_t j = std::max(begin + 1, prev_end); j < end; ++j) {
      const float* row = l + (j - 1 - begin) * V;
      const float m = *std::max_element(row, row + V);
      double sum = 0.0;
      for (int64_t v = 0; v < V; ++v) sum += std::exp(static_cast<double>(row[v] - m));
      nll_sum += static_cast<double>(m) + std::log(sum) - static_cast<double>(row[ids[j]]);
      ++scored;
    }
    prev_end = end;
    if (end == n) break;
  }
  const double mean = nll_sum / static_cast<double>(scored);
  return {scored, mean, std::exp(mean)};
}

}  // namespace attn::nn
