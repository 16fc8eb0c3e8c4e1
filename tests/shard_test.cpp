// Tensor-parallel sharding (passes/shard.h) run through the lockstep SPMD interpreter (runtime/spmd.h):
// every rank's outputs against the model's own reference outputs (ONNX Runtime / PyTorch, written
// with the model), the collectives each split needs, and bad input.
#include <gtest/gtest.h>

#include <cmath>

#include "corpus_util.h"
#include "tessel/ir/printer.h"
#include "tessel/driver/model_dir.h"
#include "tessel/driver/multichip.h"
#include "tessel/hw/hw.h"
#include "tessel/passes/pass.h"
#include "tessel/passes/shard.h"
#include "tessel/runtime/interpreter.h"
#include "tessel/runtime/spmd.h"
#include "tessel/support/error.h"

namespace tessel {
namespace {

std::vector<const Graph*> views(const ShardedProgram& p) {
  std::vector<const Graph*> v;
  for (const auto& g : p.graphs) v.push_back(g.get());
  return v;
}

struct Sharded {
  testenv::CorpusCase c;
  ShardedProgram p;
};

Sharded shard_model(const std::string& name, int tp) {
  Sharded s{testenv::load_corpus_model(name), {}};
  run_pipeline(*s.c.model.graph, parse_pipeline("simplify"), PassOptions{});
  s.p = shard_tensor_parallel(*s.c.model.graph, tp);
  return s;
}

class ShardCorpus : public ::testing::TestWithParam<std::tuple<std::string, int>> {};

TEST_P(ShardCorpus, EveryRankMatchesTheModelsReference) {
  const auto& [name, tp] = GetParam();
  Sharded s = shard_model(name, tp);
  ASSERT_EQ(s.p.graphs.size(), size_t(tp));
  auto outs = run_spmd(views(s.p), s.c.inputs);
  for (int r = 0; r < tp; ++r) testenv::expect_matches_reference(outs[size_t(r)], s.c.refs, fmt::format("{} tp={} rank {}", name, tp, r));
  // the split pays: each rank holds well under the whole of the weights
  EXPECT_LT(double(s.p.weight_bytes_per_rank), 0.8 * double(s.p.weight_bytes)) << name;
}

INSTANTIATE_TEST_SUITE_P(Models, ShardCorpus,
                         ::testing::Combine(::testing::Values("tblock_bert", "tblock_s", "attn_s", "ffn_s", "bert_tiny", "gpt2_tiny", "mobilenet_v2"),
                                            ::testing::Values(2, 4)),
                         [](const auto& info) { return std::get<0>(info.param) + "_tp" + std::to_string(std::get<1>(info.param)); });

// Megatron's block: QKV and fc1 by columns (QKV's fused weight in 3 blocks, so the Split gives each
// rank its heads of Q, K and V), proj and fc2 by rows, one all-reduce after each, nothing gathered.
TEST(Shard, ATransformerBlockIsSplitAsMegatronSplitsIt) {
  Sharded s = shard_model("tblock_bert", 4);
  EXPECT_EQ(s.p.all_reduces, 2);
  EXPECT_EQ(s.p.all_gathers, 0);
  std::string rules;
  for (const auto& d : s.p.decisions) rules += d.node + ": " + d.rule + "\n";
  EXPECT_NE(rules.find("/qkv/MatMul: column-parallel: 'onnx::MatMul_95' [768,2304] split by columns, 576 per rank (3 blocks of 192)"), std::string::npos) << rules;
  EXPECT_NE(rules.find("/proj/MatMul: row-parallel"), std::string::npos) << rules;
  EXPECT_NE(rules.find("/fc1/MatMul: column-parallel"), std::string::npos) << rules;
  EXPECT_NE(rules.find("/fc2/MatMul: row-parallel"), std::string::npos) << rules;
  // each rank: 3 of the 12 heads
  const Graph& g = *s.p.graphs[1];
  bool heads = false;
  for (const auto& n : g.nodes())
    if (n->op_name() == "Softmax") heads = n->outputs[0]->type.shape == Shape{1, 3, 128, 128};
  EXPECT_TRUE(heads);
}

// A convnet's channels: 1x1 expansions by output channels, the depthwise convs keep the split (a
// quarter of the groups each), the 1x1 projections by input channels with one all-reduce per block.
TEST(Shard, MobileNetsChannelsAreSplitPerBlock) {
  Sharded s = shard_model("mobilenet_v2", 4);
  EXPECT_EQ(s.p.all_reduces, 17);
  int depthwise = 0;
  for (const auto& n : s.p.graphs[2]->nodes())
    if (n->op_name() == "Conv" && n->attr_i("group", 1) > 1) {
      ++depthwise;
      EXPECT_EQ(n->attr_i("group"), n->outputs[0]->type.shape[1]) << n->name;  // one group per channel it holds
    }
  EXPECT_EQ(depthwise, 17);
}

// A sequence-first layout (nn.MultiheadAttention's export): [S, B, D] split by columns, reshaped to
// [S, B x heads, hd] — each batch's heads are a block, so the split becomes 2 blocks of the merged dim
// and goes through the per-head attention and back without a gather.
TEST(Shard, HeadsMergedWithTheBatchStaySplitInBlocks) {
  auto weights = [](int seed) {
    std::string t;
    for (int i = 0; i < 64; ++i) t += fmt::format("{}{}", i ? ", " : "", ((i * 37 + seed * 11) % 17 - 8) / 8.0);
    return "[" + t + "]";
  };
  const std::string text = "graph @g(%x: f32[4,2,8]) {\n"
                           "  const %w1: f32[8,8] = " + weights(1) + "\n"
                           "  const %w2: f32[8,8] = " + weights(2) + "\n"
                           "  const %heads: i64[3] = [4, 8, 2]\n"
                           "  const %back: i64[3] = [4, 2, 8]\n"
                           "  %q: f32[4,2,8] = MatMul(%x, %w1) loc(\"q\")\n"
                           "  %h: f32[4,8,2] = Reshape(%q, %heads) loc(\"h\")\n"
                           "  %t: f32[8,4,2] = Transpose(%h) {perm = [1, 0, 2]} loc(\"t\")\n"
                           "  %s: f32[8,4,2] = Softmax(%t) {axis = -1} loc(\"s\")\n"
                           "  %u: f32[4,8,2] = Transpose(%s) {perm = [1, 0, 2]} loc(\"u\")\n"
                           "  %m: f32[4,2,8] = Reshape(%u, %back) loc(\"m\")\n"
                           "  %y: f32[4,2,8] = MatMul(%m, %w2) loc(\"y\")\n"
                           "  return %y\n}\n";
  auto g = parse_graph(text);
  ShardedProgram p = shard_tensor_parallel(*g, 2);
  EXPECT_EQ(p.all_reduces, 1);
  EXPECT_EQ(p.all_gathers, 0);
  std::vector<double> xs(64);
  for (size_t i = 0; i < xs.size(); ++i) xs[i] = std::sin(double(i));
  const Tensor x = Tensor::from_f64(DType::f32, {4, 2, 8}, xs);
  const auto want = run_eager(*g, {x});
  const auto got = run_spmd(views(p), {x});
  for (const auto& rank : got) testenv::expect_matches_reference(rank, want, "seq-first heads", 1e-6);
}

// One chip: the sharded path (stages compiled from the graph the sharding reads) times exactly what the
// single-chip simulation times. (It once failed: the graph passes before the sharding left a Split's
// sizes in a form the stage's core pipeline could not decompose.)
TEST(MultiChipRun, OneChipIsTheSingleChipSimulation) {
  const std::string model = testenv::shared_dir() + "/models/tblock_bert";
  MultiChipOptions o;
  o.shard = parse_shard("tp=1");
  const MultiChipRun r = run_multichip(model, model_inputs(model), hw::load_preset("spyre"), o);
  ASSERT_EQ(r.stages.size(), 1u);
  EXPECT_EQ(r.system.collectives.size(), 0u);
  EXPECT_GT(r.one_chip_seconds, 0);
  EXPECT_DOUBLE_EQ(r.system.seconds, r.one_chip_seconds);
  EXPECT_EQ(r.max_rel, 0);
}

TEST(Shard, OneRankIsTheGraphItself) {
  Sharded s = shard_model("tblock_s", 1);
  auto outs = run_spmd(views(s.p), s.c.inputs);
  testenv::expect_matches_reference(outs[0], s.c.refs, "tp=1");
  EXPECT_EQ(s.p.all_reduces + s.p.all_gathers, 0);
}

TEST(Shard, BadInputIsOneLine) {
  auto c = testenv::load_corpus_model("ffn_s");
  EXPECT_THROW(shard_tensor_parallel(*c.model.graph, 0), Error);
  EXPECT_THROW(shard_tensor_parallel(*c.model.graph, 5000), Error);
  // a graph with a size symbol: shard it bound
  auto g = parse_graph("graph @g(%x: f32[s0,8]) {\n  %y: f32[s0,8] = Relu(%x) loc(\"r\")\n  return %y\n}\n");
  try {
    shard_tensor_parallel(*g, 2);
    FAIL() << "a symbolic graph was sharded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("symbolic"), std::string::npos) << e.what();
  }
}

// The ranks' programs must agree: a collective whose group is not the ranks run, or ranks of
// different programs, are refused naming the node.
TEST(Spmd, MismatchedGroupsAreRefused) {
  auto g = parse_graph("graph @g(%x: f32[4]) {\n  %y: f32[4] = AllReduce(%x) {ranks = 4} loc(\"ar\")\n  return %y\n}\n");
  std::vector<const Graph*> two{g.get(), g.get()};
  Tensor x(DType::f32, {4});
  try {
    run_spmd(two, {x});
    FAIL() << "a 4-rank collective ran on 2 ranks";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("group has 4 ranks but the program runs 2"), std::string::npos) << e.what();
  }
  auto h = parse_graph("graph @g(%x: f32[4]) {\n  %y: f32[4] = Relu(%x) loc(\"r\")\n  return %y\n}\n");
  EXPECT_THROW(run_spmd({g.get(), h.get()}, {x}), Error);
  // one rank alone: the plain interpreter refuses a 4-rank collective rather than returning its input
  EXPECT_THROW(run_eager(*g, {x}), Error);
}

TEST(Spmd, CollectivesSumAndConcatenateInRankOrder) {
  auto g = parse_graph(
      "graph @g(%x: f32[2,3]) {\n"
      "  %a: f32[2,3] = AllReduce(%x) {ranks = 2} loc(\"ar\")\n"
      "  %b: f32[2,6] = AllGather(%x) {axis = 1, ranks = 2} loc(\"ag\")\n"
      "  return %a, %b\n}\n");
  Tensor x = Tensor::from_f64(DType::f32, {2, 3}, std::vector<double>{1, 2, 3, 4, 5, 6});
  auto outs = run_spmd({g.get(), g.get()}, {x});
  EXPECT_EQ(outs[1][0].to_f64(), (std::vector<double>{2, 4, 6, 8, 10, 12}));
  EXPECT_EQ(outs[0][1].to_f64(), (std::vector<double>{1, 2, 3, 1, 2, 3, 4, 5, 6, 4, 5, 6}));
}

}  // namespace
}  // namespace tessel
