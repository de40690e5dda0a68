// progress.cpp - the progress display (progress.h).
#include "progress.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <iostream>

namespace attn::cli {

std::string duration_text(double seconds) {
  const auto s = static_cast<int64_t>(std::max(0.0, seconds) + 0.5);
  if (s >= 3600) return fmt::format("{}h{:02}m", s / 3600, (s / 60) % 60);
  if (s >= 60) return fmt::format("{}m{:02}s", s / 60, s % 60);
  return fmt::format("{}s", s);
}

Progress::Mode Progress::mode_for(bool quiet) {
  if (quiet) return Mode::kQuiet;
  const char* term = std::getenv("TERM");
  const bool terminal = ::isatty(STDERR_FILENO) == 1 && term != nullptr &&
                        std::strcmp(term, "dumb") != 0 && std::getenv("CI") == nullptr;
  return terminal ? Mode::kBar : Mode::kLines;
}

Progress::Progress(std::string label, int64_t total, std::string unit, Mode mode, double scale)
    : label_(std::move(label)), unit_(std::move(unit)), scale_(scale), total_(total), mode_(mode) {
  start_ = last_ = clock::now();
}

Progress::~Progress() {
  // A display cut short by an exception leaves the terminal on a fresh line.
  if (mode_ == Mode::kBar && drawn_ && !finished_) std::cerr << "\n" << std::flush;
}

void Progress::update(int64_t done, const std::string& note) {
  if (finished_ || mode_ == Mode::kQuiet) return;
  done_ = done;
  note_ = note;
  const auto now = clock::now();
  const auto every =
      mode_ == Mode::kBar ? std::chrono::milliseconds(100) : std::chrono::milliseconds(10000);
  if (now - last_ < every && !(total_ > 0 && done_ >= total_)) return;
  last_ = now;
  draw(false);
}

void Progress::message(const std::string& line) {
  if (mode_ == Mode::kQuiet) return;
  if (mode_ == Mode::kBar && drawn_) std::cerr << "\r\033[K";
  std::cerr << line << "\n" << std::flush;
  drawn_ = false;
}

void Progress::clear() {
  if (mode_ == Mode::kBar && drawn_) {
    std::cerr << "\r\033[K" << std::flush;
    drawn_ = false;
  }
}

void Progress::finish() {
  if (finished_ || mode_ == Mode::kQuiet) return;
  if (!(mode_ == Mode::kLines && drawn_done_ == done_)) draw(true);
  finished_ = true;
}

std::string Progress::count(int64_t n) const {
  if (scale_ == 1.0) return std::to_string(n);
  return fmt::format("{:.1f}", static_cast<double>(n) / scale_);
}

void Progress::draw(bool last) {
  drawn_done_ = done_;
  const double elapsed = std::chrono::duration<double>(clock::now() - start_).count();
  const double rate = elapsed > 0 ? static_cast<double>(done_) / elapsed : 0.0;
  std::string eta;
  if (total_ > 0 && rate > 0 && done_ < total_ && !last) {
    eta = duration_text(static_cast<double>(total_ - done_) / rate);
  }
  const std::string rate_text = fmt::format("{:.1f} {}/s", rate / scale_, unit_);
  if (mode_ == Mode::kBar) {
    std::string line = label_ + " ";
    if (total_ > 0) {
      constexpr int64_t kWidth = 24;
      const int64_t filled = std::min(kWidth, kWidth * done_ / total_);
      // (fmt::format rather than "[" + std::string(...): that trips GCC 12's
      // false -Wrestrict at -O3.)
      line += fmt::format("[{}{}] ", std::string(static_cast<size_t>(filled), '#'),
                          std::string(static_cast<size_t>(kWidth - filled), '.'));
      line += fmt::format("{}/{} {}", count(done_), count(total_), unit_);
    } else {
      line += fmt::format("{} {}", count(done_), unit_);
    }
    line += fmt::format("  {}", rate_text);
    line +=
        eta.empty() ? fmt::format("  {}", duration_text(elapsed)) : fmt::format("  ETA {}", eta);
    if (!note_.empty()) line += fmt::format("  {}", note_);
    std::cerr << "\r\033[K" << line << (last ? "\n" : "") << std::flush;
    drawn_ = !last;
    return;
  }
  std::string line = label_ + ": ";
  if (total_ > 0) {
    line += fmt::format("{}/{} {} ({:.0f}%)", count(done_), count(total_), unit_,
                        100.0 * static_cast<double>(done_) / static_cast<double>(total_));
  } else {
    line += fmt::format("{} {}", count(done_), unit_);
  }
  line += fmt::format(", {}", rate_text);
  line += eta.empty() ? fmt::format(", {}", duration_text(elapsed)) : fmt::format(", ETA {}", eta);
  if (!note_.empty()) line += fmt::format(", {}", note_);
  std::cerr << line << "\n" << std::flush;
}

}  // namespace attn::cli
