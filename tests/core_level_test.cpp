// The core level's bars (issue 3): after the `core` pipeline a model holds only tessel.core ops
// (except the graph-level ops with data-dependent shapes, which stay as graph breaks), at most 40
// distinct op kinds appear across the corpus and the ONNX node tests, and the simplified bert_tiny and
// gpt2_tiny hold no node whose value depends only on shapes.
#include <gtest/gtest.h>

#include <filesystem>
#include <set>

#include "corpus_util.h"
#include "tessel/driver/conformance.h"
#include "tessel/ir/op_registry.h"
#include "tessel/passes/pass.h"
#include "tessel/runtime/graph_backend.h"

using namespace tessel;

namespace {

const std::set<std::string> kDataDependent = {"NonZero", "Compress", "Unique", "NonMaxSuppression"};
// Dropout in training mode draws random numbers, and Resize's tf_crop_and_resize with a run-time roi
// samples at data-dependent positions: no static core form for those (the other forms decompose).
// TreeEnsemble (tree walks) and TfIdfVectorizer (n-gram lookups) have no decomposition at all: they
// run through their reference kernels (docs/decisions.md).
const std::set<std::string> kNotStatic = {"Dropout", "Resize", "TreeEnsemble", "TfIdfVectorizer"};

bool has_unknown_dim(const Value* v) {
  for (int64_t d : v->type.shape)
    if (d < 0) return true;
  return false;
}

// Nodes outside tessel.core that are not a data-dependent op or fed by one (an unknown dim).
std::vector<std::string> unexpected_graph_level(const Graph& g) {
  std::vector<std::string> bad;
  for (const auto& n : g.nodes()) {
    if (n->op->domain == "tessel.core" || kDataDependent.count(n->op->name) || kNotStatic.count(n->op->name)) continue;
    bool dynamic = false;
    for (const Value* v : n->inputs) dynamic = dynamic || (v && has_unknown_dim(v));
    if (!dynamic) bad.push_back(n->op->name + " '" + n->name + "'");
  }
  return bad;
}

class CorpusCore : public ::testing::TestWithParam<std::string> {};

}  // namespace

TEST_P(CorpusCore, OnlyCoreOpsAfterCorePipeline) {
  if (!testenv::have_shared()) GTEST_SKIP() << "needs ../shared";
  auto c = testenv::load_corpus_model(GetParam());
  run_pipeline(*c.model.graph, parse_pipeline("core"), PassOptions{});
  std::vector<std::string> bad = unexpected_graph_level(*c.model.graph);
  std::string list;
  for (const auto& b : bad) list += "\n  " + b;
  EXPECT_TRUE(bad.empty()) << GetParam() << " keeps graph-level ops after decompose:" << list;
}

INSTANTIATE_TEST_SUITE_P(Models, CorpusCore,
                         ::testing::Values("attn_s", "bert_tiny", "ffn_s", "gpt2_tiny", "mobilenet_v2",
                                           "nonzero_break", "tblock_bert", "tblock_s", "tblock_s_dynamo"));

// "No op whose value depends only on shapes": no node may read a shape (Shape, Size) without also
// reading data; values computed from constants alone (a transposed weight too big to fold, a broadcast
// of a scalar) are not shape arithmetic.
TEST(CoreLevel, ShapeArithmeticFoldsAway) {
  if (!testenv::have_shared()) GTEST_SKIP() << "needs ../shared";
  for (const char* name : {"bert_tiny", "gpt2_tiny"}) {
    auto c = testenv::load_corpus_model(name);
    Graph& g = *c.model.graph;
    run_pipeline(g, parse_pipeline("simplify"), PassOptions{});
    std::vector<bool> data(g.values().size(), false), shape(g.values().size(), false);
    for (const Value* v : g.inputs) data[v->id] = true;
    for (const auto& n : g.nodes()) {
      const bool reads_shape_of = n->op->name == "Shape" || n->op->name == "Size";
      bool d = false, s = reads_shape_of;
      for (const Value* v : n->inputs)
        if (v && !reads_shape_of) {
          d = d || data[v->id];
          s = s || shape[v->id];
        }
      for (const Value* v : n->outputs)
        if (v) data[v->id] = d, shape[v->id] = s;
      EXPECT_FALSE(s && !d) << name << ": node '" << n->name << "' (" << n->op->name
                            << ") depends only on shapes after simplify";
    }
  }
}

// Across every ONNX node test that imports (inputs bound from test_data_set_0) and every corpus
// model: the op kinds of the compiled core stage. Data-dependent graph-level ops are graph breaks,
// counted separately.
TEST(CoreLevel, AtMostFortyOpKindsAcrossCorpusAndNodeTests) {
  const std::string root = testenv::shared_dir() + "/onnx-tests/node";
  if (!std::filesystem::exists(root)) GTEST_SKIP() << "needs " << root;
  std::set<std::string> core_kinds, breaks;
  std::map<std::string, std::string> unexpected;  // op -> first test that keeps it
  int compiled = 0;
  auto collect = [&](const Graph& g, const std::string& where) {
    for (const auto& n : g.nodes()) {
      if (n->op->domain == "tessel.core") core_kinds.insert(n->op->name);
      else if (kDataDependent.count(n->op->name)) breaks.insert(n->op->name);
    }
    for (const auto& b : unexpected_graph_level(g)) unexpected.emplace(b.substr(0, b.find(' ')), where);
  };
  for (const auto& dir : find_test_dirs(root)) {
    try {
      ModelPaths mp = resolve_model(dir);
      std::vector<Tensor> ins = read_data_set(mp.data_sets.at(0), "input");
      ImportOptions io;
      for (const auto& t : ins) io.input_shapes.push_back(t.shape());
      auto exe = compile_graph(import_onnx(mp.model, io).graph, ins);
      collect(exe->graph(), dir);
      ++compiled;
    } catch (const Error&) {
      // Unsupported or invalid for tessel at all: the conformance suite accounts for those.
    }
  }
  for (const char* m : {"attn_s", "bert_tiny", "ffn_s", "gpt2_tiny", "mobilenet_v2", "tblock_bert", "tblock_s"}) {
    auto c = testenv::load_corpus_model(m);
    run_pipeline(*c.model.graph, parse_pipeline("core"), PassOptions{});
    collect(*c.model.graph, m);
  }
  std::string kinds, rest;
  for (const auto& k : core_kinds) kinds += k + " ";
  for (const auto& [op, where] : unexpected) rest += "\n  " + op + " (e.g. " + where + ")";
  std::printf("%d node tests compiled; %zu core op kinds: %s; graph breaks: %zu\n", compiled, core_kinds.size(),
              kinds.c_str(), breaks.size());
  EXPECT_LE(core_kinds.size(), 40u);
  EXPECT_TRUE(unexpected.empty()) << "graph-level ops left at the core stage:" << rest;
}
