// The partitioner, the repairs and the partitioned executable (src/tessel/runtime/partition.*), on the
// nonzero_break corpus model (ONNX reference outputs from PyTorch) and on small built graphs checked
// against the eager interpreter.
#include <gtest/gtest.h>

#include <random>

#include "corpus_util.h"
#include "tessel/ir/infer.h"
#include "tessel/ir/op_registry.h"
#include "tessel/runtime/interpreter.h"
#include "tessel/runtime/partition.h"
#include "tessel/support/error.h"

using namespace tessel;

namespace {

const OpDef* op(const char* name) { return OpRegistry::get().find(name); }

Tensor random_f32(Shape s, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<double> d;
  Tensor t(DType::f32, s);
  for (int64_t i = 0; i < t.numel(); ++i) t.set_f(i, d(rng));
  return t;
}

// x[8,5] -> Greater(x, 0) -> Compress(flattened) -> ReduceSum: masked_select(x, x > 0).sum()
std::unique_ptr<Graph> masked_sum_graph() {
  auto g = std::make_unique<Graph>();
  Value* x = g->add_input("x", {DType::f32, {8, 5}});
  Value* zero = g->add_constant("zero", Tensor::scalar_f(DType::f32, 0));
  Value* flat_shape = g->add_constant("flat", Tensor::from_i64(DType::i64, {1}, std::vector<int64_t>{-1}));
  Value* m = g->add_node(op("Greater"), "gt", {x, zero}, {"m"})->outputs[0];
  Value* xf = g->add_node(op("Reshape"), "xf", {x, flat_shape}, {"xf"})->outputs[0];
  Value* mf = g->add_node(op("Reshape"), "mf", {m, flat_shape}, {"mf"})->outputs[0];
  Value* sel = g->add_node(op("Compress"), "compress", {xf, mf}, {"sel"})->outputs[0];
  Value* s = g->add_node(op("ReduceSum"), "sum", {sel}, {"s"}, {{"keepdims", int64_t{0}}})->outputs[0];
  Value* y = g->add_node(op("Mul"), "scale", {s, x}, {"y"})->outputs[0];
  g->outputs = {y};
  infer_graph(*g);
  return g;
}

}  // namespace

TEST(Partition, NonZeroBreakHasOneBreakWithARepair) {
  if (!testenv::have_shared()) GTEST_SKIP() << "needs ../shared";
  auto c = testenv::load_corpus_model("nonzero_break");
  PartitionPlan plan = partition_graph(*c.model.graph);
  ASSERT_EQ(plan.breaks.size(), 1u);
  const GraphBreak& b = plan.breaks[0];
  EXPECT_EQ(b.op, "NonZero");
  EXPECT_EQ(b.kind, BreakKind::data_dependent);
  EXPECT_EQ(b.location, "/NonZero");
  EXPECT_NE(b.reason.find("data-dependent"), std::string::npos) << b.reason;
  EXPECT_NE(b.repair.find("nonzero-gather-reduce"), std::string::npos) << b.repair;
  // The break runs between the two partitions: everything before NonZero, and what reads its result.
  ASSERT_EQ(plan.partitions.size(), 2u);
  EXPECT_EQ(b.after_partition, 0);
  ASSERT_EQ(plan.steps.size(), 3u);
  EXPECT_FALSE(plan.steps[0].is_break);
  EXPECT_TRUE(plan.steps[1].is_break);
  EXPECT_FALSE(plan.steps[2].is_break);
  EXPECT_EQ(plan.partitions[0].nodes.size() + plan.partitions[1].nodes.size() + 1, c.model.graph->nodes().size());
}

TEST(Partition, NonZeroBreakRunsPartitionedAndMatchesPyTorch) {
  if (!testenv::have_shared()) GTEST_SKIP() << "needs ../shared";
  for (const char* backend : {"eager", "graph", "compiled"}) {
    auto c = testenv::load_corpus_model("nonzero_break");
    PartitionedOptions po;
    po.backend = backend;
    po.threads = 2;
    auto exe = PartitionedExecutable::build(std::move(c.model.graph), po);
    int runner_calls = 0;
    // A runner that declines: the reference kernel runs NonZero.
    auto outs = exe->run(c.inputs, [&](const Node& n, const std::vector<Tensor>&) {
      ++runner_calls;
      EXPECT_EQ(n.op_name(), "NonZero");
      return std::vector<Tensor>{};
    });
    EXPECT_EQ(runner_calls, 1);
    testenv::expect_matches_reference(outs, c.refs, std::string("nonzero_break partitioned, ") + backend);
  }
}

TEST(Partition, RepairedNonZeroBreakHasNoBreakAndTheSameResult) {
  if (!testenv::have_shared()) GTEST_SKIP() << "needs ../shared";
  auto c = testenv::load_corpus_model("nonzero_break");
  auto repairs = repair_breaks(*c.model.graph);
  ASSERT_EQ(repairs.size(), 1u);
  EXPECT_EQ(repairs[0].pattern, "nonzero-gather-reduce");
  EXPECT_EQ(repairs[0].node, "/NonZero");
  for (const auto& n : c.model.graph->nodes()) {
    EXPECT_NE(n->op_name(), "NonZero");
    for (const Value* v : n->outputs)
      for (int64_t d : v->type.shape) EXPECT_GE(d, 0) << v->name << " still has a dynamic dim";
  }
  // Eager on the repaired graph against PyTorch's reference output.
  testenv::expect_matches_reference(run_eager(*c.model.graph, c.inputs), c.refs, "repaired, eager");
  auto exe = PartitionedExecutable::build(std::move(c.model.graph), {.backend = "compiled", .threads = 2});
  EXPECT_TRUE(exe->plan().breaks.empty());
  EXPECT_EQ(exe->plan().partitions.size(), 1u);
  testenv::expect_matches_reference(exe->run(c.inputs), c.refs, "repaired, compiled");
}

TEST(Partition, RepairMatchesTheOriginalOnOtherInputs) {
  if (!testenv::have_shared()) GTEST_SKIP() << "needs ../shared";
  // Inputs other than the data set's select other rows; the repaired graph must agree on each.
  auto c = testenv::load_corpus_model("nonzero_break");
  auto original = std::move(c.model.graph);
  auto repaired = testenv::load_corpus_model("nonzero_break").model.graph;
  repair_breaks(*repaired);
  for (unsigned seed : {1u, 2u, 3u}) {
    std::vector<Tensor> inputs{random_f32({32, 64}, seed)};
    testenv::expect_matches_reference(run_eager(*repaired, inputs), run_eager(*original, inputs),
                                      "repaired vs original, seed " + std::to_string(seed), 1e-5);
  }
}

TEST(Partition, CompressReduceIsReportedAndRepaired) {
  auto g = masked_sum_graph();
  std::vector<Tensor> inputs{random_f32({8, 5}, 3)};
  auto ref = run_eager(*g, inputs);
  PartitionPlan plan = partition_graph(*g);
  ASSERT_EQ(plan.breaks.size(), 1u);
  EXPECT_EQ(plan.breaks[0].op, "Compress");
  EXPECT_NE(plan.breaks[0].repair.find("compress-reduce"), std::string::npos);
  auto repairs = repair_breaks(*g);
  ASSERT_EQ(repairs.size(), 1u);
  EXPECT_EQ(repairs[0].pattern, "compress-reduce");
  EXPECT_TRUE(partition_graph(*g).breaks.empty());
  auto exe = PartitionedExecutable::build(std::move(g), {.backend = "graph"});
  testenv::expect_matches_reference(exe->run(inputs), ref, "compress-reduce repaired", 1e-6);
}

TEST(Partition, TorchFallbackNodesBreakAndRunThroughTheRunner) {
  auto g = std::make_unique<Graph>();
  Value* x = g->add_input("x", {DType::f32, {4, 3}});
  Value* a = g->add_node(op("Relu"), "relu", {x}, {"a"})->outputs[0];
  Value* b = g->add_node(torch_fallback_op(), "mystery", {a}, {"b"},
                         {{"target", std::string("aten.cumsum.default")},
                          {"out_dtypes", std::vector<std::string>{"f32"}},
                          {"out_ranks", std::vector<int64_t>{2}},
                          {"out_shapes", std::vector<int64_t>{4, 3}}})->outputs[0];
  Value* y = g->add_node(op("Neg"), "neg", {b}, {"y"})->outputs[0];
  g->outputs = {y};
  auto exe = PartitionedExecutable::build(std::move(g), {.backend = "graph"});
  const auto& plan = exe->plan();
  ASSERT_EQ(plan.breaks.size(), 1u);
  EXPECT_EQ(plan.breaks[0].kind, BreakKind::torch_fallback);
  EXPECT_EQ(plan.breaks[0].op, "aten.cumsum.default");
  EXPECT_NE(plan.breaks[0].reason.find("no tessel lowering"), std::string::npos);
  EXPECT_EQ(plan.partitions.size(), 2u);
  Tensor in = random_f32({4, 3}, 5);
  // The runner computes a cumulative sum along dim 1 (what PyTorch would).
  auto outs = exe->run({in}, [](const Node&, const std::vector<Tensor>& args) {
    Tensor r(DType::f32, args[0].shape());
    for (int64_t i = 0; i < 4; ++i) {
      double s = 0;
      for (int64_t j = 0; j < 3; ++j) r.set_f(i * 3 + j, s += args[0].get_f(i * 3 + j));
    }
    return std::vector<Tensor>{r};
  });
  for (int64_t i = 0; i < 4; ++i) {
    double s = 0;
    for (int64_t j = 0; j < 3; ++j) {
      s += std::max(0.0, in.get_f(i * 3 + j));
      EXPECT_NEAR(outs[0].get_f(i * 3 + j), -s, 1e-6);
    }
  }
  // Without a runner the break cannot run: a clear error naming the node.
  try {
    exe->run({in});
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("mystery"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("PyTorch"), std::string::npos) << e.what();
  }
}

TEST(Partition, CorpusTransformerHasNoBreak) {
  if (!testenv::have_shared()) GTEST_SKIP() << "needs ../shared";
  auto c = testenv::load_corpus_model("tblock_s");
  PartitionPlan plan = partition_graph(*c.model.graph);
  EXPECT_TRUE(plan.breaks.empty());
  EXPECT_EQ(plan.partitions.size(), 1u);
}
