// Index, quantize and misc reference kernels, checked against hand-computed values.
#include <gtest/gtest.h>

#include <cmath>

#include "tessel/ir/infer.h"
#include "tessel/ir/op_registry.h"
#include "tessel/runtime/interpreter.h"
#include "tessel/support/error.h"
#include "op_test_util.h"

using namespace tessel;
using namespace tessel::testenv;

namespace {

// The inferred type of output 0 when input `const_in` is a constant (the others are inputs).
TensorType inferred_type(const std::string& op, const std::vector<Tensor>& ins, int const_in) {
  Graph g;
  std::vector<Value*> vs;
  for (size_t i = 0; i < ins.size(); ++i) {
    const std::string name = "x" + std::to_string(i);
    vs.push_back(static_cast<int>(i) == const_in
                     ? g.add_constant(name, ins[i])
                     : g.add_input(name, TensorType{ins[i].dtype(), ins[i].shape()}));
  }
  Node* n = g.add_node(OpRegistry::get().find(op), "n", vs, {"y0"});
  infer_graph(g);
  return n->outputs[0]->type;
}

Tensor u8(Shape s, std::vector<int64_t> v) {
  return Tensor::from_i64(DType::u8, std::move(s), v);
}


void expect_ints(const Tensor& t, const std::vector<int64_t>& want) {
  EXPECT_EQ(t.to_i64(), want);
}

}  // namespace

TEST(Index, GatherNegativeIndexOnAxis1) {
  // [[1,2,3],[4,5,6]] columns [-1, 0] -> [[3,1],[6,4]].
  auto y = run_op("Gather", {f32({2, 3}, {1, 2, 3, 4, 5, 6}), i64({2}, {-1, 0})}, 1,
                  {{"axis", int64_t{1}}});
  EXPECT_EQ(y[0].shape(), (Shape{2, 2}));
  expect_near(y[0], {3, 1, 6, 4});
}

TEST(Index, GatherOutOfRangeFails) {
  EXPECT_THROW(run_op("Gather", {f32({3}, {1, 2, 3}), i64({1}, {3})}, 1), Error);
  EXPECT_THROW(run_op("Gather", {f32({3}, {1, 2, 3}), i64({1}, {-4})}, 1), Error);
}

TEST(Index, GatherElementsAndGatherNDBatch) {
  auto y = run_op("GatherElements", {f32({2, 2}, {1, 2, 3, 4}), i64({2, 2}, {0, 0, 1, 0})}, 1,
                  {{"axis", int64_t{1}}});
  expect_near(y[0], {1, 1, 4, 3});
  // batch_dims=1: row b of indices picks data[b][idx] -> [[2,3],[4,5]].
  auto z = run_op("GatherND", {f32({2, 2, 2}, {0, 1, 2, 3, 4, 5, 6, 7}), i64({2, 1}, {1, 0})}, 1,
                  {{"batch_dims", int64_t{1}}});
  EXPECT_EQ(z[0].shape(), (Shape{2, 2}));
  expect_near(z[0], {2, 3, 4, 5});
}

TEST(Index, ScatterElementsAddWithDuplicates) {
  auto y = run_op("ScatterElements",
                  {f32({1, 5}, {1, 2, 3, 4, 5}), i64({1, 2}, {1, 1}), f32({1, 2}, {1.5, 2.5})}, 1,
                  {{"axis", int64_t{1}}, {"reduction", std::string("add")}});
  expect_near(y[0], {1, 6, 3, 4, 5});
}

TEST(Index, ScatterNDAndMax) {
  auto y = run_op(
      "ScatterND",
      {f32({8}, {1, 2, 3, 4, 5, 6, 7, 8}), i64({4, 1}, {4, 3, 1, 7}), f32({4}, {9, 10, 11, 12})},
      1);
  expect_near(y[0], {1, 11, 3, 10, 9, 6, 7, 12});
  auto m =
      run_op("ScatterND", {f32({2, 2}, {1, 5, 3, 4}), i64({2, 2}, {0, 1, 0, 1}), f32({2}, {7, 2})},
             1, {{"reduction", std::string("max")}});
  expect_near(m[0], {1, 7, 3, 4});
}

TEST(Index, NonZeroShapeIsDataDependent) {
  auto t = inferred_type("NonZero", {f32({2, 2}, {1, 0, 1, 1})}, -1);
  EXPECT_EQ(t.shape, (Shape{2, kUnknownDim}));
  auto y = run_op("NonZero", {f32({2, 2}, {1, 0, 1, 1})}, 1);
  EXPECT_EQ(y[0].shape(), (Shape{2, 3}));
  expect_ints(y[0], {0, 1, 1, 0, 0, 1});
}

TEST(Index, CompressAndOneHot) {
  Tensor cond(DType::boolean, {3});
  cond.set_i(1, 1);
  cond.set_i(2, 1);
  auto y = run_op("Compress", {f32({3, 2}, {1, 2, 3, 4, 5, 6}), cond}, 1, {{"axis", int64_t{0}}});
  EXPECT_EQ(y[0].shape(), (Shape{2, 2}));
  expect_near(y[0], {3, 4, 5, 6});
  // Index -1 wraps to depth-1; 5 is out of range and gives an all-off row.
  auto h = run_op("OneHot", {i64({3}, {1, -1, 5}), i64({}, {3}), f32({2}, {0, 1})}, 1);
  EXPECT_EQ(h[0].shape(), (Shape{3, 3}));
  expect_near(h[0], {0, 1, 0, 0, 0, 1, 0, 0, 0});
  EXPECT_EQ(
      inferred_type("OneHot", {i64({3}, {1, -1, 5}), i64({}, {3}), f32({2}, {0, 1})}, 1).shape,
      (Shape{3, 3}));
}

TEST(Index, UniqueSortedAndUnsorted) {
  auto y = run_op("Unique", {f32({6}, {2, 1, 1, 3, 4, 3})}, 4);
  expect_near(y[0], {1, 2, 3, 4});
  expect_ints(y[1], {1, 0, 3, 4});
  expect_ints(y[2], {1, 0, 0, 2, 3, 2});
  expect_ints(y[3], {2, 1, 2, 1});
  auto u = run_op("Unique", {f32({6}, {2, 1, 1, 3, 4, 3})}, 4, {{"sorted", int64_t{0}}});
  expect_near(u[0], {2, 1, 3, 4});
  expect_ints(u[2], {0, 1, 1, 2, 3, 2});
}

TEST(Quantize, QuantizeLinearRoundsHalfToEvenAndSaturates) {
  // x / 0.5 = [0.5, 1.5, 5, -12, 600] -> round-half-even [0, 2, 5, -12, 600] + 10, clamped to u8.
  auto y = run_op("QuantizeLinear",
                  {f32({5}, {0.25, 0.75, 2.5, -6, 300}), f32({}, {0.5}), u8({}, {10})}, 1);
  EXPECT_EQ(y[0].dtype(), DType::u8);
  expect_ints(y[0], {10, 12, 15, 0, 255});
}

TEST(Quantize, DequantizeLinearPerAxis) {
  // Row 0: (x - 10) * 1; row 1: (x - 20) * 0.5.
  auto y = run_op("DequantizeLinear",
                  {u8({2, 2}, {10, 20, 30, 40}), f32({2}, {1, 0.5}), u8({2}, {10, 20})}, 1,
                  {{"axis", int64_t{0}}});
  expect_near(y[0], {0, 10, 5, 10});
}

TEST(Quantize, DynamicQuantizeLinear) {
  // Range [0, 3]: scale 3/255, zero point 0, values map to 0, 85, 170, 255.
  auto y = run_op("DynamicQuantizeLinear", {f32({4}, {0, 1, 2, 3})}, 3);
  expect_ints(y[0], {0, 85, 170, 255});
  expect_near(y[1], {3.0 / 255}, 1e-7);
  expect_ints(y[2], {0});
}

TEST(Misc, GridSampleBilinearAlignCorners) {
  // 2x2 image; grid points at the centre, the top-left and the top-right corner.
  auto y = run_op("GridSample",
                  {f32({1, 1, 2, 2}, {1, 2, 3, 4}), f32({1, 1, 3, 2}, {0, 0, -1, -1, 1, -1})}, 1,
                  {{"align_corners", int64_t{1}}});
  EXPECT_EQ(y[0].shape(), (Shape{1, 1, 1, 3}));
  expect_near(y[0], {2.5, 1, 2});
}

TEST(Misc, NonMaxSuppressionSuppressesOverlap) {
  // Box 1 overlaps box 0 with IoU 0.9/1.1 > 0.5; box 2 is disjoint.
  auto y = run_op("NonMaxSuppression",
                  {f32({1, 3, 4}, {0, 0, 1, 1, 0, 0.1, 1, 1.1, 0, 2, 1, 3}),
                   f32({1, 1, 3}, {0.9, 0.8, 0.7}), i64({1}, {10}), f32({1}, {0.5})},
                  1);
  EXPECT_EQ(y[0].shape(), (Shape{2, 3}));
  expect_ints(y[0], {0, 0, 0, 0, 0, 2});
}

TEST(Misc, HannWindowAndDft) {
  auto w = run_op("HannWindow", {Tensor::scalar_i(DType::i64, 4)}, 1);
  expect_near(w[0], {0, 0.5, 1, 0.5});
  // DFT of [1,2,3,4]: [10, -2+2i, -2, -2-2i].
  auto d = run_op("DFT", {f32({1, 4, 1}, {1, 2, 3, 4}), Tensor(), i64({}, {1})}, 1);
  EXPECT_EQ(d[0].shape(), (Shape{1, 4, 2}));
  expect_near(d[0], {10, 0, -2, 2, -2, 0, -2, -2});
}

TEST(Quantize, BlockedAndFloat8Saturation) {
  // Blocks of 2 along axis 1 with scales 1 and 2: [1/1, 2/1, 3/2, 4/2] -> [1, 2, 2 (1.5 to even),
  // 2].
  auto y = run_op("QuantizeLinear", {f32({1, 4}, {1, 2, 3, 4}), f32({1, 2}, {1, 2})}, 1,
                  {{"axis", int64_t{1}}, {"block_size", int64_t{2}}, {"output_dtype", int64_t{3}}});
  EXPECT_EQ(y[0].dtype(), DType::i8);
  expect_ints(y[0], {1, 2, 2, 2});
  // 1000 is beyond float8e4m3fn's 448: saturates to 448 (0x7E) by default, NaN (0x7F) without.
  Tensor zp(DType::f8e4m3fn, {});
  auto s = run_op("QuantizeLinear", {f32({1}, {1000}), f32({}, {1}), zp}, 1);
  EXPECT_EQ(s[0].bytes()[0], 0x7E);
  auto n =
      run_op("QuantizeLinear", {f32({1}, {1000}), f32({}, {1}), zp}, 1, {{"saturate", int64_t{0}}});
  EXPECT_EQ(n[0].bytes()[0], 0x7F);
}

TEST(Quantize, QLinearMatMulRequantizes) {
  // (a - 0) = [2, 4], (b - 1) = [0, 2]: acc 8, real 8 * 0.5 * 1 = 4, 4 / 0.25 + 10 = 26.
  auto y = run_op("QLinearMatMul",
                  {u8({1, 2}, {2, 4}), f32({}, {0.5}), u8({}, {0}), u8({2, 1}, {1, 3}),
                   f32({}, {1}), u8({}, {1}), f32({}, {0.25}), u8({}, {10})},
                  1);
  EXPECT_EQ(y[0].shape(), (Shape{1, 1}));
  expect_ints(y[0], {26});
}

TEST(Misc, InverseOnesidedDftIsRealInverse) {
  // The one-sided spectrum of [1,2,3,4] is [10, -2+2i, -2]; its 4-point inverse gives back the
  // signal.
  auto y = run_op("DFT", {f32({1, 3, 2}, {10, 0, -2, 2, -2, 0}), i64({}, {4}), i64({}, {1})}, 1,
                  {{"inverse", int64_t{1}}, {"onesided", int64_t{1}}});
  EXPECT_EQ(y[0].shape(), (Shape{1, 4, 1}));
  expect_near(y[0], {1, 2, 3, 4});
}

TEST(Index, DataDependentShapesFoldWhenInputsAreKnown) {
  // With a constant input the data-dependent sizes are exact: 4 distinct values, 3 non-zeros.
  EXPECT_EQ(inferred_type("Unique", {f32({6}, {2, 1, 1, 3, 4, 3})}, 0).shape, (Shape{4}));
  EXPECT_EQ(inferred_type("NonZero", {f32({2, 2}, {1, 0, 1, 1})}, 0).shape, (Shape{2, 3}));
  // NaNs sort after the numbers and count as one value.
  auto y = run_op("Unique", {f32({4}, {NAN, 1, NAN, 0})}, 4);
  EXPECT_EQ(y[0].shape(), (Shape{3}));
  EXPECT_EQ(y[0].get_f(0), 0);
  EXPECT_EQ(y[0].get_f(1), 1);
  EXPECT_TRUE(std::isnan(y[0].get_f(2)));
}
