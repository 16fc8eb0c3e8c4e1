// Decomposition hooks of the matmul and conv/pool families: every case runs one node with its
// reference kernel (the oracle), then the same node through the core pipeline, which must leave
// only core ops and reproduce the values.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "tessel/ir/infer.h"
#include "tessel/ir/op_registry.h"
#include "tessel/passes/pass.h"
#include "tessel/runtime/interpreter.h"
#include "op_test_util.h"

using namespace tessel;
using namespace tessel::testenv;

namespace {

using Arg = NodeInput;

using Attrs = std::map<std::string, Attr>;

// Runs the node eagerly and after the core pipeline; the two must agree (relative tolerance).
std::vector<Tensor> same_after_core(const std::string& op, const std::vector<Arg>& args, int outs = 1,
                                    const Attrs& attrs = {}, double tol = 1e-5) {
  std::vector<Tensor> feeds;
  Graph ref = one_node_graph(op, args, outs, attrs, feeds);
  const std::vector<Tensor> want = run_eager(ref, feeds);
  Graph g = one_node_graph(op, args, outs, attrs, feeds);
  run_pipeline(g, parse_pipeline("core"), PassOptions{});
  for (const auto& n : g.nodes()) EXPECT_EQ(n->op->domain, "tessel.core") << op << " left " << n->op_name();
  const std::vector<Tensor> got = run_eager(g, feeds);
  EXPECT_EQ(got.size(), want.size());
  for (size_t i = 0; i < std::min(got.size(), want.size()); ++i) {
    EXPECT_EQ(got[i].dtype(), want[i].dtype()) << op << " output " << i;
    EXPECT_EQ(got[i].shape(), want[i].shape()) << op << " output " << i;
    const std::vector<double> w = want[i].to_f64(), a = got[i].to_f64();
    if (w.size() != a.size()) continue;
    for (size_t j = 0; j < w.size(); ++j) {
      if (std::isnan(w[j]))
        EXPECT_TRUE(std::isnan(a[j])) << op << " output " << i << " element " << j;
      else
        EXPECT_NEAR(a[j], w[j], tol * (1 + std::fabs(w[j]))) << op << " output " << i << " element " << j;
    }
  }
  return got;
}

// Deterministic values in [-2, 2) (a linear congruential sequence).
Tensor noise(DType t, Shape s, uint32_t seed = 1) {
  std::vector<double> v(static_cast<size_t>(shape_numel(s)));
  uint32_t x = seed * 2654435761u + 12345u;
  for (double& e : v) {
    x = x * 1664525u + 1013904223u;
    e = static_cast<double>(x >> 8) / static_cast<double>(1 << 24) * 4.0 - 2.0;
  }
  return Tensor::from_f64(t, std::move(s), v);
}

Tensor small_ints(DType t, Shape s, int64_t lo, int64_t hi, uint32_t seed = 1) {
  std::vector<int64_t> v(static_cast<size_t>(shape_numel(s)));
  uint32_t x = seed * 2654435761u + 777u;
  for (int64_t& e : v) {
    x = x * 1664525u + 1013904223u;
    e = lo + static_cast<int64_t>((x >> 8) % static_cast<uint32_t>(hi - lo + 1));
  }
  return Tensor::from_i64(t, std::move(s), v);
}

using V = std::vector<int64_t>;

}  // namespace

TEST(DecomposeMatmul, GemmTransposesScalesAndBroadcastsC) {
  Tensor a = noise(DType::f32, {4, 3}, 1), bt = noise(DType::f32, {5, 4}, 2);
  auto y = same_after_core("Gemm", {{a}, {bt}, {noise(DType::f32, {5}, 3)}}, 1,
                           {{"transA", int64_t{1}}, {"transB", int64_t{1}}, {"alpha", 0.5}, {"beta", -2.0}});
  EXPECT_EQ(y[0].shape(), (Shape{3, 5}));
  same_after_core("Gemm", {{noise(DType::f32, {2, 3}, 4)}, {noise(DType::f32, {3, 2}, 5)}, {noise(DType::f32, {2, 1}, 6)}});
  same_after_core("Gemm", {{noise(DType::f16, {3, 8}, 7)}, {noise(DType::f16, {8, 2}, 8)}, {noise(DType::f16, {1}, 9)}}, 1,
                  {{"alpha", 0.25}}, 2e-3);
  // Integer Gemm with a scale: the kernel scales in double and truncates toward zero.
  Tensor ia = small_ints(DType::i32, {2, 3}, -9, 9), ib = small_ints(DType::i32, {3, 2}, -9, 9, 2);
  auto iy = same_after_core("Gemm", {{ia}, {ib}, {small_ints(DType::i32, {2, 2}, -5, 5, 3)}}, 1,
                            {{"alpha", 0.5}, {"beta", 3.0}});
  EXPECT_EQ(iy[0].dtype(), DType::i32);
}

TEST(DecomposeMatmul, MatMulIntegerZeroPointsPerRowAndColumn) {
  Tensor a = small_ints(DType::u8, {2, 3, 4}, 0, 255, 1), b = small_ints(DType::i8, {4, 5}, -128, 127, 2);
  same_after_core("MatMulInteger", {{a}, {b}, {small_ints(DType::u8, {3}, 0, 255, 3)}, {small_ints(DType::i8, {5}, -9, 9, 4)}});
  same_after_core("MatMulInteger", {{a}, {small_ints(DType::u8, {4}, 0, 255, 5)}, {small_ints(DType::u8, {}, 0, 255, 6)}});
}

TEST(DecomposeMatmul, EinsumDiagonalsEllipsisChainsAndSums) {
  same_after_core("Einsum", {{noise(DType::f32, {3, 3, 3})}}, 1, {{"equation", std::string("iii->i")}});
  auto d = same_after_core("Einsum", {{f32({2, 2}, {1, 2, 3, 4})}}, 1,
                           {{"equation", std::string("ii")}});
  expect_near(d[0], {5});  // implicit output of a diagonal: the trace
  same_after_core("Einsum", {{noise(DType::f32, {2, 4, 4})}}, 1, {{"equation", std::string("...ii->...i")}});
  same_after_core("Einsum", {{noise(DType::f32, {1, 2, 3}, 1)}, {noise(DType::f32, {4, 3, 2}, 2)}}, 1,
                  {{"equation", std::string("...ij,...jk->...ik")}});
  same_after_core("Einsum", {{noise(DType::f32, {2, 3}, 1)}, {noise(DType::f32, {3, 4}, 2)}, {noise(DType::f32, {4, 2}, 3)}},
                  1, {{"equation", std::string("ij,jk,kl->li")}});
  same_after_core("Einsum", {{noise(DType::f32, {2, 3}, 1)}, {noise(DType::f32, {3, 4}, 2)}}, 1,
                  {{"equation", std::string("ij,jk->k")}});
  same_after_core("Einsum", {{noise(DType::f32, {2, 3}, 1)}, {noise(DType::f32, {4}, 2)}}, 1,
                  {{"equation", std::string("ij,k")}});
  same_after_core("Einsum", {{small_ints(DType::i32, {2, 3, 2}, -5, 5)}, {small_ints(DType::i32, {2, 2}, -5, 5, 2)}}, 1,
                  {{"equation", std::string("bij , bj -> bi")}});
}

TEST(DecomposeMatmul, DetSmallMatrices) {
  same_after_core("Det", {{noise(DType::f32, {2, 3, 3})}}, 1, {}, 1e-4);
  same_after_core("Det", {{noise(DType::f64, {4, 4})}});
  auto y = same_after_core("Det", {{f32({2, 2}, {1, 2, 3, 4})}});
  expect_near(y[0], {-2});
}

TEST(DecomposeConv, ConvGroupsStridesDilationsAutoPadBias) {
  Tensor x = noise(DType::f32, {2, 4, 7, 6}, 1), w = noise(DType::f32, {6, 2, 3, 2}, 2), bias = noise(DType::f32, {6}, 3);
  for (const char* ap : {"SAME_UPPER", "SAME_LOWER", "VALID"})
    same_after_core("Conv", {{x}, {w}, {bias}}, 1,
                    {{"group", int64_t{2}}, {"strides", V{2, 1}}, {"auto_pad", std::string(ap)}});
  same_after_core("Conv", {{x}, {w}}, 1,
                  {{"group", int64_t{2}}, {"dilations", V{2, 2}}, {"pads", V{1, 0, 2, 1}}, {"strides", V{1, 2}}});
  // Depthwise, half precision with a bias.
  same_after_core("Conv", {{noise(DType::f16, {1, 3, 5, 5})}, {noise(DType::f16, {3, 1, 3, 3}, 2)}, {noise(DType::f16, {3}, 3)}},
                  1, {{"group", int64_t{3}}, {"pads", V{1, 1, 1, 1}}}, 2e-3);
  same_after_core("ConvInteger", {{small_ints(DType::u8, {1, 2, 4, 4}, 0, 255)}, {small_ints(DType::u8, {3, 2, 2, 2}, 0, 255, 2)},
                                  {small_ints(DType::u8, {}, 0, 255, 3)}, {small_ints(DType::u8, {3}, 0, 255, 4)}},
                  1, {{"pads", V{1, 0, 0, 1}}});
}

// The kernel taps that read only padding are dropped from a constant weight (DeepLabV3's ASPP: dilation
// 24 and 36 over a 14 x 14 map leave the centre tap alone, a 1 x 1 convolution): the core convolution's
// weight shrinks, the values stay the reference kernel's. Cases: both ends of a dim dead, one end dead
// with a stride, nothing dead, and an inf weight on a dead tap (kept whole: the taps dropped are finite).
TEST(DecomposeConv, DropsKernelTapsThatReadOnlyPadding) {
  auto core_weight = [](const std::string& op, const std::vector<Arg>& args, const Attrs& attrs, bool compare = true) {
    if (compare) same_after_core(op, args, 1, attrs);
    std::vector<Tensor> feeds;
    Graph g = one_node_graph(op, args, 1, attrs, feeds);
    run_pipeline(g, parse_pipeline("core"), PassOptions{});
    for (const auto& n : g.nodes())
      if (is_core_op(*n, CoreOp::convolution)) return n->inputs[1]->type.shape;
    return Shape{};
  };
  Tensor x = noise(DType::f32, {1, 3, 6, 5}, 1), w = noise(DType::f32, {4, 3, 3, 3}, 2), bias = noise(DType::f32, {4}, 3);
  EXPECT_EQ(core_weight("Conv", {{x}, {w, true}, {bias, true}}, {{"dilations", V{7, 7}}, {"pads", V{7, 7, 7, 7}}}),
            (Shape{4, 3, 1, 1}));
  EXPECT_EQ(core_weight("Conv", {{x}, {w, true}}, {{"dilations", V{6, 1}}, {"pads", V{6, 1, 6, 1}}}), (Shape{4, 3, 1, 3}));
  EXPECT_EQ(core_weight("Conv", {{x}, {w, true}}, {{"dilations", V{4, 1}}, {"pads", V{5, 0, 0, 0}}, {"strides", V{2, 1}}}),
            (Shape{4, 3, 2, 3}));
  EXPECT_EQ(core_weight("Conv", {{x}, {w, true}}, {{"dilations", V{2, 2}}, {"pads", V{2, 2, 2, 2}}}), (Shape{4, 3, 3, 3}));
  std::vector<double> wv = w.to_f64();
  wv[0] = std::numeric_limits<double>::infinity();  // tap (0, 0) of filter 0: dead at dilation 7
  Tensor winf = Tensor::from_f64(DType::f32, w.shape(), wv);
  // (values not compared: the core convolution's kernels skip padded taps, as oneDNN's do, where the
  // ONNX reference multiplies them)
  EXPECT_EQ(core_weight("Conv", {{x}, {winf, true}}, {{"dilations", V{7, 7}}, {"pads", V{7, 7, 7, 7}}}, false),
            (Shape{4, 3, 3, 3}));
  // A weight that is not a constant (a graph input) is not read, so not cropped.
  EXPECT_EQ(core_weight("Conv", {{x}, {w}}, {{"dilations", V{7, 7}}, {"pads", V{7, 7, 7, 7}}}), (Shape{4, 3, 3, 3}));
}

TEST(DecomposeConv, ConvTransposeStridesPadsGroupsOutputShape) {
  Tensor x = noise(DType::f32, {2, 4, 3, 4}, 1), w = noise(DType::f32, {4, 3, 3, 2}, 2), bias = noise(DType::f32, {6}, 3);
  same_after_core("ConvTranspose", {{x}, {w}, {bias}}, 1,
                  {{"group", int64_t{2}}, {"strides", V{2, 3}}, {"pads", V{1, 0, 2, 1}}, {"output_padding", V{1, 2}}});
  same_after_core("ConvTranspose", {{x}, {w}}, 1, {{"dilations", V{2, 1}}, {"strides", V{2, 2}}, {"output_shape", V{9, 10}}});
  same_after_core("ConvTranspose", {{x}, {w}}, 1, {{"strides", V{2, 2}}, {"auto_pad", std::string("SAME_LOWER")}});
  same_after_core("ConvTranspose", {{noise(DType::f32, {1, 2, 5})}, {noise(DType::f32, {2, 2, 3}, 2)}}, 1,
                  {{"strides", V{3}}, {"pads", V{2, 2}}});
}

TEST(DecomposeConv, Col2ImAndCausalConvWithState) {
  // image 5x6, block 2x3, dilation (2, 1), stride (1, 2), pads (1, 0, 0, 1): L = 4 * 3 blocks.
  Tensor img = i64({2}, {5, 6}), blk = i64({2}, {2, 3});
  same_after_core("Col2Im", {{noise(DType::f32, {1, 2 * 6, 4 * 3})}, {img, true}, {blk, true}}, 1,
                  {{"dilations", V{2, 1}}, {"strides", V{1, 2}}, {"pads", V{1, 0, 0, 1}}});
  Tensor x = noise(DType::f32, {2, 3, 5}, 1), w = noise(DType::f32, {3, 1, 4}, 2);
  same_after_core("CausalConvWithState", {{x}, {w}, {noise(DType::f32, {3}, 3)}, {noise(DType::f32, {2, 3, 3}, 4)}}, 2,
                  {{"activation", std::string("silu")}});
  same_after_core("CausalConvWithState", {{x}, {noise(DType::f32, {3, 1, 1}, 5)}}, 2);
}

TEST(DecomposePool, AverageAndLpPoolEdges) {
  Tensor x = noise(DType::f32, {1, 2, 5, 6}, 1);
  for (int64_t include : {0, 1})
    for (int64_t ceil : {0, 1})
      same_after_core("AveragePool", {{x}}, 1,
                      {{"kernel_shape", V{3, 2}}, {"strides", V{2, 2}}, {"pads", V{1, 0, 1, 1}},
                       {"count_include_pad", include}, {"ceil_mode", ceil}, {"dilations", V{1, 2}}});
  same_after_core("AveragePool", {{x}}, 1, {{"kernel_shape", V{2, 3}}, {"auto_pad", std::string("SAME_LOWER")}});
  same_after_core("AveragePool", {{noise(DType::f16, {1, 1, 4, 4})}}, 1, {{"kernel_shape", V{3, 3}}, {"pads", V{1, 1, 1, 1}}}, 2e-3);
  same_after_core("LpPool", {{x}}, 1, {{"kernel_shape", V{2, 2}}, {"p", int64_t{3}}, {"pads", V{0, 1, 1, 0}}}, 1e-4);
  same_after_core("LpPool", {{x}}, 1, {{"kernel_shape", V{2, 2}}, {"p", int64_t{1}}});
  same_after_core("GlobalAveragePool", {{x}});
  same_after_core("GlobalMaxPool", {{x}});
}

TEST(DecomposePool, MaxPoolIndicesAndUnpool) {
  Tensor x = noise(DType::f32, {2, 2, 5, 5}, 1);
  for (int64_t order : {0, 1}) {
    auto y = same_after_core("MaxPool", {{x}}, 2,
                             {{"kernel_shape", V{3, 2}}, {"strides", V{2, 2}}, {"pads", V{1, 1, 1, 0}},
                              {"ceil_mode", int64_t{1}}, {"storage_order", order}});
    EXPECT_EQ(y[1].dtype(), DType::i64);
  }
  same_after_core("MaxPool", {{small_ints(DType::u8, {1, 1, 4, 4}, 0, 3)}}, 2,
                  {{"kernel_shape", V{2, 2}}, {"dilations", V{2, 1}}, {"pads", V{1, 1, 0, 0}}});
  // MaxUnpool of MaxPool's indices, into the default shape and into a larger explicit one.
  Tensor xs = noise(DType::f32, {1, 2, 4, 4}, 3);
  std::vector<Tensor> pooled = run_op("MaxPool", {xs}, 2, {{"kernel_shape", V{2, 2}}, {"strides", V{2, 2}}});
  same_after_core("MaxUnpool", {{pooled[0]}, {pooled[1]}}, 1, {{"kernel_shape", V{2, 2}}, {"strides", V{2, 2}}});
  same_after_core("MaxUnpool", {{pooled[0]}, {pooled[1]}, {i64({4}, {1, 2, 5, 5}), true}}, 1,
                  {{"kernel_shape", V{2, 2}}, {"strides", V{2, 2}}});
}

TEST(DecomposeConv, DeformConvOffsetGroupsMaskBias) {
  // Offsets up to +-2 move taps across cell borders and outside the input.
  Tensor x = noise(DType::f32, {2, 4, 5, 4}, 1), w = noise(DType::f32, {6, 2, 2, 3}, 2);
  const Shape out = {2, 6, 3, 4};  // pads (1, 1, 0, 1), stride (2, 1)
  Tensor off = noise(DType::f32, {2, 2 * 2 * 6, 3, 4}, 3), mask = noise(DType::f32, {2, 2 * 6, 3, 4}, 4);
  auto y = same_after_core("DeformConv", {{x}, {w}, {off}, {noise(DType::f32, {6}, 5)}, {mask}}, 1,
                           {{"group", int64_t{2}}, {"offset_group", int64_t{2}}, {"pads", V{1, 1, 0, 1}},
                            {"strides", V{2, 1}}},
                           1e-4);
  EXPECT_EQ(y[0].shape(), out);
  same_after_core("DeformConv", {{noise(DType::f32, {1, 2, 6}, 6)}, {noise(DType::f32, {3, 2, 3}, 7)}, {noise(DType::f32, {1, 3, 4}, 8)}},
                  1, {{"dilations", V{2}}, {"pads", V{1, 1}}}, 1e-4);
}
