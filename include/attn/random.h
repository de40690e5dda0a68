// attn/random.h - a random number generator that draws PyTorch's numbers.
//
// Generator reproduces torch 1.13's CPU generator bit for bit (see
// docs/rng.md): MT19937 seeded with the low 32 bits of the seed, float
// uniforms from the low 24 bits of one draw, double uniforms from 53 bits of two
// draws, normals by PyTorch's two algorithms (scalar Box-Muller with a cached
// second value for fewer than 16 elements; the 16-wide vectorised form with
// Cephes single-precision log/sin/cos for 16 or more), and dropout masks from
// double uniforms. torch.manual_seed(s); torch.rand(3, 2) and
// attn::manual_seed(s); attn::rand({3, 2}) give identical bits.
//
// The free functions draw from default_generator() unless a generator is given,
// just as PyTorch's do.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <vector>

#include "attn/tensor.h"

namespace attn {

// Everything a Generator's future draws depend on: a Generator given a state
// with set_state draws exactly what the one that get_state() was taken from
// would have drawn next (torch.Generator.get_state / set_state; a different
// layout from PyTorch's byte tensor).
struct GeneratorState {
  uint64_t seed = 0;                // initial_seed()
  std::array<uint32_t, 624> mt{};   // the MT19937 state vector
  int left = 1;                     // draws left before the next twist (1..624)
  int next = 0;                     // index of the next word (0..623)
  std::optional<double> cached_normal;
};

class Generator {
 public:
  static constexpr uint64_t kDefaultSeed = 67280421310721ULL;  // PyTorch's default seed

  explicit Generator(uint64_t seed = kDefaultSeed);
  // Reseed: only seed & 0xffffffff reaches MT19937; clears the cached normal.
  void manual_seed(uint64_t seed);
  uint64_t initial_seed() const { return seed_; }
  GeneratorState get_state() const;
  // Throws std::invalid_argument naming left or next when out of range.
  void set_state(const GeneratorState& state);

  uint32_t random();    // one tempered MT19937 output
  uint64_t random64();  // (first << 32) | second

  float uniform_float(float from = 0.0f, float to = 1.0f);    // one draw
  double uniform_double(double from = 0.0, double to = 1.0);  // two draws
  // PyTorch's scalar normal (at::normal_distribution<double>): Box-Muller with
  // the second value cached until used or until manual_seed.
  double normal_double(double mean = 0.0, double std = 1.0);

 private:
  void init_genrand(uint32_t seed);
  void next_state();

  static constexpr int kN = 624;
  uint64_t seed_ = kDefaultSeed;
  std::array<uint32_t, kN> state_{};
  int left_ = 1;
  int next_ = 0;
  std::optional<double> cached_normal_;
};

// The process-wide generator the free functions use by default.
Generator& default_generator();
// torch.manual_seed(seed) on the default generator.
void manual_seed(uint64_t seed);

// torch.rand(shape): uniform [0, 1) float32.
Tensor rand(const Shape& shape, Generator& gen = default_generator());
// torch.randn(shape): standard normal float32, choosing PyTorch's algorithm by size.
Tensor randn(const Shape& shape, Generator& gen = default_generator());
// tensor.uniform_(from, to) in place: fmaf(u, to - from, from) per element.
void uniform_(Tensor& t, float from, float to, Generator& gen = default_generator());
// tensor.normal_(mean, std) in place (vectorised path for numel >= 16).
void normal_(Tensor& t, float mean, float std, Generator& gen = default_generator());

// torch.empty((), dtype=torch.int64).random_(): one 64-bit draw, modulo 2^63
// (a non-negative int64). torch.utils.data draws one per pass over a
// DataLoader (its iterator's base seed), and RandomSampler one more, the seed
// of the generator its permutation comes from (docs/rng.md, section 7).
int64_t random_int64(Generator& gen = default_generator());

// torch.randperm(n, generator=gen) on the CPU: 0 .. n-1 shuffled by
// Fisher-Yates from the front, swapping element i with element
// i + random() % (n - i) for i = 0 .. n-2 (one 32-bit draw each). Throws
// std::invalid_argument for n < 0 or n >= 2^32.
std::vector<int64_t> randperm(int64_t n, Generator& gen = default_generator());
// torch.bernoulli-style keep mask for dropout: for each element in row-major
// order one double uniform u, value = (u < 1 - p) ? 1 / (float)(1 - p) : 0.
// p must be in [0, 1]. p == 0 gives all ones and p == 1 all zeros, with no draws
// (as nn.Dropout). This is the "noise" tensor that dropout multiplies by.
// 1 - p is computed in double from the shortest decimal that reads back as p
// (0.1f counts as 0.1), which is the double Python hands to torch.
Tensor dropout_noise(const Shape& shape, float p, Generator& gen = default_generator());

// The default initialisation of nn.Linear(in_features, out_features):
// weight (out, in) ~ U(-1/sqrt(in), 1/sqrt(in)) drawn first, then the bias (out).
void init_linear_(Tensor& weight, Tensor* bias, Generator& gen = default_generator());

}  // namespace attn
