// Numerics of the reference kernels on the small float types: results are rounded once, to nearest
// even, and sums accumulate in at least fp32 (checked with cases that a narrower accumulator gets wrong).
#include <gtest/gtest.h>

#include <cmath>

#include "op_test_util.h"

using namespace tessel;
using namespace tessel::testenv;

namespace {
Tensor half(DType t, Shape s, std::vector<double> v) { return Tensor::from_f64(t, std::move(s), v); }
}  // namespace

TEST(KernelNumerics, Float16AddRoundsTiesToEven) {
  const double u = std::ldexp(1.0, -11);  // half an ulp of 1.0 in f16
  // 1 + u is a tie between 1 (even) and 1 + 2u: rounds to 1. (1 + 2u) + u ties between 1 + 2u (odd)
  // and 1 + 4u (even): rounds up.
  auto y = run_op("Add", {half(DType::f16, {2}, {1.0, 1.0 + 2 * u}), half(DType::f16, {2}, {u, u})});
  EXPECT_EQ(y[0].data<uint16_t>()[0], 0x3C00);
  EXPECT_EQ(y[0].data<uint16_t>()[1], 0x3C02);
}

TEST(KernelNumerics, BFloat16MatMulAccumulatesWide) {
  // 300 ones dotted with ones: a bf16 accumulator sticks at 256 (256 + 1 rounds back to 256);
  // 300 itself is representable in bf16.
  std::vector<double> ones(300, 1.0);
  auto y = run_op("MatMul", {half(DType::bf16, {1, 300}, ones), half(DType::bf16, {300, 1}, ones)});
  EXPECT_EQ(y[0].dtype(), DType::bf16);
  EXPECT_EQ(y[0].get_f(0), 300.0);
}

TEST(KernelNumerics, Float16ReduceSumAccumulatesWide) {
  // 4096 copies of 1.0 in f16: an f16 accumulator stops at 2048 (2048 + 1 is a tie to even 2048).
  std::vector<double> ones(4096, 1.0);
  auto y = run_op("ReduceSum", {half(DType::f16, {4096}, ones)});
  EXPECT_EQ(y[0].get_f(0), 4096.0);
}

TEST(KernelNumerics, Float16SoftmaxStaysFloat16) {
  // softmax([0, ln 3]) = [0.25, 0.75]; ln 3 itself is rounded to f16, hence the tolerance.
  auto y = run_op("Softmax", {half(DType::f16, {2}, {0.0, std::log(3.0)})});
  EXPECT_NEAR(y[0].get_f(0), 0.25, 1e-3);
  EXPECT_NEAR(y[0].get_f(1), 0.75, 1e-3);
  EXPECT_EQ(y[0].dtype(), DType::f16);
}
