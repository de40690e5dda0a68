// omp_policy.h - how long idle OpenMP threads spin before they sleep, chosen by attn.
//
// libgomp's default (OMP_WAIT_POLICY and GOMP_SPINCOUNT unset) spins up to 300000
// iterations in every barrier. On a quiet machine that makes attn's many short parallel
// regions cheap; on a shared one a spinning thread holds the core the thread it waits
// for needs, and 2-thread `attn train` (small recipe) went from ~0.17 s to 1.3-2 s a step
// (issue 21, docs/threads.md). libgomp reads both variables once, before main, so
// the CLI applies its choice by executing itself again (once: kAppliedMarker guards
// the loop) with GOMP_SPINCOUNT=kSpinCount. Only the wait changes, never the thread
// count, so every result keeps its bits.
//
// The user's settings always win: when OMP_WAIT_POLICY or GOMP_SPINCOUNT is set, or
// ATTN_OMP_POLICY=off, attn changes nothing. Pure functions (taking the environment
// as a lookup) so tests/unit/test_omp_policy.cpp can drive them.
#pragma once

#include <functional>
#include <string>

namespace attn::cli {

inline constexpr const char* kSpinCount = "1000";
inline constexpr const char* kPolicyVariable = "ATTN_OMP_POLICY";         // "off": keep libgomp's
inline constexpr const char* kAppliedMarker = "ATTN_OMP_POLICY_APPLIED";  // set by the re-exec

// getenv-like lookup: the value, or nullptr when unset.
using EnvLookup = std::function<const char*(const char*)>;

struct OmpPolicy {
  bool reexec = false;    // execute again with GOMP_SPINCOUNT=spincount and the marker
  std::string spincount;  // what attn sets ("" when it sets nothing)
  std::string text;       // one line for `attn bench`'s header
};

inline bool policy_off(const char* value) {
  if (value == nullptr) return false;
  const std::string v = value;
  return v == "off" || v == "0" || v == "false" || v == "no";
}

// The decision, from the environment alone.
inline OmpPolicy choose_omp_policy(const EnvLookup& env) {
  OmpPolicy p;
  const char* spin = env("GOMP_SPINCOUNT");
  if (env(kAppliedMarker) != nullptr && spin != nullptr && std::string(spin) == kSpinCount) {
    // This process is the re-exec: the spin count in force is attn's.
    p.spincount = kSpinCount;
    p.text = std::string("attn set GOMP_SPINCOUNT=") + kSpinCount + " (" + kPolicyVariable +
             "=off keeps libgomp's default)";
    return p;
  }
  if (policy_off(env(kPolicyVariable))) {
    p.text = std::string("attn's wait policy off (") + kPolicyVariable + ")";
    return p;
  }
  if (env("OMP_WAIT_POLICY") != nullptr || spin != nullptr) {
    p.text = "attn's wait policy not applied: the user set OMP_WAIT_POLICY/GOMP_SPINCOUNT";
    return p;
  }
  if (env(kAppliedMarker) != nullptr) {
    // The marker without attn's count (something unset it): never a second exec.
    p.text = "attn's wait policy not applied: marker set, GOMP_SPINCOUNT unset";
    return p;
  }
  p.reexec = true;
  p.spincount = kSpinCount;
  p.text = std::string("attn sets GOMP_SPINCOUNT=") + kSpinCount;
  return p;
}

// Applies the policy at the top of main: sets the variables and replaces the process by
// /proc/self/exe with the same argv. Returns only when nothing is to be done or the exec
// failed (then libgomp's default stays, and the run goes on). Defined in omp_policy.cpp.
void apply_omp_policy(char** argv);

}  // namespace attn::cli
