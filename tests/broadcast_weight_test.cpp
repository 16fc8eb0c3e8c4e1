// Constants whose elements are all equal feeding a matmul or a convolution: canonicalize turns such
// a constant into a scalar and a broadcast_in_dim (a view with zero strides), and the compiled
// backend must still hand oneDNN dense weights of the full shape. Each case is compiled and compared
// with the eager interpreter (an all-ones weight, a fresh BatchNorm folded after a convolution, a
// convolution times a one-element constant, all-equal convolution weights).
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>

#include "graph_test_util.h"
#include "tessel/ir/infer.h"
#include "tessel/ir/op_registry.h"
#include "tessel/runtime/compiled_backend.h"
#include "tessel/runtime/interpreter.h"

using namespace tessel;

namespace {

Tensor filled(Shape s, double value) {
  std::vector<double> v(static_cast<size_t>(shape_numel(s)), value);
  return Tensor::from_f64(DType::f32, std::move(s), v);
}

using testenv::op_node;
Tensor varied_tensor(Shape s, uint32_t seed) { return testenv::varied_f32(std::move(s), seed); }

using Builder = std::unique_ptr<Graph> (*)();

// The compiled backend's outputs against the eager interpreter's on the same (fresh) graph.
void expect_compiled_matches_eager(Builder build, const Shape& x_shape, const std::string& what) {
  SCOPED_TRACE(what);
  const std::vector<Tensor> inputs = {varied_tensor(x_shape, 7)};
  auto ref_graph = build();
  const std::vector<Tensor> ref = run_eager(*ref_graph, inputs);
  auto exe = compile_cpu(build(), inputs, testenv::compiled_test_options());
  EXPECT_GT(exe->stats().matmul_kernels + exe->stats().conv_kernels, 0) << "no library kernel: not the case under test";
  const std::vector<Tensor> out = exe->run(inputs);
  ASSERT_EQ(out.size(), ref.size());
  for (size_t i = 0; i < out.size(); ++i) {
    ASSERT_EQ(out[i].shape(), ref[i].shape());
    double err = 0, mag = 0;
    for (int64_t j = 0; j < ref[i].numel(); ++j) {
      err = std::max(err, std::abs(out[i].get_f(j) - ref[i].get_f(j)));
      mag = std::max(mag, std::abs(ref[i].get_f(j)));
    }
    EXPECT_LE(err, 1e-5 * std::max(mag, 1.0)) << "output " << i << ": max abs error " << err;
  }
}

// x[4,16] · ones[16,8]
std::unique_ptr<Graph> matmul_by_ones() {
  auto g = std::make_unique<Graph>();
  Value* x = g->add_input("x", TensorType{DType::f32, {4, 16}});
  Value* w = g->add_constant("w", filled({16, 8}, 1.0));
  g->outputs = {op_node(*g, "MatMul", "mm", {x, w})};
  infer_graph(*g);
  return g;
}

// x[2,5,16] · 0.25[16,8] (a batch folded into M)
std::unique_ptr<Graph> batched_matmul_by_splat() {
  auto g = std::make_unique<Graph>();
  Value* x = g->add_input("x", TensorType{DType::f32, {2, 5, 16}});
  Value* w = g->add_constant("w", filled({16, 8}, 0.25));
  g->outputs = {op_node(*g, "MatMul", "mm", {x, w})};
  infer_graph(*g);
  return g;
}

// Gemm(x[4,16], W[8,16] all 0.5, transB) + b[8] all 0.1: nn.Linear with constant-filled parameters
std::unique_ptr<Graph> linear_all_equal() {
  auto g = std::make_unique<Graph>();
  Value* x = g->add_input("x", TensorType{DType::f32, {4, 16}});
  Value* w = g->add_constant("w", filled({8, 16}, 0.5));
  Value* b = g->add_constant("b", filled({8}, 0.1));
  g->outputs = {op_node(*g, "Gemm", "fc", {x, w, b}, {{"transB", int64_t{1}}})};
  infer_graph(*g);
  return g;
}

// Conv(x[2,3,8,8], varied w[8,3,3,3], pad 1) * scale[1,8,1,1] + shift[1,8,1,1]: a fresh BatchNorm
// in eval (scale 1/sqrt(1+eps), shift 0) folded after a convolution.
std::unique_ptr<Graph> conv_fresh_batchnorm() {
  auto g = std::make_unique<Graph>();
  Value* x = g->add_input("x", TensorType{DType::f32, {2, 3, 8, 8}});
  Value* w = g->add_constant("w", varied_tensor({8, 3, 3, 3}, 11));
  Value* scale = g->add_constant("scale", filled({1, 8, 1, 1}, 1.0 / std::sqrt(1.0 + 1e-5)));
  Value* shift = g->add_constant("shift", filled({1, 8, 1, 1}, 0.0));
  Value* c = op_node(*g, "Conv", "conv", {x, w}, {{"pads", std::vector<int64_t>{1, 1, 1, 1}}});
  Value* y = op_node(*g, "Mul", "bn_scale", {c, scale});
  g->outputs = {op_node(*g, "Add", "bn_shift", {y, shift})};
  infer_graph(*g);
  return g;
}

// Conv(x, varied w) * c[1]: a one-element constant
std::unique_ptr<Graph> conv_times_one_element() {
  auto g = std::make_unique<Graph>();
  Value* x = g->add_input("x", TensorType{DType::f32, {2, 3, 8, 8}});
  Value* w = g->add_constant("w", varied_tensor({8, 3, 3, 3}, 13));
  Value* k = g->add_constant("k", filled({1}, 3.0));
  Value* c = op_node(*g, "Conv", "conv", {x, w}, {{"pads", std::vector<int64_t>{1, 1, 1, 1}}});
  g->outputs = {op_node(*g, "Mul", "mul", {c, k})};
  infer_graph(*g);
  return g;
}

// Conv(x, w all 0.1) with a bias all 0.2: the weights themselves are a splat
std::unique_ptr<Graph> conv_all_equal_weights() {
  auto g = std::make_unique<Graph>();
  Value* x = g->add_input("x", TensorType{DType::f32, {2, 3, 8, 8}});
  Value* w = g->add_constant("w", filled({8, 3, 3, 3}, 0.1));
  Value* b = g->add_constant("b", filled({8}, 0.2));
  g->outputs = {op_node(*g, "Conv", "conv", {x, w, b}, {{"pads", std::vector<int64_t>{1, 1, 1, 1}}})};
  infer_graph(*g);
  return g;
}

}  // namespace

TEST(BroadcastWeight, MatMulByAllOnes) { expect_compiled_matches_eager(matmul_by_ones, {4, 16}, "x @ ones"); }

TEST(BroadcastWeight, BatchedMatMulBySplat) {
  expect_compiled_matches_eager(batched_matmul_by_splat, {2, 5, 16}, "x[2,5,16] @ 0.25");
}

TEST(BroadcastWeight, LinearWithAllEqualParameters) {
  expect_compiled_matches_eager(linear_all_equal, {4, 16}, "Gemm with W = 0.5, b = 0.1");
}

TEST(BroadcastWeight, ConvThenFreshBatchNorm) {
  expect_compiled_matches_eager(conv_fresh_batchnorm, {2, 3, 8, 8}, "conv, fresh batch norm");
}

TEST(BroadcastWeight, ConvTimesOneElementConstant) {
  expect_compiled_matches_eager(conv_times_one_element, {2, 3, 8, 8}, "conv * [3]");
}

TEST(BroadcastWeight, ConvWithAllEqualWeights) {
  expect_compiled_matches_eager(conv_all_equal_weights, {2, 3, 8, 8}, "conv with w = 0.1, b = 0.2");
}
