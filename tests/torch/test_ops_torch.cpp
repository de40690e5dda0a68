// attn/ops.h against PyTorch 1.13 (tests/torch/oracle_ops.py): every op on
// seeded random inputs, broadcasting, batched matmul, softmax over each dim.
//
// Ops without rounding choices (+, -, *, / element-wise, copies, masks, max)
// must match bit for bit. The others (exp, sqrt, sums, matmul, softmax) may
// round differently from PyTorch's vectorised kernels and BLAS calls and are
// compared element-wise with
//   |ours - torch| <= 1e-6 * |torch| + 1e-6 * max|torch|,
// a relative tolerance of 1e-6 per element plus 1e-6 of the tensor's largest
// magnitude for entries near 0 that come out of cancellation (a dot product
// of terms of size ~1 that sums to ~0 carries absolute error ~1e-7).
// NaN must meet NaN and infinities must be equal.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <map>
#include <set>
#include <string>

#include "attn/ops.h"
#include "oracle.h"

using attn::Tensor;
using nlohmann::json;

namespace {

constexpr double kRtol = 1e-6;
constexpr double kAtolOfMax = 1e-6;

const json& cases() {
  static const json all = attn::test::read_oracle_json("ops.json", "oracle_ops.py").at("cases");
  return all;
}

Tensor input(const json& c, size_t i) {
  return attn::test::tensor_from_bits_json(c.at("inputs").at(i));
}

std::vector<Tensor> all_inputs(const json& c) {
  std::vector<Tensor> out;
  for (size_t i = 0; i < c.at("inputs").size(); ++i) out.push_back(input(c, i));
  return out;
}

// Runs the op a case names, with its arguments, through attn.
Tensor run(const json& c) {
  const std::string op = c.at("op");
  const json& args = c.at("args");
  auto dim = [&] { return args.at("dim").get<int64_t>(); };
  auto keepdim = [&] { return args.at("keepdim").get<bool>(); };
  auto scalar = [&] { return static_cast<float>(args.at("s").get<double>()); };
  if (op == "add") return attn::add(input(c, 0), input(c, 1));
  if (op == "sub") return attn::sub(input(c, 0), input(c, 1));
  if (op == "mul") return attn::mul(input(c, 0), input(c, 1));
  if (op == "div") return attn::div(input(c, 0), input(c, 1));
  if (op == "add_scalar") return input(c, 0) + scalar();
  if (op == "sub_scalar") return input(c, 0) - scalar();
  if (op == "mul_scalar") return input(c, 0) * scalar();
  if (op == "div_scalar") return input(c, 0) / scalar();
  if (op == "neg") return -input(c, 0);
  if (op == "exp") return attn::exp(input(c, 0));
  if (op == "sqrt") return attn::sqrt(input(c, 0));
  if (op == "iadd") {
    Tensor a = input(c, 0);
    a += input(c, 1);
    return a;
  }
  if (op == "sum") return attn::sum(input(c, 0), dim(), keepdim());
  if (op == "mean") return attn::mean(input(c, 0), dim(), keepdim());
  if (op == "max") return attn::max(input(c, 0), dim(), keepdim());
  if (op == "sum_all") return Tensor(attn::Shape{}, std::vector<float>{attn::sum_all(input(c, 0))});
  if (op == "matmul") return attn::matmul(input(c, 0), input(c, 1));
  if (op == "dot")
    return Tensor(attn::Shape{}, std::vector<float>{attn::dot(input(c, 0), input(c, 1))});
  if (op == "transpose") return attn::transpose(input(c, 0), args.at("dim0"), args.at("dim1"));
  if (op == "t") return attn::t(input(c, 0));
  if (op == "select") return attn::select(input(c, 0), dim(), args.at("i").get<int64_t>());
  if (op == "slice") return attn::slice(input(c, 0), dim(), args.at("start"), args.at("end"));
  if (op == "cat") return attn::cat(all_inputs(c), dim());
  if (op == "stack") return attn::stack(all_inputs(c), dim());
  if (op == "unsqueeze") return attn::unsqueeze(input(c, 0), dim());
  if (op == "squeeze") return attn::squeeze(input(c, 0), dim());
  if (op == "tril") return attn::tril(input(c, 0), args.at("diagonal"));
  if (op == "triu") return attn::triu(input(c, 0), args.at("diagonal"));
  if (op == "masked_fill") {
    // The fill value comes as text ("-inf", "0.5"): JSON has no infinity.
    const float value = std::stof(args.at("value").get<std::string>());
    return attn::masked_fill(input(c, 0), input(c, 1), value);
  }
  if (op == "softmax") return attn::softmax(input(c, 0), dim());
  if (op == "softmax_naive") return attn::softmax_naive(input(c, 0), dim());
  if (op == "normalize_sum") return attn::normalize_sum(input(c, 0), dim());
  ADD_FAILURE() << "unknown op " << op;
  return Tensor();
}

struct Worst {
  double rel = 0.0;  // largest |ours - torch| / |torch| over elements with torch != 0
  double abs = 0.0;  // largest |ours - torch|
  int cases = 0;
};

// Compares every case whose op is in `ops`; returns the worst errors per op.
void check_ops(const std::set<std::string>& ops) {
  std::map<std::string, Worst> worst;
  int n = 0;
  for (size_t k = 0; k < cases().size(); ++k) {
    const json& c = cases()[k];
    const std::string op = c.at("op");
    if (!ops.count(op)) continue;
    ++n;
    SCOPED_TRACE("case " + std::to_string(k) + ": " + op + " " + c.at("args").dump());
    const Tensor expected = attn::test::tensor_from_bits_json(c.at("out"));
    const Tensor got = run(c);
    ASSERT_EQ(attn::shape_str(got.shape()), attn::shape_str(expected.shape()));
    const bool exact = c.at("exact");
    double max_ref = 0.0;
    for (float y : expected.values())
      if (std::isfinite(y)) max_ref = std::max(max_ref, std::fabs(static_cast<double>(y)));
    Worst& w = worst[op];
    ++w.cases;
    int reported = 0;
    for (int64_t i = 0; i < got.numel(); ++i) {
      const float x = got[i], y = expected[i];
      bool ok;
      if (std::isnan(y) || std::isnan(x)) {
        ok = std::isnan(x) && std::isnan(y);
      } else if (exact || std::isinf(y) || std::isinf(x)) {
        ok = x == y && std::signbit(x) == std::signbit(y);
      } else {
        const double err = std::fabs(static_cast<double>(x) - y);
        ok = err <= kRtol * std::fabs(static_cast<double>(y)) + kAtolOfMax * max_ref;
        w.abs = std::max(w.abs, err);
        if (y != 0.0f) w.rel = std::max(w.rel, err / std::fabs(static_cast<double>(y)));
      }
      if (!ok && reported++ < 5)
        ADD_FAILURE() << "element " << i << ": attn " << x << ", torch " << y;
    }
  }
  EXPECT_GT(n, 0) << "no oracle cases for these ops";
  for (const std::string& op : ops)  // an op without a case would pass unchecked
    EXPECT_EQ(worst.count(op), 1u) << "no oracle case for op " << op;
  for (const auto& [op, w] : worst) {
    std::printf("  %-14s %3d cases, largest error: %.3g relative, %.3g absolute\n", op.c_str(),
                w.cases, w.rel, w.abs);
  }
}

}  // namespace

TEST(OpsTorch, ElementwiseAndBroadcasting) {
  check_ops({"add", "sub", "mul", "div", "add_scalar", "sub_scalar", "mul_scalar", "div_scalar",
             "neg", "exp", "sqrt", "iadd"});
}

TEST(OpsTorch, ReductionsOverEveryDim) { check_ops({"sum", "mean", "max", "sum_all"}); }

TEST(OpsTorch, MatmulAllForms) { check_ops({"matmul", "dot"}); }

TEST(OpsTorch, ShapeOps) {
  check_ops({"transpose", "t", "select", "slice", "cat", "stack", "unsqueeze", "squeeze"});
}

TEST(OpsTorch, MasksAndSoftmax) {
  check_ops({"tril", "triu", "masked_fill", "softmax", "softmax_naive", "normalize_sum"});
}
