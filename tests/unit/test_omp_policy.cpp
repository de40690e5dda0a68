// attn's OpenMP wait policy (tools/attn/omp_policy.h): the pure decision from the
// environment, and the CLI's header showing that the user's variables win.
#include <gtest/gtest.h>

#include <cstdlib>
#include <map>
#include <string>

#include "../../tools/attn/omp_policy.h"
#include "cli.h"

using attn::cli::choose_omp_policy;
using attn::cli::kSpinCount;
using attn::test::ScopedEnv;

namespace {

attn::cli::OmpPolicy decide(const std::map<std::string, std::string>& vars) {
  return choose_omp_policy([&](const char* name) -> const char* {
    const auto it = vars.find(name);
    return it == vars.end() ? nullptr : it->second.c_str();
  });
}

TEST(OmpPolicy, NothingSetReexecsWithBoundedSpin) {
  const auto p = decide({});
  EXPECT_TRUE(p.reexec);
  EXPECT_EQ(p.spincount, kSpinCount);
}

TEST(OmpPolicy, UserVariablesWin) {
  for (const auto& vars : {std::map<std::string, std::string>{{"GOMP_SPINCOUNT", "0"}},
                           std::map<std::string, std::string>{{"OMP_WAIT_POLICY", "active"}},
                           std::map<std::string, std::string>{{"OMP_WAIT_POLICY", "passive"}},
                           std::map<std::string, std::string>{{"GOMP_SPINCOUNT", ""}}}) {
    const auto p = decide(vars);
    EXPECT_FALSE(p.reexec) << vars.begin()->first;
    EXPECT_TRUE(p.spincount.empty());
    EXPECT_NE(p.text.find("user"), std::string::npos) << p.text;
  }
}

TEST(OmpPolicy, OffSwitchKeepsLibgompDefault) {
  for (const char* off : {"off", "0", "false", "no"}) {
    const auto p = decide({{"ATTN_OMP_POLICY", off}});
    EXPECT_FALSE(p.reexec) << off;
    EXPECT_NE(p.text.find("off"), std::string::npos);
  }
  EXPECT_TRUE(decide({{"ATTN_OMP_POLICY", "on"}}).reexec);
}

TEST(OmpPolicy, MarkerStopsTheLoop) {
  const auto p = decide({{"ATTN_OMP_POLICY_APPLIED", "1"}, {"GOMP_SPINCOUNT", kSpinCount}});
  EXPECT_FALSE(p.reexec);
  EXPECT_EQ(p.spincount, kSpinCount);
  EXPECT_NE(p.text.find("attn set GOMP_SPINCOUNT="), std::string::npos) << p.text;
  // An inherited marker with the user's own count: the user's count wins, no re-exec.
  const auto user = decide({{"ATTN_OMP_POLICY_APPLIED", "1"}, {"GOMP_SPINCOUNT", "0"}});
  EXPECT_FALSE(user.reexec);
  EXPECT_NE(user.text.find("user"), std::string::npos) << user.text;
  // A marker without GOMP_SPINCOUNT: never a second exec, whatever happened.
  EXPECT_FALSE(decide({{"ATTN_OMP_POLICY_APPLIED", "1"}}).reexec);
}

std::string policy_line(const std::string& out) {
  for (const auto& line : attn::test::lines_of(out))
    if (line.rfind("GOMP_SPINCOUNT=", 0) == 0) return line;
  return "";
}

TEST(OmpPolicyCli, BenchHeaderShowsTheChoiceAndTheUserWins) {
  ATTN_REQUIRE_CLI();
  const std::string args =
      "bench --kind core --batch 1 --tokens 16 --d-model 16 --heads 1 "
      "--mode fwd --repeats 1 --no-probe --sgemm-n 64";
  ScopedEnv a("OMP_WAIT_POLICY", nullptr), b("ATTN_OMP_POLICY", nullptr),
      c("ATTN_OMP_POLICY_APPLIED", nullptr);
  {
    ScopedEnv s("GOMP_SPINCOUNT", nullptr);
    const auto r = attn::test::run_cli(args);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(policy_line(r.out).rfind(std::string("GOMP_SPINCOUNT=") + kSpinCount + ",", 0), 0u)
        << r.out;
    EXPECT_NE(policy_line(r.out).find("attn set"), std::string::npos) << r.out;
  }
  {
    ScopedEnv s("GOMP_SPINCOUNT", "0");
    const auto r = attn::test::run_cli(args);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(policy_line(r.out).rfind("GOMP_SPINCOUNT=0,", 0), 0u) << r.out;
    EXPECT_NE(policy_line(r.out).find("user"), std::string::npos) << r.out;
  }
  {
    ScopedEnv s("GOMP_SPINCOUNT", nullptr), off("ATTN_OMP_POLICY", "off");
    const auto r = attn::test::run_cli(args);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(policy_line(r.out).rfind("GOMP_SPINCOUNT=unset,", 0), 0u) << r.out;
  }
}

}  // namespace
