// walkthrough.cpp - `attn walkthrough`: the flags, and the dispatch to the
// chapter that --chapter names (walkthrough_ch3.h, walkthrough_ch4.h,
// walkthrough_ch5.h) and to the pictures of chapter 3 (walkthrough_pictures.h).
#include "walkthrough.h"

#include <fmt/format.h>

#include <charconv>
#include <iostream>
#include <limits>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "attn/utf8.h"
#include "flag_checks.h"
#include "progress.h"
#include "walkthrough_ch3.h"
#include "walkthrough_ch4.h"
#include "walkthrough_ch5.h"
#include "walkthrough_pictures.h"
#include "walkthrough_sections.h"

namespace attn::cli {
namespace {

// A chapter's section names joined by ", ", for --section's help.
std::string joined_names(const std::vector<WalkthroughSection>& sections) {
  std::string names;
  for (const auto& info : sections) names += (names.empty() ? "" : ", ") + info.name;
  return names;
}

}  // namespace

uint64_t parse_seed(const std::string& text) {
  const char* first = text.data();
  const char* last = text.data() + text.size();
  if (!text.empty() && text[0] == '-') {
    int64_t v = 0;
    const auto [end, ec] = std::from_chars(first, last, v);
    if (ec == std::errc() && end == last) return static_cast<uint64_t>(v);  // wraps, as in torch
  } else {
    uint64_t v = 0;
    const auto [end, ec] = std::from_chars(first, last, v);
    if (ec == std::errc() && end == last) return v;
  }
  throw UsageError(
      fmt::format("--seed: '{}' is not an integer in [{}, {}] (what torch.manual_seed accepts)",
                  printable(text, 64), std::numeric_limits<int64_t>::min(),
                  std::numeric_limits<uint64_t>::max()));
}

Command add_walkthrough_command(CLI::App& app) {
  struct Flags {
    std::vector<std::string> sections;
    std::string seed;
    bool json = false;
    std::string json_out;
    std::string plot_dir;
    std::string html_out;
    bool heatmap = false;
    int chapter = 3;
    std::string text = "data/the-verdict.txt";
    int64_t epochs = 10;
    bool quiet = false;
  };
  auto flags = std::make_shared<Flags>();

  std::string sections_help = "Chapter 3's sections, in this order:\n";
  for (const auto& info : walkthrough_ch3_sections()) {
    sections_help += fmt::format("  {:<15} {}\n", info.name, info.title.substr(3));
  }
  sections_help += "Chapter 4's sections (--chapter 4), in this order:\n";
  for (const auto& info : walkthrough_ch4_sections()) {
    sections_help += fmt::format("  {:<15} {}\n", info.name, info.title.substr(3));
  }
  sections_help +=
      "Chapter 5's sections (--chapter 5), in this order; the notebook with its training "
      "(about 10 minutes on 2 cores; saving the model and GPT-2's weights are not part of "
      "it; trained_generate and top_k_generate train first when train is not chosen):\n";
  for (const auto& info : walkthrough_ch5_sections()) {
    sections_help += fmt::format("  {:<15} {}\n", info.name, info.title.substr(3));
  }
  CLI::App* cmd = app.add_subcommand(
      "walkthrough",
      "The chapter's worked examples on \"Your journey starts with one step\", every tensor "
      "printed the way PyTorch 1.13 prints it; --chapter 4: the GPT chapter's notebook; "
      "--chapter 5: the pretraining chapter's notebook, its training included");
  cmd->footer(sections_help);
  add_option(cmd, "--chapter", flags->chapter,
             "3 (the default): the attention chapter's examples; 4: the GPT chapter's "
             "notebook (GPT_CONFIG_124M under torch.manual_seed(123), its logits, "
             "parameter counts and greedy generation); 5: the pretraining chapter's "
             "notebook (generation, the loss, The Verdict's loaders, the untrained "
             "model's losses, train_model_simple's 10 epochs, the trained model's text, "
             "temperature and top-k on the 9-word vocabulary and with the trained "
             "model); progress on stderr")
      ->type_name("N");
  add_option(cmd, "--section", flags->sections,
             "Run only this section (repeatable, or comma-separated); chapter 3: " +
                 joined_names(walkthrough_ch3_sections()) +
                 "; chapter 4: " + joined_names(walkthrough_ch4_sections()) +
                 "; chapter 5: " + joined_names(walkthrough_ch5_sections()))
      ->delimiter(',')
      ->type_name("NAME");
  CLI::Option* seed_opt =
      add_option(cmd, "--seed", flags->seed, "Use this seed for every torch.manual_seed")
          ->type_name("N");
  cmd->add_flag("--json", flags->json,
                "Print a JSON array of every tensor: section, name, explanation, shape, values "
                "(row-major; inf, -inf, nan as strings), text (as PyTorch prints it)");
  add_option(cmd, "--json-out", flags->json_out, "Also write that JSON array to FILE (atomically)")
      ->type_name("FILE");
  CLI::Option* text_opt =
      add_option(cmd, "--text", flags->text,
                 "Chapter 5: the notebook's the-verdict.txt (default: data/the-verdict.txt)")
          ->type_name("FILE");
  CLI::Option* epochs_opt =
      add_option(cmd, "--epochs", flags->epochs,
                 "Chapter 5: train this many epochs instead of the notebook's 10 (the first "
                 "epochs print the same; the trained model's sections then use this model)")
          ->type_name("N");
  CLI::Option* plot_opt =
      add_option(cmd, "--plot", flags->plot_dir,
                 "Write every attention matrix as a heatmap, NN-section-name.svg and .png, and "
                 "index.html listing them, into DIR (created if missing)")
          ->type_name("DIR");
  CLI::Option* html_opt =
      add_option(cmd, "--html", flags->html_out,
                 "Write the whole walkthrough as one self-contained HTML page: every step, its "
                 "PyTorch line, its tensor and its heatmap")
          ->type_name("FILE");
  cmd->add_flag("-q,--quiet", flags->quiet,
                "Chapters 4 and 5: no progress on stderr (the lines of the slow parts, the "
                "training's progress display)");
  cmd->add_flag(
      "--heatmap", flags->heatmap,
      "Print every attention matrix as a heatmap: truecolour blocks on a terminal, numbers when "
      "stdout is not a terminal or NO_COLOR is set");

  // Chapter 4: the notebook's prints; the pictures and --seed are chapter 3's.
  auto run_chapter4 = [flags, seed_opt, plot_opt, html_opt]() -> int {
    for (const CLI::Option* opt : {seed_opt, plot_opt, html_opt}) {
      if (opt->count() > 0) {
        throw UsageError(
            fmt::format("{} is chapter 3's: chapter 4 prints the notebook as it runs, with its "
                        "torch.manual_seed(123) and no attention matrices to draw",
                        opt->get_name()));
      }
    }
    if (flags->heatmap) {
      throw UsageError(
          "--heatmap is chapter 3's: chapter 4 prints the notebook, which has no attention "
          "matrices to draw");
    }
    for (const auto& name : flags->sections) {
      try {
        check_ch4_section(name);
      } catch (const std::invalid_argument& e) {
        throw UsageError(e.what());
      }
    }
    const std::vector<Printed> printed =
        run_walkthrough_ch4(flags->sections, [quiet = flags->quiet](const std::string& line) {
          if (!quiet) std::cerr << "walkthrough: " << line << std::endl;
        });
    if (!flags->json_out.empty()) write_file_atomically(flags->json_out, printed_to_json(printed));
    std::cout << (flags->json ? printed_to_json(printed) : ch4_to_text(printed)) << std::flush;
    return 0;
  };

  // Chapter 5: as chapter 4, with --text for the-verdict.txt.
  auto run_chapter5 = [flags, seed_opt, plot_opt, html_opt]() -> int {
    for (const CLI::Option* opt : {seed_opt, plot_opt, html_opt}) {
      if (opt->count() > 0) {
        throw UsageError(
            fmt::format("{} is chapter 3's: chapter 5 prints the notebook as it runs, with its "
                        "torch.manual_seed(123) and no attention matrices to draw",
                        opt->get_name()));
      }
    }
    if (flags->heatmap) {
      throw UsageError(
          "--heatmap is chapter 3's: chapter 5 prints the notebook, which has no attention "
          "matrices to draw");
    }
    for (const auto& name : flags->sections) {
      try {
        check_ch5_section(name);
      } catch (const std::invalid_argument& e) {
        throw UsageError(e.what());
      }
    }
    // Each epoch of the notebook's model takes seconds: 1000 bounds the run (issue 46).
    if (flags->epochs < 1 || flags->epochs > 1000) {
      throw UsageError(fmt::format("--epochs must be in 1..1000 (the notebook trains 10), got {}",
                                   flags->epochs));
    }
    // The training's steps on the progress display (progress.h), its other
    // lines through it so that a bar is not torn.
    const Progress::Mode mode = Progress::mode_for(flags->quiet);
    std::unique_ptr<Progress> training;
    Ch5Options options;
    options.text_path = flags->text;
    options.num_epochs = flags->epochs;
    options.on_train_step = [&training, mode](int64_t done, int64_t total, float loss) {
      if (!training)
        training =
            std::make_unique<Progress>("walkthrough: train_model_simple", total, "steps", mode);
      training->update(done, fmt::format("loss {:.4f}", loss));
      if (done == total) training->finish();
    };
    const std::vector<Printed> printed =
        run_walkthrough_ch5(flags->sections, options, [&training, mode](const std::string& line) {
          if (mode == Progress::Mode::kQuiet) return;
          if (training) {
            training->message("walkthrough: " + line);
          } else {
            std::cerr << "walkthrough: " << line << std::endl;
          }
        });
    if (!flags->json_out.empty()) write_file_atomically(flags->json_out, printed_to_json(printed));
    std::cout << (flags->json ? printed_to_json(printed) : ch5_to_text(printed)) << std::flush;
    return 0;
  };

  auto run = [flags, seed_opt, plot_opt, html_opt, text_opt, epochs_opt, run_chapter4,
              run_chapter5]() -> int {
    if (flags->chapter == 5) return run_chapter5();
    if (text_opt->count() > 0) {
      throw UsageError(fmt::format(
          "--text is chapter 5's (the notebook's the-verdict.txt); this is chapter {}",
          flags->chapter));
    }
    if (epochs_opt->count() > 0) {
      throw UsageError(fmt::format(
          "--epochs is chapter 5's (the training cell's num_epochs); this is chapter {}",
          flags->chapter));
    }
    if (flags->chapter == 4) return run_chapter4();
    if (flags->chapter != 3) {
      throw UsageError(fmt::format(
          "--chapter {}: attn walkthrough has chapters 3 (attention), 4 (the GPT model) and 5 "
          "(pretraining)",
          flags->chapter));
    }
    WalkthroughOptions options;
    options.sections = flags->sections;
    if (seed_opt->count() > 0) options.seed = parse_seed(flags->seed);
    for (const auto& name : options.sections) {
      try {
        check_ch3_section(name);
      } catch (const std::invalid_argument& e) {
        throw UsageError(e.what());
      }
    }
    if (flags->json && flags->heatmap) {
      throw UsageError("--json and --heatmap both choose what stdout prints: give one of them");
    }
    for (const CLI::Option* path : {plot_opt, html_opt}) {
      if (path->count() > 0 && path->as<std::string>().empty()) {
        throw UsageError(fmt::format("{}: the path is empty", path->get_name()));
      }
    }
    const std::vector<Shown> shown = run_walkthrough_ch3(options);
    if (!flags->json_out.empty()) write_file_atomically(flags->json_out, ch3_to_json(shown));
    std::string report;  // what --plot and --html wrote
    if (!flags->html_out.empty()) {
      write_file_atomically(flags->html_out, walkthrough_html(shown, options.seed));
      report += fmt::format("wrote {}\n", flags->html_out);
    }
    if (!flags->plot_dir.empty()) {
      const std::vector<std::string> files = write_plots(shown, flags->plot_dir);
      report += fmt::format("wrote {} files to {} (index.html lists them)\n", files.size(),
                            flags->plot_dir);
    }
    if (flags->json) {
      std::cout << ch3_to_json(shown);
    } else if (flags->heatmap) {
      std::cout << walkthrough_heatmaps(shown, stdout_wants_colour());
    } else if (!report.empty()) {
      std::cout << report;
    } else {
      std::cout << ch3_to_text(shown, options.seed);
    }
    std::cout << std::flush;
    return 0;
  };
  return Command{cmd, run};
}

}  // namespace attn::cli
