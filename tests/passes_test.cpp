// The simplification pipeline on the corpus: results unchanged, shape arithmetic gone, every dumped
// stage parses back; and the pass manager's errors.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>

#include "tessel/driver/compare.h"
#include "tessel/driver/model_dir.h"
#include "tessel/frontend/onnx/importer.h"
#include "tessel/ir/op_registry.h"
#include "tessel/ir/printer.h"
#include "tessel/ir/verifier.h"
#include "tessel/passes/pass.h"
#include "tessel/runtime/interpreter.h"
#include "tessel/support/error.h"
#include "corpus_util.h"
#include "graph_test_util.h"

using namespace tessel;
namespace fs = std::filesystem;

namespace {

class Simplify : public ::testing::TestWithParam<std::string> {};

}  // namespace

TEST_P(Simplify, KeepsResultsAndFoldsShapeArithmetic) {
  if (!testenv::have_shared()) GTEST_SKIP() << "needs ../shared/models";
  auto [m, ins, refs] = testenv::load_corpus_model(GetParam());
  const size_t before = m.graph->nodes().size();
  fs::path dump = fs::temp_directory_path() / ("tessel_passes_" + GetParam() + std::to_string(getpid()));
  PassOptions po;
  po.dump_dir = dump.string();
  auto records = run_pipeline(*m.graph, parse_pipeline("simplify"), po);
  ASSERT_EQ(records.size(), parse_pipeline("simplify").size());
  EXPECT_EQ(m.graph->check_name_index(), "");  // passes rename only through the graph
  // canonicalize may add broadcasts (splat constants become scalar + broadcast); nothing else grows.
  size_t after = 0;
  for (const auto& n : m.graph->nodes()) after += n->op_name() != "broadcast_in_dim";
  EXPECT_LE(after, before);
  // Nothing left whose value depends only on constants and shapes.
  for (const auto& n : m.graph->nodes()) {
    EXPECT_NE(n->op_name(), "Shape") << n->name;
    EXPECT_NE(n->op_name(), "Size") << n->name;
    // A broadcast of a constant is the canonical form of a splat (docs/ir/core.md), never folded.
    bool all_const = !n->inputs.empty() && n->op_name() != "broadcast_in_dim";
    for (const Value* v : n->inputs) all_const = all_const && (!v || v->constant);
    EXPECT_FALSE(all_const && n->op->deterministic && shape_numel(n->outputs[0]->type.shape) <= (1 << 16))
        << "foldable node left: " << n->name << " (" << n->op_name() << ")";
  }
  testenv::expect_matches_reference(run_eager(*m.graph, ins), refs, GetParam());
  // Every stage was dumped and parses back.
  int files = 0;
  for (const auto& e : fs::directory_iterator(dump)) {
    auto g = parse_graph(testenv::read_text(e.path().string()), e.path().string());
    verify_graph(*g);
    ++files;
  }
  EXPECT_EQ(files, static_cast<int>(records.size()) + 1);
  fs::remove_all(dump);
}

INSTANTIATE_TEST_SUITE_P(Corpus, Simplify,
                         ::testing::Values("bert_tiny", "gpt2_tiny", "tblock_s", "tblock_s_dynamo", "attn_s", "ffn_s",
                                           "mobilenet_v2", "nonzero_break"),
                         [](const auto& info) { return info.param; });

// decompose + simplify: graph-level and core ops mixed (the decompositions written so far) still
// compute the reference outputs, and only core ops or ops without a hook remain.
TEST_P(Simplify, CorePipelineKeepsResults) {
  if (!testenv::have_shared()) GTEST_SKIP() << "needs ../shared/models";
  auto [m, ins, refs] = testenv::load_corpus_model(GetParam());
  fs::path dump = fs::temp_directory_path() / ("tessel_core_" + GetParam() + std::to_string(getpid()));
  PassOptions po;
  po.dump_dir = dump.string();
  auto records = run_pipeline(*m.graph, parse_pipeline("core"), po);
  EXPECT_EQ(m.graph->check_name_index(), "");  // decompose hands names over through the graph
  // Only core ops remain, or ops in a dynamic region (an unknown dim: downstream of NonZero).
  for (const auto& n : m.graph->nodes()) {
    bool dynamic = false;
    for (const auto* vs : {&n->inputs, &n->outputs})
      for (const Value* v : *vs)
        for (int64_t d : v ? v->type.shape : Shape{}) dynamic = dynamic || d < 0;
    EXPECT_TRUE(n->op->domain == "tessel.core" || !n->op->decompose || dynamic) << n->name << " (" << n->op_name() << ")";
  }
  testenv::expect_matches_reference(run_eager(*m.graph, ins), refs, GetParam());
  // Every stage, numbered in pipeline order, parses back and verifies.
  for (size_t i = 0; i <= records.size(); ++i) {
    const std::string stage = i == 0 ? "input" : records[i - 1].pass;
    const fs::path f = dump / fmt::format("{:02d}-{}.tsl", i, stage);
    ASSERT_TRUE(fs::exists(f)) << f;
    verify_graph(*parse_graph(testenv::read_text(f.string()), f.string()));
  }
  fs::remove_all(dump);
}

TEST(PassManager, UnknownPassesAreErrors) {
  try {
    parse_pipeline("fold-constants,frobnicate");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("unknown pass 'frobnicate'"), std::string::npos) << e.what();
  }
  Graph g;
  PassOptions po;
  po.print_after = "nope";
  EXPECT_THROW(run_pipeline(g, parse_pipeline("dce"), po), Error);
}

TEST(PassManager, VerifierNamesTheBrokenPass) {
  auto g = parse_graph(
      "graph @g(%x: f32[2]) {\n  %y: f32[2] = Relu(%x) loc(\"r\")\n  return %y\n}\n");
  Pass breaker{"breaker", "breaks the graph", [](Graph& gr) {
                 gr.mutable_nodes()[0]->outputs[0]->type.shape = {3};
                 return std::string("broke it");
               }};
  try {
    run_pipeline(*g, {&breaker}, PassOptions{});
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("[verify after breaker]"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("node 'r' (Relu)"), std::string::npos) << e.what();
  }
}

// algebraic's "elementwise below a reshape" (passes/algebraic.cpp): the golden case's outputs — the
// GELU-like chain and the bias that moved, the math that stayed — equal the eager
// interpreter's on the graph before the pass, bit for bit (the same ops on the same elements).
TEST(Algebraic, ReshapeSinkKeepsEveryElement) {
  const std::string path = testenv::source_dir() + "/tests/golden/algebraic/reshape_sink.in.tsl";
  auto before = parse_graph(testenv::read_text(path), path);
  auto after = parse_graph(testenv::read_text(path), path);
  run_pipeline(*after, parse_pipeline("algebraic,dce"), PassOptions{});
  // the chain now runs on the product's [6, 8], the residual add after it stays over [2, 3, 8]; the
  // per-batch broadcast kept its [2, 3, 8]
  EXPECT_EQ(after->outputs[4]->producer->op_name(), "add");
  EXPECT_EQ(after->outputs[4]->producer->inputs[0]->producer->op_name(), "reshape");
  EXPECT_EQ(after->outputs[4]->producer->inputs[0]->producer->inputs[0]->type.shape, (Shape{6, 8}));
  EXPECT_EQ(after->outputs[2]->producer->op_name(), "reshape");
  EXPECT_EQ(after->outputs[3]->producer->op_name(), "add");
  EXPECT_EQ(after->outputs[3]->producer->inputs[0]->producer->op_name(), "reshape");
  // the residual sum read once stays over [2, 3, 8], reading the reshape
  const Node* once = after->outputs[5]->producer->inputs[0]->producer;
  EXPECT_EQ(once->op_name(), "add");
  EXPECT_EQ(once->outputs[0]->type.shape, (Shape{2, 3, 8}));
  EXPECT_EQ(once->inputs[0]->producer->op_name(), "reshape");
  std::vector<Tensor> ins;
  for (const Value* v : before->inputs) ins.push_back(testenv::varied_f32(v->type.shape, 7 + static_cast<uint32_t>(ins.size())));
  const std::vector<Tensor> want = run_eager(*before, ins), got = run_eager(*after, ins);
  ASSERT_EQ(want.size(), got.size());
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(got[i].shape(), want[i].shape()) << "output " << i;
    EXPECT_EQ(got[i].to_f64(), want[i].to_f64()) << "output " << i;
  }
}
