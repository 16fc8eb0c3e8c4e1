// Matmul, conv/pool and attention ops: shape rules and reference kernels against hand-computed
// values.
#include <gtest/gtest.h>

#include <cmath>

#include "op_test_util.h"
#include "tessel/ir/infer.h"
#include "tessel/ir/op_registry.h"
#include "tessel/runtime/interpreter.h"
#include "tessel/support/error.h"

using namespace tessel;
using namespace tessel::testenv;

namespace {

// One node over graph inputs, attributes before the output count (the order these tests read best in).
std::vector<Tensor> run1(const std::string& op, const std::vector<Tensor>& inputs,
                         std::map<std::string, Attr> attrs = {}, int num_outputs = 1) {
  return run_op(op, inputs, num_outputs, std::move(attrs));
}

void expect_f(const Tensor& t, const Shape& shape, std::vector<double> want, double tol = 1e-5) {
  EXPECT_EQ(t.shape(), shape);
  ASSERT_EQ(t.numel(), static_cast<int64_t>(want.size()));
  for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(t.get_f(i), want[i], tol) << "element " << i;
}

TEST(OpsMatMul, MatMul2DAndVectors) {
  Tensor a = f32({2, 3}, {1, 2, 3, 4, 5, 6});
  Tensor b = f32({3, 2}, {1, 0, 0, 1, 1, 1});
  // [1+3, 2+3; 4+6, 5+6]
  expect_f(run1("MatMul", {a, b})[0], {2, 2}, {4, 5, 10, 11});
  // 1-D @ 1-D is a scalar dot product: 1*4 + 2*5 + 3*6 = 32.
  expect_f(run1("MatMul", {f32({3}, {1, 2, 3}), f32({3}, {4, 5, 6})})[0], {}, {32});
  // 1-D @ 2-D drops the M dim: [1,1,1] @ b = [2, 2].
  expect_f(run1("MatMul", {f32({3}, {1, 1, 1}), b})[0], {2}, {2, 2});
}

TEST(OpsMatMul, MatMulBatchBroadcastAndInt) {
  // a: [2,1,2] (two 1x2 rows), b: [2,2] broadcast over the batch.
  Tensor a = f32({2, 1, 2}, {1, 2, 3, 4});
  Tensor b = f32({2, 2}, {1, 2, 3, 4});
  expect_f(run1("MatMul", {a, b})[0], {2, 1, 2}, {7, 10, 15, 22});
  Tensor r =
      run1("MatMul", {ints(DType::i32, {1, 2}, {2, -3}), ints(DType::i32, {2, 1}, {5, 7})})[0];
  EXPECT_EQ(r.dtype(), DType::i32);
  EXPECT_EQ(r.get_i(0), 10 - 21);
}

TEST(OpsMatMul, MatMulRejectsMismatchedK) {
  EXPECT_THROW(run1("MatMul", {f32({2, 3}, {1, 2, 3, 4, 5, 6}), f32({2, 2}, {1, 2, 3, 4})}), Error);
}

TEST(OpsMatMul, GemmTransposeAlphaBeta) {
  // A^T with A = [[1,3],[2,4]] is [[1,2],[3,4]]; B = I; alpha 2, beta 0.5, C row [10, 20].
  Tensor a = f32({2, 2}, {1, 3, 2, 4});
  Tensor b = f32({2, 2}, {1, 0, 0, 1});
  Tensor c = f32({2}, {10, 20});
  Tensor y = run1("Gemm", {a, b, c}, {{"transA", int64_t{1}}, {"alpha", 2.0}, {"beta", 0.5}})[0];
  expect_f(y, {2, 2}, {2 + 5, 4 + 10, 6 + 5, 8 + 10});
  // No C, transB.
  Tensor y2 = run1("Gemm", {f32({1, 2}, {1, 2}), f32({3, 2}, {1, 0, 0, 1, 1, 1})},
                   {{"transB", int64_t{1}}})[0];
  expect_f(y2, {1, 3}, {1, 2, 3});
}

TEST(OpsMatMul, MatMulIntegerZeroPoints) {
  Tensor a = ints(DType::u8, {1, 2}, {10, 20});
  Tensor b = ints(DType::u8, {2, 1}, {3, 4});
  // (10-2)*(3-1) + (20-2)*(4-1) = 16 + 54 = 70
  Tensor y = run1("MatMulInteger", {a, b, ints(DType::u8, {}, {2}), ints(DType::u8, {}, {1})})[0];
  EXPECT_EQ(y.dtype(), DType::i32);
  EXPECT_EQ(y.get_i(0), 70);
}

TEST(OpsMatMul, EinsumTraceTransposeAndImplicit) {
  Tensor m = f32({2, 2}, {1, 2, 3, 4});
  expect_f(run1("Einsum", {m}, {{"equation", std::string("ii->")}})[0], {}, {5});
  expect_f(run1("Einsum", {m}, {{"equation", std::string("ij->ji")}})[0], {2, 2}, {1, 3, 2, 4});
  // Implicit output: "ij,jk" sums j and keeps i,k alphabetically -> matmul.
  expect_f(run1("Einsum", {m, m}, {{"equation", std::string("ij,jk")}})[0], {2, 2},
           {7, 10, 15, 22});
  // Ellipsis batch dims.
  expect_f(run1("Einsum", {f32({2, 2}, {1, 2, 3, 4}), f32({2, 2}, {1, 1, 2, 2})},
                {{"equation", std::string("...i,...i->...")}})[0],
           {2}, {3, 14});
}

TEST(OpsMatMul, DetWithPivoting) {
  // [[0,1],[2,3]]: det = -2 (needs a row swap); batch with [[2,0],[0,3]] = 6.
  expect_f(run1("Det", {f32({2, 2, 2}, {0, 1, 2, 3, 2, 0, 0, 3})})[0], {2}, {-2, 6});
}

TEST(OpsConv, ConvPaddedAndStrided) {
  // 3x3 input 1..9, 2x2 kernel of ones, stride 1, no pad: window sums.
  Tensor x = f32({1, 1, 3, 3}, {1, 2, 3, 4, 5, 6, 7, 8, 9});
  Tensor w = f32({1, 1, 2, 2}, {1, 1, 1, 1});
  expect_f(run1("Conv", {x, w})[0], {1, 1, 2, 2}, {12, 16, 24, 28});
  // pads 1 all round, stride 2: out 2x2 at rows/cols {-1,1}: [1, 2+3, 4+7, 5+6+8+9] plus bias 1.
  Tensor y = run1(
      "Conv", {x, w, f32({1}, {1})},
      {{"pads", std::vector<int64_t>{1, 1, 1, 1}}, {"strides", std::vector<int64_t>{2, 2}}})[0];
  expect_f(y, {1, 1, 2, 2}, {2, 6, 12, 29});
}

TEST(OpsConv, DepthwiseGroupsAndSameUpper) {
  // Two channels, group 2, 1-D kernel [1,2]; SAME_UPPER pads one at the end.
  Tensor x = f32({1, 2, 3}, {1, 2, 3, 10, 20, 30});
  Tensor w = f32({2, 1, 2}, {1, 2, 1, -1});
  Tensor y =
      run1("Conv", {x, w}, {{"group", int64_t{2}}, {"auto_pad", std::string("SAME_UPPER")}})[0];
  // ch0: 1+4, 2+6, 3+0; ch1: 10-20, 20-30, 30-0
  expect_f(y, {1, 2, 3}, {5, 8, 3, -10, -10, 30});
  EXPECT_THROW(
      run1("Conv", {f32({1, 3, 3}, std::vector<double>(9, 1)), w}, {{"group", int64_t{2}}}), Error);
}

TEST(OpsConv, ConvTransposeStride2) {
  // x = [1, 2], kernel [1, 1, 1], stride 2: out length 2*(2-1)+3 = 5: [1,1,1+2,2,2].
  Tensor y = run1("ConvTranspose", {f32({1, 1, 2}, {1, 2}), f32({1, 1, 3}, {1, 1, 1})},
                  {{"strides", std::vector<int64_t>{2}}})[0];
  expect_f(y, {1, 1, 5}, {1, 1, 3, 2, 2});
}

TEST(OpsPool, MaxPoolWithIndicesAndAveragePool) {
  Tensor x = f32({1, 1, 2, 3}, {1, 5, 2, 4, 3, 6});
  std::vector<Tensor> r = run1("MaxPool", {x}, {{"kernel_shape", std::vector<int64_t>{2, 2}}}, 2);
  expect_f(r[0], {1, 1, 1, 2}, {5, 6});
  EXPECT_EQ(r[1].get_i(0), 1);
  EXPECT_EQ(r[1].get_i(1), 5);
  // Average with a pad of 1 at the end of the width: last window sees {2, 6} only (pad excluded)
  // or {2, 6, 0, 0} when pads count.
  std::map<std::string, Attr> at = {{"kernel_shape", std::vector<int64_t>{2, 2}},
                                    {"pads", std::vector<int64_t>{0, 0, 0, 1}},
                                    {"strides", std::vector<int64_t>{2, 2}}};
  expect_f(run1("AveragePool", {x}, at)[0], {1, 1, 1, 2}, {13.0 / 4, 4});
  at["count_include_pad"] = int64_t{1};
  expect_f(run1("AveragePool", {x}, at)[0], {1, 1, 1, 2}, {13.0 / 4, 2});
  expect_f(run1("GlobalAveragePool", {x})[0], {1, 1, 1, 1}, {21.0 / 6});
  expect_f(run1("LpPool", {f32({1, 1, 2}, {3, 4})}, {{"kernel_shape", std::vector<int64_t>{2}}})[0],
           {1, 1, 1}, {5});
}

TEST(OpsPool, MaxPoolCeilMode) {
  // Length 4, kernel 2, stride 2 with ceil: windows {0,1},{2,3}; length 5 adds a partial {4}.
  Tensor x = f32({1, 1, 5}, {1, 2, 3, 4, 5});
  Tensor y = run1("MaxPool", {x},
                  {{"kernel_shape", std::vector<int64_t>{2}},
                   {"strides", std::vector<int64_t>{2}},
                   {"ceil_mode", int64_t{1}}})[0];
  expect_f(y, {1, 1, 3}, {2, 4, 5});
}

TEST(OpsAttention, SingleHeadUniformAndCausal) {
  // Q = 0 gives uniform weights: Y = mean of V rows. Causal: row 0 sees only V row 0.
  Tensor q = f32({1, 1, 2, 2}, {0, 0, 0, 0});
  Tensor k = f32({1, 1, 2, 2}, {1, 0, 0, 1});
  Tensor v = f32({1, 1, 2, 2}, {2, 4, 6, 8});
  expect_f(run1("Attention", {q, k, v})[0], {1, 1, 2, 2}, {4, 6, 4, 6});
  expect_f(run1("Attention", {q, k, v}, {{"is_causal", int64_t{1}}})[0], {1, 1, 2, 2},
           {2, 4, 4, 6});
  // A boolean mask that hides key 1 everywhere.
  Tensor m = Tensor::from_i64(DType::boolean, {2, 2}, std::vector<int64_t>{1, 0, 1, 0});
  expect_f(run1("Attention", {q, k, v, m})[0], {1, 1, 2, 2}, {2, 4, 2, 4});
}

TEST(OpsAttention, RotaryEmbeddingHalfSplit) {
  // One position, head size 2: (x1, x2) rotated by cos=0, sin=1 -> (-x2, x1).
  Tensor x = f32({1, 1, 1, 2}, {3, 5});
  Tensor cs = f32({1, 1, 1}, {0});
  Tensor sn = f32({1, 1, 1}, {1});
  expect_f(run1("RotaryEmbedding", {x, cs, sn})[0], {1, 1, 1, 2}, {-5, 3});
}

TEST(OpsConv, CausalConvWithStateUsesPastState) {
  // Row [past=5, 1, 2, 3] with kernel [1, 10]: [5+10, 1+20, 2+30]; the new state is the last step.
  std::vector<Tensor> r =
      run1("CausalConvWithState",
           {f32({1, 1, 3}, {1, 2, 3}), f32({1, 1, 2}, {1, 10}), f32({1}, {0}), f32({1, 1, 1}, {5})},
           {}, 2);
  expect_f(r[0], {1, 1, 3}, {15, 21, 32});
  expect_f(r[1], {1, 1, 1}, {3});
}

TEST(OpsConv, DeformConvHalfPixelOffset) {
  // 1x1 kernel of weight 2; every tap shifted by +0.5 along w: samples average neighbours, and
  // the right column reads half of a zero outside the image.
  Tensor x = f32({1, 1, 2, 2}, {1, 2, 3, 4});
  Tensor off = f32({1, 2, 2, 2}, {0, 0, 0, 0, 0.5, 0.5, 0.5, 0.5});
  expect_f(run1("DeformConv", {x, f32({1, 1, 1, 1}, {2}), off})[0], {1, 1, 2, 2}, {3, 2, 7, 4});
}

TEST(OpsAttention, LinearAttentionAccumulatesState) {
  // One head, dk = dv = 1, scale 1: S = 1*3 = 3 then 3 + 2*4 = 11; outputs q*S.
  std::vector<Tensor> r = run1(
      "LinearAttention", {f32({1, 2, 1}, {1, 1}), f32({1, 2, 1}, {1, 2}), f32({1, 2, 1}, {3, 4})},
      {{"q_num_heads", int64_t{1}},
       {"kv_num_heads", int64_t{1}},
       {"update_rule", std::string("linear")}},
      2);
  expect_f(r[0], {1, 2, 1}, {3, 11});
  expect_f(r[1], {1, 1, 1, 1}, {11});
}

TEST(OpsPool, MaxUnpoolAndCol2Im) {
  // Index 3 of the default 2x2 output is its bottom-right element.
  Tensor y = run1(
      "MaxUnpool", {f32({1, 1, 1, 1}, {7}), ints(DType::i64, {1, 1, 1, 1}, {3})},
      {{"kernel_shape", std::vector<int64_t>{2, 2}}, {"strides", std::vector<int64_t>{2, 2}}})[0];
  expect_f(y, {1, 1, 2, 2}, {0, 0, 0, 7});
  // 1x3 image, 1x2 blocks at positions 0 and 1: the middle pixel sums two taps (10 + 2).
  Tensor im = run1("Col2Im", {f32({1, 2, 2}, {1, 2, 10, 20}), ints(DType::i64, {2}, {1, 3}),
                              ints(DType::i64, {2}, {1, 2})})[0];
  expect_f(im, {1, 1, 1, 3}, {1, 12, 20});
}

TEST(OpsConv, ConvIntegerSubtractsZeroPoint) {
  Tensor y = run1("ConvInteger", {ints(DType::u8, {1, 1, 2}, {5, 7}),
                                  ints(DType::u8, {1, 1, 1}, {2}), ints(DType::u8, {}, {3})})[0];
  EXPECT_EQ(y.dtype(), DType::i32);
  EXPECT_EQ(y.get_i(0), 4);
  EXPECT_EQ(y.get_i(1), 8);
}

TEST(OpsAttention, GroupedQueryWithPastCache) {
  // Two query heads share one kv head; zero queries weigh past (v=2) and new (v=4) equally.
  Tensor q = f32({1, 2, 1, 1}, {0, 0});
  Tensor k = f32({1, 1, 1, 1}, {1});
  Tensor v = f32({1, 1, 1, 1}, {4});
  Tensor pk = f32({1, 1, 1, 1}, {5});
  Tensor pv = f32({1, 1, 1, 1}, {2});
  Graph g;
  std::vector<Value*> ins;
  std::vector<Tensor> vals = {q, k, v, pk, pv};
  for (size_t i = 0; i < vals.size(); ++i)
    ins.push_back(g.add_input("in" + std::to_string(i), {DType::f32, vals[i].shape()}));
  // attn_mask (input 3) omitted.
  Node* n = g.add_node(OpRegistry::get().find("Attention"), "n",
                       {ins[0], ins[1], ins[2], nullptr, ins[3], ins[4]}, {"y", "pk", "pv"});
  for (Value* o : n->outputs) g.outputs.push_back(o);
  infer_graph(g);
  std::vector<Tensor> r = run_eager(g, vals);
  expect_f(r[0], {1, 2, 1, 1}, {3, 3});
  expect_f(r[1], {1, 1, 2, 1}, {5, 1});
  expect_f(r[2], {1, 1, 2, 1}, {2, 4});
}

}  // namespace
