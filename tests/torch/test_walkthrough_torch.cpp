// `attn walkthrough --json` against the same walkthrough written in PyTorch
// (tests/torch/oracle_walkthrough.py): the same tensors, with the same names, in the
// same order, and every tensor's printed text equal to torch's str() character for
// character (so every 4th decimal agrees). The values agree within a stated
// tolerance too (|ours - torch| <= 1e-5 + 1e-4 |torch|, non-finite values equal).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>

#include "cli.h"
#include "oracle.h"

namespace {

using attn::test::first_difference;
using nlohmann::json;

constexpr double kAtol = 1e-5;
constexpr double kRtol = 1e-4;

// The torch oracle's tensors, optionally only one section's.
json torch_tensors(const std::string& file, const std::string& section = "") {
  return attn::test::read_oracle_list(file, "oracle_walkthrough.py", "tensors", section);
}

json run_walkthrough_json(const std::string& args) {
  const auto r = attn::test::run_cli("walkthrough --json " + args);
  EXPECT_EQ(r.exit_code, 0) << "attn walkthrough --json " << args << ": " << r.err;
  EXPECT_EQ(r.err, "");
  return json::parse(r.out);
}

bool value_close(const json& ours, const json& theirs) {
  if (theirs.is_string() || ours.is_string()) return ours == theirs;  // "inf", "-inf", "nan"
  const double a = ours.get<double>(), b = theirs.get<double>();
  return std::fabs(a - b) <= kAtol + kRtol * std::fabs(b);
}

// Compares tensor by tensor; returns how many print exactly as torch prints them.
int compare(const json& ours, const json& torch, const std::string& label) {
  EXPECT_EQ(ours.size(), torch.size()) << label << ": number of printed tensors";
  const size_t n = std::min(ours.size(), torch.size());
  int same_text = 0;
  for (size_t i = 0; i < n; ++i) {
    const json& a = ours[i];
    const json& b = torch[i];
    const std::string where = label + " #" + std::to_string(i) + " [" +
                              b.at("section").get<std::string>() + "] " +
                              b.at("name").get<std::string>();
    EXPECT_EQ(a.at("section"), b.at("section")) << where;
    EXPECT_EQ(a.at("name"), b.at("name")) << where;
    EXPECT_EQ(a.at("shape"), b.at("shape")) << where;
    const std::string text = a.at("text").get<std::string>();
    const std::string torch_text = b.at("text").get<std::string>();
    if (text == torch_text) {
      ++same_text;
    } else {
      ADD_FAILURE() << where << ": printed text differs from torch's\n"
                    << first_difference(text, torch_text);
    }
    const json& va = a.at("values");
    const json& vb = b.at("values");
    if (va.size() != vb.size()) {
      ADD_FAILURE() << where << ": " << va.size() << " values, torch has " << vb.size();
      continue;
    }
    int far = 0;
    size_t first_far = 0;
    for (size_t k = 0; k < va.size(); ++k) {
      if (!value_close(va[k], vb[k])) {
        if (far++ == 0) first_far = k;
      }
    }
    EXPECT_EQ(far, 0) << where << ": " << far << " values differ beyond the tolerance, first at "
                      << first_far << ": " << va[first_far] << " vs torch " << vb[first_far];
  }
  std::cout << "[walkthrough vs torch] " << label << ": " << same_text << " of " << torch.size()
            << " tensors print exactly as PyTorch 1.13 prints them (attn printed " << ours.size()
            << ")\n";
  return same_text;
}

TEST(WalkthroughTorch, BookSeedsPrintLikeTorch) {
  ATTN_REQUIRE_CLI();
  const json torch = torch_tensors("walkthrough.json");
  ASSERT_GT(torch.size(), 50u);
  const json ours = run_walkthrough_json("");
  EXPECT_EQ(compare(ours, torch, "book seeds"), static_cast<int>(torch.size()));
}

TEST(WalkthroughTorch, SeedSevenPrintsLikeTorchWithSeedSeven) {
  ATTN_REQUIRE_CLI();
  const json torch = torch_tensors("walkthrough_seed7.json");
  ASSERT_GT(torch.size(), 50u);  // two empty lists would compare equal
  const json ours = run_walkthrough_json("--seed 7");
  EXPECT_EQ(compare(ours, torch, "--seed 7"), static_cast<int>(torch.size()));
}

// A section run alone recomputes what it needs and prints what the full run prints.
TEST(WalkthroughTorch, CausalSectionAlonePrintsLikeTorch) {
  ATTN_REQUIRE_CLI();
  const json torch = torch_tensors("walkthrough.json", "causal");
  ASSERT_EQ(torch.size(), 6u);
  const json ours = run_walkthrough_json("--section causal");
  EXPECT_EQ(compare(ours, torch, "--section causal"), static_cast<int>(torch.size()));
}

TEST(WalkthroughTorch, DropoutSectionAlonePrintsLikeTorch) {
  ATTN_REQUIRE_CLI();
  const json torch = torch_tensors("walkthrough.json", "dropout");
  ASSERT_EQ(torch.size(), 2u);
  const json ours = run_walkthrough_json("--section dropout");
  EXPECT_EQ(compare(ours, torch, "--section dropout"), static_cast<int>(torch.size()));
}

}  // namespace
