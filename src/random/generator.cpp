// PyTorch's CPU generator (torch 1.13), bit for bit: MT19937, its uniform and
// normal transformations, dropout masks and nn.Linear's default init.
// The rules are written down in docs/rng.md; the section numbers below
// refer to it. Built with -ffp-contract=off: a multiply-add that PyTorch's
// build fuses is written as std::fma / std::fmaf, every other one is rounded
// twice, as in PyTorch.
#include <fmt/format.h>

#include <charconv>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <utility>
#include <vector>

#include "attn/random.h"
#include "random/cephes.h"

namespace attn {

namespace {

constexpr int kM = 397;                     // MT19937's middle offset
constexpr uint32_t kMatrixA = 0x9908b0dfu;  // the twist matrix
constexpr uint32_t kUpperMask = 0x80000000u;
constexpr uint32_t kLowerMask = 0x7fffffffu;
constexpr uint32_t kLow24 = (1u << 24) - 1;
constexpr uint64_t kLow53 = (uint64_t{1} << 53) - 1;
constexpr float kTwoPow24Inv = 1.0f / static_cast<float>(1u << 24);
constexpr double kTwoPow53Inv = 1.0 / static_cast<double>(uint64_t{1} << 53);
constexpr double kTwoPi = 2.0 * 3.14159265358979323846;  // c10::pi<double> * 2
constexpr int64_t kNormalBlock = 16;                     // normal_fill_16: 8 (radius, angle) pairs

// The double a user most likely meant by float p: the shortest decimal that
// reads back as p (0.1f -> 0.1), as Python would hand it to torch. This keeps
// 1 - p equal to torch's even in the last bit of the double.
double decimal_value(float p) {
  char buf[64];
  const auto written = std::to_chars(buf, buf + sizeof(buf), p);
  double value = static_cast<double>(p);
  std::from_chars(buf, written.ptr, value);
  return value;
}

}  // namespace

// ---- section 1: the engine ---------------------------------------------------

Generator::Generator(uint64_t seed) { manual_seed(seed); }

void Generator::manual_seed(uint64_t seed) {
  seed_ = seed;
  init_genrand(static_cast<uint32_t>(seed & 0xffffffffu));
  cached_normal_.reset();
}

GeneratorState Generator::get_state() const {
  return GeneratorState{.seed = seed_, .mt = state_, .left = left_, .next = next_,
                        .cached_normal = cached_normal_};
}

void Generator::set_state(const GeneratorState& s) {
  // random() decrements left first and twists when it reaches 0 (next = 0),
  // then reads state_[next]: left in [1, N], next in [0, N] and
  // left + next <= N + 1 keep that read in bounds (next = N only with left = 1).
  if (s.left < 1 || s.left > kN || s.next < 0 || s.next > kN || s.left + s.next > kN + 1)
    throw std::invalid_argument(fmt::format(
        "Generator::set_state: left {} / next {} out of range (left in [1, {}], next in [0, {}], "
        "left + next <= {})",
        s.left, s.next, kN, kN, kN + 1));
  seed_ = s.seed;
  state_ = s.mt;
  left_ = s.left;
  next_ = s.next;
  cached_normal_ = s.cached_normal;
}

void Generator::init_genrand(uint32_t seed) {
  state_[0] = seed;
  for (int j = 1; j < kN; ++j) {
    const uint32_t prev = state_[j - 1];
    state_[j] = 1812433253u * (prev ^ (prev >> 30)) + static_cast<uint32_t>(j);
  }
  left_ = 1;  // the first draw twists the whole state
  next_ = 0;
}

void Generator::next_state() {
  auto twist = [](uint32_t u, uint32_t v) {
    const uint32_t mixed = (u & kUpperMask) | (v & kLowerMask);
    return (mixed >> 1) ^ ((v & 1u) ? kMatrixA : 0u);
  };
  for (int k = 0; k < kN; ++k) {
    state_[k] = state_[(k + kM) % kN] ^ twist(state_[k], state_[(k + 1) % kN]);
  }
  left_ = kN;
  next_ = 0;
}

uint32_t Generator::random() {
  if (--left_ == 0) next_state();
  uint32_t y = state_[next_++];
  y ^= (y >> 11);
  y ^= (y << 7) & 0x9d2c5680u;
  y ^= (y << 15) & 0xefc60000u;
  y ^= (y >> 18);
  return y;
}

uint64_t Generator::random64() {
  const uint64_t hi = random();
  const uint64_t lo = random();
  return (hi << 32) | lo;
}

// ---- section 2: uniform ----------------------------------------------------------

float Generator::uniform_float(float from, float to) {
  const float u = static_cast<float>(random() & kLow24) * kTwoPow24Inv;  // [0, 1), exact
  return std::fmaf(u, to - from, from);
}

// PyTorch's build fuses u * (to - from) + from here too (torch.empty(n,
// dtype=float64).uniform_(a, b) differs in about 45% of values otherwise).
double Generator::uniform_double(double from, double to) {
  const double u = static_cast<double>(random64() & kLow53) * kTwoPow53Inv;  // [0, 1), exact
  return std::fma(u, to - from, from);
}

// ---- section 4: the scalar normal -----------------------------------------------

// The final `* std + mean` is a fused multiply-add, as in PyTorch's AVX2
// build (after the cast to float the unfused form gave the same bits on the
// 45,000 values of normal_(0.3, 2.7) tried, so this one is not pinned down).
double Generator::normal_double(double mean, double std) {
  if (cached_normal_) {
    const double cached = *cached_normal_;
    cached_normal_.reset();
    return std::fma(cached, std, mean);
  }
  const double u1 = uniform_double();  // angle
  const double u2 = uniform_double();  // radius
  const double r = std::sqrt(-2.0 * std::log(1.0 - u2));
  const double theta = kTwoPi * u1;
  cached_normal_ = r * std::sin(theta);
  return std::fma(r * std::cos(theta), std, mean);
}

Generator& default_generator() {
  static Generator generator;
  return generator;
}

void manual_seed(uint64_t seed) { default_generator().manual_seed(seed); }

// ---- tensors ---------------------------------------------------------------------

int64_t random_int64(Generator& gen) {
  // at::uniform_int_full_range's int64 case: random64() % (INT64_MAX + 1).
  return static_cast<int64_t>(gen.random64() % (uint64_t{1} << 63));
}

std::vector<int64_t> randperm(int64_t n, Generator& gen) {
  if (n < 0 || n >= (int64_t{1} << 32))
    throw std::invalid_argument(fmt::format("randperm: n must be in [0, 2^32), got {}", n));
  std::vector<int64_t> r(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) r[static_cast<size_t>(i)] = i;
  for (int64_t i = 0; i + 1 < n; ++i) {
    const auto z = static_cast<int64_t>(gen.random() % static_cast<uint64_t>(n - i));
    std::swap(r[static_cast<size_t>(i)], r[static_cast<size_t>(i + z)]);
  }
  return r;
}

Tensor rand(const Shape& shape, Generator& gen) {
  Tensor t(shape);
  uniform_(t, 0.0f, 1.0f, gen);
  return t;
}

Tensor randn(const Shape& shape, Generator& gen) {
  Tensor t(shape);
  normal_(t, 0.0f, 1.0f, gen);
  return t;
}

void uniform_(Tensor& t, float from, float to, Generator& gen) {
  if (!(from <= to)) {
    throw std::invalid_argument(fmt::format(
        "uniform_: expects a [from, to) range with from <= to, got from={} and to={}", from, to));
  }
  if (!std::isfinite(to - from)) {
    throw std::invalid_argument(
        fmt::format("uniform_: to - from must be finite, got from={} and to={}", from, to));
  }
  for (float& v : t.values()) v = gen.uniform_float(from, to);
}

void normal_(Tensor& t, float mean, float std, Generator& gen) {
  if (!(std >= 0.0f)) {
    throw std::invalid_argument(fmt::format("normal_: expects std >= 0, got std={}", std));
  }
  const int64_t n = t.numel();
  float* x = t.data();  // (n)
  if (n < kNormalBlock) {
    // PyTorch's element-wise path: Box-Muller in double with a cached second value.
    for (int64_t i = 0; i < n; ++i) {
      x[i] = static_cast<float>(
          gen.normal_double(static_cast<double>(mean), static_cast<double>(std)));
    }
    return;
  }
  // normal_fill_AVX2: all uniforms first, then 16 at a time in place; a ragged
  // tail redraws the last 16 and transforms them again.
  for (int64_t i = 0; i < n; ++i) x[i] = gen.uniform_float();
  for (int64_t i = 0; i + kNormalBlock <= n; i += kNormalBlock)
    detail::normal_fill16(x + i, mean, std);
  if (n % kNormalBlock != 0) {
    float* tail = x + n - kNormalBlock;  // (16)
    for (int64_t i = 0; i < kNormalBlock; ++i) tail[i] = gen.uniform_float();
    detail::normal_fill16(tail, mean, std);
  }
}

// ---- section 5: dropout ------------------------------------------------------------

Tensor dropout_noise(const Shape& shape, float p, Generator& gen) {
  if (!(p >= 0.0f && p <= 1.0f)) {
    throw std::invalid_argument(
        fmt::format("dropout: probability p must be in [0, 1], got p={}", p));
  }
  if (p == 0.0f) return Tensor(shape, 1.0f);
  if (p == 1.0f) return Tensor(shape, 0.0f);
  // noise.bernoulli_(1 - p) draws one double uniform per element and keeps it
  // when u < 1 - p; noise.div_(1 - p) then divides in float.
  const double q = 1.0 - decimal_value(p);
  const float kept = 1.0f / static_cast<float>(q);
  Tensor noise(shape);
  for (float& v : noise.values()) v = gen.uniform_double() < q ? kept : 0.0f;
  return noise;
}

// ---- section 3: nn.Linear ------------------------------------------------------------

void init_linear_(Tensor& weight, Tensor* bias, Generator& gen) {
  if (weight.dim() != 2) {
    throw std::invalid_argument(
        fmt::format("init_linear_: weight must be 2-D (out_features, in_features), got shape {}",
                    shape_str(weight.shape())));
  }
  const int64_t d_out = weight.size(0);
  const int64_t d_in = weight.size(1);
  if (bias != nullptr && (bias->dim() != 1 || bias->size(0) != d_out)) {
    throw std::invalid_argument(
        fmt::format("init_linear_: bias shape {} does not match weight shape {} (expected ({},))",
                    shape_str(bias->shape()), shape_str(weight.shape()), d_out));
  }
  // kaiming_uniform_(weight, a=sqrt(5)) in Python's double arithmetic:
  // gain = sqrt(2 / (1 + a^2)), bound = sqrt(3) * gain / sqrt(fan_in),
  // which is 1 / sqrt(fan_in) up to rounding. A zero-element weight is left
  // alone and draws nothing, as in torch.
  if (weight.numel() > 0) {
    const double a = std::sqrt(5.0);
    const double gain = std::sqrt(2.0 / (1.0 + std::pow(a, 2.0)));
    const double bound = std::sqrt(3.0) * (gain / std::sqrt(static_cast<double>(d_in)));
    uniform_(weight, static_cast<float>(-bound), static_cast<float>(bound), gen);
  }
  if (bias != nullptr) {
    const double bound = d_in > 0 ? 1.0 / std::sqrt(static_cast<double>(d_in)) : 0.0;
    uniform_(*bias, static_cast<float>(-bound), static_cast<float>(bound), gen);
  }
}

}  // namespace attn
