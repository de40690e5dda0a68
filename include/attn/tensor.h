// attn/tensor.h - the tensor every part of attn speaks: a handle on shared
// storage with a dtype, a shape, strides and an offset, as torch.Tensor is.
//
//   Storage   one aligned, reference-counted byte buffer
//   Tensor    (storage, dtype, shape, strides, offset): element (i0, ..., in)
//             lives at  offset + i0·strides[0] + ... + in·strides[n]
//             elements into the storage
//
// Copying a Tensor copies the handle, not the values: `Tensor b = a;` and every
// view (reshape when the layout allows, view, transpose, permute, slice, select,
// unsqueeze, squeeze) share a's storage, so a write through one is seen by all,
// as in PyTorch. clone() copies the values into new storage; contiguous()
// returns the tensor itself when it is already row-major and dense, else such a
// copy.
//
// Layouts: a tensor is contiguous when its strides are the row-major strides of
// its shape. Raw element access (data(), values()) needs a contiguous float32
// tensor and throws otherwise, so nothing reads a strided view as if it were
// dense; data_ptr<T>() is the strided escape hatch for kernels that take
// strides. Every op in attn/ops.h and attn/functional.h accepts any layout (it
// reads its inputs through contiguous()) and returns contiguous tensors; the
// view functions return views.
//
// dtypes: float32 (the maths), bfloat16 (the storage format of the bf16 path:
// the high 16 bits of a float32, converted with round-to-nearest-even as
// PyTorch's .to(torch.bfloat16)) and int64 (token ids). Ops compute in float32
// and say so when given another dtype; to(dtype) converts.
//
// Dimension vocabulary used across attn:
//   B batch, T tokens, d_in / d_out embedding widths, H num_heads,
//   hd head_dim = d_out / H, context_length the longest causal input.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "attn/bfloat16.h"

namespace attn {

using Shape = std::vector<int64_t>;

// "(2, 6, 3)" - the form every error message uses for a shape (and strides).
std::string shape_str(const Shape& shape);
int64_t shape_numel(const Shape& shape);
// The row-major (contiguous) strides of a shape, in elements.
Shape contiguous_strides(const Shape& shape);

// ---- dtypes ---------------------------------------------------------------------------

enum class DType : uint8_t { kFloat32, kBFloat16, kInt64 };
// "float32", "bfloat16", "int64" (PyTorch's torch.float32 etc. without "torch.").
const char* dtype_name(DType dtype);
// The inverse of dtype_name; throws std::invalid_argument naming an unknown name.
DType dtype_from_name(std::string_view name);
int64_t element_size(DType dtype);  // bytes: 4, 2, 8

// The dtype that stores a C++ type: float, BFloat16, int64_t.
template <class T>
constexpr DType dtype_of() {
  if constexpr (std::is_same_v<T, float>) {
    return DType::kFloat32;
  } else if constexpr (std::is_same_v<T, BFloat16>) {
    return DType::kBFloat16;
  } else {
    static_assert(std::is_same_v<T, int64_t>, "attn tensors hold float, BFloat16 or int64_t");
    return DType::kInt64;
  }
}

// ---- storage ----------------------------------------------------------------------------

namespace detail {
struct Block;  // src/tensor/storage_cache.h: one block of the allocator
}  // namespace detail

// One 64-byte-aligned buffer, shared by every tensor that views it.
// Buffers of kStorageCacheMinBytes or more come from the storage cache below.
class Storage {
 public:
  // nbytes >= 0; zero-filled unless zero is false.
  explicit Storage(int64_t nbytes, bool zero = true);
  // nbytes at `data`, memory that `owner` keeps alive (a memory-mapped file):
  // nothing is allocated or freed here; the storage holds owner until it goes.
  Storage(std::shared_ptr<void> owner, std::byte* data, int64_t nbytes);
  std::byte* data() { return data_.get(); }
  const std::byte* data() const { return data_.get(); }
  int64_t nbytes() const { return nbytes_; }

 private:
  Storage(detail::Block block, int64_t nbytes);
  struct Free {
    size_t block_bytes;  // the size of the block behind the pointer (>= nbytes)
    std::shared_ptr<void> owner = nullptr;  // external memory: released with this, never freed
    void operator()(std::byte* p) const;
  };
  std::unique_ptr<std::byte, Free> data_;
  int64_t nbytes_;
};

// ---- the storage cache ----------------------------------------------------------------
// A freed buffer of at least kStorageCacheMinBytes is kept, up to a limit,
// and handed to the next storage of the same size (sizes are rounded up to
// 4 KiB). Why: a training step allocates the same activations every step,
// and the C library returns blocks this large to the kernel at once, so each
// fresh one costs a page fault and a page clear per 4 KiB on first touch (the
// 6-layer, 384-wide Shakespeare model spent a quarter of its step there). The
// same idea as PyTorch's CUDA caching allocator. When adding a block would
// pass the limit, the least recently freed blocks are released first.
// Thread-safe.
inline constexpr int64_t kStorageCacheMinBytes = int64_t{1} << 20;      // 1 MiB
inline constexpr int64_t kStorageCacheDefaultLimit = int64_t{4} << 30;  // 4 GiB
struct StorageCacheStats {
  int64_t cached_bytes = 0;  // held by the cache now, unused
  int64_t cached_blocks = 0;
  int64_t limit_bytes = 0;
  int64_t hits = 0;    // large storages served from the cache
  int64_t misses = 0;  // large storages that came from the C library
};
StorageCacheStats storage_cache_stats();
// bytes >= 0 (0 turns the cache off); releases what is over the new limit.
// Throws std::invalid_argument for a negative limit.
void set_storage_cache_limit(int64_t bytes);
// Returns every cached block to the C library (and so to the system).
void release_cached_storage();

// ---- the tensor -------------------------------------------------------------------------

class Tensor {
 public:
  Tensor() = default;  // an empty float32 tensor of shape (0), no storage
  // Zero-filled (or `fill`) float32, contiguous.
  explicit Tensor(Shape shape, float fill = 0.0f);
  Tensor(Shape shape, const std::vector<float>& values);  // throws if sizes differ

  static Tensor zeros(Shape shape, DType dtype = DType::kFloat32);
  static Tensor ones(Shape shape) { return Tensor(std::move(shape), 1.0f); }
  static Tensor full(Shape shape, float value) { return Tensor(std::move(shape), value); }
  // Uninitialised storage, for outputs the caller overwrites completely.
  static Tensor empty(Shape shape, DType dtype = DType::kFloat32);
  // Tensor::of({6, 3}, {0.43f, 0.15f, ...}): a float32 literal, row-major.
  static Tensor of(Shape shape, std::initializer_list<float> values);
  // An int64 tensor (token ids), row-major; throws if sizes differ.
  static Tensor from_int64(Shape shape, const std::vector<int64_t>& values);
  // A contiguous tensor over memory `owner` keeps alive (no copy): a weight
  // read in place from a memory-mapped file. data must hold numel elements of
  // dtype, aligned to the element size (std::invalid_argument otherwise).
  static Tensor wrap(std::shared_ptr<void> owner, void* data, Shape shape, DType dtype);
  // 0, 1, ..., n-1 as float32.
  static Tensor arange(int64_t n);

  // ---- metadata ----
  DType dtype() const { return dtype_; }
  const Shape& shape() const { return shape_; }
  const Shape& strides() const { return strides_; }  // in elements
  int64_t storage_offset() const { return offset_; }  // in elements
  int64_t dim() const { return static_cast<int64_t>(shape_.size()); }
  // size(-1) is the last dimension; throws std::out_of_range naming the dims.
  int64_t size(int64_t d) const;
  int64_t stride(int64_t d) const;
  int64_t numel() const { return numel_; }
  bool empty() const { return numel_ == 0; }
  bool is_contiguous() const { return contiguous_; }
  // True when both handles view the same storage (the same buffer, whatever
  // their offsets): a write through one may be seen through the other.
  bool shares_storage_with(const Tensor& other) const {
    return storage_ != nullptr && storage_ == other.storage_;
  }
  // How many tensors hold this storage (1: this handle is the only one).
  int64_t storage_use_count() const { return storage_ ? storage_.use_count() : 0; }

  // ---- raw access ----
  // The first element of a contiguous float32 tensor. Throws std::logic_error
  // for another dtype or a strided view (call contiguous() first).
  float* data();
  const float* data() const;
  // The same elements as a span (row-major order): for loops and algorithms.
  std::span<float> values();
  std::span<const float> values() const;
  // The element at offset 0 of a tensor of dtype T, for code that follows the
  // strides itself. Throws std::logic_error when T is not the dtype.
  template <class T>
  T* data_ptr() {
    check_dtype(dtype_of<T>(), "data_ptr");
    return storage_ ? reinterpret_cast<T*>(storage_->data()) + offset_ : nullptr;
  }
  template <class T>
  const T* data_ptr() const {
    check_dtype(dtype_of<T>(), "data_ptr");
    return storage_ ? reinterpret_cast<const T*>(storage_->data()) + offset_ : nullptr;
  }
  // The values in row-major order, converted to float (any dtype, any layout).
  std::vector<float> to_vector() const;
  // The values of an int64 tensor in row-major order.
  std::vector<int64_t> to_int64_vector() const;

  // Element access by row-major position (any layout), float32, bounds-checked.
  float& operator[](int64_t i);
  float operator[](int64_t i) const;
  // Multi-index access (any layout), float32, bounds-checked: t.at({b, i, j}).
  float& at(std::initializer_list<int64_t> index);
  float at(std::initializer_list<int64_t> index) const;
  // The scalar value of a one-element tensor as float (any dtype); throws otherwise.
  float item() const;

  // ---- views: share the storage ----
  // The same elements in a new shape (one entry may be -1); throws when the
  // strides cannot express it (a transposed tensor viewed as 1-D), naming both.
  Tensor view(Shape shape) const;
  // A view when the layout allows, else a contiguous copy (torch.reshape).
  Tensor reshape(Shape shape) const;
  Tensor transpose(int64_t dim0, int64_t dim1) const;
  Tensor permute(const Shape& dims) const;
  // a[..., start:end, ...] on one dim; Python's clamping of the bounds.
  Tensor slice(int64_t dim, int64_t start, int64_t end) const;
  // a.select(dim, i): dim removed; negative i counts from the end.
  Tensor select(int64_t dim, int64_t i) const;
  Tensor unsqueeze(int64_t dim) const;
  Tensor squeeze(int64_t dim) const;  // no-op unless size(dim) == 1

  // ---- copies ----
  Tensor contiguous() const;  // *this when contiguous, else a row-major copy
  Tensor clone() const;       // always new storage, row-major
  Tensor to(DType dtype) const;  // *this when the dtype matches, else converted values
  // Writes `value` into every element (float32, any layout).
  Tensor& fill_(float value);
  // Writes src's values (same shape; converted to this dtype) into this tensor's elements.
  Tensor& copy_(const Tensor& src);

 private:
  Tensor(std::shared_ptr<Storage> storage, DType dtype, Shape shape, Shape strides,
         int64_t offset);
  void check_dtype(DType want, const char* what) const;
  void check_dense_float(const char* what) const;
  int64_t element_offset(int64_t flat) const;  // row-major position -> storage element
  int64_t wrap(const char* op, int64_t dim) const;

  std::shared_ptr<Storage> storage_;
  DType dtype_ = DType::kFloat32;
  Shape shape_{0};
  Shape strides_{1};
  int64_t offset_ = 0;
  int64_t numel_ = 0;
  bool contiguous_ = true;
};

// Element-wise comparison helpers for tests and checks (float32, any layout).
float max_abs_diff(const Tensor& a, const Tensor& b);  // throws on shape mismatch
bool allclose(const Tensor& a, const Tensor& b, float rtol = 1e-5f, float atol = 1e-8f);
bool has_non_finite(const Tensor& t);

}  // namespace attn
