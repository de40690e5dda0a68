// eval.cpp - `attn eval` (eval.h).
#include "eval.h"

#include <fmt/format.h>

#include <fstream>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <string>

#include "attn/decoder.h"
#include "attn/generate.h"
#include "attn/hf_decoder.h"
#include "attn/hf_gpt2.h"
#include "attn/utf8.h"
#include "flag_checks.h"
#include "hf_text.h"
#include "input_file.h"
#include "model_text.h"
#include "weights.h"

namespace attn::cli {
namespace {

struct Flags {
  std::string model;
  std::string file;
  std::optional<int64_t> context;
  std::optional<int64_t> stride;
  bool json = false;
  bool allow_special = false;  // GPT-2: "<|endoftext|>" in the file is the token 50256
};

std::string read_file(const std::string& path) { return read_input_file(path, "--file"); }

// The window and stride flags against the longest window the model takes.
std::pair<int64_t, int64_t> window_of(const Flags& f, int64_t longest, int64_t fallback) {
  const int64_t context = f.context.value_or(fallback);
  if (context < 2 || context > longest) {
    throw UsageError(fmt::format(
        "eval: --context must be in 2..{} (the model's context_length), got {}", longest, context));
  }
  const int64_t stride = f.stride.value_or(std::max<int64_t>(1, context / 2));
  if (stride < 1 || stride > context) {
    throw UsageError(
        fmt::format("eval: --stride must be in 1..{} (the context), got {}", context, stride));
  }
  return {context, stride};
}

int print_result(const Flags& f, const nn::PerplexityResult& r, int64_t context, int64_t stride) {
  if (f.json) {
    nlohmann::ordered_json j;
    j["tokens"] = r.tokens;
    j["mean_loss"] = r.mean_loss;
    j["perplexity"] = r.perplexity;
    std::cout << j.dump() << '\n';
  } else {
    std::cout << fmt::format(
        "{}: {} tokens scored (context {}, stride {}): mean loss {:.6f} nats/token, perplexity "
        "{:.4f}\n",
        printable(f.file), r.tokens, context, stride, r.mean_loss, r.perplexity);
  }
  std::cout.flush();
  return std::cout ? 0 : 1;
}

// A Llama 3 / Qwen / Gemma directory: its tokenizer.json (with the BOS its
// post-processor adds, as transformers' perplexity guide encodes), windows of
// at most 4,096 tokens by default.
int run_decoder_eval(const Flags& f) {
  if (f.allow_special) {
    throw UsageError(
        "eval: --allow-special is GPT-2's; a tokenizer.json's added tokens are always matched");
  }
  const text::HfTokenizer tok = load_hf_tokenizer(f.model);
  std::unique_ptr<nn::DecoderLM> model;
  io::load_hf_decoder(f.model, model);
  const int64_t C = model->config().context_length;
  const auto [context, stride] = window_of(f, C, std::min<int64_t>(C, 4096));
  const std::vector<int64_t> ids = tok.encode(read_file(f.file));
  if (ids.size() < 2) {
    throw std::invalid_argument(fmt::format("'{}' has {} token(s); a perplexity needs at least 2",
                                            printable(f.file), ids.size()));
  }
  const nn::PerplexityResult r =
      nn::sliding_window_perplexity([&](const Tensor& window) { return model->forward(window); },
                                    model->config().vocab_size, C, ids, context, stride);
  return print_result(f, r, context, stride);
}

}  // namespace

Command add_eval_command(CLI::App& app) {
  auto flags = std::make_shared<Flags>();
  CLI::App* cmd = app.add_subcommand(
      "eval",
      "The mean cross-entropy (nats per token) and perplexity of a model on a UTF-8 text file, "
      "with the sliding window of transformers' perplexity guide");
  cmd->footer(
      "Windows of --context tokens start every --stride tokens; each scores only the tokens the "
      "previous window did not reach, so every token after the first is predicted once, from up "
      "to --context - 1 tokens before it (fewer at the start). The mean is over all scored "
      "tokens.\n\n"
      "Examples:\n"
      "  attn eval --model gpt2 --file data/the-verdict.txt\n"
      "  attn eval --model gpt2 --file data/the-verdict.txt --context 1024 --stride 512 --json");
  add_option(cmd, "-m,--model", flags->model,
             "Model directory (Hugging Face GPT-2, Llama 3, Qwen2/3, Gemma 2/3, or an attn "
             "checkpoint)")
      ->required()
      ->type_name("DIR");
  add_option(cmd, "--file", flags->file, "The text to score (UTF-8)")
      ->required()
      ->type_name("FILE");
  add_option(cmd, "--context", flags->context,
             "Tokens per window (default: the model's context_length; at most 4096 for "
             "Llama, Qwen and Gemma)")
      ->type_name("N");
  add_option(cmd, "--stride", flags->stride, "Tokens between window starts (default: context / 2)")
      ->type_name("S");
  // Within any model's context as they are parsed; the model's own bounds are checked when
  // it is read.
  in_range(cmd->get_option("--context"), int64_t{2}, int64_t{1} << 20);
  in_range(cmd->get_option("--stride"), int64_t{1}, int64_t{1} << 20);
  cmd->add_flag("--json", flags->json,
                "Print {\"tokens\": ..., \"mean_loss\": ..., \"perplexity\": ...}");
  cmd->add_flag("--allow-special", flags->allow_special,
                "GPT-2 models: encode \"<|endoftext|>\" in the file as the special token 50256 "
                "(else a file holding it is refused, as tiktoken refuses it)");
  auto run = [flags]() -> int {
    const Flags& f = *flags;
    require_model_dir(f.model);
    if (io::is_hf_decoder_dir(f.model)) return run_decoder_eval(f);
    std::unique_ptr<nn::GPTModel> model;
    const io::ModelDir md = io::load_model_dir(f.model, model);
    const int64_t C = md.config.context_length;
    const auto [context, stride] = window_of(f, C, C);
    const std::vector<int64_t> ids = ModelText(md).encode(
        read_file(f.file), "--file '" + printable(f.file) + "'", f.allow_special);
    if (ids.size() < 2) {
      throw std::invalid_argument(fmt::format(
          "'{}' has {} token(s); a perplexity needs at least 2", printable(f.file), ids.size()));
    }
    return print_result(f, nn::sliding_window_perplexity(*model, ids, context, stride), context,
                        stride);
  };
  return Command{cmd, run};
}

}  // namespace attn::cli
