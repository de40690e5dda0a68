// tests/layer_kernel_checks.h - what the layer-kernel tests share
// (tests/unit/test_layer_kernels.cpp, test_fused_layer_kernels.cpp): the
// relative bound they hold results to, the loop over every SIMD target this
// CPU runs, and the check that 1 and 2 OpenMP threads give the same bits.
#pragma once

#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <iostream>
#include <string>
#include <vector>

#include "attn/kernels.h"
#include "attn/layer_kernels.h"
#include "attn/tensor.h"

namespace attn::test {

// The AdamW scalars the kernel tests run with (grad_scale 1: no clipping).
inline kernels::AdamWScalars test_adamw_scalars() {
  return {.decay = 0.9999f,
          .beta1 = 0.9f,
          .beta2 = 0.99f,
          .one_minus_beta1 = 0.1f,
          .one_minus_beta2 = 0.01f,
          .eps = 1e-8f,
          .neg_step_size = -1.3e-3f,
          .bias_correction2_sqrt = 0.17f};
}

// |got − want| <= rel · (1 + |want|) element by element (same shapes); prints
// the largest error / (1 + |want|) under `what`.
inline void expect_near_rel(const Tensor& got, const Tensor& want, double rel,
                            const std::string& what) {
  ASSERT_EQ(got.shape(), want.shape()) << what;
  const float* g = got.data();
  const float* w = want.data();
  double worst = 0.0;
  for (int64_t i = 0; i < got.numel(); ++i) {
    const double err = std::fabs(double(g[i]) - double(w[i]));
    worst = std::max(worst, err / (1.0 + std::fabs(double(w[i]))));
    ASSERT_LE(err, rel * (1.0 + std::fabs(double(w[i]))))
        << what << "[" << i << "]: got " << g[i] << " want " << w[i];
  }
  std::cout << "[layer kernels] " << what << ": max error / (1 + |want|) " << worst << "\n";
}

// check(target) on every SIMD target compiled in that this CPU runs (AVX3,
// AVX2, SSE4, scalar), with the layer kernels on that target; then the
// automatic choice again.
template <class Check>
void on_every_simd_target(const Check& check) {
  for (const std::string& target : kernels::flash_attention_targets()) {
    ASSERT_TRUE(kernels::flash_attention_use_target(target.c_str()));
    EXPECT_EQ(std::string(kernels::layer_kernels_target()), target);
    check(target);
  }
  kernels::flash_attention_use_target(nullptr);
}

// run() (every output it computes, e.g. as one vector of floats) gives the
// same bits on 1 and on 2 OpenMP threads; the thread count is put back after.
template <class Run>
void expect_same_bits_on_1_and_2_threads(const Run& run) {
  std::vector<decltype(run())> runs;
  const int saved = omp_get_max_threads();
  for (int threads : {1, 2}) {
    omp_set_num_threads(threads);
    runs.push_back(run());
  }
  omp_set_num_threads(saved);
  EXPECT_EQ(runs[0], runs[1]);
}

// The values of tensors, one after the other (what a run above returns).
inline std::vector<float> all_values(std::initializer_list<const Tensor*> tensors) {
  std::vector<float> all;
  for (const Tensor* t : tensors) all.insert(all.end(), t->data(), t->data() + t->numel());
  return all;
}

}  // namespace attn::test
