// The verdict of a peak probe on its readings (src/cpu/peak_rate.h): FLOP per
// cycle against what the vector width allows.
#include "cpu/peak_rate.h"

#include <fmt/format.h>

#include <cmath>
#include <string>
#include <vector>

namespace attn::cpu {

PeakProbe& judge_peak_at(PeakProbe& p, int running, double flops_per_unit,
                         const std::vector<double>& units, const char* what) {
  if (p.gflops <= 0 || p.clock_ghz <= 0 || running < 1) {
    p.plausible = false;
    p.verdict = p.gflops <= 0 ? "not measured" : "clock unknown";
    return p;
  }
  p.flops_per_cycle = p.gflops / (double(running) * p.clock_ghz);
  double nearest = units.front();
  for (const double u : units)
    if (std::abs(p.flops_per_cycle - u * flops_per_unit) <
        std::abs(p.flops_per_cycle - nearest * flops_per_unit))
      nearest = u;
  p.expected_per_cycle = nearest * flops_per_unit;
  const double lo = units.front() * flops_per_unit, hi = units.back() * flops_per_unit;
  if (p.flops_per_cycle > 1.1 * hi) {
    p.plausible = false;
    p.verdict = fmt::format(
        "above the {:g} FLOP/cycle the vector width allows: the probe or the clock is wrong", hi);
  } else if (p.flops_per_cycle < 0.75 * lo) {
    p.plausible = false;
    p.verdict = fmt::format(
        "below the {:g} FLOP/cycle of {:g} {}: the probe under-reads (a busy or shared core, a "
        "throttled clock, or too few chains)",
        lo, units.front(), what);
  } else {
    p.plausible = true;
    p.verdict =
        fmt::format("{:g} {}{} x {} lanes", nearest, what, nearest > 1.0 ? "s" : "", p.lanes);
  }
  return p;
}

PeakProbe& judge_peak(PeakProbe& p, double flops_per_unit, const std::vector<double>& units,
                      const char* what) {
  p.clock_ghz = cpu_clock_ghz(5);
  return judge_peak_at(p, threads_at_once(p.threads), flops_per_unit, units, what);
}

bool bf16_dot_beats_fma(double bf16_dot_gflops, double fma_gflops) {
  return bf16_dot_gflops > 0.0 && fma_gflops > 0.0 && bf16_dot_gflops >= 0.75 * fma_gflops;
}

}  // namespace attn::cpu
