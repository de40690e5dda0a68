// engine.cpp - the scheduler loop of continuous batching (engine.h).
#include "engine.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "attn/fnv1a.h"
#include "attn/generate.h"

namespace attn::serve {

const char* finish_name(Finish f) {
  switch (f) {
    case Finish::kStop:
      return "stop";
    case Finish::kLength:
      return "length";
    case Finish::kCancelled:
      return "cancelled";
    case Finish::kError:
      return "error";
    case Finish::kNone:
      break;
  }
  return "none";
}

// ---- Sequence ------------------------------------------------------------------------------

Finish Sequence::wait(std::vector<TokenEvent>& out, std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait_for(lock, timeout, [&] { return !events_.empty() || finish_ != Finish::kNone; });
  while (!events_.empty()) {
    out.push_back(std::move(events_.front()));
    events_.pop_front();
  }
  return finish_;
}

std::string Sequence::error() const {
  std::lock_guard<std::mutex> lock(mu_);
  return error_;
}

void Sequence::push(TokenEvent e) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    events_.push_back(std::move(e));
  }
  cv_.notify_all();
}

void Sequence::finish(Finish f, std::string error) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (finish_ != Finish::kNone) return;
    finish_ = f;
    error_ = std::move(error);
  }
  cv_.notify_all();
}

// ---- Engine --------------------------------------------------------------------------------

namespace {

// log softmax of one row at `id`, and the `n` largest (ties by id).
TokenEvent token_event(const float* logits, int64_t V, int64_t id, int64_t n) {
  float m = -std::numeric_limits<float>::infinity();
  for (int64_t v = 0; v < V; ++v) m = std::max(m, logits[v]);
  double sum = 0.0;
  for (int64_t v = 0; v < V; ++v) sum += std::exp(static_cast<double>(logits[v] - m));
  const double lse = static_cast<double>(m) + std::log(sum);
  TokenEvent e;
  e.id = id;
  e.logprob = static_cast<float>(logits[id] - lse);
  if (n > 0) {
    std::vector<int64_t> order(static_cast<size_t>(V));
    for (int64_t v = 0; v < V; ++v) order[static_cast<size_t>(v)] = v;
    const int64_t k = std::min(n, V);
    std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](int64_t a, int64_t b) {
      return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
    });
    for (int64_t i = 0; i < k; ++i) {
      const int64_t v = order[static_cast<size_t>(i)];
      e.top.emplace_back(v, static_cast<float>(logits[v] - lse));
    }
  }
  return e;
}

}  // namespace

Engine::Engine(ServedModel& model, const EngineOptions& options, Metrics& metrics)
    : model_(model),
      options_(options),
      metrics_(metrics),
      cache_(model.make_cache(options.block_size, options.num_blocks)) {
  if (options.parallel < 1 || options.queue_size < 0 || options.step_tokens < options.parallel) {
    throw std::invalid_argument(fmt::format(
        "Engine: parallel must be >= 1, queue_size >= 0 and step_tokens >= parallel, got {}, {}, "
        "{}",
        options.parallel, options.queue_size, options.step_tokens));
  }
  metrics_.kv_blocks_total = cache_.num_blocks();
  metrics_.kv_blocks_free = cache_.free_blocks();
  metrics_.kv_blocks_cached = static_cast<int64_t>(prefix_.size());
  thread_ = std::thread([this] { loop(); });
}

Engine::~Engine() { stop(); }

int64_t Engine::max_fit_tokens() const { return cache_.num_blocks() * cache_.block_size(); }

std::shared_ptr<Sequence> Engine::submit(std::vector<int64_t> prompt,
                                         const SamplingParams& params) {
  auto seq = std::make_shared<Sequence>(std::move(prompt), params);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) throw std::runtime_error("the server is shutting down");
    // Free slots take requests at once; beyond them, queue_size may wait.
    if (static_cast<int64_t>(waiting_.size()) + running_ >=
        options_.parallel + options_.queue_size) {
      throw QueueFull(fmt::format("all {} slots are busy and {} requests wait; retry later",
                                  options_.parallel, waiting_.size()));
    }
    waiting_.emplace_back(seq, std::chrono::steady_clock::now());
    metrics_.requests_waiting = static_cast<int64_t>(waiting_.size());
  }
  cv_.notify_all();
  return seq;
}

void Engine::stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

std::vector<uint64_t> Engine::block_hashes(const std::vector<int64_t>& tokens, int64_t n) const {
  const int64_t bs = cache_.block_size();
  std::vector<uint64_t> hashes;
  uint64_t h = kFnv1a64Basis;
  for (int64_t i = 0; i < n; ++i) {
    h = fnv1a64(tokens.data() + i * bs, static_cast<size_t>(bs) * sizeof(int64_t), h);
    hashes.push_back(h);
  }
  return hashes;
}

Engine::PrefixHit Engine::cached_prefix(const std::vector<int64_t>& prompt) {
  const int64_t bs = cache_.block_size();
  // Up to the token before the last: the last one's logits must be computed.
  const int64_t usable = static_cast<int64_t>(prompt.size()) - 1;
  const int64_t n = usable / bs;
  PrefixHit hit;
  const std::vector<uint64_t> hashes = block_hashes(prompt, n);
  uint64_t parent = kFnv1a64Basis;
  for (int64_t i = 0; i < n; ++i) {
    const auto it = prefix_.find(hashes[static_cast<size_t>(i)]);
    if (it == prefix_.end() || static_cast<int64_t>(it->second.tokens.size()) != bs ||
        !std::equal(it->second.tokens.begin(), it->second.tokens.end(), prompt.begin() + i * bs)) {
      break;
    }
    lru_.splice(lru_.end(), lru_, it->second.lru);  // the most recently used now
    hit.blocks.push_back(it->second.block);
    parent = hashes[static_cast<size_t>(i)];
  }
  // The next stretch, [k·bs, min((k + 1)·bs, usable)): the child of the shared
  // prefix with the longest common beginning (a system prompt asked again, a
  // prompt that ends inside a block another prompt filled).
  const int64_t k = static_cast<int64_t>(hit.blocks.size());
  const int64_t want = std::min(bs, usable - k * bs);
  const auto [first, last] = children_.equal_range(parent);
  for (auto c = first; c != last && want > 0; ++c) {
    const CachedBlock& child = prefix_.at(c->second);
    const int64_t most = std::min(want, static_cast<int64_t>(child.tokens.size()));
    int64_t common = 0;
    while (common < most && child.tokens[static_cast<size_t>(common)] ==
                                prompt[static_cast<size_t>(k * bs + common)])
      ++common;
    if (common > hit.partial_tokens) {
      lru_.splice(lru_.end(), lru_, child.lru);
      hit.partial = child.block, hit.partial_tokens = common;
    }
  }
  return hit;
}

void Engine::remember_prompt(Active& a) {
  a.remembered = true;
  const int64_t bs = cache_.block_size();
  const std::vector<int64_t>& prompt = a.seq->prompt;
  // The blocks the prompt fills; generated tokens are written after them.
  const int64_t n = static_cast<int64_t>(prompt.size()) / bs;
  const std::vector<uint64_t> hashes = block_hashes(prompt, n);
  for (int64_t i = 0; i < n; ++i) {
    const uint64_t h = hashes[static_cast<size_t>(i)];
    const auto it = prefix_.find(h);
    if (it != prefix_.end()) {
      lru_.splice(lru_.end(), lru_, it->second.lru);
      continue;
    }
    const int32_t block = a.table.blocks[static_cast<size_t>(i)];
    const uint64_t parent = i == 0 ? kFnv1a64Basis : hashes[static_cast<size_t>(i - 1)];
    cache_.hold(block);
    lru_.push_back(h);
    prefix_.emplace(
        h, CachedBlock{block,
                       std::vector<int64_t>(prompt.begin() + i * bs, prompt.begin() + (i + 1) * bs),
                       std::prev(lru_.end()), parent});
    children_.emplace(parent, h);
  }
  // The prompt's last rows when it ends inside a block: a copy in a block of
  // the cache's own (the sequence goes on writing its own), keyed apart from
  // the full blocks (its hash counts its length too), when a block is free.
  const int64_t rows = static_cast<int64_t>(prompt.size()) - n * bs;
  if (rows == 0) return;
  const uint64_t parent = n == 0 ? kFnv1a64Basis : hashes[static_cast<size_t>(n - 1)];
  uint64_t h = fnv1a64(prompt.data() + n * bs, static_cast<size_t>(rows) * sizeof(int64_t), parent);
  h = fnv1a64(&rows, sizeof(rows), h);
  if (const auto it = prefix_.find(h); it != prefix_.end()) {
    lru_.splice(lru_.end(), lru_, it->second.lru);
    return;
  }
  nn::BlockTable own;
  if (!cache_.reserve(own, 1)) return;
  const int32_t block = own.blocks[0];
  cache_.copy_rows(a.table.blocks[static_cast<size_t>(n)], block, rows);
  lru_.push_back(h);
  prefix_.emplace(h, CachedBlock{block, std::vector<int64_t>(prompt.begin() + n * bs, prompt.end()),
                                 std::prev(lru_.end()), parent});
  children_.emplace(parent, h);
}

void Engine::forget(std::unordered_map<uint64_t, CachedBlock>::iterator entry) {
  const auto [first, last] = children_.equal_range(entry->second.parent);
  for (auto c = first; c != last; ++c) {
    if (c->second == entry->first) {
      children_.erase(c);
      break;
    }
  }
  cache_.drop(entry->second.block);
  prefix_.erase(entry);
}

bool Engine::evict_one() {
  for (auto it = lru_.begin(); it != lru_.end(); ++it) {
    const auto entry = prefix_.find(*it);
    if (cache_.holds(entry->second.block) != 1) continue;  // a sequence reads it
    forget(entry);
    lru_.erase(it);
    return true;
  }
  return false;
}

void Engine::clear_prefix_cache() {
  for (const auto& [h, c] : prefix_) cache_.drop(c.block);
  prefix_.clear();
  children_.clear();
  lru_.clear();
}

void Engine::finish(Active& a, Finish f, const std::string& error) {
  cache_.release(a.table);
  const auto now = std::chrono::steady_clock::now();
  if (a.generated > 1) {
    metrics_.time_per_output_token.observe(
        std::chrono::duration<double>(now - a.first_token).count() /
        static_cast<double>(a.generated - 1));
  }
  ++metrics_.requests_total;
  // The gauges before the client hears of the end: what it reads next counts it freed.
  metrics_.kv_blocks_free = cache_.free_blocks();
  metrics_.kv_blocks_cached = static_cast<int64_t>(prefix_.size());
  metrics_.slots_busy = std::count_if(active_.begin(), active_.end(),
                                      [](const Active& x) { return !x.table.blocks.empty(); });
  a.seq->finish(f, error);
}

void Engine::loop() {
  using Clock = std::chrono::steady_clock;
  for (;;) {
    // Admit what fits; leave when stopping.
    {
      std::unique_lock<std::mutex> lock(mu_);
      running_ = static_cast<int64_t>(active_.size());
      cv_.wait(lock, [&] { return stopping_ || !active_.empty() || !waiting_.empty(); });
      if (stopping_) {
        for (auto& [seq, t] : waiting_)
          seq->finish(Finish::kCancelled, "the server is shutting down");
        waiting_.clear();
        for (Active& a : active_) finish(a, Finish::kCancelled, "the server is shutting down");
        active_.clear();
        clear_prefix_cache();
        metrics_.requests_waiting = 0;
        metrics_.slots_busy = 0;
        metrics_.kv_blocks_free = cache_.free_blocks();
        metrics_.kv_blocks_cached = static_cast<int64_t>(prefix_.size());
        return;
      }
      while (!waiting_.empty() && static_cast<int64_t>(active_.size()) < options_.parallel) {
        auto& [seq, submitted] = waiting_.front();
        if (seq->cancelled()) {
          seq->finish(Finish::kCancelled);
          waiting_.pop_front();
          continue;
        }
        // Blocks for the whole request up front: a running sequence never waits for
        // memory. A cached prefix is shared, not computed again.
        const int64_t need = static_cast<int64_t>(seq->prompt.size()) + seq->params.max_tokens;
        Active a{.seq = seq, .gen = Generator(seq->params.seed), .submitted = submitted};
        PrefixHit hit;
        if (options_.prefix_caching) {
          hit = cached_prefix(seq->prompt);
          if (!hit.blocks.empty()) {
            const int64_t tokens = static_cast<int64_t>(hit.blocks.size()) * cache_.block_size();
            cache_.share(a.table, hit.blocks, tokens);
            a.fed = tokens;
          }
          // The partial block's source held while blocks are found (not evicted).
          if (hit.partial >= 0) cache_.hold(hit.partial);
        }
        bool room = cache_.reserve(a.table, need);
        while (!room && evict_one()) room = cache_.reserve(a.table, need);
        if (hit.partial >= 0) {
          if (room) {  // its first rows into the sequence's own next block
            const size_t next = static_cast<size_t>(hit.blocks.size());
            cache_.copy_rows(hit.partial, a.table.blocks[next], hit.partial_tokens);
            a.fed += hit.partial_tokens;
            a.table.length = a.fed;
          }
          cache_.drop(hit.partial);
        }
        if (!room) {  // wait for blocks to be freed
          cache_.release(a.table);
          break;
        }
        metrics_.prefix_cache_hit_tokens_total += static_cast<uint64_t>(a.fed);
        active_.push_back(std::move(a));
        waiting_.pop_front();
      }
      metrics_.requests_waiting = static_cast<int64_t>(waiting_.size());
      running_ = static_cast<int64_t>(active_.size());
    }
    // Drop the cancelled.
    for (Active& a : active_) {
      if (a.seq->cancelled()) finish(a, Finish::kCancelled);
    }
    std::erase_if(active_, [](const Active& a) { return a.table.blocks.empty(); });
    metrics_.slots_busy = static_cast<int64_t>(active_.size());
    metrics_.kv_blocks_free = cache_.free_blocks();
    metrics_.kv_blocks_cached = static_cast<int64_t>(prefix_.size());
    if (active_.empty()) continue;

    // The step: decoding sequences first (one row each), then prompt chunks.
    std::vector<nn::PagedSequence> batch;
    std::vector<Active*> members;
    std::vector<int64_t> ids;
    int64_t budget = options_.step_tokens;
    for (Active& a : active_) {
      if (a.fed < static_cast<int64_t>(a.seq->prompt.size())) continue;
      batch.push_back({&a.table, 1});
      members.push_back(&a);
      ids.push_back(a.next);
      --budget;
    }
    for (Active& a : active_) {
      const int64_t left = static_cast<int64_t>(a.seq->prompt.size()) - a.fed;
      if (left <= 0 || budget <= 0) continue;
      const int64_t n = std::min(left, budget);
      batch.push_back({&a.table, n});
      members.push_back(&a);
      ids.insert(ids.end(), a.seq->prompt.begin() + a.fed, a.seq->prompt.begin() + a.fed + n);
      budget -= n;
    }
    Tensor logits;
    try {
      logits = model_.step(ids, batch, cache_);  // (S, V)
    } catch (const std::exception& e) {
      for (Active* a : members) finish(*a, Finish::kError, e.what());
      std::erase_if(active_, [](const Active& a) { return a.table.blocks.empty(); });
      continue;
    }
    const int64_t V = logits.size(1);
    const auto now = Clock::now();
    for (size_t i = 0; i < members.size(); ++i) {
      Active& a = *members[i];
      const int64_t P = static_cast<int64_t>(a.seq->prompt.size());
      if (a.fed < P) {
        a.fed += batch[i].count;
        metrics_.prompt_tokens_total += static_cast<uint64_t>(batch[i].count);
        if (a.fed < P) continue;  // more of the prompt to feed
      }
      if (options_.prefix_caching && !a.remembered) remember_prompt(a);
      const SamplingParams& p = a.seq->params;
      const Tensor row = logits.slice(0, static_cast<int64_t>(i), static_cast<int64_t>(i) + 1);
      int64_t id = 0;
      try {
        id = nn::sample_next(row, p.temperature, std::min(p.top_k, V),
                             p.temperature > 0.0f ? p.top_p : 1.0f, a.gen)[0];
      } catch (const std::exception& e) {
        finish(a, Finish::kError, e.what());
        continue;
      }
      if (a.generated == 0) {
        a.first_token = now;
        metrics_.time_to_first_token.observe(
            std::chrono::duration<double>(now - a.submitted).count());
      }
      const auto among = [id](const std::vector<int64_t>& list) {
        return std::find(list.begin(), list.end(), id) != list.end();
      };
      const bool eos = !p.ignore_eos && (among(model_.eos_ids()) || among(p.end_ids));
      if (eos) {
        finish(a, Finish::kStop);
        continue;
      }
      if (p.top_logprobs >= 0) {
        const Tensor rc = row.contiguous();
        a.seq->push(token_event(rc.data(), V, id, p.top_logprobs));
      } else {
        TokenEvent e;
        e.id = id;
        a.seq->push(std::move(e));
      }
      ++a.generated;
      ++metrics_.generated_tokens_total;
      a.next = id;
      if (a.generated >= p.max_tokens) finish(a, Finish::kLength);
    }
    std::erase_if(active_, [](const Active& a) { return a.table.blocks.empty(); });
    metrics_.slots_busy = static_cast<int64_t>(active_.size());
    metrics_.kv_blocks_free = cache_.free_blocks();
    metrics_.kv_blocks_cached = static_cast<int64_t>(prefix_.size());
    std::lock_guard<std::mutex> lock(mu_);
    running_ = static_cast<int64_t>(active_.size());
  }
}

}  // namespace attn::serve
