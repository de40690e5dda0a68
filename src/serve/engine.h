// engine.h - continuous batching: one scheduler thread owns the model and
// runs every active request's next tokens as one batched step.
//
//   submit(prompt, params) -> Sequence     (a bounded queue; QueueFull past it)
//   scheduler loop, between two steps:
//     admit      waiting requests while a slot (--parallel) and the blocks of
//                prompt + max_tokens (the paged cache's pool) are free
//     drop       cancelled requests (a client gone, a stop string found):
//                slot and blocks freed before the next step
//     step       decoding sequences feed their last token (1 row each), then
//                prompts are fed in chunks up to the step's token budget, so a
//                long prompt never stalls the others for more than one chunk;
//                ServedModel::step runs all rows as one batched forward
//     sample     every sequence whose prompt is complete samples its next
//                token with its own Generator (seeded per request: the same
//                tokens alone or in any batch), with nn::sample_next, the
//                sampler of `attn generate`; an end id finishes it ("stop"),
//                max_tokens finishes it ("length")
//
// The HTTP side reads a Sequence's events (token id, log-probabilities) as they
// come and may cancel it; text, stop strings and JSON are its business.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <list>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "attn/paged_kv_cache.h"
#include "attn/random.h"
#include "metrics.h"
#include "served_model.h"

namespace attn::serve {

struct SamplingParams {
  float temperature = 1.0f;   // 0: argmax
  float top_p = 1.0f;         // (0, 1]; ignored at temperature 0
  int64_t top_k = 0;          // 0: off
  uint64_t seed = 0;          // the request's Generator
  int64_t max_tokens = 16;    // >= 1
  int64_t top_logprobs = -1;  // -1: no log-probabilities; 0..20: the token's and this many more
  bool ignore_eos = false;    // an end id is then a token like the others
  std::vector<int64_t> end_ids;  // ids that end this request besides the model's (a chat
                                 // template's end of turn)
};

struct TokenEvent {
  int64_t id = 0;
  float logprob = 0.0f;                        // log softmax of the logits at id
  std::vector<std::pair<int64_t, float>> top;  // the top_logprobs most likely (id, logprob)
};

enum class Finish { kNone, kStop, kLength, kCancelled, kError };
const char* finish_name(Finish f);  // "stop", "length", "cancelled", "error"

// One request as the engine and its HTTP handler share it.
class Sequence {
 public:
  Sequence(std::vector<int64_t> prompt_ids, const SamplingParams& sampling)
      : prompt(std::move(prompt_ids)), params(sampling) {}
  const std::vector<int64_t> prompt;
  const SamplingParams params;

  // Waits up to `timeout` for events or the end; moves the new events into
  // `out` and returns the finish (kNone while running).
  Finish wait(std::vector<TokenEvent>& out, std::chrono::milliseconds timeout);
  // Asks the engine to stop it (its slot and blocks are freed before the next step).
  void cancel() { cancelled_.store(true); }
  bool cancelled() const { return cancelled_.load(); }
  std::string error() const;

  // The engine's side.
  void push(TokenEvent e);
  void finish(Finish f, std::string error = "");

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<TokenEvent> events_;
  Finish finish_ = Finish::kNone;
  std::string error_;
  std::atomic<bool> cancelled_{false};
};

struct EngineOptions {
  int64_t parallel = 4;     // sequences decoded together (slots)
  int64_t queue_size = 64;  // requests waiting for a slot
  int64_t block_size = 16;  // the paged cache's positions per block
  int64_t num_blocks = 0;   // the pool
  // Token rows one step may run (prompt chunks fill what decoding leaves).
  int64_t step_tokens = 256;
  // Full blocks of finished prompts stay cached (until their room is needed),
  // and a request whose prompt begins with the same tokens reads them instead
  // of computing them again (a system prompt, a chat's earlier turns).
  bool prefix_caching = true;
};

class QueueFull : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class Engine {
 public:
  // Throws std::invalid_argument naming an option out of range.
  Engine(ServedModel& model, const EngineOptions& options, Metrics& metrics);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Queues a request (prompt and params already validated against the model
  // and the pool: max_fit_tokens). Throws QueueFull when the queue is full and
  // std::runtime_error once the engine is stopping.
  std::shared_ptr<Sequence> submit(std::vector<int64_t> prompt, const SamplingParams& params);
  // The most prompt + max_tokens one request may hold: the pool's positions.
  int64_t max_fit_tokens() const;
  // Stops admitting; cancels the waiting and running requests (kCancelled)
  // and joins the scheduler thread. Idempotent.
  void stop();
  const EngineOptions& options() const { return options_; }

 private:
  struct Active {
    std::shared_ptr<Sequence> seq;
    nn::BlockTable table = {};
    Generator gen;
    int64_t fed = 0;        // prompt tokens fed so far
    int64_t generated = 0;  // tokens sampled
    int64_t next = -1;      // the last sampled token, fed by the next step
    bool remembered = false;  // its prompt's blocks are in the prefix cache
    std::chrono::steady_clock::time_point submitted = {}, first_token = {};
  };
  void loop();
  void finish(Active& a, Finish f, const std::string& error = "");

  // Prefix caching: a full block of a prompt by the hash of every token up to
  // its end (chained block by block), with its own tokens to confirm a match
  // and the chained hash before it (its parent: the blocks that follow one
  // prefix are its children); and a prompt's last rows that end inside a block,
  // copied into a block of the cache's own (fewer tokens than a block).
  struct CachedBlock {
    int32_t block = 0;
    std::vector<int64_t> tokens;
    std::list<uint64_t>::iterator lru;
    uint64_t parent = 0;
  };
  // The chained hashes of the first n full blocks of `tokens`.
  std::vector<uint64_t> block_hashes(const std::vector<int64_t>& tokens, int64_t n) const;
  // What the cache holds of a prompt's beginning, up to the token before its
  // last: whole blocks to share, then the cached block that shares the most
  // leading tokens with the next stretch of the prompt (partial = -1 when none),
  // whose first partial_tokens rows a sequence copies into a block of its own.
  struct PrefixHit {
    std::vector<int32_t> blocks;
    int32_t partial = -1;
    int64_t partial_tokens = 0;
  };
  PrefixHit cached_prefix(const std::vector<int64_t>& prompt);
  void remember_prompt(Active& a);
  bool evict_one();  // drops the least recently used block that only the cache holds
  void forget(std::unordered_map<uint64_t, CachedBlock>::iterator entry);
  void clear_prefix_cache();
  std::unordered_map<uint64_t, CachedBlock> prefix_;
  std::unordered_multimap<uint64_t, uint64_t> children_;  // parent hash -> block hashes
  std::list<uint64_t> lru_;  // least recently used first

  ServedModel& model_;
  EngineOptions options_;
  Metrics& metrics_;
  nn::PagedKVCache cache_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::pair<std::shared_ptr<Sequence>, std::chrono::steady_clock::time_point>> waiting_;
  bool stopping_ = false;
  int64_t running_ = 0;         // active_.size(), as submit may read it (under mu_)
  std::vector<Active> active_;  // the scheduler thread's
  std::thread thread_;
};

}  // namespace attn::serve
