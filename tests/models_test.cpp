// Every model of the corpus (../shared/models): imports, verifies, runs in eager and matches its
// reference output (relative error <= 1e-4), and its .tsl text round-trips.
#include <gtest/gtest.h>

#include <filesystem>

#include "tessel/driver/compare.h"
#include "tessel/driver/model_dir.h"
#include "tessel/frontend/onnx/importer.h"
#include "tessel/ir/printer.h"
#include "tessel/ir/verifier.h"
#include "tessel/runtime/interpreter.h"
#include "test_util.h"

using namespace tessel;
namespace fs = std::filesystem;

namespace {

class CorpusModel : public ::testing::TestWithParam<std::string> {};

std::vector<std::string> corpus() {
  return {"attn_s", "bert_tiny", "ffn_s", "gpt2_tiny", "mobilenet_v2", "nonzero_break",
          "tblock_bert", "tblock_s", "tblock_s_dynamo"};
}

ImportedModel load(const ModelPaths& mp, const std::vector<Tensor>& ins) {
  ImportOptions io;
  for (const auto& t : ins) io.input_shapes.push_back(t.shape());
  return import_onnx(mp.model, io);
}

}  // namespace

TEST_P(CorpusModel, EagerMatchesReference) {
  if (!testenv::have_shared()) GTEST_SKIP() << "needs ../shared/models";
  ModelPaths mp = resolve_model(testenv::shared_dir() + "/models/" + GetParam());
  ASSERT_FALSE(mp.data_sets.empty());
  std::vector<Tensor> ins = read_data_set(mp.data_sets[0], "input");
  std::vector<Tensor> refs = read_data_set(mp.data_sets[0], "output");
  ImportedModel m = load(mp, ins);
  verify_graph(*m.graph);
  std::vector<Tensor> outs = run_eager(*m.graph, ins);
  ASSERT_EQ(outs.size(), refs.size());
  Tolerance tol;
  tol.max_rel = 1e-4;
  for (size_t i = 0; i < outs.size(); ++i) {
    Comparison c = compare_tensors(outs[i], refs[i], tol);
    EXPECT_TRUE(c.match) << GetParam() << " output " << i << ": " << c.mismatch << " (max abs " << c.max_abs
                         << ", rel " << c.rel << ")";
  }
}

TEST_P(CorpusModel, TextRoundTrips) {
  if (!testenv::have_shared()) GTEST_SKIP() << "needs ../shared/models";
  ModelPaths mp = resolve_model(testenv::shared_dir() + "/models/" + GetParam());
  ImportedModel m = load(mp, read_data_set(mp.data_sets[0], "input"));
  std::string p1 = print_graph(*m.graph);
  auto g2 = parse_graph(p1, GetParam() + ".tsl");
  verify_graph(*g2);
  std::string p2 = print_graph(*g2);
  EXPECT_TRUE(p1 == p2) << "print(parse(print(g))) differs from print(g) for " << GetParam();
}

INSTANTIATE_TEST_SUITE_P(Corpus, CorpusModel, ::testing::ValuesIn(corpus()),
                         [](const auto& info) { return info.param; });
