// omp_policy.cpp - the re-exec that applies attn's OpenMP wait policy (omp_policy.h).
#include "omp_policy.h"

#include <unistd.h>

#include <cstdlib>

namespace attn::cli {

void apply_omp_policy(char** argv) {
  const OmpPolicy p = choose_omp_policy([](const char* name) { return std::getenv(name); });
  if (!p.reexec) return;
  // The marker first: even if the exec fails half-way, no loop.
  if (setenv(kAppliedMarker, "1", 1) != 0) return;
  if (setenv("GOMP_SPINCOUNT", p.spincount.c_str(), 1) != 0) return;
  execv("/proc/self/exe", argv);
  // exec failed (no /proc, say): undo, so the header does not claim the policy.
  unsetenv("GOMP_SPINCOUNT");
  unsetenv(kAppliedMarker);
}

}  // namespace attn::cli
