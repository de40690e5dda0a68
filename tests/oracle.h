// tests/oracle.h - reading the reference values that PyTorch wrote
// (tests/torch/oracle.py) and the shared golden files.
#pragma once

#include <cstdint>
#include <cstring>
#include <fstream>
#include <stdexcept>
#include <string>

#include <nlohmann/json.hpp>

#include "attn/tensor.h"

namespace attn::test {

inline std::string oracle_path(const std::string& name) {
  return std::string(ATTN_ORACLE_DIR) + "/" + name;
}
inline std::string shared_path(const std::string& name) {
  return std::string(ATTN_SHARED_DIR) + "/" + name;
}

inline nlohmann::json read_json(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot open " + path + " (did the torch_oracle test run?)");
  return nlohmann::json::parse(in);
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

}  // namespace attn::test
