// attn::to_string against str(t) of PyTorch 1.13 (tests/torch/oracle_print.py):
// every case must match byte for byte, with default print options and with
// the non-default ones some cases name (torch.set_printoptions).
#include <gtest/gtest.h>

#include <cstdio>
#include <sstream>
#include <string>

#include "attn/print.h"
#include "oracle.h"

using attn::Tensor;

TEST(PrintTorch, MatchesStrOfEveryOracleTensor) {
  const nlohmann::json cases =
      attn::test::read_oracle_json("print.json", "oracle_print.py").at("cases");
  ASSERT_GE(cases.size(), 80u);
  size_t matched = 0;
  for (const auto& c : cases) {
    const std::string name = c.at("name");
    const Tensor t = attn::test::tensor_from_bits_json(c.at("tensor"));
    attn::PrintOptions options;
    options.suffix = c.at("suffix").get<std::string>();
    if (c.contains("options")) {
      const auto& o = c.at("options");
      options.precision = o.value("precision", options.precision);
      options.linewidth = o.value("linewidth", options.linewidth);
      options.threshold = o.value("threshold", options.threshold);
      options.edgeitems = o.value("edgeitems", options.edgeitems);
      if (o.contains("sci_mode")) options.sci_mode = o.at("sci_mode").get<bool>();
    }
    const std::string got = attn::to_string(t, options);
    const std::string expected = c.at("str");
    if (got == expected) {
      ++matched;
    } else {
      ADD_FAILURE() << "case " << name << "\n--- torch:\n" << expected << "\n--- attn:\n" << got;
    }
  }
  std::printf("  %zu of %zu tensors print exactly as PyTorch 1.13 prints them\n", matched,
              cases.size());
  EXPECT_EQ(matched, cases.size());
}

TEST(PrintTorch, StreamOperatorUsesDefaultOptions) {
  const nlohmann::json cases =
      attn::test::read_oracle_json("print.json", "oracle_print.py").at("cases");
  for (const auto& c : cases) {
    if (c.at("name") != "spec_inputs") continue;
    std::ostringstream os;
    os << attn::test::tensor_from_bits_json(c.at("tensor"));
    EXPECT_EQ(os.str(), c.at("str").get<std::string>());
    return;
  }
  FAIL() << "no spec_inputs case in print.json";
}
