// Core-level primitives (docs/ir/core.md): reference kernels checked against hand-computed
// values, and the shape/dtype rules that reject anything implicit.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "tessel/ir/infer.h"
#include "tessel/ir/op_registry.h"
#include "tessel/runtime/interpreter.h"
#include "tessel/support/error.h"
#include "op_test_util.h"

using namespace tessel;
using namespace tessel::testenv;

namespace {
using Ints = std::vector<int64_t>;
constexpr double kPi = 3.14159265358979323846;
Attr s(const char* v) { return std::string(v); }
Attr i(int64_t v) { return v; }
std::vector<int64_t> as_ints(const Tensor& t) { return t.to_i64(); }
}  // namespace

TEST(Core, AllThirtyEightRegistered) {
  const char* names[] = {"neg", "exp", "log", "sqrt", "sin", "atan", "erf", "tanh", "floor", "round_even",
                         "add", "mul", "div", "rem", "pow", "max", "min", "and", "or", "xor",
                         "compare", "select", "convert", "bitcast_convert", "reduce", "reduce_window",
                         "dot_general", "convolution", "broadcast_in_dim", "reshape", "transpose", "slice",
                         "pad", "concatenate", "gather", "scatter", "iota", "sort"};
  EXPECT_EQ(std::size(names), 38u);
  for (const char* n : names) EXPECT_NE(OpRegistry::get().find(n), nullptr) << n;
  EXPECT_EQ(OpRegistry::get().find("dot_general")->fusion, FusionKind::matmul);
  EXPECT_EQ(OpRegistry::get().find("scatter")->fusion, FusionKind::opaque);
  EXPECT_EQ(OpRegistry::get().find("reduce_window")->fusion, FusionKind::reduction);
  EXPECT_EQ(OpRegistry::get().find("gather")->fusion, FusionKind::injective);
}

TEST(Core, Unary) {
  expect_near(run_op("neg", {f32({2}, {1, -2})})[0], {-1, 2});
  EXPECT_EQ(as_ints(run_op("neg", {i64({2}, {3, -4})})[0]), (Ints{-3, 4}));
  expect_near(run_op("exp", {f32({2}, {0, 1})})[0], {1, std::exp(1.0)});
  expect_near(run_op("log", {f32({2}, {1, std::exp(2.0)})})[0], {0, 2});
  expect_near(run_op("sqrt", {f32({2}, {4, 9})})[0], {2, 3});
  expect_near(run_op("sin", {f32({2}, {0, kPi / 2})})[0], {0, 1});
  expect_near(run_op("atan", {f32({2}, {0, 1})})[0], {0, kPi / 4});
  expect_near(run_op("erf", {f32({2}, {0, 1})})[0], {0, 0.8427007929});
  expect_near(run_op("tanh", {f32({2}, {0, 1})})[0], {0, 0.7615941560});
  expect_near(run_op("floor", {f32({3}, {1.5, -1.5, 2})})[0], {1, -2, 2});
  expect_near(run_op("round_even", {f32({6}, {0.5, 1.5, 2.5, -2.5, 2.6, -0.4})})[0], {0, 2, 2, -2, 3, -0});
  // Float-only ops reject integers.
  EXPECT_THROW(run_op("exp", {i64({1}, {1})}), Error);
}

TEST(Core, BinaryFloat) {
  auto a = f32({4}, {7, -7, 2, 9});
  auto b = f32({4}, {2, 2, 3, 0.5});
  expect_near(run_op("add", {a, b})[0], {9, -5, 5, 9.5});
  expect_near(run_op("mul", {a, b})[0], {14, -14, 6, 4.5});
  expect_near(run_op("div", {a, b})[0], {3.5, -3.5, 2.0 / 3.0, 18});
  expect_near(run_op("rem", {a, b})[0], {1, -1, 2, 0});  // fmod keeps the dividend's sign
  expect_near(run_op("pow", {a, b})[0], {49, 49, 8, 3});
  expect_near(run_op("max", {a, b})[0], {7, 2, 3, 9});
  expect_near(run_op("min", {a, b})[0], {2, -7, 2, 0.5});
}

TEST(Core, BinaryInt) {
  auto a = i64({4}, {7, -7, 2, 5});
  auto b = i64({4}, {2, 2, 3, 3});
  EXPECT_EQ(as_ints(run_op("div", {a, b})[0]), (Ints{3, -3, 0, 1}));  // truncates
  EXPECT_EQ(as_ints(run_op("rem", {a, b})[0]), (Ints{1, -1, 2, 2}));
  EXPECT_EQ(as_ints(run_op("pow", {a, b})[0]), (Ints{49, 49, 8, 125}));
  EXPECT_EQ(as_ints(run_op("and", {a, b})[0]), (Ints{2, 0, 2, 1}));
  EXPECT_EQ(as_ints(run_op("or", {a, b})[0]), (Ints{7, -5, 3, 7}));
  EXPECT_EQ(as_ints(run_op("xor", {a, b})[0]), (Ints{5, -5, 1, 6}));
  // int8 wraps: 100 + 100 = -56.
  auto w = run_op("add", {ints(DType::i8, {1}, {100}), ints(DType::i8, {1}, {100})});
  EXPECT_EQ(w[0].get_i(0), -56);
  // Logical on bool.
  auto t = ints(DType::boolean, {4}, {0, 0, 1, 1});
  auto u = ints(DType::boolean, {4}, {0, 1, 0, 1});
  EXPECT_EQ(as_ints(run_op("and", {t, u})[0]), (Ints{0, 0, 0, 1}));
  EXPECT_EQ(as_ints(run_op("xor", {t, u})[0]), (Ints{0, 1, 1, 0}));
  // Errors: integer division by zero, negative integer exponent, bitwise ops on floats.
  EXPECT_THROW(run_op("div", {i64({1}, {1}), i64({1}, {0})}), Error);
  EXPECT_THROW(run_op("rem", {i64({1}, {1}), i64({1}, {0})}), Error);
  EXPECT_THROW(run_op("pow", {i64({1}, {2}), i64({1}, {-1})}), Error);
  EXPECT_THROW(run_op("and", {f32({1}, {1}), f32({1}, {1})}), Error);
}

TEST(Core, ElementwiseRejectsImplicitBroadcastAndPromotion) {
  EXPECT_THROW(run_op("add", {f32({2, 3}, {1, 2, 3, 4, 5, 6}), f32({3}, {1, 2, 3})}), Error);
  EXPECT_THROW(run_op("add", {f32({2}, {1, 2}), f32({1}, {1})}), Error);
  EXPECT_THROW(run_op("add", {f32({2}, {1, 2}), Tensor::from_f64(DType::f64, {2}, std::vector<double>{1, 2})}),
               Error);
  EXPECT_THROW(run_op("mul", {f32({1}, {1}), i64({1}, {1})}), Error);
  EXPECT_THROW(run_op("compare", {f32({1}, {1}), i64({1}, {1})}, 1, {{"direction", s("eq")}}), Error);
}

TEST(Core, CompareAndSelect) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  auto a = f32({3}, {1, 2, nan});
  auto b = f32({3}, {2, 2, nan});
  EXPECT_EQ(as_ints(run_op("compare", {a, b}, 1, {{"direction", s("lt")}})[0]), (Ints{1, 0, 0}));
  EXPECT_EQ(as_ints(run_op("compare", {a, b}, 1, {{"direction", s("le")}})[0]), (Ints{1, 1, 0}));
  EXPECT_EQ(as_ints(run_op("compare", {a, b}, 1, {{"direction", s("eq")}})[0]), (Ints{0, 1, 0}));
  EXPECT_EQ(as_ints(run_op("compare", {a, b}, 1, {{"direction", s("ne")}})[0]), (Ints{1, 0, 1}));
  EXPECT_EQ(as_ints(run_op("compare", {a, b}, 1, {{"direction", s("ge")}})[0]), (Ints{0, 1, 0}));
  auto g = run_op("compare", {i64({2}, {3, 1}), i64({2}, {2, 2})}, 1, {{"direction", s("gt")}});
  EXPECT_EQ(g[0].dtype(), DType::boolean);
  EXPECT_EQ(as_ints(g[0]), (Ints{1, 0}));
  EXPECT_THROW(run_op("compare", {a, b}, 1, {{"direction", s("lte")}}), Error);

  auto p = ints(DType::boolean, {3}, {1, 0, 1});
  expect_near(run_op("select", {p, f32({3}, {1, 2, 3}), f32({3}, {-1, -2, -3})})[0], {1, -2, 3});
  EXPECT_THROW(run_op("select", {f32({3}, {1, 0, 1}), f32({3}, {1, 2, 3}), f32({3}, {1, 2, 3})}), Error);
  EXPECT_THROW(run_op("select", {p, f32({3}, {1, 2, 3}), i64({3}, {1, 2, 3})}), Error);
}

TEST(Core, ConvertAndBitcast) {
  auto y = run_op("convert", {f32({3}, {1.7, -1.7, 300})}, 1, {{"dtype", s("i8")}});
  EXPECT_EQ(y[0].dtype(), DType::i8);
  EXPECT_EQ(y[0].get_i(0), 1);
  EXPECT_EQ(y[0].get_i(1), -1);
  auto h = run_op("convert", {i64({2}, {3, -2})}, 1, {{"dtype", s("f16")}});
  EXPECT_EQ(h[0].dtype(), DType::f16);
  expect_near(h[0], {3, -2});
  // float8 e4m3fn: 1000 saturates to 448 by default; with saturate 0 it becomes NaN.
  auto f8 = run_op("convert", {f32({1}, {1000})}, 1, {{"dtype", s("f8e4m3fn")}});
  expect_near(f8[0], {448});
  auto f8n = run_op("convert", {f32({1}, {1000})}, 1, {{"dtype", s("f8e4m3fn")}, {"saturate", i(0)}});
  EXPECT_TRUE(std::isnan(f8n[0].get_f(0)));
  auto bo = run_op("convert", {f32({3}, {0, 0.5, -2})}, 1, {{"dtype", s("bool")}});
  EXPECT_EQ(as_ints(bo[0]), (Ints{0, 1, 1}));
  EXPECT_THROW(run_op("convert", {f32({1}, {1})}, 1, {{"dtype", s("float32")}}), Error);

  // 1.0f is 0x3F800000.
  auto b = run_op("bitcast_convert", {f32({1}, {1.0})}, 1, {{"dtype", s("i32")}});
  EXPECT_EQ(b[0].get_i(0), 0x3F800000);
  auto u = run_op("bitcast_convert", {ints(DType::i8, {2}, {-1, 5})}, 1, {{"dtype", s("u8")}});
  EXPECT_EQ(as_ints(u[0]), (Ints{255, 5}));
  EXPECT_THROW(run_op("bitcast_convert", {f32({1}, {1.0})}, 1, {{"dtype", s("i64")}}), Error);
}

TEST(Core, Reduce) {
  auto x = f32({2, 3}, {1, 2, 3, 4, 5, 6});
  auto sum1 = run_op("reduce", {x}, 1, {{"kind", s("sum")}, {"axes", Ints{1}}});
  EXPECT_EQ(sum1[0].shape(), (Shape{2}));
  expect_near(sum1[0], {6, 15});
  auto max0 = run_op("reduce", {x}, 1, {{"kind", s("max")}, {"axes", Ints{0}}});
  expect_near(max0[0], {4, 5, 6});
  auto prod = run_op("reduce", {x}, 1, {{"kind", s("prod")}, {"axes", Ints{0, 1}}});
  EXPECT_EQ(prod[0].shape(), Shape{});
  expect_near(prod[0], {720});
  auto none = run_op("reduce", {x}, 1, {{"kind", s("min")}, {"axes", Ints{}}});
  expect_near(none[0], {1, 2, 3, 4, 5, 6});
  // Empty sets: identities.
  auto e = f32({2, 0}, {});
  expect_near(run_op("reduce", {e}, 1, {{"kind", s("sum")}, {"axes", Ints{1}}})[0], {0, 0});
  expect_near(run_op("reduce", {e}, 1, {{"kind", s("prod")}, {"axes", Ints{1}}})[0], {1, 1});
  auto mx = run_op("reduce", {e}, 1, {{"kind", s("max")}, {"axes", Ints{1}}});
  EXPECT_TRUE(std::isinf(mx[0].get_f(0)) && mx[0].get_f(0) < 0);
  auto mi = run_op("reduce", {ints(DType::i32, {0}, {})}, 1, {{"kind", s("min")}, {"axes", Ints{0}}});
  EXPECT_EQ(mi[0].get_i(0), std::numeric_limits<int32_t>::max());
  auto is = run_op("reduce", {ints(DType::i32, {3}, {5, -2, 7})}, 1, {{"kind", s("max")}, {"axes", Ints{0}}});
  EXPECT_EQ(is[0].get_i(0), 7);
  // Rejections: repeated, unsorted, out-of-range axes; unknown kind.
  EXPECT_THROW(run_op("reduce", {x}, 1, {{"kind", s("sum")}, {"axes", Ints{1, 1}}}), Error);
  EXPECT_THROW(run_op("reduce", {x}, 1, {{"kind", s("sum")}, {"axes", Ints{1, 0}}}), Error);
  EXPECT_THROW(run_op("reduce", {x}, 1, {{"kind", s("sum")}, {"axes", Ints{2}}}), Error);
  EXPECT_THROW(run_op("reduce", {x}, 1, {{"kind", s("sum")}, {"axes", Ints{-1}}}), Error);
  EXPECT_THROW(run_op("reduce", {x}, 1, {{"kind", s("mean")}, {"axes", Ints{1}}}), Error);
}

TEST(Core, ReduceWindowMaxPool) {
  // 4x4 input, 2x2 window, stride 2.
  auto x = f32({1, 1, 4, 4}, {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16});
  auto y = run_op("reduce_window", {x}, 1,
                  {{"kind", s("max")}, {"window", Ints{1, 1, 2, 2}}, {"strides", Ints{1, 1, 2, 2}}});
  EXPECT_EQ(y[0].shape(), (Shape{1, 1, 2, 2}));
  expect_near(y[0], {6, 8, 14, 16});
  // 3-wide window over [1,5,2,4] padded by 1 each side (padding is -inf for max): [5,5,5,4].
  auto p = run_op("reduce_window", {f32({4}, {1, 5, 2, 4})}, 1,
                  {{"kind", s("max")}, {"window", Ints{3}}, {"padding", Ints{1, 1}}});
  expect_near(p[0], {5, 5, 5, 4});
  // Dilation 2, window 2: pairs (0,2), (1,3): sums 4 and 6... min of [1,5,2,4] at (0,2)=1, (1,3)=4.
  auto d = run_op("reduce_window", {f32({4}, {1, 5, 2, 4})}, 1,
                  {{"kind", s("min")}, {"window", Ints{2}}, {"dilations", Ints{2}}});
  expect_near(d[0], {1, 4});
}

TEST(Core, ReduceWindowCumsum) {
  // cumsum of n = 4 elements: window 4, padding low 3.
  auto y = run_op("reduce_window", {f32({4}, {1, 2, 3, 4})}, 1,
                  {{"kind", s("sum")}, {"window", Ints{4}}, {"padding", Ints{3, 0}}});
  EXPECT_EQ(y[0].shape(), (Shape{4}));
  expect_near(y[0], {1, 3, 6, 10});
  // cumprod on ints along axis 1 of [2,3].
  auto p = run_op("reduce_window", {i64({2, 3}, {1, 2, 3, 2, 2, 2})}, 1,
                  {{"kind", s("prod")}, {"window", Ints{1, 3}}, {"padding", Ints{0, 0, 2, 0}}});
  EXPECT_EQ(as_ints(p[0]), (Ints{1, 2, 6, 2, 4, 8}));
  EXPECT_THROW(run_op("reduce_window", {f32({4}, {1, 2, 3, 4})}, 1, {{"kind", s("sum")}, {"window", Ints{2, 2}}}),
               Error);
}

TEST(Core, DotGeneralMatmul) {
  // [2,3] x [3,2] contracting lhs 1 with rhs 0.
  auto a = f32({2, 3}, {1, 2, 3, 4, 5, 6});
  auto b = f32({3, 2}, {1, 0, 0, 1, 1, 1});
  auto y = run_op("dot_general", {a, b}, 1, {{"lhs_contract", Ints{1}}, {"rhs_contract", Ints{0}}});
  EXPECT_EQ(y[0].shape(), (Shape{2, 2}));
  expect_near(y[0], {4, 5, 10, 11});
  // a · aᵀ by contracting both dim 1: [[14, 32], [32, 77]].
  auto g = run_op("dot_general", {a, a}, 1, {{"lhs_contract", Ints{1}}, {"rhs_contract", Ints{1}}});
  expect_near(g[0], {14, 32, 32, 77});
  // Outer product: no contraction.
  auto o = run_op("dot_general", {f32({2}, {1, 2}), f32({3}, {1, 10, 100})}, 1,
                  {{"lhs_contract", Ints{}}, {"rhs_contract", Ints{}}});
  EXPECT_EQ(o[0].shape(), (Shape{2, 3}));
  expect_near(o[0], {1, 10, 100, 2, 20, 200});
  // Integer dot.
  auto iy = run_op("dot_general", {i64({2}, {3, 4}), i64({2}, {5, 6})}, 1,
                   {{"lhs_contract", Ints{0}}, {"rhs_contract", Ints{0}}});
  EXPECT_EQ(iy[0].shape(), Shape{});
  EXPECT_EQ(iy[0].get_i(0), 39);
}

TEST(Core, DotGeneralBatchPermutations) {
  // lhs [K=2, B=2, M=1], rhs [N=2, B=2, K=2]; batch lhs 1 / rhs 1, contract lhs 0 / rhs 2.
  // lhs[k][b][0]: b0: k0=1, k1=2; b1: k0=3, k1=4.
  auto lhs = f32({2, 2, 1}, {1, 3, 2, 4});
  // rhs[n][b][k]: n0,b0 = [1,0]; n0,b1 = [1,1]; n1,b0 = [0,1]; n1,b1 = [2,0].
  auto rhs = f32({2, 2, 2}, {1, 0, 1, 1, 0, 1, 2, 0});
  auto y = run_op("dot_general", {lhs, rhs}, 1,
                  {{"lhs_batch", Ints{1}}, {"rhs_batch", Ints{1}}, {"lhs_contract", Ints{0}},
                   {"rhs_contract", Ints{2}}});
  // Output [B, M, N]: b0: n0 = 1*1+2*0 = 1, n1 = 1*0+2*1 = 2; b1: n0 = 3+4 = 7, n1 = 6.
  EXPECT_EQ(y[0].shape(), (Shape{2, 1, 2}));
  expect_near(y[0], {1, 2, 7, 6});
  // Two contracting dims in swapped order: lhs [2,3] contract (1,0) with rhs [3,2] contract (0,1):
  // sum over i,j of a[i][j] * b[j][i] = trace(a·b) = 4 + 11 = 15.
  auto a = f32({2, 3}, {1, 2, 3, 4, 5, 6});
  auto b = f32({3, 2}, {1, 0, 0, 1, 1, 1});
  auto t = run_op("dot_general", {a, b}, 1, {{"lhs_contract", Ints{1, 0}}, {"rhs_contract", Ints{0, 1}}});
  EXPECT_EQ(t[0].shape(), Shape{});
  expect_near(t[0], {15});
  // Batch dims come first even when they are last in the operands: lhs [M=2, B=2], rhs [B=2].
  auto u = run_op("dot_general", {f32({2, 2}, {1, 2, 3, 4}), f32({2}, {10, 100})}, 1,
                  {{"lhs_batch", Ints{1}}, {"rhs_batch", Ints{0}}, {"lhs_contract", Ints{}}, {"rhs_contract", Ints{}}});
  EXPECT_EQ(u[0].shape(), (Shape{2, 2}));
  expect_near(u[0], {10, 30, 200, 400});  // [b][m]
  // Rejections: size mismatch, dim listed twice, dtype mismatch.
  EXPECT_THROW(run_op("dot_general", {a, a}, 1, {{"lhs_contract", Ints{1}}, {"rhs_contract", Ints{0}}}), Error);
  EXPECT_THROW(run_op("dot_general", {a, b}, 1,
                      {{"lhs_batch", Ints{1}}, {"rhs_batch", Ints{0}}, {"lhs_contract", Ints{1}}, {"rhs_contract", Ints{0}}}),
               Error);
  EXPECT_THROW(run_op("dot_general", {a, i64({3, 2}, {1, 2, 3, 4, 5, 6})}, 1,
                      {{"lhs_contract", Ints{1}}, {"rhs_contract", Ints{0}}}),
               Error);
}

TEST(Core, Convolution) {
  // 1-D: input [1,1,4] = [1,2,3,4], weight [1,1,2] = [1,1]: [3,5,7].
  auto x = f32({1, 1, 4}, {1, 2, 3, 4});
  auto w = f32({1, 1, 2}, {1, 1});
  auto y = run_op("convolution", {x, w});
  EXPECT_EQ(y[0].shape(), (Shape{1, 1, 3}));
  expect_near(y[0], {3, 5, 7});
  // Padding 1/1 and stride 2: padded [0,1,2,3,4,0]: positions 0,2,4 -> [1, 5, 4].
  auto p = run_op("convolution", {x, w}, 1, {{"padding", Ints{1, 1}}, {"strides", Ints{2}}});
  expect_near(p[0], {1, 5, 4});
  // Dilation 2: taps (0,2), (1,3): [4, 6].
  auto d = run_op("convolution", {x, w}, 1, {{"dilations", Ints{2}}});
  expect_near(d[0], {4, 6});
  // Groups 2: channels [1,2] and [10,20], weights [1] and [2] (1x1 kernels): [1,2], [20,40].
  auto g = run_op("convolution", {f32({1, 2, 2}, {1, 2, 10, 20}), f32({2, 1, 1}, {1, 2})}, 1,
                  {{"groups", i(2)}});
  EXPECT_EQ(g[0].shape(), (Shape{1, 2, 2}));
  expect_near(g[0], {1, 2, 20, 40});
  // 2-D, 2 input channels summed, 2x2 kernel of ones on 3x3 inputs [1..9] and all-ones.
  std::vector<double> in(18);
  for (int k = 0; k < 9; ++k) in[k] = k + 1, in[9 + k] = 1;
  auto c2 = run_op("convolution", {f32({1, 2, 3, 3}, in), f32({1, 2, 2, 2}, std::vector<double>(8, 1))});
  EXPECT_EQ(c2[0].shape(), (Shape{1, 1, 2, 2}));
  expect_near(c2[0], {12 + 4, 16 + 4, 24 + 4, 28 + 4});
  // Rejections: channels not matching C/groups, dtype mismatch.
  EXPECT_THROW(run_op("convolution", {f32({1, 2, 2}, {1, 2, 3, 4}), f32({1, 1, 1}, {1})}), Error);
  EXPECT_THROW(run_op("convolution", {x, Tensor::from_f64(DType::f64, {1, 1, 2}, std::vector<double>{1, 1})}),
               Error);
}

TEST(Core, BroadcastInDim) {
  // [3] -> [2,3] along dim 1.
  auto y = run_op("broadcast_in_dim", {f32({3}, {1, 2, 3})}, 1, {{"shape", Ints{2, 3}}, {"dims", Ints{1}}});
  expect_near(y[0], {1, 2, 3, 1, 2, 3});
  // [2,1] -> [2,3,2]: dims {0, 2}; size-1 dim broadcasts.
  auto z = run_op("broadcast_in_dim", {f32({2, 1}, {5, 6})}, 1, {{"shape", Ints{2, 3, 2}}, {"dims", Ints{0, 2}}});
  expect_near(z[0], {5, 5, 5, 5, 5, 5, 6, 6, 6, 6, 6, 6});
  // [2] along dim 0 of [2,2]: column broadcast.
  auto c = run_op("broadcast_in_dim", {f32({2}, {1, 2})}, 1, {{"shape", Ints{2, 2}}, {"dims", Ints{0}}});
  expect_near(c[0], {1, 1, 2, 2});
  // Rejections: non-increasing dims, size mismatch.
  EXPECT_THROW(run_op("broadcast_in_dim", {f32({2, 2}, {1, 2, 3, 4})}, 1, {{"shape", Ints{2, 2}}, {"dims", Ints{1, 0}}}),
               Error);
  EXPECT_THROW(run_op("broadcast_in_dim", {f32({2, 2}, {1, 2, 3, 4})}, 1, {{"shape", Ints{2, 2}}, {"dims", Ints{0, 0}}}),
               Error);
  EXPECT_THROW(run_op("broadcast_in_dim", {f32({3}, {1, 2, 3})}, 1, {{"shape", Ints{2, 2}}, {"dims", Ints{1}}}), Error);
}

TEST(Core, ReshapeTranspose) {
  auto x = f32({2, 3}, {1, 2, 3, 4, 5, 6});
  auto r = run_op("reshape", {x}, 1, {{"shape", Ints{3, 2}}});
  EXPECT_EQ(r[0].shape(), (Shape{3, 2}));
  expect_near(r[0], {1, 2, 3, 4, 5, 6});
  EXPECT_THROW(run_op("reshape", {x}, 1, {{"shape", Ints{-1, 2}}}), Error);
  EXPECT_THROW(run_op("reshape", {x}, 1, {{"shape", Ints{4, 2}}}), Error);
  auto t = run_op("transpose", {x}, 1, {{"perm", Ints{1, 0}}});
  EXPECT_EQ(t[0].shape(), (Shape{3, 2}));
  expect_near(t[0], {1, 4, 2, 5, 3, 6});
  // 3-D: [2,1,3] perm (2,0,1) -> [3,2,1].
  auto t3 = run_op("transpose", {f32({2, 1, 3}, {1, 2, 3, 4, 5, 6})}, 1, {{"perm", Ints{2, 0, 1}}});
  EXPECT_EQ(t3[0].shape(), (Shape{3, 2, 1}));
  expect_near(t3[0], {1, 4, 2, 5, 3, 6});
  EXPECT_THROW(run_op("transpose", {x}, 1, {{"perm", Ints{0, 0}}}), Error);
}

TEST(Core, Slice) {
  auto x = f32({6}, {0, 1, 2, 3, 4, 5});
  expect_near(run_op("slice", {x}, 1, {{"starts", Ints{1}}, {"stops", Ints{5}}, {"strides", Ints{2}}})[0], {1, 3});
  // Negative stride: start 4 down to (excluding) 0: [4, 3, 2, 1]; stop -1 reaches element 0.
  expect_near(run_op("slice", {x}, 1, {{"starts", Ints{4}}, {"stops", Ints{0}}, {"strides", Ints{-1}}})[0],
              {4, 3, 2, 1});
  expect_near(run_op("slice", {x}, 1, {{"starts", Ints{5}}, {"stops", Ints{-1}}, {"strides", Ints{-2}}})[0],
              {5, 3, 1});
  // 2-D, with reversal of rows.
  auto m = run_op("slice", {f32({2, 3}, {1, 2, 3, 4, 5, 6})}, 1,
                  {{"starts", Ints{1, 0}}, {"stops", Ints{-1, 2}}, {"strides", Ints{-1, 1}}});
  EXPECT_EQ(m[0].shape(), (Shape{2, 2}));
  expect_near(m[0], {4, 5, 1, 2});
  EXPECT_THROW(run_op("slice", {x}, 1, {{"starts", Ints{0}}, {"stops", Ints{7}}}), Error);
  EXPECT_THROW(run_op("slice", {x}, 1, {{"starts", Ints{0}}, {"stops", Ints{4}}, {"strides", Ints{-1}}}), Error);
  EXPECT_THROW(run_op("slice", {x}, 1, {{"starts", Ints{0}}, {"stops", Ints{4}}, {"strides", Ints{0}}}), Error);
}

TEST(Core, Pad) {
  auto x = f32({3}, {1, 2, 3});
  auto v = f32({}, {9});
  expect_near(run_op("pad", {x, v}, 1, {{"low", Ints{1}}, {"high", Ints{2}}})[0], {9, 1, 2, 3, 9, 9});
  // Interior 1: [1,9,2,9,3].
  expect_near(run_op("pad", {x, v}, 1, {{"low", Ints{0}}, {"high", Ints{0}}, {"interior", Ints{1}}})[0],
              {1, 9, 2, 9, 3});
  // Negative low/high crop: low -1, high 1 -> [2, 3, 9].
  expect_near(run_op("pad", {x, v}, 1, {{"low", Ints{-1}}, {"high", Ints{1}}})[0], {2, 3, 9});
  // Negative high with interior: [1,9,2,9,3] cropped by 2 at the end -> [1,9,2].
  expect_near(run_op("pad", {x, v}, 1, {{"low", Ints{0}}, {"high", Ints{-2}}, {"interior", Ints{1}}})[0], {1, 9, 2});
  // 2-D.
  auto m = run_op("pad", {f32({1, 2}, {1, 2}), f32({}, {0})}, 1, {{"low", Ints{1, 0}}, {"high", Ints{0, 1}}});
  EXPECT_EQ(m[0].shape(), (Shape{2, 3}));
  expect_near(m[0], {0, 0, 0, 1, 2, 0});
  EXPECT_THROW(run_op("pad", {x, f32({1}, {0})}, 1, {{"low", Ints{0}}, {"high", Ints{0}}}), Error);
  EXPECT_THROW(run_op("pad", {x, i64({}, {0})}, 1, {{"low", Ints{0}}, {"high", Ints{0}}}), Error);
  EXPECT_THROW(run_op("pad", {x, v}, 1, {{"low", Ints{-2}}, {"high", Ints{-2}}}), Error);
}

TEST(Core, Concatenate) {
  auto y = run_op("concatenate", {f32({2, 1}, {1, 2}), f32({2, 2}, {3, 4, 5, 6})}, 1, {{"axis", i(1)}});
  EXPECT_EQ(y[0].shape(), (Shape{2, 3}));
  expect_near(y[0], {1, 3, 4, 2, 5, 6});
  auto z = run_op("concatenate", {f32({1}, {1}), f32({0}, {}), f32({2}, {2, 3})}, 1, {{"axis", i(0)}});
  expect_near(z[0], {1, 2, 3});
  auto one = run_op("concatenate", {f32({2}, {1, 2})}, 1, {{"axis", i(0)}});
  expect_near(one[0], {1, 2});
  EXPECT_THROW(run_op("concatenate", {f32({2, 1}, {1, 2}), f32({1, 2}, {3, 4})}, 1, {{"axis", i(1)}}), Error);
  EXPECT_THROW(run_op("concatenate", {f32({1}, {1}), i64({1}, {2})}, 1, {{"axis", i(0)}}), Error);
}

TEST(Core, GatherScatter) {
  // GatherElements: data [[1,2],[3,4]], indices [[0,0],[1,0]] axis 1 -> [[1,1],[4,3]].
  auto data = f32({2, 2}, {1, 2, 3, 4});
  auto g = run_op("gather", {data, i64({2, 2}, {0, 0, 1, 0})}, 1, {{"axis", i(1)}});
  expect_near(g[0], {1, 1, 4, 3});
  // Axis 0 with a negative index (-1 = last row), output smaller than data.
  auto g0 = run_op("gather", {data, ints(DType::i32, {1, 2}, {-1, 0})}, 1, {{"axis", i(0)}});
  EXPECT_EQ(g0[0].shape(), (Shape{1, 2}));
  expect_near(g0[0], {3, 2});
  EXPECT_THROW(run_op("gather", {data, i64({1, 1}, {2})}, 1, {{"axis", i(1)}}), Error);
  EXPECT_THROW(run_op("gather", {data, i64({1, 1}, {-3})}, 1, {{"axis", i(1)}}), Error);
  EXPECT_THROW(run_op("gather", {data, f32({1, 1}, {0})}, 1, {{"axis", i(1)}}), Error);

  // ScatterElements: data zeros [1,5], indices [[1,3]], updates [[1.1, 2.1]] axis 1.
  auto z = f32({1, 5}, {1, 2, 3, 4, 5});
  auto s0 = run_op("scatter", {z, i64({1, 2}, {1, 3}), f32({1, 2}, {10, 20})}, 1, {{"axis", i(1)}});
  expect_near(s0[0], {1, 10, 3, 20, 5});
  auto sa = run_op("scatter", {z, i64({1, 2}, {1, 1}), f32({1, 2}, {10, 20})}, 1,
                   {{"axis", i(1)}, {"reduction", s("add")}});
  expect_near(sa[0], {1, 32, 3, 4, 5});
  auto sm = run_op("scatter", {z, i64({1, 2}, {-1, 0}), f32({1, 2}, {2, 0})}, 1,
                   {{"axis", i(1)}, {"reduction", s("mul")}});
  expect_near(sm[0], {0, 2, 3, 4, 10});
  auto sx = run_op("scatter", {z, i64({1, 2}, {0, 4}), f32({1, 2}, {7, 0})}, 1,
                   {{"axis", i(1)}, {"reduction", s("max")}});
  expect_near(sx[0], {7, 2, 3, 4, 5});
  auto sn = run_op("scatter", {i64({2}, {5, 5}), i64({2}, {1, 1}), i64({2}, {7, 3})}, 1,
                   {{"axis", i(0)}, {"reduction", s("min")}});
  EXPECT_EQ(as_ints(sn[0]), (Ints{5, 3}));
  EXPECT_THROW(run_op("scatter", {z, i64({1, 1}, {5}), f32({1, 1}, {1})}, 1, {{"axis", i(1)}}), Error);
  EXPECT_THROW(run_op("scatter", {z, i64({1, 1}, {0}), f32({1, 2}, {1, 2})}, 1, {{"axis", i(1)}}), Error);
}

TEST(Core, Iota) {
  auto y = run_op("iota", {}, 1, {{"shape", Ints{2, 3}}, {"axis", i(1)}, {"dtype", s("i32")}});
  EXPECT_EQ(y[0].dtype(), DType::i32);
  EXPECT_EQ(as_ints(y[0]), (Ints{0, 1, 2, 0, 1, 2}));
  auto z = run_op("iota", {}, 1, {{"shape", Ints{2, 3}}, {"axis", i(0)}, {"dtype", s("f32")}});
  expect_near(z[0], {0, 0, 0, 1, 1, 1});
  EXPECT_THROW(run_op("iota", {}, 1, {{"shape", Ints{2}}, {"axis", i(1)}, {"dtype", s("i32")}}), Error);
}

TEST(Core, SortStableWithNaN) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  auto x = f32({6}, {3, 1, nan, 2, 1, 3});
  auto a = run_op("sort", {x}, 2, {{"axis", i(0)}});
  EXPECT_EQ(as_ints(a[1]), (Ints{1, 4, 3, 0, 5, 2}));  // equal keys keep input order; NaN last
  EXPECT_TRUE(std::isnan(a[0].get_f(5)));
  for (int k = 0; k < 5; ++k) EXPECT_EQ(a[0].get_f(k), (std::vector<double>{1, 1, 2, 3, 3})[k]);
  auto d = run_op("sort", {x}, 2, {{"axis", i(0)}, {"descending", i(1)}});
  EXPECT_EQ(as_ints(d[1]), (Ints{2, 0, 5, 3, 1, 4}));
  // Along axis 0 of a [3,2] int tensor.
  auto m = run_op("sort", {i64({3, 2}, {5, 0, 1, 0, 3, -1})}, 2, {{"axis", i(0)}});
  EXPECT_EQ(as_ints(m[0]), (Ints{1, -1, 3, 0, 5, 0}));
  EXPECT_EQ(as_ints(m[1]), (Ints{1, 2, 2, 0, 0, 1}));
  EXPECT_EQ(m[1].dtype(), DType::i64);
}

TEST(Core, RejectsUnknownDims) {
  Graph g;
  Value* x = g.add_input("x", TensorType{DType::f32, {kUnknownDim}});
  Node* n = g.add_node(OpRegistry::get().find("neg"), "n", {x}, {"y"}, {});
  g.outputs.push_back(n->outputs[0]);
  EXPECT_THROW(infer_graph(g), Error);
}

TEST(Core, Costs) {
  Graph g;
  Value* a = g.add_input("a", TensorType{DType::f32, {4, 8}});
  Value* b = g.add_input("b", TensorType{DType::f32, {8, 5}});
  Node* n = g.add_node(OpRegistry::get().find("dot_general"), "n", {a, b}, {"y"},
                       {{"lhs_contract", Ints{1}}, {"rhs_contract", Ints{0}}});
  g.outputs.push_back(n->outputs[0]);
  infer_graph(g);
  EXPECT_DOUBLE_EQ(op_cost(*n).flops, 2.0 * 4 * 5 * 8);
}

TEST(Core, IntegerEdgeCases) {
  // u64 orders as unsigned: 2^63 > 1.
  const int64_t big = std::numeric_limits<int64_t>::min();  // bits of 2^63 as u64
  auto a = ints(DType::u64, {2}, {big, 1});
  auto b = ints(DType::u64, {2}, {1, 2});
  EXPECT_EQ(as_ints(run_op("max", {a, b})[0]), (Ints{big, 2}));
  EXPECT_EQ(as_ints(run_op("compare", {a, b}, 1, {{"direction", s("gt")}})[0]), (Ints{1, 0}));
  auto m = run_op("reduce", {a}, 1, {{"kind", s("max")}, {"axes", Ints{0}}});
  EXPECT_EQ(m[0].get_i(0), big);
  // int64 min / -1 wraps instead of trapping; its remainder is 0.
  const int64_t lo = std::numeric_limits<int64_t>::min();
  EXPECT_EQ(run_op("div", {i64({1}, {lo}), i64({1}, {-1})})[0].get_i(0), lo);
  EXPECT_EQ(run_op("rem", {i64({1}, {lo}), i64({1}, {-1})})[0].get_i(0), 0);
  // int8 pow wraps: 2^7 = 128 -> -128.
  EXPECT_EQ(run_op("pow", {ints(DType::i8, {1}, {2}), ints(DType::i8, {1}, {7})})[0].get_i(0), -128);
}

TEST(Core, SmallFloatsRoundOnce) {
  // f16: 2048 + 1 is not representable (spacing 2 there) and ties to even: 2048.
  auto h = Tensor::from_f64(DType::f16, {2}, std::vector<double>{2048, 1});
  auto o = Tensor::from_f64(DType::f16, {2}, std::vector<double>{1, 1});
  auto y = run_op("add", {h, o});
  EXPECT_EQ(y[0].dtype(), DType::f16);
  expect_near(y[0], {2048, 2});
  // Dot in f16 accumulates in double and rounds once: 2048 + 1 + 1 = 2050 exactly.
  auto d = run_op("dot_general", {Tensor::from_f64(DType::f16, {3}, std::vector<double>{2048, 1, 1}),
                                  Tensor::from_f64(DType::f16, {3}, std::vector<double>{1, 1, 1})},
                  1, {{"lhs_contract", Ints{0}}, {"rhs_contract", Ints{0}}});
  expect_near(d[0], {2050});
}

TEST(Core, BadAttributesAreErrors) {
  auto x = f32({4}, {1, 2, 3, 4});
  EXPECT_THROW(run_op("reduce_window", {x}, 1, {{"kind", s("sum")}, {"window", Ints{2}}, {"strides", Ints{0}}}),
               Error);
  EXPECT_THROW(run_op("reduce_window", {x}, 1, {{"kind", s("sum")}, {"window", Ints{2}}, {"padding", Ints{-3, -3}}}),
               Error);
  EXPECT_THROW(run_op("reduce", {x}, 1, {{"kind", s("sum")}}), Error);  // axes required
  EXPECT_THROW(run_op("convolution", {f32({1, 1, 4}, {1, 2, 3, 4}), f32({1, 1, 2}, {1, 1})}, 1,
                      {{"strides", Ints{0}}}),
               Error);
  EXPECT_THROW(run_op("convolution", {f32({1, 2, 2}, {1, 2, 3, 4}), f32({1, 1, 1}, {1})}, 1, {{"groups", i(3)}}),
               Error);
  EXPECT_THROW(run_op("sort", {x}, 2, {{"axis", i(1)}}), Error);
  EXPECT_THROW(run_op("scatter", {x, i64({1}, {0}), f32({1}, {1})}, 1, {{"axis", i(0)}, {"reduction", s("sub")}}),
               Error);
  // A window longer than the input gives an empty output, not an error.
  auto e = run_op("reduce_window", {x}, 1, {{"kind", s("sum")}, {"window", Ints{5}}});
  EXPECT_EQ(e[0].shape(), (Shape{0}));
}
