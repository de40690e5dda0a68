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

#include "attn/generate.h"
#include "attn/hf_gpt2.h"
#include "attn/utf8.h"
#include "model_text.h"

namespace attn::cli {

Command add_eval_command(CLI::App& app) {
  struct Flags {
    std::string model;
    std::string file;
    std::optional<int64_t> context;
    std::optional<int64_t> stride;
    bool json = false;
  };
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
  cmd->add_option("--model", flags->model, "Model directory (Hugging Face GPT-2 or attn checkpoint)")
      ->required()
      ->type_name("DIR");
  cmd->add_option("--file", flags->file, "The text to score (UTF-8)")->required()->type_name("FILE");
  cmd->add_option("--context", flags->context,
                  "Tokens per window (default: the model's context_length)")
      ->type_name("N");
  cmd->add_option("--stride", flags->stride, "Tokens between window starts (default: context / 2)")
      ->type_name("S");
  cmd->add_flag("--json", flags->json,
                "Print {\"tokens\": ..., \"mean_loss\": ..., \"perplexity\": ...}");
  auto run = [flags]() -> int {
    const Flags& f = *flags;
    std::unique_ptr<nn::GPTModel> model;
    const io::ModelDir md = io::load_model_dir(f.model, model);
    const int64_t C = md.config.context_length;
    const int64_t context = f.context.value_or(C);
    if (context < 2 || context > C) {
      throw UsageError(fmt::format(
          "eval: --context must be in 2..{} (the model's context_length), got {}", C, context));
    }
    const int64_t stride = f.stride.value_or(std::max<int64_t>(1, context / 2));
    if (stride < 1 || stride > context) {
      throw UsageError(
          fmt::format("eval: --stride must be in 1..{} (the context), got {}", context, stride));
    }
    std::ifstream in(f.file, std::ios::binary);
    if (!in) throw std::runtime_error(fmt::format("cannot read '{}'", printable(f.file)));
    std::ostringstream text;
    text << in.rdbuf();
    const std::vector<int64_t> ids = ModelText(md).encode(text.str());
    if (ids.size() < 2) {
      throw std::invalid_argument(fmt::format(
          "'{}' has {} token(s); a perplexity needs at least 2", printable(f.file), ids.size()));
    }
    const nn::PerplexityResult r = nn::sliding_window_perplexity(*model, ids, context, stride);
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
  };
  return Command{cmd, run};
}

}  // namespace attn::cli
