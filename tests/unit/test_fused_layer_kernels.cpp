// The fused passes of the GPT block (attn/layer_kernels.h) against the unfused
// kernels they replace, on every SIMD target this CPU runs:
//   add_layer_norm_forward(_bf16)   = add, then layer_norm_forward(_bf16)   bit for bit
//   layer_norm_backward_add          = dresidual + layer_norm_backward        bit for bit
//   bias_gelu_forward(_bf16)         = h + b, then gelu_forward (rounded)     bit for bit
//   gelu_backward_bias(_bf16)        = gelu_backward (rounded) bit for bit; db = Σ_rows dh
//                                      within float rounding of the row sums
//   bias_gelu_forward_slope(_bf16)   = bias_gelu_forward's y, h = gelu_backward(1, h + b)
//   slope_backward_bias(_bf16)       = gelu_backward_bias from h + b          bit for bit
//   adamw_update_zero_grad, grad_scale = adamw_update of g·scale, then g = 0  bit for bit
//   sum_of_squares                   = Σ x² in double (order aside)
//   adamw_update_zero_grad, sum_of_squares over many tensors in one region
//                                    = the one-tensor kernels, tensor by tensor  bit for bit
// and nn::FeedForward's fused path (LayerImpl::kKernel) against the module
// chain Linear, GELU, Linear: reference modules in float32, the same modules'
// bf16 mode in bf16. Thread counts 1 and 2 give the same bits.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "attn/gemm.h"
#include "attn/gpt.h"
#include "attn/kernels.h"
#include "attn/layer_kernels.h"
#include "attn/nn.h"
#include "attn/ops.h"
#include "attn/random.h"
#include "expect.h"
#include "gemm_route_guard.h"
#include "gradcheck.h"
#include "layer_kernel_checks.h"

namespace attn::test {
namespace {

struct MN {
  int64_t M, N;
};
// Widths below, at and past a vector (and AVX-512's 16 lanes); rows of one
// chunk, a partial chunk and several threads' worth.
const MN kShapes[] = {{1, 1}, {5, 3}, {7, 17}, {64, 128}, {65, 512}, {300, 771}, {768, 128}};

std::string name(const std::string& target, MN s) {
  return target + " " + std::to_string(s.M) + "x" + std::to_string(s.N);
}

void expect_same_bits(const Tensor& got, const Tensor& want, const std::string& what) {
  ASSERT_EQ(got.shape(), want.shape()) << what;
  for (int64_t i = 0; i < got.numel(); ++i) {
    ASSERT_EQ(got.data()[i], want.data()[i]) << what << " element " << i;
  }
}

void expect_same_bf16(const Tensor& got16, const Tensor& want32, const std::string& what) {
  ASSERT_EQ(got16.numel(), want32.numel()) << what;
  for (int64_t i = 0; i < got16.numel(); ++i) {
    ASSERT_EQ(got16.data_ptr<BFloat16>()[i].bits, to_bfloat16(want32.data()[i]).bits)
        << what << " element " << i;
  }
}

void check_add_layer_norm(const std::string& target) {
  for (const MN s : kShapes) {
    const std::string what = name(target, s);
    const Tensor a = mul(random_tensor({s.M, s.N}, 1), 2.0f), r = random_tensor({s.M, s.N}, 2);
    const Tensor scale = add(random_tensor({s.N}, 3), 1.0f), shift = random_tensor({s.N}, 4);
    // Unfused: x1 = a + r, then the norm.
    const Tensor x1_want = add(a, r);
    Tensor y_want({s.M, s.N}), mean_want({s.M}), sd_want({s.M});
    kernels::layer_norm_forward(y_want.data(), mean_want.data(), sd_want.data(), x1_want.data(),
                                scale.data(), shift.data(), s.M, s.N, 1e-5f);
    Tensor x1({s.M, s.N}), y({s.M, s.N}), mean({s.M}), sd({s.M});
    kernels::add_layer_norm_forward(x1.data(), y.data(), mean.data(), sd.data(), a.data(), r.data(),
                                    scale.data(), shift.data(), s.M, s.N, 1e-5f);
    expect_same_bits(x1, x1_want, "add+norm x1, " + what);
    expect_same_bits(y, y_want, "add+norm y, " + what);
    expect_same_bits(mean, mean_want, "add+norm mean, " + what);
    expect_same_bits(sd, sd_want, "add+norm std, " + what);
    Tensor x1b({s.M, s.N}), y16 = Tensor::empty({s.M, s.N}, DType::kBFloat16), mb({s.M}), sb({s.M});
    kernels::add_layer_norm_forward_bf16(x1b.data(), y16.data_ptr<BFloat16>(), mb.data(), sb.data(),
                                         a.data(), r.data(), scale.data(), shift.data(), s.M, s.N,
                                         1e-5f);
    expect_same_bits(x1b, x1_want, "add+norm bf16 x1, " + what);
    expect_same_bf16(y16, y_want, "add+norm bf16 y, " + what);

    // Backward: dx = dresidual + the norm's dx; dscale, dshift accumulate alike.
    const Tensor dy = random_tensor({s.M, s.N}, 5), dres = random_tensor({s.M, s.N}, 6);
    Tensor dx_ln({s.M, s.N}), ds_want = Tensor::full({s.N}, 0.5f), db_want = Tensor::zeros({s.N});
    kernels::layer_norm_backward(dx_ln.data(), ds_want.data(), db_want.data(), dy.data(),
                                 x1_want.data(), scale.data(), mean.data(), sd.data(), s.M, s.N);
    const Tensor dx_want = add(dres, dx_ln);
    Tensor dx({s.M, s.N}), ds = Tensor::full({s.N}, 0.5f), db = Tensor::zeros({s.N});
    kernels::layer_norm_backward_add(dx.data(), ds.data(), db.data(), dy.data(), dres.data(),
                                     x1.data(), scale.data(), mean.data(), sd.data(), s.M, s.N);
    expect_same_bits(dx, dx_want, "norm backward + residual dx, " + what);
    expect_same_bits(ds, ds_want, "norm backward + residual dscale, " + what);
    expect_same_bits(db, db_want, "norm backward + residual dshift, " + what);
  }
}

// Σ_rows of a (M, N) in double, as float.
Tensor column_sums_double(const Tensor& a, int64_t M, int64_t N, float start) {
  Tensor out({N});
  for (int64_t c = 0; c < N; ++c) {
    double sum = start;
    for (int64_t r = 0; r < M; ++r) sum += a.data()[r * N + c];
    out.data()[c] = static_cast<float>(sum);
  }
  return out;
}

void check_bias_gelu(const std::string& target) {
  for (const MN s : kShapes) {
    const std::string what = name(target, s);
    // Spread over about [-12, 12]: both tails and the curved middle.
    const Tensor h0 = mul(random_tensor({s.M, s.N}, 7), 3.0f), b = random_tensor({s.N}, 8);
    Tensor h_want({s.M, s.N});
    kernels::fill_rows(h_want.data(), s.N, b.data(), s.M, s.N);
    for (int64_t i = 0; i < s.M * s.N; ++i) h_want.data()[i] = h0.data()[i] + h_want.data()[i];
    Tensor y_want({s.M, s.N});
    kernels::gelu_forward(y_want.data(), h_want.data(), s.M * s.N);

    Tensor h = h0.clone(), y({s.M, s.N});
    kernels::bias_gelu_forward(h.data(), y.data(), b.data(), s.M, s.N);
    expect_same_bits(h, h_want, "bias+gelu h, " + what);
    expect_same_bits(y, y_want, "bias+gelu y, " + what);
    Tensor h2 = h0.clone(), y16 = Tensor::empty({s.M, s.N}, DType::kBFloat16);
    kernels::bias_gelu_forward_bf16(h2.data(), y16.data_ptr<BFloat16>(), b.data(), s.M, s.N);
    expect_same_bits(h2, h_want, "bias+gelu bf16 h, " + what);
    expect_same_bf16(y16, y_want, "bias+gelu bf16 y, " + what);

    // Backward: dh = gelu_backward(dy, h) bit for bit, db += Σ_rows dh.
    const Tensor dy = random_tensor({s.M, s.N}, 9);
    Tensor dh_want({s.M, s.N});
    kernels::gelu_backward(dh_want.data(), dy.data(), h_want.data(), s.M * s.N);
    const Tensor db_want = column_sums_double(dh_want, s.M, s.N, 0.25f);
    Tensor dh({s.M, s.N}), db = Tensor::full({s.N}, 0.25f);
    kernels::gelu_backward_bias(dh.data(), db.data(), dy.data(), h.data(), s.M, s.N);
    expect_same_bits(dh, dh_want, "gelu backward + bias dh, " + what);
    expect_near_rel(db, db_want, 1e-6 * double(s.M), "gelu backward + bias db, " + what);
    // In place (dh over dy), as FeedForward runs it.
    Tensor dh_in = dy.clone(), db_in = Tensor::full({s.N}, 0.25f);
    kernels::gelu_backward_bias(dh_in.data(), db_in.data(), dh_in.data(), h.data(), s.M, s.N);
    expect_same_bits(dh_in, dh, "gelu backward + bias in place dh, " + what);
    expect_same_bits(db_in, db, "gelu backward + bias in place db, " + what);
    Tensor dh16 = Tensor::empty({s.M, s.N}, DType::kBFloat16), db16 = Tensor::full({s.N}, 0.25f);
    kernels::gelu_backward_bias_bf16(dh16.data_ptr<BFloat16>(), db16.data(), dy.data(), h.data(),
                                     s.M, s.N);
    expect_same_bf16(dh16, dh_want, "gelu backward + bias bf16 dh, " + what);
    expect_same_bits(db16, db, "gelu backward + bias bf16 db (the float dh's sums), " + what);

    // The slope pair: y as above, h = gelu'(h + b); then dy ⊙ slope has the
    // bits of gelu_backward_bias from h + b (in place too, and bf16).
    Tensor slope = h0.clone(), ys({s.M, s.N});
    kernels::bias_gelu_forward_slope(slope.data(), ys.data(), b.data(), s.M, s.N);
    expect_same_bits(ys, y_want, "bias+gelu+slope y, " + what);
    Tensor ones = Tensor::full({s.M, s.N}, 1.0f), slope_want({s.M, s.N});
    kernels::gelu_backward(slope_want.data(), ones.data(), h_want.data(), s.M * s.N);
    expect_same_bits(slope, slope_want, "bias+gelu+slope h = gelu'(h + b), " + what);
    Tensor slope16 = h0.clone(), ys16 = Tensor::empty({s.M, s.N}, DType::kBFloat16);
    kernels::bias_gelu_forward_slope_bf16(slope16.data(), ys16.data_ptr<BFloat16>(), b.data(),
                                          s.M, s.N);
    expect_same_bf16(ys16, y_want, "bias+gelu+slope bf16 y, " + what);
    expect_same_bits(slope16, slope_want, "bias+gelu+slope bf16 h, " + what);
    Tensor dhs = dy.clone(), dbs = Tensor::full({s.N}, 0.25f);
    kernels::slope_backward_bias(dhs.data(), dbs.data(), dhs.data(), slope.data(), s.M, s.N);
    expect_same_bits(dhs, dh, "slope backward + bias in place dh, " + what);
    expect_same_bits(dbs, db, "slope backward + bias in place db, " + what);
    Tensor dhs16 = Tensor::empty({s.M, s.N}, DType::kBFloat16), dbs16 = Tensor::full({s.N}, 0.25f);
    kernels::slope_backward_bias_bf16(dhs16.data_ptr<BFloat16>(), dbs16.data(), dy.data(),
                                      slope.data(), s.M, s.N);
    expect_same_bf16(dhs16, dh_want, "slope backward + bias bf16 dh, " + what);
    expect_same_bits(dbs16, db, "slope backward + bias bf16 db, " + what);

    // The _bf16_values pair: the bf16 outputs' values in float32, bit for
    // bit, h and db as the _bf16 pair's (dh in place over dy too).
    Tensor slope_v = h0.clone(), ys_v({s.M, s.N});
    kernels::bias_gelu_forward_slope_bf16_values(slope_v.data(), ys_v.data(), b.data(), s.M, s.N);
    expect_same_bits(ys_v, ys16.to(DType::kFloat32), "bias+gelu+slope bf16 values y, " + what);
    expect_same_bits(slope_v, slope_want, "bias+gelu+slope bf16 values h, " + what);
    Tensor dh_v = dy.clone(), db_v = Tensor::full({s.N}, 0.25f);
    kernels::slope_backward_bias_bf16_values(dh_v.data(), db_v.data(), dh_v.data(), slope.data(),
                                             s.M, s.N);
    expect_same_bits(dh_v, dhs16.to(DType::kFloat32), "slope backward bf16 values dh, " + what);
    expect_same_bits(db_v, db, "slope backward bf16 values db, " + what);
  }
}

void check_adamw_zero_grad(const std::string& target) {
  const kernels::AdamWScalars plain = test_adamw_scalars();
  for (const float scale : {1.0f, 0.37f}) {
    kernels::AdamWScalars scaled = plain;
    scaled.grad_scale = scale;
    const int64_t n = 40003;  // past the parallel threshold, with a tail
    const Tensor w0 = random_tensor({n}, 21), g0 = random_tensor({n}, 22);
    const Tensor m0 = random_tensor({n}, 23), v0 = mul(random_tensor({n}, 24), random_tensor({n}, 24));
    // Unfused: g *= scale (clip_grad_norm), adamw_update, g = 0 (zero_grad).
    Tensor w_want = w0.clone(), m_want = m0.clone(), v_want = v0.clone(), gs = g0.clone();
    for (int64_t i = 0; i < n; ++i) gs.data()[i] *= scale;
    kernels::adamw_update(w_want.data(), m_want.data(), v_want.data(), gs.data(), n, plain);
    Tensor w = w0.clone(), m = m0.clone(), v = v0.clone(), g = g0.clone();
    kernels::adamw_update_zero_grad(w.data(), m.data(), v.data(), g.data(), n, scaled);
    const std::string what = target + " scale " + std::to_string(scale);
    expect_same_bits(w, w_want, "adamw w, " + what);
    expect_same_bits(m, m_want, "adamw m, " + what);
    expect_same_bits(v, v_want, "adamw v, " + what);
    expect_same_bits(g, Tensor::zeros({n}), "adamw zeroed g, " + what);
    // adamw_update with grad_scale leaves g as it was.
    Tensor w2 = w0.clone(), m2 = m0.clone(), v2 = v0.clone(), g2 = g0.clone();
    kernels::adamw_update(w2.data(), m2.data(), v2.data(), g2.data(), n, scaled);
    expect_same_bits(w2, w_want, "adamw (scaled, g kept) w, " + what);
    expect_same_bits(g2, g0, "adamw (scaled, g kept) g, " + what);
  }
}

void check_sum_of_squares(const std::string& target) {
  for (const int64_t n : {int64_t{0}, int64_t{1}, int64_t{7}, int64_t{17}, int64_t{40001},
                          int64_t{300000}}) {
    const Tensor x = n == 0 ? Tensor({0}) : mul(random_tensor({n}, 25), 3.0f);
    double want = 0.0;
    for (int64_t i = 0; i < n; ++i) want += double(x.data()[i]) * x.data()[i];
    const double got = kernels::sum_of_squares(x.data(), n);
    EXPECT_NEAR(got, want, 1e-12 * (1.0 + want)) << target << " n " << n;
  }
}

// The one-region kernels over many tensors (AdamW::step) against the
// one-tensor kernels, tensor by tensor: sizes below, at and past a chunk and
// the parallel threshold, two groups' scalars; 1 and 2 threads.
void check_many_tensors(const std::string& target) {
  const int64_t sizes[] = {1, 17, 8192, 40003, 0, 16384 + 5, 300000, 3};
  constexpr int64_t kCount = std::size(sizes);
  kernels::AdamWScalars groups[2] = {test_adamw_scalars(), {}};
  groups[0].grad_scale = 0.37f;
  groups[1] = groups[0];
  groups[1].decay = 1.0f;
  std::vector<Tensor> w0, m0, v0, g0;
  for (int64_t t = 0; t < kCount; ++t) {
    const Shape shape{sizes[t]};
    const uint64_t seed = 40 + 4 * uint64_t(t);
    w0.push_back(sizes[t] == 0 ? Tensor(shape) : random_tensor(shape, seed));
    m0.push_back(sizes[t] == 0 ? Tensor(shape) : random_tensor(shape, seed + 1));
    v0.push_back(sizes[t] == 0 ? Tensor(shape)
                               : mul(random_tensor(shape, seed + 2), random_tensor(shape, seed + 2)));
    g0.push_back(sizes[t] == 0 ? Tensor(shape) : mul(random_tensor(shape, seed + 3), 3.0f));
  }
  const int saved = omp_get_max_threads();
  for (const int threads : {1, 2}) {
    omp_set_num_threads(threads);
    const std::string what = target + " threads " + std::to_string(threads);
    std::vector<Tensor> w, m, v, g;
    std::vector<kernels::AdamWTensor> all;
    std::vector<const float*> xs;
    for (int64_t t = 0; t < kCount; ++t) {
      w.push_back(w0[size_t(t)].clone()), m.push_back(m0[size_t(t)].clone());
      v.push_back(v0[size_t(t)].clone()), g.push_back(g0[size_t(t)].clone());
      xs.push_back(g0[size_t(t)].data());
    }
    for (int64_t t = 0; t < kCount; ++t) {
      const auto i = size_t(t);
      all.push_back({w[i].data(), m[i].data(), v[i].data(), g[i].data(), sizes[t], &groups[t % 2]});
    }
    std::vector<double> sums(kCount, -1.0);
    kernels::sum_of_squares(sums.data(), xs.data(), sizes, kCount);
    kernels::adamw_update_zero_grad(all.data(), kCount);
    for (int64_t t = 0; t < kCount; ++t) {
      const auto i = size_t(t);
      EXPECT_EQ(sums[i], kernels::sum_of_squares(g0[i].data(), sizes[t])) << what << " tensor " << t;
      Tensor w1 = w0[i].clone(), m1 = m0[i].clone(), v1 = v0[i].clone(), g1 = g0[i].clone();
      kernels::adamw_update_zero_grad(w1.data(), m1.data(), v1.data(), g1.data(), sizes[t],
                                      groups[t % 2]);
      const std::string each = what + " tensor " + std::to_string(t);
      expect_same_bits(w[i], w1, "adamw many w, " + each);
      expect_same_bits(m[i], m1, "adamw many m, " + each);
      expect_same_bits(v[i], v1, "adamw many v, " + each);
      expect_same_bits(g[i], Tensor::zeros({sizes[t]}), "adamw many zeroed g, " + each);
    }
  }
  omp_set_num_threads(saved);
}

TEST(FusedLayerKernels, EveryTargetMatchesTheUnfusedKernels) {
  on_every_simd_target([](const std::string& target) {
    check_add_layer_norm(target);
    check_bias_gelu(target);
    check_adamw_zero_grad(target);
    check_sum_of_squares(target);
    check_many_tensors(target);
  });
}

TEST(FusedLayerKernels, FillRowsAddIsTheResidualPlusTheBias) {
  const int64_t M = 300, N = 130;  // past the parallel threshold
  const Tensor r = random_tensor({M, N}, 26), b = random_tensor({N}, 27);
  Tensor c({M, N});
  kernels::fill_rows_add(c.data(), N, b.data(), r.data(), N, M, N);
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j)
      ASSERT_EQ(c.data()[i * N + j], r.data()[i * N + j] + b.data()[j]) << i << ", " << j;
}

TEST(FusedLayerKernels, BitsDoNotDependOnTheThreadCount) {
  const int64_t M = 1000, N = 300;  // past the parallel thresholds
  const Tensor a = random_tensor({M, N}, 28), r = random_tensor({M, N}, 29);
  const Tensor dy = random_tensor({M, N}, 30), b = random_tensor({N}, 31);
  const Tensor scale = random_tensor({N}, 32), shift = random_tensor({N}, 33);
  expect_same_bits_on_1_and_2_threads([&] {
    Tensor x1({M, N}), y({M, N}), mean({M}), sd({M}), dx({M, N}), ds = Tensor::zeros({N}),
                                                                  dsh = Tensor::zeros({N});
    kernels::add_layer_norm_forward(x1.data(), y.data(), mean.data(), sd.data(), a.data(),
                                    r.data(), scale.data(), shift.data(), M, N, 1e-5f);
    kernels::layer_norm_backward_add(dx.data(), ds.data(), dsh.data(), dy.data(), r.data(),
                                     x1.data(), scale.data(), mean.data(), sd.data(), M, N);
    Tensor h = a.clone(), g({M, N}), dh({M, N}), db = Tensor::zeros({N});
    kernels::bias_gelu_forward(h.data(), g.data(), b.data(), M, N);
    kernels::gelu_backward_bias(dh.data(), db.data(), dy.data(), h.data(), M, N);
    Tensor slope = a.clone(), gs({M, N}), dhs({M, N}), dbs = Tensor::zeros({N});
    kernels::bias_gelu_forward_slope(slope.data(), gs.data(), b.data(), M, N);
    kernels::slope_backward_bias(dhs.data(), dbs.data(), dy.data(), slope.data(), M, N);
    return std::make_pair(
        all_values({&x1, &y, &mean, &sd, &dx, &ds, &dsh, &h, &g, &dh, &db, &slope, &gs, &dhs, &dbs}),
        kernels::sum_of_squares(a.data(), M * N));
  });
}

// nn::FeedForward with LayerImpl::kKernel (the fused path) against the chain
// of modules it fuses, forward and backward, every parameter's gradient.
void copy_weights(nn::FeedForward& to, const nn::FeedForward& from) {
  to.fc.weight.value = from.fc.weight.value.clone();
  to.fc.bias.value = from.fc.bias.value.clone();
  to.proj.weight.value = from.proj.weight.value.clone();
  to.proj.bias.value = from.proj.bias.value.clone();
}

TEST(FusedLayerKernels, FeedForwardMatchesTheModuleChainInFloat32) {
  nn::GPTConfig cfg;
  cfg.emb_dim = 24;
  Generator gen(5);
  nn::FeedForward fused(cfg, gen, nn::LayerImpl::kKernel);
  nn::FeedForward chain(cfg, gen, nn::LayerImpl::kReference);
  copy_weights(chain, fused);
  const Tensor x = random_tensor({3, 7, 24}, 34), residual = random_tensor({3, 7, 24}, 35);
  const Tensor dy = random_tensor({3, 7, 24}, 36);
  for (const bool with_residual : {false, true}) {
    const std::string what = with_residual ? "forward_add" : "forward";
    for (nn::FeedForward* ff : {&fused, &chain}) ff->zero_grad();
    const Tensor y = with_residual ? fused.forward_add(x, residual) : fused.forward(x);
    const Tensor y_want = with_residual ? add(chain.forward(x), residual) : chain.forward(x);
    expect_near_rel(y, y_want, 1e-5, "FeedForward fp32 y, " + what);
    expect_near_rel(fused.backward(dy), chain.backward(dy), 1e-5, "FeedForward fp32 dx, " + what);
    expect_near_rel(fused.fc.weight.grad, chain.fc.weight.grad, 1e-5, "fc dW, " + what);
    expect_near_rel(fused.fc.bias.grad, chain.fc.bias.grad, 1e-5, "fc db, " + what);
    expect_near_rel(fused.proj.weight.grad, chain.proj.weight.grad, 1e-5, "proj dW, " + what);
    expect_near_rel(fused.proj.bias.grad, chain.proj.bias.grad, 1e-5, "proj db, " + what);
  }
}

// bf16: the same bf16 operands as the chain of bf16-mode modules (Linear,
// GELU with bf16 out, Linear), so only the order of float sums differs; on
// every gemm_bf16 route (the fused layer's operands are made once in the
// route's form, attn/bf16_operand.h; the chain's Linear products are
// gemm_bf16's own), three steps each so that the later ones reuse the buffers.
void feed_forward_matches_the_module_chain_in_bf16();
TEST(FusedLayerKernels, FeedForwardMatchesTheModuleChainInBf16) {
  for (const std::string& route : gemm::gemm_bf16_routes()) {
    const GemmBf16RouteGuard guard(route);
    ASSERT_TRUE(guard.forced());
    SCOPED_TRACE("gemm_bf16 route " + route);
    feed_forward_matches_the_module_chain_in_bf16();
  }
}

void feed_forward_matches_the_module_chain_in_bf16() {
  nn::GPTConfig cfg;
  cfg.emb_dim = 32;
  Generator gen(6);
  nn::FeedForward fused(cfg, gen, nn::LayerImpl::kKernel, DType::kBFloat16);
  nn::FeedForward chain(cfg, gen, nn::LayerImpl::kKernel, DType::kBFloat16);
  copy_weights(chain, fused);
  const Tensor x = random_tensor({2, 9, 32}, 37), residual = random_tensor({2, 9, 32}, 38);
  const Tensor dy = random_tensor({2, 9, 32}, 39);
  for (const bool bf16_input : {false, true, false}) {
    const Tensor xin = bf16_input ? x.to(DType::kBFloat16) : x;
    for (nn::FeedForward* ff : {&fused, &chain}) ff->zero_grad();
    const Tensor y = fused.forward_add(xin, residual);
    // The chain, module by module (what FeedForward ran before the fusion).
    const Tensor y_want =
        add(chain.proj.forward(chain.gelu.forward(chain.fc.forward(xin))), residual);
    const std::string what = bf16_input ? "bf16 input" : "float32 input";
    expect_near_rel(y, y_want, 1e-5, "FeedForward bf16 y, " + what);
    const Tensor dx_want = chain.fc.backward(chain.gelu.backward(chain.proj.backward(dy)));
    expect_near_rel(fused.backward(dy), dx_want, 1e-5, "FeedForward bf16 dx, " + what);
    expect_near_rel(fused.fc.weight.grad, chain.fc.weight.grad, 1e-5, "bf16 fc dW, " + what);
    expect_near_rel(fused.fc.bias.grad, chain.fc.bias.grad, 1e-5, "bf16 fc db, " + what);
    expect_near_rel(fused.proj.weight.grad, chain.proj.weight.grad, 1e-5, "bf16 proj dW, " + what);
    expect_near_rel(fused.proj.bias.grad, chain.proj.bias.grad, 1e-5, "bf16 proj db, " + what);
  }
}

TEST(FusedLayerKernels, FeedForwardRejectsBadInput) {
  nn::GPTConfig cfg;
  cfg.emb_dim = 8;
  Generator gen(7);
  nn::FeedForward ff(cfg, gen);
  EXPECT_THROW(ff.forward(random_tensor({2, 7}, 40)), std::invalid_argument);
  EXPECT_THROW(ff.forward(random_tensor({2, 8}, 40).to(DType::kBFloat16)), std::invalid_argument);
  const Tensor y = ff.forward(random_tensor({2, 8}, 41));
  EXPECT_THROW(ff.backward(random_tensor({2, 9}, 42)), std::invalid_argument);
}

}  // namespace
}  // namespace attn::test
