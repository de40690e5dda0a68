// The safetensors reader and writer (attn/safetensors.h): round trips of every
// dtype and shape, the exact bytes the writer produces, atomic writes, every
// kind of malformed file (each a std::runtime_error naming the fault, never a
// crash), random and mutated bytes, modules in and out, and `attn inspect`.
// tests/torch/test_safetensors_torch.cpp checks the format against files
// written and read by Python (json + numpy); tests/fuzz fuzzes the reader.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "attn/nn.h"
#include "attn/ops.h"
#include "attn/random.h"
#include "attn/safetensors.h"
#include "attn/state_dict.h"
#include "cli.h"

using attn::BFloat16;
using attn::DType;
using attn::Shape;
using attn::Tensor;
namespace io = attn::io;
namespace fs = std::filesystem;

namespace {

using Named = std::vector<std::pair<std::string, Tensor>>;

std::span<const std::byte> as_bytes(const std::string& s) {
  return {reinterpret_cast<const std::byte*>(s.data()), s.size()};
}

// Every stored byte of a tensor, row-major (any dtype, any layout).
std::string raw_bytes(const Tensor& t) {
  const Tensor c = t.contiguous();
  const int64_t n = c.numel() * attn::element_size(c.dtype());
  if (n == 0) return {};
  const void* p = nullptr;
  switch (c.dtype()) {
    case DType::kFloat32:
      p = c.data_ptr<float>();
      break;
    case DType::kBFloat16:
      p = c.data_ptr<BFloat16>();
      break;
    case DType::kInt64:
      p = c.data_ptr<int64_t>();
      break;
  }
  return std::string(static_cast<const char*>(p), static_cast<size_t>(n));
}

void expect_same_tensor(const Tensor& got, const Tensor& want, const std::string& name) {
  EXPECT_EQ(got.dtype(), want.dtype()) << name;
  EXPECT_EQ(got.shape(), want.shape()) << name;
  EXPECT_TRUE(got.is_contiguous()) << name;
  EXPECT_EQ(raw_bytes(got), raw_bytes(want)) << name << ": bytes differ";
}

// A float32 tensor of random bit patterns (NaNs, infinities, subnormals, -0 included).
Tensor random_bits_f32(const Shape& shape, uint32_t seed) {
  Tensor t = Tensor::empty(shape, DType::kFloat32);
  std::mt19937 rng(seed);
  float* p = t.data_ptr<float>();
  for (int64_t i = 0; i < t.numel(); ++i) {
    const auto u = static_cast<uint32_t>(rng());  // mt19937 draws 32 bits
    std::memcpy(&p[i], &u, sizeof u);
  }
  return t;
}

Tensor random_bf16(const Shape& shape, uint32_t seed) {
  Tensor t = Tensor::empty(shape, DType::kBFloat16);
  std::mt19937 rng(seed);
  BFloat16* p = t.data_ptr<BFloat16>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i].bits = static_cast<uint16_t>(rng());
  return t;
}

Tensor random_i64(const Shape& shape, uint32_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<int64_t> v(static_cast<size_t>(attn::shape_numel(shape)));
  for (auto& x : v) x = static_cast<int64_t>(rng());
  if (!v.empty()) v[0] = std::numeric_limits<int64_t>::min();
  if (v.size() > 1) v[1] = std::numeric_limits<int64_t>::max();
  return Tensor::from_int64(shape, v);
}

// A file from a header text and a data section, the length prefix computed.
std::string file_of(const std::string& header, const std::string& data = "") {
  std::string out(8, '\0');
  const uint64_t n = header.size();
  for (int i = 0; i < 8; ++i)
    out[static_cast<size_t>(i)] = static_cast<char>((n >> (8 * i)) & 0xFF);
  return out + header + data;
}

std::string prefix_of(uint64_t n) {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i)
    out[static_cast<size_t>(i)] = static_cast<char>((n >> (8 * i)) & 0xFF);
  return out;
}

// Parsing `bytes` throws std::runtime_error whose message contains `needle`
// and names the file.
void expect_rejected(const std::string& bytes, const std::string& needle) {
  try {
    (void)io::parse_safetensors(as_bytes(bytes), "bad.safetensors");
    ADD_FAILURE() << "accepted a file that should fail with: " << needle;
  } catch (const std::runtime_error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("safetensors file 'bad.safetensors': "), std::string::npos) << what;
    EXPECT_NE(what.find(needle), std::string::npos)
        << "message: " << what << "\nexpected: " << needle;
  }
}

std::string temp_dir() {
  const fs::path dir = attn::test::temp_path("safetensors_dir");
  fs::remove_all(dir);  // empty, whatever an earlier process left there
  fs::create_directories(dir);
  return dir.string();
}

const Shape kShapes[] = {{}, {0}, {1}, {7}, {2, 3}, {3, 0, 2}, {2, 3, 4}, {1, 1, 1, 5}, {65, 17}};

Named every_dtype_and_shape() {
  Named tensors;
  uint32_t seed = 1;
  for (const Shape& shape : kShapes) {
    const std::string s = attn::shape_str(shape);
    tensors.emplace_back("f32 " + s, random_bits_f32(shape, seed++));
    tensors.emplace_back("bf16 " + s, random_bf16(shape, seed++));
    tensors.emplace_back("i64 " + s, random_i64(shape, seed++));
  }
  return tensors;
}

}  // namespace

// ---- round trips -------------------------------------------------------------------------

TEST(Safetensors, RoundTripEveryDTypeAndShapeThroughAFile) {
  const Named tensors = every_dtype_and_shape();
  const std::map<std::string, std::string> metadata = {{"format", "pt"},
                                                       {"note", "ünïcode, \"quotes\"\n"}};
  const std::string path = temp_dir() + "/all.safetensors";
  io::write_safetensors(path, tensors, metadata);
  const io::SafetensorsFile file = io::read_safetensors(path);
  EXPECT_EQ(file.metadata, metadata);
  EXPECT_EQ(file.path, path);
  ASSERT_EQ(file.tensors.size(), tensors.size());
  std::map<std::string, Tensor> by_name(file.tensors.begin(), file.tensors.end());
  for (const auto& [name, want] : tensors) {
    ASSERT_EQ(by_name.count(name), 1u) << name;
    expect_same_tensor(by_name.at(name), want, name);
  }
  // The file is what serialize_safetensors makes, byte for byte.
  EXPECT_EQ(attn::test::read_text(path), io::serialize_safetensors(tensors, metadata));
}

TEST(Safetensors, RoundTripInMemoryAndEmptyFile) {
  const Named tensors = every_dtype_and_shape();
  const io::SafetensorsFile file =
      io::parse_safetensors(as_bytes(io::serialize_safetensors(tensors)));
  EXPECT_TRUE(file.metadata.empty());
  ASSERT_EQ(file.tensors.size(), tensors.size());
  // No tensors at all: the header "{}" padded to 8 bytes, no data.
  const std::string empty = io::serialize_safetensors({});
  EXPECT_EQ(empty, prefix_of(8) + "{}      ");
  EXPECT_TRUE(io::parse_safetensors(as_bytes(empty)).tensors.empty());
}

TEST(Safetensors, StridedViewsAreWrittenRowMajor) {
  Tensor base = attn::randn({4, 6});
  Tensor view = base.transpose(0, 1).slice(0, 1, 5);  // (4, 4), strided
  ASSERT_FALSE(view.is_contiguous());
  const auto file = io::parse_safetensors(as_bytes(io::serialize_safetensors({{"v", view}})));
  expect_same_tensor(file.tensors.at(0).second, view.contiguous(), "v");
  // The read tensor owns its storage.
  EXPECT_FALSE(file.tensors.at(0).second.shares_storage_with(base));
}

// The writer's exact output: the length prefix, compact JSON with __metadata__
// first, larger elements first then names in order, padding to a multiple of 8.
TEST(Safetensors, WriterOutputIsExactAndDeterministic) {
  const Tensor a = Tensor::of({2}, {1.0f, -2.0f});
  const Tensor ids = Tensor::from_int64({1}, {7});
  const Tensor h = Tensor::of({1}, {1.0f}).to(DType::kBFloat16);
  const std::string bytes =
      io::serialize_safetensors({{"b", a}, {"h", h}, {"a", a}, {"ids", ids}}, {{"k", "v"}});
  const std::string header =
      R"({"__metadata__":{"k":"v"},"ids":{"dtype":"I64","shape":[1],"data_offsets":[0,8]},)"
      R"("a":{"dtype":"F32","shape":[2],"data_offsets":[8,16]},)"
      R"("b":{"dtype":"F32","shape":[2],"data_offsets":[16,24]},)"
      R"("h":{"dtype":"BF16","shape":[1],"data_offsets":[24,26]}})";
  const std::string padded = header + std::string((8 - header.size() % 8) % 8, ' ');
  ASSERT_EQ(padded.size() % 8, 0u);
  const std::string data = raw_bytes(ids) + raw_bytes(a) + raw_bytes(a) + raw_bytes(h);
  EXPECT_EQ(bytes, prefix_of(padded.size()) + padded + data);
  // The same tensors in another order give the same bytes.
  EXPECT_EQ(io::serialize_safetensors({{"ids", ids}, {"a", a}, {"h", h}, {"b", a}}, {{"k", "v"}}),
            bytes);
}

TEST(Safetensors, WriterRefusesBadNames) {
  const Tensor t = Tensor::ones({2});
  auto message = [&](const Named& tensors, const std::map<std::string, std::string>& meta = {}) {
    try {
      (void)io::serialize_safetensors(tensors, meta);
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string("(accepted)");
  };
  EXPECT_EQ(message({{"w", t}, {"w", t}}), "safetensors: the tensor name 'w' appears twice");
  EXPECT_EQ(message({{"__metadata__", t}}),
            "safetensors: '__metadata__' is reserved and cannot name a tensor");
  EXPECT_EQ(message({{"", t}}), "(accepted)");  // as the reference: any string names a tensor
  // The name's bytes come out through attn::printable: no raw byte in a message.
  EXPECT_EQ(message({{"bad\xff", t}}), "safetensors: the tensor name 'bad\\xFF' is not valid UTF-8");
  EXPECT_EQ(message({{"w", t}}, {{"k", "\xc3"}}),
            "safetensors: the metadata value of 'k' is not valid UTF-8");
}

TEST(Safetensors, WriteIsAtomicAndReplacesTheTarget) {
  const std::string dir = temp_dir();
  const std::string path = dir + "/w.safetensors";
  io::write_safetensors(path, {{"x", Tensor::ones({3})}});
  io::write_safetensors(path, {{"y", Tensor::zeros({2})}});  // replaces
  const auto file = io::read_safetensors(path);
  ASSERT_EQ(file.tensors.size(), 1u);
  EXPECT_EQ(file.tensors[0].first, "y");
  // Nothing else is left in the folder (no temporary file).
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(dir))
    names.push_back(entry.path().filename().string());
  EXPECT_EQ(names, std::vector<std::string>{"w.safetensors"});
  // A folder that does not exist: an error naming the path and the reason.
  const std::string missing = dir + "/no/such/folder/w.safetensors";
  try {
    io::write_safetensors(missing, {{"x", Tensor::ones({3})}});
    ADD_FAILURE() << "wrote into a missing folder";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("cannot write '" + missing + "'"), std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("No such file or directory"), std::string::npos)
        << e.what();
  }
}

TEST(Safetensors, DTypeNames) {
  EXPECT_STREQ(io::safetensors_dtype_name(DType::kFloat32), "F32");
  EXPECT_STREQ(io::safetensors_dtype_name(DType::kBFloat16), "BF16");
  EXPECT_STREQ(io::safetensors_dtype_name(DType::kInt64), "I64");
  EXPECT_EQ(io::dtype_from_safetensors("BF16"), DType::kBFloat16);
  EXPECT_THROW(io::dtype_from_safetensors("F16"), std::invalid_argument);
  EXPECT_THROW(io::dtype_from_safetensors("f32"), std::invalid_argument);
}

// ---- malformed files ---------------------------------------------------------------------

TEST(SafetensorsMalformed, TruncatedLengthAndHeader) {
  expect_rejected("", "truncated: 0 bytes, fewer than the 8 of the header length");
  expect_rejected(std::string(7, '\0'), "truncated: 7 bytes");
  expect_rejected(prefix_of(100),
                  "header length 100 goes beyond the end of the file (8 bytes: at most 0 for");
  expect_rejected(prefix_of(10) + "{}",
                  "header length 10 goes beyond the end of the file (10 bytes");
  expect_rejected(prefix_of(100'000'001) + "{}",
                  "header length 100000001 exceeds the limit of 100000000 bytes");
  expect_rejected(prefix_of(UINT64_MAX), "header length 18446744073709551615 exceeds the limit");
  expect_rejected(prefix_of(0), "the header (length 0) does not start with '{'");
}

TEST(SafetensorsMalformed, HeaderIsNotAJsonObject) {
  expect_rejected(file_of("[1, 2]"), "does not start with '{'");
  expect_rejected(file_of(" {}"), "does not start with '{'");
  expect_rejected(file_of(R"({"a": )"), "the header is not valid JSON: ");
  expect_rejected(file_of(R"({"a": 1)"), "not valid JSON");
  expect_rejected(file_of("{} x"), "not valid JSON");
  expect_rejected(file_of(std::string("{}\0\0", 4)), "not valid JSON: a NUL byte at offset 2 of 4");
  expect_rejected(file_of(std::string("{}\0x", 4)), "not valid JSON: a NUL byte at offset 2 of 4");
  expect_rejected(file_of("{\"\xff\": 1}"), "not valid JSON");  // invalid UTF-8
  expect_rejected(file_of(R"({"a": {"dtype": "F32", "shape": [[1]], "data_offsets": [0, 4]}})"),
                  "nests deeper");
  expect_rejected(file_of(R"({"a": {"dtype": {"x": [1]}}})"), "nests deeper");
}

TEST(SafetensorsMalformed, EntriesAndMetadata) {
  expect_rejected(file_of(R"({"a": 5})"), "tensor 'a': expected an object, got number");
  expect_rejected(file_of(R"({"a": {"shape": [], "data_offsets": [0, 4]}})"),
                  "tensor 'a': no \"dtype\"");
  expect_rejected(file_of(R"({"a": {"dtype": "F32", "data_offsets": [0, 4]}})"),
                  "tensor 'a': no \"shape\"");
  expect_rejected(file_of(R"({"a": {"dtype": "F32", "shape": []}})"),
                  "tensor 'a': no \"data_offsets\"");
  expect_rejected(
      file_of(R"({"a": {"dtype": "F32", "shape": [], "data_offsets": [0, 4], "x": 1}})", "1234"),
      "tensor 'a': unexpected key 'x'");
  expect_rejected(
      file_of(R"({"a": {"dtype": "F33", "shape": [], "data_offsets": [0, 4]}})", "1234"),
      "tensor 'a': unknown dtype \"F33\" (safetensors dtypes: BOOL, U8");
  expect_rejected(file_of(R"({"a": {"dtype": 4, "shape": [], "data_offsets": [0, 4]}})", "1234"),
                  "tensor 'a': dtype must be a string, got 4");
  expect_rejected(file_of(R"({"a": {"dtype": "F32", "shape": 3, "data_offsets": [0, 4]}})", "1234"),
                  "tensor 'a': shape must be an array, got 3");
  expect_rejected(
      file_of(R"({"a": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}})", "1234"),
      "tensor 'a': shape[0] must be a non-negative integer, got -1");
  expect_rejected(
      file_of(R"({"a": {"dtype": "F32", "shape": [1.0], "data_offsets": [0, 4]}})", "1234"),
      "tensor 'a': shape[0] must be a non-negative integer, got 1.0");
  expect_rejected(
      file_of(R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4, 8]}})", "1234"),
      "tensor 'a': data_offsets must be [begin, end], got [0,4,8]");
  expect_rejected(
      file_of(R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": ["0", 4]}})", "1234"),
      "tensor 'a': data_offsets[0] must be a non-negative integer, got \"0\"");
  expect_rejected(
      file_of(R"({"a": {"dtype": "F32", "shape": [0], "data_offsets": [4, 0]}})", "1234"),
      "tensor 'a': data_offsets [4, 0] end before they begin");
  expect_rejected(
      file_of(R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 18446744073709551615]}})",
              "1234"),
      "tensor 'a': data_offsets[1] (18446744073709551615) is too large");
  expect_rejected(
      file_of(R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}, "a": 1})", "1234"),
      "the header names 'a' twice");
  expect_rejected(
      file_of(R"({"a": {"dtype": "F32", "dtype": "F32", "shape": [1], "data_offsets": [0, 4]}})",
              "1234"),
      "the header repeats the key 'dtype' inside one entry");
  expect_rejected(file_of(R"({"__metadata__": [1]})"), "__metadata__ must be an object, got array");
  expect_rejected(file_of(R"({"__metadata__": {"k": 1}})"),
                  "__metadata__ 'k' must be a string, got 1");
}

TEST(SafetensorsMalformed, SizesThatDisagreeOrOverflow) {
  expect_rejected(
      file_of(R"({"a": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 20]}})",
              std::string(20, 'x')),
      "tensor 'a': shape (2, 3) of F32 needs 24 bytes but data_offsets [0, 20] hold 20");
  expect_rejected(file_of(R"({"a": {"dtype": "F32", "shape": [], "data_offsets": [0, 0]}})"),
                  "shape () of F32 needs 4 bytes but data_offsets [0, 0] hold 0");
  // 2^62 elements of 4 bytes: the byte count overflows int64.
  expect_rejected(
      file_of(R"({"a": {"dtype": "F32", "shape": [4611686018427387904], "data_offsets": [0, 0]}})"),
      "tensor 'a': shape (4611686018427387904,) of F32 needs more bytes than int64 can count");
  expect_rejected(
      file_of(
          R"({"a": {"dtype": "I64", "shape": [1099511627776, 1099511627776], "data_offsets": [0, 8]}})"),
      "tensor 'a': shape (1099511627776, 1099511627776) has more elements than int64 can count");
  // Products that wrap to a small number in 64 bits: 2^32 · 2^32 · 4 = 0 mod 2^64.
  expect_rejected(
      file_of(
          R"({"a": {"dtype": "F32", "shape": [4294967296, 4294967296], "data_offsets": [0, 0]}})"),
      "has more elements than int64 can count");
  // Empty, but its row-major strides would overflow.
  expect_rejected(
      file_of(
          R"({"a": {"dtype": "U8", "shape": [0, 4294967296, 4294967296], "data_offsets": [0, 0]}})"),
      "has more elements than int64 can count");
  expect_rejected(
      file_of(R"({"a": {"dtype": "F32", "shape": [9223372036854775808], "data_offsets": [0, 0]}})"),
      "tensor 'a': shape[0] (9223372036854775808) is too large");
}

TEST(SafetensorsMalformed, OffsetsWithHolesOverlapsOrOutOfRange) {
  const std::string f32 = R"({"dtype": "F32", "shape": [2], "data_offsets": )";
  expect_rejected(
      file_of("{\"a\": " + f32 + "[0, 8]}, \"b\": " + f32 + "[12, 20]}}", std::string(20, 'x')),
      "bytes [8, 12) of the data section belong to no tensor (a hole before 'b')");
  expect_rejected(file_of("{\"a\": " + f32 + "[4, 12]}}", std::string(12, 'x')),
                  "bytes [0, 4) of the data section belong to no tensor (a hole before 'a')");
  expect_rejected(
      file_of("{\"a\": " + f32 + "[0, 8]}, \"b\": " + f32 + "[4, 12]}}", std::string(12, 'x')),
      "tensor 'b' at data_offsets [4, 12] overlaps 'a' at [0, 8]");
  expect_rejected(
      file_of("{\"a\": " + f32 + "[0, 8]}, \"b\": " + f32 + "[0, 8]}}", std::string(16, 'x')),
      "tensor 'b' at data_offsets [0, 8] overlaps 'a' at [0, 8]");
  expect_rejected(file_of("{\"a\": " + f32 + "[0, 8]}}", std::string(4, 'x')),
                  "tensor 'a' at data_offsets [0, 8] goes beyond the data section's 4 bytes");
  expect_rejected(
      file_of("{\"a\": " + f32 + "[0, 8]}}", std::string(12, 'x')),
      "the tensors end at byte 8 of the data section, but it has 12 bytes (4 bytes after the last");
  expect_rejected(file_of("{}", "x"),
                  "the tensors end at byte 0 of the data section, but it has 1 bytes");
  // Offsets far past the end, with sizes that agree.
  expect_rejected(
      file_of(
          R"({"a": {"dtype": "U8", "shape": [8], "data_offsets": [9223372036854775799, 9223372036854775807]}})"),
      "belong to no tensor");
}

// A header of many small tensors parses in O(n log n): nlohmann's parse with a
// callback rescanned the enclosing object at the end of every entry, so 40,000
// tensors took 12.6 s and 80,000 over two minutes (issue 46).
TEST(SafetensorsMalformed, AHundredThousandTensorsParseQuickly) {
  constexpr int kTensors = 100000;
  std::string header = "{";
  for (int i = 0; i < kTensors; ++i) {
    header +=
        fmt::format("{}\"t{}\": {{\"dtype\": \"U8\", \"shape\": [1], \"data_offsets\": [{}, {}]}}",
                    i == 0 ? "" : ", ", i, i, i + 1);
  }
  header += "}";
  const std::string bytes = file_of(header, std::string(kTensors, 'x'));
  const auto start = std::chrono::steady_clock::now();
  const io::SafetensorsHeader parsed = io::parse_safetensors_header(as_bytes(bytes), "many");
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ASSERT_EQ(parsed.entries.size(), static_cast<size_t>(kTensors));
  EXPECT_EQ(parsed.entries[kTensors - 1].begin, kTensors - 1);
  // Well under a second on an idle machine; the bound leaves room for a loaded one.
  EXPECT_LT(seconds, 3.0) << "100,000 tensors took " << seconds << " s";
  // A duplicate name among them is still found.
  std::string dup = header;
  dup.back() = ',';
  dup += R"( "t5": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]}})";
  expect_rejected(file_of(dup, std::string(kTensors, 'x')), "the header names 't5' twice");
}

TEST(SafetensorsMalformed, DTypesAttnDoesNotRead) {
  // A valid file with an F16 tensor: the header reads, the tensors do not.
  const std::string bytes =
      file_of(R"({"h": {"dtype": "F16", "shape": [2], "data_offsets": [0, 4]}})", "abcd");
  const auto header = io::parse_safetensors_header(as_bytes(bytes), "half.safetensors");
  ASSERT_EQ(header.entries.size(), 1u);
  EXPECT_EQ(header.entries[0].dtype, "F16");
  EXPECT_EQ(header.entries[0].element_size, 2);
  expect_rejected(bytes,
                  "tensor 'h' has dtype F16, which attn does not read (it reads F32, BF16, I64)");
}

TEST(SafetensorsMalformed, FilesThatCannotBeRead) {
  const std::string dir = temp_dir();
  EXPECT_THROW(
      {
        try {
          (void)io::read_safetensors(dir + "/missing.safetensors");
        } catch (const std::runtime_error& e) {
          EXPECT_NE(std::string(e.what()).find("missing.safetensors': cannot open: No such file"),
                    std::string::npos)
              << e.what();
          throw;
        }
      },
      std::runtime_error);
  EXPECT_THROW((void)io::read_safetensors(dir),
               std::runtime_error);  // a folder: not a regular file
  // A truncated file on disk: every proper prefix of a valid file is refused.
  const std::string valid = io::serialize_safetensors(every_dtype_and_shape(), {{"k", "v"}});
  const std::string path = dir + "/cut.safetensors";
  for (size_t cut :
       {size_t{0}, size_t{5}, size_t{8}, size_t{100}, valid.size() / 2, valid.size() - 1}) {
    std::FILE* f = std::fopen(path.c_str(), "wb");
    ASSERT_NE(f, nullptr);
    std::fwrite(valid.data(), 1, cut, f);
    std::fclose(f);
    EXPECT_THROW((void)io::read_safetensors(path), std::runtime_error) << "cut at " << cut;
  }
}

// Random bytes and damaged valid files: either a valid file or a
// std::runtime_error, never a crash, another exception or a read out of bounds
// (the asan preset runs this too).
TEST(SafetensorsMalformed, RandomBytesAndMutationsNeverCrash) {
  const std::string valid =
      io::serialize_safetensors({{"w", attn::randn({3, 4})},
                                 {"ids", Tensor::from_int64({2}, {1, 2})},
                                 {"h", Tensor::ones({2}).to(DType::kBFloat16)}},
                                {{"k", "v"}});
  int accepted = 0, refused = 0;
  auto attempt = [&](const std::string& bytes) {
    try {
      const auto file = io::parse_safetensors(as_bytes(bytes));
      for (const auto& [name, t] : file.tensors) EXPECT_TRUE(t.is_contiguous()) << name;
      ++accepted;
    } catch (const std::runtime_error&) {
      ++refused;
    }
  };
  // Every proper prefix of a valid file is refused.
  for (size_t cut = 0; cut < valid.size(); ++cut) {
    EXPECT_THROW((void)io::parse_safetensors(as_bytes(valid.substr(0, cut))), std::runtime_error)
        << cut;
  }
  for (uint32_t seed = 0; seed < 2000; ++seed) {
    std::mt19937 rng(seed);
    // Pure random bytes, sometimes behind a plausible length prefix.
    std::string noise(rng() % 256, '\0');
    for (char& c : noise) c = static_cast<char>(rng());
    attempt(noise);
    attempt(prefix_of(noise.size()) + noise);
    // A valid file with 1 to 4 bytes changed.
    std::string damaged = valid;
    for (uint32_t k = 0, n = 1 + rng() % 4; k < n; ++k) {
      damaged[rng() % damaged.size()] = static_cast<char>(rng());
    }
    attempt(damaged);
  }
  EXPECT_GT(refused, 4000);
  std::printf("random/mutated inputs: %d accepted, %d refused\n", accepted, refused);
}

// ---- modules --------------------------------------------------------------------------------

namespace {

attn::nn::MultiHeadAttentionOptions mha_options() {
  return {.d_in = 8,
          .d_out = 12,
          .context_length = 10,
          .dropout = 0.0f,
          .num_heads = 3,
          .qkv_bias = true};
}

struct TiedLm : attn::nn::Module {
  explicit TiedLm(attn::Generator& gen)
      : tok_emb({.num_embeddings = 7, .embedding_dim = 4}, gen),
        out_head({.in_features = 4, .out_features = 7, .bias = false}, gen) {
    register_module("tok_emb", &tok_emb);
    register_module("out_head", &out_head);
    attn::nn::tie(out_head.weight, tok_emb.weight);
  }
  attn::nn::Embedding tok_emb;
  attn::nn::Linear out_head;
};

std::string load_error(attn::nn::Module& m, const io::SafetensorsFile& file, bool strict = true) {
  try {
    (void)io::load_state_dict(m, file, strict);
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "(loaded)";
}

}  // namespace

TEST(SafetensorsModules, SaveAndLoadMultiHeadAttention) {
  attn::manual_seed(123);
  attn::nn::MultiHeadAttention a(mha_options());
  const std::string path = temp_dir() + "/mha.safetensors";
  io::save_state_dict(a, path, {{"model", "MultiHeadAttention"}});
  const auto header = io::read_safetensors_header(path);
  EXPECT_EQ(header.metadata.at("model"), "MultiHeadAttention");
  EXPECT_EQ(header.entries.size(), a.state_dict().size());  // every parameter (and buffer)

  attn::manual_seed(999);  // other weights
  attn::nn::MultiHeadAttention b(mha_options());
  const io::LoadResult r = io::load_state_dict(b, path);
  EXPECT_TRUE(r.missing.empty());
  EXPECT_TRUE(r.unexpected.empty());
  const auto sa = a.state_dict(), sb = b.state_dict();
  ASSERT_EQ(sa.size(), sb.size());
  for (size_t i = 0; i < sa.size(); ++i) {
    EXPECT_EQ(sa[i].first, sb[i].first);
    EXPECT_EQ(raw_bytes(sa[i].second), raw_bytes(sb[i].second)) << sa[i].first;
  }
  a.eval();
  b.eval();
  const Tensor x = attn::randn({2, 5, 8});
  EXPECT_EQ(raw_bytes(a.forward(x)), raw_bytes(b.forward(x)));
}

TEST(SafetensorsModules, NamesTheModuleDoesNotHaveAndMissingNames) {
  attn::manual_seed(1);
  attn::nn::MultiHeadAttention m(mha_options());
  io::SafetensorsFile file;
  file.path = "m.safetensors";
  for (const auto& [name, t] : m.state_dict()) file.tensors.emplace_back(name, t.clone());

  io::SafetensorsFile extra = file;
  extra.tensors.emplace_back("W_gate.weight", Tensor::ones({2}));
  extra.tensors.emplace_back("blocks.0.bias", Tensor::ones({2}));
  EXPECT_EQ(load_error(m, extra),
            "load_state_dict: 'm.safetensors': 2 tensor(s) the module does not have: "
            "W_gate.weight, blocks.0.bias");

  io::SafetensorsFile fewer = file;
  std::erase_if(fewer.tensors, [](const auto& e) {
    return e.first == "W_query.bias" || e.first == "out_proj.weight";
  });
  EXPECT_EQ(load_error(m, fewer),
            "load_state_dict: 'm.safetensors': 2 of the module's tensor(s) missing from the file: "
            "W_query.bias, out_proj.weight");
  std::erase_if(extra.tensors, [](const auto& e) { return e.first == "W_query.weight"; });
  EXPECT_EQ(load_error(m, extra),
            "load_state_dict: 'm.safetensors': 2 tensor(s) the module does not have: "
            "W_gate.weight, blocks.0.bias; "
            "1 of the module's tensor(s) missing from the file: W_query.weight");

  // Not strict: the common names load, the others are returned.
  Tensor before = m.parameter("W_query.weight").value.clone();
  for (auto& [name, t] : extra.tensors) {
    if (name == "W_key.weight") t.fill_(0.5f);
  }
  const io::LoadResult r = io::load_state_dict(m, extra, /*strict=*/false);
  EXPECT_EQ(r.unexpected, (std::vector<std::string>{"W_gate.weight", "blocks.0.bias"}));
  EXPECT_EQ(r.missing, (std::vector<std::string>{"W_query.weight"}));
  EXPECT_EQ(m.parameter("W_key.weight").value.at({0, 0}), 0.5f);
  EXPECT_EQ(raw_bytes(m.parameter("W_query.weight").value), raw_bytes(before));
}

TEST(SafetensorsModules, DTypeAndShapeMismatchesWriteNothing) {
  attn::manual_seed(2);
  attn::nn::MultiHeadAttention m(mha_options());
  io::SafetensorsFile file;
  file.path = "m.safetensors";
  for (const auto& [name, t] : m.state_dict())
    file.tensors.emplace_back(name, Tensor::zeros(t.shape()));
  const Tensor before = m.parameter("W_query.weight").value.clone();

  // out_proj.bias is the module's last state_dict() entry: every other tensor
  // has passed its checks when it fails.
  ASSERT_EQ(m.state_dict().back().first, "out_proj.bias");
  auto bias_of = [](io::SafetensorsFile& f) -> Tensor& {
    for (auto& [name, t] : f.tensors) {
      if (name == "out_proj.bias") return t;
    }
    throw std::logic_error("no out_proj.bias");
  };
  io::SafetensorsFile wrong_dtype = file;
  bias_of(wrong_dtype) = bias_of(wrong_dtype).to(DType::kBFloat16);
  EXPECT_EQ(load_error(m, wrong_dtype),
            "load_state_dict: 'm.safetensors': tensor 'out_proj.bias' has dtype bfloat16 but the "
            "module's is float32");
  io::SafetensorsFile wrong_shape = file;
  bias_of(wrong_shape) = Tensor::zeros({13});
  EXPECT_EQ(load_error(m, wrong_shape),
            "load_state_dict: 'm.safetensors': tensor 'out_proj.bias' has shape (13,) but the "
            "module's is (12,)");
  // Nothing was copied.
  EXPECT_EQ(raw_bytes(m.parameter("W_query.weight").value), raw_bytes(before));
}

TEST(SafetensorsModules, TiedParameterIsSavedOnceAndLoadedThroughEitherName) {
  attn::Generator gen(5);
  TiedLm a(gen);
  const std::string path = temp_dir() + "/tied.safetensors";
  io::save_state_dict(a, path);
  const auto file = io::read_safetensors(path);
  ASSERT_EQ(file.tensors.size(), 1u);
  EXPECT_EQ(file.tensors[0].first, "tok_emb.weight");

  attn::Generator other(6);
  TiedLm b(other);
  EXPECT_TRUE(io::load_state_dict(b, file).missing.empty());
  EXPECT_EQ(raw_bytes(b.out_head.weight.value), raw_bytes(a.tok_emb.weight.value));
  EXPECT_TRUE(b.out_head.weight.is(b.tok_emb.weight));  // still tied
  // The file may name it the other way (as GPT-2 checkpoints that keep only lm_head).
  io::SafetensorsFile renamed = file;
  renamed.tensors[0].first = "out_head.weight";
  renamed.tensors[0].second = Tensor::ones({7, 4});
  EXPECT_TRUE(io::load_state_dict(b, renamed).missing.empty());
  EXPECT_EQ(b.tok_emb.weight.value.at({6, 3}), 1.0f);
}

// ---- attn inspect ---------------------------------------------------------------------------

TEST(SafetensorsCli, InspectListsTensorsAndMetadata) {
  ATTN_REQUIRE_CLI();
  const std::string path = temp_dir() + "/model.safetensors";
  io::write_safetensors(path,
                        {{"W_query.weight", Tensor::ones({12, 8})},
                         {"ids", Tensor::from_int64({3}, {1, 2, 3})},
                         {"scalar", Tensor::ones({}).to(DType::kBFloat16)},
                         {"empty", Tensor::zeros({0, 4})}},
                        {{"format", "pt"}});
  const auto r = attn::test::run_cli("inspect '" + path + "'");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.err, "");
  const auto lines = attn::test::lines_of(r.out);
  ASSERT_EQ(lines.size(), 8u) << r.out;
  EXPECT_EQ(lines[0], path + ": 4 tensors, 100 elements; 288 bytes of header, 410 bytes of data");
  EXPECT_EQ(lines[1], "name            dtype  shape    bytes  data_offsets");
  EXPECT_EQ(lines[2], "ids             I64    (3,)        24  [0, 24)");
  EXPECT_EQ(lines[3], "W_query.weight  F32    (12, 8)    384  [24, 408)");
  EXPECT_EQ(lines[4], "empty           F32    (0, 4)       0  [408, 408)");
  EXPECT_EQ(lines[5], "scalar          BF16   ()           2  [408, 410)");
  EXPECT_EQ(lines[6], "metadata: 1 entries");
  EXPECT_EQ(lines[7], "  format: pt");

  const auto j = attn::test::run_cli("inspect --json '" + path + "'");
  ASSERT_EQ(j.exit_code, 0) << j.err;
  const auto parsed = nlohmann::json::parse(j.out);
  EXPECT_EQ(parsed.at("tensors").size(), 4u);
  EXPECT_EQ(parsed.at("tensors")[1].at("name"), "W_query.weight");
  EXPECT_EQ(parsed.at("tensors")[1].at("shape"), nlohmann::json({12, 8}));
  EXPECT_EQ(parsed.at("metadata").at("format"), "pt");
}

TEST(SafetensorsCli, InspectOfAMalformedFileIsOneLineAndExitOne) {
  ATTN_REQUIRE_CLI();
  const std::string dir = temp_dir();
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"short", "abc"},
      {"beyond", prefix_of(1000) + "{}"},
      {"json", file_of("{\"a\":\n")},
      {"hole",
       file_of(R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}})", "12345678")},
  };
  const std::vector<std::string> needles = {"truncated: 3 bytes", "header length 1000 goes beyond",
                                            "not valid JSON", "belong to no tensor"};
  for (size_t i = 0; i < cases.size(); ++i) {
    const std::string path = dir + "/" + cases[i].first + ".safetensors";
    std::FILE* f = std::fopen(path.c_str(), "wb");
    ASSERT_NE(f, nullptr);
    std::fwrite(cases[i].second.data(), 1, cases[i].second.size(), f);
    std::fclose(f);
    const auto r = attn::test::run_cli("inspect '" + path + "'");
    EXPECT_EQ(r.exit_code, 1) << cases[i].first;
    EXPECT_EQ(r.out, "");
    const auto lines = attn::test::lines_of(r.err);
    ASSERT_EQ(lines.size(), 1u) << r.err;
    EXPECT_EQ(lines[0].rfind("attn: inspect: safetensors file '" + path + "': ", 0), 0u)
        << lines[0];
    EXPECT_NE(lines[0].find(needles[i]), std::string::npos) << lines[0];
  }
  const auto missing = attn::test::run_cli("inspect '" + dir + "/none.safetensors'");
  EXPECT_EQ(missing.exit_code, 1);
  EXPECT_NE(missing.err.find("cannot open: No such file or directory"), std::string::npos)
      << missing.err;
  const auto usage = attn::test::run_cli("inspect");
  EXPECT_EQ(usage.exit_code, 2);
}
