// tests/oracle.h - reading the golden files that ship in data/ and the fixtures
// committed under tests/fixtures/ (both test binaries), and the reference values
// that PyTorch wrote (tests/torch/oracle.py; attn_torch_tests only).
//
// A file that cannot be opened fails with a message that names the file, the full
// path it was looked for at, and what puts it there: the checkout's data/ folder
// (ATTN_DATA_DIR) for golden files, the oracle script and the torch_oracle test for
// oracle outputs. The messages are built by plain functions
// so that tests/unit/test_oracle_messages.cpp can check them without PyTorch.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "attn/tensor.h"

namespace attn::test {

// path made absolute, with "." and ".." resolved: the path a reader can look at.
inline std::string full_path(const std::string& path) {
  return std::filesystem::absolute(std::filesystem::path(path)).lexically_normal().string();
}

// "does not exist" or, for a file that is there, "cannot be read".
inline std::string why_unreadable(const std::string& path) {
  std::error_code ec;
  return std::filesystem::exists(path, ec) ? "cannot be read" : "does not exist";
}

// The message for data file `name` (relative to data/) looked for under
// `data_dir` (ATTN_DATA_DIR).
inline std::string missing_data_message(const std::string& name, const std::string& data_dir) {
  const std::string path = full_path(data_dir + "/" + name);
  return "cannot open the data file " + name + ": " + path + " " + why_unreadable(path) +
         ". It ships with attn in the checkout's data/ folder (data/README.md lists every file "
         "and its sha256): restore it with git checkout -- data/";
}

// The message for oracle output `name` looked for under `oracle_dir`; `script`
// (e.g. "oracle_ops.py") is the tests/torch script that writes it.
inline std::string missing_oracle_message(const std::string& name, const std::string& oracle_dir,
                                          const std::string& script,
                                          const std::string& python = "/usr/bin/python3") {
  const std::string path = full_path(oracle_dir + "/" + name);
  std::string only = script;
  if (only.rfind("oracle_", 0) == 0) only.erase(0, 7);
  if (only.size() > 3 && only.compare(only.size() - 3, 3, ".py") == 0) only.resize(only.size() - 3);
  return "cannot open the oracle output " + name + ": " + path + " " + why_unreadable(path) +
         ". tests/torch/" + script +
         " writes it when the torch_oracle test runs (ctest --preset release -L torch runs it "
         "before these tests; by hand: " +
         python + " tests/torch/oracle.py --out " + full_path(oracle_dir) + " --only " + only + ")";
}

// The message for the committed fixture `name` (relative to tests/fixtures/)
// looked for under `tests_dir` (ATTN_TESTS_DIR); `recorder`, where given, is
// the command that recorded it (e.g. "/usr/bin/python3 tests/torch/record_ch5_training.py
// PATH, about 25 minutes of 2 idle cores").
inline std::string missing_fixture_message(const std::string& name, const std::string& tests_dir,
                                           const std::string& recorder = "") {
  const std::string path = full_path(tests_dir + "/fixtures/" + name);
  return "cannot open the test fixture " + name + ": " + path + " " + why_unreadable(path) +
         ". It is committed with the tests: restore it with git checkout -- tests/fixtures/" +
         name + (recorder.empty() ? "" : " (it was recorded once by " + recorder + ")");
}

// Parses the JSON file at path; throws std::runtime_error(missing()) when it cannot
// be opened. Json is nlohmann::json or nlohmann::ordered_json.
template <class Json = nlohmann::json, class Message>
Json read_json_file(const std::string& path, const Message& missing) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error(missing());
  return Json::parse(in);
}

// ---- files in data/ (ATTN_DATA_DIR) --------------------------------------------------
#ifdef ATTN_DATA_DIR
inline std::string data_path(const std::string& name) {
  return std::string(ATTN_DATA_DIR) + "/" + name;
}

// The golden file `name` (e.g. "golden/rng_vectors.json") of data/.
inline nlohmann::json read_data_json(const std::string& name) {
  return read_json_file(data_path(name), [&] { return missing_data_message(name, ATTN_DATA_DIR); });
}
#endif

// ---- committed fixtures in tests/fixtures/ (ATTN_TESTS_DIR) ---------------------------
#ifdef ATTN_TESTS_DIR
inline std::string fixture_path(const std::string& name) {
  return std::string(ATTN_TESTS_DIR) + "/fixtures/" + name;
}

// The fixture `name` (e.g. "gqa_swa/book_1.13.json"); `recorder` as for
// missing_fixture_message.
template <class Json = nlohmann::json>
Json read_fixture_json(const std::string& name, const std::string& recorder = "") {
  return read_json_file<Json>(fixture_path(name), [&] {
    return missing_fixture_message(name, ATTN_TESTS_DIR, recorder);
  });
}
#endif

// ---- PyTorch's reference outputs (attn_torch_tests only) ---------------------------
#ifdef ATTN_ORACLE_DIR
inline std::string oracle_path(const std::string& name) {
  return std::string(ATTN_ORACLE_DIR) + "/" + name;
}

// The oracle output `name` (e.g. "ops.json"), written by tests/torch/<script>.
template <class Json = nlohmann::json>
Json read_oracle_json(const std::string& name, const std::string& script) {
  return read_json_file<Json>(oracle_path(name), [&] {
    return missing_oracle_message(name, ATTN_ORACLE_DIR, script, ATTN_TORCH_PYTHON);
  });
}

// The list `key` (e.g. "printed") of oracle output `name`; with a `section`,
// only its entries whose "section" is that one.
inline nlohmann::json read_oracle_list(const std::string& name, const std::string& script,
                                       const std::string& key, const std::string& section = "") {
  const nlohmann::json all = read_oracle_json(name, script).at(key);
  if (section.empty()) return all;
  nlohmann::json some = nlohmann::json::array();
  for (const auto& entry : all) {
    if (entry.at("section") == section) some.push_back(entry);
  }
  return some;
}
#endif

// The first line where a text attn printed and torch's differ, both versions
// (how the walkthrough tests report a print that is not PyTorch's).
inline std::string first_difference(const std::string& ours, const std::string& torch) {
  const auto lines = [](const std::string& text) {
    std::vector<std::string> out;
    std::istringstream in(text);
    for (std::string line; std::getline(in, line);) out.push_back(line);
    return out;
  };
  const std::vector<std::string> a = lines(ours), b = lines(torch);
  for (size_t i = 0; i < std::max(a.size(), b.size()); ++i) {
    const std::string la = i < a.size() ? a[i] : "(no line)";
    const std::string lb = i < b.size() ? b[i] : "(no line)";
    if (la != lb) return "line " + std::to_string(i + 1) + "\n  attn:  " + la + "\n  torch: " + lb;
  }
  return "(same lines, different line endings)";
}

// {"shape": [...], "values": [...]} -> Tensor.
inline Tensor tensor_from_json(const nlohmann::json& j) {
  Shape shape = j.at("shape").get<Shape>();
  std::vector<float> values;
  values.reserve(j.at("values").size());
  for (const auto& v : j.at("values")) values.push_back(v.get<float>());
  if (shape.empty()) return Tensor(Shape{}, std::move(values));
  return Tensor(std::move(shape), std::move(values));
}

// {"shape": [...], "bits": [...]} (oracle_util.tensor_bits_json) -> Tensor:
// the float32 bit patterns, so inf, NaN and -0.0 come through exactly.
inline Tensor tensor_from_bits_json(const nlohmann::json& j) {
  Shape shape = j.at("shape").get<Shape>();
  std::vector<float> values;
  values.reserve(j.at("bits").size());
  for (const auto& b : j.at("bits")) {
    const auto u = b.get<uint32_t>();
    float f;
    std::memcpy(&f, &u, sizeof f);
    values.push_back(f);
  }
  return Tensor(std::move(shape), std::move(values));
}

// zlib's CRC-32 of `size` bytes (what the oracles' zlib.crc32 computes).
inline uint32_t crc32(const void* data, size_t size) {
  static const std::array<uint32_t, 256> table = [] {
    std::array<uint32_t, 256> t{};
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1u) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
      t[i] = c;
    }
    return t;
  }();
  const auto* bytes = static_cast<const unsigned char*>(data);
  uint32_t c = 0xFFFFFFFFu;
  for (size_t i = 0; i < size; ++i) c = table[(c ^ bytes[i]) & 0xFFu] ^ (c >> 8);
  return c ^ 0xFFFFFFFFu;
}

// The CRC-32 of a float32 tensor's values, row-major (any layout).
inline uint32_t crc32(const Tensor& t) {
  const Tensor dense = t.contiguous();
  return crc32(dense.data(), static_cast<size_t>(dense.numel()) * sizeof(float));
}

}  // namespace attn::test
