// `tessel compare` (driver/target_compare.h): one model on two dataflow targets, decision by decision. On the
// bundled transformer block (examples/tblock_s) every kernel has a row for each of the five aspects; fusion
// (decided before any target) is the same on both; every difference names hardware facts that differ
// between the two files (and only facts that do); a target against itself has no difference at all.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <set>

#include "tessel/driver/model_dir.h"
#include "tessel/driver/target_compare.h"
#include "tessel/hw/hw.h"
#include "test_util.h"

using namespace tessel;

namespace {

DataflowCompile mapped(const std::string& target) {
  const std::string model = testenv::source_dir() + "/examples/tblock_s";
  return compile_dataflow(model, model_inputs(model), hw::resolve_target(target));
}

}  // namespace

TEST(TargetCompare, TransformerBlockOnTpuAndSpyre) {
  const TargetComparison c = compare_targets(mapped("tpu-v5e"), mapped("spyre"));
  std::map<std::string, std::pair<std::string, std::string>> facts(c.facts.begin(), c.facts.end());
  EXPECT_EQ(facts.at("cores"), std::make_pair(std::string("1"), std::string("32")));
  std::map<std::string, std::set<std::string>> aspects;
  int differ = 0;
  for (const DecisionRow& r : c.rows) {
    aspects[r.kernel].insert(r.aspect);
    if (r.aspect == "fusion") {
      EXPECT_TRUE(r.same) << r.kernel << ": " << r.a << " | " << r.b;
    }
    if (r.same) {
      EXPECT_TRUE(r.fact.empty()) << r.kernel << " " << r.aspect;
      continue;
    }
    ++differ;
    ASSERT_FALSE(r.fact.empty()) << r.kernel << " " << r.aspect;
    // every fact cited differs between the two files
    bool cites = false;
    for (const auto& [name, v] : c.facts)
      if (r.fact.find(name + ": ") != std::string::npos) {
        cites = true;
        EXPECT_NE(v.first, v.second) << r.kernel << " " << r.aspect << " cites '" << name << "', which is the same";
      }
    EXPECT_TRUE(cites || r.fact.find("no hardware fact differs") != std::string::npos || r.kernel == "program")
        << r.kernel << " " << r.aspect << ": " << r.fact;
    if (r.aspect == "work division" && r.kernel != "program") {
      EXPECT_NE(r.fact.find("cores: 1 vs 32"), std::string::npos) << r.fact;
    }
  }
  EXPECT_GT(differ, 10);
  int kernels = 0;
  for (const auto& [k, a] : aspects) {
    if (k == "program") continue;
    ++kernels;
    EXPECT_EQ(a, (std::set<std::string>{"fusion", "layout", "work division", "tile sizes", "scheduling"})) << k;
  }
  EXPECT_GE(kernels, 8);  // attention, MLP, two LayerNorms, softmax
  const nlohmann::json j = comparison_json(c);
  EXPECT_EQ(j["decisions"].size(), c.rows.size());
  EXPECT_EQ(j["facts"]["cores"]["b"], "32");
}

TEST(TargetCompare, ATargetAgainstItselfHasNoDifference) {
  const TargetComparison c = compare_targets(mapped("spyre"), mapped("spyre"));
  for (const DecisionRow& r : c.rows) EXPECT_TRUE(r.same) << r.kernel << " " << r.aspect << ": " << r.a << " | " << r.b;
  EXPECT_NE(comparison_text(c).find(" 0 different"), std::string::npos);
}
