// Training today's open models (attn/train.h with TrainOptions::arch and
// init_from) and writing them in the Hub layout (attn/hf_decoder.h's
// save_hf_decoder, `attn export`): a table of the three families built from
// scratch, each learning, resuming bit for bit and accumulating gradients as
// one bigger batch; fine-tuning the transformers fixtures; every fixture
// written back and read again into the same logits; GPT-2's vocabulary as a
// tokenizer.json; and the CLI.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "attn/bfloat16.h"
#include "attn/decoder.h"
#include "attn/hf_decoder.h"
#include "attn/hf_tokenizer.h"
#include "attn/safetensors.h"
#include "attn/tokenizer.h"
#include "attn/train.h"
#include "attn/train_book.h"
#include "cli.h"
#include "train_steps.h"

namespace attn::test {
namespace {

namespace fs = std::filesystem;
using train::Trainer;
using train::TrainOptions;

const std::string kFixtures = std::string(ATTN_TESTS_DIR) + "/fixtures/open_models";

std::string data_path(const std::string& name) { return std::string(ATTN_DATA_DIR) + "/" + name; }

std::string shakespeare(size_t n) {
  return read_text(data_path("tinyshakespeare.txt")).substr(0, n);
}

// A small decoder of `arch`: 2 layers, 4 heads over 2 key/value heads of 8.
TrainOptions tiny_decoder(const std::string& arch) {
  TrainOptions o;
  o.arch = arch;
  o.n_layers = 2;
  o.n_heads = 4;
  o.n_kv_groups = 2;
  o.emb_dim = 32;
  o.context_length = 16;
  o.batch_size = 4;
  o.max_iters = 30;
  o.warmup_iters = 5;
  o.eval_interval = 5;
  o.eval_iters = 2;
  o.lr = 3e-3;
  o.min_lr = 3e-4;
  o.seed = 11;
  if (arch != "llama3") {  // a window shorter than the context on every other layer
    o.sliding_window_size = 6;
    o.sliding_window_stride = 1;
  }
  return o;
}

class TrainDecoderArch : public ::testing::TestWithParam<const char*> {};

TEST_P(TrainDecoderArch, BuildsTheFamilyAndLearns) {
  TrainOptions o = tiny_decoder(GetParam());
  o.max_iters = 80;
  Trainer t(shakespeare(6000), o);
  ASSERT_TRUE(t.is_decoder());
  const nn::DecoderConfig& c = t.decoder().config();
  EXPECT_EQ(c.num_kv_heads, 2);
  EXPECT_EQ(c.head_dim, 8);
  EXPECT_EQ(c.intermediate_size, 96);  // 3 x emb
  EXPECT_EQ(c.qk_norm, std::string(GetParam()) != "llama3");
  EXPECT_EQ(c.sandwich_norms, std::string(GetParam()) == "gemma3");
  EXPECT_THROW(t.model(), std::logic_error);
  // transformers' init: the loss starts near ln(V).
  const double start = t.evaluate().val_loss;
  EXPECT_NEAR(start, std::log(static_cast<double>(t.vocab_size())), 0.3) << GetParam();
  while (t.iter() < t.options().max_iters) t.step();
  const double end = t.evaluate().val_loss;
  EXPECT_LT(end, start - 0.7) << GetParam();
  EXPECT_TRUE(std::isfinite(end));
}

// Mixed precision (--dtype bfloat16, as torch.autocast): the same run learns
// as well, and it really ran in bf16 (not the float32 bits).
TEST_P(TrainDecoderArch, LearnsInBf16AsInFloat32) {
  double end[2];
  for (int b = 0; b < 2; ++b) {
    TrainOptions o = tiny_decoder(GetParam());
    o.max_iters = 80;
    o.dtype = b ? "bfloat16" : "float32";
    Trainer t(shakespeare(6000), o);
    EXPECT_EQ(t.decoder().compute_dtype(), b ? DType::kBFloat16 : DType::kFloat32);
    while (t.iter() < t.options().max_iters) t.step();
    end[b] = t.evaluate().val_loss;
  }
  EXPECT_TRUE(std::isfinite(end[1]));
  EXPECT_NEAR(end[1], end[0], 0.05) << GetParam();
  EXPECT_NE(end[1], end[0]) << "bf16 gave the float32 bits";
  std::printf("[  BF16    ] %s: validation loss after 80 steps %.4f (float32 %.4f)\n", GetParam(),
              end[1], end[0]);
}

TEST_P(TrainDecoderArch, ResumeGivesBitIdenticalLosses) {
  const std::string text = shakespeare(4000);
  const TrainOptions o = tiny_decoder(GetParam());
  Trainer straight(text, o);
  const std::vector<double> all = run_losses(straight, 20);
  const std::string path = temp_path(std::string("decoder_resume_") + GetParam() + ".safetensors");
  std::vector<double> resumed;
  {
    Trainer first(text, o);
    resumed = run_losses(first, 10);
    first.save(path);
    const auto meta = io::read_safetensors_header(path).metadata;
    EXPECT_EQ(meta.at("model_type"), first.hub_config().model_type);
    // "config" is the decoder's config.json.
    EXPECT_EQ(io::parse_hf_decoder_config(meta.at("config")).model_type,
              first.hub_config().model_type);
  }
  Trainer second(text, o);
  second.resume(path);
  const std::vector<double> rest = run_losses(second, 20);
  resumed.insert(resumed.end(), rest.begin(), rest.end());
  ASSERT_EQ(all.size(), resumed.size());
  for (size_t i = 0; i < all.size(); ++i) EXPECT_EQ(all[i], resumed[i]) << "loss " << i;

  // Another size, another family or a GPT cannot take this checkpoint.
  TrainOptions wider = o;
  wider.ffn_dim = 64;
  Trainer other(text, wider);
  EXPECT_THROW(other.resume(path), std::invalid_argument);
  TrainOptions gpt = o;
  gpt.arch = "gpt";
  gpt.sliding_window_size = 0;
  gpt.n_kv_groups = 0;
  Trainer g(text, gpt);
  EXPECT_THROW(g.resume(path), std::invalid_argument);
  fs::remove(path);
}

TEST_P(TrainDecoderArch, GradAccumMatchesTheBiggerBatch) {
  const std::string text = shakespeare(4000);
  TrainOptions big = tiny_decoder(GetParam());
  TrainOptions accum = big;
  accum.batch_size = 2;
  accum.grad_accum_steps = 2;
  Trainer a(text, big), b(text, accum);
  for (int s = 0; s < 4; ++s) EXPECT_NEAR(a.step(), b.step(), 1e-5) << "step " << s;
  const std::vector<float> wa = all_weights(a), wb = all_weights(b);
  ASSERT_EQ(wa.size(), wb.size());
  float worst = 0.0f;
  for (size_t i = 0; i < wa.size(); ++i) worst = std::max(worst, std::abs(wa[i] - wb[i]));
  EXPECT_LT(worst, 1e-5f);
}

INSTANTIATE_TEST_SUITE_P(Families, TrainDecoderArch,
                         ::testing::Values("llama3", "qwen3", "gemma3"));

TEST(TrainDecoder, OptionsAreChecked) {
  auto refused = [](TrainOptions o, const std::string& says) {
    try {
      o.validate();
      ADD_FAILURE() << "accepted; expected: " << says;
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(says), std::string::npos) << e.what();
    }
  };
  TrainOptions o = tiny_decoder("qwen3");
  o.validate();
  TrainOptions bad = o;
  bad.arch = "mistral";
  refused(bad, "--arch must be gpt, llama3, qwen3 or gemma3");
  bad = o;
  bad.drop_rate = 0.1;
  refused(bad, "without dropout");
  bad = o;
  bad.dtype = "float16";
  refused(bad, "--dtype must be float32 or bfloat16");
  bad = o;
  bad.init_from = kFixtures + "/qwen3";
  refused(bad, "drop --arch qwen3");
  bad = o;
  bad.head_dim = 7;
  refused(bad, "must be even");
  bad = TrainOptions{};
  bad.ffn_dim = 64;
  refused(bad, "--head-dim and --ffn-dim size a decoder");
  bad = TrainOptions{};
  bad.init_from = kFixtures + "/qwen3";
  bad.tokenizer = "gpt2";
  refused(bad, "the model's own tokenizer");
  bad = TrainOptions{};
  bad.tokenizer = "hf";
  refused(bad, "--tokenizer-file");
  // A Llama has no sliding layers to say in its config.json.
  TrainOptions llama = tiny_decoder("llama3");
  llama.sliding_window_size = 4;
  EXPECT_THROW(Trainer(shakespeare(4000), llama), std::invalid_argument);
  // train_args carry the new fields.
  const TrainOptions back = TrainOptions::from_json(tiny_decoder("gemma3").to_json());
  EXPECT_EQ(back.arch, "gemma3");
  EXPECT_EQ(back.to_json(), tiny_decoder("gemma3").to_json());
}

// ---- fine-tuning a Hub directory ---------------------------------------------------------

class FineTune : public ::testing::TestWithParam<const char*> {};

TEST_P(FineTune, StartsFromTheFilesAndWritesThemBack) {
  const std::string dir = kFixtures + "/" + GetParam();
  TrainOptions o;
  o.init_from = dir;
  o.tokenizer = "hf";
  o.context_length = 32;
  o.batch_size = 2;
  o.max_iters = 40;
  o.warmup_iters = 0;
  o.eval_iters = 4;
  o.lr = 3e-3;
  const std::string text = read_text(data_path("the-verdict.txt"));
  Trainer t(text, o);
  ASSERT_TRUE(t.is_decoder());

  // Before any step the model is the file's: its loss on a batch equals a plain load's.
  std::unique_ptr<nn::DecoderLM> plain;
  (void)io::load_hf_decoder(dir, plain);
  const std::vector<int64_t> ids =
      t.encode("I had always thought Jack Gisburn rather a cheap genius");
  EXPECT_EQ(ids, text::HfTokenizer::from_file(dir + "/tokenizer.json")
                     .encode("I had always thought Jack Gisburn rather a cheap genius", false));
  const Tensor x = Tensor::from_int64({1, static_cast<int64_t>(ids.size())}, ids);
  t.lm().module().eval();
  const Tensor before = t.lm().forward(x);
  const Tensor want = plain->forward(x);
  ASSERT_EQ(before.shape(), want.shape());
  for (int64_t i = 0; i < want.numel(); ++i) ASSERT_EQ(before[i], want[i]) << i;
  t.lm().module().train();

  const double start = t.evaluate().train_loss;
  while (t.iter() < o.max_iters) t.step();
  EXPECT_LT(t.evaluate().train_loss, start - 0.3);

  // Written in the Hub layout, read back: the trained model's logits, bit for bit.
  const std::string out = temp_path(std::string("finetuned_") + GetParam());
  fs::remove_all(out);
  io::HfDecoderSaveOptions with_tokenizer;
  with_tokenizer.tokenizer_json = t.hf_tokenizer_json();
  io::save_hf_decoder(t.decoder(), t.hub_config(), out, with_tokenizer);
  std::unique_ptr<nn::DecoderLM> back;
  const io::HfDecoderInfo info = io::load_hf_decoder(out, back);
  EXPECT_EQ(info.hf.model_type, io::read_hf_decoder_config(dir).model_type);
  EXPECT_EQ(info.hf.eos_token_ids, io::read_hf_decoder_config(dir).eos_token_ids);
  t.lm().module().eval();
  const Tensor after = t.lm().forward(x), read = back->forward(x);
  for (int64_t i = 0; i < read.numel(); ++i) ASSERT_EQ(after[i], read[i]) << i;
  EXPECT_EQ(read_text(out + "/tokenizer.json"), read_text(dir + "/tokenizer.json"));
  fs::remove_all(out);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, FineTune, ::testing::Values("llama3", "qwen3"));

// ---- the Hub layout, written ---------------------------------------------------------------

class HubLayout : public ::testing::TestWithParam<const char*> {};

TEST_P(HubLayout, WrittenBackLoadsTheSameModel) {
  const std::string dir = kFixtures + "/" + GetParam();
  std::unique_ptr<nn::DecoderLM> model;
  const io::HfDecoderInfo info = io::load_hf_decoder(dir, model);
  // The config.json written says the same model as the one read.
  const io::HfDecoderConfig again =
      io::parse_hf_decoder_config(io::hf_decoder_config_json(info.hf));
  EXPECT_EQ(again.model_type, info.hf.model_type);
  EXPECT_EQ(again.eos_token_ids, info.hf.eos_token_ids);
  EXPECT_EQ(again.bos_token_id, info.hf.bos_token_id);
  EXPECT_EQ(again.unapplied_attn_softcap, info.hf.unapplied_attn_softcap);
  const nn::DecoderConfig &a = again.config, &b = info.hf.config;
  EXPECT_EQ(a.vocab_size, b.vocab_size);
  EXPECT_EQ(a.num_kv_heads, b.num_kv_heads);
  EXPECT_EQ(a.head_dim, b.head_dim);
  EXPECT_EQ(a.intermediate_size, b.intermediate_size);
  EXPECT_EQ(a.context_length, b.context_length);
  EXPECT_EQ(a.norm_eps, b.norm_eps);
  EXPECT_EQ(a.attention_scale, b.attention_scale);
  EXPECT_EQ(a.attn_softcap, b.attn_softcap);
  EXPECT_EQ(a.final_softcap, b.final_softcap);
  EXPECT_EQ(a.sliding_window > 0 ? a.sliding_window : 0,
            b.sliding_window > 0 ? b.sliding_window : 0);
  for (int64_t i = 0; i < b.num_layers; ++i) EXPECT_EQ(a.layer_window(i), b.layer_window(i)) << i;
  EXPECT_EQ(a.tie_embeddings, b.tie_embeddings);
  EXPECT_EQ(a.qkv_bias, b.qkv_bias);
  EXPECT_EQ(a.o_bias, b.o_bias);
  EXPECT_EQ(a.pad_token_id, b.pad_token_id);
  for (const auto& [x, y] : {std::pair{a.rope, b.rope}, std::pair{a.rope_local, b.rope_local}}) {
    EXPECT_EQ(x.type, y.type);
    EXPECT_EQ(x.theta, y.theta);
    EXPECT_EQ(x.factor, y.factor);
    EXPECT_EQ(x.low_freq_factor, y.low_freq_factor);
    EXPECT_EQ(x.high_freq_factor, y.high_freq_factor);
    EXPECT_EQ(x.original_context_length, y.original_context_length);
  }

  const Tensor ids = Tensor::from_int64({1, 9}, {1, 5, 9, 17, 33, 2, 7, 60, 3});
  const Tensor want = model->forward(ids);
  for (const DType dtype : {DType::kFloat32, DType::kBFloat16}) {
    const std::string out = temp_path(std::string("hub_") + GetParam() + dtype_name(dtype));
    fs::remove_all(out);
    io::HfDecoderSaveOptions options;
    options.dtype = dtype;
    io::save_hf_decoder(*model, info.hf, out, options);
    std::unique_ptr<nn::DecoderLM> back;
    const io::HfDecoderInfo read = io::load_hf_decoder(out, back, dtype);
    EXPECT_EQ(read.file_dtype, dtype == DType::kFloat32 ? "F32" : "BF16");
    EXPECT_EQ(read.weight_files.size(), 1u);
    const Tensor got = back->forward(ids);
    if (dtype == DType::kFloat32) {
      for (int64_t i = 0; i < want.numel(); ++i) ASSERT_EQ(got[i], want[i]) << i;
    } else {  // every tensor the float32 value rounded to nearest even, as torch's .to(bfloat16)
      const io::SafetensorsFile file = io::read_safetensors(out + "/model.safetensors");
      std::map<std::string, const Tensor*> by_name;
      for (const auto& [name, t] : file.tensors) by_name[name] = &t;
      std::unique_ptr<nn::DecoderLM> f32;
      (void)io::load_hf_decoder(dir, f32);
      for (auto& [name, p] : f32->named_parameters()) {
        const Tensor* t = by_name.at(io::hf_decoder_name(name));
        ASSERT_EQ(t->dtype(), DType::kBFloat16) << name;
        const Tensor rounded = p->value.to(DType::kBFloat16);
        ASSERT_EQ(std::memcmp(t->data_ptr<BFloat16>(), rounded.data_ptr<BFloat16>(),
                              static_cast<size_t>(t->numel()) * 2),
                  0)
            << name;
      }
      EXPECT_EQ(by_name.size(), f32->named_parameters().size());
    }
    fs::remove_all(out);
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, HubLayout,
                         ::testing::Values("llama3", "llama32_bf16_sharded", "qwen3", "qwen2",
                                           "gemma3", "gemma3_softcap_old", "gemma2"));

TEST(HubLayout, RefusesWhatTheFamilyCannotSay) {
  std::unique_ptr<nn::DecoderLM> model;
  io::HfDecoderConfig hf = io::load_hf_decoder(kFixtures + "/llama3", model).hf;
  io::HfDecoderConfig windowed = hf;
  windowed.config.sliding_window = 4;
  windowed.config.layer_sliding = {true, false};
  EXPECT_THROW(io::hf_decoder_config_json(windowed), std::invalid_argument);
  io::HfDecoderConfig qk = hf;
  qk.config.qk_norm = true;
  EXPECT_THROW(io::hf_decoder_config_json(qk), std::invalid_argument);
  io::HfDecoderConfig other = hf;
  other.model_type = "mistral";
  EXPECT_THROW(io::hf_decoder_config_json(other), std::invalid_argument);
  EXPECT_THROW(io::hf_decoder_config_json(hf, "float16"), std::invalid_argument);
}

TEST(Gpt2TokenizerJson, EncodesAsGpt2) {
  const text::HfTokenizer tok = text::HfTokenizer::from_json(text::gpt2_tokenizer_json(), "gpt2");
  const text::Tokenizer& gpt2 = text::Tokenizer::gpt2();
  EXPECT_EQ(tok.vocab_size(), 50257);
  const std::string verdict = read_text(data_path("the-verdict.txt"));
  for (const std::string& s :
       {std::string("Hello, world! <|endoftext|> It's  12345 tokens\n\n  ok"),
        std::string("naïve café — 東京 🙂 <|endoftext|><|endoftext|>"),
        verdict.substr(0, 4000)}) {
    const std::vector<int64_t> ids = gpt2.encode(s, /*allow_special=*/true);
    EXPECT_EQ(tok.encode(s, false), ids) << s.substr(0, 40);
    EXPECT_EQ(tok.decode(ids), gpt2.decode(ids));
  }
  EXPECT_TRUE(tok.is_special(50256));
}

// ---- the CLI ------------------------------------------------------------------------------

TEST(TrainDecoderCli, ArchRunWritesAHubDirectoryThatGenerates) {
  ATTN_REQUIRE_CLI();
  const std::string out = temp_path("qwen3run");
  fs::remove_all(out);
  const auto r =
      run_cli("train --text '" + data_path("the-verdict.txt") + "' --out '" + out +
              "' --arch qwen3 --tokenizer gpt2 --context-length 32 --batch-size 4 --n-layers 1 "
              "--n-heads 2 --n-kv-groups 1 --emb-dim 16 --max-iters 4 --eval-interval 2 "
              "--eval-iters 1 --threads 1");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("qwen3 decoder: 1 layers, 2 heads (1 key/value) of 8, emb 16"),
            std::string::npos)
      << r.out;
  for (const char* f : {"checkpoint.safetensors", "config.json", "generation_config.json",
                        "model.safetensors", "tokenizer.json"})
    EXPECT_TRUE(fs::is_regular_file(out + "/" + f)) << f;
  const io::HfDecoderConfig hf = io::read_hf_decoder_config(out);
  EXPECT_EQ(hf.model_type, "qwen3");
  EXPECT_EQ(hf.eos_token_ids, std::vector<int64_t>{50256});
  const auto gen =
      run_cli("generate --model '" + out +
              "' --prompt 'Every effort moves you' --max-new-tokens 3 --greedy --print-ids");
  ASSERT_EQ(gen.exit_code, 0) << gen.err;
  EXPECT_EQ(gen.out.rfind("6109 3626 6100 345", 0), 0u) << gen.out;  // the prompt's GPT-2 ids first

  // Exported again in bf16: one file, half the bytes of the weights.
  const std::string bf16 = out + "-bf16";
  fs::remove_all(bf16);
  const auto ex =
      run_cli("export --model '" + out + "' --format hf --dtype bfloat16 --out '" + bf16 + "'");
  ASSERT_EQ(ex.exit_code, 0) << ex.err;
  EXPECT_EQ(io::read_safetensors_header(bf16 + "/model.safetensors").entries.front().dtype, "BF16");
  EXPECT_EQ(read_text(bf16 + "/tokenizer.json"), read_text(out + "/tokenizer.json"));
  const auto bad = run_cli("export --model '" + out + "' --format book --out '" + bf16 + "x'");
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_EQ(lines_of(bad.err).size(), 1u) << bad.err;
  fs::remove_all(out);
  fs::remove_all(bf16);
}

TEST(TrainDecoderCli, InitFromFineTunesWithTheDirectorysTokenizer) {
  ATTN_REQUIRE_CLI();
  const std::string out = temp_path("llama3_finetune");
  fs::remove_all(out);
  const auto r = run_cli("train --text '" + data_path("the-verdict.txt") + "' --out '" + out +
                         "' --init-from '" + kFixtures +
                         "/llama3' --context-length 32 --batch-size 2 --max-iters 2 "
                         "--eval-interval 2 --eval-iters 1 --threads 1");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("(tokenizer.json)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("llama decoder: 2 layers"), std::string::npos) << r.out;
  EXPECT_EQ(read_text(out + "/tokenizer.json"), read_text(kFixtures + "/llama3/tokenizer.json"));
  std::unique_ptr<nn::DecoderLM> m;
  EXPECT_EQ(io::load_hf_decoder(out, m).hf.model_type, "llama");
  fs::remove_all(out);
}

TEST(TrainDecoderCli, BookRecipeRunsWithQwen3) {
  ATTN_REQUIRE_CLI();
  const std::string text = temp_path("book_qwen3.txt");
  { std::ofstream(text) << read_text(data_path("the-verdict.txt")).substr(0, 3000); }
  const std::string out = temp_path("book_qwen3_run");
  fs::remove_all(out);
  const auto r =
      run_cli("train --recipe book-ch5 --arch qwen3 --text '" + text + "' --out '" + out +
              "' --n-layers 1 --n-heads 2 --emb-dim 16 --context-length 32 --stride 32 --epochs 1 "
              "--eval-iters 1 --threads 1");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto lines = lines_of(r.out);
  ASSERT_GE(lines.size(), 3u) << r.out;
  EXPECT_NE(lines[0].find("qwen3 decoder"), std::string::npos) << lines[0];
  EXPECT_NE(lines[0].find("fused path"), std::string::npos) << lines[0];
  bool sampled = false;
  for (const auto& l : lines) sampled = sampled || l.rfind("Every effort moves you", 0) == 0;
  EXPECT_TRUE(sampled) << r.out;
  EXPECT_TRUE(fs::is_regular_file(out + "/config.json"));
  fs::remove_all(out);
  fs::remove(text);
}

TEST(TrainDecoderCli, BadFlagsAreOneLine) {
  ATTN_REQUIRE_CLI();
  const std::string out = temp_path("decoder_bad");
  for (const std::string& flags :
       {std::string("--arch mistral"), std::string("--arch qwen3 --drop-rate 0.1"),
        std::string("--arch qwen3 --init-from '" + kFixtures + "/qwen3'"),
        std::string("--init-from '" + kFixtures + "/gemma3'"),  // no tokenizer.json there
        std::string("--init-from /nonexistent/dir --tokenizer-file '" + kFixtures + "/qwen3'")}) {
    const auto r = run_cli("train --text '" + data_path("the-verdict.txt") + "' --out '" + out +
                           "' " + flags + " --max-iters 1");
    EXPECT_NE(r.exit_code, 0) << flags;
    EXPECT_EQ(lines_of(r.err).size(), 1u) << flags << ": " << r.err;
  }
  fs::remove_all(out);
}

}  // namespace
}  // namespace attn::test
