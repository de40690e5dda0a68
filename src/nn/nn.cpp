// The base of attn/nn.h: the Module (modes, named parameters) and the
// building blocks Linear, Dropout and Embedding.
#include <fmt/format.h>

#include <algorithm>
#include <stdexcept>

#include "attn/gemm.h"
#include "attn/utf8.h"
#include "attn/layer_kernels.h"
#include "attn/nn.h"
#include "attn/ops.h"
#include "nn/checks.h"

namespace attn::nn {

// ---- Module -------------------------------------------------------------------------

void Module::train(bool on) {
  training_ = on;
  for (auto& [name, child] : children_) child->train(on);
}

// ---- Parameter and tying ---------------------------------------------------------

bool Parameter::is(const Parameter& other) const {
  return this == &other ||
         (value.shares_storage_with(other.value) &&
          value.storage_offset() == other.value.storage_offset() &&
          value.shape() == other.value.shape() && value.strides() == other.value.strides());
}

void tie(Parameter& param, Parameter& source) {
  if (param.value.shape() != source.value.shape()) {
    throw std::invalid_argument(
        fmt::format("tie: the parameter has shape {} but the source has shape {}",
                    shape_str(param.value.shape()), shape_str(source.value.shape())));
  }
  param.value = source.value;  // handles: one storage for both
  param.grad = source.grad;
}

// ---- Module -------------------------------------------------------------------------

// As PyTorch: this module's own parameters first, then each child's, depth first.
std::vector<std::pair<std::string, Parameter*>> Module::all_named_parameters() {
  std::vector<std::pair<std::string, Parameter*>> all = parameters_;
  for (auto& [prefix, child] : children_) {
    for (auto& [name, p] : child->all_named_parameters()) all.emplace_back(prefix + "." + name, p);
  }
  return all;
}

std::vector<std::pair<std::string, Parameter*>> Module::named_parameters() {
  std::vector<std::pair<std::string, Parameter*>> unique;
  for (auto& [name, p] : all_named_parameters()) {
    const bool seen =
        std::any_of(unique.begin(), unique.end(), [&](const auto& u) { return u.second->is(*p); });
    if (!seen) unique.emplace_back(name, p);
  }
  return unique;
}

std::vector<std::pair<std::string, const Tensor*>> Module::named_buffers() {
  std::vector<std::pair<std::string, const Tensor*>> all;
  for (const auto& [name, b] : buffers_) all.emplace_back(name, &b->get());
  for (auto& [prefix, child] : children_) {
    for (auto& [name, t] : child->named_buffers()) all.emplace_back(prefix + "." + name, t);
  }
  return all;
}

bool Module::buffer_materialized(const std::string& name) {
  for (const auto& [own, b] : buffers_)
    if (own == name) return b->materialized();
  for (auto& [prefix, child] : children_) {
    if (name.rfind(prefix + ".", 0) == 0)
      return child->buffer_materialized(name.substr(prefix.size() + 1));
  }
  throw std::out_of_range(fmt::format("Module: no buffer named '{}'", printable(name)));
}

std::vector<std::pair<std::string, Tensor>> Module::state_dict() {
  std::vector<std::pair<std::string, Tensor>> all;
  for (const auto& [name, p] : parameters_) all.emplace_back(name, p->value);
  for (const auto& [name, b] : buffers_) {
    if (b->persistent()) all.emplace_back(name, b->get());
  }
  for (auto& [prefix, child] : children_) {
    for (auto& [name, t] : child->state_dict()) all.emplace_back(prefix + "." + name, t);
  }
  return all;
}

Parameter& Module::parameter(const std::string& name) {
  const auto all = all_named_parameters();
  for (const auto& [n, p] : all) {
    if (n == name) return *p;
  }
  std::string known;
  for (const auto& [n, p] : all) known += (known.empty() ? "" : ", ") + n;
  throw std::out_of_range(fmt::format("Module: no parameter named '{}'; known: {}", printable(name),
                                      known.empty() ? "(none)" : known));
}

int64_t Module::num_parameters() {
  int64_t n = 0;
  for (const auto& [name, p] : named_parameters()) n += p->value.numel();
  return n;
}

void Module::zero_grad() {
  for (auto& [name, p] : named_parameters()) p->grad.fill_(0.0f);
}

void Module::register_parameter(std::string name, Parameter* p) {
  // Under a NoInitScope the gradient is left unmade (a loaded model that only
  // infers never holds its size again); whoever trains such a module makes it
  // (DecoderLM does so on its first forward in training mode).
  if (NoInitScope::active()) {
    p->grad = Tensor();
  } else if (p->grad.shape() != p->value.shape()) {
    p->grad = Tensor(p->value.shape());
  }
  parameters_.emplace_back(std::move(name), p);
}

void Module::register_buffer(std::string name, const Buffer* b) {
  buffers_.emplace_back(std::move(name), b);
}

void Module::register_module(std::string name, Module* m) {
  m->train(training_);
  children_.emplace_back(std::move(name), m);
}

void Module::require_forward(bool ok, const char* module) {
  if (!ok) throw std::logic_error(fmt::format("{}: backward() called before forward()", module));
}

// ---- Linear -------------------------------------------------------------------------

namespace {
const LinearOptions& checked(const LinearOptions& o) {
  detail::check_positive("Linear", "in_features", o.in_features);
  detail::check_positive("Linear", "out_features", o.out_features);
  if (o.dtype != DType::kFloat32 && o.dtype != DType::kBFloat16) {
    throw std::invalid_argument(
        fmt::format("Linear: dtype must be float32 or bfloat16, got {}", dtype_name(o.dtype)));
  }
  return o;
}

// t rounded to bf16 (contiguous), or t itself when it is bf16 already.
Tensor as_bf16(const Tensor& t) {
  if (t.dtype() == DType::kBFloat16) return t.contiguous();
  const Tensor src = t.contiguous();
  Tensor out = Tensor::empty(t.shape(), DType::kBFloat16);
  kernels::round_to_bf16(out.data_ptr<BFloat16>(), src.data(), src.numel());
  return out;
}
}  // namespace

namespace {
thread_local int no_init_depth = 0;
}  // namespace

NoInitScope::NoInitScope() { ++no_init_depth; }
NoInitScope::~NoInitScope() { --no_init_depth; }
bool NoInitScope::active() { return no_init_depth > 0; }

Linear::Linear(const LinearOptions& options, Generator& gen) : options_(checked(options)) {
  if (NoInitScope::active()) {
    weight.value = Tensor::empty({options_.out_features, options_.in_features});
    if (options_.bias) bias.value = Tensor::empty({options_.out_features});
  } else {
    weight.value = Tensor({options_.out_features, options_.in_features});  // (out, in)
    if (options_.bias) bias.value = Tensor({options_.out_features});       // (out)
    init_linear_(weight.value, options_.bias ? &bias.value : nullptr, gen);
  }
  register_parameter("weight", &weight);
  if (options_.bias) register_parameter("bias", &bias);
}

void Linear::set_compute_dtype(DType dtype) {
  if ((dtype != DType::kFloat32 && dtype != DType::kBFloat16) ||
      weight.value.dtype() != DType::kFloat32) {
    throw std::invalid_argument(fmt::format(
        "Linear: the compute dtype must be float32 or bfloat16 over float32 weights, got {} over "
        "{}",
        dtype_name(dtype), dtype_name(weight.value.dtype())));
  }
  options_.dtype = dtype;
  x_ = weight_bf16_ = Tensor();
  has_forward_ = false;
}

Tensor Linear::forward(const Tensor& x) {
  if (x.dim() < 1 || x.size(-1) != options_.in_features) {
    throw std::invalid_argument(
        fmt::format("Linear: input last dim {} does not match in_features {}",
                    x.dim() < 1 ? 0 : x.size(-1), options_.in_features));
  }
  const bool bf16 = options_.dtype == DType::kBFloat16;
  if (x.dtype() != DType::kFloat32 && !(bf16 && x.dtype() == DType::kBFloat16)) {
    throw std::invalid_argument(fmt::format("Linear: input must be float32{}, got {} of shape {}",
                                            bf16 ? " or bfloat16" : "", dtype_name(x.dtype()),
                                            shape_str(x.shape())));
  }
  x_shape_ = x.shape();
  has_forward_ = true;
  if (bf16) return forward_bf16(x);
  x_ = x;
  return ref::linear_forward(x, weight.value, options_.bias ? &bias.value : nullptr,
                             options_.engine);
}

Tensor Linear::backward(const Tensor& dy) {
  require_forward(has_forward_, "Linear");
  Shape y_shape = x_shape_;
  y_shape.back() = options_.out_features;
  detail::check_grad("Linear", dy, y_shape);
  if (options_.dtype == DType::kBFloat16) return backward_bf16(dy);
  return ref::linear_backward(dy, x_, weight.value, weight.grad,
                              options_.bias ? &bias.grad : nullptr, options_.engine);
}

// bf16 mode, with N = the rows of x (all dims but the last):
//   xb = bf16(x) (N, in), Wb = bf16(W) (out, in)
//   y  = xb Wbᵀ + b                                   (N, out) float32
// The bias is written into y first and the product added onto it (beta = 1).
Tensor Linear::forward_bf16(const Tensor& x) {
  const int64_t in = options_.in_features, out = options_.out_features;
  const int64_t N = x.numel() / in;
  x_ = as_bf16(x).reshape({N, in});
  weight_bf16_ = as_bf16(weight.value);
  Shape y_shape = x_shape_;
  y_shape.back() = out;
  Tensor y = Tensor::empty({N, out});
  float beta = 0.0f;
  if (options_.bias) {
    kernels::fill_rows(y.data(), out, bias.value.data(), N, out);
    beta = 1.0f;
  }
  gemm::gemm_bf16(gemm::Trans::kNo, gemm::Trans::kYes, N, out, in, 1.0f, x_.data_ptr<BFloat16>(),
                  in, weight_bf16_.data_ptr<BFloat16>(), in, beta, y.data(), out);
  return y.reshape(y_shape);
}

//   dyb = bf16(dy)                                    (N, out)
//   dW += dybᵀ xb    db += Σ_rows dy (float32)        (out, in), (out)
//   dx  = dyb Wb                                      (N, in) float32
Tensor Linear::backward_bf16(const Tensor& dy) {
  const int64_t in = options_.in_features, out = options_.out_features;
  const int64_t N = x_.size(0);
  const Tensor dyc = dy.contiguous();
  const Tensor dyb = as_bf16(dyc);
  gemm::gemm_bf16(gemm::Trans::kYes, gemm::Trans::kNo, out, in, N, 1.0f, dyb.data_ptr<BFloat16>(),
                  out, x_.data_ptr<BFloat16>(), in, 1.0f, weight.grad.data(), in);
  if (options_.bias) kernels::column_sums_accumulate(bias.grad.data(), dyc.data(), out, N, out);
  Tensor dx = Tensor::empty({N, in});
  gemm::gemm_bf16(gemm::Trans::kNo, gemm::Trans::kNo, N, in, out, 1.0f, dyb.data_ptr<BFloat16>(),
                  out, weight_bf16_.data_ptr<BFloat16>(), in, 0.0f, dx.data(), in);
  return dx.reshape(x_shape_);
}

// ---- Dropout ------------------------------------------------------------------------

namespace {
const DropoutOptions& checked(const DropoutOptions& o) {
  detail::check_dropout(o.p);
  return o;
}
}  // namespace

Dropout::Dropout(const DropoutOptions& options, Generator& gen)
    : options_(checked(options)), gen_(&gen) {}

Tensor Dropout::sample_noise(const Shape& shape) {
  if (!is_training() || options_.p == 0.0f) return Tensor();
  return dropout_noise(shape, options_.p, *gen_);  // p == 1 gives zeros without draws
}

Tensor Dropout::forward(const Tensor& x) {
  noise_ = x.numel() == 0 ? Tensor() : sample_noise(x.shape());
  has_forward_ = true;
  if (noise_.empty()) return x;  // the identity
  return ref::dropout_forward(x, noise_);
}

Tensor Dropout::backward(const Tensor& dy) {
  require_forward(has_forward_, "Dropout");
  if (noise_.empty()) return dy;
  detail::check_grad("Dropout", dy, noise_.shape());
  return ref::dropout_backward(dy, noise_);
}

// ---- Embedding ----------------------------------------------------------------------

namespace {
const EmbeddingOptions& checked(const EmbeddingOptions& o) {
  detail::check_positive("Embedding", "num_embeddings", o.num_embeddings);
  detail::check_positive("Embedding", "embedding_dim", o.embedding_dim);
  return o;
}
}  // namespace

Embedding::Embedding(const EmbeddingOptions& options, Generator& gen) : options_(checked(options)) {
  if (NoInitScope::active()) {
    weight.value = Tensor::empty({options_.num_embeddings, options_.embedding_dim});
  } else {
    weight.value = Tensor({options_.num_embeddings, options_.embedding_dim});  // (num, dim)
    normal_(weight.value, 0.0f, 1.0f, gen);  // torch.randn(num * dim)
  }
  register_parameter("weight", &weight);
}

Tensor Embedding::forward(const Tensor& indices) {
  if (indices.dtype() != DType::kInt64) {
    throw std::invalid_argument(fmt::format("Embedding: indices must be int64, got {} of shape {}",
                                            dtype_name(indices.dtype()),
                                            shape_str(indices.shape())));
  }
  return forward(indices.to_int64_vector(), indices.shape());
}

Tensor Embedding::forward(const std::vector<int64_t>& indices) {
  return forward(indices, Shape{static_cast<int64_t>(indices.size())});
}

Tensor Embedding::forward(const std::vector<int64_t>& indices, const Shape& shape) {
  if (shape_numel(shape) != static_cast<int64_t>(indices.size())) {
    throw std::invalid_argument(fmt::format("Embedding: {} indices do not fill shape {}",
                                            indices.size(), shape_str(shape)));
  }
  const int64_t dim = options_.embedding_dim;
  for (int64_t idx : indices) {
    if (idx < 0 || idx >= options_.num_embeddings) {
      throw std::invalid_argument(
          fmt::format("Embedding: index {} is out of range for num_embeddings {}", idx,
                      options_.num_embeddings));
    }
  }
  Shape out_shape = shape;
  out_shape.push_back(dim);
  Tensor out(out_shape);  // (..., dim): row n is weight[indices[n]]
  for (size_t n = 0; n < indices.size(); ++n) {
    const float* row = weight.value.data() + indices[n] * dim;
    std::copy(row, row + dim, out.data() + static_cast<int64_t>(n) * dim);
  }
  indices_ = indices;
  has_forward_ = true;
  return out;
}

// Each output row is a copy of one weight row, so its gradient adds to that row.
void Embedding::backward(const Tensor& dy) {
  require_forward(has_forward_, "Embedding");
  const int64_t dim = options_.embedding_dim;
  const int64_t n_rows = static_cast<int64_t>(indices_.size());
  if (dy.dim() < 1 || dy.size(-1) != dim || dy.numel() != n_rows * dim) {
    throw std::invalid_argument(
        fmt::format("Embedding: gradient shape {} does not match {} rows of width {}",
                    shape_str(dy.shape()), n_rows, dim));
  }
  const Tensor dense_dy = dy.contiguous();  // (N, dim) row-major
  for (int64_t n = 0; n < n_rows; ++n) {
    float* grad_row = weight.grad.data() + indices_[static_cast<size_t>(n)] * dim;
    const float* dy_row = dense_dy.data() + n * dim;
    for (int64_t c = 0; c < dim; ++c) grad_row[c] += dy_row[c];
  }
}

}  // namespace attn::nn
