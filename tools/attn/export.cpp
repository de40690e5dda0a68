// export.cpp - `attn export` (export.h).
#include "export.h"

#include <fmt/format.h>

#include <filesystem>
#include <iostream>
#include <memory>
#include <string>

#include "attn/char_tokenizer.h"
#include "attn/checkpoint.h"
#include "attn/hf_decoder.h"
#include "attn/hf_gpt2.h"
#include "attn/hf_tokenizer.h"
#include "attn/model_config.h"
#include "attn/read_file.h"
#include "attn/safetensors.h"
#include "attn/state_dict.h"
#include "attn/tokenizer.h"
#include "attn/utf8.h"
#include "flag_checks.h"
#include "weights.h"

namespace attn::cli {
namespace {

namespace fs = std::filesystem;

struct Flags {
  std::string model;
  std::string format;
  std::string out;
  std::string dtype = "float32";
  bool force = false;
};

constexpr int64_t kGpt2VocabSize = 50257;

// A Llama / Qwen / Gemma directory written again in the Hub layout (one
// model.safetensors in float32 or bfloat16, config.json in today's form), its
// tokenizer files copied: a sharded or float16 download made one file, or a
// float32 fine-tune made bf16.
int export_decoder(const Flags& f) {
  if (f.format != "hf") {
    throw UsageError(fmt::format(
        "export: '{}' is a {} directory; it exports as --format hf (the book's names are GPT's)",
        printable(f.model), io::read_hf_decoder_config(f.model).model_type));
  }
  if (f.dtype != "float32" && f.dtype != "bfloat16") {
    throw UsageError(
        fmt::format("export: a Llama / Qwen / Gemma directory is written in float32 or bfloat16, "
                    "got --dtype {}",
                    printable(f.dtype)));
  }
  const DType dtype = f.dtype == "bfloat16" ? DType::kBFloat16 : DType::kFloat32;
  std::unique_ptr<nn::DecoderLM> model;
  const io::HfDecoderInfo info = io::load_hf_decoder(f.model, model, dtype);
  io::HfDecoderSaveOptions options;
  options.dtype = dtype;
  const fs::path src(f.model);
  if (fs::is_regular_file(src / "tokenizer.json")) {
    options.tokenizer_json = read_file((src / "tokenizer.json").string());
    // Copied only when it reads as a tokenizer (checked before anything is written).
    (void)text::HfTokenizer::from_json(options.tokenizer_json, (src / "tokenizer.json").string());
  }
  if (fs::is_regular_file(src / "tokenizer_config.json"))
    options.tokenizer_config_json = read_file((src / "tokenizer_config.json").string());
  io::save_hf_decoder(*model, info.hf, f.out, options);
  // A chat template kept in a file of its own travels too.
  for (const char* name : {"chat_template.jinja", "chat_template.json"}) {
    if (fs::is_regular_file(src / name))
      write_file_atomically((fs::path(f.out) / name).string(), read_file((src / name).string()));
  }
  std::cout << fmt::format("wrote {} (hf format, {} {}, {} parameters)\n", printable(f.out),
                           info.hf.model_type, f.dtype, model->num_parameters());
  std::cout.flush();
  return std::cout ? 0 : 1;
}

// --out onto a training run or another model would replace its files (a
// run's checkpoint with its optimizer state, so --resume fails): refused
// unless --force, naming what is there.
void check_out_folder(const Flags& f) {
  std::error_code ec;
  if (f.force || !fs::exists(f.out, ec)) return;
  if (!fs::is_directory(f.out, ec)) {
    throw std::runtime_error(
        fmt::format("--out '{}' exists and is not a folder", printable(f.out)));
  }
  for (const char* name : {"checkpoint.safetensors", "model.safetensors",
                           "model.safetensors.index.json", "config.json", "metrics.jsonl"}) {
    if (fs::exists(fs::path(f.out) / name, ec)) {
      throw std::runtime_error(fmt::format(
          "--out '{}' already holds {} (a training run or another model); choose another folder "
          "or pass --force to replace its files",
          printable(f.out), name));
    }
  }
}

}  // namespace

Command add_export_command(CLI::App& app) {
  auto flags = std::make_shared<Flags>();
  CLI::App* cmd = app.add_subcommand(
      "export",
      "Write a model directory (Hugging Face GPT-2 or attn checkpoint) as a Hugging Face GPT-2 "
      "directory (config.json + model.safetensors, loadable by "
      "transformers.GPT2LMHeadModel.from_pretrained) or as an attn checkpoint with the book's "
      "names; a Llama 3 / Qwen2 / Qwen3 / Gemma 2 / Gemma 3 directory again in the Hub layout");
  cmd->footer(
      "--format hf: DIR/config.json and DIR/model.safetensors (names transformer.*, Conv1D "
      "layout), --dtype float32, bfloat16 or float16; a source's vocab.json and merges.txt are "
      "copied. --format book: DIR/checkpoint.safetensors with attn's (the book's) names, float32, "
      "as attn train writes it. A Llama / Qwen / Gemma directory (attn train --arch or --init-from "
      "writes one too) exports as --format hf only: one model.safetensors in --dtype float32 or "
      "bfloat16, config.json in transformers 5's form, its tokenizer.json, tokenizer_config.json "
      "and chat template copied. Every file is written atomically; an --out that already holds a "
      "checkpoint, a model or a training run's metrics.jsonl is refused unless --force.\n\n"
      "Examples:\n"
      "  attn export --model gpt2 --format book --out gpt2-book\n"
      "  attn export --model gpt2-book --format hf --dtype bfloat16 --out gpt2-bf16\n"
      "  attn export --model Qwen3-0.6B --format hf --dtype bfloat16 --out qwen3-bf16");
  add_option(cmd, "-m,--model", flags->model, "The source model directory")
      ->required()
      ->type_name("SRC");
  add_option(cmd, "--format", flags->format, "hf or book")->required()->type_name("FORMAT");
  add_option(cmd, "--out", flags->out, "The directory to write (created)")
      ->required()
      ->type_name("DIR");
  add_option(cmd, "--dtype", flags->dtype,
             "--format hf: the weights' dtype, float32 (default), bfloat16 or float16")
      ->type_name("DTYPE");
  cmd->add_flag("--force", flags->force,
                "Write into --out even when it holds a checkpoint, a model or a training run's "
                "metrics (their files are replaced)");

  auto run = [flags]() -> int {
    const Flags& f = *flags;
    if (f.format != "hf" && f.format != "book") {
      throw UsageError(
          fmt::format("export: --format must be hf or book, got '{}'", printable(f.format)));
    }
    io::HfDType dtype{};
    try {
      dtype = io::hf_dtype_from_name(f.dtype);
    } catch (const std::invalid_argument& e) {
      throw UsageError(fmt::format("export: --{}", e.what()));
    }
    if (f.format == "book" && dtype != io::HfDType::kFloat32) {
      throw UsageError(fmt::format(
          "export: --format book writes float32 (attn's checkpoints hold float32 weights), got "
          "--dtype {}",
          printable(f.dtype)));
    }
    require_model_dir(f.model);
    check_out_folder(f);
    if (io::is_hf_decoder_dir(f.model)) return export_decoder(f);
    std::unique_ptr<nn::GPTModel> model;
    const io::ModelDir md = io::load_model_dir(f.model, model);
    const nn::GPTConfig& c = md.config;
    if (f.format == "hf") {
      // An attn checkpoint needs GPT-2's whole vocabulary; a Hugging Face source
      // (re-written, e.g. in another dtype) is GPT-2 whatever its size.
      if (md.kind == io::ModelDir::Kind::kAttnCheckpoint &&
          (md.tokenizer != "gpt2" || c.vocab_size != kGpt2VocabSize)) {
        throw std::invalid_argument(fmt::format(
            "'{}' has a {} vocabulary of {} tokens; a Hugging Face GPT-2 directory needs GPT-2's "
            "(the byte-level BPE, 50257 tokens): export a model trained with the gpt2 tokenizer "
            "(checkpoint metadata \"tokenizer\": \"gpt2\"), or use --format book",
            printable(f.model), md.tokenizer == "char" ? "character-level" : "non-GPT-2",
            c.vocab_size));
      }
      // The source's vocab.json and merges.txt travel with it only when they
      // read as a tokenizer (checked before anything is written).
      const fs::path vocab = fs::path(f.model) / "vocab.json",
                     merges = fs::path(f.model) / "merges.txt";
      if (md.kind == io::ModelDir::Kind::kHuggingFace && fs::is_regular_file(vocab) &&
          fs::is_regular_file(merges)) {
        (void)text::Tokenizer::from_files(vocab.string(), merges.string());
      }
      io::save_hf_gpt2(*model, f.out, dtype);
      // The source's own tokenizer files travel with it; an attn checkpoint
      // trained on GPT-2's BPE gets GPT-2's.
      bool copied = false;
      for (const char* name : {"vocab.json", "merges.txt"}) {
        const fs::path src = fs::path(f.model) / name;
        if (md.kind == io::ModelDir::Kind::kHuggingFace && fs::is_regular_file(src)) {
          write_file_atomically((fs::path(f.out) / name).string(), read_file(src.string()));
          copied = true;
        }
      }
      if (!copied && md.kind == io::ModelDir::Kind::kAttnCheckpoint) text::write_gpt2_vocabulary(f.out);
    } else {
      std::error_code ec;
      fs::create_directories(f.out, ec);
      if (ec) {
        throw std::runtime_error(fmt::format("cannot create the directory '{}': {}",
                                             printable(f.out), ec.message()));
      }
      std::map<std::string, std::string> metadata = {
          {"format", nn::kCheckpointFormat},
          {"config", nn::config_to_json(c)},
          {"tokenizer", md.tokenizer}};
      if (md.tokenizer == "char") metadata["vocab"] = text::CharTokenizer(md.vocab).to_json();
      io::save_state_dict(*model, (fs::path(f.out) / "checkpoint.safetensors").string(), metadata);
    }
    std::cout << fmt::format("wrote {} ({} format{}, {} parameters)\n", printable(f.out), f.format,
                             f.format == "hf" ? ", " + f.dtype : std::string(),
                             model->num_parameters());
    std::cout.flush();
    return std::cout ? 0 : 1;
  };
  return Command{cmd, run};
}

}  // namespace attn::cli
