// The book's chapter-5 recipe (attn/train_book.h) and `attn train --recipe
// book-ch5`: the recipe's settings, train_model_simple's schedule (evaluation
// after every eval_freq-th step, tokens seen, a sample per epoch), its prints,
// its errors, and the CLI's flags, errors and output files on a tiny model.
// The numbers against PyTorch are tests/torch/test_ch5_training_torch.cpp's.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <string>
#include <vector>

#include "attn/safetensors.h"
#include "attn/train.h"
#include "attn/train_book.h"
#include "attn/utf8.h"
#include "cli.h"

namespace {

using attn::train::BookEvaluation;
using attn::train::TrainOptions;

std::string data_path(const std::string& name) { return std::string(ATTN_DATA_DIR) + "/" + name; }

// The Verdict's first 3,000 characters: about 700 GPT-2 tokens.
std::string verdict_start() { return attn::test::read_text(data_path("the-verdict.txt")).substr(0, 3000); }

// The recipe on a tiny model: windows of 32 every 32 tokens, batch 2 (10
// training batches per epoch of the text above), 2 epochs.
TrainOptions tiny_book_options() {
  TrainOptions o = attn::train::book_ch5_options();
  o.n_layers = 1;
  o.n_heads = 2;
  o.emb_dim = 16;
  o.context_length = 32;
  o.stride = 32;
  o.epochs = 2;
  o.eval_iters = 2;
  return o;
}

// Python's bytes.decode("utf-8", errors="replace"), case by case (expected
// values from Python 3.11): one U+FFFD per maximal ill-formed subpart.
TEST(Utf8Replacing, IsPythonsErrorsReplace) {
  const std::string r = "\xEF\xBF\xBD";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"ab\xE2\x82", "ab" + r},
      {"\xFF\x80" "a", r + r + "a"},
      {"\xE0\x80\x80", r + r + r},
      {"\xED\xA0\x80", r + r + r},
      {"\xF0\x9F\x98", r},
      {"\xF4\x90\x80\x80", r + r + r + r},
      {"\xC3\xA9\xC3", "\xC3\xA9" + r},
      {"a\xE2\x82\xAC" "b", "a\xE2\x82\xAC" "b"},
      {"\xC0\xAF", r + r},
      {"\xF0\x9F\x98\x80x\xE2x", "\xF0\x9F\x98\x80x" + r + "x"},
      {"", ""},
  };
  for (const auto& [in, want] : cases)
    EXPECT_EQ(attn::utf8_replacing_invalid(in), want) << attn::printable(in);
}

TEST(BookRecipe, OptionsAreTheBooks) {
  const TrainOptions o = attn::train::book_ch5_options();
  EXPECT_EQ(o.n_layers, 12);
  EXPECT_EQ(o.n_heads, 12);
  EXPECT_EQ(o.emb_dim, 768);
  EXPECT_EQ(o.context_length, 256);
  EXPECT_DOUBLE_EQ(o.drop_rate, 0.1);
  EXPECT_EQ(o.tokenizer, "gpt2");
  EXPECT_EQ(o.stride, 256);
  EXPECT_EQ(o.batch_size, 2);
  EXPECT_DOUBLE_EQ(o.lr, 4e-4);
  EXPECT_EQ(o.lr_schedule, "constant");
  EXPECT_DOUBLE_EQ(o.weight_decay, 0.1);
  EXPECT_EQ(o.decay, "all");
  EXPECT_DOUBLE_EQ(o.beta1, 0.9);
  EXPECT_DOUBLE_EQ(o.beta2, 0.999);
  EXPECT_DOUBLE_EQ(o.grad_clip, 0.0);
  EXPECT_EQ(o.epochs, 10);
  EXPECT_EQ(o.eval_interval, 5);
  EXPECT_EQ(o.eval_iters, 5);
  EXPECT_EQ(o.seed, 123u);
  EXPECT_TRUE(o.exact);
  EXPECT_NO_THROW(o.validate());
  EXPECT_EQ(TrainOptions::from_json(o.to_json()).to_json(), o.to_json());
}

TEST(BookRecipe, NewOptionsAreValidated) {
  auto message = [](auto change) {
    TrainOptions o = attn::train::book_ch5_options();
    change(o);
    try {
      o.validate();
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string("(no error)");
  };
  EXPECT_EQ(message([](TrainOptions& o) { o.lr_schedule = "linear"; }),
            "--lr-schedule must be cosine or constant, got 'linear'");
  EXPECT_EQ(message([](TrainOptions& o) { o.decay = "none"; }),
            "--decay must be matrices or all, got 'none'");
  EXPECT_EQ(message([](TrainOptions& o) { o.dtype = "bfloat16"; }),
            "--exact runs the float32 reference path; it cannot be combined with --dtype bfloat16");
}

// Python's f"{x:.3f}": correctly rounded from the double (2.0005 is a little above).
TEST(BookRecipe, EvaluationLineIsTheBooksFString) {
  EXPECT_EQ(attn::train::format_evaluation(BookEvaluation{1, 0, 9.78149, 9.9327, 512}),
            "Ep 1 (Step 000000): Train loss 9.781, Val loss 9.933");
  EXPECT_EQ(attn::train::format_evaluation(BookEvaluation{10, 85, 2.0005, 10.98758305, 44032}),
            "Ep 10 (Step 000085): Train loss 2.001, Val loss 10.988");
}

// train_model_simple: 2 epochs of 10 steps; evaluations after global steps 0,
// 5, 10, 15 (epochs 1, 1, 2, 2); tokens seen 64 per step; a sample per epoch of
// the start context's 4 ids and 50 more, printed without newlines; the same
// run twice gives the same numbers.
TEST(BookRecipe, TrainModelSimpleEvaluatesEveryFifthStepAndSamplesEachEpoch) {
  const std::string text = verdict_start();
  attn::train::Trainer trainer(text, tiny_book_options());
  ASSERT_EQ(trainer.train_loader()->batches(), 10);
  std::vector<int64_t> steps;
  std::vector<std::string> printed;
  attn::train::BookCallbacks cb;
  cb.on_step = [&](int64_t s, float loss, double ms) {
    steps.push_back(s);
    EXPECT_TRUE(std::isfinite(loss));
    EXPECT_GE(ms, 0.0);
  };
  cb.on_evaluation = [&](const BookEvaluation& e) { printed.push_back(format_evaluation(e)); };
  cb.on_sample = [&](const attn::train::BookSample& s) { printed.push_back(s.text); };
  const attn::train::BookHistory h = attn::train::train_model_simple(trainer, cb);
  EXPECT_FALSE(h.stopped);
  ASSERT_EQ(steps.size(), 20u);
  EXPECT_EQ(steps.front(), 0);
  EXPECT_EQ(steps.back(), 19);
  EXPECT_EQ(trainer.iter(), 20);
  EXPECT_DOUBLE_EQ(trainer.lr(), 4e-4);  // constant
  ASSERT_EQ(h.evaluations.size(), 4u);
  const int64_t want_steps[] = {0, 5, 10, 15}, want_epochs[] = {1, 1, 2, 2};
  for (size_t k = 0; k < 4; ++k) {
    EXPECT_EQ(h.evaluations[k].global_step, want_steps[k]);
    EXPECT_EQ(h.evaluations[k].epoch, want_epochs[k]);
    EXPECT_EQ(h.evaluations[k].tokens_seen, (want_steps[k] + 1) * 64);
    EXPECT_GT(h.evaluations[k].train_loss, 0.0);
    EXPECT_GT(h.evaluations[k].val_loss, 0.0);
  }
  // The loss falls from about ln(50257) = 10.8.
  EXPECT_GT(h.evaluations[0].train_loss, 10.0);
  EXPECT_LT(h.evaluations[3].train_loss, h.evaluations[0].train_loss);
  ASSERT_EQ(h.samples.size(), 2u);
  for (const auto& s : h.samples) {
    ASSERT_EQ(s.ids.size(), 54u);
    EXPECT_EQ(std::vector<int64_t>(s.ids.begin(), s.ids.begin() + 4),
              (std::vector<int64_t>{6109, 3626, 6100, 345}));
    EXPECT_EQ(s.text.rfind("Every effort moves you", 0), 0u) << s.text;
    EXPECT_EQ(s.text.find('\n'), std::string::npos) << s.text;
  }
  // The prints in train_model_simple's order: epoch 1's two evaluations, its sample, ...
  ASSERT_EQ(printed.size(), 6u);
  EXPECT_EQ(printed[0].rfind("Ep 1 (Step 000000): Train loss ", 0), 0u) << printed[0];
  EXPECT_EQ(printed[1].rfind("Ep 1 (Step 000005): Train loss ", 0), 0u) << printed[1];
  EXPECT_EQ(printed[2], h.samples[0].text);
  EXPECT_EQ(printed[3].rfind("Ep 2 (Step 000010): Train loss ", 0), 0u) << printed[3];
  EXPECT_EQ(printed[5], h.samples[1].text);

  attn::train::Trainer again(text, tiny_book_options());
  const attn::train::BookHistory h2 = attn::train::train_model_simple(again);
  ASSERT_EQ(h2.evaluations.size(), 4u);
  for (size_t k = 0; k < 4; ++k) {
    EXPECT_EQ(h2.evaluations[k].train_loss, h.evaluations[k].train_loss) << k;
    EXPECT_EQ(h2.evaluations[k].val_loss, h.evaluations[k].val_loss) << k;
  }
  EXPECT_EQ(h2.samples[1].ids, h.samples[1].ids);
}

TEST(BookRecipe, ShouldStopEndsTheLoopAfterTheStep) {
  attn::train::Trainer trainer(verdict_start(), tiny_book_options());
  attn::train::BookCallbacks cb;
  int64_t calls = 0;
  cb.should_stop = [&] { return ++calls == 3; };
  const auto h = attn::train::train_model_simple(trainer, cb);
  EXPECT_TRUE(h.stopped);
  EXPECT_EQ(trainer.iter(), 3);
  EXPECT_EQ(h.evaluations.size(), 1u);  // after step 0
  EXPECT_TRUE(h.samples.empty());
}

TEST(BookRecipe, TrainModelSimpleRefusesACharRunOrATrainedModel) {
  TrainOptions chars;
  chars.n_layers = 1;
  chars.n_heads = 2;
  chars.emb_dim = 16;
  chars.context_length = 16;
  attn::train::Trainer c(verdict_start(), chars);
  EXPECT_THROW(attn::train::train_model_simple(c), std::invalid_argument);
  attn::train::Trainer t(verdict_start(), tiny_book_options());
  t.step();
  try {
    attn::train::train_model_simple(t);
    ADD_FAILURE() << "no error";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("has already run 1 steps"), std::string::npos) << e.what();
  }
}

// ---- attn train --recipe book-ch5 ---------------------------------------------------------

void expect_one_line_error(const attn::test::CliResult& r, const std::string& needle) {
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.exit_code, -1) << "crashed";
  const auto lines = attn::test::lines_of(r.err);
  ASSERT_EQ(lines.size(), 1u) << r.err;
  EXPECT_NE(lines[0].find(needle), std::string::npos) << lines[0];
}

TEST(TrainBookCli, BadRecipeAndFlagsAreOneLineErrors) {
  ATTN_REQUIRE_CLI();
  const std::string text = attn::test::temp_path("book_text.txt");
  { std::ofstream(text) << verdict_start(); }
  const std::string out = attn::test::temp_path("book_bad");
  const std::string base = "train --text '" + text + "' --out '" + out + "' ";
  expect_one_line_error(attn::test::run_cli(base + "--recipe book-ch4"),
                        "--recipe must be book-ch5, got 'book-ch4'");
  expect_one_line_error(attn::test::run_cli(base + "--recipe book-ch5 --resume"),
                        "--resume cannot be combined with --recipe book-ch5");
  expect_one_line_error(attn::test::run_cli(base + "--recipe book-ch5 --tokenizer char"),
                        "--recipe book-ch5 needs --tokenizer gpt2 or hf and --epochs >= 1");
  expect_one_line_error(attn::test::run_cli(base + "--recipe book-ch5 --epochs 0"),
                        "--recipe book-ch5 needs --tokenizer gpt2 or hf and --epochs >= 1");
  expect_one_line_error(attn::test::run_cli(base + "--recipe book-ch5 --lr-schedule step"),
                        "--lr-schedule must be cosine or constant, got 'step'");
  expect_one_line_error(attn::test::run_cli(base + "--recipe book-ch5 --decay some"),
                        "--decay must be matrices or all, got 'some'");
  expect_one_line_error(attn::test::run_cli(base + "--recipe book-ch5 --dtype bfloat16"),
                        "--exact runs the float32 reference path");
  EXPECT_FALSE(std::filesystem::exists(out));
  std::remove(text.c_str());
}

// A tiny model through the recipe: the book's prints on stdout, metrics.jsonl
// (epoch, tokens seen), samples.jsonl, the checkpoint with the recipe's
// settings (the flags given overriding them), loss.svg; the losses those of
// train_model_simple in the library on the same options.
TEST(TrainBookCli, TinyRunWritesTheBooksPrintsAndFiles) {
  ATTN_REQUIRE_CLI();
  const std::string text = attn::test::temp_path("book_tiny.txt");
  { std::ofstream(text) << verdict_start(); }
  const std::string out = attn::test::temp_path("book_tiny_run");
  std::filesystem::remove_all(out);
  const auto r = attn::test::run_cli(
      "train --recipe book-ch5 --text '" + text + "' --out '" + out +
      "' --n-layers 1 --n-heads 2 --emb-dim 16 --context-length 32 --stride 32 --epochs 2 "
      "--eval-iters 2 --threads 1");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto lines = attn::test::lines_of(r.out);
  ASSERT_EQ(lines.size(), 8u) << r.out;  // header, 2 x (2 evaluations + sample), done
  EXPECT_EQ(lines[0].rfind("attn train --recipe book-ch5: ", 0), 0u) << lines[0];
  EXPECT_NE(lines[0].find("10 training batches per epoch"), std::string::npos) << lines[0];
  EXPECT_NE(lines[0].find("2 epochs = 20 steps"), std::string::npos) << lines[0];
  EXPECT_NE(lines[0].find("reference (PyTorch's dropout masks)"), std::string::npos) << lines[0];
  const std::regex eval_line(R"(Ep [12] \(Step 0000(00|05|10|15)\): Train loss \d+\.\d{3}, Val loss \d+\.\d{3})");
  for (int k : {1, 2, 4, 5}) EXPECT_TRUE(std::regex_match(lines[k], eval_line)) << lines[k];
  for (int k : {3, 6}) EXPECT_EQ(lines[k].rfind("Every effort moves you", 0), 0u) << lines[k];
  EXPECT_EQ(lines[7].rfind("done: 20 steps in ", 0), 0u) << lines[7];
  // The progress display's last line (stderr is not a terminal).
  EXPECT_NE(r.err.find("train: 20/20 steps (100%), "), std::string::npos) << r.err;

  const auto metrics = attn::test::lines_of(attn::test::read_text(out + "/metrics.jsonl"));
  ASSERT_EQ(metrics.size(), 4u);
  attn::train::Trainer trainer(verdict_start(), tiny_book_options());
  const auto h = attn::train::train_model_simple(trainer);
  for (size_t k = 0; k < 4; ++k) {
    const auto j = nlohmann::json::parse(metrics[k]);
    const BookEvaluation& e = h.evaluations[k];
    EXPECT_EQ(j.at("global_step"), e.global_step);
    EXPECT_EQ(j.at("iter"), e.global_step + 1);
    EXPECT_EQ(j.at("epoch"), e.epoch);
    EXPECT_EQ(j.at("tokens_seen"), e.tokens_seen);
    EXPECT_EQ(j.at("num_epochs"), 2);
    EXPECT_DOUBLE_EQ(j.at("lr").get<double>(), 4e-4);
    // One thread here, the default there: the same sums up to float rounding.
    EXPECT_NEAR(j.at("train_loss").get<double>(), e.train_loss, 1e-4);
    EXPECT_NEAR(j.at("val_loss").get<double>(), e.val_loss, 1e-4);
    EXPECT_EQ(lines[k < 2 ? k + 1 : k + 2], format_evaluation(BookEvaluation{
                                                e.epoch, e.global_step, j.at("train_loss"),
                                                j.at("val_loss"), e.tokens_seen}));
  }
  const auto samples = attn::test::lines_of(attn::test::read_text(out + "/samples.jsonl"));
  ASSERT_EQ(samples.size(), 2u);
  const auto s1 = nlohmann::json::parse(samples[1]);
  EXPECT_EQ(s1.at("epoch"), 2);
  EXPECT_EQ(s1.at("ids").size(), 54u);
  EXPECT_EQ(s1.at("text"), lines[6]);

  const auto header = attn::io::read_safetensors_header(out + "/checkpoint.safetensors");
  const TrainOptions saved = TrainOptions::from_json(header.metadata.at("train_args"));
  EXPECT_EQ(saved.lr_schedule, "constant");
  EXPECT_EQ(saved.decay, "all");
  EXPECT_TRUE(saved.exact);
  EXPECT_EQ(saved.emb_dim, 16);  // the flag given
  EXPECT_EQ(saved.seed, 123u);   // the recipe's
  EXPECT_EQ(header.metadata.at("iter"), "20");
  EXPECT_EQ(attn::test::read_text(out + "/loss.svg").rfind("<?xml", 0), 0u);
  std::filesystem::remove_all(out);
  std::remove(text.c_str());
}

}  // namespace
