// attn_fuzz_corpus OUT_DIR: writes the seed corpus of the safetensors fuzzer
// (tests/fuzz/fuzz_safetensors.cpp) into OUT_DIR/seeds - valid files of every
// dtype and shape, with and without metadata, and damaged ones - and makes an
// empty OUT_DIR/work for the files the fuzzer finds. Both are recreated on
// every run, so each fuzzing run starts from the same corpus.
#include <cstdio>
#include <exception>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "attn/random.h"
#include "attn/safetensors.h"

namespace fs = std::filesystem;
using attn::DType;
using attn::Tensor;

namespace {

void write(const fs::path& dir, int& count, const std::string& bytes) {
  std::ofstream out(dir / (std::string("seed_") + std::to_string(count++)), std::ios::binary);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!out)
    throw std::runtime_error(std::string("cannot write the seed corpus under ") + dir.string());
}

std::string with_length(const std::string& header, const std::string& data = "") {
  std::string out(8, '\0');
  for (size_t i = 0; i < 8; ++i) out[i] = static_cast<char>((header.size() >> (8 * i)) & 0xFF);
  return out + header + data;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: attn_fuzz_corpus OUT_DIR\n");
    return 2;
  }
  try {
    const fs::path root(argv[1]);
    fs::remove_all(root / "seeds");
    fs::remove_all(root / "work");
    fs::create_directories(root / "seeds");
    fs::create_directories(root / "work");
    const fs::path seeds = root / "seeds";
    int count = 0;
    attn::manual_seed(1);
    const std::vector<attn::Shape> shapes = {{}, {0}, {1}, {3}, {2, 2}, {2, 0, 3}, {1, 2, 3}};
    for (size_t i = 0; i < shapes.size(); ++i) {
      const Tensor f = attn::randn(shapes[i]);
      const std::vector<std::pair<std::string, Tensor>> one = {
          {std::string("w") + std::to_string(i), f}};
      write(seeds, count, attn::io::serialize_safetensors(one));
      write(seeds, count, attn::io::serialize_safetensors({{"b", f.to(DType::kBFloat16)}}));
      std::vector<int64_t> ids(static_cast<size_t>(f.numel()));
      for (size_t k = 0; k < ids.size(); ++k) ids[k] = static_cast<int64_t>(k) - 3;
      write(seeds, count,
            attn::io::serialize_safetensors({{"ids", Tensor::from_int64(shapes[i], ids)}}));
    }
    const std::string mixed =
        attn::io::serialize_safetensors({{"W_query.weight", attn::randn({2, 3})},
                                         {"tok_emb", attn::randn({4}).to(DType::kBFloat16)},
                                         {"ids", Tensor::from_int64({2}, {5, -1})}},
                                        {{"format", "pt"}, {"note", "seed"}});
    write(seeds, count, mixed);
    write(seeds, count, attn::io::serialize_safetensors({}, {{"k", "v"}}));
    write(seeds, count, attn::io::serialize_safetensors({}));
    // Damaged: cut short, a byte changed in the header and in the length.
    write(seeds, count, mixed.substr(0, mixed.size() / 2));
    std::string damaged = mixed;
    damaged[20] = '[';
    write(seeds, count, damaged);
    damaged = mixed;
    damaged[0] = static_cast<char>(damaged[0] + 1);
    write(seeds, count, damaged);
    // Other dtypes, holes, overlaps, overflowing shapes.
    write(seeds, count,
          with_length(R"({"h":{"dtype":"F16","shape":[2],"data_offsets":[0,4]}})", "abcd"));
    write(seeds, count,
          with_length(R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},)"
                      R"("b":{"dtype":"U8","shape":[2],"data_offsets":[1,3]}})",
                      "abc"));
    write(seeds, count,
          with_length(
              R"({"a":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,0]}})"));
    write(seeds, count,
          with_length(
              R"({"__metadata__":{"a":"b"},"x":{"dtype":"I64","shape":[],"data_offsets":[0,8]}})",
              "12345678"));
    std::printf("attn_fuzz_corpus: %d seeds in %s\n", count, seeds.c_str());
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "attn_fuzz_corpus: %s\n", e.what());
    return 1;
  }
}
