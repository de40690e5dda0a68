// attn serve's library side (src/serve): the OpenAI requests' checks, the
// text stream with stop strings, and the engine's continuous batching on a
// small model (a request's tokens are the same alone or in a batch). The
// HTTP endpoints are tested as clients use them by python/tests/serve.
#include <gtest/gtest.h>

#include <chrono>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "attn/decoder.h"
#include "attn/generate.h"
#include "attn/hf_decoder.h"
#include "serve/api.h"
#include "serve/engine.h"
#include "serve/served_model.h"
#include "serve/text_stream.h"

namespace attn::test {
namespace {

using nlohmann::json;

const std::string kFixtures = std::string(ATTN_TESTS_DIR) + "/fixtures";

// The ApiError a body raises (its status, param and a piece of its message).
void expect_error(const std::function<void()>& f, int status, const std::string& param,
                  const std::string& piece) {
  try {
    f();
    ADD_FAILURE() << "no ApiError";
  } catch (const serve::ApiError& e) {
    EXPECT_EQ(e.status, status) << e.what();
    EXPECT_EQ(e.param, param) << e.what();
    EXPECT_NE(std::string(e.what()).find(piece), std::string::npos) << e.what();
  }
}

TEST(ServeApi, ReadsACompletionRequest) {
  const serve::GenerationRequest r = serve::parse_completion_request(json::parse(R"({
    "model": "m", "prompt": "Hello", "max_tokens": 7, "temperature": 0.5, "top_p": 0.9,
    "top_k": 40, "seed": 11, "stop": ["\n", "end"], "n": 1, "stream": true,
    "stream_options": {"include_usage": true}, "logprobs": 2, "presence_penalty": 0})"));
  EXPECT_EQ(r.model, "m");
  EXPECT_EQ(*r.prompt_text, "Hello");
  EXPECT_EQ(*r.max_tokens, 7);
  EXPECT_FLOAT_EQ(r.temperature, 0.5f);
  EXPECT_FLOAT_EQ(r.top_p, 0.9f);
  EXPECT_EQ(r.top_k, 40);
  EXPECT_EQ(*r.seed, 11);
  EXPECT_EQ(r.stop, (std::vector<std::string>{"\n", "end"}));
  EXPECT_TRUE(r.stream && r.include_usage);
  EXPECT_EQ(r.top_logprobs, 2);
  const serve::GenerationRequest ids =
      serve::parse_completion_request(json::parse(R"({"prompt": [[5, 6, 7]], "stop": "x"})"));
  EXPECT_EQ(ids.prompt_ids, (std::vector<int64_t>{5, 6, 7}));
  EXPECT_EQ(ids.stop, (std::vector<std::string>{"x"}));
  EXPECT_EQ(ids.top_logprobs, -1);
}

TEST(ServeApi, NamesTheFieldOfEveryBadValue) {
  const auto completion = [](const char* body) {
    return [body] { serve::parse_completion_request(json::parse(body)); };
  };
  expect_error(completion(R"({"prompt": "a", "max_tokens": "7"})"), 400, "max_tokens",
               "must be an integer, got string");
  expect_error(completion(R"({"prompt": "a", "max_tokens": 0})"), 400, "max_tokens", ">= 1");
  expect_error(completion(R"({"prompt": "a", "max_tokens": 18446744073709551615})"), 400,
               "max_tokens", "out of range");
  expect_error(completion(R"({"prompt": "a", "temperature": -1})"), 400, "temperature", "[0, 2]");
  expect_error(completion(R"({"prompt": "a", "temperature": true})"), 400, "temperature",
               "a number, got boolean");
  expect_error(completion(R"({"prompt": "a", "top_p": 0})"), 400, "top_p", "(0, 1]");
  expect_error(completion(R"({"prompt": "a", "stop": ["a","b","c","d","e"]})"), 400, "stop",
               "at most 4");
  expect_error(completion(R"({"prompt": "a", "stop": [1]})"), 400, "stop", "strings");
  expect_error(completion(R"({"prompt": "a", "n": 2})"), 400, "n", "must be 1");
  expect_error(completion(R"({"prompt": "a", "stream_options": {"include_usage": true}})"), 400,
               "stream_options", "only allowed when 'stream' is true");
  expect_error(completion(R"({"prompt": "a", "logprobs": 6})"), 400, "logprobs", "[0, 5]");
  expect_error(completion(R"({"prompt": ""})"), 400, "prompt", "must not be empty");
  expect_error(completion(R"({"prompt": ["a", "b"]})"), 400, "prompt", "one prompt per request");
  expect_error(completion(R"({"prompt": {"a": 1}})"), 400, "prompt", "got object");
  expect_error(completion(R"({"max_tokens": 3})"), 400, "prompt", "required");
  expect_error(completion(R"({"prompt": "a", "frequency_penalty": 0.5})"), 400, "frequency_penalty",
               "not supported");
  expect_error(completion(R"({"prompt": "a", "echo": true})"), 400, "echo", "not supported");
  const auto chat = [](const char* body) {
    return [body] { serve::parse_chat_request(json::parse(body)); };
  };
  expect_error(chat(R"({"messages": []})"), 400, "messages", "must not be empty");
  expect_error(chat(R"({"messages": [{"role": "wizard", "content": "x"}]})"), 400,
               "messages[0].role", "'wizard'");
  expect_error(chat(R"({"messages": [{"role": "user", "content": 5}]})"), 400,
               "messages[0].content", "got number");
  expect_error(chat(R"({"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2})"), 400,
               "top_logprobs", "needs 'logprobs'");
  expect_error(chat(R"({"messages": [{"role": "user", "content": "x"}],
                        "continue_final_message": true})"),
               400, "continue_final_message", "needs 'add_generation_prompt' set to false");
  expect_error(chat(R"({"messages": [{"role": "user", "content": "x"}],
                        "add_generation_prompt": "no"})"),
               400, "add_generation_prompt", "boolean");
  const serve::GenerationRequest cont = serve::parse_chat_request(json::parse(
      R"({"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}],
          "add_generation_prompt": false, "continue_final_message": true})"));
  EXPECT_FALSE(cont.add_generation_prompt);
  EXPECT_TRUE(cont.continue_final_message);
  const serve::GenerationRequest c = serve::parse_chat_request(json::parse(
      R"({"messages": [{"role": "system", "content": "Be brief."},
                       {"role": "user", "content": [{"type": "text", "text": "Hi"}]}],
          "max_completion_tokens": 9, "logprobs": true, "top_logprobs": 3})"));
  ASSERT_EQ(c.messages.size(), 2u);
  EXPECT_EQ(c.messages[1].content, "Hi");
  EXPECT_EQ(*c.max_tokens, 9);
  EXPECT_EQ(c.top_logprobs, 3);
}

TEST(ServeApi, MalformedJsonIsA400WithoutItsBytes) {
  try {
    serve::parse_body("{\"prompt\": \"\x01\xff");
    FAIL() << "no throw";
  } catch (const serve::ApiError& e) {
    EXPECT_EQ(e.status, 400);
    EXPECT_EQ(std::string(e.what()).find('\xff'), std::string::npos);
    EXPECT_EQ(e.body()["error"]["code"], "invalid_json");
  }
  expect_error([] { serve::parse_body("[1, 2]"); }, 400, "", "must be a JSON object, got array");
  expect_error([] { serve::parse_body(""); }, 400, "", "no body");
}

// One character per id: "a" = 0, "b" = 1, ...; id 9 is the first half of "é"
// and id 10 its second half.
std::string letters(std::span<const int64_t> ids) {
  std::string s;
  for (const int64_t id : ids) {
    if (id == 9) {
      s += '\xC3';
    } else if (id == 10) {
      s += '\xA9';
    } else {
      s += static_cast<char>('a' + id);
    }
  }
  return s;
}

TEST(ServeTextStream, HoldsBackSplitCharactersAndStopStringPrefixes) {
  serve::TextStream plain(letters, {});
  EXPECT_EQ(plain.push(0), "a");
  EXPECT_EQ(plain.push(9), "");  // half a character
  EXPECT_EQ(plain.push(10), "\xC3\xA9");
  EXPECT_EQ(plain.push(1), "b");
  EXPECT_EQ(plain.flush(), "");

  serve::TextStream s(letters, {"cd", "xyz"});
  EXPECT_EQ(s.push(0), "a");
  EXPECT_EQ(s.push(2), "");    // "c" may begin "cd"
  EXPECT_EQ(s.push(4), "ce");  // it did not
  EXPECT_EQ(s.push(1), "b");
  EXPECT_EQ(s.push(2), "");
  EXPECT_EQ(s.push(3), "");  // "cd": stop, nothing of it given
  EXPECT_TRUE(s.stopped());
  EXPECT_EQ(s.text(), "aceb");
  EXPECT_EQ(s.push(0), "");  // nothing after the stop

  serve::TextStream t(letters, {"xyz"});
  t.push(23);  // "x"
  t.push(24);  // "xy"
  EXPECT_FALSE(t.stopped());
  EXPECT_EQ(t.flush(), "xy");  // the end gives what was held
}

TEST(ServeModel, IdsPastTheTokenizerHaveNoText) {
  // A model's vocabulary may be padded past its tokenizer's (Qwen: 151,936 rows over
  // 151,669 tokens); a sampled padding id must not stop the server.
  auto model = serve::ServedModel::load({.dir = kFixtures + "/open_models/qwen3", .name = ""});
  const std::vector<int64_t> with = {300, 1 << 30, 301}, without = {300, 301};
  EXPECT_EQ(model->decode(with), model->decode(without));
  EXPECT_EQ(model->name(), "qwen3");
  EXPECT_EQ(model->eos_ids(), (std::vector<int64_t>{2}));
}

// ---- the engine on the Qwen3 fixture ----------------------------------------------------

std::vector<int64_t> run_alone(serve::Engine& engine, const std::vector<int64_t>& prompt,
                               const serve::SamplingParams& p) {
  auto seq = engine.submit(prompt, p);
  std::vector<serve::TokenEvent> events;
  serve::Finish f = serve::Finish::kNone;
  while (f == serve::Finish::kNone) f = seq->wait(events, std::chrono::milliseconds(50));
  std::vector<int64_t> ids;
  for (const auto& e : events) ids.push_back(e.id);
  return ids;
}

TEST(ServeEngine, SeededRequestsGiveTheSameTokensAloneAndBatchedAsAttnGenerate) {
  auto model = serve::ServedModel::load({.dir = kFixtures + "/open_models/qwen3", .name = ""});
  serve::Metrics metrics;
  serve::Engine engine(
      *model,
      {.parallel = 4, .queue_size = 16, .block_size = 4, .num_blocks = 64, .step_tokens = 8},
      metrics);
  std::vector<std::vector<int64_t>> prompts = {
      {5, 17, 300, 2}, {9}, {44, 45, 46, 47, 48, 49, 50, 51, 52, 53, 54}, {7, 7}};
  std::vector<serve::SamplingParams> params(4);
  for (size_t i = 0; i < 4; ++i) {
    params[i].temperature = i == 1 ? 0.0f : 0.9f;
    params[i].top_k = i == 2 ? 20 : 0;
    params[i].top_p = i == 3 ? 0.8f : 1.0f;
    params[i].seed = 100 + i;
    params[i].max_tokens = 12;
  }
  std::vector<std::vector<int64_t>> alone;
  for (size_t i = 0; i < 4; ++i) alone.push_back(run_alone(engine, prompts[i], params[i]));
  // All four at once (the long prompt in chunks of the step's budget).
  std::vector<std::shared_ptr<serve::Sequence>> seqs;
  for (size_t i = 0; i < 4; ++i) seqs.push_back(engine.submit(prompts[i], params[i]));
  for (size_t i = 0; i < 4; ++i) {
    std::vector<serve::TokenEvent> events;
    serve::Finish f = serve::Finish::kNone;
    while (f == serve::Finish::kNone) f = seqs[i]->wait(events, std::chrono::milliseconds(50));
    std::vector<int64_t> ids;
    for (const auto& e : events) ids.push_back(e.id);
    EXPECT_EQ(ids, alone[i]) << "request " << i;
  }
  // The same tokens as nn::generate with the same seed (what `attn generate --seed` runs).
  std::unique_ptr<nn::DecoderLM> lm;
  const io::HfDecoderInfo info = io::load_hf_decoder(kFixtures + "/open_models/qwen3", lm);
  for (size_t i = 0; i < 4; ++i) {
    Generator gen(params[i].seed);
    const int64_t T = static_cast<int64_t>(prompts[i].size());
    const Tensor out = nn::generate(*lm, Tensor::from_int64({1, T}, prompts[i]),
                                    {.max_new_tokens = 12,
                                     .temperature = params[i].temperature,
                                     .top_k = params[i].top_k,
                                     .top_p = params[i].top_p},
                                    gen, info.hf.eos_token_ids);
    const std::vector<int64_t> all = out.to_int64_vector();
    EXPECT_EQ(std::vector<int64_t>(all.begin() + T, all.end()), alone[i]) << "request " << i;
  }
  EXPECT_EQ(metrics.slots_busy.load(), 0);
  EXPECT_EQ(metrics.kv_blocks_free.load() + metrics.kv_blocks_cached.load(), 64);
}

TEST(ServeEngine, APrefixCachedPromptGivesTheTokensOfAComputedOne) {
  auto model = serve::ServedModel::load({.dir = kFixtures + "/open_models/qwen3", .name = ""});
  std::vector<int64_t> system;  // 3 blocks of 4 and 2 tokens
  for (int64_t i = 0; i < 14; ++i) system.push_back(100 + 7 * i);
  std::vector<std::vector<int64_t>> prompts;
  for (int64_t q = 0; q < 3; ++q) {
    prompts.push_back(system);
    for (int64_t i = 0; i <= q; ++i) prompts.back().push_back(500 + 31 * q + i);
  }
  serve::SamplingParams p;
  p.temperature = 0.8f;
  p.max_tokens = 10;
  std::vector<std::vector<int64_t>> computed, cached;
  for (const bool caching : {false, true}) {
    serve::Metrics metrics;
    // 8 blocks: a request takes 7 (3 of them shared), so the cache must give some back.
    serve::Engine engine(*model,
                         {.parallel = 2,
                          .queue_size = 8,
                          .block_size = 4,
                          .num_blocks = 8,
                          .step_tokens = 8,
                          .prefix_caching = caching},
                         metrics);
    for (int round = 0; round < 2; ++round) {
      for (size_t q = 0; q < prompts.size(); ++q) {
        p.seed = 7 + q;
        (caching ? cached : computed).push_back(run_alone(engine, prompts[q], p));
      }
    }
    if (caching) {
      // Every request after the first reads the 3 blocks of the shared beginning;
      // the third prompt's second run (17 tokens) also its own fourth block
      // (64 tokens). Beyond them, rows of cached fourth blocks that begin the
      // rest of a prompt are copied, as far as the small pool keeps those
      // blocks (APromptAskedAgainComputesOnlyItsLastToken counts them exactly).
      EXPECT_GE(metrics.prefix_cache_hit_tokens_total.load(), 5u * 12u + 4u);
      EXPECT_LE(metrics.prefix_cache_hit_tokens_total.load(), 5u * 12u + 4u + 2u + 2u + 2u + 3u);
      EXPECT_GT(metrics.kv_blocks_cached.load(), 0);
    } else {
      EXPECT_EQ(metrics.prefix_cache_hit_tokens_total.load(), 0u);
    }
    EXPECT_EQ(metrics.kv_blocks_free.load() + metrics.kv_blocks_cached.load(), 8);
  }
  EXPECT_EQ(cached, computed);
}

// A prompt asked again reuses all of it but its last token, whether it ends on
// a block's edge or inside a block (rows copied from the cached block), and
// gives the tokens the first run gave; the copied rows' block is the
// sequence's own (the cached one is not written).
TEST(ServeEngine, APromptAskedAgainComputesOnlyItsLastToken) {
  auto model = serve::ServedModel::load({.dir = kFixtures + "/open_models/qwen3", .name = ""});
  serve::SamplingParams p;
  p.temperature = 0.0f;
  p.max_tokens = 6;
  for (const int64_t length : {16, 14, 5}) {
    SCOPED_TRACE(length);
    std::vector<int64_t> prompt;
    for (int64_t i = 0; i < length; ++i) prompt.push_back(200 + 13 * i);
    serve::Metrics metrics;
    serve::Engine engine(*model,
                         {.parallel = 1,
                          .queue_size = 4,
                          .block_size = 4,
                          .num_blocks = 16,
                          .step_tokens = 8,
                          .prefix_caching = true},
                         metrics);
    const std::vector<int64_t> first = run_alone(engine, prompt, p);
    EXPECT_EQ(metrics.prefix_cache_hit_tokens_total.load(), 0u);
    const std::vector<int64_t> again = run_alone(engine, prompt, p);
    EXPECT_EQ(metrics.prefix_cache_hit_tokens_total.load(), uint64_t(length - 1));
    EXPECT_EQ(again, first);
    // A third time: the cached blocks were not changed by the second run.
    EXPECT_EQ(run_alone(engine, prompt, p), first);
    EXPECT_EQ(metrics.prefix_cache_hit_tokens_total.load(), 2u * uint64_t(length - 1));
  }
}

TEST(ServeEngine, CancelledAndQueuedRequestsFreeTheirSlots) {
  auto model = serve::ServedModel::load({.dir = kFixtures + "/open_models/qwen3", .name = ""});
  serve::Metrics metrics;
  serve::Engine engine(
      *model, {.parallel = 1, .queue_size = 1, .block_size = 4, .num_blocks = 16, .step_tokens = 8},
      metrics);
  serve::SamplingParams p;
  p.max_tokens = 50;
  p.temperature = 0.0f;
  auto a = engine.submit({1, 2, 3}, p);
  auto b = engine.submit({4, 5}, p);  // waits for a's slot (or runs, if a already ended)
  // The queue (1) is full while a holds the slot; on a loaded machine the
  // scheduler may have run a to its end (50 tokens of a tiny model) before
  // this line, and then b holds the slot and c waits in the queue instead.
  decltype(a) c;
  try {
    c = engine.submit({6}, p);
  } catch (const serve::QueueFull&) {
  }
  a->cancel();
  std::vector<serve::TokenEvent> events;
  serve::Finish fa = serve::Finish::kNone;
  while (fa == serve::Finish::kNone) fa = a->wait(events, std::chrono::milliseconds(50));
  EXPECT_TRUE(fa == serve::Finish::kCancelled || fa == serve::Finish::kLength ||
              fa == serve::Finish::kStop);
  serve::Finish fb = serve::Finish::kNone;
  events.clear();
  while (fb == serve::Finish::kNone) fb = b->wait(events, std::chrono::milliseconds(50));
  EXPECT_NE(fb, serve::Finish::kError);
  if (c) {  // accepted only because a had ended before it came
    EXPECT_NE(fa, serve::Finish::kCancelled);
    serve::Finish fc = serve::Finish::kNone;
    events.clear();
    while (fc == serve::Finish::kNone) fc = c->wait(events, std::chrono::milliseconds(50));
    EXPECT_NE(fc, serve::Finish::kError);
  }
  engine.stop();
  EXPECT_EQ(metrics.kv_blocks_free.load(), 16);
  EXPECT_THROW(engine.submit({1}, p), std::runtime_error);
}

}  // namespace
}  // namespace attn::test
