// The safetensors reader and writer (attn/safetensors.h).
//
// Reading goes through a Source (a file read with pread, or bytes in memory),
// so the file and the fuzzer take the same path: the length prefix, the header,
// every entry and the tiling of the data section are checked before the first
// byte of tensor data is read, and every read stays inside what was checked.
#include "attn/safetensors.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "attn/atomic_file.h"
#include "attn/bfloat16.h"
#include "attn/utf8.h"
#include "base/file_kind.h"

static_assert(std::endian::native == std::endian::little,
              "attn's safetensors reader copies little-endian data as it is");

namespace attn::io {

namespace {

using Json = nlohmann::json;

constexpr int64_t kInt64Max = std::numeric_limits<int64_t>::max();
constexpr int64_t kLengthPrefixBytes = 8;

// ---- dtypes -----------------------------------------------------------------------------

struct DTypeInfo {
  const char* name;
  int64_t element_size;
};
// Every dtype of the safetensors format, with its element size in bytes.
constexpr std::array<DTypeInfo, 15> kSafetensorsDTypes = {{{"BOOL", 1},
                                                           {"U8", 1},
                                                           {"I8", 1},
                                                           {"F8_E5M2", 1},
                                                           {"F8_E4M3", 1},
                                                           {"I16", 2},
                                                           {"U16", 2},
                                                           {"F16", 2},
                                                           {"BF16", 2},
                                                           {"I32", 4},
                                                           {"U32", 4},
                                                           {"F32", 4},
                                                           {"F64", 8},
                                                           {"I64", 8},
                                                           {"U64", 8}}};

const DTypeInfo* find_dtype(const std::string& name) {
  for (const auto& info : kSafetensorsDTypes) {
    if (name == info.name) return &info;
  }
  return nullptr;
}

std::string known_dtype_names() {
  std::string names;
  for (const auto& info : kSafetensorsDTypes)
    names += (names.empty() ? "" : ", ") + std::string(info.name);
  return names;
}

// ---- errors -----------------------------------------------------------------------------

// "safetensors file 'model.safetensors': <what>"
[[noreturn]] void fail(const std::string& file, const std::string& what) {
  // The file's own bytes (names, header text, the JSON parser's message quoting
  // them) reach a message only through printable().
  throw std::runtime_error(
      fmt::format("safetensors file '{}': {}", printable(file), printable(what, 4096)));
}

// ---- where the bytes come from ------------------------------------------------------------

class Source {
 public:
  explicit Source(std::string name) : name_(std::move(name)) {}
  virtual ~Source() = default;
  virtual uint64_t size() const = 0;
  // Exactly n bytes at offset into dst; the caller has checked the range.
  virtual void read(uint64_t offset, void* dst, size_t n) const = 0;
  const std::string& name() const { return name_; }

 private:
  std::string name_;
};

class MemorySource : public Source {
 public:
  MemorySource(std::span<const std::byte> bytes, std::string name)
      : Source(std::move(name)), bytes_(bytes) {}
  uint64_t size() const override { return bytes_.size(); }
  void read(uint64_t offset, void* dst, size_t n) const override {
    if (offset > bytes_.size() ||
        n > bytes_.size() - offset) {  // an invariant: callers check first
      throw std::logic_error(fmt::format("safetensors: read of {} bytes at {} beyond {} bytes", n,
                                         offset, bytes_.size()));
    }
    if (n > 0) std::memcpy(dst, bytes_.data() + offset, n);
  }

 private:
  std::span<const std::byte> bytes_;
};

using detail::file_kind;

class FileSource : public Source {
 public:
  explicit FileSource(const std::string& path) : Source(path) {
    // O_NONBLOCK: a FIFO opens at once (and is refused below) instead of
    // waiting for a writer for ever; it changes nothing for a regular file.
    fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd_ < 0) fail(path, fmt::format("cannot open: {}", std::strerror(errno)));
    struct stat st {};
    if (::fstat(fd_, &st) != 0) {
      const int err = errno;
      ::close(fd_);
      fail(path, fmt::format("cannot stat: {}", std::strerror(err)));
    }
    if (!S_ISREG(st.st_mode)) {
      ::close(fd_);
      fail(path, fmt::format("not a regular file: {}", file_kind(st.st_mode)));
    }
    size_ = static_cast<uint64_t>(st.st_size);
  }
  ~FileSource() override { ::close(fd_); }
  FileSource(const FileSource&) = delete;
  FileSource& operator=(const FileSource&) = delete;

  uint64_t size() const override { return size_; }
  void read(uint64_t offset, void* dst, size_t n) const override {
    auto* out = static_cast<char*>(dst);
    while (n > 0) {
      const ssize_t got = ::pread(fd_, out, n, static_cast<off_t>(offset));
      if (got < 0 && errno == EINTR) continue;
      if (got < 0)
        fail(name(), fmt::format("read of {} bytes at offset {} failed: {}", n, offset,
                                 std::strerror(errno)));
      if (got == 0)
        fail(name(), fmt::format("ended at offset {}, before the {} bytes it had when opened "
                                 "(changed while being read?)",
                                 offset, size_));
      out += got;
      n -= static_cast<size_t>(got);
      offset += static_cast<uint64_t>(got);
    }
  }

 private:
  int fd_ = -1;
  uint64_t size_ = 0;
};

// ---- the header ---------------------------------------------------------------------------

// A JSON value that must be an integer in [0, int64 max]: shapes and offsets.
int64_t non_negative_integer(const Json& j, const std::string& file, const std::string& what) {
  if (!j.is_number_unsigned())
    fail(file, fmt::format("{} must be a non-negative integer, got {}", what, j.dump()));
  const uint64_t v = j.get<uint64_t>();
  if (v > static_cast<uint64_t>(kInt64Max))
    fail(file, fmt::format("{} ({}) is too large", what, v));
  return static_cast<int64_t>(v);
}

SafetensorsEntry parse_entry(const std::string& name, const Json& info, const std::string& file) {
  const std::string tensor = fmt::format("tensor '{}'", printable(name));
  if (!info.is_object())
    fail(file, fmt::format("{}: expected an object, got {}", tensor, info.type_name()));
  for (const auto& [key, value] : info.items()) {
    if (key != "dtype" && key != "shape" && key != "data_offsets") {
      fail(file, fmt::format("{}: unexpected key '{}' (an entry has dtype, shape and data_offsets)",
                             tensor, printable(key)));
    }
  }
  for (const char* key : {"dtype", "shape", "data_offsets"}) {
    if (!info.contains(key)) fail(file, fmt::format("{}: no \"{}\"", tensor, printable(key)));
  }

  SafetensorsEntry e;
  e.name = name;
  const Json& dtype = info.at("dtype");
  if (!dtype.is_string())
    fail(file, fmt::format("{}: dtype must be a string, got {}", tensor, dtype.dump()));
  e.dtype = dtype.get<std::string>();
  const DTypeInfo* dinfo = find_dtype(e.dtype);
  if (dinfo == nullptr) {
    fail(file, fmt::format("{}: unknown dtype {} (safetensors dtypes: {})", tensor, dtype.dump(),
                           known_dtype_names()));
  }
  e.element_size = dinfo->element_size;

  const Json& shape = info.at("shape");
  if (!shape.is_array())
    fail(file, fmt::format("{}: shape must be an array, got {}", tensor, shape.dump()));
  for (size_t d = 0; d < shape.size(); ++d) {
    e.shape.push_back(
        non_negative_integer(shape[d], file, fmt::format("{}: shape[{}]", tensor, d)));
  }

  const Json& offsets = info.at("data_offsets");
  if (!offsets.is_array() || offsets.size() != 2) {
    fail(file,
         fmt::format("{}: data_offsets must be [begin, end], got {}", tensor, offsets.dump()));
  }
  e.begin = non_negative_integer(offsets[0], file, tensor + ": data_offsets[0]");
  e.end = non_negative_integer(offsets[1], file, tensor + ": data_offsets[1]");
  if (e.end < e.begin) {
    fail(file,
         fmt::format("{}: data_offsets [{}, {}] end before they begin", tensor, e.begin, e.end));
  }

  // numel × element size, checked for overflow; so is the product of the
  // non-zero sizes, which bounds every row-major stride of the shape.
  int64_t strides_bound = 1, numel = 1, nbytes = 0;
  for (int64_t s : e.shape) {
    if (__builtin_mul_overflow(strides_bound, std::max<int64_t>(s, 1), &strides_bound) ||
        __builtin_mul_overflow(numel, s, &numel)) {
      fail(file, fmt::format("{}: shape {} has more elements than int64 can count", tensor,
                             shape_str(e.shape)));
    }
  }
  if (__builtin_mul_overflow(numel, e.element_size, &nbytes)) {
    fail(file, fmt::format("{}: shape {} of {} needs more bytes than int64 can count", tensor,
                           shape_str(e.shape), e.dtype));
  }
  if (nbytes != e.end - e.begin) {
    fail(file,
         fmt::format("{}: shape {} of {} needs {} bytes but data_offsets [{}, {}] hold {}", tensor,
                     shape_str(e.shape), e.dtype, nbytes, e.begin, e.end, e.end - e.begin));
  }
  return e;
}

// Builds the JSON value of a header from nlohmann's SAX events, checking as it
// goes: no duplicate names, no key twice inside one entry, nothing nested
// deeper than an entry's arrays. (nlohmann's parse with a callback scans the
// whole enclosing object for discarded values at the end of every object, so a
// header of n entries took O(n²) time; this builder is O(n log n).)
class HeaderBuilder : public nlohmann::json_sax<Json> {
 public:
  HeaderBuilder(Json& root, const std::string& file) : root_(root), file_(file) {}

  bool null() override { return put(Json(nullptr)); }
  bool boolean(bool v) override { return put(Json(v)); }
  bool number_integer(number_integer_t v) override { return put(Json(v)); }
  bool number_unsigned(number_unsigned_t v) override { return put(Json(v)); }
  bool number_float(number_float_t v, const string_t& /*text*/) override { return put(Json(v)); }
  bool string(string_t& v) override { return put(Json(std::move(v))); }
  bool binary(binary_t& v) override { return put(Json::binary(std::move(v))); }

  bool start_object(std::size_t /*elements*/) override {
    check_depth();
    if (stack_.size() == 1) entry_keys_.clear();
    stack_.push_back(slot(Json::object()));
    return true;
  }
  bool key(string_t& k) override {
    if (stack_.size() == 1 && !names_.insert(k).second)
      fail(file_, fmt::format("the header names '{}' twice", printable(k)));
    if (stack_.size() == 2 && !entry_keys_.insert(k).second)
      fail(file_, fmt::format("the header repeats the key '{}' inside one entry", printable(k)));
    key_ = k;
    return true;
  }
  bool end_object() override {
    stack_.pop_back();
    return true;
  }
  bool start_array(std::size_t /*elements*/) override {
    check_depth();
    stack_.push_back(slot(Json::array()));
    return true;
  }
  bool end_array() override {
    stack_.pop_back();
    return true;
  }
  bool parse_error(std::size_t /*position*/, const std::string& /*last_token*/,
                   const nlohmann::detail::exception& e) override {
    fail(file_, fmt::format("the header is not valid JSON: {}", e.what()));
  }

 private:
  void check_depth() const {
    if (stack_.size() >= 3)
      fail(file_, "the header nests deeper than {\"name\": {\"shape\": [...]}}");
  }
  // Places v where the parser is (the root, the end of an array, or the
  // current key of an object) and returns where it now lives.
  Json* slot(Json v) {
    if (stack_.empty()) {
      root_ = std::move(v);
      return &root_;
    }
    Json& parent = *stack_.back();
    if (parent.is_array()) {
      parent.push_back(std::move(v));
      return &parent.back();
    }
    Json& target = parent[key_];
    target = std::move(v);
    return &target;
  }
  bool put(Json v) {
    slot(std::move(v));
    return true;
  }

  Json& root_;
  const std::string& file_;
  std::vector<Json*> stack_;
  std::string key_;
  std::set<std::string> names_, entry_keys_;
};

// Parses the JSON text of a header: an object, no duplicate names, nothing
// nested deeper than an entry's arrays.
Json parse_header_json(const std::string& text, const std::string& file) {
  Json root;
  HeaderBuilder builder(root, file);
  try {
    Json::sax_parse(text, &builder);
  } catch (const Json::exception& e) {
    fail(file, fmt::format("the header is not valid JSON: {}", printable(e.what(), 4096)));
  }
  return root;
}

SafetensorsHeader parse_header(const Source& src) {
  const std::string& file = src.name();
  const uint64_t file_size = src.size();
  if (file_size < kLengthPrefixBytes) {
    fail(file,
         fmt::format("truncated: {} bytes, fewer than the 8 of the header length", file_size));
  }
  std::array<unsigned char, kLengthPrefixBytes> prefix{};
  src.read(0, prefix.data(), prefix.size());
  uint64_t n = 0;
  for (size_t i = prefix.size(); i-- > 0;) n = (n << 8) | prefix[i];  // little-endian
  if (n > kSafetensorsMaxHeaderBytes) {
    fail(file, fmt::format("header length {} exceeds the limit of {} bytes", n,
                           kSafetensorsMaxHeaderBytes));
  }
  if (n > file_size - kLengthPrefixBytes) {
    fail(file, fmt::format("header length {} goes beyond the end of the file ({} bytes: at most {} "
                           "for the header)",
                           n, file_size, file_size - kLengthPrefixBytes));
  }
  std::string text(n, '\0');
  src.read(kLengthPrefixBytes, text.data(), text.size());
  if (text.empty() || text.front() != '{') {
    fail(file,
         fmt::format("the header (length {}) does not start with '{{': not a JSON object", n));
  }
  // nlohmann's parser stops at a NUL byte as at the end of its input, so a NUL
  // would hide whatever follows it; JSON has no place for one.
  if (const size_t nul = text.find('\0'); nul != std::string::npos) {
    fail(file, fmt::format("the header is not valid JSON: a NUL byte at offset {} of {}", nul, n));
  }
  const Json root = parse_header_json(text, file);
  if (!root.is_object())
    fail(file, fmt::format("the header is a JSON {}, not an object", root.type_name()));

  SafetensorsHeader header;
  header.header_bytes = static_cast<int64_t>(n);
  header.data_bytes = static_cast<int64_t>(file_size - kLengthPrefixBytes - n);
  for (const auto& [key, value] : root.items()) {
    if (key == "__metadata__") {
      if (!value.is_object())
        fail(file, fmt::format("__metadata__ must be an object, got {}", value.type_name()));
      for (const auto& [mkey, mvalue] : value.items()) {
        if (!mvalue.is_string()) {
          fail(file,
               fmt::format("__metadata__ '{}' must be a string, got {}", printable(mkey), printable(mvalue.dump())));
        }
        header.metadata.emplace(mkey, mvalue.get<std::string>());
      }
      continue;
    }
    header.entries.push_back(parse_entry(key, value, file));
  }

  // In offset order the tensors must tile [0, data_bytes): each begins where
  // the one before ended and the last ends where the file does.
  std::sort(header.entries.begin(), header.entries.end(), [](const auto& a, const auto& b) {
    return std::tie(a.begin, a.end, a.name) < std::tie(b.begin, b.end, b.name);
  });
  int64_t expected = 0;
  const SafetensorsEntry* previous = nullptr;
  for (const auto& e : header.entries) {
    if (e.begin > expected) {
      fail(file, fmt::format(
                     "bytes [{}, {}) of the data section belong to no tensor (a hole before '{}')",
                     expected, e.begin, printable(e.name)));
    }
    if (e.begin < expected) {
      fail(file,
           fmt::format("tensor '{}' at data_offsets [{}, {}] overlaps '{}' at [{}, {}]", printable(e.name),
                       e.begin, e.end, previous->name, previous->begin, previous->end));
    }
    if (e.end > header.data_bytes) {
      fail(file, fmt::format(
                     "tensor '{}' at data_offsets [{}, {}] goes beyond the data section's {} bytes "
                     "(file of {} bytes, header {})",
                     printable(e.name), e.begin, e.end, header.data_bytes, file_size, n));
    }
    expected = e.end;
    previous = &e;
  }
  if (expected != header.data_bytes) {
    fail(file,
         fmt::format(
             "the tensors end at byte {} of the data section, but it has {} bytes ({} bytes after "
             "the last tensor)",
             expected, header.data_bytes, header.data_bytes - expected));
  }
  return header;
}

std::byte* tensor_bytes(Tensor& t) {
  switch (t.dtype()) {
    case DType::kFloat32:
      return reinterpret_cast<std::byte*>(t.data_ptr<float>());
    case DType::kBFloat16:
      return reinterpret_cast<std::byte*>(t.data_ptr<BFloat16>());
    case DType::kInt64:
      return reinterpret_cast<std::byte*>(t.data_ptr<int64_t>());
  }
  throw std::logic_error("safetensors: unknown dtype");
}

SafetensorsFile read_all(const Source& src) {
  const SafetensorsHeader header = parse_header(src);
  // Every dtype first, so that a file attn cannot read fails before any allocation.
  std::vector<DType> dtypes;
  for (const auto& e : header.entries) {
    try {
      dtypes.push_back(dtype_from_safetensors(e.dtype));
    } catch (const std::invalid_argument&) {
      fail(src.name(),
           fmt::format(
               "tensor '{}' has dtype {}, which attn does not read (it reads F32, BF16, I64)",
               printable(e.name), e.dtype));
    }
  }
  SafetensorsFile out;
  out.metadata = header.metadata;
  out.path = src.name();
  const uint64_t data_start = kLengthPrefixBytes + static_cast<uint64_t>(header.header_bytes);
  for (size_t i = 0; i < header.entries.size(); ++i) {
    const auto& e = header.entries[i];
    Tensor t = Tensor::empty(e.shape, dtypes[i]);  // e.nbytes() bytes, checked above
    if (e.nbytes() > 0)
      src.read(data_start + static_cast<uint64_t>(e.begin), tensor_bytes(t),
               static_cast<size_t>(e.nbytes()));
    out.tensors.emplace_back(e.name, std::move(t));
  }
  return out;
}

// ---- writing ------------------------------------------------------------------------------

// The header text (padded) and the tensors in the order of their data.
struct Plan {
  std::string header;  // JSON, padded with spaces to a multiple of 8
  std::vector<std::pair<const std::byte*, int64_t>> data;  // bytes, in data order
};

void check_utf8(const std::string& s, const std::string& what) {
  try {
    (void)Json(s).dump();  // the strict handler throws on invalid UTF-8
  } catch (const Json::exception&) {
    throw std::invalid_argument(fmt::format("safetensors: {} is not valid UTF-8", what));
  }
}

// One tensor to write: its name, safetensors dtype and shape, and its bytes
// (contiguous, little-endian).
struct Item {
  std::string name;
  std::string dtype;
  int64_t element_size = 0;
  Shape shape;
  const std::byte* data = nullptr;
  int64_t nbytes = 0;
};

Plan plan(const std::vector<Item>& items, const std::map<std::string, std::string>& metadata) {
  std::set<std::string> seen;
  for (const auto& item : items) {
    const std::string& name = item.name;
    if (name == "__metadata__") {
      throw std::invalid_argument(
          "safetensors: '__metadata__' is reserved and cannot name a tensor");
    }
    if (!seen.insert(name).second) {
      throw std::invalid_argument(
          fmt::format("safetensors: the tensor name '{}' appears twice", printable(name)));
    }
    check_utf8(name, fmt::format("the tensor name '{}'", printable(name)));
  }
  for (const auto& [key, value] : metadata) {
    check_utf8(key, fmt::format("the metadata key '{}'", printable(key)));
    check_utf8(value, fmt::format("the metadata value of '{}'", printable(key)));
  }

  // Larger elements first, then by name: every tensor starts at a multiple of
  // its element size (the data section starts at a multiple of 8).
  std::vector<size_t> order(items.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    const int64_t ea = items[a].element_size, eb = items[b].element_size;
    if (ea != eb) return ea > eb;
    return items[a].name < items[b].name;
  });

  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) {
    nlohmann::ordered_json meta = nlohmann::ordered_json::object();
    for (const auto& [key, value] : metadata) meta[key] = value;
    header["__metadata__"] = std::move(meta);
  }
  Plan p;
  int64_t offset = 0;
  for (size_t i : order) {
    const Item& item = items[i];
    header[item.name] = {{"dtype", item.dtype},
                         {"shape", item.shape},
                         {"data_offsets", {offset, offset + item.nbytes}}};
    offset += item.nbytes;
    p.data.push_back({item.data, item.nbytes});
  }
  p.header = header.dump();
  p.header.append((8 - p.header.size() % 8) % 8, ' ');
  return p;
}

std::string length_prefix(uint64_t n) {
  std::string prefix(kLengthPrefixBytes, '\0');
  for (size_t i = 0; i < prefix.size(); ++i) prefix[i] = static_cast<char>((n >> (8 * i)) & 0xFF);
  return prefix;
}

const std::byte* tensor_bytes(const Tensor& t) {
  switch (t.dtype()) {
    case DType::kFloat32:
      return reinterpret_cast<const std::byte*>(t.data_ptr<float>());
    case DType::kBFloat16:
      return reinterpret_cast<const std::byte*>(t.data_ptr<BFloat16>());
    case DType::kInt64:
      return reinterpret_cast<const std::byte*>(t.data_ptr<int64_t>());
  }
  throw std::logic_error("safetensors: unknown dtype");
}

}  // namespace

// ---- public -------------------------------------------------------------------------------

const char* safetensors_dtype_name(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return "F32";
    case DType::kBFloat16:
      return "BF16";
    case DType::kInt64:
      return "I64";
  }
  throw std::invalid_argument("safetensors: unknown attn dtype");
}

DType dtype_from_safetensors(const std::string& name) {
  if (name == "F32") return DType::kFloat32;
  if (name == "BF16") return DType::kBFloat16;
  if (name == "I64") return DType::kInt64;
  if (find_dtype(name) != nullptr) {
    throw std::invalid_argument(
        fmt::format("safetensors dtype {} has no attn dtype (attn has F32, BF16, I64)", printable(name)));
  }
  throw std::invalid_argument(fmt::format("unknown safetensors dtype '{}'", printable(name)));
}

SafetensorsHeader read_safetensors_header(const std::string& path) {
  return parse_header(FileSource(path));
}

SafetensorsFile read_safetensors(const std::string& path) { return read_all(FileSource(path)); }

SafetensorsHeader parse_safetensors_header(std::span<const std::byte> bytes,
                                           const std::string& name) {
  return parse_header(MemorySource(bytes, name));
}

SafetensorsFile parse_safetensors(std::span<const std::byte> bytes, const std::string& name) {
  return read_all(MemorySource(bytes, name));
}

namespace {

// The items of attn tensors: each made contiguous (kept alive in `holders`).
std::vector<Item> tensor_items(const std::vector<std::pair<std::string, Tensor>>& tensors,
                               std::vector<Tensor>& holders) {
  std::vector<Item> items;
  holders.reserve(tensors.size());
  for (const auto& [name, t] : tensors) {
    holders.push_back(t.contiguous());
    const Tensor& c = holders.back();
    items.push_back({name, safetensors_dtype_name(c.dtype()), element_size(c.dtype()), c.shape(),
                     tensor_bytes(c), c.numel() * element_size(c.dtype())});
  }
  return items;
}

void write_plan(const std::string& path, const Plan& p) {
  // Piece by piece: the header, then each tensor's bytes straight from its storage.
  write_file_atomically(path, [&](const ByteSink& sink) {
    const std::string prefix = length_prefix(p.header.size());
    sink(prefix.data(), prefix.size());
    sink(p.header.data(), p.header.size());
    for (const auto& [data, nbytes] : p.data) {
      if (nbytes > 0) sink(data, static_cast<size_t>(nbytes));
    }
  });
}

}  // namespace

std::string serialize_safetensors(const std::vector<std::pair<std::string, Tensor>>& tensors,
                                  const std::map<std::string, std::string>& metadata) {
  std::vector<Tensor> holders;
  const Plan p = plan(tensor_items(tensors, holders), metadata);
  std::string out = length_prefix(p.header.size()) + p.header;
  for (const auto& [data, nbytes] : p.data) {
    if (nbytes > 0) out.append(reinterpret_cast<const char*>(data), static_cast<size_t>(nbytes));
  }
  return out;
}

void write_safetensors(const std::string& path,
                       const std::vector<std::pair<std::string, Tensor>>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  std::vector<Tensor> holders;
  write_plan(path, plan(tensor_items(tensors, holders), metadata));
}

void write_safetensors(const std::string& path, const std::vector<RawTensor>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  std::vector<Item> items;
  for (const RawTensor& t : tensors) {
    const DTypeInfo* info = find_dtype(t.dtype);
    if (info == nullptr) {
      throw std::invalid_argument(fmt::format("safetensors: tensor '{}': unknown dtype '{}'",
                                              printable(t.name), printable(t.dtype)));
    }
    int64_t numel = 1;
    for (int64_t d : t.shape) numel *= d;
    const int64_t nbytes = numel * info->element_size;
    if (static_cast<int64_t>(t.bytes.size()) != nbytes) {
      throw std::invalid_argument(fmt::format(
          "safetensors: tensor '{}': shape {} of {} needs {} bytes, got {}", printable(t.name),
          shape_str(t.shape), t.dtype, nbytes, t.bytes.size()));
    }
    items.push_back({t.name, t.dtype, info->element_size, t.shape, t.bytes.data(), nbytes});
  }
  write_plan(path, plan(items, metadata));
}

// ---- F16 ------------------------------------------------------------------------------------

// IEEE binary16: 1 sign bit, 5 exponent bits (bias 15), 10 fraction bits.
float half_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exponent = (h >> 10) & 0x1Fu;
  const uint32_t fraction = h & 0x3FFu;
  float magnitude;
  if (exponent == 0) {
    magnitude = std::ldexp(static_cast<float>(fraction), -24);  // zero or subnormal: f x 2^-24
  } else if (exponent == 0x1F) {
    magnitude = fraction == 0 ? std::numeric_limits<float>::infinity()
                              : std::numeric_limits<float>::quiet_NaN();
  } else {
    magnitude = std::ldexp(static_cast<float>(fraction | 0x400u), static_cast<int>(exponent) - 25);
  }
  return std::bit_cast<float>(std::bit_cast<uint32_t>(magnitude) | sign);
}

uint16_t float_to_half(float f) {
  const uint32_t bits = std::bit_cast<uint32_t>(f);
  const auto sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
  const float a = std::fabs(f);
  if (std::isnan(f)) return static_cast<uint16_t>(sign | 0x7E00u);
  if (a >= 65520.0f) return static_cast<uint16_t>(sign | 0x7C00u);  // rounds past 65504: inf
  if (a < std::ldexp(1.0f, -14)) {
    // Subnormal (or zero): a multiple of 2^-24, rounded to nearest even.
    const float scaled = std::nearbyint(std::ldexp(a, 24));  // the default mode: nearest even
    return static_cast<uint16_t>(sign | static_cast<uint16_t>(scaled));
  }
  // Normal: keep 10 of float's 23 fraction bits, rounding to nearest even (a
  // carry into the exponent is the right result, up to 0x7BFF + 1 = infinity,
  // which the test above excludes).
  const uint32_t abs_bits = bits & 0x7FFFFFFFu;
  const uint32_t rounded = abs_bits + 0xFFFu + ((abs_bits >> 13) & 1u);
  const uint32_t exponent = (rounded >> 23) - 127 + 15;
  return static_cast<uint16_t>(sign | (exponent << 10) | ((rounded >> 13) & 0x3FFu));
}

// ---- memory-mapped files ----------------------------------------------------------------------

MappedSafetensors::MappedSafetensors(const std::string& path) : MappedSafetensors(path, false) {}

MappedSafetensors::MappedSafetensors(const std::string& path, bool copy_on_write)
    : path_(path),
      map_(path, fmt::format("safetensors file '{}'", printable(path)), copy_on_write) {
  header_ = parse_header(MemorySource(map_.bytes(), printable(path)));
}

void MappedSafetensors::release(const SafetensorsEntry& e) const {
  const std::span<const std::byte> b = bytes(e);
  const auto page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  const auto begin = (reinterpret_cast<uintptr_t>(b.data()) + page - 1) / page * page;
  const auto end = reinterpret_cast<uintptr_t>(b.data() + b.size()) / page * page;
  if (end > begin) ::madvise(reinterpret_cast<void*>(begin), end - begin, MADV_DONTNEED);
}

std::byte* MappedSafetensors::mutable_data(const SafetensorsEntry& e) const {
  std::byte* base = map_.writable_data();
  if (base == nullptr) return nullptr;
  return base + kLengthPrefixBytes + static_cast<size_t>(header_.header_bytes) +
         static_cast<size_t>(e.begin);
}

const SafetensorsEntry* MappedSafetensors::find(const std::string& name) const {
  for (const auto& e : header_.entries) {
    if (e.name == name) return &e;
  }
  return nullptr;
}

std::span<const std::byte> MappedSafetensors::bytes(const SafetensorsEntry& e) const {
  const size_t start = kLengthPrefixBytes + static_cast<size_t>(header_.header_bytes);
  return {map_.data() + start + static_cast<size_t>(e.begin), static_cast<size_t>(e.nbytes())};
}

void MappedSafetensors::read_float32(const SafetensorsEntry& e, float* dst) const {
  const std::span<const std::byte> b = bytes(e);
  const size_t n = static_cast<size_t>(e.nbytes() / e.element_size);
  if (e.dtype == "F32") {
    if (n > 0) std::memcpy(dst, b.data(), b.size());
  } else if (e.dtype == "BF16" || e.dtype == "F16") {
    const bool bf16 = e.dtype == "BF16";
    for (size_t i = 0; i < n; ++i) {
      uint16_t h;
      std::memcpy(&h, b.data() + 2 * i, 2);  // unaligned-safe, little-endian
      dst[i] = bf16 ? std::bit_cast<float>(static_cast<uint32_t>(h) << 16) : half_to_float(h);
    }
  } else {
    fail(printable(path_),
         fmt::format("tensor '{}' has dtype {}; attn reads weights of F32, F16 or BF16",
                     printable(e.name), e.dtype));
  }
}

void MappedSafetensors::read_bfloat16(const SafetensorsEntry& e, uint16_t* dst) const {
  const std::span<const std::byte> b = bytes(e);
  const size_t n = static_cast<size_t>(e.nbytes() / e.element_size);
  if (e.dtype == "BF16") {
    if (n > 0) std::memcpy(dst, b.data(), b.size());
  } else if (e.dtype == "F32" || e.dtype == "F16") {
    const bool f32 = e.dtype == "F32";
    for (size_t i = 0; i < n; ++i) {
      float f;
      if (f32) {
        std::memcpy(&f, b.data() + 4 * i, 4);
      } else {
        uint16_t h;
        std::memcpy(&h, b.data() + 2 * i, 2);
        f = half_to_float(h);
      }
      dst[i] = to_bfloat16(f).bits;
    }
  } else {
    fail(printable(path_),
         fmt::format("tensor '{}' has dtype {}; attn reads weights of F32, F16 or BF16",
                     printable(e.name), e.dtype));
  }
}

}  // namespace attn::io
