// The SIMD layer kernels (attn/layer_kernels.h) against the reference loops of
// attn::ref (attn/functional_gpt.h) and AdamW's scalar formula, on every SIMD
// target this CPU runs; and the fast GEMM engine of nn::Linear against the BLAS one.
// Bounds (float32, values ~ N(0, 1) scaled up to ±8):
//   layer norm y, dx:   |kernel − ref| <= 2e-5 · (1 + |ref|)  (float vs double sums)
//   dscale, dshift:     |kernel − ref| <= 1e-5 · N · (1 + |ref| / N)
//   GELU y, dx:         |kernel − ref| <= 4e-6 · (1 + |ref|)  (vector tanh: a few ulps)
//   SwiGLU, GeGLU z, a, dg, du: the same (vector exp, tanh)
// Every shape class: C below, at and above a vector (1, 3, 16, 17, 128, 771),
// N of one row, a partial chunk and several threads' worth of chunks.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "attn/functional_gpt.h"
#include "attn/gpt.h"
#include "attn/kernels.h"
#include "attn/layer_kernels.h"
#include "attn/nn.h"
#include "attn/ops.h"
#include "attn/random.h"
#include "expect.h"
#include "gradcheck.h"
#include "layer_kernel_checks.h"

namespace attn::test {
namespace {

struct NC {
  int64_t N, C;
};
const NC kShapes[] = {{1, 1},    {5, 3},    {1, 16},    {7, 17},
                      {64, 128}, {65, 128}, {300, 771}, {768, 128}};

void check_layer_norm_against_reference(const std::string& target) {
  for (const NC s : kShapes) {
    const std::string what = target + " N " + std::to_string(s.N) + " C " + std::to_string(s.C);
    const Tensor x = add(mul(random_tensor({s.N, s.C}, 1), 3.0f), 0.5f);  // an offset mean
    const Tensor scale = add(random_tensor({s.C}, 2), 1.0f);
    const Tensor shift = random_tensor({s.C}, 3);
    const Tensor dy = random_tensor({s.N, s.C}, 4);

    ref::LayerNormSaved saved;
    const Tensor y_ref = ref::layer_norm_forward(x, scale, shift, 1e-5f, &saved);
    Tensor ds_ref = Tensor::zeros({s.C}), db_ref = Tensor::zeros({s.C});
    const Tensor dx_ref = ref::layer_norm_backward(dy, x, scale, saved, ds_ref, db_ref);

    Tensor y({s.N, s.C}), mean({s.N}), sd({s.N});
    kernels::layer_norm_forward(y.data(), mean.data(), sd.data(), x.data(), scale.data(),
                                shift.data(), s.N, s.C, 1e-5f);
    expect_near_rel(y, y_ref, 2e-5, "layer norm y, " + what);
    expect_near_rel(mean, saved.mean, 2e-6, "layer norm mean, " + what);
    expect_near_rel(sd, saved.std, 2e-6, "layer norm std, " + what);
    // The bf16 output: the float32 y rounded, bit for bit.
    Tensor y16 = Tensor::empty({s.N, s.C}, DType::kBFloat16), mean16({s.N}), sd16({s.N});
    kernels::layer_norm_forward_bf16(y16.data_ptr<BFloat16>(), mean16.data(), sd16.data(), x.data(),
                                     scale.data(), shift.data(), s.N, s.C, 1e-5f);
    for (int64_t i = 0; i < s.N * s.C; ++i)
      ASSERT_EQ(y16.data_ptr<BFloat16>()[i].bits, to_bfloat16(y[i]).bits)
          << what << " bf16 y " << i;
    EXPECT_EQ(max_abs_diff(mean16, mean), 0.0f) << what;
    EXPECT_EQ(max_abs_diff(sd16, sd), 0.0f) << what;

    Tensor dx({s.N, s.C}), ds = Tensor::zeros({s.C}), db = Tensor::zeros({s.C});
    kernels::layer_norm_backward(dx.data(), ds.data(), db.data(), dy.data(), x.data(), scale.data(),
                                 mean.data(), sd.data(), s.N, s.C);
    expect_near_rel(dx, dx_ref, 2e-5, "layer norm dx, " + what);
    expect_near_rel(ds, ds_ref, 1e-5 * double(s.N), "layer norm dscale, " + what);
    expect_near_rel(db, db_ref, 1e-5 * double(s.N), "layer norm dshift, " + what);
  }
}

// RMSNorm (Llama / Qwen weight w, Gemma's 1 + w) against ref::rms_norm_forward.
void check_rms_norm_against_reference(const std::string& target) {
  for (const NC s : kShapes) {
    for (const float offset : {0.0f, 1.0f}) {
      const std::string what = target + " N " + std::to_string(s.N) + " C " + std::to_string(s.C) +
                               " offset " + std::to_string(int(offset));
      const Tensor x = mul(random_tensor({s.N, s.C}, 12), 3.0f);
      const Tensor w = random_tensor({s.C}, 13);
      ref::RmsNormSaved saved;
      const Tensor y_ref = ref::rms_norm_forward(x, w, 1e-6f, offset, &saved);
      Tensor y({s.N, s.C}), inv_rms({s.N});
      kernels::rms_norm_forward(y.data(), inv_rms.data(), x.data(), w.data(), s.N, s.C, 1e-6f,
                                offset);
      expect_near_rel(y, y_ref, 2e-6, "rms norm y, " + what);
      expect_near_rel(inv_rms, saved.inv_rms, 2e-6, "rms norm inv_rms, " + what);
    }
  }
}

TEST(LayerKernels, LayerNormBackwardAccumulatesIntoDscaleAndDshift) {
  const int64_t N = 9, C = 20;
  const Tensor x = random_tensor({N, C}, 5), dy = random_tensor({N, C}, 6);
  const Tensor scale = Tensor::ones({C}), shift = Tensor::zeros({C});
  Tensor y({N, C}), mean({N}), sd({N}), dx({N, C});
  kernels::layer_norm_forward(y.data(), mean.data(), sd.data(), x.data(), scale.data(),
                              shift.data(), N, C, 1e-5f);
  Tensor ds = Tensor::zeros({C}), db = Tensor::zeros({C});
  kernels::layer_norm_backward(dx.data(), ds.data(), db.data(), dy.data(), x.data(), scale.data(),
                               mean.data(), sd.data(), N, C);
  Tensor ds2 = Tensor::full({C}, 1.0f), db2 = Tensor::full({C}, -2.0f);
  kernels::layer_norm_backward(dx.data(), ds2.data(), db2.data(), dy.data(), x.data(), scale.data(),
                               mean.data(), sd.data(), N, C);
  for (int64_t c = 0; c < C; ++c) {
    EXPECT_FLOAT_EQ(ds2.data()[c], ds.data()[c] + 1.0f);
    EXPECT_FLOAT_EQ(db2.data()[c], db.data()[c] - 2.0f);
  }
}

void check_gelu_against_reference(const std::string& target) {
  for (const int64_t n : {int64_t{1}, int64_t{7}, int64_t{16}, int64_t{33}, int64_t{40000}}) {
    // Spread over [-12, 12]: both tails (tanh saturates) and the curved middle.
    const Tensor x = mul(random_tensor({n}, 7), 4.0f);
    const Tensor dy = random_tensor({n}, 8);
    Tensor y({n}), dx({n});
    kernels::gelu_forward(y.data(), x.data(), n);
    kernels::gelu_backward(dx.data(), dy.data(), x.data(), n);
    expect_near_rel(y, ref::gelu_forward(x), 4e-6, "gelu y, " + target + " n " + std::to_string(n));
    expect_near_rel(dx, ref::gelu_backward(dy, x), 4e-6,
                    "gelu dx, " + target + " n " + std::to_string(n));
  }
}

// The gated feed-forward's act(g) ⊙ u and its gradients against the plain
// loops (nn::gate_activation, ref::gelu_backward, SiLU's σ (1 + g (1 − σ))).
void check_gated_against_reference(const std::string& target) {
  for (const bool gelu : {false, true}) {
    const nn::GateActivation act = gelu ? nn::GateActivation::kGeluTanh : nn::GateActivation::kSiLU;
    for (const int64_t n : {int64_t{1}, int64_t{7}, int64_t{16}, int64_t{33}, int64_t{40000}}) {
      const std::string what = target + (gelu ? " geglu" : " swiglu") + " n " + std::to_string(n);
      const Tensor g = mul(random_tensor({n}, 9), 4.0f);  // both tails and the middle
      const Tensor u = random_tensor({n}, 10), dz = random_tensor({n}, 11);
      Tensor z({n}), a({n}), dg({n}), du({n});
      kernels::gated_activation_forward(z.data(), a.data(), g.data(), u.data(), n, gelu);
      kernels::gated_activation_backward(dg.data(), du.data(), dz.data(), g.data(), u.data(), n,
                                         gelu);
      const Tensor a_ref = nn::gate_activation(g, act);
      Tensor dg_ref({n});
      if (gelu) {
        dg_ref = ref::gelu_backward(mul(dz, u), g);
      } else {
        for (int64_t i = 0; i < n; ++i) {
          const float h = g[i], sg = 1.0f / (1.0f + std::exp(-h));
          dg_ref.data()[i] = dz[i] * u[i] * sg * (1.0f + h * (1.0f - sg));
        }
      }
      expect_near_rel(a, a_ref, 4e-6, "act, " + what);
      expect_near_rel(z, mul(a_ref, u), 4e-6, "z, " + what);
      expect_near_rel(dg, dg_ref, 4e-6, "dg, " + what);
      expect_near_rel(du, mul(dz, a_ref), 4e-6, "du, " + what);
    }
  }
}

// round_to_bf16 and gelu_forward_bf16 against the scalar to_bfloat16
// (attn/tensor.h) of the float32 values, bit for bit:
// ties to even both ways, the largest finite values (which round to ±inf),
// infinities, every NaN to 0xFFFF, subnormals and signed zeros; lengths below,
// at and past a vector and a thread's chunk.
void check_round_to_bf16(const std::string& target) {
  const float inf = std::numeric_limits<float>::infinity();
  auto from_bits = [](uint32_t u) {
    float f;
    std::memcpy(&f, &u, sizeof f);
    return f;
  };
  std::vector<float> special = {0.0f,
                                -0.0f,
                                1.0f,
                                -1.0f,
                                inf,
                                -inf,
                                std::numeric_limits<float>::quiet_NaN(),
                                from_bits(0x7F800001u),
                                from_bits(0xFFC00000u),
                                std::numeric_limits<float>::max(),
                                -std::numeric_limits<float>::max(),
                                from_bits(0x00000001u),
                                from_bits(0x3F808000u),
                                from_bits(0x3F818000u),  // ties: down, up
                                from_bits(0x3F808001u),
                                from_bits(0x3F807FFFu)};
  for (const int64_t n :
       {int64_t{0}, int64_t{1}, int64_t{15}, int64_t{16}, int64_t{17}, int64_t{100003}}) {
    std::vector<float> src(static_cast<size_t>(n));
    const Tensor r = random_tensor({std::max<int64_t>(n, 1)}, 21);
    for (int64_t i = 0; i < n; ++i)
      src[size_t(i)] = i < int64_t(special.size()) ? special[size_t(i)] : 1e3f * r[i];
    std::vector<BFloat16> got(static_cast<size_t>(n));
    kernels::round_to_bf16(got.data(), src.data(), n);
    for (int64_t i = 0; i < n; ++i) {
      ASSERT_EQ(got[size_t(i)].bits, to_bfloat16(src[size_t(i)]).bits)
          << target << " n " << n << " element " << i << " = " << src[size_t(i)];
    }
    // gelu_forward_bf16 = gelu_forward, then rounded.
    std::vector<float> g(static_cast<size_t>(n));
    kernels::gelu_forward(g.data(), src.data(), n);
    kernels::gelu_forward_bf16(got.data(), src.data(), n);
    for (int64_t i = 0; i < n; ++i) {
      ASSERT_EQ(got[size_t(i)].bits, to_bfloat16(g[size_t(i)]).bits)
          << target << " gelu n " << n << " element " << i << " = " << src[size_t(i)];
    }
  }
}

// Every SIMD target compiled in that this CPU runs (AVX3, AVX2, SSE4, scalar).
TEST(LayerKernels, EveryTargetMatchesTheReference) {
  on_every_simd_target([](const std::string& target) {
    check_layer_norm_against_reference(target);
    check_rms_norm_against_reference(target);
    check_gelu_against_reference(target);
    check_gated_against_reference(target);
    check_round_to_bf16(target);
  });
}

// fill_rows and column_sums_accumulate against their loops, with a leading
// dimension wider than the rows, bit for bit for 1, 2 and 3 threads.
TEST(LayerKernels, BiasRowsAndColumnSumsAreTheLoopsForAnyThreadCount) {
  const int saved = omp_get_max_threads();
  for (const NC s : {NC{3, 5}, NC{700, 97}, NC{1000, 200}}) {
    const int64_t ld = s.C + 3;
    const Tensor A = random_tensor({s.N, ld}, 22), b = random_tensor({s.C}, 23);
    const Tensor Ab = A.to(DType::kBFloat16);
    std::vector<float> want32(size_t(s.C), 0.5f), want16(size_t(s.C), 0.5f);
    for (int64_t r = 0; r < s.N; ++r) {
      for (int64_t j = 0; j < s.C; ++j) {
        want32[size_t(j)] += A[r * ld + j];
        want16[size_t(j)] += to_float(Ab.data_ptr<BFloat16>()[r * ld + j]);
      }
    }
    for (int threads : {1, 2, 3}) {
      omp_set_num_threads(threads);
      std::vector<float> sum32(size_t(s.C), 0.5f), sum16(size_t(s.C), 0.5f);
      kernels::column_sums_accumulate(sum32.data(), A.data(), ld, s.N, s.C);
      kernels::column_sums_accumulate(sum16.data(), Ab.data_ptr<BFloat16>(), ld, s.N, s.C);
      EXPECT_EQ(sum32, want32) << s.N << "x" << s.C << ", " << threads << " threads";
      EXPECT_EQ(sum16, want16) << s.N << "x" << s.C << ", " << threads << " threads";
      std::vector<float> C(size_t(s.N * ld), -1.0f);
      kernels::fill_rows(C.data(), ld, b.data(), s.N, s.C);
      for (int64_t r = 0; r < s.N; ++r) {
        for (int64_t j = 0; j < ld; ++j) {
          ASSERT_EQ(C[size_t(r * ld + j)], j < s.C ? b[j] : -1.0f) << r << ", " << j;
        }
      }
    }
  }
  omp_set_num_threads(saved);
}

// AdamW's update against the scalar formula of AdamW::step (PyTorch's order):
// bit for bit where the target has FMA (AVX2, AVX3), within float rounding elsewhere.
TEST(LayerKernels, AdamWUpdateIsTheScalarFormulaOnEveryTarget) {
  const kernels::AdamWScalars c = test_adamw_scalars();
  const int64_t n = 40003;  // past the parallel threshold, with a tail
  const std::vector<float> w0 = random_tensor({n}, 21).to_vector(),
                           g = random_tensor({n}, 22).to_vector();
  const std::vector<float> m0 = random_tensor({n}, 23).to_vector();
  std::vector<float> v0 = random_tensor({n}, 24).to_vector();
  for (float& x : v0) x = x * x;  // second moments are >= 0
  std::vector<float> w_ref = w0, m_ref = m0, v_ref = v0;
  for (size_t i = 0; i < size_t(n); ++i) {
    w_ref[i] = w_ref[i] * c.decay;
    m_ref[i] = std::fma(g[i], c.one_minus_beta1, m_ref[i] * c.beta1);
    v_ref[i] = v_ref[i] * c.beta2 + c.one_minus_beta2 * g[i] * g[i];
    const float denom = std::sqrt(v_ref[i]) / c.bias_correction2_sqrt + c.eps;
    w_ref[i] = w_ref[i] + c.neg_step_size * m_ref[i] / denom;
  }
  on_every_simd_target([&](const std::string& target) {
    std::vector<float> w = w0, m = m0, v = v0;
    kernels::adamw_update(w.data(), m.data(), v.data(), g.data(), n, c);
    if (target == "AVX3" || target == "AVX2") {
      EXPECT_EQ(w, w_ref) << target;
      EXPECT_EQ(m, m_ref) << target;
      EXPECT_EQ(v, v_ref) << target;
    } else {
      expect_near_rel(Tensor({n}, w), Tensor({n}, w_ref), 1e-6, "adamw w, " + target);
      expect_near_rel(Tensor({n}, m), Tensor({n}, m_ref), 1e-6, "adamw m, " + target);
    }
  });
}

TEST(LayerKernels, GeluPropagatesNaNAndSaturates) {
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> xs = {std::nanf(""), 30.0f, -30.0f, inf, -inf, 0.0f};
  const Tensor x({6}, xs);
  Tensor y({6});
  kernels::gelu_forward(y.data(), x.data(), 6);
  EXPECT_TRUE(std::isnan(y.data()[0]));
  EXPECT_FLOAT_EQ(y.data()[1], 30.0f);
  EXPECT_FLOAT_EQ(y.data()[2], -0.0f);
  EXPECT_EQ(y.data()[5], 0.0f);
}

// Every output, and every chunk's partial dscale/dshift, is computed in one
// fixed order: 1 and 2 OpenMP threads give the same bits.
TEST(LayerKernels, BitsDoNotDependOnTheThreadCount) {
  const int64_t N = 1000, C = 200;  // past the parallel threshold
  const Tensor x = random_tensor({N, C}, 9), dy = random_tensor({N, C}, 10);
  const Tensor scale = random_tensor({C}, 11), shift = random_tensor({C}, 12);
  expect_same_bits_on_1_and_2_threads([&] {
    Tensor y({N, C}), mean({N}), sd({N}), dx({N, C}), ds = Tensor::zeros({C}),
                                                      db = Tensor::zeros({C});
    Tensor g({N, C}), gdx({N, C});
    kernels::layer_norm_forward(y.data(), mean.data(), sd.data(), x.data(), scale.data(),
                                shift.data(), N, C, 1e-5f);
    kernels::layer_norm_backward(dx.data(), ds.data(), db.data(), dy.data(), x.data(), scale.data(),
                                 mean.data(), sd.data(), N, C);
    kernels::gelu_forward(g.data(), x.data(), N * C);
    kernels::gelu_backward(gdx.data(), dy.data(), x.data(), N * C);
    return all_values({&y, &mean, &sd, &dx, &ds, &db, &g, &gdx});
  });
}

TEST(LayerKernels, TargetIsNamed) {
  EXPECT_FALSE(std::string(kernels::layer_kernels_target()).empty());
}

// The modules: LayerImpl::kKernel and kReference agree within the bounds above,
// forward and backward, on a strided (non-contiguous) input too.
TEST(LayerKernels, ModulesAgreeOnBothImplementations) {
  const Tensor base = mul(random_tensor({4, 6, 10}, 13), 2.0f);
  const Tensor x = transpose(base, 0, 1);  // (6, 4, 10), strided
  const Tensor dy = random_tensor({6, 4, 10}, 14);
  nn::LayerNorm ln_k(10), ln_r(10, 1e-5f, nn::LayerImpl::kReference);
  for (nn::LayerNorm* ln : {&ln_k, &ln_r}) {
    ln->scale.value = add(random_tensor({10}, 15), 1.0f);
    ln->shift.value = random_tensor({10}, 16);
  }
  expect_near_rel(ln_k.forward(x), ln_r.forward(x), 2e-5, "LayerNorm module y");
  expect_near_rel(ln_k.backward(dy), ln_r.backward(dy), 2e-5, "LayerNorm module dx");
  expect_near_rel(ln_k.scale.grad, ln_r.scale.grad, 1e-4, "LayerNorm module dscale");
  expect_near_rel(ln_k.shift.grad, ln_r.shift.grad, 1e-4, "LayerNorm module dshift");
  nn::GELU g_k, g_r(nn::LayerImpl::kReference);
  expect_near_rel(g_k.forward(x), g_r.forward(x), 4e-6, "GELU module y");
  expect_near_rel(g_k.backward(dy), g_r.backward(dy), 4e-6, "GELU module dx");
}

TEST(LayerKernels, ModulesRejectOtherDtypes) {
  nn::LayerNorm ln(4);
  nn::GELU g;
  const Tensor x = random_tensor({2, 4}, 17).to(DType::kBFloat16);
  EXPECT_THROW(ln.forward(x), std::invalid_argument);
  EXPECT_THROW(g.forward(x), std::invalid_argument);
}

// nn::Linear on the fast GEMM engine against the BLAS engine: y, dx, dweight
// and dbias within K-term float rounding, bias or not.
TEST(LayerKernels, LinearOnTheFastEngineMatchesTheBlasEngine) {
  for (bool bias : {true, false}) {
    manual_seed(18);
    nn::Linear a({.in_features = 37, .out_features = 70, .bias = bias});
    nn::Linear b(
        {.in_features = 37, .out_features = 70, .bias = bias, .engine = gemm::Engine::kFast});
    b.weight.value = a.weight.value.clone();
    if (bias) b.bias.value = a.bias.value.clone();
    const Tensor x = random_tensor({3, 50, 37}, 19), dy = random_tensor({3, 50, 70}, 20);
    const std::string what = bias ? "Linear with bias" : "Linear without bias";
    expect_near_rel(b.forward(x), a.forward(x), 1e-5, what + " y");
    expect_near_rel(b.backward(dy), a.backward(dy), 1e-5, what + " dx");
    expect_near_rel(b.weight.grad, a.weight.grad, 1e-4, what + " dweight");
    if (bias) expect_near_rel(b.bias.grad, a.bias.grad, 1e-4, what + " dbias");
  }
}

// nn::Linear in bf16 mode is the product of the bf16-rounded operands summed
// in float32: y = bf16(x) bf16(W)ᵀ + b, dx = bf16(dy) bf16(W), dW += bf16(dy)ᵀ
// bf16(x), against those sums in double (bounds as the fp32 test above:
// float sums of 37 and 1200 terms); db is the fp32 Linear's Σ_rows dy, bit for
// bit; a bf16 input gives the same bits as its float32 value.
TEST(LayerKernels, LinearInBf16IsTheProductOfTheRoundedOperands) {
  const int64_t in = 37, out = 70;
  manual_seed(24);
  nn::Linear f32({.in_features = in, .out_features = out, .engine = gemm::Engine::kFast});
  nn::Linear b16({.in_features = in, .out_features = out, .dtype = DType::kBFloat16});
  b16.weight.value = f32.weight.value.clone();
  b16.bias.value = f32.bias.value.clone();
  const Tensor x = random_tensor({4, 300, in}, 25), dy = random_tensor({4, 300, out}, 26);
  const Tensor y = b16.forward(x);
  const Tensor dx = b16.backward(dy);
  ASSERT_EQ(y.dtype(), DType::kFloat32);
  ASSERT_EQ(y.shape(), (Shape{4, 300, out}));
  ASSERT_EQ(dx.shape(), x.shape());
  auto rounded = [](const Tensor& t) { return t.to(DType::kBFloat16).to(DType::kFloat32); };
  const Tensor xb = rounded(x).reshape({1200, in}), Wb = rounded(f32.weight.value);
  const Tensor dyb = rounded(dy).reshape({1200, out});
  Tensor y_ref({1200, out}), dx_ref({1200, in}), dW_ref({out, in});
  for (int64_t n = 0; n < 1200; ++n) {
    for (int64_t o = 0; o < out; ++o) {
      double acc = f32.bias.value[o];
      for (int64_t i = 0; i < in; ++i) acc += double(xb[n * in + i]) * Wb[o * in + i];
      y_ref.data()[n * out + o] = float(acc);
    }
    for (int64_t i = 0; i < in; ++i) {
      double acc = 0.0;
      for (int64_t o = 0; o < out; ++o) acc += double(dyb[n * out + o]) * Wb[o * in + i];
      dx_ref.data()[n * in + i] = float(acc);
    }
  }
  for (int64_t o = 0; o < out; ++o) {
    for (int64_t i = 0; i < in; ++i) {
      double acc = 0.0;
      for (int64_t n = 0; n < 1200; ++n) acc += double(dyb[n * out + o]) * xb[n * in + i];
      dW_ref.data()[o * in + i] = float(acc);
    }
  }
  expect_near_rel(y.reshape({1200, out}), y_ref, 1e-5, "bf16 Linear y");
  expect_near_rel(dx.reshape({1200, in}), dx_ref, 1e-5, "bf16 Linear dx");
  expect_near_rel(b16.weight.grad, dW_ref, 1e-4, "bf16 Linear dweight");
  f32.forward(x);
  f32.backward(dy);
  EXPECT_EQ(max_abs_diff(b16.bias.grad, f32.bias.grad), 0.0f);
  EXPECT_GT(max_abs_diff(y, f32.forward(x)), 0.0f) << "bf16 gave the fp32 bits";
  EXPECT_EQ(max_abs_diff(b16.forward(x.to(DType::kBFloat16)), y), 0.0f);
}

TEST(LayerKernels, LinearDtypeErrorsNameTheValues) {
  expect_message<std::invalid_argument>(
      [] { nn::Linear l({.in_features = 2, .out_features = 3, .dtype = DType::kInt64}); },
      "Linear: dtype must be float32 or bfloat16, got int64");
  nn::Linear f32({.in_features = 2, .out_features = 3});
  nn::Linear b16({.in_features = 2, .out_features = 3, .dtype = DType::kBFloat16});
  const Tensor xb = random_tensor({4, 2}, 27).to(DType::kBFloat16);
  expect_message<std::invalid_argument>(
      [&] { f32.forward(xb); }, "Linear: input must be float32, got bfloat16 of shape (4, 2)");
  expect_message<std::invalid_argument>(
      [&] {
        b16.forward(Tensor::zeros({4, 2}, DType::kInt64));
      },
      "Linear: input must be float32 or bfloat16, got int64 of shape (4, 2)");
}

// Finite differences on the reference loops too (test_gpt.cpp checks the kernels' modules).
TEST(LayerKernels, ReferenceModulesPassGradcheck) {
  nn::LayerNorm ln(7, 1e-5f, nn::LayerImpl::kReference);
  ln.scale.value = add(random_tensor({7}, 1), 1.0f);
  ln.shift.value = random_tensor({7}, 2);
  gradcheck_module("LayerNorm (reference)", ln, random_tensor({2, 3, 7}, 3));
  nn::GELU gelu(nn::LayerImpl::kReference);
  gradcheck_module("GELU (reference)", gelu, mul(random_tensor({3, 4, 5}, 4), 2.0f));
}

}  // namespace
}  // namespace attn::test
