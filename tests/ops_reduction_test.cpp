// Reduction and normalization reference kernels, checked against hand-computed values.
#include <gtest/gtest.h>

#include <cmath>

#include "tessel/ir/infer.h"
#include "tessel/ir/op_registry.h"
#include "tessel/runtime/interpreter.h"
#include "tessel/support/error.h"
#include "op_test_util.h"

using namespace tessel;
using namespace tessel::testenv;

TEST(Reduction, ReduceSumAxesInput) {
  // [[1,2,3],[4,5,6]] summed over axis 1: [6, 15].
  auto y = run_op("ReduceSum", {f32({2, 3}, {1, 2, 3, 4, 5, 6}), i64({1}, {1})}, 1,
                  {{"keepdims", int64_t{0}}});
  EXPECT_EQ(y[0].shape(), (Shape{2}));
  expect_near(y[0], {6, 15});
}

TEST(Reduction, ReduceMeanAllAndEmptySet) {
  auto y = run_op("ReduceMean", {f32({2, 2}, {1, 2, 3, 6})}, 1);
  EXPECT_EQ(y[0].shape(), (Shape{1, 1}));
  expect_near(y[0], {3});
  // Reducing a zero-size axis: sum is 0, max is -inf.
  auto s = run_op("ReduceSum", {f32({2, 0}, {}), i64({1}, {1})}, 1);
  expect_near(s[0], {0, 0});
  auto m = run_op("ReduceMax", {f32({2, 0}, {}), i64({1}, {1})}, 1);
  EXPECT_TRUE(std::isinf(m[0].get_f(0)) && m[0].get_f(0) < 0);
}

TEST(Reduction, ReduceLogSumExpAndL2) {
  // log(e^1 + e^1) = 1 + ln 2; sqrt(3^2 + 4^2) = 5.
  auto y = run_op("ReduceLogSumExp", {f32({2}, {1, 1})}, 1, {{"keepdims", int64_t{0}}});
  expect_near(y[0], {1 + std::log(2.0)});
  auto l2 = run_op("ReduceL2", {f32({2}, {3, 4})}, 1);
  expect_near(l2[0], {5});
}

TEST(Reduction, NoopWithEmptyAxes) {
  auto y = run_op("ReduceSum", {f32({2}, {1, 2}), i64({0}, {})}, 1,
                  {{"noop_with_empty_axes", int64_t{1}}});
  expect_near(y[0], {1, 2});
}

TEST(Reduction, ArgMaxSelectLast) {
  auto a = run_op("ArgMax", {f32({4}, {1, 3, 3, 2})}, 1);
  EXPECT_EQ(a[0].get_i(0), 1);
  auto b = run_op("ArgMax", {f32({4}, {1, 3, 3, 2})}, 1, {{"select_last_index", int64_t{1}}});
  EXPECT_EQ(b[0].get_i(0), 2);
}

TEST(Reduction, SoftmaxAndLogSoftmax) {
  // softmax([0, ln 3]) = [0.25, 0.75].
  auto y = run_op("Softmax", {f32({1, 2}, {0, std::log(3.0)})}, 1);
  expect_near(y[0], {0.25, 0.75});
  auto l = run_op("LogSoftmax", {f32({1, 2}, {0, std::log(3.0)})}, 1);
  expect_near(l[0], {std::log(0.25), std::log(0.75)});
  auto h = run_op("Hardmax", {f32({1, 3}, {1, 5, 5})}, 1);
  expect_near(h[0], {0, 1, 0});
}

TEST(Reduction, CumSumExclusiveReverse) {
  Tensor axis = i64({}, {0});
  auto y = run_op("CumSum", {f32({3}, {1, 2, 3}), axis}, 1);
  expect_near(y[0], {1, 3, 6});
  auto e = run_op("CumSum", {f32({3}, {1, 2, 3}), axis}, 1,
                  {{"exclusive", int64_t{1}}, {"reverse", int64_t{1}}});
  expect_near(e[0], {5, 3, 0});
}

TEST(Reduction, TopKStableTies) {
  auto y = run_op("TopK", {f32({4}, {2, 5, 5, 1}), i64({1}, {3})}, 2);
  expect_near(y[0], {5, 5, 2});
  EXPECT_EQ(y[1].to_i64(), (std::vector<int64_t>{1, 2, 0}));
  auto s = run_op("TopK", {f32({4}, {2, 5, 5, 1}), i64({1}, {2})}, 2, {{"largest", int64_t{0}}});
  EXPECT_EQ(s[1].to_i64(), (std::vector<int64_t>{3, 0}));
}

TEST(Reduction, NllLossMeanWithWeights) {
  // log-probs [[-1, -2], [-3, -4]], targets [1, 0], weights [1, 3]:
  // losses 2*3 = 6 and 3*1 = 3; mean = 9 / (3 + 1).
  auto y = run_op("NegativeLogLikelihoodLoss",
                  {f32({2, 2}, {-1, -2, -3, -4}), i64({2}, {1, 0}), f32({2}, {1, 3})}, 1);
  expect_near(y[0], {9.0 / 4});
  auto n = run_op("NegativeLogLikelihoodLoss", {f32({2, 2}, {-1, -2, -3, -4}), i64({2}, {1, 0})}, 1,
                  {{"reduction", std::string("none")}, {"ignore_index", int64_t{0}}});
  expect_near(n[0], {2, 0});
}

TEST(Reduction, SoftmaxCrossEntropy) {
  // Equal scores: log_prob = -ln 2 everywhere; the loss is ln 2.
  auto y = run_op("SoftmaxCrossEntropyLoss", {f32({1, 2}, {7, 7}), i64({1}, {1})}, 2);
  expect_near(y[0], {std::log(2.0)});
  expect_near(y[1], {-std::log(2.0), -std::log(2.0)});
}

TEST(Normalization, LayerNorm) {
  // Row [1, 3]: mean 2, var 1 -> [-1, 1] (eps 0), scaled by [2, 2] and shifted by [1, 0].
  auto y = run_op("LayerNormalization", {f32({1, 2}, {1, 3}), f32({2}, {2, 2}), f32({2}, {1, 0})},
                  3, {{"epsilon", 0.0}});
  expect_near(y[0], {-1, 2});
  expect_near(y[1], {2});
  expect_near(y[2], {1});
}

TEST(Normalization, RmsNorm) {
  // [3, 4]: mean square 12.5 -> divide by sqrt(12.5).
  auto y = run_op("RMSNormalization", {f32({2}, {3, 4}), f32({2}, {1, 1})}, 1, {{"epsilon", 0.0}});
  expect_near(y[0], {3 / std::sqrt(12.5), 4 / std::sqrt(12.5)});
}

TEST(Normalization, BatchNormInference) {
  // (x - 1) / sqrt(4) * 3 + 0.5.
  auto y =
      run_op("BatchNormalization",
             {f32({1, 1, 2}, {1, 5}), f32({1}, {3}), f32({1}, {0.5}), f32({1}, {1}), f32({1}, {4})},
             1, {{"epsilon", 0.0}});
  expect_near(y[0], {0.5, 6.5});
}

TEST(Normalization, InstanceAndLrn) {
  auto y = run_op("InstanceNormalization", {f32({1, 1, 2}, {0, 2}), f32({1}, {1}), f32({1}, {0})},
                  1, {{"epsilon", 0.0}});
  expect_near(y[0], {-1, 1});
  // size 1: y = x / (1 + 1 * x^2)^1.
  auto l = run_op("LRN", {f32({1, 1, 1, 1}, {2})}, 1,
                  {{"size", int64_t{1}}, {"alpha", 1.0}, {"beta", 1.0}, {"bias", 1.0}});
  expect_near(l[0], {0.4});
}

TEST(Normalization, BadInputFails) {
  EXPECT_THROW(run_op("LayerNormalization", {f32({2}, {1, 2}), f32({3}, {1, 1, 1})}, 1), Error);
  EXPECT_THROW(run_op("ReduceSum", {f32({2}, {1, 2}), i64({1}, {3})}, 1), Error);
}

TEST(Reduction, LegacyUpgrades) {
  // ReduceMean-13 with an axes attribute becomes the axes-input form.
  Graph g;
  Value* x = g.add_input("x", TensorType{DType::f32, {2, 2}});
  const OpDef* rm = OpRegistry::get().find("ReduceMean");
  Node* n = g.add_node(rm, "n", {x}, {"y"},
                       {{"axes", std::vector<int64_t>{0}}, {"keepdims", int64_t{0}}});
  rm->upgrade(g, *n, 13);
  g.outputs.push_back(n->outputs[0]);
  infer_graph(g);
  EXPECT_FALSE(n->has_attr("axes"));
  auto y = run_eager(g, {f32({2, 2}, {1, 2, 3, 6})});
  expect_near(y[0], {2, 4});

  // Softmax-11 at axis 1 of a [1, 2, 2] input normalizes over the flattened trailing 4 values.
  Graph g2;
  Value* x2 = g2.add_input("x", TensorType{DType::f32, {1, 2, 2}});
  const OpDef* sm = OpRegistry::get().find("Softmax");
  Node* s = g2.add_node(sm, "s", {x2}, {"y"});
  sm->upgrade(g2, *s, 11);
  g2.outputs.push_back(s->outputs[0]);
  infer_graph(g2);
  auto z = run_eager(g2, {f32({1, 2, 2}, {0, 0, 0, 0})});
  expect_near(z[0], {0.25, 0.25, 0.25, 0.25});
}

TEST(Reduction, IntegerReductions) {
  // u64 values above 2^63 must still order as unsigned.
  const int64_t big = static_cast<int64_t>((uint64_t{1} << 63) + 5);
  Tensor u = Tensor::from_i64(DType::u64, {2}, std::vector<int64_t>{1, big});
  auto m = run_op("ReduceMax", {u}, 1, {{"keepdims", int64_t{0}}});
  EXPECT_EQ(m[0].get_i(0), big);
  auto a = run_op("ArgMin", {u}, 1);
  EXPECT_EQ(a[0].get_i(0), 0);
  Tensor i = Tensor::from_i64(DType::i32, {3}, std::vector<int64_t>{-2, 5, 4});
  auto s = run_op("ReduceL1", {i}, 1);
  EXPECT_EQ(s[0].get_i(0), 11);
  auto p = run_op("ReduceProd", {i}, 1);
  EXPECT_EQ(p[0].get_i(0), -40);
}

TEST(Normalization, LayerNormBroadcastScale) {
  // Normalized over all of [[1,3],[5,7]] (mean 4, var 5); scale [1,2] broadcasts along columns.
  auto y = run_op("LayerNormalization", {f32({2, 2}, {1, 3, 5, 7}), f32({2}, {1, 2})}, 1,
                  {{"axis", int64_t{0}}, {"epsilon", 0.0}});
  const double s = std::sqrt(5.0);
  expect_near(y[0], {-3 / s, -2 / s, 1 / s, 6 / s});
}

TEST(Reduction, ArgMaxNaNWins) {
  auto a = run_op("ArgMax", {f32({3}, {1, NAN, 5})}, 1);
  EXPECT_EQ(a[0].get_i(0), 1);
  auto b = run_op("ArgMin", {f32({3}, {1, NAN, -5})}, 1);
  EXPECT_EQ(b[0].get_i(0), 1);
}

TEST(Normalization, GroupNorm18PerGroupScaleUpgrade) {
  // Two groups of two channels: [0, 2 | 4, 8] normalize to [-1, 1 | -1, 1]; the per-group
  // scale [1, 3] and bias [0, 10] become per-channel [1, 1, 3, 3] and [0, 0, 10, 10].
  Graph g;
  Value* x = g.add_input("x", TensorType{DType::f32, {1, 4, 1}});
  Value* s = g.add_constant("s", f32({2}, {1, 3}));
  Value* b = g.add_constant("b", f32({2}, {0, 10}));
  const OpDef* gn = OpRegistry::get().find("GroupNormalization");
  Node* n = g.add_node(gn, "n", {x, s, b}, {"y"}, {{"num_groups", int64_t{2}}, {"epsilon", 0.0}});
  gn->upgrade(g, *n, 18);
  g.outputs.push_back(n->outputs[0]);
  infer_graph(g);
  auto y = run_eager(g, {f32({1, 4, 1}, {0, 2, 4, 8})});
  expect_near(y[0], {-1, 1, 7, 13});
}
