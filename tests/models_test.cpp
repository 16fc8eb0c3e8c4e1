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
#include "corpus_util.h"

using namespace tessel;
namespace fs = std::filesystem;

namespace {

class CorpusModel : public ::testing::TestWithParam<std::string> {};

std::vector<std::string> corpus() {
  return {"attn_s", "bert_tiny", "ffn_s", "gpt2_tiny", "mobilenet_v2", "nonzero_break",
          "tblock_bert", "tblock_s", "tblock_s_dynamo"};
}

}  // namespace

TEST_P(CorpusModel, EagerMatchesReference) {
  if (!testenv::have_shared()) GTEST_SKIP() << "needs ../shared/models";
  auto [m, ins, refs] = testenv::load_corpus_model(GetParam());
  verify_graph(*m.graph);
  testenv::expect_matches_reference(run_eager(*m.graph, ins), refs, GetParam());
}

TEST_P(CorpusModel, TextRoundTrips) {
  if (!testenv::have_shared()) GTEST_SKIP() << "needs ../shared/models";
  ImportedModel m = testenv::load_corpus_model(GetParam()).model;
  std::string p1 = print_graph(*m.graph);
  auto g2 = parse_graph(p1, GetParam() + ".tsl");
  verify_graph(*g2);
  std::string p2 = print_graph(*g2);
  EXPECT_TRUE(p1 == p2) << "print(parse(print(g))) differs from print(g) for " << GetParam();
}

INSTANTIATE_TEST_SUITE_P(Corpus, CorpusModel, ::testing::ValuesIn(corpus()),
                         [](const auto& info) { return info.param; });
