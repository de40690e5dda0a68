// tests/oracle.h's messages for a file the tests cannot open: a missing data/ file
// or a missing oracle output must say which file, the full path it was looked for
// at, and what puts it there. Runs without PyTorch: the oracle message is a plain
// function of the folder and the script.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>

#include "cli.h"
#include "oracle.h"

namespace {

namespace fs = std::filesystem;

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// A folder that does not exist, inside the test's temporary folder.
std::string absent_folder(const std::string& stem) {
  const std::string dir = attn::test::temp_path(stem);
  fs::remove_all(dir);
  return dir;
}

TEST(OracleMessages, MissingDataFileNamesThePathAndHowToRestoreIt) {
  const std::string parent = absent_folder("parent");
  const std::string data = parent + "/attn/sub/../data";
  const std::string looked_at = parent + "/attn/data/golden/x.json";
  try {
    attn::test::read_json_file(data + "/golden/x.json", [&] {
      return attn::test::missing_data_message("golden/x.json", data);
    });
    FAIL() << "expected std::runtime_error";
  } catch (const std::runtime_error& e) {
    const std::string m = e.what();
    EXPECT_TRUE(contains(m, "data file golden/x.json")) << m;
    EXPECT_TRUE(contains(m, looked_at + " does not exist")) << m;  // full, without ".."
    EXPECT_FALSE(contains(m, "..")) << m;
    EXPECT_TRUE(contains(m, "data/README.md")) << m;
    EXPECT_FALSE(contains(m, "shared")) << m;  // nothing outside the checkout
    EXPECT_FALSE(contains(m, "torch_oracle")) << m;  // PyTorch has nothing to do with it
    EXPECT_EQ(m.find('\n'), std::string::npos) << m;
  }
}

TEST(OracleMessages, MissingOracleOutputNamesThePathAndTheScript) {
  const std::string dir = absent_folder("oracle");
  const std::string m =
      attn::test::missing_oracle_message("ops.json", dir, "oracle_ops.py", "/usr/bin/python3");
  EXPECT_EQ(m, "cannot open the oracle output ops.json: " + dir +
                   "/ops.json does not exist. tests/torch/oracle_ops.py writes it when the "
                   "torch_oracle test runs (ctest --preset release -L torch runs it before these "
                   "tests; by hand: /usr/bin/python3 tests/torch/oracle.py --out " +
                   dir + " --only ops)");
}

TEST(OracleMessages, MissingFixtureNamesThePathAndHowToRestoreIt) {
  const std::string tests = absent_folder("tests");
  const std::string m = attn::test::missing_fixture_message("gqa_swa/x.json", tests);
  EXPECT_EQ(m, "cannot open the test fixture gqa_swa/x.json: " + tests +
                   "/fixtures/gqa_swa/x.json does not exist. It is committed with the tests: "
                   "restore it with git checkout -- tests/fixtures/gqa_swa/x.json");
  const std::string r = attn::test::missing_fixture_message("a.json", tests, "record.py PATH");
  EXPECT_TRUE(contains(r, "(it was recorded once by record.py PATH)")) << r;
  // The real reader on a real fixture, and on a name that is not there.
  EXPECT_TRUE(attn::test::read_fixture_json("tokenizer/cases.json").contains("cases"));
  try {
    attn::test::read_fixture_json("no/such.json");
    FAIL() << "expected std::runtime_error";
  } catch (const std::runtime_error& e) {
    EXPECT_TRUE(contains(e.what(), "tests/fixtures/no/such.json does not exist")) << e.what();
  }
}

TEST(OracleMessages, FirstDifferenceShowsBothVersionsOfTheLine) {
  EXPECT_EQ(attn::test::first_difference("a\nb\nc", "a\nB\nc"), "line 2\n  attn:  b\n  torch: B");
  EXPECT_EQ(attn::test::first_difference("a", "a\nz"), "line 2\n  attn:  (no line)\n  torch: z");
  EXPECT_EQ(attn::test::first_difference("a\n", "a"), "(same lines, different line endings)");
}

TEST(OracleMessages, AFileThatExistsButCannotBeParsedIsNotCalledMissing) {
  // An existing file gives the JSON parser's error, not the missing-file message.
  const std::string path = attn::test::temp_path("bad.json");
  {
    std::ofstream out(path);
    out << "{ not json";
  }
  EXPECT_THROW(attn::test::read_json_file(path, [] { return std::string("missing"); }),
               nlohmann::json::parse_error);
  fs::remove(path);
}

TEST(OracleMessages, TheGoldenVectorsShipInsideTheCheckout) {
  // The real helper on the real file: it opens, and a name that is not there fails
  // with the configured folder in the message.
  EXPECT_NO_THROW(attn::test::read_data_json("golden/rng_vectors.json"));
  try {
    attn::test::read_data_json("golden/no_such_file.json");
    FAIL() << "expected std::runtime_error";
  } catch (const std::runtime_error& e) {
    EXPECT_TRUE(contains(e.what(),
                         attn::test::full_path(std::string(ATTN_DATA_DIR) +
                                               "/golden/no_such_file.json") +
                             " does not exist"))
        << e.what();
  }
}

}  // namespace
