// `attn walkthrough --chapter 4` against the chapter-4 notebook run in PyTorch 1.13
// (tests/torch/oracle_walkthrough_ch4.py): the same prints, with the same sections
// and names, in the same order, each print's text equal to what the notebook's
// print() writes character for character (tensors as torch's str(), shapes as
// torch.Size, counts with Python's thousands separators, the generated ids and
// their decoded text, the shortcut example's gradient means to all 17 digits).
// Values: ids, counts and shapes equal; the logits' 402,056 values each within
// |ours - torch| <= 1e-5 + 1e-4 |torch|.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
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

json torch_printed(const std::string& section = "") {
  return attn::test::read_oracle_list("walkthrough_ch4.json", "oracle_walkthrough_ch4.py", "printed", section);
}

// `attn walkthrough --chapter 4 <args>`.
attn::test::CliResult run_ch4(const std::string& args) {
  const auto r = attn::test::run_cli("walkthrough --chapter 4 " + args);
  EXPECT_EQ(r.exit_code, 0) << "attn walkthrough --chapter 4 " << args << ": " << r.err;
  return r;
}
// Compares a value: tensors ({"shape", "values"}) within the tolerance, the rest equal.
// Returns the largest |ours - torch| of a float tensor (0 otherwise).
double compare_value(const json& ours, const json& torch, const std::string& where) {
  if (!(torch.is_object() && torch.contains("values"))) {
    if (torch.is_number_float()) {
      EXPECT_DOUBLE_EQ(ours.get<double>(), torch.get<double>()) << where;
    } else {
      EXPECT_EQ(ours, torch) << where;
    }
    return 0.0;
  }
  EXPECT_EQ(ours.at("shape"), torch.at("shape")) << where;
  const json& va = ours.at("values");
  const json& vb = torch.at("values");
  if (va.size() != vb.size()) {
    ADD_FAILURE() << where << ": " << va.size() << " values, torch has " << vb.size();
    return 0.0;
  }
  double max_diff = 0.0;
  int far = 0;
  size_t first_far = 0;
  for (size_t k = 0; k < va.size(); ++k) {
    if (vb[k].is_number_integer()) {
      if (va[k] != vb[k] && far++ == 0) first_far = k;
      continue;
    }
    const double a = va[k].get<double>(), b = vb[k].get<double>();
    max_diff = std::max(max_diff, std::fabs(a - b));
    if (!(std::fabs(a - b) <= kAtol + kRtol * std::fabs(b)) && far++ == 0) first_far = k;
  }
  EXPECT_EQ(far, 0) << where << ": " << far << " values differ, first at " << first_far << ": "
                    << va[first_far] << " vs torch " << vb[first_far];
  return max_diff;
}

// Print by print; returns how many texts are torch's exactly.
int compare(const json& ours, const json& torch, const std::string& label) {
  EXPECT_EQ(ours.size(), torch.size()) << label << ": number of prints";
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
    EXPECT_FALSE(a.at("explanation").get<std::string>().empty()) << where;
    const std::string text = a.at("text").get<std::string>();
    const std::string torch_text = b.at("text").get<std::string>();
    if (text == torch_text) {
      ++same_text;
    } else {
      ADD_FAILURE() << where << ": printed text differs from torch's\n"
                    << first_difference(text, torch_text);
    }
    const double d = compare_value(a.at("value"), b.at("value"), where);
    if (d > 0.0) std::cout << "[walkthrough ch4 vs torch] " << where << ": max |diff| " << d << "\n";
  }
  std::cout << "[walkthrough ch4 vs torch] " << label << ": " << same_text << " of "
            << torch.size() << " prints are PyTorch 1.13's exactly (attn printed " << ours.size()
            << ")\n";
  return same_text;
}

// One run (ctest runs each test in its own process, and the notebook takes
// seconds): the text on stdout, the JSON through --json-out, progress on stderr.
TEST(WalkthroughCh4Torch, EveryPrintIsTorchsInJsonAndText) {
  ATTN_REQUIRE_CLI();
  const json torch = torch_printed();
  // batch 1, dummy 2, layernorm 10, feedforward 2, shortcut 10, block 2, gpt 8, generate 5
  ASSERT_EQ(torch.size(), 40u);
  // The book's numbers, as the chapter states them.
  const auto find = [&torch](const std::string& name) {
    for (const auto& p : torch) {
      if (p.at("name") == name) return p;
    }
    ADD_FAILURE() << "no print named " << name;
    return json();
  };
  EXPECT_EQ(find("total_params").at("text"), "Total number of parameters: 163,009,536");
  EXPECT_EQ(find("len(out[0])").at("value"), 10);

  const std::string json_file = attn::test::temp_path("ch4.json");
  const auto r = run_ch4("--json-out '" + json_file + "'");
  const json ours = json::parse(attn::test::read_text(json_file));
  std::remove(json_file.c_str());
  EXPECT_EQ(compare(ours, torch, "--chapter 4"), static_cast<int>(torch.size()));

  // The text form: each print of the notebook, torch's text, under its explanation.
  ASSERT_EQ(ours.size(), torch.size());
  size_t pos = 0;
  for (size_t i = 0; i < torch.size(); ++i) {
    const std::string block = "\n# " + ours[i].at("explanation").get<std::string>() + "\n" +
                              torch[i].at("text").get<std::string>() + "\n";
    const size_t at = r.out.find(block, pos);
    ASSERT_NE(at, std::string::npos) << "print #" << i << " (" << torch[i].at("name")
                                     << ") not found after offset " << pos << ":\n"
                                     << block;
    pos = at + block.size();
  }

  // The long parts report on stderr: each model's construction and each generated token.
  for (const char* line : {"walkthrough: DummyGPTModel: built and run in ",
                           "walkthrough: GPTModel(GPT_CONFIG_124M): 163,009,536 parameters in ",
                           "walkthrough: generate_text_simple: token 1 of 6 (27018)",
                           "walkthrough: generate_text_simple: token 6 of 6 (7267)"}) {
    EXPECT_NE(r.err.find(line), std::string::npos) << line << "\nstderr:\n" << r.err;
  }
}

// Sections run in the notebook's order whatever order they are named in, and
// "generate" alone builds the model itself: the same ids and text as the whole run.
TEST(WalkthroughCh4Torch, GenerateAloneAndInNotebookOrder) {
  ATTN_REQUIRE_CLI();
  json torch = torch_printed("batch");
  for (const auto& p : torch_printed("generate")) torch.push_back(p);
  ASSERT_EQ(torch.size(), 6u);
  const auto r = run_ch4("--json --section generate,batch");
  EXPECT_EQ(compare(json::parse(r.out), torch, "--section generate,batch"),
            static_cast<int>(torch.size()));
  EXPECT_EQ(r.err.find("DummyGPTModel"), std::string::npos) << r.err;
}

}  // namespace
