// libFuzzer target for the safetensors reader (attn/safetensors.h), built with
// clang -fsanitize=fuzzer,address,undefined by tests/fuzz/CMakeLists.txt.
//
// Any input must end in one of two ways: a std::runtime_error (a malformed
// file), or a file whose tensors, written again by serialize_safetensors and
// read back, come out identical (names, dtypes, shapes, bytes, metadata). A
// crash, a sanitizer report, another exception or a round-trip difference is a
// finding.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <span>
#include <stdexcept>
#include <string>

#include "attn/safetensors.h"
#include "fuzz_common.h"

namespace {

using attn::fuzz::finding;

const void* bytes_of(const attn::Tensor& t) {
  switch (t.dtype()) {
    case attn::DType::kFloat32:
      return t.data_ptr<float>();
    case attn::DType::kBFloat16:
      return t.data_ptr<attn::BFloat16>();
    case attn::DType::kInt64:
      return t.data_ptr<int64_t>();
  }
  return nullptr;
}

bool same(const attn::io::SafetensorsFile& a, const attn::io::SafetensorsFile& b) {
  if (a.metadata != b.metadata || a.tensors.size() != b.tensors.size()) return false;
  // The writer orders by element size then name; compare by name.
  for (const auto& [name, t] : a.tensors) {
    bool found = false;
    for (const auto& [other_name, u] : b.tensors) {
      if (other_name != name) continue;
      found = true;
      if (t.dtype() != u.dtype() || t.shape() != u.shape()) return false;
      const size_t n = static_cast<size_t>(t.numel() * attn::element_size(t.dtype()));
      if (n > 0 && std::memcmp(bytes_of(t), bytes_of(u), n) != 0) return false;
    }
    if (!found) return false;
  }
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(data), size);
  attn::io::SafetensorsFile file;
  try {
    file = attn::io::parse_safetensors(bytes, "fuzz");
  } catch (const std::runtime_error&) {
    return 0;  // refused: the expected outcome for almost every input
  }
  // The header alone agrees with the full read.
  const attn::io::SafetensorsHeader header = attn::io::parse_safetensors_header(bytes, "fuzz");
  if (header.entries.size() != file.tensors.size())
    finding("header and file disagree on the tensor count");
  const std::string again = attn::io::serialize_safetensors(file.tensors, file.metadata);
  const attn::io::SafetensorsFile reread = attn::io::parse_safetensors(
      std::span<const std::byte>(reinterpret_cast<const std::byte*>(again.data()), again.size()),
      "rewritten");
  if (!same(file, reread)) finding("a file read, written and read again changed");
  return 0;
}
