// The training data (attn/train.h): Batcher's random windows, the book's
// WindowLoader, and the 90/10 split.
#include <fmt/format.h>

#include <algorithm>
#include <memory>
#include <stdexcept>
#include <utility>

#include "attn/random.h"
#include "attn/token_shards.h"
#include "attn/train.h"

namespace attn::train {

// ---- Batcher -------------------------------------------------------------------------------

Batcher::Batcher(std::vector<int64_t> data, int64_t batch_size, int64_t context_length)
    : data_(std::move(data)), batch_size_(batch_size), context_length_(context_length) {
  if (batch_size < 1 || context_length < 1)
    throw std::invalid_argument(fmt::format(
        "Batcher: batch_size {} and context_length {} must be >= 1", batch_size, context_length));
  if (static_cast<int64_t>(data_.size()) < context_length + 1)
    throw std::invalid_argument(
        fmt::format("Batcher: {} tokens, need at least context_length + 1 = {}", data_.size(),
                    context_length + 1));
}

std::pair<Tensor, Tensor> Batcher::next(Generator& gen) const {
  const auto B = static_cast<size_t>(batch_size_), T = static_cast<size_t>(context_length_);
  const uint64_t range = data_.size() - T;  // offsets [0, n - T)
  std::vector<int64_t> x(B * T), y(B * T);  // (B, T) each
  for (size_t b = 0; b < B; ++b) {
    // torch.randint(high) for high < 2^32: one 32-bit draw modulo the range.
    const uint64_t i = range < (uint64_t{1} << 32) ? gen.random() % range : gen.random64() % range;
    std::copy_n(data_.begin() + static_cast<std::ptrdiff_t>(i), T,
                x.begin() + static_cast<std::ptrdiff_t>(b * T));
    std::copy_n(data_.begin() + static_cast<std::ptrdiff_t>(i + 1), T,
                y.begin() + static_cast<std::ptrdiff_t>(b * T));
  }
  const Shape shape{batch_size_, context_length_};
  return {Tensor::from_int64(shape, x), Tensor::from_int64(shape, y)};
}

// ---- WindowLoader --------------------------------------------------------------------------

WindowLoader::WindowLoader(std::vector<int64_t> ids, int64_t batch_size, int64_t max_length,
                           int64_t stride, bool shuffle, bool drop_last, std::string name)
    : WindowLoader(std::make_shared<const data::TokenVector>(std::move(ids)), batch_size,
                   max_length, stride, shuffle, drop_last, std::move(name)) {}

WindowLoader::WindowLoader(std::shared_ptr<const data::TokenSource> tokens, int64_t batch_size,
                           int64_t max_length, int64_t stride, bool shuffle, bool drop_last,
                           std::string name)
    : tokens_(std::move(tokens)),
      batch_size_(batch_size),
      max_length_(max_length),
      stride_(stride),
      shuffle_(shuffle),
      drop_last_(drop_last),
      name_(std::move(name)) {
  if (batch_size < 1 || max_length < 1 || stride < 1)
    throw std::invalid_argument(
        fmt::format("{} loader: batch_size {}, max_length {} and stride {} must be >= 1", name_,
                    batch_size, max_length, stride));
  const int64_t n = tokens_->size();
  // range(0, n - max_length, stride)
  windows_ = n > max_length ? (n - max_length + stride - 1) / stride : 0;
  if (windows_ == 0)
    throw std::invalid_argument(
        fmt::format("{} loader: {} tokens hold no window of max_length {} (a window needs "
                    "max_length + 1 tokens)",
                    name_, n, max_length));
  if (drop_last_ && windows_ < batch_size_)
    throw std::invalid_argument(fmt::format(
        "{} loader: {} windows of {} tokens every {} make no full batch of {} (drop_last)", name_,
        windows_, max_length, stride, batch_size_));
}

int64_t WindowLoader::batches() const {
  return drop_last_ ? windows_ / batch_size_ : (windows_ + batch_size_ - 1) / batch_size_;
}

void WindowLoader::set_order(int64_t seed) {
  seed_ = seed;
  if (shuffle_) {
    Generator sampler(static_cast<uint64_t>(seed));  // RandomSampler's own generator
    order_ = randperm(windows_, sampler);
  } else {
    order_.resize(static_cast<size_t>(windows_));
    for (int64_t k = 0; k < windows_; ++k) order_[static_cast<size_t>(k)] = k;
  }
}

void WindowLoader::start_pass(Generator& gen) {
  (void)random_int64(gen);  // the DataLoader iterator's base seed (unused with num_workers=0)
  set_order(shuffle_ ? random_int64(gen) : 0);
  position_ = 0;
  in_pass_ = batches() > 0;
}

void WindowLoader::restore_pass(int64_t seed, int64_t position) {
  if (position < 0 || position > batches())
    throw std::invalid_argument(fmt::format(
        "{} loader: position {} is outside the pass's {} batches", name_, position, batches()));
  set_order(seed);
  position_ = position;
  in_pass_ = position < batches();
}

std::pair<Tensor, Tensor> WindowLoader::next() {
  if (!in_pass_) throw std::logic_error(fmt::format("{} loader: next() outside a pass", name_));
  const int64_t first = position_ * batch_size_;
  const int64_t B = std::min(batch_size_, windows_ - first), T = max_length_;
  std::vector<int64_t> x(static_cast<size_t>(B * T)), y(static_cast<size_t>(B * T));  // (B, T) each
  std::vector<int64_t> window(static_cast<size_t>(T + 1));
  for (int64_t b = 0; b < B; ++b) {
    const int64_t start = order_[static_cast<size_t>(first + b)] * stride_;
    tokens_->read(start, T + 1, window.data());
    std::copy_n(window.begin(), T, x.begin() + static_cast<std::ptrdiff_t>(b * T));
    std::copy_n(window.begin() + 1, T, y.begin() + static_cast<std::ptrdiff_t>(b * T));
  }
  if (++position_ == batches()) in_pass_ = false;
  return {Tensor::from_int64({B, T}, x), Tensor::from_int64({B, T}, y)};
}

// ---- the 90/10 split -----------------------------------------------------------------------

Split split_90_10(const std::vector<int64_t>& tokens) {
  const auto n = static_cast<std::ptrdiff_t>(tokens.size() * 9 / 10);
  return Split{std::vector<int64_t>(tokens.begin(), tokens.begin() + n),
               std::vector<int64_t>(tokens.begin() + n, tokens.end())};
}

}  // namespace attn::train
