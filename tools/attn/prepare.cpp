// `attn prepare` (prepare.h).
#include "prepare.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "attn/token_shards.h"
#include "attn/utf8.h"
#include "flag_checks.h"
#include "progress.h"
#include "special_tokens.h"

namespace attn::cli {

Command add_prepare_command(CLI::App& app) {
  struct Flags {
    std::vector<std::string> inputs;
    std::string out;
    data::PrepareOptions o;
    bool verify = false;
    bool allow_special = false;
    bool quiet = false;
  };
  auto flags = std::make_shared<Flags>();
  CLI::App* cmd = app.add_subcommand(
      "prepare",
      "Tokenize a corpus of UTF-8 text files once, in parallel, into memory-mapped token shards "
      "(uint16 tokens behind a header with the vocabulary, the count and an FNV-1a checksum) and "
      "DIR/manifest.json, for attn train --data-shards DIR");
  cmd->footer(
      "The files are tokenized in order, with GPT-2's end-of-text token (50256) between them as "
      "the document separator; \"<|endoftext|>\" inside a file is refused unless "
      "--allow-special, which makes it that token too (tiktoken's rule, as in every attn "
      "command). The ids equal those of tokenizing each "
      "file whole, one after the other, for any --threads.\n"
      "Format: docs/distributed.md and include/attn/token_shards.h.\n"
      "Examples:\n"
      "  attn prepare --tokenizer gpt2 data/tinyshakespeare.txt --out shakespeare\n"
      "  attn prepare --tokenizer gpt2 corpus/*.txt --out corpus-tok --shard-tokens 100000000 "
      "--threads 16\n"
      "  attn train --data-shards shakespeare --out run --context-length 256 --batch-size 4");
  add_option(cmd, "inputs", flags->inputs, "The text files (UTF-8)")
      ->required()
      ->type_name("IN...");
  add_option(cmd, "--out", flags->out,
             "Folder for shard-NNNNN.tok and manifest.json (created; must not hold a manifest)")
      ->required()
      ->type_name("DIR");
  add_option(cmd, "--tokenizer", flags->o.tokenizer, "gpt2: GPT-2's byte-level BPE (50,257 tokens)")
      ->required()
      ->type_name("NAME");
  add_option(cmd, "--shard-tokens", flags->o.shard_tokens, "Tokens per shard (2 bytes each)")
      ->capture_default_str()
      ->type_name("N");
  add_option(cmd, "-t,--threads", flags->o.threads, "Tokenizer threads (0: every core)")
      ->capture_default_str()
      ->type_name("N");
  // A shard is held in memory until written (2 bytes a token): 2^30 tokens, 2 GiB (issue 46).
  in_range(cmd->get_option("--shard-tokens"), int64_t{1}, int64_t{data::kMaxShardTokens});
  in_range(cmd->get_option("--threads"), int64_t{0}, int64_t{4096});
  cmd->add_flag("--verify", flags->verify, "Read the shards back and check their checksums");
  cmd->add_flag("-q,--quiet", flags->quiet, "No progress display on stderr");
  cmd->add_flag("--allow-special", flags->allow_special,
                "Encode \"<|endoftext|>\" inside a file as the token 50256, a document separator "
                "(else a file holding it is refused, as tiktoken refuses it)");
  auto run = [flags]() -> int {
    if (flags->o.tokenizer != "gpt2")
      throw UsageError(
          fmt::format("--tokenizer must be gpt2, got '{}'", printable(flags->o.tokenizer, 64)));
    // Every file before any is written: tiktoken's rule for "<|endoftext|>".
    for (const auto& input : flags->inputs)
      refuse_special_tokens_in_file(input, flags->allow_special);
    const auto start = std::chrono::steady_clock::now();
    // The progress display (progress.h): megabytes of input tokenized.
    int64_t total_bytes = 0;
    for (const auto& input : flags->inputs) {
      std::error_code ec;
      if (std::filesystem::is_regular_file(input, ec)) {
        const auto size = std::filesystem::file_size(input, ec);
        if (!ec) total_bytes += static_cast<int64_t>(size);
      }
    }
    Progress progress("prepare", total_bytes, "MB", Progress::mode_for(flags->quiet), 1e6);
    data::PrepareOptions o = flags->o;
    o.on_progress = [&progress](int64_t bytes) { progress.update(bytes); };
    const data::Manifest m = data::prepare_token_shards(flags->inputs, flags->out, o);
    progress.finish();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (flags->verify) data::ShardedTokens check(flags->out, /*verify=*/true);
    std::cout << fmt::format("attn prepare: {} file{} -> {} tokens ({}) in {} shard{}, {:.1f} s ({:.2f} M tokens/s){}; {}\n",
                             m.documents, m.documents == 1 ? "" : "s", m.tokens, m.tokenizer, m.shards.size(),
                             m.shards.size() == 1 ? "" : "s", s,
                             static_cast<double>(m.tokens) / std::max(s, 1e-9) * 1e-6,
                             flags->verify ? ", verified" : "",
                             printable(flags->out + "/" + data::kManifestName));
    std::cout.flush();
    return std::cout ? 0 : 1;
  };
  return Command{cmd, run};
}

}  // namespace attn::cli
