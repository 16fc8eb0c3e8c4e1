// The fast paths of convolution-heavy models on the compiled and graph backends, each against the
// eager interpreter: a 1-D convolution (Whisper's audio front) runs as a oneDNN conv kernel, a
// convolution reads an input permuted back from [N, H, W, C] (convnext's LayerNorm2d) straight from
// that buffer, and pooling (reduce_window over the last two dims) with pads, strides, dilations,
// ceil mode, NaN and infinities gives the eager results.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <limits>
#include <map>

#include "graph_test_util.h"
#include "tessel/ir/infer.h"
#include "tessel/ir/op_registry.h"
#include "tessel/kernel/kernel.h"
#include "tessel/passes/pass.h"
#include "tessel/runtime/compiled_backend.h"
#include "tessel/runtime/graph_backend.h"
#include "tessel/runtime/interpreter.h"
#include "tessel/targets/cpu/codegen.h"

using namespace tessel;

namespace {

Tensor varied(Shape s, uint32_t seed) { return testenv::varied_f32(std::move(s), seed); }
using testenv::op_node;
CompiledBackendOptions compiled_options() { return testenv::compiled_test_options(); }

// max |out - ref| <= tol · max(|ref|, 1), NaN exactly where ref has NaN, infinities equal.
void expect_close(const std::vector<Tensor>& out, const std::vector<Tensor>& ref, double tol) {
  ASSERT_EQ(out.size(), ref.size());
  for (size_t i = 0; i < out.size(); ++i) {
    ASSERT_EQ(out[i].shape(), ref[i].shape());
    double err = 0, mag = 0;
    for (int64_t j = 0; j < ref[i].numel(); ++j) {
      const double o = out[i].get_f(j), r = ref[i].get_f(j);
      if (std::isnan(r) || std::isinf(r)) {
        EXPECT_TRUE(std::isnan(r) ? std::isnan(o) : o == r) << "output " << i << " element " << j << ": " << o << " vs " << r;
        continue;
      }
      err = std::max(err, std::abs(o - r));
      mag = std::max(mag, std::abs(r));
    }
    EXPECT_LE(err, tol * std::max(mag, 1.0)) << "output " << i << ": max abs error " << err;
  }
}

using Builder = std::unique_ptr<Graph> (*)();

// Compiled against eager; returns the compile statistics.
CompiledCompileStats expect_compiled_matches_eager(Builder build, const std::vector<Tensor>& inputs) {
  auto ref_graph = build();
  const std::vector<Tensor> ref = run_eager(*ref_graph, inputs);
  auto exe = compile_cpu(build(), inputs, compiled_options());
  expect_close(exe->run(inputs), ref, 1e-5);
  return exe->stats();
}

// Whisper's front at a small size: Conv1d(8->16, k3, pad 1) -> Relu -> Conv1d(16->16, k3, stride 2, pad 1)
// with bias.
std::unique_ptr<Graph> conv1d_front() {
  auto g = std::make_unique<Graph>();
  Value* x = g->add_input("x", TensorType{DType::f32, {1, 8, 40}});
  Value* w1 = g->add_constant("w1", varied({16, 8, 3}, 1));
  Value* b1 = g->add_constant("b1", varied({16}, 2));
  Value* w2 = g->add_constant("w2", varied({16, 16, 3}, 3));
  Value* b2 = g->add_constant("b2", varied({16}, 4));
  Value* c1 = op_node(*g, "Conv", "conv1", {x, w1, b1}, {{"pads", std::vector<int64_t>{1, 1}}});
  Value* r = op_node(*g, "Relu", "relu", {c1});
  g->outputs = {op_node(*g, "Conv", "conv2", {r, w2, b2},
                     {{"pads", std::vector<int64_t>{1, 1}}, {"strides", std::vector<int64_t>{2}}})};
  infer_graph(*g);
  return g;
}

// convnext's downsampling after a LayerNorm2d, reduced: x -> Transpose(0,2,3,1) -> Relu (the
// channels-last work) -> Transpose(0,3,1,2) -> Conv 2x2 stride 2 -> Mul 2 -> Conv 1x1. The second
// transpose is a view of the Relu's [N, H, W, C] buffer.
std::unique_ptr<Graph> permuted_conv_input() {
  auto g = std::make_unique<Graph>();
  Value* x = g->add_input("x", TensorType{DType::f32, {1, 8, 6, 6}});
  Value* w = g->add_constant("w", varied({16, 8, 2, 2}, 5));
  Value* w2 = g->add_constant("w2", varied({4, 16, 1, 1}, 6));
  Value* two = g->add_constant("two", Tensor::from_f64(DType::f32, {}, std::vector<double>{2.0}));
  Value* t = op_node(*g, "Transpose", "to_nhwc", {x}, {{"perm", std::vector<int64_t>{0, 2, 3, 1}}});
  Value* r = op_node(*g, "Relu", "relu", {t});
  Value* b = op_node(*g, "Transpose", "to_nchw", {r}, {{"perm", std::vector<int64_t>{0, 3, 1, 2}}});
  Value* c = op_node(*g, "Conv", "down", {b, w}, {{"strides", std::vector<int64_t>{2, 2}}});
  Value* m = op_node(*g, "Mul", "mul", {c, two});
  g->outputs = {op_node(*g, "Conv", "pw", {m, w2})};
  infer_graph(*g);
  return g;
}

// Input with NaN, infinities and ties in the first plane's corners and middle.
Tensor pool_input(const Shape& s) {
  Tensor t = varied(s, 9);
  float* p = t.data<float>();
  p[0] = std::numeric_limits<float>::quiet_NaN();
  p[1] = -std::numeric_limits<float>::infinity();
  p[s[3] + 2] = std::numeric_limits<float>::infinity();
  p[shape_numel(s) / 2] = std::numeric_limits<float>::quiet_NaN();
  p[shape_numel(s) - 1] = -std::numeric_limits<float>::infinity();
  return t;
}

std::unique_ptr<Graph> pools() {
  auto g = std::make_unique<Graph>();
  Value* x = g->add_input("x", TensorType{DType::f32, {2, 3, 11, 10}});
  using V = std::vector<int64_t>;
  g->outputs = {
      op_node(*g, "MaxPool", "max", {x}, {{"kernel_shape", V{3, 3}}, {"strides", V{2, 2}}, {"pads", V{1, 1, 1, 1}}}),
      op_node(*g, "MaxPool", "max_dil", {x}, {{"kernel_shape", V{2, 3}}, {"dilations", V{2, 2}}, {"pads", V{0, 2, 1, 0}}}),
      op_node(*g, "AveragePool", "avg", {x},
           {{"kernel_shape", V{3, 2}}, {"strides", V{2, 3}}, {"pads", V{1, 0, 1, 1}}, {"ceil_mode", int64_t{1}}}),
      op_node(*g, "AveragePool", "avg_pad", {x},
           {{"kernel_shape", V{3, 3}}, {"pads", V{1, 1, 1, 1}}, {"count_include_pad", int64_t{1}}}),
  };
  infer_graph(*g);
  return g;
}

}  // namespace

TEST(ConvPaths, Conv1dRunsAsALibraryConvolution) {
  const CompiledCompileStats st = expect_compiled_matches_eager(conv1d_front, {varied({1, 8, 40}, 7)});
  EXPECT_EQ(st.conv_kernels, 2) << "a 1-D convolution fell back to the typed kernel (the slow path)";
}

// Regression: the convolution's result was laid out channels-last by the layout decision, but the
// convolution itself (input a permuting view) stayed a typed NCHW kernel: wrong results (convnext_tiny).
TEST(ConvPaths, ConvolutionReadsAnInputPermutedFromChannelsLast) {
  const CompiledCompileStats st = expect_compiled_matches_eager(permuted_conv_input, {varied({1, 8, 6, 6}, 8)});
  EXPECT_EQ(st.conv_kernels, 2);
}

TEST(ConvPaths, PoolingMatchesEagerOnGraphAndCompiled) {
  const std::vector<Tensor> inputs = {pool_input({2, 3, 11, 10})};
  auto ref_graph = pools();
  const std::vector<Tensor> ref = run_eager(*ref_graph, inputs);
  auto graph_exe = compile_graph(pools(), inputs);
  expect_close(graph_exe->run(inputs), ref, 1e-6);
  auto exe = compile_cpu(pools(), inputs, compiled_options());
  expect_close(exe->run(inputs), ref, 1e-6);
}

namespace {

// Conv (bias) -> Relu, Gemm (bias) -> Relu and Conv -> LeakyRelu.
std::unique_ptr<Graph> conv_and_gemm_relu() {
  auto g = std::make_unique<Graph>();
  Value* x = g->add_input("x", TensorType{DType::f32, {1, 16, 6, 6}});
  Value* a = g->add_input("a", TensorType{DType::f32, {4, 16}});
  Value* w = g->add_constant("w", varied({16, 16, 1, 1}, 11));
  Value* b = g->add_constant("b", varied({16}, 12));
  Value* wg = g->add_constant("wg", varied({16, 32}, 13));
  Value* bg = g->add_constant("bg", varied({32}, 14));
  Value* w2 = g->add_constant("w2", varied({8, 16, 1, 1}, 17));
  g->outputs = {op_node(*g, "Relu", "relu", {op_node(*g, "Conv", "conv", {x, w, b})}),
                op_node(*g, "Relu", "relu_g", {op_node(*g, "Gemm", "gemm", {a, wg, bg})}),
                op_node(*g, "LeakyRelu", "leaky", {op_node(*g, "Conv", "conv2", {x, w2})}, {{"alpha", 0.1}})};
  infer_graph(*g);
  return g;
}

// Every value class a Relu can see: NaN, ±inf (whose products give NaN and ±inf), -0, denormals.
Tensor special_values(Shape s, uint32_t seed) {
  Tensor t = varied(std::move(s), seed);
  float* p = t.data<float>();
  const float v[] = {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                     -std::numeric_limits<float>::infinity(), -0.0f, 1e-45f, -1e-45f, -1e-38f, 3e38f, -3e38f};
  for (size_t i = 0; i < std::size(v); ++i) p[static_cast<size_t>(t.numel()) * (i + 1) / (std::size(v) + 2)] = v[i];
  return t;
}

}  // namespace

// LeakyRelu after a convolution runs as oneDNN's relu with a slope (no pass over the result after the
// call); Relu after a convolution or matmul runs in the generated pass. Both keep ONNX's semantics:
// NaN stays NaN (oneDNN's own relu maps it to 0), a negative gives +0 after Relu.
TEST(ConvPaths, ActivationsAfterTheLibraryKeepNaN) {
  const std::vector<Tensor> inputs = {special_values({1, 16, 6, 6}, 15), special_values({4, 16}, 16)};
  auto ref_graph = conv_and_gemm_relu();
  const std::vector<Tensor> ref = run_eager(*ref_graph, inputs);
  auto exe = compile_cpu(conv_and_gemm_relu(), inputs, compiled_options());
  const std::vector<Tensor> out = exe->run(inputs);
  expect_close(out, ref, 1e-5);
  int nan = 0, zeros = 0;
  for (size_t i = 0; i < ref.size(); ++i)
    for (int64_t j = 0; j < ref[i].numel(); ++j) {
      const double r = ref[i].get_f(j), o = out[i].get_f(j);
      nan += std::isnan(r);
      if (r == 0 && i < 2) {
        ++zeros;
        EXPECT_FALSE(std::signbit(o)) << "output " << i << " element " << j << " is -0";
      }
    }
  EXPECT_GT(nan, 0) << "the inputs no longer reach the Relu with NaN";
  EXPECT_GT(zeros, 0);
  EXPECT_EQ(exe->stats().library_epilogues, 1) << "LeakyRelu ran after the library call, or Relu inside it";
}

namespace {

// efficientnet's activation: Conv -> Sigmoid -> Mul (SiLU, as torch exports it), and Conv -> Sigmoid.
std::unique_ptr<Graph> conv_silu_and_sigmoid() {
  auto g = std::make_unique<Graph>();
  Value* x = g->add_input("x", TensorType{DType::f32, {1, 16, 6, 6}});
  Value* w = g->add_constant("w", varied({16, 16, 1, 1}, 31));
  Value* b = g->add_constant("b", varied({16}, 32));
  Value* w2 = g->add_constant("w2", varied({16, 1, 3, 3}, 33));
  Value* c = op_node(*g, "Conv", "conv", {x, w, b});
  Value* dw = op_node(*g, "Conv", "dw", {x, w2}, {{"group", int64_t{16}}, {"pads", std::vector<int64_t>{1, 1, 1, 1}}});
  g->outputs = {op_node(*g, "Mul", "silu", {c, op_node(*g, "Sigmoid", "sig", {c})}), op_node(*g, "Sigmoid", "sig2", {dw})};
  infer_graph(*g);
  return g;
}

}  // namespace

// SiLU (x · sigmoid(x)) and sigmoid after a convolution run inside the library call as oneDNN's swish
// and logistic post-ops (no pass over the result after the call); NaN, ±inf and large magnitudes give
// what the eager interpreter gives.
TEST(ConvPaths, SiluAndSigmoidAfterAConvolutionRunInsideTheLibraryCall) {
  const std::vector<Tensor> inputs = {special_values({1, 16, 6, 6}, 35)};
  auto ref_graph = conv_silu_and_sigmoid();
  const std::vector<Tensor> ref = run_eager(*ref_graph, inputs);
  auto exe = compile_cpu(conv_silu_and_sigmoid(), inputs, compiled_options());
  const std::vector<Tensor> out = exe->run(inputs);
  expect_close(out, ref, 1e-5);
  int nan = 0;
  for (const Tensor& r : ref)
    for (int64_t j = 0; j < r.numel(); ++j) nan += std::isnan(r.get_f(j));
  EXPECT_GT(nan, 0) << "the inputs no longer reach the activations with NaN";
  EXPECT_EQ(exe->stats().library_epilogues, 2) << "SiLU or sigmoid ran after the library call";
}

namespace {

// shufflenet's block, reduced: conv -> channel shuffle (reshape, transpose, reshape: not a view a
// library convolution can read) -> a slice of the second half of the channels -> conv.
std::unique_ptr<Graph> shuffled_slice_conv() {
  auto g = std::make_unique<Graph>();
  using V = std::vector<int64_t>;
  Value* x = g->add_input("x", TensorType{DType::f32, {1, 8, 6, 6}});
  Value* w1 = g->add_constant("w1", varied({16, 8, 1, 1}, 21));
  Value* w2 = g->add_constant("w2", varied({8, 8, 3, 3}, 22));
  Value* s1 = g->add_constant("s1", Tensor::from_f64(DType::i64, {5}, std::vector<double>{1, 2, 8, 6, 6}));
  Value* s2 = g->add_constant("s2", Tensor::from_f64(DType::i64, {4}, std::vector<double>{1, 16, 6, 6}));
  Value* st = g->add_constant("st", Tensor::from_f64(DType::i64, {1}, std::vector<double>{8}));
  Value* en = g->add_constant("en", Tensor::from_f64(DType::i64, {1}, std::vector<double>{16}));
  Value* ax = g->add_constant("ax", Tensor::from_f64(DType::i64, {1}, std::vector<double>{1}));
  Value* c1 = op_node(*g, "Conv", "conv1", {x, w1});
  Value* r1 = op_node(*g, "Reshape", "split_groups", {c1, s1});
  Value* t = op_node(*g, "Transpose", "shuffle", {r1}, {{"perm", V{0, 2, 1, 3, 4}}});
  Value* r2 = op_node(*g, "Reshape", "merge_groups", {t, s2});
  Value* half = op_node(*g, "Slice", "second_half", {r2, st, en, ax});
  g->outputs = {op_node(*g, "Conv", "conv2", {half, w2}, {{"pads", V{1, 1, 1, 1}}})};
  infer_graph(*g);
  return g;
}

}  // namespace

// Regression: a convolution reading a channel slice of a shuffled tensor stayed a core node (the
// graph backend's im2col kernel: shufflenet_v2 ran 13 of them); it now reads an explicit dense copy.
TEST(ConvPaths, ConvolutionOfAShuffledChannelSliceIsALibraryKernel) {
  const CompiledCompileStats st = expect_compiled_matches_eager(shuffled_slice_conv, {varied({1, 8, 6, 6}, 23)});
  EXPECT_EQ(st.conv_kernels, 2) << "the second convolution stayed a core node";
}

namespace {

// An inception block, reduced: conv 1x1 -> Relu and conv 3x3 from one input, concatenated along C,
// then a 3x3 stride-1 max pool -> conv 1x1 (googlenet's pool branch), a 3x3 stride-2 ceil-mode max
// pool -> conv 1x1 and an average pool -> conv 1x1; with `cat_is_output` the concatenation is also a
// graph output (which the caller reads row-major).
std::unique_ptr<Graph> inception(bool cat_is_output) {
  auto g = std::make_unique<Graph>();
  using V = std::vector<int64_t>;
  Value* x = g->add_input("x", TensorType{DType::f32, {1, 8, 9, 9}});
  Value* a = op_node(*g, "Relu", "relu_a", {op_node(*g, "Conv", "conv_a", {x, g->add_constant("wa", varied({8, 8, 1, 1}, 31))})});
  Value* b = op_node(*g, "Conv", "conv_b", {x, g->add_constant("wb", varied({4, 8, 3, 3}, 32))}, {{"pads", V{1, 1, 1, 1}}});
  Value* cat = op_node(*g, "Concat", "cat", {a, b}, {{"axis", int64_t{1}}});
  Value* p1 = op_node(*g, "MaxPool", "pool_s1", {cat}, {{"kernel_shape", V{3, 3}}, {"pads", V{1, 1, 1, 1}}});
  Value* p2 = op_node(*g, "MaxPool", "pool_s2", {cat}, {{"kernel_shape", V{3, 3}}, {"strides", V{2, 2}}, {"ceil_mode", int64_t{1}}});
  Value* p3 = op_node(*g, "AveragePool", "pool_avg", {cat}, {{"kernel_shape", V{2, 2}}, {"pads", V{0, 0, 1, 1}}});
  g->outputs = {op_node(*g, "Conv", "proj1", {p1, g->add_constant("w1", varied({4, 12, 1, 1}, 33))}),
                op_node(*g, "Conv", "proj2", {p2, g->add_constant("w2", varied({4, 12, 1, 1}, 34))}),
                op_node(*g, "Conv", "proj3", {p3, g->add_constant("w3", varied({4, 12, 1, 1}, 35))})};
  if (cat_is_output) g->outputs.push_back(cat);
  infer_graph(*g);
  return g;
}

// The kernel module compile_cpu makes of `g` (the core pipeline, then fusion with its options).
KernelModule cpu_kernel_module(std::unique_ptr<Graph> g) {
  run_pipeline(*g, parse_pipeline("core"), PassOptions{});
  return fuse(std::move(g), cpu_fuse_options());
}

// The layout each pooling and concatenation of inception() runs in after fusion as compile_cpu fuses.
// The core graph claims nhwc for all of them first: the fuser must decide for itself.
std::map<std::string, std::string> step_layouts(bool cat_is_output) {
  auto g = inception(cat_is_output);
  run_pipeline(*g, parse_pipeline("core"), PassOptions{});
  for (auto& n : g->mutable_nodes())
    if (n->op->name == "reduce_window" || n->op->name == "concatenate") n->attrs["layout"] = std::string("nhwc");
  KernelModule m = fuse(std::move(g), cpu_fuse_options());
  std::map<std::string, std::string> out;
  for (const auto& n : m.graph->nodes())
    if (n->op->name == "reduce_window" || n->op->name == "concatenate")
      out[n->name] = runs_channels_last(*n) ? "nhwc" : "nchw";
  return out;
}

}  // namespace

// Poolings and the channel concatenation between channels-last convolutions run channels-last
// (no reorder to NCHW and back around them), with the eager results: NaN, infinities, pads, ceil
// mode and averages included. A concatenation that is also a graph output stays row-major, and so
// do the pools that read it; a layout the input graph claims is not trusted.
TEST(ConvPaths, PoolingAndConcatenationBetweenConvolutionsRunChannelsLast) {
  const std::vector<Tensor> inputs = {pool_input({1, 8, 9, 9})};
  expect_compiled_matches_eager([] { return inception(false); }, inputs);
  expect_compiled_matches_eager([] { return inception(true); }, inputs);
  const auto inside = step_layouts(false);
  ASSERT_EQ(inside.size(), 4u);
  for (const auto& [name, layout] : inside) EXPECT_EQ(layout, "nhwc") << name;
  const auto output = step_layouts(true);
  ASSERT_EQ(output.size(), 4u);
  for (const auto& [name, layout] : output) EXPECT_EQ(layout, "nchw") << name;
}

namespace {

// Squeeze-and-excitation pooling, reduced: depthwise conv 1x1 (a NaN stays in its channel) -> Relu
// (channels-last) -> GlobalAveragePool, ReduceMax and ReduceSum over H and W. 300 channels: one full
// block of 256 side-by-side channels and a partial one.
std::unique_ptr<Graph> channel_pools() {
  auto g = std::make_unique<Graph>();
  Value* x = g->add_input("x", TensorType{DType::f32, {1, 300, 5, 7}});
  Value* axes = g->add_constant("axes", Tensor::from_f64(DType::i64, {2}, std::vector<double>{2, 3}));
  Value* c = op_node(*g, "Conv", "conv", {x, g->add_constant("w", varied({300, 1, 1, 1}, 41))}, {{"group", int64_t{300}}});
  Value* r = op_node(*g, "Relu", "relu", {c});
  g->outputs = {op_node(*g, "GlobalAveragePool", "gap", {r}), op_node(*g, "ReduceMax", "rmax", {r, axes}),
                op_node(*g, "ReduceSum", "rsum", {r, axes}, {{"keepdims", int64_t{0}}})};
  infer_graph(*g);
  return g;
}

}  // namespace

// A reduction over the spatial dims of a channels-last value is generated with its loops
// interchanged (the channels side by side, one vector pass per pixel: googlenet's and efficientnet's
// squeeze-and-excitation pools were a gather per element), with the eager results, NaN included,
// whatever the thread count.
TEST(ConvPaths, SpatialReductionOfChannelsLastValuesRunsAcrossChannels) {
  const std::vector<Tensor> inputs = {pool_input({1, 300, 5, 7})};
  auto ref_graph = channel_pools();
  const std::vector<Tensor> ref = run_eager(*ref_graph, inputs);
  int nan = 0;
  for (int64_t j = 0; j < ref[0].numel(); ++j) nan += std::isnan(ref[0].get_f(j));
  ASSERT_GE(nan, 1);
  ASSERT_LE(nan, 10) << "NaN reached most channels: the values are not compared";
  for (int threads : {1, 2, 3}) {
    CompiledBackendOptions o = compiled_options();
    o.threads = threads;
    auto exe = compile_cpu(channel_pools(), inputs, o);
    expect_close(exe->run(inputs), ref, 1e-5);
  }
  const KernelModule m = cpu_kernel_module(channel_pools());
  int column = 0;
  for (size_t i = 0; i < m.kernels.size(); ++i) {
    column += cpu::generate_kernel(m.kernels[i], i).find("column reduction") != std::string::npos;
  }
  EXPECT_GE(column, 1) << "no spatial reduction was generated across channels";
}

namespace {

// A model's stem, reduced: the 3-channel image input -> conv 3x3 stride 2 -> Relu -> conv 1x1.
std::unique_ptr<Graph> stem() {
  auto g = std::make_unique<Graph>();
  using V = std::vector<int64_t>;
  Value* x = g->add_input("x", TensorType{DType::f32, {1, 3, 13, 11}});
  Value* c = op_node(*g, "Conv", "stem", {x, g->add_constant("w", varied({8, 3, 3, 3}, 51)), g->add_constant("b", varied({8}, 52))},
                     {{"strides", V{2, 2}}, {"pads", V{1, 1, 1, 1}}});
  Value* r = op_node(*g, "Relu", "relu", {c});
  g->outputs = {op_node(*g, "Conv", "pw", {r, g->add_constant("w2", varied({8, 8, 1, 1}, 53))})};
  infer_graph(*g);
  return g;
}

}  // namespace

// The first convolution reads a channels-last copy of the image input made by a generated kernel,
// so oneDNN runs it NHWC to NHWC (its direct NCHW kernel wrote a blocked result whose reorder cost
// more than the convolution), with the eager results.
TEST(ConvPaths, FirstLayerReadsAChannelsLastCopyOfTheImage) {
  const CompiledCompileStats st = expect_compiled_matches_eager(stem, {pool_input({1, 3, 13, 11})});
  EXPECT_EQ(st.conv_kernels, 2);
  const KernelModule m = cpu_kernel_module(stem());
  int channels_last_stems = 0;
  for (const Kernel& k : m.kernels) channels_last_stems += k.kind == KernelKind::conv && k.conv.c == 3 && k.conv.x_nhwc;
  EXPECT_EQ(channels_last_stems, 1) << print_kernel_module(m, true);
}

// A layout is nchw or nhwc, and nhwc is for 4-D operands: anything else is an error naming the node
// (a model file or a cached kernel module cannot make the runtime read a buffer in a made-up order).
TEST(ConvPaths, ALayoutOtherThanNchwOrNhwcIsAnError) {
  auto g = inception(false);
  run_pipeline(*g, parse_pipeline("core"), PassOptions{});
  Node* pool = nullptr;
  for (auto& n : g->mutable_nodes())
    if (n->op->name == "reduce_window") pool = n.get();
  ASSERT_NE(pool, nullptr);
  pool->attrs["layout"] = std::string("nhwx");
  try {
    infer_graph(*g);
    FAIL() << "layout nhwx was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("layout 'nhwx' is neither nchw nor nhwc"), std::string::npos) << e.what();
  }
  pool->attrs["layout"] = std::string("nhwc");
  EXPECT_NO_THROW(infer_graph(*g));
}

namespace {

// Video models' Conv3d (issue 42: only 2-d convolutions had a typed kernel; a 3-d one ran the reference
// kernel, ~40x ONNX Runtime's time): strides, asymmetric pads, a dilation, groups, a bias, and a depth
// window that reaches past both ends; the first convolution large enough to split its slices over the
// threads.
// Constant weights run through oneDNN's 3-d convolution; weights given as an input (second graph
// input when `weights_input`) through the typed vol2col product.
std::unique_ptr<Graph> conv3d_block(bool weights_input) {
  auto g = std::make_unique<Graph>();
  Value* x = g->add_input("x", TensorType{DType::f32, {2, 4, 6, 17, 20}});
  Value* w1 = weights_input ? g->add_input("w1", TensorType{DType::f32, {6, 4, 3, 3, 3}}) : g->add_constant("w1", varied({6, 4, 3, 3, 3}, 31));
  Value* b1 = g->add_constant("b1", varied({6}, 32));
  Value* w2 = weights_input ? g->add_input("w2", TensorType{DType::f32, {6, 3, 1, 3, 3}}) : g->add_constant("w2", varied({6, 3, 1, 3, 3}, 33));
  Value* c1 = op_node(*g, "Conv", "conv1", {x, w1, b1},
                      {{"pads", std::vector<int64_t>{1, 0, 2, 1, 1, 0}}, {"strides", std::vector<int64_t>{1, 2, 1}}});
  Value* r = op_node(*g, "Relu", "relu", {c1});
  g->outputs = {op_node(*g, "Conv", "conv2", {r, w2},
                        {{"pads", std::vector<int64_t>{0, 2, 2, 0, 2, 2}}, {"dilations", std::vector<int64_t>{1, 2, 2}},
                         {"group", int64_t{2}}})};
  infer_graph(*g);
  return g;
}

}  // namespace

TEST(ConvPaths, Conv3dMatchesEagerOnGraphAndCompiled) {
  for (bool weights_input : {false, true}) {
    SCOPED_TRACE(weights_input ? "weights as inputs (vol2col)" : "constant weights (oneDNN)");
    std::vector<Tensor> inputs = {varied({2, 4, 6, 17, 20}, 30)};
    if (weights_input) inputs.push_back(varied({6, 4, 3, 3, 3}, 31)), inputs.push_back(varied({6, 3, 1, 3, 3}, 33));
    auto ref_graph = conv3d_block(weights_input);
    const std::vector<Tensor> ref = run_eager(*ref_graph, inputs);
    auto graph_exe = compile_graph(conv3d_block(weights_input), inputs);
    expect_close(graph_exe->run(inputs), ref, 1e-5);
    EXPECT_EQ(graph_exe->stats().fallback_count(), 0) << "a 3-d convolution fell back to the reference kernel";
    auto exe = compile_cpu(conv3d_block(weights_input), inputs, compiled_options());
    expect_close(exe->run(inputs), ref, 1e-5);
    EXPECT_EQ(exe->stats().graph.fallback_count(), 0);
  }
}
