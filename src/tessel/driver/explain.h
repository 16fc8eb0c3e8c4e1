// `tessel explain`: the graph-break report of a model (partitions, breaks with op, reason, location and
// repair), optionally after the auto-repairs, and optionally a partitioned run checked against the
// model's reference outputs. The Python package prints the same report. docs/graph-breaks.md.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tessel/runtime/partition.h"

namespace tessel {

// The report as text: one line per graph (partition) with its node count, then each break.
std::string explain_text(const PartitionPlan& plan, const std::vector<RepairRecord>& repairs);
// The same as JSON: {graphs, breaks: [{op, kind, reason, location, repair, after_graph}], repairs}.
nlohmann::json explain_json(const PartitionPlan& plan, const std::vector<RepairRecord>& repairs);

struct ExplainOptions {
  bool json = false;
  bool repair = false;
  bool check = false;              // run partitioned on test_data_set_0 and compare with its outputs
  std::string backend = "compiled";
  int threads = 0;
  double max_rel = 1e-4;
};
// The `explain` subcommand; returns the exit status (1 when --check fails).
int cmd_explain(const std::string& model, const ExplainOptions& opts);

}  // namespace tessel
