// Training (attn/train.h) and `attn train`: UTF-8, the tokenizer, the
// generator's state, batches, options, exact resume, SIGINT / SIGKILL, the
// loss a small model reaches on tinyshakespeare, and bad input.
#include <gtest/gtest.h>
#include <omp.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "attn/checkpoint.h"
#include "attn/gemm.h"
#include "attn/generate.h"
#include "attn/hf_gpt2.h"
#include "attn/model_config.h"
#include "attn/random.h"
#include "attn/safetensors.h"
#include "attn/train.h"
#include "attn/utf8.h"
#include "cli.h"
#include "train_steps.h"

namespace {

using attn::Generator;
using attn::test::all_weights;
using attn::test::run_losses;
using attn::train::Batcher;
using attn::train::CharTokenizer;
using attn::train::Trainer;
using attn::train::TrainOptions;

std::string data_path(const std::string& name) { return std::string(ATTN_DATA_DIR) + "/" + name; }

// The first n bytes of tinyshakespeare (ASCII, so any cut is valid UTF-8).
std::string shakespeare(size_t n) {
  const std::string all = attn::test::read_text(data_path("tinyshakespeare.txt"));
  if (all.empty()) ADD_FAILURE() << "cannot read " << data_path("tinyshakespeare.txt");
  return all.substr(0, n);
}

void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}

TrainOptions tiny_options() {
  TrainOptions o;
  o.n_layers = 1;
  o.n_heads = 2;
  o.emb_dim = 16;
  o.context_length = 16;
  o.batch_size = 4;
  o.max_iters = 30;
  o.warmup_iters = 5;
  o.eval_interval = 5;
  o.eval_iters = 2;
  o.seed = 7;
  return o;
}

// ---- UTF-8 and the tokenizer ---------------------------------------------------------------

TEST(Utf8, DecodesAndEncodesEveryLength) {
  const std::string text = "a\u00e9\u20ac\U0001F600";  // 1, 2, 3, 4 bytes
  const std::vector<char32_t> cps = attn::train::decode_utf8(text);
  EXPECT_EQ(cps, (std::vector<char32_t>{U'a', 0xE9, 0x20AC, 0x1F600}));
  std::string back;
  for (char32_t cp : cps) back += attn::train::encode_utf8(cp);
  EXPECT_EQ(back, text);
  EXPECT_THROW(attn::train::encode_utf8(0xD800), std::invalid_argument);
  EXPECT_THROW(attn::train::encode_utf8(0x110000), std::invalid_argument);
}

TEST(Utf8, InvalidInputNamesTheByteOffset) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"abc\xff", "byte offset 3"},             // invalid lead byte
      {"ab\x80", "byte offset 2"},              // stray continuation
      {"a\xc3", "byte offset 1"},               // cut short
      {"xy\xe2\x28\xa1", "byte offset 2"},      // missing continuation
      {"\xc0\xaf", "byte offset 0"},            // overlong '/'
      {"ok\xed\xa0\x80", "byte offset 2"},      // surrogate U+D800
      {"\xf4\x90\x80\x80", "byte offset 0"}};   // above U+10FFFF
  for (const auto& [bytes, where] : cases) {
    try {
      attn::train::decode_utf8(bytes);
      ADD_FAILURE() << "no error for " << nlohmann::json(where).dump();
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(where), std::string::npos) << e.what();
    }
  }
}

TEST(CharTokenizer, SortedVocabularyRoundTrips) {
  const std::string text = "hello, w\u00f6rld\n";
  const CharTokenizer tok = CharTokenizer::from_text(text);
  EXPECT_EQ(tok.vocab(), (std::vector<std::string>{"\n", " ", ",", "d", "e", "h", "l", "o", "r", "w", "\u00f6"}));
  const std::vector<int64_t> ids = tok.encode(text);
  EXPECT_EQ(ids.size(), 13u);
  EXPECT_EQ(ids[0], 5);  // 'h'
  EXPECT_EQ(tok.decode(ids), text);
  EXPECT_EQ(CharTokenizer::from_json(tok.to_json()).vocab(), tok.vocab());
  EXPECT_THROW(tok.decode({11}), std::out_of_range);
  try {
    tok.encode("he!");
    ADD_FAILURE() << "no error for a character outside the vocabulary";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("byte offset 2"), std::string::npos) << e.what();
  }
  EXPECT_THROW(CharTokenizer::from_text(""), std::invalid_argument);
  EXPECT_THROW(CharTokenizer(std::vector<std::string>{"a", "bc"}), std::invalid_argument);
  EXPECT_THROW(CharTokenizer(std::vector<std::string>{"a", "a"}), std::invalid_argument);
}

// ---- the generator's state -----------------------------------------------------------------

TEST(GeneratorState, RestoredGeneratorDrawsTheSame) {
  for (int warmup : {0, 1, 623, 624, 625, 1500}) {
    Generator g(42);
    for (int i = 0; i < warmup; ++i) g.random();
    g.normal_double();  // leaves a cached second normal
    const attn::GeneratorState s = g.get_state();
    std::vector<double> a;
    for (int i = 0; i < 700; ++i) a.push_back(i % 3 == 0 ? g.normal_double() : static_cast<double>(g.random()));
    Generator h(1);
    h.set_state(s);
    EXPECT_EQ(h.initial_seed(), 42u);
    std::vector<double> b;
    for (int i = 0; i < 700; ++i) b.push_back(i % 3 == 0 ? h.normal_double() : static_cast<double>(h.random()));
    EXPECT_EQ(a, b) << "after " << warmup << " draws";
  }
  attn::GeneratorState bad = Generator(1).get_state();
  bad.left = 0;
  EXPECT_THROW(Generator().set_state(bad), std::invalid_argument);
  bad.left = 5;
  bad.next = 700;
  EXPECT_THROW(Generator().set_state(bad), std::invalid_argument);
}

// ---- batches and options -------------------------------------------------------------------

TEST(Batcher, WindowsAndTargetsShiftedByOne) {
  std::vector<int64_t> data(50);
  for (int64_t i = 0; i < 50; ++i) data[static_cast<size_t>(i)] = i;
  const Batcher batcher(data, 3, 8);
  Generator g(5), h(5);
  auto [x, y] = batcher.next(g);
  EXPECT_EQ(x.shape(), (attn::Shape{3, 8}));
  const int64_t* xs = x.data_ptr<int64_t>();
  const int64_t* ys = y.data_ptr<int64_t>();
  for (int64_t b = 0; b < 3; ++b) {
    const auto expected = static_cast<int64_t>(h.random() % 42);  // offsets in [0, 50 - 8)
    for (int64_t t = 0; t < 8; ++t) {
      EXPECT_EQ(xs[b * 8 + t], expected + t);
      EXPECT_EQ(ys[b * 8 + t], expected + t + 1);
    }
  }
  EXPECT_THROW(Batcher(std::vector<int64_t>(8), 1, 8), std::invalid_argument);
  EXPECT_NO_THROW(Batcher(std::vector<int64_t>(9), 1, 8));
}

TEST(TrainOptions, ValidatesAndRoundTrips) {
  TrainOptions o = tiny_options();
  o.lr = 3e-4;
  o.seed = 99;
  o.dtype = "bfloat16";
  const TrainOptions back = TrainOptions::from_json(o.to_json());
  EXPECT_EQ(back.to_json(), o.to_json());
  EXPECT_NO_THROW(o.validate());
  auto bad = [](auto change, const std::string& needle) {
    TrainOptions b = tiny_options();
    change(b);
    try {
      b.validate();
      ADD_FAILURE() << "no error for " << needle;
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  bad([](TrainOptions& b) { b.n_heads = 3; }, "--n-heads 3 must divide --emb-dim 16");
  bad([](TrainOptions& b) { b.batch_size = 0; }, "--batch-size");
  bad([](TrainOptions& b) { b.lr = 0; }, "--lr");
  bad([](TrainOptions& b) { b.min_lr = 1.0; }, "--min-lr");
  bad([](TrainOptions& b) { b.drop_rate = 1.0; }, "--drop-rate");
  bad([](TrainOptions& b) { b.eval_iters = -1; }, "--eval-iters");
  bad([](TrainOptions& b) { b.dtype = "float16"; },
      "--dtype must be float32 or bfloat16, got 'float16'");
  bad([](TrainOptions& b) { b.tokenizer = "bpe"; }, "--tokenizer must be char, gpt2 or hf, got 'bpe'");
  bad([](TrainOptions& b) { b.stride = -1; }, "--stride must be >= 0, got -1");
  bad([](TrainOptions& b) { b.epochs = -2; }, "--epochs must be >= 0, got -2");
  TrainOptions g = tiny_options();
  g.tokenizer = "gpt2";
  g.stride = 3;
  g.epochs = 2;
  EXPECT_EQ(TrainOptions::from_json(g.to_json()).to_json(), g.to_json());
}

// Issue 46, paths are bytes: --init-from and --tokenizer-file that are not
// UTF-8 come back from train_args byte for byte (a resume reads the same
// folder), through KEY_hex beside KEY's U+FFFD text (attn/utf8.h).
TEST(TrainOptions, PathsThatAreNotUtf8RoundTripByteForByte) {
  TrainOptions o = tiny_options();
  o.arch = "qwen3";
  o.init_from = "/models/caf\xE9-\xFF\xC3";  // Latin-1 é, a stray byte, a cut sequence
  o.tokenizer = "hf";
  o.tokenizer_file = "/t/\x80tokenizer.json";
  const std::string text = o.to_json();
  const auto j = nlohmann::json::parse(text);  // valid JSON, valid UTF-8
  EXPECT_EQ(j.at("init_from"), "/models/caf\xEF\xBF\xBD-\xEF\xBF\xBD\xEF\xBF\xBD");
  EXPECT_EQ(j.at("init_from_hex"), "2f6d6f64656c732f636166e92dffc3");
  const TrainOptions back = TrainOptions::from_json(text);
  EXPECT_EQ(back.init_from, o.init_from);
  EXPECT_EQ(back.tokenizer_file, o.tokenizer_file);
  // UTF-8 paths are written as before, with no _hex key.
  o.init_from = "/models/caf\xC3\xA9";
  EXPECT_EQ(nlohmann::json::parse(o.to_json()).count("init_from_hex"), 0u);
  EXPECT_EQ(TrainOptions::from_json(o.to_json()).init_from, o.init_from);
}

TEST(Trainer, RefusesTextTooShortForTheSplit) {
  TrainOptions o = tiny_options();
  // 100 characters: 90 train, 10 validation < context_length + 1 = 17.
  try {
    Trainer t(shakespeare(100), o);
    ADD_FAILURE() << "no error";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("10 validation tokens"), std::string::npos) << e.what();
  }
  EXPECT_NO_THROW(Trainer(shakespeare(170), o));  // 153 / 17
}

// ---- exact resume --------------------------------------------------------------------------

TEST(Trainer, ResumeGivesBitIdenticalLosses) {
  const std::string text = shakespeare(4000);
  TrainOptions o = tiny_options();
  o.drop_rate = 0.1;  // dropout masks come from the saved generator too
  Trainer straight(text, o);
  const std::vector<double> all = run_losses(straight, 30);

  const std::string path = attn::test::temp_path("resume.safetensors");
  std::vector<double> resumed;
  {
    Trainer first(text, o);
    resumed = run_losses(first, 15);  // 15 % 5 == 0: its evaluation at 15 is saved as done
    first.save(path);
  }
  {
    Trainer second(text, o);
    second.resume(path);
    EXPECT_EQ(second.iter(), 15);
    const std::vector<double> rest = run_losses(second, 30);
    resumed.insert(resumed.end(), rest.begin(), rest.end());
  }
  ASSERT_EQ(all.size(), resumed.size());
  for (size_t i = 0; i < all.size(); ++i) EXPECT_EQ(all[i], resumed[i]) << "loss " << i;

  // Resuming in the middle of an evaluation interval (no evaluation saved at 12).
  Trainer a(text, o);
  run_losses(a, 12);
  a.save(path);
  const std::vector<double> tail_a = run_losses(a, 30);
  Trainer b(text, o);
  b.resume(path);
  EXPECT_EQ(run_losses(b, 30), tail_a);
  std::filesystem::remove(path);
}

// ---- GPT-2 BPE runs: the book's chapter-5 data ---------------------------------------------

TEST(WindowLoader, WindowsBatchesAndErrors) {
  std::vector<int64_t> ids(20);
  for (int64_t i = 0; i < 20; ++i) ids[static_cast<size_t>(i)] = 100 + i;
  // range(0, 20 - 4, 3): 0 3 6 9 12 15 -> 6 windows; batches of 4: 1 (drop_last) or 2.
  attn::train::WindowLoader in_order(ids, 4, 4, 3, /*shuffle=*/false, /*drop_last=*/false);
  EXPECT_EQ(in_order.windows(), 6);
  EXPECT_EQ(in_order.batches(), 2);
  attn::Generator gen(1);
  in_order.start_pass(gen);
  auto [x0, y0] = in_order.next();
  EXPECT_EQ(x0.shape(), (attn::Shape{4, 4}));
  EXPECT_EQ(x0.data_ptr<int64_t>()[4], 103);  // row 1 starts at 3
  EXPECT_EQ(y0.data_ptr<int64_t>()[4], 104);
  auto [x1, y1] = in_order.next();
  EXPECT_EQ(x1.shape(), (attn::Shape{2, 4}));  // the short last batch
  EXPECT_EQ(x1.data_ptr<int64_t>()[4], 115);
  EXPECT_EQ(y1.data_ptr<int64_t>()[7], 119);  // the last target is the last id
  EXPECT_FALSE(in_order.in_pass());
  EXPECT_THROW(in_order.next(), std::logic_error);
  attn::train::WindowLoader dropped(ids, 4, 4, 3, /*shuffle=*/true, /*drop_last=*/true);
  EXPECT_EQ(dropped.batches(), 1);

  auto error = [&](int64_t n, int64_t batch, int64_t len, int64_t stride, bool drop_last) {
    try {
      attn::train::WindowLoader l(std::vector<int64_t>(static_cast<size_t>(n)), batch, len, stride, drop_last,
                                  drop_last, "validation");
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string("(accepted)");
  };
  EXPECT_EQ(error(8, 2, 8, 8, false),
            "validation loader: 8 tokens hold no window of max_length 8 (a window needs max_length + 1 "
            "tokens)");
  EXPECT_EQ(error(9, 2, 8, 8, false), "(accepted)");
  EXPECT_EQ(error(20, 7, 4, 3, true),
            "validation loader: 6 windows of 4 tokens every 3 make no full batch of 7 (drop_last)");
  EXPECT_EQ(error(20, 0, 4, 3, false),
            "validation loader: batch_size 0, max_length 4 and stride 3 must be >= 1");
}

TrainOptions verdict_options() {
  TrainOptions o = tiny_options();
  o.tokenizer = "gpt2";
  o.context_length = 256;
  o.batch_size = 2;
  o.emb_dim = 16;
  o.n_heads = 2;
  o.n_layers = 1;
  o.eval_iters = 5;
  o.eval_interval = 5;
  o.warmup_iters = 0;
  return o;
}

// The book's chapter 5 on The Verdict (context 256, stride 256, batch 2):
// "Train loader" 9 batches, "Validation loader" 1 batch of 2.
TEST(Trainer, Gpt2RunHasTheBooksLoaders) {
  const std::string verdict = attn::test::read_text(data_path("the-verdict.txt"));
  ASSERT_EQ(verdict.size(), 20479u);
  TrainOptions o = verdict_options();
  o.epochs = 10;
  Trainer t(verdict, o);
  EXPECT_EQ(t.vocab_size(), 50257);
  ASSERT_NE(t.train_loader(), nullptr);
  EXPECT_EQ(t.train_loader()->batches(), 9);
  EXPECT_EQ(t.val_loader()->batches(), 1);
  EXPECT_EQ(t.val_loader()->windows(), 2);
  // 4,612 + 534 (tiktoken's counts for the two parts): one more than the
  // whole text's 5,145, as the cut at 90% of the characters splits "collapse".
  EXPECT_EQ(t.train_tokens(), 4612);
  EXPECT_EQ(t.val_tokens(), 534);
  EXPECT_EQ(t.options().max_iters, 90);                // 10 epochs of 9 batches
  EXPECT_THROW((void)t.tokenizer(), std::logic_error);
  EXPECT_EQ(t.metadata().at("tokenizer"), "gpt2");
  EXPECT_EQ(t.metadata().count("vocab"), 0u);
}

TEST(Trainer, Gpt2RunResumesMidEpochBitIdentically) {
  const std::string text = attn::test::read_text(data_path("the-verdict.txt"));
  TrainOptions o = verdict_options();
  o.context_length = 32;
  o.stride = 32;
  o.batch_size = 8;
  o.max_iters = 40;  // 18 training batches a pass: the run crosses two passes
  o.drop_rate = 0.1;
  Trainer straight(text, o);
  const std::vector<double> all = run_losses(straight, 40);
  EXPECT_EQ(straight.train_loader()->batches(), 18);
  EXPECT_EQ(straight.epoch(), 2);

  const std::string path = attn::test::temp_path("gpt2.safetensors");
  Trainer first(text, o);
  std::vector<double> resumed = run_losses(first, 23);  // inside the second pass, between evaluations
  first.save(path);
  Trainer second(text, o);
  second.resume(path);
  EXPECT_EQ(second.epoch(), 1);
  const std::vector<double> rest = run_losses(second, 40);
  resumed.insert(resumed.end(), rest.begin(), rest.end());
  ASSERT_EQ(all.size(), resumed.size());
  for (size_t i = 0; i < all.size(); ++i) EXPECT_EQ(all[i], resumed[i]) << "loss " << i;

  // A character-level run cannot resume a gpt2 checkpoint.
  TrainOptions chars = tiny_options();
  chars.context_length = 32;
  try {
    Trainer(text, chars).resume(path);
    ADD_FAILURE() << "no error";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("was trained with --tokenizer gpt2, this run uses char"),
              std::string::npos)
        << e.what();
  }
  std::filesystem::remove(path);
}

TEST(Trainer, Gpt2RunLearnsTheVerdict) {
  // 60 steps of a small model bring the validation loss far below ln(50257) = 10.8.
  const std::string text = attn::test::read_text(data_path("the-verdict.txt"));
  TrainOptions o = verdict_options();
  o.context_length = 64;
  o.stride = 64;
  o.batch_size = 4;
  o.emb_dim = 32;
  o.max_iters = 60;
  o.lr = 4e-3;
  o.min_lr = 4e-4;
  Trainer t(text, o);
  const double before = t.evaluate().val_loss;
  EXPECT_NEAR(before, std::log(50257.0), 0.3);
  for (int i = 0; i < 60; ++i) t.step();
  const double after = t.evaluate().val_loss;
  EXPECT_LT(after, 8.0) << "before " << before;
}

// The checkpoint is float32 in either dtype: an fp32 run resumes in bf16 (and
// back) with the same weights and optimizer state, and goes on learning.
TEST(Trainer, ResumesInTheOtherDtype) {
  const std::string text = shakespeare(4000);
  const std::string path = attn::test::temp_path("dtype.safetensors");
  TrainOptions o = tiny_options();
  Trainer f32(text, o);
  run_losses(f32, 10);
  f32.save(path);
  o.dtype = "bfloat16";
  Trainer b16(text, o);
  b16.resume(path);
  EXPECT_EQ(b16.iter(), 10);
  const auto a = f32.model().named_parameters(), b = b16.model().named_parameters();
  for (size_t i = 0; i < a.size(); ++i)
    EXPECT_EQ(max_abs_diff(a[i].second->value, b[i].second->value), 0.0f) << a[i].first;
  // The same next batch: the bf16 step's loss is the fp32 one up to bf16 rounding.
  const double loss32 = f32.step(), loss16 = b16.step();
  EXPECT_NEAR(loss16, loss32, 2e-2);
  EXPECT_NE(loss16, loss32);
  std::filesystem::remove(path);
}

TEST(Trainer, ResumeRefusesAnotherModelOrVocabulary) {
  const std::string text = shakespeare(4000);
  const std::string path = attn::test::temp_path("mismatch.safetensors");
  Trainer t(text, tiny_options());
  t.save(path);
  TrainOptions other = tiny_options();
  other.n_layers = 2;
  Trainer u(text, other);
  try {
    u.resume(path);
    ADD_FAILURE() << "no error";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("config mismatch"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("n_layers = 1"), std::string::npos) << e.what();
  }
  Trainer v(text + "\u00e9", tiny_options());
  EXPECT_THROW(v.resume(path), std::invalid_argument);
  // Weights only (what `attn generate` also accepts) is not enough to resume.
  attn::io::write_safetensors(path, t.model().state_dict(), t.metadata());
  EXPECT_THROW(Trainer(text, tiny_options()).resume(path), std::invalid_argument);
  std::filesystem::remove(path);
}

// Issue 46: a checkpoint whose counts are not counts ("iter": "-1" was
// accepted) is refused by name, escaped, before anything is copied.
TEST(Trainer, ResumeRefusesCountsThatAreNotCounts) {
  const std::string text = shakespeare(4000);
  const std::string path = attn::test::temp_path("counts.safetensors");
  Trainer t(text, tiny_options());
  t.save(path);
  const attn::io::SafetensorsFile good = attn::io::read_safetensors(path);
  const std::vector<std::tuple<std::string, std::string, std::string>> cases = {
      {"iter", "-1", "metadata \"iter\" = \"-1\" is not an iteration count"},
      {"optim_step", "-1", "metadata \"optim_step\" = \"-1\" is not an iteration count"},
      {"iter", " 5", "metadata \"iter\" = \" 5\" is not an iteration count"},
      {"iter", "1e3", "is not an iteration count"},
      {"iter", "99999999999999999999", "is not an iteration count"},
      {"iter", "3\x1b[2J", "metadata \"iter\" = \"3\\x1B[2J\" is not"},
      {"last_eval_iter", "-2", "metadata \"last_eval_iter\" = \"-2\" is not an iteration count"},
      {"last_eval_iter", "7", "metadata \"last_eval_iter\" = 7 is past \"iter\" = 0"},
  };
  for (const auto& [key, value, needle] : cases) {
    auto meta = good.metadata;
    meta[key] = value;
    attn::io::write_safetensors(path, good.tensors, meta);
    Trainer u(text, tiny_options());
    try {
      u.resume(path);
      ADD_FAILURE() << key << " = " << value << " accepted";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
    EXPECT_EQ(u.iter(), 0);
  }
  std::filesystem::remove(path);
}

// Issue 46: a character vocabulary with an entry twice (which generate
// accepted, decoding two ids as one character) is refused by name.
TEST(Trainer, CheckpointWithARepeatedCharacterIsRefused) {
  const std::string dir = attn::test::temp_path("dup_vocab");
  std::filesystem::create_directories(dir);
  const std::string path = dir + "/checkpoint.safetensors";
  Trainer t(shakespeare(4000), tiny_options());
  t.save(path);
  attn::io::SafetensorsFile file = attn::io::read_safetensors(path);
  auto vocab = nlohmann::json::parse(file.metadata.at("vocab"));
  ASSERT_GT(vocab.size(), 5u);
  vocab[5] = vocab[2];
  file.metadata["vocab"] = vocab.dump();
  attn::io::write_safetensors(path, file.tensors, file.metadata);
  std::unique_ptr<attn::nn::GPTModel> model;
  try {
    (void)attn::nn::load_checkpoint(dir, model);
    ADD_FAILURE() << "a repeated character was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("vocab entry 5 (" + vocab[2].dump() + ") repeats entry 2"),
              std::string::npos)
        << e.what();
  }
  std::filesystem::remove_all(dir);
}

// ---- learning ------------------------------------------------------------------------------

// A small model on the first 200,000 characters of tinyshakespeare: 500 steps
// bring the validation loss from ln(vocab) ≈ 4.2 to below 2.45 (2.31 measured:
// about bigram level) in about 2 s. One thread: a model this small loses more to
// OpenMP's barriers than it gains, badly so on a loaded machine (30 s allowed).
struct TinyRun {
  double before, after, seconds;
};
TinyRun train_tiny_shakespeare(const std::string& dtype) {
  TrainOptions o;
  o.n_layers = 1;
  o.n_heads = 2;
  o.emb_dim = 32;
  o.context_length = 32;
  o.batch_size = 16;
  o.max_iters = 500;
  o.lr = 1e-2;
  o.min_lr = 1e-4;
  o.warmup_iters = 20;
  o.eval_iters = 10;
  o.seed = 1337;
  o.dtype = dtype;
  const int threads = omp_get_max_threads(), blas_threads = attn::gemm::blas_threads();
  omp_set_num_threads(1);
  attn::gemm::set_blas_threads(1);
  const auto start = std::chrono::steady_clock::now();
  Trainer t(shakespeare(200000), o);
  TinyRun r{};
  r.before = t.evaluate().val_loss;
  while (t.iter() < o.max_iters) t.step();
  r.after = t.evaluate().val_loss;
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  omp_set_num_threads(threads);
  attn::gemm::set_blas_threads(blas_threads);
  std::cout << "tiny model, " << dtype << ": val loss " << r.before << " -> " << r.after << " in "
            << r.seconds << " s\n";
  return r;
}

TEST(Trainer, LearnsTinyShakespeare) {
  const TinyRun r = train_tiny_shakespeare("float32");
  EXPECT_GT(r.before, 3.9);
  EXPECT_LT(r.after, 2.45);
  EXPECT_LT(r.seconds, 30.0);
}

// Mixed precision (--dtype bfloat16) learns as well: the same run in bf16
// ends within 0.02 of fp32's validation loss (seen: 2.3077 against 2.3078).
TEST(Trainer, LearnsTinyShakespeareInBf16) {
  const TinyRun f32 = train_tiny_shakespeare("float32");
  const TinyRun b16 = train_tiny_shakespeare("bfloat16");
  EXPECT_LT(b16.after, 2.45);
  EXPECT_NEAR(b16.after, f32.after, 0.02);
  EXPECT_NE(b16.after, f32.after) << "bf16 gave the fp32 bits";
}

// ---- the CLI -------------------------------------------------------------------------------

#ifdef ATTN_CLI_PATH
// Starts `attn train <args>` with stdout and stderr to /dev/null; returns its pid.
pid_t spawn_train(const std::vector<std::string>& args) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    std::vector<std::string> all = {ATTN_CLI_PATH, "train"};
    all.insert(all.end(), args.begin(), args.end());
    std::vector<char*> argv;
    for (auto& a : all) argv.push_back(a.data());
    argv.push_back(nullptr);
    std::FILE* null = std::freopen("/dev/null", "w", stdout);
    (void)null;
    ::execv(ATTN_CLI_PATH, argv.data());
    ::_exit(127);
  }
  return pid;
}

// Waits (up to 60 s) until path exists.
bool wait_for(const std::string& path) {
  for (int i = 0; i < 6000; ++i) {
    if (std::filesystem::exists(path)) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
}

std::vector<std::string> metric_losses(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& line : attn::test::lines_of(attn::test::read_text(dir + "/metrics.jsonl"))) {
    const auto j = nlohmann::json::parse(line);
    out.push_back(j.at("iter").dump() + " " + j.at("train_loss").dump() + " " + j.at("val_loss").dump());
  }
  return out;
}
#endif

const std::string kCliModel =
    "--n-layers 1 --n-heads 2 --emb-dim 16 --context-length 16 --batch-size 4 --warmup-iters 5 "
    "--eval-interval 25 --eval-iters 2 --seed 3";

// --tokenizer gpt2 leaves the folder in Hugging Face's layout beside the
// checkpoint: the same weights (logits equal), GPT-2's vocabulary files, and
// `attn generate --model` reads it.
TEST(TrainCli, Gpt2RunWritesAHuggingFaceDirectory) {
  ATTN_REQUIRE_CLI();
  const std::string dir = attn::test::temp_path("gpt2run");
  const auto r = attn::test::run_cli(
      "train --text '" + data_path("the-verdict.txt") + "' --out '" + dir +
      "' --tokenizer gpt2 --context-length 32 --batch-size 4 --n-layers 1 --n-heads 2 --emb-dim 16 "
      "--epochs 1 --eval-interval 20 --eval-iters 2 --threads 1");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("GPT-2 BPE"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("36 training batches per epoch"), std::string::npos) << r.out;
  const auto ckpt = attn::io::read_safetensors(dir + "/checkpoint.safetensors");
  EXPECT_EQ(ckpt.metadata.at("tokenizer"), "gpt2");
  EXPECT_EQ(ckpt.metadata.at("iter"), "36");
  EXPECT_EQ(attn::test::read_text(dir + "/vocab.json"),
            attn::test::read_text(data_path("gpt2/encoder.json")));
  EXPECT_EQ(attn::test::read_text(dir + "/merges.txt"), attn::test::read_text(data_path("gpt2/vocab.bpe")));

  std::unique_ptr<attn::nn::GPTModel> from_hf, from_ckpt;
  const attn::io::HfGpt2Info info = attn::io::load_hf_gpt2(dir, from_hf);
  EXPECT_TRUE(info.lm_head_stored);  // the book's untied output head
  (void)attn::nn::load_checkpoint(dir, from_ckpt);
  const attn::Tensor ids = attn::Tensor::from_int64({1, 5}, {464, 3290, 286, 262, 1110});
  const attn::Tensor a = from_hf->forward(ids), b = from_ckpt->forward(ids);
  ASSERT_EQ(a.shape(), b.shape());
  for (int64_t i = 0; i < a.numel(); ++i) ASSERT_EQ(a[i], b[i]) << i;

  const auto gen = attn::test::run_cli("generate --model '" + dir +
                                       "' --prompt 'Every effort moves you' --max-new-tokens 3 --greedy "
                                       "--print-ids");
  ASSERT_EQ(gen.exit_code, 0) << gen.err;
  EXPECT_EQ(gen.out.rfind("6109 3626 6100 345", 0), 0u) << gen.out;  // the prompt's GPT-2 ids first
  std::filesystem::remove_all(dir);
}

TEST(TrainCli, WritesMetricsAndCheckpoint) {
  ATTN_REQUIRE_CLI();
  const std::string text = attn::test::temp_path("text.txt"), dir = attn::test::temp_path("run");
  write_file(text, shakespeare(5000));
  const auto r = attn::test::run_cli("train --text '" + text + "' --out '" + dir + "' " + kCliModel +
                                     " --max-iters 50 --threads 1");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto lines = attn::test::lines_of(attn::test::read_text(dir + "/metrics.jsonl"));
  ASSERT_EQ(lines.size(), 3u);  // iterations 0, 25, 50
  const auto last = nlohmann::json::parse(lines.back());
  EXPECT_EQ(last.at("iter"), 50);
  for (const char* key : {"train_loss", "val_loss", "ms_per_iter", "tokens_per_s"})
    EXPECT_TRUE(last.at(key).is_number()) << key;
  EXPECT_GT(last.at("tokens_per_s").get<double>(), 0.0);
  const auto file = attn::io::read_safetensors(dir + "/checkpoint.safetensors");
  EXPECT_EQ(file.metadata.at("format"), "attn-checkpoint-1");
  EXPECT_EQ(file.metadata.at("iter"), "50");
  EXPECT_EQ(file.metadata.at("optim_step"), "50");
  const auto cfg = nlohmann::json::parse(file.metadata.at("config"));
  EXPECT_EQ(cfg.at("n_layers"), 1);
  EXPECT_EQ(cfg.at("vocab_size"), nlohmann::json::parse(file.metadata.at("vocab")).size());
  bool has_moment = false;
  for (const auto& [name, t] : file.tensors) has_moment |= name == "optim.tok_emb.weight.exp_avg_sq";
  EXPECT_TRUE(has_moment);
  // The loss curve of the run, drawn at the end (the chart itself is checked
  // pixel by pixel in test_line_chart.cpp).
  const std::string svg = attn::test::read_text(dir + "/loss.svg");
  EXPECT_NE(svg.find("<svg"), std::string::npos);
  EXPECT_NE(svg.find("width=\"720\""), std::string::npos) << svg.substr(0, 300);
  EXPECT_NE(r.out.find("loss curve " + dir + "/loss.svg"), std::string::npos) << r.out;
  // A second run into the same folder without --resume is refused.
  const auto again = attn::test::run_cli("train --text '" + text + "' --out '" + dir + "' " + kCliModel);
  EXPECT_EQ(again.exit_code, 1);
  EXPECT_NE(again.err.find("already holds a checkpoint"), std::string::npos) << again.err;
  std::filesystem::remove_all(dir);
}

TEST(TrainCli, SigintThenResumeEqualsAnUninterruptedRun) {
  ATTN_REQUIRE_CLI();
#ifdef ATTN_CLI_PATH
  const std::string text = attn::test::temp_path("text.txt");
  write_file(text, shakespeare(20000));
  const std::string straight = attn::test::temp_path("straight"), split = attn::test::temp_path("split");
  // Long enough that SIGINT, 100 ms after the first evaluation, lands mid-run
  // however fast the machine (a step of this model takes well under a millisecond).
  const std::string iters = "4000";
  auto args = [&](const std::string& dir) {
    std::vector<std::string> a = {"--text", text, "--out", dir, "--max-iters", iters};
    std::istringstream in(kCliModel);
    for (std::string w; in >> w;) a.push_back(w);
    const auto at = std::find(a.begin(), a.end(), "--eval-interval");
    *(at + 1) = "500";  // kCliModel's 25 would make 161 evaluations
    return a;
  };
  int status = 0;
  pid_t pid = spawn_train(args(straight));
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);

  pid = spawn_train(args(split));
  ASSERT_TRUE(wait_for(split + "/metrics.jsonl"));  // the handler is installed before the first evaluation
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  ::kill(pid, SIGINT);
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status)) << "killed by the signal instead of stopping";
  EXPECT_EQ(WEXITSTATUS(status), 130);
  const auto ckpt = attn::io::read_safetensors(split + "/checkpoint.safetensors");
  const int64_t stopped = std::stoll(ckpt.metadata.at("iter"));
  EXPECT_GT(stopped, 0);
  EXPECT_LT(stopped, 4000) << "the run finished before SIGINT; make it longer";

  const auto r = attn::test::run_cli("train --text '" + text + "' --out '" + split + "' --resume");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(metric_losses(split), metric_losses(straight));
  EXPECT_EQ(metric_losses(straight).size(), 9u);  // 0, 500, ..., 4000
  std::filesystem::remove_all(straight);
  std::filesystem::remove_all(split);
#endif
}

TEST(TrainCli, SigkillLeavesALoadableCheckpoint) {
  ATTN_REQUIRE_CLI();
#ifdef ATTN_CLI_PATH
  const std::string text = attn::test::temp_path("text.txt");
  write_file(text, shakespeare(20000));
  std::mt19937 rng(static_cast<unsigned>(std::random_device{}()));
  for (int round = 0; round < 3; ++round) {
    const std::string dir = attn::test::temp_path("killed");
    std::vector<std::string> a = {"--text", text, "--out", dir, "--max-iters", "100000", "--eval-interval", "3",
                                  "--eval-iters", "1"};
    std::istringstream in("--n-layers 1 --n-heads 2 --emb-dim 16 --context-length 16 --batch-size 4");
    for (std::string w; in >> w;) a.push_back(w);
    const pid_t pid = spawn_train(a);
    ASSERT_TRUE(wait_for(dir + "/metrics.jsonl"));
    std::this_thread::sleep_for(std::chrono::milliseconds(std::uniform_int_distribution<int>(0, 400)(rng)));
    ::kill(pid, SIGKILL);
    int status = 0;
    ASSERT_EQ(::waitpid(pid, &status, 0), pid);
    ASSERT_TRUE(WIFSIGNALED(status));
    const auto file = attn::io::read_safetensors(dir + "/checkpoint.safetensors");
    EXPECT_EQ(file.metadata.at("format"), "attn-checkpoint-1");
    // It resumes: a few more iterations from where it was.
    const int64_t at = std::stoll(file.metadata.at("iter"));
    const auto r = attn::test::run_cli("train --text '" + text + "' --out '" + dir + "' --resume --max-iters " +
                                       std::to_string(at + 3));
    EXPECT_EQ(r.exit_code, 0) << r.err;
    std::filesystem::remove_all(dir);
  }
#endif
}

TEST(TrainCli, BadInputIsOneLineAndNonZero) {
  ATTN_REQUIRE_CLI();
  const std::string dir = attn::test::temp_path("bad");
  const std::string good = attn::test::temp_path("good.txt"), empty = attn::test::temp_path("empty.txt"),
                    invalid = attn::test::temp_path("invalid.txt"), shorter = attn::test::temp_path("short.txt");
  write_file(good, shakespeare(3000));
  write_file(empty, "");
  write_file(invalid, "To be\xff or not");
  write_file(shorter, shakespeare(100));
  const std::string model = " --n-layers 1 --emb-dim 16 --context-length 16 --max-iters 2 ";
  struct Case {
    std::string args;
    int code;
    std::string needle;
  };
  const std::vector<Case> cases = {
      {"--text /nonexistent/x.txt --out '" + dir + "'" + model, 1, "no such file"},
      {"--text '" + empty + "' --out '" + dir + "'" + model, 1, "empty"},
      {"--text '" + invalid + "' --out '" + dir + "'" + model, 1, "invalid UTF-8 at byte offset 5"},
      {"--text '" + shorter + "' --out '" + dir + "'" + model, 1, "10 validation tokens"},
      {"--text '" + good + "' --out '" + dir + "'" + model + "--n-heads 3", 2,
       "--n-heads 3 must divide --emb-dim 16"},
      {"--text '" + good + "' --out '" + dir + "'" + model + "--batch-size 0", 2,
       "--batch-size: must be a whole number in 1..65536, got '0'"},
      {"--text '" + good + "' --out '" + dir + "'" + model + "--lr -1", 2, "--lr must be > 0"},
      {"--text '" + good + "' --out '" + dir + "'" + model + "--threads -2", 2,
       "--threads: must be a whole number in 1..4096, got '-2'"},
      {"--text '" + good + "' --out '" + good + "/sub'" + model, 1, "--out"},
      {"--text '" + good + "' --out '" + dir + "'" + model + "--resume", 1, "no checkpoint"},
  };
  for (const Case& c : cases) {
    const auto r = attn::test::run_cli("train " + c.args);
    EXPECT_EQ(r.exit_code, c.code) << c.args << "\n" << r.err;
    EXPECT_EQ(attn::test::lines_of(r.err).size(), 1u) << r.err;
    EXPECT_NE(r.err.find(c.needle), std::string::npos) << c.needle << " not in: " << r.err;
  }
  // --resume with a different model: config mismatch.
  auto r = attn::test::run_cli("train --text '" + good + "' --out '" + dir + "'" + model);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  r = attn::test::run_cli("train --text '" + good + "' --out '" + dir + "' --resume --n-layers 2");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("config mismatch"), std::string::npos) << r.err;
  EXPECT_EQ(attn::test::lines_of(r.err).size(), 1u) << r.err;
  std::filesystem::remove_all(dir);
}

// Issue 46, numbers at the edges: every size flag has an upper bound and the
// products of sizes are checked, before anything is read, allocated or
// created (no --out folder is left behind); a seed of 2^64 is refused, not
// capped; a GPT config of 1e8 layers is refused before its blocks are built.
TEST(TrainCli, SizesAtTheEdgesAreRefusedAsParsed) {
  ATTN_REQUIRE_CLI();
  namespace fs = std::filesystem;
  const std::string dir = attn::test::temp_path("edges"), good = attn::test::temp_path("good.txt");
  fs::remove_all(dir);
  write_file(good, shakespeare(3000));
  const std::string base = "train --text '" + good + "' --out '" + dir + "' ";
  // An integer flag's text is read as a whole number in the flag's range
  // (attn/train_flags.h) as it is parsed: the message names the text as typed
  // (escaped) and the range, whatever the text (past int64 it used to name
  // int64's largest value, the number CLI11 had made of it). A needle starting
  // "attn: " is the whole of stderr.
  const auto refused = [](const std::string& flag, const std::string& range,
                          const std::string& typed) {
    return "attn: train: " + flag + ": must be a whole number in " + range + ", got '" + typed +
           "'";
  };
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"--n-layers 2147483648", refused("--n-layers", "1..1024", "2147483648")},
      {"--batch-size 2147483648", refused("--batch-size", "1..65536", "2147483648")},
      {"--grad-accum-steps 2147483648", refused("--grad-accum-steps", "1..65536", "2147483648")},
      {"--epochs 1099511627776", refused("--epochs", "0..1048576", "1099511627776")},
      {"--warmup-iters 9223372036854775807",
       refused("--warmup-iters", "0..1099511627776", "9223372036854775807")},
      {"--latent-dim 9223372036854775807",
       refused("--latent-dim", "0..65536", "9223372036854775807")},
      {"--context-length 4194304", refused("--context-length", "1..1048576", "4194304")},
      // Past int64, past uint64, negative, below int64, and what CLI11 would have read
      // another way (C's hex and octal prefixes, a sign, spaces, a float).
      {"--epochs 9223372036854775808", refused("--epochs", "0..1048576", "9223372036854775808")},
      {"--epochs 18446744073709551616", refused("--epochs", "0..1048576", "18446744073709551616")},
      {"--epochs 99999999999999999999", refused("--epochs", "0..1048576", "99999999999999999999")},
      {"--epochs -1", refused("--epochs", "0..1048576", "-1")},
      {"--epochs -9223372036854775809", refused("--epochs", "0..1048576", "-9223372036854775809")},
      {"--max-iters 9223372036854775808",
       refused("--max-iters", "0..1099511627776", "9223372036854775808")},
      {"--n-heads 0x10", refused("--n-heads", "1..4096", "0x10")},
      {"--eval-iters +5", refused("--eval-iters", "1..1048576", "+5")},
      {"--eval-interval ' 5'", refused("--eval-interval", "1..1099511627776", " 5")},
      {"--stride 1e3", refused("--stride", "0..1048576", "1e3")},
      {"--stride ''", refused("--stride", "0..1048576", "")},
      {"--emb-dim abc", refused("--emb-dim", "1..65536", "abc")},
      {"--sliding-window-stride -2", refused("--sliding-window-stride", "-1..1048576", "-2")},
      {"--head-dim \"$(printf '8\\033[2J')\"", refused("--head-dim", "0..4096", "8\\x1B[2J")},
      {"--ffn-dim \"$(printf '8\\342\\200\\256')\"",
       refused("--ffn-dim", "0..262144", "8\\u{202E}")},
      {"--n-kv-groups \"$(printf '\\377')\"", refused("--n-kv-groups", "0..4096", "\\xFF")},
      {"--batch-size 65536 --context-length 1024",
       "--batch-size 65536 x --context-length 1024 = 67108864 tokens per micro-batch, more than "
       "16777216"},
      {"--n-layers 1024 --emb-dim 65536 --n-heads 1", "more than attn trains (68719476736)"},
      {"--seed 18446744073709551616",
       refused("--seed", "0..18446744073709551615", "18446744073709551616")},
      {"--seed 99999999999999999999999",
       refused("--seed", "0..18446744073709551615", "99999999999999999999999")},
      {"--seed -1", refused("--seed", "0..18446744073709551615", "-1")},
      {"--seed 0x10", refused("--seed", "0..18446744073709551615", "0x10")},
  };
  for (const auto& [args, needle] : cases) {
    const auto r = attn::test::run_cli_capped(base + args);  // 4 GiB: a failed bound fails here
    EXPECT_EQ(r.exit_code, 2) << args << "\n" << r.err;
    EXPECT_EQ(attn::test::lines_of(r.err).size(), 1u) << args << "\n" << r.err;
    if (needle.rfind("attn: ", 0) == 0) {
      EXPECT_EQ(r.err, needle + "\n") << args;
    } else {
      EXPECT_NE(r.err.find(needle), std::string::npos) << needle << " not in: " << r.err;
    }
    EXPECT_FALSE(fs::exists(dir)) << args << " left --out behind";
  }
  // The largest seed is a seed, and what CLI11 read as octal is decimal: --max-iters 010
  // and --eval-interval 010 are 10 steps, evaluated at 0 and 10 (CLI11 made them 8).
  const auto r = attn::test::run_cli(
      base +
      "--seed 18446744073709551615 --n-layers 1 --emb-dim 16 --n-heads 2 --context-length 16 "
      "--max-iters 010 --eval-interval 010 --eval-iters 1 --threads 1 --quiet");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  const std::string metrics = attn::test::read_text(dir + "/metrics.jsonl");
  EXPECT_NE(metrics.find("{\"iter\":10,"), std::string::npos) << metrics;
  EXPECT_EQ(metrics.find("{\"iter\":8,"), std::string::npos) << metrics;
  fs::remove_all(dir);

  // generate: the benchmark's random prompt and the new tokens are bounded too.
  for (const auto& [args, needle] : std::vector<std::pair<std::string, std::string>>{
           {"--config 124m --benchmark --prompt-tokens 2147483648",
            "--prompt-tokens: must be a whole number in 1..1048576, got '2147483648'"},
           {"--config 124m --benchmark --max-new-tokens 9223372036854775808",
            "--max-new-tokens: must be a whole number in 0..1048576, got '9223372036854775808'"},
           {"--config 124m --benchmark --seed 18446744073709551616",
            "--seed: must be a whole number in 0..18446744073709551615, got "
            "'18446744073709551616'"}}) {
    const auto g = attn::test::run_cli_capped("generate " + args);
    EXPECT_EQ(g.exit_code, 2) << args << "\n" << g.err;
    EXPECT_EQ(attn::test::lines_of(g.err).size(), 1u) << g.err;
    EXPECT_NE(g.err.find(needle), std::string::npos) << needle << " not in: " << g.err;
  }

  // A checkpoint's or GPT-2 config's layer count, before any block is built.
  const std::string cfg =
      R"({"vocab_size": 65, "context_length": 16, "emb_dim": 16, "n_heads": 2, "n_layers": 100000000, "drop_rate": 0.0, "qkv_bias": false})";
  try {
    (void)attn::nn::config_from_json(cfg, "ckpt");
    ADD_FAILURE() << "accepted n_layers 1e8";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("\"n_layers\" must be at most 4096, got 100000000"),
              std::string::npos)
        << e.what();
  }
  try {
    (void)attn::io::parse_hf_gpt2_config(
        R"({"n_embd": 16, "n_layer": 100000000, "n_head": 2, "n_positions": 16, "vocab_size": 65})");
    ADD_FAILURE() << "accepted n_layer 1e8";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("\"n_layer\" must be at most 4096, got 100000000"),
              std::string::npos)
        << e.what();
  }
}

// Issue 46, paths are bytes: --data-shards and --out that are not UTF-8
// train (train_args and the shards' record in the checkpoint used to fail
// with nlohmann's type_error.316), and a run that cannot start leaves no
// empty --out folder behind.
TEST(TrainCli, PathsThatAreNotUtf8AndNoEmptyOutLeftBehind) {
  ATTN_REQUIRE_CLI();
  namespace fs = std::filesystem;
  const std::string text = attn::test::temp_path("text.txt"),
                    shorter = attn::test::temp_path("short.txt");
  write_file(text, shakespeare(20000));
  write_file(shorter, shakespeare(100));
  const std::string out = attn::test::temp_path("never_made");
  auto r = attn::test::run_cli("train --text '" + shorter + "' --out '" + out +
                               "' --n-layers 1 --emb-dim 16");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("validation tokens"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(out)) << "an empty --out folder was left behind";

  const std::string shards = attn::test::temp_path("shards\xff\x1b"),
                    run = attn::test::temp_path("run\xfe\x1b[31m");
  r = attn::test::run_cli("prepare --tokenizer gpt2 '" + text + "' --out '" + shards + "'");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  r = attn::test::run_cli(
      "train --data-shards '" + shards + "' --out '" + run +
      "' --n-layers 1 --n-heads 2 --emb-dim 16 --context-length 16 --batch-size 2 "
      "--max-iters 2 --eval-interval 2 --eval-iters 1 --threads 1");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(fs::exists(run + "/checkpoint.safetensors"));
  // Every line, the --out path's echo among them, is valid UTF-8 without a control byte.
  for (const std::string& line : attn::test::lines_of(r.out)) {
    EXPECT_TRUE(attn::is_utf8(line)) << "bytes that are not UTF-8 in: " << attn::printable(line);
    EXPECT_EQ(std::count_if(line.begin(), line.end(),
                            [](char c) { return static_cast<unsigned char>(c) < 0x20; }),
              0)
        << "a raw control byte in: " << attn::printable(line);
  }
  fs::remove_all(shards);
  fs::remove_all(run);
}

// Issue 46, data lost: a run that diverges stops with one line and keeps its
// last finite checkpoint; generate refuses weights that are not finite;
// export refuses to write over a training run unless --force.
TEST(TrainCli, DivergedRunKeepsTheLastFiniteCheckpoint) {
  ATTN_REQUIRE_CLI();
#ifdef ATTN_CLI_PATH
  namespace fs = std::filesystem;
  const std::string text = attn::test::temp_path("text.txt"),
                    dir = attn::test::temp_path("diverge");
  write_file(text, shakespeare(5000));
  fs::remove_all(dir);
  auto r = attn::test::run_cli("train --text '" + text + "' --out '" + dir + "' " + kCliModel +
                               " --max-iters 25 --threads 1");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::string before = attn::test::read_text(dir + "/checkpoint.safetensors");
  r = attn::test::run_cli("train --text '" + text + "' --out '" + dir +
                          "' --resume --lr 1e30 --min-lr 1e29 --max-iters 100 --threads 1");
  EXPECT_EQ(r.exit_code, 1) << r.out;
  ASSERT_EQ(attn::test::lines_of(r.err).size(), 1u) << r.err;
  EXPECT_NE(r.err.find("diverged"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("keeps iteration 25"), std::string::npos) << r.err;
  EXPECT_EQ(attn::test::read_text(dir + "/checkpoint.safetensors"), before)
      << "the checkpoint of iteration 25 was replaced";

  // The same checkpoint with a NaN in a weight: generate says which and exits 1.
  attn::io::SafetensorsFile file = attn::io::read_safetensors(dir + "/checkpoint.safetensors");
  const std::string nan_dir = attn::test::temp_path("nan_model");
  fs::remove_all(nan_dir);
  fs::create_directories(nan_dir);
  for (auto& [name, t] : file.tensors) {
    if (name == "tok_emb.weight") t.data_ptr<float>()[3] = std::numeric_limits<float>::quiet_NaN();
  }
  attn::io::write_safetensors(nan_dir + "/checkpoint.safetensors", file.tensors, file.metadata);
  const auto gen = attn::test::run_cli("generate --model '" + nan_dir +
                                       "' --prompt 'To be' --max-new-tokens 3 --greedy");
  EXPECT_EQ(gen.exit_code, 1) << gen.out;
  EXPECT_EQ(gen.out, "");
  ASSERT_EQ(attn::test::lines_of(gen.err).size(), 1u) << gen.err;
  EXPECT_NE(gen.err.find("the weight 'tok_emb.weight' holds nan at index 3"), std::string::npos)
      << gen.err;
  const auto ok = attn::test::run_cli("generate --model '" + dir +
                                      "' --prompt 'To be' --max-new-tokens 3 --greedy");
  EXPECT_EQ(ok.exit_code, 0) << ok.err;

  // export onto the training run (or any folder with a model) is refused
  // unless --force; the run's files are untouched.
  const std::string exported = attn::test::temp_path("exported");
  fs::remove_all(exported);
  auto e =
      attn::test::run_cli("export --model '" + nan_dir + "' --format book --out '" + dir + "'");
  EXPECT_EQ(e.exit_code, 1);
  ASSERT_EQ(attn::test::lines_of(e.err).size(), 1u) << e.err;
  EXPECT_NE(e.err.find("--out '" + dir + "' already holds checkpoint.safetensors"),
            std::string::npos)
      << e.err;
  EXPECT_NE(e.err.find("--force"), std::string::npos) << e.err;
  EXPECT_EQ(attn::test::read_text(dir + "/checkpoint.safetensors"), before);
  e = attn::test::run_cli("export --model '" + dir + "' --format book --out '" + exported + "'");
  EXPECT_EQ(e.exit_code, 0) << e.err;
  e = attn::test::run_cli("export --model '" + dir + "' --format book --out '" + exported + "'");
  EXPECT_EQ(e.exit_code, 1) << "a second export over the first";
  e = attn::test::run_cli("export --model '" + dir + "' --format book --out '" + exported +
                          "' --force");
  EXPECT_EQ(e.exit_code, 0) << e.err;
  fs::remove_all(dir);
  fs::remove_all(nan_dir);
  fs::remove_all(exported);
#endif
}

// Issue 46: a kill between the metrics write and the checkpoint write, and
// the temporaries a kill leaves. metrics.jsonl is written first, so the state
// a kill can leave is a line past the checkpoint: --resume drops it and
// writes it again, every evaluation once. Temporaries of processes that no
// longer run are removed at the next start; a live process's are not.
TEST(TrainCli, KilledRunLosesNoEvaluationAndLeavesNoTemporaries) {
  ATTN_REQUIRE_CLI();
#ifdef ATTN_CLI_PATH
  namespace fs = std::filesystem;
  const std::string text = attn::test::temp_path("text.txt"),
                    dir = attn::test::temp_path("killed2");
  write_file(text, shakespeare(5000));
  fs::remove_all(dir);
  fs::create_directories(dir);
  const std::string stale = dir + "/.checkpoint.safetensors.tmp.999999999.0";  // > any pid_max
  const std::string live = dir + "/.metrics.jsonl.tmp." + std::to_string(::getpid()) + ".0";
  const std::string other = dir + "/.notes.tmp.x.0";
  for (const std::string& p : {stale, live, other}) write_file(p, "partial");
  const std::string common =
      "train --text '" + text + "' --out '" + dir + "' " + kCliModel + " --threads 1 --max-iters ";
  auto r = attn::test::run_cli(common + "50");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_FALSE(fs::exists(stale));
  EXPECT_NE(r.out.find("removed '" + stale + "', left by an earlier run"), std::string::npos)
      << r.out;
  EXPECT_TRUE(fs::exists(live)) << "the temporary of a running process was removed";
  EXPECT_TRUE(fs::exists(other)) << "a file that is not attn's temporary was removed";
  const std::string at50 = attn::test::read_text(dir + "/checkpoint.safetensors");
  r = attn::test::run_cli("train --text '" + text + "' --out '" + dir +
                          "' --resume --max-iters 75");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto whole = metric_losses(dir);
  ASSERT_EQ(whole.size(), 4u);  // 0, 25, 50, 75
  // The kill: metrics.jsonl has iteration 75, the checkpoint still 50.
  write_file(dir + "/checkpoint.safetensors", at50);
  r = attn::test::run_cli("train --text '" + text + "' --out '" + dir +
                          "' --resume --max-iters 75");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(metric_losses(dir), whole);
  fs::remove_all(dir);
#endif
}

}  // namespace

// --grad-accum-steps K with batch B takes the same windows as K = 1 with batch
// K·B (the offsets are drawn in micro-batch order from the one generator), so
// the step losses and weights agree within float32 rounding; K = 1 is the
// plain step, bit for bit (attn/train.h: "Global batches").
TEST(Trainer, GradAccumMatchesTheBiggerBatch) {
  const std::string text = shakespeare(4000);
  TrainOptions big = tiny_options();
  big.batch_size = 4;
  TrainOptions accum = big;
  accum.batch_size = 2;
  accum.grad_accum_steps = 2;
  Trainer a(text, big), b(text, accum);
  EXPECT_EQ(a.tokens_per_step(), b.tokens_per_step());
  EXPECT_EQ(b.micro_batches(), 2);
  for (int s = 0; s < 6; ++s) {
    const float la = a.step(), lb = b.step();
    EXPECT_NEAR(la, lb, 1e-5) << "step " << s;
  }
  const std::vector<float> wa = all_weights(a), wb = all_weights(b);
  ASSERT_EQ(wa.size(), wb.size());
  float worst = 0.0f;
  for (size_t i = 0; i < wa.size(); ++i) worst = std::max(worst, std::abs(wa[i] - wb[i]));
  EXPECT_LT(worst, 1e-5f);
}

TEST(Trainer, GradAccumWithDropoutIsReproducibleAndSeededPerMicroBatch) {
  const std::string text = shakespeare(4000);
  TrainOptions o = tiny_options();
  o.batch_size = 2;
  o.grad_accum_steps = 3;
  o.drop_rate = 0.2;
  Trainer a(text, o), b(text, o);
  for (int s = 0; s < 4; ++s) EXPECT_EQ(a.step(), b.step()) << "step " << s;
  using attn::train::micro_batch_seed;
  EXPECT_NE(micro_batch_seed(7, 0, 0), micro_batch_seed(7, 0, 1));
  EXPECT_NE(micro_batch_seed(7, 0, 1), micro_batch_seed(7, 1, 0));
  EXPECT_EQ(micro_batch_seed(7, 3, 2), micro_batch_seed(7, 3, 2));
}

TEST(Trainer, ResumeRefusesAnotherGlobalBatch) {
  const std::string text = shakespeare(4000);
  TrainOptions o = tiny_options();
  o.grad_accum_steps = 2;
  const std::string path = attn::test::temp_path("accum.safetensors");
  {
    Trainer t(text, o);
    t.step();
    t.save(path);
  }
  TrainOptions other = o;
  other.grad_accum_steps = 3;
  Trainer u(text, other);
  try {
    u.resume(path);
    FAIL() << "resumed with another global batch";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("2 micro-batches"), std::string::npos) << e.what();
  }
  Trainer same(text, o);
  same.resume(path);
  EXPECT_EQ(same.iter(), 1);
}
