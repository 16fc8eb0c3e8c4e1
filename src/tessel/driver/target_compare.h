// `tessel compare MODEL --hw A,B`: one model mapped onto two dataflow targets side by side (the course's
// attention worked example, docs/sim.md "Two targets side by side"). Per kernel, each decision the
// pipelines make -- fusion, layout, work division, tile sizes, scheduling -- on both targets, whether it
// is the same, and for each difference the hardware facts of the two files that explain it.
#pragma once

#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

#include "tessel/driver/dataflow.h"

namespace tessel {

struct DecisionRow {
  std::string kernel;    // "k3 matmul" (the kernel level's kernel), or "program" for rows about the whole model
  std::string node;      // the kernel's node (provenance)
  std::string aspect;    // fusion, layout, work division, tile sizes, scheduling
  std::string a, b;      // the decision on each target
  bool same = false;
  std::string fact;      // the hardware facts that explain a difference (empty when the decisions agree)
};

struct TargetComparison {
  std::string model, target_a, target_b;
  std::vector<std::pair<std::string, std::pair<std::string, std::string>>> facts;  // (fact, (on A, on B))
  std::vector<DecisionRow> rows;
};

// `a` and `b`: the same kernel module mapped for two targets (compile_dataflow of one model).
TargetComparison compare_targets(const DataflowCompile& a, const DataflowCompile& b);
std::string comparison_text(const TargetComparison& c);
nlohmann::json comparison_json(const TargetComparison& c);

}  // namespace tessel
