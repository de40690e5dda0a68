// attn/safetensors.h - weights in and out: the safetensors file format.
//
// A safetensors file (the format of Hugging Face's `safetensors` package):
//
//   bytes [0, 8)          N, the header's length in bytes: uint64, little-endian
//   bytes [8, 8 + N)      the header: a UTF-8 JSON object
//                           {"__metadata__": {"key": "value", ...},      (optional)
//                            "name": {"dtype": "F32", "shape": [2, 3],
//                                     "data_offsets": [begin, end]}, ...}
//   bytes [8 + N, size)   the data section: every tensor's values, row-major,
//                         little-endian, at [begin, end) relative to its start
//
// The reader trusts nothing in a file: before a byte of data is read it checks
// that N is at most 100,000,000 (the reference reader's limit) and inside the
// file, that the header is a JSON object (no duplicate names) whose entries
// have exactly the keys dtype, shape and data_offsets, that every dtype is a
// safetensors dtype and every shape and offset a non-negative integer, that
// shape product × element size equals end - begin without overflowing int64,
// that the tensors, taken in offset order, tile the data section from 0 with
// no hole and no overlap, and that the data ends exactly at the end of the
// file. Every failure throws std::runtime_error naming the file and, where one
// is at fault, the tensor and the values.
//
// dtypes: attn reads and writes F32, BF16 and I64 (DType kFloat32, kBFloat16,
// kInt64). The header reader (read_safetensors_header, `attn inspect`) also
// accepts the other safetensors dtypes (F64, F16, F8_E4M3, F8_E5M2, I32, I16,
// I8, U64, U32, U16, U8, BOOL) and checks their sizes; read_safetensors
// refuses a tensor of one of them, naming it.
//
// The writer is deterministic: tensors ordered by element size, largest first
// (so every tensor's data is aligned to its element size), then by name, as the
// reference writer orders them; metadata keys sorted; the JSON written
// compactly and padded with spaces so that the data starts at a multiple of 8.
// It writes atomically: a temporary file in the target's folder, fsync, rename
// over the target, fsync of the folder; a reader never sees half a file.
//
// Modules in and out of these files: attn/state_dict.h.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "attn/mapped_file.h"
#include "attn/tensor.h"

namespace attn::io {

// The reference reader's limit on the header length N.
inline constexpr uint64_t kSafetensorsMaxHeaderBytes = 100'000'000;

// One tensor as the header describes it (validated against the file).
struct SafetensorsEntry {
  std::string name;
  std::string dtype;         // the safetensors name: "F32", "BF16", "I64", "F16", ...
  int64_t element_size = 0;  // bytes per element of that dtype
  Shape shape;
  int64_t begin = 0;  // data_offsets, relative to the data section: bytes [begin, end)
  int64_t end = 0;
  int64_t nbytes() const { return end - begin; }
};

struct SafetensorsHeader {
  std::vector<SafetensorsEntry> entries;  // in data-offset order
  std::map<std::string, std::string> metadata;
  int64_t header_bytes = 0;  // N
  int64_t data_bytes = 0;    // the data section: file size - 8 - N
};

struct SafetensorsFile {
  std::vector<std::pair<std::string, Tensor>> tensors;  // in data-offset order, contiguous
  std::map<std::string, std::string> metadata;
  std::string
      path;  // where it was read from (parse_safetensors: the name given); names it in errors
};

// The safetensors name of an attn dtype ("F32", "BF16", "I64") and back;
// dtype_from_safetensors throws std::invalid_argument naming an unknown or
// unsupported name.
const char* safetensors_dtype_name(DType dtype);
DType dtype_from_safetensors(const std::string& name);

// Reads and validates the header of the file at path (reads no tensor data).
SafetensorsHeader read_safetensors_header(const std::string& path);
// Reads the whole file: every tensor into its own storage.
SafetensorsFile read_safetensors(const std::string& path);
// The same from bytes in memory (what the fuzzer feeds); `name` stands for the
// file in error messages.
SafetensorsHeader parse_safetensors_header(std::span<const std::byte> bytes,
                                           const std::string& name = "<memory>");
SafetensorsFile parse_safetensors(std::span<const std::byte> bytes,
                                  const std::string& name = "<memory>");

// The bytes of a safetensors file holding `tensors` (any layout; F32, BF16 or
// I64) and `metadata`. Throws std::invalid_argument for a duplicate or
// non-UTF-8 name or metadata string, or the name "__metadata__". (Any other
// string names a tensor, "" included, as in the reference implementation.)
std::string serialize_safetensors(const std::vector<std::pair<std::string, Tensor>>& tensors,
                                  const std::map<std::string, std::string>& metadata = {});
// serialize_safetensors written to path atomically (temporary file, fsync,
// rename, fsync of the folder). Throws std::runtime_error naming the path and
// the system's reason when it cannot.
void write_safetensors(const std::string& path,
                       const std::vector<std::pair<std::string, Tensor>>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

// ---- memory-mapped reading and other dtypes --------------------------------------------------

// IEEE half precision (F16) <-> float32. half_to_float is exact (every half is
// a float); float_to_half rounds to nearest even, overflowing to infinity, and
// keeps NaN a (quiet) NaN.
float half_to_float(uint16_t h);
uint16_t float_to_half(float f);

// A safetensors file mapped read-only (mmap): the header is checked exactly as
// read_safetensors_header checks it, and tensor data is then read in place, so
// a large checkpoint is never copied whole into memory (Hugging Face's GPT-2
// files: attn/hf_gpt2.h). The mapping lives as long as this object; the file
// must not be truncated meanwhile.
class MappedSafetensors {
 public:
  // Throws std::runtime_error naming the path and what is wrong (as
  // read_safetensors_header does, or the system's reason for open/mmap).
  explicit MappedSafetensors(const std::string& path);
  // copy_on_write: the mapping private and writable (MappedFile), so that
  // tensors can be read in place (mutable_data) and still be written.
  MappedSafetensors(const std::string& path, bool copy_on_write);

  const std::string& path() const { return path_; }
  const SafetensorsHeader& header() const { return header_; }
  // The entry of that name, or nullptr.
  const SafetensorsEntry* find(const std::string& name) const;
  // The entry's bytes in the mapping: [begin, end) of the data section.
  std::span<const std::byte> bytes(const SafetensorsEntry& e) const;
  // The entry's first byte, writable: a copy_on_write mapping only (nullptr otherwise).
  std::byte* mutable_data(const SafetensorsEntry& e) const;
  // Drops the whole pages inside the entry's bytes from this process's memory
  // (madvise MADV_DONTNEED; the file and the page cache keep them): after a
  // copy, so that reading a large file does not hold it twice. A page later
  // read again comes back from the file; one written in a copy_on_write
  // mapping is discarded (do not call it on bytes still in use).
  void release(const SafetensorsEntry& e) const;
  // The entry's numel values as float32 into dst: F32 copied, BF16 and F16
  // widened (exactly). Any other dtype throws std::runtime_error naming the
  // file, the tensor and its dtype.
  void read_float32(const SafetensorsEntry& e, float* dst) const;
  // The same as bf16 (as uint16 words, attn/bfloat16.h): BF16 copied, F32
  // rounded to nearest even as PyTorch's .to(torch.bfloat16), F16 widened then
  // rounded. Other dtypes throw as read_float32.
  void read_bfloat16(const SafetensorsEntry& e, uint16_t* dst) const;

 private:
  std::string path_;
  MappedFile map_;
  SafetensorsHeader header_;
};

// A tensor given as its little-endian bytes in any safetensors dtype (F16,
// for instance, which attn has no DType for): `bytes` must hold exactly
// numel(shape) x the dtype's element size and outlive the write.
struct RawTensor {
  std::string name;
  std::string dtype;  // "F32", "F16", "BF16", "I64", ...
  Shape shape;
  std::span<const std::byte> bytes;
};
// write_safetensors for raw tensors: the same order, padding and atomic
// write. Throws std::invalid_argument for an unknown dtype or a byte count
// that does not match the shape (naming the tensor), and as write_safetensors.
void write_safetensors(const std::string& path, const std::vector<RawTensor>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

}  // namespace attn::io
