// walkthrough.h - `attn walkthrough`: the book's chapters printed the way PyTorch
// 1.13 prints them. The command sits above its chapters: --chapter 3 (the
// default, the attention chapter's worked examples) is walkthrough_ch3.h, with
// its pictures in walkthrough_pictures.h; --chapter 4 (the GPT chapter's
// notebook) is walkthrough_ch4.h; --chapter 5 (the pretraining chapter's
// notebook) is walkthrough_ch5.h. What the chapters share is
// walkthrough_sections.h.
#pragma once

#include <cstdint>
#include <string>

#include "command.h"

namespace attn::cli {

// Parses a seed as torch.manual_seed takes it: a decimal integer in
// [-2^63, 2^64 - 1], negative values wrapping to uint64 as in PyTorch.
// Throws UsageError naming the text otherwise.
uint64_t parse_seed(const std::string& text);

// Registers the `walkthrough` subcommand on the app.
Command add_walkthrough_command(CLI::App& app);

}  // namespace attn::cli
