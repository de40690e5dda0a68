// progress.h - the one progress display of the long commands (attn prepare,
// attn train, its book recipe, walkthrough --chapter 5's training), on stderr:
//
//   a terminal   one line redrawn at most 10 times a second, as tqdm and
//                cargo draw it:
//                  train [########................] 120/500 steps  3.2 steps/s  ETA 1m58s
//                  loss 2.4856
//   otherwise    a plain line at most every 10 s, and the last one:
//                  train: 120/500 steps (24%), 3.2 steps/s, ETA 1m58s, loss 2.4856
//   --quiet      nothing
//
// "A terminal" is stderr being a tty with TERM neither unset nor "dumb" and CI
// unset. Machine-readable progress stays in metrics.jsonl and --json; the
// display is for people.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace attn::cli {

// "3s", "1m58s", "2h05m".
std::string duration_text(double seconds);

class Progress {
 public:
  enum class Mode { kBar, kLines, kQuiet };
  // kQuiet for quiet, else kBar on a terminal, else kLines.
  static Mode mode_for(bool quiet);

  // total 0: unknown (no bar, no ETA). unit: "steps", "MB", ... Counts are
  // shown divided by scale (bytes as MB: scale 1e6, one decimal).
  Progress(std::string label, int64_t total, std::string unit, Mode mode, double scale = 1.0);
  ~Progress();
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

  // done of total so far; note (e.g. "loss 2.4856") ends the line. Drawn when
  // the mode's interval has passed, and always for done == total.
  void update(int64_t done, const std::string& note = "");
  // A line of the command's own (an evaluation's losses) without tearing the
  // bar: the bar is cleared, the line printed, the bar redrawn at the next update.
  void message(const std::string& line);
  // Before the command prints to stdout (same screen): the bar is erased, and
  // drawn again at the next update.
  void clear();
  // The last state as a line (kBar ends its line); later updates are ignored.
  void finish();

  Mode mode() const { return mode_; }

 private:
  void draw(bool last);

  std::string count(int64_t n) const;

  std::string label_, unit_;
  double scale_ = 1.0;
  int64_t total_ = 0, done_ = 0;
  int64_t drawn_done_ = -1;  // kLines: the count of the last line printed
  std::string note_;
  Mode mode_;
  bool drawn_ = false, finished_ = false;
  using clock = std::chrono::steady_clock;
  clock::time_point start_, last_;
};

}  // namespace attn::cli
