// Fusion of a model of repeated refinement blocks (issue 42): RAFT's update step, a convolutional GRU
// and a flow head, each block reading the last one's state and the shared context. Fusing torchvision's
// raft_small took 28.5 s at 4 blocks and more than 30 minutes at 12 (the reachability walks of the
// vertical merges, rescanned from the first group after every merge); tests/python/test_fuse_scaling.py
// fuses it at 16 blocks under a timeout. Here a hand-made chain of 16 such blocks, fused and compiled,
// against eager: the faster merge scan must make the same merges.
#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "graph_test_util.h"
#include "tessel/ir/infer.h"
#include "tessel/kernel/kernel.h"
#include "tessel/lower/cpu.h"
#include "tessel/runtime/interpreter.h"

using namespace tessel;
using testenv::op_node;
using testenv::varied_f32;

namespace {

// `blocks` refinement steps on [1, C, 8, 8] maps: h and flow updated from (h, ctx, flow) each step.
std::unique_ptr<Graph> refinement_chain(int blocks) {
  const int64_t C = 8;
  auto g = std::make_unique<Graph>();
  Value* ctx = g->add_input("ctx", TensorType{DType::f32, {1, C, 8, 8}});
  Value* h = g->add_input("h0", TensorType{DType::f32, {1, C, 8, 8}});
  Value* flow = g->add_input("flow0", TensorType{DType::f32, {1, 2, 8, 8}});
  const std::vector<double> one_value = {1.0};
  Value* one = g->add_constant("one", Tensor::from_f64(DType::f32, {}, one_value));
  const std::map<std::string, Attr> pad1 = {{"pads", std::vector<int64_t>{1, 1, 1, 1}}};
  uint32_t seed = 1;
  auto weight = [&](int64_t out, int64_t in, const std::string& name) {
    Tensor w = varied_f32({out, in, 3, 3}, seed++);
    for (int64_t k = 0; k < w.numel(); ++k) w.set_f(k, w.get_f(k) * 0.1);
    return g->add_constant(name, w);
  };
  for (int b = 0; b < blocks; ++b) {
    const std::string p = "b" + std::to_string(b) + "_";
    Value* hx = op_node(*g, "Concat", p + "hx", {h, ctx, flow}, {{"axis", int64_t{1}}});
    Value* z = op_node(*g, "Sigmoid", p + "z", {op_node(*g, "Conv", p + "convz", {hx, weight(C, 2 * C + 2, p + "wz")}, pad1)});
    Value* r = op_node(*g, "Sigmoid", p + "r", {op_node(*g, "Conv", p + "convr", {hx, weight(C, 2 * C + 2, p + "wr")}, pad1)});
    Value* rh = op_node(*g, "Mul", p + "rh", {r, h});
    Value* rx = op_node(*g, "Concat", p + "rx", {rh, ctx, flow}, {{"axis", int64_t{1}}});
    Value* q = op_node(*g, "Tanh", p + "q", {op_node(*g, "Conv", p + "convq", {rx, weight(C, 2 * C + 2, p + "wq")}, pad1)});
    Value* keep = op_node(*g, "Mul", p + "keep", {op_node(*g, "Sub", p + "1mz", {one, z}), h});
    h = op_node(*g, "Add", p + "h", {keep, op_node(*g, "Mul", p + "zq", {z, q})});
    Value* f1 = op_node(*g, "Relu", p + "f1", {op_node(*g, "Conv", p + "conv1", {h, weight(C, C, p + "w1")}, pad1)});
    flow = op_node(*g, "Add", p + "flow", {flow, op_node(*g, "Conv", p + "conv2", {f1, weight(2, C, p + "w2")}, pad1)});
  }
  g->outputs = {flow, h};
  infer_graph(*g);
  return g;
}

}  // namespace

// 16 blocks fused and compiled give eager's outputs (the fusion is still right at that size).
TEST(FuseScaling, SixteenRefinementBlocksRunAsEager) {
  std::unique_ptr<Graph> g = refinement_chain(16);
  const std::vector<Tensor> ins = {varied_f32({1, 8, 8, 8}, 101), varied_f32({1, 8, 8, 8}, 102), varied_f32({1, 2, 8, 8}, 103)};
  const std::vector<Tensor> ref = run_eager(*g, ins);
  std::unique_ptr<CompiledExecutable> exe = compile_cpu(g->clone(), ins, testenv::compiled_test_options());
  const std::vector<Tensor> out = exe->run(ins);
  ASSERT_EQ(out.size(), ref.size());
  for (size_t i = 0; i < out.size(); ++i)
    for (int64_t k = 0; k < ref[i].numel(); ++k)
      ASSERT_NEAR(out[i].get_f(k), ref[i].get_f(k), 1e-4 * (1 + std::abs(ref[i].get_f(k)))) << "output " << i << " element " << k;
  EXPECT_GT(exe->stats().kernels, 16);
}

// The same fusion per block at every length: the merge scan that resumes after each merge makes the
// merges a scan from the first group would, so each block adds as many kernels at 16 blocks as at 3.
TEST(FuseScaling, EveryBlockFusesAlikeAtEveryLength) {
  auto kernels = [](int blocks) {
    lower::CpuOptions o;
    o.codegen = false;
    return static_cast<int64_t>(lower::lower_cpu(refinement_chain(blocks), o).module.kernels.size());
  };
  const int64_t two = kernels(2), per_block = kernels(3) - two;
  ASSERT_GT(per_block, 0);
  EXPECT_EQ(kernels(8), two + 6 * per_block);
  EXPECT_EQ(kernels(16), two + 14 * per_block);
}
