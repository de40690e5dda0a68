// The Tensor handle: storage, dtype conversions, views with strides, checked
// element access, comparisons (attn/tensor.h).
#include "attn/tensor.h"
#include "attn/utf8.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <new>
#include <stdexcept>

#include "tensor/storage_cache.h"

namespace attn {

std::string shape_str(const Shape& shape) {
  if (shape.size() == 1) return fmt::format("({},)", shape[0]);
  return fmt::format("({})", fmt::join(shape, ", "));
}

int64_t shape_numel(const Shape& shape) {
  int64_t n = 1;
  for (int64_t s : shape) {
    if (s < 0) throw std::invalid_argument(fmt::format("negative size in shape {}", shape_str(shape)));
    n *= s;
  }
  return n;
}

Shape contiguous_strides(const Shape& shape) {
  Shape strides(shape.size(), 1);
  for (size_t d = shape.size(); d-- > 1;) strides[d - 1] = strides[d] * std::max<int64_t>(shape[d], 1);
  return strides;
}

const char* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return "float32";
    case DType::kBFloat16:
      return "bfloat16";
    case DType::kInt64:
      return "int64";
  }
  return "unknown";
}

DType dtype_from_name(std::string_view name) {
  for (const DType d : {DType::kFloat32, DType::kBFloat16, DType::kInt64})
    if (name == dtype_name(d)) return d;
  throw std::invalid_argument(fmt::format("unknown dtype '{}' (float32, bfloat16 or int64)", printable(name)));
}

int64_t element_size(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return 4;
    case DType::kBFloat16:
      return 2;
    case DType::kInt64:
      return 8;
  }
  return 1;
}

// ---- storage ----------------------------------------------------------------------------

namespace {
detail::Block checked_block(int64_t nbytes, bool zero) {
  if (nbytes < 0) throw std::invalid_argument(fmt::format("Storage: negative size {} bytes", nbytes));
  const detail::Block block = detail::allocate_block(static_cast<size_t>(nbytes));
  if (zero) std::memset(block.data, 0, static_cast<size_t>(nbytes));
  return block;
}
}  // namespace

Storage::Storage(int64_t nbytes, bool zero) : Storage(checked_block(nbytes, zero), nbytes) {}

Storage::Storage(detail::Block block, int64_t nbytes)
    : data_(block.data, Free{block.bytes}), nbytes_(nbytes) {}

Storage::Storage(std::shared_ptr<void> owner, std::byte* data, int64_t nbytes)
    : data_(data, Free{0, std::move(owner)}), nbytes_(nbytes) {}

void Storage::Free::operator()(std::byte* p) const {
  if (owner == nullptr) detail::free_block({p, block_bytes});
}

// ---- construction -----------------------------------------------------------------------

namespace {
bool strides_are_contiguous(const Shape& shape, const Shape& strides) {
  if (shape_numel(shape) == 0) return true;
  int64_t expected = 1;
  for (size_t d = shape.size(); d-- > 0;) {
    if (shape[d] == 1) continue;  // any stride works for a dim of size 1
    if (strides[d] != expected) return false;
    expected *= shape[d];
  }
  return true;
}

std::shared_ptr<Storage> new_storage(int64_t numel, DType dtype, bool zero) {
  return std::make_shared<Storage>(numel * element_size(dtype), zero);
}
}  // namespace

Tensor::Tensor(std::shared_ptr<Storage> storage, DType dtype, Shape shape, Shape strides,
               int64_t offset)
    : storage_(std::move(storage)),
      dtype_(dtype),
      shape_(std::move(shape)),
      strides_(std::move(strides)),
      offset_(offset),
      numel_(shape_numel(shape_)),
      contiguous_(strides_are_contiguous(shape_, strides_)) {}

Tensor::Tensor(Shape shape, float fill) {
  numel_ = shape_numel(shape);
  strides_ = contiguous_strides(shape);
  shape_ = std::move(shape);
  storage_ = new_storage(numel_, DType::kFloat32, fill == 0.0f);
  if (fill != 0.0f) std::fill_n(data(), numel_, fill);
}

Tensor::Tensor(Shape shape, const std::vector<float>& values) : Tensor(std::move(shape)) {
  if (numel_ != static_cast<int64_t>(values.size())) {
    throw std::invalid_argument(fmt::format("Tensor: shape {} holds {} values, got {}",
                                            shape_str(shape_), numel_, values.size()));
  }
  std::copy(values.begin(), values.end(), data());
}

Tensor Tensor::zeros(Shape shape, DType dtype) {
  const int64_t n = shape_numel(shape);
  Shape strides = contiguous_strides(shape);
  return Tensor(new_storage(n, dtype, true), dtype, std::move(shape), std::move(strides), 0);
}

Tensor Tensor::wrap(std::shared_ptr<void> owner, void* data, Shape shape, DType dtype) {
  const int64_t n = shape_numel(shape);
  const int64_t size = element_size(dtype);
  if (n < 0 || (n > 0 && (data == nullptr ||
                          reinterpret_cast<uintptr_t>(data) % static_cast<uintptr_t>(size) != 0))) {
    throw std::invalid_argument(
        fmt::format("Tensor::wrap: {} elements of {} need memory aligned to {} bytes", n,
                    dtype_name(dtype), size));
  }
  Shape strides = contiguous_strides(shape);
  auto storage =
      std::make_shared<Storage>(std::move(owner), static_cast<std::byte*>(data), n * size);
  return Tensor(std::move(storage), dtype, std::move(shape), std::move(strides), 0);
}

Tensor Tensor::empty(Shape shape, DType dtype) {
  const int64_t n = shape_numel(shape);
  Shape strides = contiguous_strides(shape);
  return Tensor(new_storage(n, dtype, false), dtype, std::move(shape), std::move(strides), 0);
}

Tensor Tensor::of(Shape shape, std::initializer_list<float> values) {
  return Tensor(std::move(shape), std::vector<float>(values));
}

Tensor Tensor::from_int64(Shape shape, const std::vector<int64_t>& values) {
  Tensor t = empty(std::move(shape), DType::kInt64);
  if (t.numel() != static_cast<int64_t>(values.size())) {
    throw std::invalid_argument(fmt::format("Tensor: shape {} holds {} values, got {}",
                                            shape_str(t.shape()), t.numel(), values.size()));
  }
  std::copy(values.begin(), values.end(), t.data_ptr<int64_t>());
  return t;
}

Tensor Tensor::arange(int64_t n) {
  Tensor t({n});
  for (int64_t i = 0; i < n; ++i) t.data()[i] = static_cast<float>(i);
  return t;
}

// ---- metadata and raw access ---------------------------------------------------------------

int64_t Tensor::wrap(const char* op, int64_t d) const {
  const int64_t nd = dim();
  const int64_t k = d < 0 ? d + nd : d;
  if (k < 0 || k >= nd) {
    throw std::out_of_range(fmt::format("{}: dim {} out of range for shape {} (expected {} to {})",
                                        op, d, shape_str(shape_), -nd, nd - 1));
  }
  return k;
}

int64_t Tensor::size(int64_t d) const {
  const int64_t nd = dim();
  const int64_t k = d < 0 ? d + nd : d;
  if (k < 0 || k >= nd) {
    throw std::out_of_range(fmt::format("Tensor::size: dim {} out of range for shape {}", d, shape_str(shape_)));
  }
  return shape_[static_cast<size_t>(k)];
}

int64_t Tensor::stride(int64_t d) const { return strides_[static_cast<size_t>(wrap("Tensor::stride", d))]; }

void Tensor::check_dtype(DType want, const char* what) const {
  if (dtype_ != want) {
    throw std::logic_error(fmt::format("Tensor::{}: the tensor is {}, not {}; convert it with to()", what,
                                       dtype_name(dtype_), dtype_name(want)));
  }
}

void Tensor::check_dense_float(const char* what) const {
  check_dtype(DType::kFloat32, what);
  if (!contiguous_) {
    throw std::logic_error(fmt::format(
        "Tensor::{}: the tensor of shape {} with strides {} is not contiguous; call contiguous() first",
        what, shape_str(shape_), shape_str(strides_)));
  }
}

float* Tensor::data() {
  check_dense_float("data");
  return storage_ ? reinterpret_cast<float*>(storage_->data()) + offset_ : nullptr;
}
const float* Tensor::data() const {
  check_dense_float("data");
  return storage_ ? reinterpret_cast<const float*>(storage_->data()) + offset_ : nullptr;
}
std::span<float> Tensor::values() { return {data(), static_cast<size_t>(numel_)}; }
std::span<const float> Tensor::values() const { return {data(), static_cast<size_t>(numel_)}; }

// The storage element of the value at row-major position `flat`.
int64_t Tensor::element_offset(int64_t flat) const {
  if (contiguous_) return offset_ + flat;
  int64_t off = offset_;
  for (size_t d = shape_.size(); d-- > 0;) {
    const int64_t n = shape_[d];
    off += (flat % n) * strides_[d];
    flat /= n;
  }
  return off;
}

namespace {
// Calls f(storage element offset) for each element of (shape, strides, offset)
// in row-major order.
template <class F>
void for_each_offset(const Shape& shape, const Shape& strides, int64_t offset, F f) {
  const int64_t total = shape_numel(shape);
  if (total == 0) return;
  const size_t nd = shape.size();
  if (nd == 0) {
    f(offset);
    return;
  }
  std::vector<int64_t> idx(nd, 0);
  const int64_t n_last = shape[nd - 1], s_last = strides[nd - 1];
  int64_t row = offset;
  for (int64_t i = 0; i < total; i += n_last) {
    for (int64_t j = 0; j < n_last; ++j) f(row + j * s_last);
    for (size_t d = nd - 1; d-- > 0;) {
      ++idx[d];
      row += strides[d];
      if (idx[d] < shape[d]) break;
      row -= strides[d] * shape[d];
      idx[d] = 0;
    }
  }
}

float load_as_float(const std::byte* base, DType dtype, int64_t i) {
  switch (dtype) {
    case DType::kFloat32:
      return reinterpret_cast<const float*>(base)[i];
    case DType::kBFloat16:
      return to_float(reinterpret_cast<const BFloat16*>(base)[i]);
    case DType::kInt64:
      return static_cast<float>(reinterpret_cast<const int64_t*>(base)[i]);
  }
  return 0.0f;
}
}  // namespace

std::vector<float> Tensor::to_vector() const {
  std::vector<float> out;
  out.reserve(static_cast<size_t>(numel_));
  if (numel_ == 0) return out;
  const std::byte* base = storage_->data();
  for_each_offset(shape_, strides_, offset_, [&](int64_t off) { out.push_back(load_as_float(base, dtype_, off)); });
  return out;
}

std::vector<int64_t> Tensor::to_int64_vector() const {
  check_dtype(DType::kInt64, "to_int64_vector");
  std::vector<int64_t> out;
  out.reserve(static_cast<size_t>(numel_));
  if (numel_ == 0) return out;
  const auto* base = reinterpret_cast<const int64_t*>(storage_->data());
  for_each_offset(shape_, strides_, offset_, [&](int64_t off) { out.push_back(base[off]); });
  return out;
}

float& Tensor::operator[](int64_t i) {
  check_dtype(DType::kFloat32, "operator[]");
  if (i < 0 || i >= numel_) {
    throw std::out_of_range(fmt::format("Tensor: flat index {} out of range for {} elements", i, numel_));
  }
  return reinterpret_cast<float*>(storage_->data())[element_offset(i)];
}

float Tensor::operator[](int64_t i) const { return const_cast<Tensor&>(*this)[i]; }

float& Tensor::at(std::initializer_list<int64_t> index) {
  check_dtype(DType::kFloat32, "at");
  if (static_cast<int64_t>(index.size()) != dim()) {
    throw std::out_of_range(fmt::format("Tensor::at: {} indices for shape {}", index.size(), shape_str(shape_)));
  }
  int64_t off = offset_;
  size_t d = 0;
  for (int64_t i : index) {
    if (i < 0 || i >= shape_[d]) {
      throw std::out_of_range(
          fmt::format("Tensor::at: index {} out of range for dim {} of shape {}", i, d, shape_str(shape_)));
    }
    off += i * strides_[d];
    ++d;
  }
  return reinterpret_cast<float*>(storage_->data())[off];
}

float Tensor::at(std::initializer_list<int64_t> index) const { return const_cast<Tensor&>(*this).at(index); }

float Tensor::item() const {
  if (numel_ != 1) {
    throw std::invalid_argument(
        fmt::format("item: tensor of shape {} has {} elements, not 1", shape_str(shape_), numel_));
  }
  return load_as_float(storage_->data(), dtype_, offset_);
}

// ---- views ------------------------------------------------------------------------------

namespace {
// The shape with its one -1 entry inferred from numel (torch's infer_size).
Shape infer_shape(const char* op, Shape shape, int64_t numel) {
  int64_t known = 1;
  int inferred = -1;
  for (size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] == -1) {
      if (inferred >= 0) throw std::invalid_argument(fmt::format("{}: only one dimension can be -1", op));
      inferred = static_cast<int>(d);
    } else if (shape[d] < 0) {
      throw std::invalid_argument(fmt::format("{}: invalid size {} in {}", op, shape[d], shape_str(shape)));
    } else {
      known *= shape[d];
    }
  }
  const auto invalid = [&] {
    return std::invalid_argument(
        fmt::format("{}: shape {} is invalid for input of size {}", op, shape_str(shape), numel));
  };
  if (inferred >= 0) {
    if (known == 0 || numel % known != 0) throw invalid();
    shape[static_cast<size_t>(inferred)] = numel / known;
  }
  if (shape_numel(shape) != numel) throw invalid();
  return shape;
}

// The strides that view (old_shape, old_strides) as new_shape without moving
// any element, or false when there are none (ATen's computeStride): each run
// of old dims that are laid out as one block may be split or merged freely.
bool view_strides(const Shape& old_shape, const Shape& old_strides, const Shape& new_shape, Shape& out) {
  out.assign(new_shape.size(), 1);
  const int64_t numel = shape_numel(old_shape);
  if (numel == 0) {
    out = contiguous_strides(new_shape);
    return true;
  }
  int64_t view_d = static_cast<int64_t>(new_shape.size()) - 1;
  int64_t chunk_base_stride = old_strides.empty() ? 1 : old_strides.back();
  int64_t tensor_numel = 1, view_numel = 1;
  for (int64_t tensor_d = static_cast<int64_t>(old_shape.size()) - 1; tensor_d >= 0; --tensor_d) {
    const auto td = static_cast<size_t>(tensor_d);
    tensor_numel *= old_shape[td];
    // The end of a chunk: the first dim, or one whose neighbour is not laid out right before it.
    if (tensor_d == 0 ||
        (old_shape[td - 1] != 1 && old_strides[td - 1] != tensor_numel * chunk_base_stride)) {
      while (view_d >= 0 && (view_numel < tensor_numel || new_shape[static_cast<size_t>(view_d)] == 1)) {
        out[static_cast<size_t>(view_d)] = view_numel * chunk_base_stride;
        view_numel *= new_shape[static_cast<size_t>(view_d)];
        --view_d;
      }
      if (view_numel != tensor_numel) return false;
      if (tensor_d > 0) {
        chunk_base_stride = old_strides[td - 1];
        tensor_numel = 1;
        view_numel = 1;
      }
    }
  }
  return view_d == -1;
}
}  // namespace

Tensor Tensor::view(Shape shape) const {
  shape = infer_shape("view", std::move(shape), numel_);
  Shape strides;
  if (contiguous_) {
    strides = contiguous_strides(shape);
  } else if (!view_strides(shape_, strides_, shape, strides)) {
    throw std::invalid_argument(fmt::format(
        "view: a tensor of shape {} with strides {} cannot be viewed as {}; use reshape (it copies)",
        shape_str(shape_), shape_str(strides_), shape_str(shape)));
  }
  return Tensor(storage_, dtype_, std::move(shape), std::move(strides), offset_);
}

Tensor Tensor::reshape(Shape shape) const {
  shape = infer_shape("reshape", std::move(shape), numel_);
  Shape strides;
  if (contiguous_) return Tensor(storage_, dtype_, shape, contiguous_strides(shape), offset_);
  if (view_strides(shape_, strides_, shape, strides)) {
    return Tensor(storage_, dtype_, std::move(shape), std::move(strides), offset_);
  }
  return clone().view(std::move(shape));
}

Tensor Tensor::transpose(int64_t dim0, int64_t dim1) const {
  if (dim() == 0) return *this;
  const auto d0 = static_cast<size_t>(wrap("transpose", dim0));
  const auto d1 = static_cast<size_t>(wrap("transpose", dim1));
  Shape shape = shape_, strides = strides_;
  std::swap(shape[d0], shape[d1]);
  std::swap(strides[d0], strides[d1]);
  return Tensor(storage_, dtype_, std::move(shape), std::move(strides), offset_);
}

Tensor Tensor::permute(const Shape& dims) const {
  if (static_cast<int64_t>(dims.size()) != dim()) {
    throw std::invalid_argument(fmt::format("permute: {} dims {} for a tensor of shape {}", dims.size(),
                                            shape_str(dims), shape_str(shape_)));
  }
  Shape shape(dims.size()), strides(dims.size());
  std::vector<bool> seen(dims.size(), false);
  for (size_t i = 0; i < dims.size(); ++i) {
    const auto d = static_cast<size_t>(wrap("permute", dims[i]));
    if (seen[d]) {
      throw std::invalid_argument(
          fmt::format("permute: dim {} repeats in {} (shape {})", d, shape_str(dims), shape_str(shape_)));
    }
    seen[d] = true;
    shape[i] = shape_[d];
    strides[i] = strides_[d];
  }
  return Tensor(storage_, dtype_, std::move(shape), std::move(strides), offset_);
}

Tensor Tensor::slice(int64_t dim_, int64_t start, int64_t end) const {
  if (dim() == 0) {
    throw std::invalid_argument(fmt::format("slice: cannot slice a 0-d tensor (shape {})", shape_str(shape_)));
  }
  const auto d = static_cast<size_t>(wrap("slice", dim_));
  const int64_t n = shape_[d];
  const auto clamp = [n](int64_t x) {
    if (x < 0) x += n;
    return std::clamp<int64_t>(x, 0, n);
  };
  const int64_t lo = clamp(start);
  const int64_t hi = std::max(lo, clamp(end));
  Shape shape = shape_;
  shape[d] = hi - lo;
  return Tensor(storage_, dtype_, std::move(shape), strides_, offset_ + lo * strides_[d]);
}

Tensor Tensor::select(int64_t dim_, int64_t i) const {
  if (dim() == 0) {
    throw std::invalid_argument(fmt::format("select: cannot index a 0-d tensor (shape {})", shape_str(shape_)));
  }
  const auto d = static_cast<size_t>(wrap("select", dim_));
  const int64_t n = shape_[d];
  if (i < -n || i >= n) {
    throw std::out_of_range(fmt::format("select: index {} out of range for dim {} of size {} (shape {})", i,
                                        dim_, n, shape_str(shape_)));
  }
  const int64_t idx = i < 0 ? i + n : i;
  Shape shape = shape_, strides = strides_;
  shape.erase(shape.begin() + static_cast<std::ptrdiff_t>(d));
  strides.erase(strides.begin() + static_cast<std::ptrdiff_t>(d));
  return Tensor(storage_, dtype_, std::move(shape), std::move(strides), offset_ + idx * strides_[d]);
}

Tensor Tensor::unsqueeze(int64_t dim_) const {
  const int64_t ndim = dim() + 1;
  if (dim_ < -ndim || dim_ >= ndim) {
    throw std::out_of_range(fmt::format("unsqueeze: dim {} out of range for shape {} (expected {} to {})", dim_,
                                        shape_str(shape_), -ndim, ndim - 1));
  }
  const auto d = static_cast<size_t>(dim_ < 0 ? dim_ + ndim : dim_);
  Shape shape = shape_, strides = strides_;
  // The new dim's stride: what a contiguous layout would give it.
  const int64_t stride = d < shape_.size() ? strides_[d] * shape_[d] : 1;
  shape.insert(shape.begin() + static_cast<std::ptrdiff_t>(d), 1);
  strides.insert(strides.begin() + static_cast<std::ptrdiff_t>(d), stride);
  return Tensor(storage_, dtype_, std::move(shape), std::move(strides), offset_);
}

Tensor Tensor::squeeze(int64_t dim_) const {
  if (dim() == 0) {
    if (dim_ != 0 && dim_ != -1) {
      throw std::out_of_range(fmt::format("squeeze: dim {} out of range for shape () (expected -1 to 0)", dim_));
    }
    return *this;
  }
  const auto d = static_cast<size_t>(wrap("squeeze", dim_));
  if (shape_[d] != 1) return *this;
  Shape shape = shape_, strides = strides_;
  shape.erase(shape.begin() + static_cast<std::ptrdiff_t>(d));
  strides.erase(strides.begin() + static_cast<std::ptrdiff_t>(d));
  return Tensor(storage_, dtype_, std::move(shape), std::move(strides), offset_);
}

// ---- copies -----------------------------------------------------------------------------

Tensor Tensor::contiguous() const { return contiguous_ ? *this : clone(); }

Tensor Tensor::clone() const {
  Tensor out = empty(shape_, dtype_);
  out.copy_(*this);
  return out;
}

Tensor Tensor::to(DType dtype) const {
  if (dtype == dtype_) return *this;
  Tensor out = empty(shape_, dtype);
  out.copy_(*this);
  return out;
}

Tensor& Tensor::fill_(float value) {
  check_dtype(DType::kFloat32, "fill_");
  if (numel_ == 0) return *this;
  auto* base = reinterpret_cast<float*>(storage_->data());
  if (contiguous_) {
    std::fill_n(base + offset_, numel_, value);
  } else {
    for_each_offset(shape_, strides_, offset_, [&](int64_t off) { base[off] = value; });
  }
  return *this;
}

namespace {
// One element converted from dtype `from` at src[i] to dtype `to` at dst[j]:
// float -> bfloat16 rounds to nearest even, float -> int64 truncates toward
// zero (as PyTorch's casts do), the rest are exact.
void convert_element(std::byte* dst, DType to, int64_t j, const std::byte* src, DType from, int64_t i) {
  if (to == from) {
    const int64_t size = element_size(to);
    std::memcpy(dst + j * size, src + i * size, static_cast<size_t>(size));
    return;
  }
  if (from == DType::kInt64 && to == DType::kBFloat16) {
    // Through float, as PyTorch's int -> bfloat16 cast does.
    reinterpret_cast<BFloat16*>(dst)[j] =
        to_bfloat16(static_cast<float>(reinterpret_cast<const int64_t*>(src)[i]));
    return;
  }
  const float f = load_as_float(src, from, i);
  switch (to) {
    case DType::kFloat32:
      reinterpret_cast<float*>(dst)[j] = f;
      break;
    case DType::kBFloat16:
      reinterpret_cast<BFloat16*>(dst)[j] = to_bfloat16(f);
      break;
    case DType::kInt64:
      reinterpret_cast<int64_t*>(dst)[j] = static_cast<int64_t>(f);
      break;
  }
}
}  // namespace

Tensor& Tensor::copy_(const Tensor& src) {
  if (src.shape_ != shape_) {
    throw std::invalid_argument(fmt::format("copy_: source of shape {} does not match destination of shape {}",
                                            shape_str(src.shape_), shape_str(shape_)));
  }
  if (numel_ == 0) return *this;
  std::byte* dst_base = storage_->data();
  const std::byte* src_base = src.storage_->data();
  if (contiguous_ && src.contiguous_ && dtype_ == src.dtype_) {
    const int64_t size = element_size(dtype_);
    std::memmove(dst_base + offset_ * size, src_base + src.offset_ * size, static_cast<size_t>(numel_ * size));
    return *this;
  }
  if (shares_storage_with(src)) {
    // Views that may overlap: read everything before writing anything.
    const Tensor staged = src.clone();
    return copy_(staged);
  }
  if (shape_.empty()) {  // one element
    convert_element(dst_base, dtype_, offset_, src_base, src.dtype_, src.offset_);
    return *this;
  }
  // Walk both in row-major order, one row (the last dim) at a time.
  const size_t last = shape_.size() - 1;
  const int64_t row_len = shape_[last], dst_step = strides_[last], src_step = src.strides_[last];
  std::vector<int64_t> idx(last, 0);  // the index over the leading dims
  int64_t dst_row = offset_, src_row = src.offset_;
  for (int64_t r = 0, rows = numel_ / row_len; r < rows; ++r) {
    if (dtype_ == DType::kFloat32 && src.dtype_ == DType::kFloat32) {  // the common case: a strided float copy
      float* d = reinterpret_cast<float*>(dst_base) + dst_row;
      const float* from = reinterpret_cast<const float*>(src_base) + src_row;
      for (int64_t j = 0; j < row_len; ++j) d[j * dst_step] = from[j * src_step];
    } else {
      for (int64_t j = 0; j < row_len; ++j)
        convert_element(dst_base, dtype_, dst_row + j * dst_step, src_base, src.dtype_, src_row + j * src_step);
    }
    for (size_t d = last; d-- > 0;) {
      ++idx[d];
      dst_row += strides_[d];
      src_row += src.strides_[d];
      if (idx[d] < shape_[d]) break;
      dst_row -= strides_[d] * shape_[d];
      src_row -= src.strides_[d] * shape_[d];
      idx[d] = 0;
    }
  }
  return *this;
}

// ---- comparisons --------------------------------------------------------------------------

float max_abs_diff(const Tensor& a, const Tensor& b) {
  if (a.shape() != b.shape()) {
    throw std::invalid_argument(
        fmt::format("max_abs_diff: shapes differ: {} vs {}", shape_str(a.shape()), shape_str(b.shape())));
  }
  const std::vector<float> va = a.to_vector(), vb = b.to_vector();
  float m = 0.0f;
  for (size_t i = 0; i < va.size(); ++i) {
    const float x = va[i], y = vb[i];
    if (std::isnan(x) != std::isnan(y)) return INFINITY;
    if (std::isnan(x)) continue;
    if (x == y) continue;  // equal infinities
    m = std::max(m, std::fabs(x - y));
  }
  return m;
}

bool allclose(const Tensor& a, const Tensor& b, float rtol, float atol) {
  if (a.shape() != b.shape()) return false;
  const std::vector<float> va = a.to_vector(), vb = b.to_vector();
  for (size_t i = 0; i < va.size(); ++i) {
    const float x = va[i], y = vb[i];
    if (x == y) continue;
    if (!(std::fabs(x - y) <= atol + rtol * std::fabs(y))) return false;
  }
  return true;
}

bool has_non_finite(const Tensor& t) {
  if (t.dtype() == DType::kFloat32 && t.is_contiguous()) {  // no copy: benchmarks check every step
    for (float x : t.values()) {
      if (!std::isfinite(x)) return true;
    }
    return false;
  }
  for (float x : t.to_vector()) {
    if (!std::isfinite(x)) return true;
  }
  return false;
}

}  // namespace attn
