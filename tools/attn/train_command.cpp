// train_command.cpp - `attn train` (train_command.h): flags, the loop around
// attn::train::Trainer, the progress display, DIR/metrics.jsonl and SIGINT.
#include "train_command.h"

#include <fmt/format.h>
#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "attn/attn.h"
#include "attn/dist.h"
#include "attn/gemm.h"
#include "attn/hf_decoder.h"
#include "attn/hf_gpt2.h"
#include "attn/read_file.h"
#include "attn/safetensors.h"
#include "attn/token_shards.h"
#include "attn/tokenizer.h"
#include "attn/train.h"
#include "attn/train_book.h"
#include "attn/train_flags.h"
#include "attn/utf8.h"
#include "flag_checks.h"
#include "input_file.h"
#include "plot/line_chart.h"
#include "progress.h"
#include "special_tokens.h"
#include "weights.h"

namespace attn::cli {

namespace {

volatile std::sig_atomic_t g_stop = 0;
extern "C" void on_sigint(int) { g_stop = 1; }

constexpr int kInterrupted = 130;  // 128 + SIGINT, as a shell reports a killed job

std::string read_text_file(const std::string& path) {
  std::string text = read_input_file(path, "--text");  // a regular file, at most 4 GiB
  if (text.empty())
    throw std::runtime_error(fmt::format("--text '{}': the file is empty", printable(path)));
  return text;
}

// A stream that drops what it is given (ranks other than 0 print nothing).
std::ostream& null_stream() {
  static std::ostream s(nullptr);
  return s;
}

// The running binary's bytes (/proc/self/exe): the start-up agreement's version.
std::string read_self() { return attn::read_file("/proc/self/exe") + attn::version(); }

double median(std::vector<double> v) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// The metrics lines of an earlier run kept on --resume: those up to the
// checkpoint's last evaluation (a killed run may have written later ones).
std::vector<std::string> kept_metrics(const std::string& path, int64_t last_eval_iter) {
  std::vector<std::string> kept;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) {
    try {
      const auto j = nlohmann::json::parse(line);
      if (j.at("iter").get<int64_t>() <= last_eval_iter) kept.push_back(line);
    } catch (const nlohmann::json::exception&) {
      // a line that is not a metrics object is dropped
    }
  }
  return kept;
}

// Removes what a killed run left in DIR: the temporaries of attn's atomic
// writer (".NAME.tmp.PID.N", attn/atomic_file.h; a 124M checkpoint's is 1.5 GB)
// whose process no longer runs.
void remove_stale_temporaries(const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    const size_t tmp = name.rfind(".tmp.");
    if (name.empty() || name[0] != '.' || tmp == std::string::npos || tmp == 0) continue;
    // PID.N after ".tmp."
    const std::string rest = name.substr(tmp + 5);
    const size_t dot = rest.find('.');
    if (dot == std::string::npos || dot == 0 || dot + 1 == rest.size() ||
        rest.find_first_not_of("0123456789.") != std::string::npos)
      continue;
    long pid = 0;
    try {
      pid = std::stol(rest.substr(0, dot));
    } catch (const std::exception&) {
      continue;
    }
    if (pid <= 0 || (::kill(static_cast<pid_t>(pid), 0) == 0 || errno == EPERM)) continue;  // alive
    std::error_code rm;
    if (it->is_regular_file(rm) && fs::remove(it->path(), rm))
      std::cout << fmt::format("removed '{}', left by an earlier run\n",
                               printable(it->path().string()));
  }
}

// "GPT-2 BPE", "characters" or the tokenizer.json's.
std::string tokens_name(const train::Trainer& trainer) {
  const std::string& t = trainer.tokenizer_name();
  return t == "gpt2" ? "GPT-2 BPE" : t == "hf" ? "tokenizer.json" : "characters";
}

// The model's shape, as the banner prints it.
std::string model_summary(train::Trainer& trainer) {
  if (!trainer.is_decoder()) {
    const nn::GPTConfig& c = trainer.model().config();
    return fmt::format("{} layers, {} heads, emb {}", c.n_layers, c.n_heads, c.emb_dim);
  }
  const nn::DecoderConfig& c = trainer.decoder().config();
  return fmt::format(
      "{} decoder: {} layers, {} heads ({} key/value) of {}, emb {}, feed-forward {}",
      trainer.hub_config().model_type, c.num_layers, c.num_heads, c.num_kv_heads, c.head_dim,
      c.hidden_size, c.intermediate_size);
}

// The book's loop (train_model_simple, attn/train_book.h): its prints on
// stdout as the notebook prints them ("Ep 1 (Step 000000): Train loss ...,
// Val loss ..." and each epoch's sample), the steps' progress on stderr;
// DIR/metrics.jsonl (one line per evaluation, with epoch, global_step,
// tokens_seen and num_epochs) and DIR/samples.jsonl (one per epoch) as they
// come; at the end (or on SIGINT) the checkpoint, and DIR/loss.svg as the
// book's plot_losses draws it.
int run_book_recipe(train::Trainer& trainer, const std::string& out,
                    const std::function<void(train::Trainer&)>& save, Progress::Mode mode) {
  namespace fs = std::filesystem;
  using clock = std::chrono::steady_clock;
  const train::TrainOptions& options = trainer.options();
  const std::string metrics_path = (fs::path(out) / "metrics.jsonl").string();
  const std::string samples_path = (fs::path(out) / "samples.jsonl").string();
  const int64_t batches = trainer.train_loader()->batches();
  const int64_t steps = options.epochs * batches;
  std::cout << fmt::format(
      "attn train --recipe book-ch5: {} tokens ({}), {} train / {} val tokens ({} training "
      "batches per epoch); {} parameters; {}, context {}, batch {}; {} "
      "epochs = {} steps; AdamW lr {} (constant), weight decay {} on {} parameters; {} path\n",
      trainer.train_tokens() + trainer.val_tokens(), tokens_name(trainer), trainer.train_tokens(),
      trainer.val_tokens(), batches, trainer.lm().num_parameters(), model_summary(trainer),
      options.context_length, options.batch_size, options.epochs, steps, options.lr,
      options.weight_decay, options.decay,
      options.exact ? "reference (PyTorch's dropout masks)" : "fused");
  std::cout.flush();

  struct sigaction sa {};
  sa.sa_handler = on_sigint;
  sa.sa_flags = SA_RESETHAND;
  sigemptyset(&sa.sa_mask);
  struct sigaction old {};
  sigaction(SIGINT, &sa, &old);
  g_stop = 0;

  const auto start = clock::now();
  std::vector<std::string> metrics, samples;
  std::vector<double> step_ms, all_ms;
  train::BookCallbacks cb;
  Progress progress("train", steps, "steps", mode);
  cb.on_step = [&](int64_t step, float loss, double ms) {
    step_ms.push_back(ms);
    all_ms.push_back(ms);
    progress.update(step + 1, fmt::format("loss {:.4f}", loss));
  };
  cb.on_evaluation = [&](const train::BookEvaluation& e) {
    nlohmann::ordered_json j;
    j["iter"] = e.global_step + 1;  // steps done
    j["epoch"] = e.epoch;
    j["global_step"] = e.global_step;
    j["train_loss"] = e.train_loss;
    j["val_loss"] = e.val_loss;
    j["tokens_seen"] = e.tokens_seen;
    j["num_epochs"] = options.epochs;
    j["lr"] = options.lr;
    j["ms_per_iter"] = median(step_ms);
    j["elapsed_s"] = std::chrono::duration<double>(clock::now() - start).count();
    step_ms.clear();
    metrics.push_back(j.dump());
    std::string all;
    for (const auto& line : metrics) all += line + "\n";
    write_file_atomically(metrics_path, all);
    progress.clear();
    std::cout << train::format_evaluation(e) << "\n";
    std::cout.flush();
  };
  cb.on_sample = [&](const train::BookSample& s) {
    nlohmann::ordered_json j;
    j["epoch"] = s.epoch;
    j["text"] = s.text;
    j["ids"] = s.ids;
    samples.push_back(j.dump());
    std::string all;
    for (const auto& line : samples) all += line + "\n";
    write_file_atomically(samples_path, all);
    progress.clear();
    std::cout << s.text << "\n";
    std::cout.flush();
  };
  cb.should_stop = [] { return g_stop != 0; };
  const train::BookHistory history = train::train_model_simple(trainer, cb);
  progress.finish();
  sigaction(SIGINT, &old, nullptr);
  const double wall = std::chrono::duration<double>(clock::now() - start).count();
  save(trainer);
  if (history.stopped) {
    std::cout << fmt::format(
        "interrupted after step {}: checkpoint written to {} (the book's loop is not resumable)\n",
        trainer.iter(), printable((fs::path(out) / "checkpoint.safetensors").string()));
    std::cout.flush();
    return kInterrupted;
  }
  const std::string loss_curve = (fs::path(out) / "loss.svg").string();
  plot::write_loss_curve(metrics_path, loss_curve);
  std::cout << fmt::format(
      "done: {} steps in {:.1f} s ({:.1f} ms/step median); checkpoint {}; loss curve {}\n",
      trainer.iter(), wall, median(all_ms),
      printable((fs::path(out) / "checkpoint.safetensors").string()), printable(loss_curve));
  std::cout.flush();
  return std::cout ? 0 : 1;
}

}  // namespace

Command add_train_command(CLI::App& app) {
  struct Flags {
    std::string text, out, recipe;
    std::string data_shards;  // attn prepare's folder, read in place of --text
    bool resume = false;
    bool allow_special = false;  // --tokenizer gpt2: "<|endoftext|>" in --text is the token 50256
    bool quiet = false;          // no progress display (the bar, or the step lines)
    bool deterministic = false;
    bool shard_optimizer = false;
    int threads = 0;  // 0: OpenMP's default (OMP_NUM_THREADS, else every core)
    train::TrainOptions o;
  };
  auto flags = std::make_shared<Flags>();
  CLI::App* cmd = app.add_subcommand(
      "train",
      "Train a GPT on a UTF-8 text, on its characters or on GPT-2's BPE (--tokenizer gpt2): "
      "90/10 train/validation split, AdamW with warm-up and cosine decay; writes "
      "DIR/checkpoint.safetensors and DIR/metrics.jsonl");
  cmd->footer(
      "Defaults: nanoGPT's Shakespeare-character CPU recipe (a few minutes on 2 cores).\n"
      "SIGINT (Ctrl-C) stops after the current step, writes the checkpoint and exits with 130.\n"
      "Examples:\n"
      "  attn train --text input.txt --out run\n"
      "  attn train --text input.txt --out run --resume --max-iters 4000\n"
      "  attn train --text the-verdict.txt --out run --tokenizer gpt2 --context-length 256 "
      "--batch-size 2 --epochs 10\n"
      "  attn train --recipe book-ch5 --text the-verdict.txt --out run   (the book's chapter 5)\n"
      "Data parallel (MPI; docs/distributed.md): each rank computes its micro-batches of every global\n"
      "batch (ranks x --grad-accum-steps x --batch-size), gradients summed across ranks while backward\n"
      "runs; rank 0 prints and writes; --resume works at any rank count with the same ranks x K.\n"
      "  mpirun -np 2 --bind-to none attn train --text input.txt --out run\n"
      "  mpirun -np 8 --hostfile hosts attn train --text input.txt --out /shared/run --deterministic");
  add_option(cmd, "--text", flags->text, "The training text (UTF-8)")->type_name("FILE");
  add_option(cmd, "--data-shards", flags->data_shards,
             "Train on the token shards attn prepare wrote in DIR instead of --text (GPT-2 BPE; "
             "memory-mapped, each batch reads only its windows; the first 90% of the tokens "
             "train, the rest validate)")
      ->type_name("DIR");
  add_option(cmd, "--out", flags->out, "Folder for checkpoint.safetensors and metrics.jsonl")
      ->required()
      ->type_name("DIR");
  add_option(cmd, "--recipe", flags->recipe,
             "book-ch5: the book's chapter-5 run (GPT_CONFIG_124M with context 256, GPT-2 BPE, "
             "windows of 256 every 256, batch 2, AdamW lr 4e-4 with weight decay 0.1 on every "
             "parameter, betas (0.9, 0.999), constant lr, no clipping, dropout 0.1 with "
             "PyTorch's masks, 10 epochs, seed 123) and its loop, train_model_simple: "
             "evaluation after every 5th step on 5 batches, a greedy sample from \"Every "
             "effort moves you\" after each epoch. Flags given too override the recipe's")
      ->type_name("NAME");
  cmd->add_flag(
      "-q,--quiet", flags->quiet,
      "No progress display: no bar on stderr (a terminal), no step lines (otherwise); the "
      "evaluations and the summary still print");
  cmd->add_flag("--allow-special", flags->allow_special,
                "--tokenizer gpt2: encode \"<|endoftext|>\" in --text as the token 50256, the "
                "document separator (else a text holding it is refused, as tiktoken refuses it; "
                "give it again with --resume)");
  cmd->add_flag("--resume", flags->resume,
                "Continue from DIR/checkpoint.safetensors with its flags (flags given here override "
                "those that do not change the model)");
  add_option(cmd, "-t,--threads", flags->threads,
             "OpenMP and BLAS threads (default: OMP_NUM_THREADS, else every core). On a busy "
             "machine, 1 is often much faster for a small model: threads that wait for each "
             "other lose their core. Losses are reproducible (and --resume exact) for the "
             "same thread count")
      ->type_name("N");
  cmd->add_flag("--deterministic", flags->deterministic,
                "Under mpirun: sum the ranks' gradients in rank order (an allgather of each bucket, "
                "then g0 + g1 + ...), so the weights are bit-identical to one rank with "
                "--grad-accum-steps N (same threads per rank); without it MPI_Iallreduce's order, "
                "equal within float32 rounding (for 2 ranks identical anyway)");
  cmd->add_flag("--shard-optimizer", flags->shard_optimizer,
                "Under mpirun: ZeRO stage 1, each rank keeps AdamW's moments for about 1/N of the "
                "parameters and updates those, then broadcasts them; the same weights as without "
                "(bit for bit), optimizer memory / N (optimizer_bytes in metrics.jsonl)");
  train::TrainOptions& o = flags->o;
  // Each flag with how to copy it from one TrainOptions to another (--resume
  // starts from the checkpoint's flags and applies the ones given).
  std::vector<std::pair<CLI::Option*, std::function<void(train::TrainOptions&, const train::TrainOptions&)>>>
      given;
#define ATTN_TRAIN_FLAG(name, field, help)                         \
  given.emplace_back(                                              \
      add_option(cmd, name, o.field, help)->capture_default_str(), \
      [](train::TrainOptions& d, const train::TrainOptions& s) { d.field = s.field; })
  ATTN_TRAIN_FLAG("--n-layers", n_layers, "Transformer blocks");
  ATTN_TRAIN_FLAG("--n-heads", n_heads, "Attention heads (must divide --emb-dim)");
  ATTN_TRAIN_FLAG("--emb-dim", emb_dim, "Embedding size");
  ATTN_TRAIN_FLAG("--n-kv-groups", n_kv_groups,
                  "Grouped-query attention (the book's ch04/04_gqa): this many key/value heads, "
                  "each shared by n-heads / n-kv-groups query heads (must divide --n-heads; 1: "
                  "multi-query; 0: off, every head its own)");
  ATTN_TRAIN_FLAG("--sliding-window-size", sliding_window_size,
                  "Sliding-window attention (the book's ch04/06_swa): each token attends to itself "
                  "and the W - 1 tokens before it (0: off)");
  ATTN_TRAIN_FLAG("--sliding-window-stride", sliding_window_stride,
                  "Which layers take the window, the book's K:1 schedule: K > 0 windows K layers, "
                  "then one full, repeated (Gemma 3: 5); 0 none; -1 every layer");
  ATTN_TRAIN_FLAG("--context-length", context_length, "Tokens per training window");
  ATTN_TRAIN_FLAG("--batch-size", batch_size, "Windows per step");
  ATTN_TRAIN_FLAG("--grad-accum-steps", grad_accum_steps,
                  "Micro-batches of --batch-size each rank accumulates per step (nanoGPT's "
                  "gradient_accumulation_steps): the global batch is ranks x K x --batch-size, one "
                  "clip and one AdamW step per global batch; windows and dropout masks depend on "
                  "(seed, step, micro-batch), not on the rank (docs/distributed.md)");
  ATTN_TRAIN_FLAG("--max-iters", max_iters, "Training steps (also where the cosine decay ends)");
  ATTN_TRAIN_FLAG("--lr", lr, "Peak learning rate");
  ATTN_TRAIN_FLAG("--min-lr", min_lr, "Learning rate at the end of the cosine decay");
  ATTN_TRAIN_FLAG("--warmup-iters", warmup_iters, "Linear warm-up steps");
  ATTN_TRAIN_FLAG("--weight-decay", weight_decay, "AdamW weight decay (weights and embeddings)");
  ATTN_TRAIN_FLAG("--grad-clip", grad_clip, "Clip the gradients' global norm to this (0: off)");
  ATTN_TRAIN_FLAG("--drop-rate", drop_rate, "Dropout probability");
  ATTN_TRAIN_FLAG("--eval-interval", eval_interval, "Evaluate (and checkpoint) every this many steps");
  ATTN_TRAIN_FLAG("--eval-iters", eval_iters, "Batches per split in an evaluation");
  ATTN_TRAIN_FLAG("--seed", seed, "Seed of the weights, batches and dropout");
  ATTN_TRAIN_FLAG("--tokenizer", tokenizer,
                  "char: the text's characters are the vocabulary, random windows (nanoGPT); gpt2: "
                  "GPT-2's byte-level BPE (50,257 tokens) and the book's chapter-5 data loader "
                  "(windows every --stride tokens, shuffled each epoch); hf: a tokenizer.json "
                  "(--tokenizer-file, or --init-from's) with the same loader");
  ATTN_TRAIN_FLAG("--stride", stride, "gpt2: tokens between training windows (0: --context-length)");
  ATTN_TRAIN_FLAG("--epochs", epochs,
                  "gpt2: passes over the training windows; sets --max-iters to epochs x batches "
                  "per pass (0: use --max-iters)");
  ATTN_TRAIN_FLAG("--lr-schedule", lr_schedule,
                  "cosine: warm-up and cosine decay to --min-lr (nanoGPT); constant: --lr at every "
                  "step (the book)");
  ATTN_TRAIN_FLAG("--decay", decay,
                  "Which parameters AdamW's weight decay applies to: matrices (weights and "
                  "embeddings, nanoGPT) or all (AdamW(model.parameters()), the book)");
  given.emplace_back(cmd->add_flag("--exact", o.exact,
                                   "Run the model on the reference paths with PyTorch's dropout "
                                   "masks (the book's numbers; slower than the fused kernels)"),
                     [](train::TrainOptions& d, const train::TrainOptions& s) { d.exact = s.exact; });
  given.emplace_back(
      cmd->add_flag("--rope", o.rope,
                    "Rotary position embedding (the book's Llama chapter) in every attention "
                    "layer instead of the learned position embedding (pos_emb); the head size "
                    "(--emb-dim / --n-heads) must be even. Saved in the checkpoint's config, so "
                    "attn generate uses it too; no Hugging Face GPT-2 copy is written"),
      [](train::TrainOptions& d, const train::TrainOptions& s) { d.rope = s.rope; });
  ATTN_TRAIN_FLAG("--theta-base", theta_base,
                  "With --rope: the base of its angles, theta_i = theta_base^(-2i/head_size) (the "
                  "book's rope_base: Llama 2 10000, Llama 3 500000)");
  ATTN_TRAIN_FLAG("--latent-dim", latent_dim,
                  "Multi-head latent attention (the book's ch04/05_mla) in every block with this "
                  "latent width: keys and values up-projected from a cached latent of N values per "
                  "token (0: the usual multi-head attention). float32, not with --rope or --exact");
  ATTN_TRAIN_FLAG("--dtype", dtype,
                  "Compute dtype: float32, or bfloat16 (mixed precision as torch.autocast: float32 "
                  "weights, gradients and optimizer; bf16 products summed in float32)");
  ATTN_TRAIN_FLAG("--fused-loss", fused_loss,
                  "true: the output head and the cross-entropy fused, 512 rows at a time, so the "
                  "(batch x context, vocab) logits are never held whole (less memory, faster); "
                  "false: the logits, then the loss (the plain path)");
  ATTN_TRAIN_FLAG(
      "--arch", arch,
      "The model: gpt (the book's GPT), or a decoder of today's open models built "
      "from the size flags: llama3 (SwiGLU, RMSNorm, RoPE), qwen3 (and QK-norm), "
      "gemma3 (GeGLU, four norms per block, local RoPE on its sliding layers); float32, "
      "no dropout; written beside the checkpoint in the Hugging Face layout (token runs)");
  ATTN_TRAIN_FLAG("--head-dim", head_dim,
                  "--arch llama3|qwen3|gemma3: the heads' size (0: --emb-dim / --n-heads)");
  ATTN_TRAIN_FLAG("--ffn-dim", ffn_dim,
                  "--arch llama3|qwen3|gemma3: the gated feed-forward's width (0: 3 x --emb-dim)");
  ATTN_TRAIN_FLAG(
      "--init-from", init_from,
      "Fine-tune a Llama 3 / Qwen2 / Qwen3 / Gemma 2 / Gemma 3 directory as the Hub "
      "publishes it (config.json, model.safetensors, tokenizer.json): its weights and "
      "config replace the size flags, its tokenizer.json tokenizes the text (--tokenizer hf)");
  ATTN_TRAIN_FLAG("--tokenizer-file", tokenizer_file,
                  "--tokenizer hf: the tokenizer.json (or a directory holding one; default: "
                  "--init-from's)");
#undef ATTN_TRAIN_FLAG
  // Each size and count in its range as it is parsed (TrainOptions::validate
  // checks the same ranges again, for a resumed run's train_args).
  for (const train::FlagRange& r : train::integer_flag_ranges())
    in_range(cmd->get_option(std::string("--") + r.flag), r.min, r.max);
  in_range(cmd->get_option("--threads"), 1, 4096);  // 0, the default, is not given

  CLI::Option* accum_flag = cmd->get_option("--grad-accum-steps");
  CLI::Option* tokenizer_flag = cmd->get_option("--tokenizer");
  CLI::Option* exact_flag = cmd->get_option("--exact");
  CLI::Option* drop_flag = cmd->get_option("--drop-rate");
  auto run_rank = [flags, given, accum_flag, tokenizer_flag, exact_flag,
                   drop_flag](dist::MpiCollective* mpi) -> int {
    namespace fs = std::filesystem;
    const bool root = mpi == nullptr || mpi->rank() == 0;
    const std::string checkpoint = (fs::path(flags->out) / "checkpoint.safetensors").string();
    const std::string metrics_path = (fs::path(flags->out) / "metrics.jsonl").string();
    // The checkpoint, and for a GPT-2 BPE run the same weights in Hugging Face's
    // layout beside it (config.json, model.safetensors, vocab.json, merges.txt).
    int64_t saved_iter = -1;  // the iteration DIR/checkpoint.safetensors holds (-1: none yet)
    // Where a run that diverged stops: what is kept, and what to try.
    auto kept = [&]() {
      return saved_iter < 0
                 ? fmt::format("no checkpoint was written to '{}'", printable(checkpoint))
                 : fmt::format("'{}' keeps iteration {}", printable(checkpoint), saved_iter);
    };
    auto save = [&](train::Trainer& trainer) {
      // Every rank checks (the weights are the same on each), so all stop together.
      if (const std::string bad = non_finite_weight(trainer.lm().module()); !bad.empty()) {
        throw std::runtime_error(
            fmt::format("the run diverged by iteration {}: {}; stopped without writing, {} (try a "
                        "lower --lr or "
                        "--grad-clip)",
                        trainer.iter(), bad, kept()));
      }
      trainer.save(checkpoint);  // collective with --shard-optimizer; rank 0 writes
      saved_iter = trainer.iter();
      if (!root) return;
      if (trainer.is_decoder()) {
        // The Hub's layout (config.json, generation_config.json, model.safetensors
        // and the tokenizer), which attn generate --model, transformers and
        // llama.cpp's converter read. A character run has no tokenizer.json.
        if (trainer.tokenizer_name() == "char") return;
        io::HfDecoderSaveOptions hub;
        hub.tokenizer_json = trainer.tokenizer_name() == "gpt2" ? text::gpt2_tokenizer_json()
                                                                : trainer.hf_tokenizer_json();
        if (!trainer.options().init_from.empty()) {
          const fs::path tc = fs::path(trainer.options().init_from) / "tokenizer_config.json";
          std::error_code e;
          if (fs::is_regular_file(tc, e)) hub.tokenizer_config_json = attn::read_file(tc.string());
        }
        io::save_hf_decoder(trainer.decoder(), trainer.hub_config(), flags->out, hub);
        return;
      }
      const nn::GPTConfig& c = trainer.model().config();
      // GPT-2's layout has no RoPE, latent, grouped-query or sliding-window attention.
      if (trainer.tokenizer_name() == "gpt2" && !c.rope && c.latent_dim == 0 && c.n_kv_groups == 0 &&
          c.sliding_window_size == 0) {
        io::save_hf_gpt2(trainer.model(), flags->out);
        text::write_gpt2_vocabulary(flags->out);
      }
    };

    // The options: the flags, or on --resume the checkpoint's with the given flags applied.
    if (flags->threads != 0) {
      omp_set_num_threads(flags->threads);
      gemm::set_blas_threads(flags->threads);
    } else if (mpi != nullptr && std::getenv("OMP_NUM_THREADS") == nullptr) {
      // No oversubscription: the cores (those this rank may run on) shared by the ranks of this host.
      const int cores = std::max(1, omp_get_num_procs());
      const int per_rank = std::max(1, std::min(cores, static_cast<int>(std::thread::hardware_concurrency()) /
                                                           std::max(1, mpi->local_size())));
      omp_set_num_threads(per_rank);
      gemm::set_blas_threads(per_rank);
    }
    train::TrainOptions options = flags->o;
    std::error_code ec;
    const bool have_checkpoint = fs::exists(checkpoint, ec);
    const bool book = !flags->recipe.empty();
    if (book) {
      if (flags->recipe != "book-ch5")
        throw UsageError(fmt::format("--recipe must be book-ch5, got '{}'", printable(flags->recipe)));
      if (mpi != nullptr)
        throw UsageError("--recipe book-ch5 (the book's own loop) runs on one process, not under mpirun");
      if (flags->resume)
        throw UsageError(
            "--resume cannot be combined with --recipe book-ch5: the book's loop "
            "(train_model_simple) runs from the fresh model to its last epoch");
      options = train::book_ch5_options();
      for (const auto& [opt, copy] : given) {
        if (opt->count() > 0) copy(options, flags->o);
      }
      if (options.arch != "gpt" || !options.init_from.empty()) {
        // The book's ch05/14: chapter 5 with Llama 3.2 or Qwen3 in place of
        // GPT-2; their blocks have no dropout and no reference path.
        if (exact_flag->count() == 0) options.exact = false;
        if (drop_flag->count() == 0) options.drop_rate = 0.0;
      }
      if (options.tokenizer == "char" || options.epochs < 1)
        throw UsageError(fmt::format(
            "--recipe book-ch5 needs --tokenizer gpt2 or hf and --epochs >= 1 (the book's data "
            "loaders), got --tokenizer {} and --epochs {}",
            printable(options.tokenizer), options.epochs));
    }
    if (flags->resume) {
      if (!have_checkpoint)
        throw std::runtime_error(fmt::format("--resume: no checkpoint at '{}'", printable(checkpoint)));
      const auto header = io::read_safetensors_header(checkpoint);
      const auto it = header.metadata.find("train_args");
      if (it == header.metadata.end())
        throw std::runtime_error(fmt::format("--resume: '{}' has no \"train_args\" metadata", printable(checkpoint)));
      options = train::TrainOptions::from_json(it->second);
      for (const auto& [opt, copy] : given) {
        if (opt->count() > 0) copy(options, flags->o);
      }
      // The same global batch at another rank count: K = micro-batches / ranks when that divides.
      const auto gb = header.metadata.find("global_batch");
      const int ranks = mpi != nullptr ? mpi->size() : 1;
      if (accum_flag->count() == 0) {
        int64_t micro = 1;
        if (gb != header.metadata.end()) {
          try {
            micro = nlohmann::json::parse(gb->second).at("micro_batches").get<int64_t>();
          } catch (const nlohmann::json::exception&) {
            micro = 0;  // Trainer::resume names the problem
          }
        }
        if (micro > 0 && micro % ranks == 0) options.grad_accum_steps = micro / ranks;
      }
    }
    // Fine-tuning reads the directory's own tokenizer unless told otherwise.
    if (!options.init_from.empty() && tokenizer_flag->count() == 0) options.tokenizer = "hf";
    try {
      options.validate();
    } catch (const std::invalid_argument& e) {
      throw UsageError(e.what());
    }
    if (flags->text.empty() == flags->data_shards.empty())
      throw UsageError("give the training data as --text FILE or --data-shards DIR (one of them)");
    if (book && !flags->data_shards.empty())
      throw UsageError("--recipe book-ch5 reads --text (the book splits the text by characters)");
    std::shared_ptr<const data::ShardedTokens> shards;
    if (!flags->data_shards.empty()) {
      shards = std::make_shared<const data::ShardedTokens>(flags->data_shards);
      if (tokenizer_flag->count() > 0 && options.tokenizer != shards->manifest().tokenizer)
        throw UsageError(fmt::format("--tokenizer {}: the shards in '{}' hold {} tokens",
                                     printable(options.tokenizer), printable(flags->data_shards),
                                     printable(shards->manifest().tokenizer)));
      options.tokenizer = shards->manifest().tokenizer;
    }
    const std::string text = shards ? std::string() : read_text_file(flags->text);
    // GPT-2's BPE reads "<|endoftext|>" by tiktoken's rule: refused unless
    // --allow-special, which makes it the token 50256 (the book's chapter 5
    // encodes with allowed_special={"<|endoftext|>"}), the document separator.
    if (options.tokenizer == "gpt2") {
      refuse_special_tokens(text, "--text '" + printable(flags->text) + "'", flags->allow_special);
    }

    const bool out_was_there = fs::exists(flags->out, ec);
    fs::create_directories(flags->out, ec);
    if (ec || !fs::is_directory(flags->out))
      throw std::runtime_error(fmt::format("--out '{}': cannot create the folder{}", printable(flags->out),
                                           ec ? ": " + ec.message() : ""));
    if (::access(flags->out.c_str(), W_OK) != 0)
      throw std::runtime_error(fmt::format("--out '{}': the folder is not writable", printable(flags->out)));
    if (have_checkpoint && !flags->resume)
      throw std::runtime_error(fmt::format(
          "--out '{}' already holds a checkpoint; pass --resume to continue it or choose another folder",
          printable(flags->out)));
    if (root) remove_stale_temporaries(flags->out);

    std::unique_ptr<train::Trainer> trainer_ptr;
    try {
      trainer_ptr = shards ? std::make_unique<train::Trainer>(shards, shards->vocab_size(), options)
                           : std::make_unique<train::Trainer>(text, options);
    } catch (...) {
      // A run that cannot start leaves no empty --out folder it made behind.
      std::error_code rm;
      if (root && !out_was_there && fs::is_empty(flags->out, rm)) fs::remove(flags->out, rm);
      throw;
    }
    train::Trainer& trainer = *trainer_ptr;
    if (mpi != nullptr) {
      // Start-up agreement, before any step: the same flags, data and binary on every rank.
      mpi->check_agreement({{"the training flags (train_args)", trainer.options().to_json()},
                            {"--resume", flags->resume ? "1" : "0"},
                            {"--deterministic", flags->deterministic ? "1" : "0"},
                            {"--shard-optimizer", flags->shard_optimizer ? "1" : "0"},
                            {shards ? "the --data-shards manifest" : "the --text file's contents",
                             shards ? shards->manifest().to_json() : text},
                            {"the attn binary (its bytes)", read_self()}});
      trainer.set_collective(mpi);
      if (flags->shard_optimizer) trainer.shard_optimizer();
    } else if (flags->shard_optimizer) {
      throw UsageError("--shard-optimizer shards AdamW's state over the ranks of an mpirun; this is one process");
    }
    options = trainer.options();  // max_iters resolved from --epochs
    if (book)
      return run_book_recipe(trainer, flags->out, save, Progress::mode_for(flags->quiet || !root));
    std::vector<std::string> metrics;
    if (flags->resume) {
      trainer.resume(checkpoint);
      saved_iter = trainer.iter();
      metrics = kept_metrics(metrics_path, trainer.last_eval_iter());
    }

    // The progress display (progress.h): on a terminal the bar on stderr; else
    // the step lines of the log on stdout every log_every steps, which are
    // this command's plain periodic lines (and the per-step losses the MPI
    // tests read); --quiet neither. Evaluations and the summary always print.
    const Progress::Mode progress_mode = Progress::mode_for(flags->quiet || !root);
    const bool bar = progress_mode == Progress::Mode::kBar;
    const bool step_lines = progress_mode == Progress::Mode::kLines;
    std::ostream& out = root ? std::cout : null_stream();
    if (mpi != nullptr || trainer.micro_batches() > 1)
      out << fmt::format(
          "data parallel: {} ranks x {} micro-batches of {} = {} windows per step{}; {} threads "
          "per rank; "
          "{} gradient buckets of {} bytes in all ({}); AdamW moments {} bytes on this rank{}\n",
          trainer.ranks(), options.grad_accum_steps, options.batch_size,
          trainer.micro_batches() * options.batch_size,
          mpi != nullptr ? fmt::format(" ({} on this host)", mpi->local_size()) : std::string(),
          omp_get_max_threads(), trainer.lm().num_blocks() + 1,
          mpi != nullptr ? mpi->bucket_bytes() : 0,
          mpi == nullptr                            ? "one process"
          : mpi->deterministic() && mpi->size() > 2 ? "rank-ordered allgather"
                                                    : "MPI_Iallreduce",
          trainer.optimizer_bytes(), trainer.sharded() ? " (sharded, ZeRO-1)" : "");
    out << fmt::format(
        "attn train: {} tokens ({}), vocabulary {}, {} train / {} val tokens{}; {} parameters; "
        "{}, context {}, batch {}{}; iterations {} -> {}\n",
        trainer.train_tokens() + trainer.val_tokens(), tokens_name(trainer), trainer.vocab_size(),
        trainer.train_tokens(), trainer.val_tokens(),
        trainer.train_loader() != nullptr
            ? fmt::format(" ({} training batches per epoch)", trainer.train_loader()->batches())
            : std::string(),
        trainer.lm().num_parameters(), model_summary(trainer), options.context_length,
        options.batch_size,
        options.rope         ? fmt::format(", RoPE (theta_base {})", options.theta_base)
        : options.latent_dim ? fmt::format(", latent attention (latent_dim {})", options.latent_dim)
                             : std::string(),
        trainer.iter(), options.max_iters);
    out.flush();

    struct sigaction sa {};
    sa.sa_handler = on_sigint;
    sa.sa_flags = SA_RESETHAND;  // a second Ctrl-C kills at once (the last checkpoint stays whole)
    sigemptyset(&sa.sa_mask);
    struct sigaction old {};
    sigaction(SIGINT, &sa, &old);
    g_stop = 0;

    using clock = std::chrono::steady_clock;
    const auto start = clock::now();
    std::vector<double> step_ms;  // since the last evaluation
    std::vector<double> all_ms;   // this process's steps
    const int64_t first_iter = trainer.iter();
    // The bar counts this process's steps (a resumed run's ETA is of what is left).
    Progress progress("train", options.max_iters - first_iter, "steps",
                      bar ? Progress::Mode::kBar : Progress::Mode::kQuiet);
    float loss = 0.0f;
    bool interrupted = false;
    const int64_t log_every = std::max<int64_t>(1, std::min<int64_t>(options.eval_interval / 5, 50));

    auto eta = [&](int64_t it) {
      return median(all_ms) * 1e-3 * static_cast<double>(options.max_iters - it);
    };
    while (true) {
      const int64_t it = trainer.iter();
      if ((it % options.eval_interval == 0 || it == options.max_iters) && trainer.last_eval_iter() != it) {
        const train::EvalResult r = trainer.evaluate(/*compute=*/root);  // the other ranks only draw
        nlohmann::ordered_json j;
        j["iter"] = r.iter;
        j["train_loss"] = r.train_loss;
        j["val_loss"] = r.val_loss;
        const double ms = median(step_ms);
        if (step_ms.empty()) {
          j["ms_per_iter"] = nullptr;  // no step since the last evaluation (iteration 0)
          j["tokens_per_s"] = nullptr;
        } else {
          j["ms_per_iter"] = ms;
          j["tokens_per_s"] = static_cast<double>(trainer.tokens_per_step()) * 1e3 / ms;
        }
        j["lr"] = options.lr_schedule == "constant" ? options.lr
                  : it < options.max_iters
                      ? optim::get_lr(it, {options.lr, options.min_lr, options.warmup_iters, options.max_iters})
                      : options.min_lr;
        j["elapsed_s"] = std::chrono::duration<double>(clock::now() - start).count();
        if (mpi != nullptr || trainer.micro_batches() > 1) {
          j["ranks"] = trainer.ranks();
          j["grad_accum_steps"] = options.grad_accum_steps;
          // Time this rank (0) sat in MPI_Waitall per step: the communication backward did not hide.
          const double wait_s = mpi != nullptr ? mpi->take_wait_seconds() : 0.0;
          j["mpi_wait_ms_per_iter"] = step_ms.empty() ? 0.0 : wait_s * 1e3 / static_cast<double>(step_ms.size());
          j["gradient_bytes"] = mpi != nullptr ? mpi->bucket_bytes() : 0;
          j["optimizer_bytes"] = trainer.optimizer_bytes();  // rank 0's AdamW moments
        }
        step_ms.clear();
        if (root && !(std::isfinite(r.train_loss) && std::isfinite(r.val_loss))) {
          throw std::runtime_error(fmt::format(
              "the run diverged by iteration {}: train loss {}, val loss {}; stopped without "
              "writing, {} (try a lower --lr or --grad-clip)",
              r.iter, r.train_loss, r.val_loss, kept()));
        }
        // metrics.jsonl first, then the checkpoint: a kill between the two leaves
        // a line past the checkpoint's last_eval_iter, which --resume drops and
        // writes again when it reaches that iteration (kept_metrics), so no
        // evaluation is ever missing.
        if (root) {
          metrics.push_back(j.dump());
          std::string all;
          for (const auto& line : metrics) all += line + "\n";
          write_file_atomically(metrics_path, all);
        }
        save(trainer);
        progress.clear();
        out << fmt::format("iter {}: train loss {:.4f}, val loss {:.4f}{}\n", r.iter, r.train_loss,
                           r.val_loss,
                           ms > 0 ? fmt::format(", {:.1f} ms/iter", ms) : std::string());
        out.flush();
      }
      if (it >= options.max_iters) break;
      if (mpi != nullptr ? mpi->any(g_stop != 0) : g_stop != 0) {  // every rank stops at the same step
        interrupted = true;
        break;
      }
      const auto t0 = clock::now();
      if (mpi != nullptr) mpi->set_step(trainer.iter());
      loss = trainer.step();
      if (!std::isfinite(loss)) {
        throw std::runtime_error(fmt::format(
            "the run diverged at iteration {}: its training loss is {}; stopped, {} (try a lower "
            "--lr or --grad-clip)",
            trainer.iter(), loss, kept()));
      }
      const double ms = std::chrono::duration<double, std::milli>(clock::now() - t0).count();
      step_ms.push_back(ms);
      all_ms.push_back(ms);
      const int64_t done = trainer.iter();
      const double tok_s = static_cast<double>(trainer.tokens_per_step()) * 1e3 / median(all_ms);
      if (bar) {
        progress.update(done - first_iter, fmt::format("loss {:.4f}  {:.0f} tok/s", loss, tok_s));
      } else if (step_lines && done % log_every == 0) {
        out << fmt::format("step {}/{} loss {:.4f} {:.0f} tok/s ETA {}\n", done, options.max_iters,
                           loss, tok_s, duration_text(eta(done)));
        out.flush();
      }
    }
    sigaction(SIGINT, &old, nullptr);
    progress.clear();
    const double wall = std::chrono::duration<double>(clock::now() - start).count();
    if (interrupted) {
      save(trainer);
      progress.clear();
      out << fmt::format(
          "interrupted after iteration {}: checkpoint written to {}; continue with --resume\n",
          trainer.iter(), printable(checkpoint));
      out.flush();
      return kInterrupted;
    }
    // The loss curve of the whole run (every evaluation in metrics.jsonl), as a picture beside it.
    const std::string loss_curve = (fs::path(flags->out) / "loss.svg").string();
    if (root) plot::write_loss_curve(metrics_path, loss_curve);
    out << fmt::format(
        "done: {} iterations in {:.1f} s ({:.1f} ms/iter median); checkpoint {}; loss curve {}\n",
        trainer.iter() - first_iter, wall, median(all_ms), printable(checkpoint),
        printable(loss_curve));
    out.flush();
    return std::cout ? 0 : 1;
  };
  auto run = [run_rank, flags]() -> int {
    if (!dist::launched()) return run_rank(nullptr);
    if (!dist::available())
      throw std::runtime_error(fmt::format(
          "started by an MPI launcher (mpirun) but {}",
          "this attn was built without MPI: install OpenMPI (apt-get install openmpi-bin libopenmpi-dev, "
          "or ./scripts/bootstrap --tests) and configure and build again"));
    auto mpi = dist::MpiCollective::init(flags->deterministic);
    try {
      return run_rank(mpi.get());
    } catch (const dist::DisagreementError& e) {
      // Every rank saw the same disagreement: rank 0 says it, all end together.
      if (mpi->rank() == 0) std::cerr << "attn: train: " << e.what() << "\n";
      return 1;
    } catch (const std::exception& e) {
      // One rank's error: say which, and end the whole job (the others may wait on it).
      std::cerr << fmt::format("attn: train: rank {} of {}: {}\n", mpi->rank(), mpi->size(), e.what());
      std::cerr.flush();
      if (mpi->size() == 1) throw;
      mpi->abort(dynamic_cast<const UsageError*>(&e) != nullptr ? 2 : 1);
    }
  };
  return Command{cmd, run};
}

}  // namespace attn::cli
