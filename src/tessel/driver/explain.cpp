// `tessel explain`. docs/graph-breaks.md.
#include "tessel/driver/explain.h"

#include <fmt/format.h>

#include "tessel/driver/compare.h"
#include "tessel/driver/compile_model.h"
#include "tessel/driver/model_dir.h"
#include "tessel/frontend/onnx/importer.h"
#include "tessel/ir/graph.h"
#include "tessel/support/error.h"
#include "tessel/support/escape.h"

namespace tessel {

std::string explain_text(const PartitionPlan& plan, const std::vector<RepairRecord>& repairs) {
  std::string out;
  for (const auto& r : repairs)
    out += fmt::format("repaired {} at '{}': {}\n", r.pattern, display_text(r.node), display_text(r.detail));
  int nodes = 0;
  for (const auto& p : plan.partitions) nodes += static_cast<int>(p.nodes.size());
  out += fmt::format("{} graph(s), {} break(s), {} compiled node(s)\n", plan.partitions.size(), plan.breaks.size(), nodes);
  for (const auto& s : plan.steps) {
    if (!s.is_break) {
      const Partition& p = plan.partitions[s.index];
      out += fmt::format("graph {}: {} node(s), {} input(s), {} output(s), from '{}' to '{}'\n", s.index, p.nodes.size(),
                         p.inputs.size(), p.outputs.size(), display_text(p.nodes.front()->name),
                         display_text(p.nodes.back()->name));
      continue;
    }
    const GraphBreak& b = plan.breaks[s.index];
    out += fmt::format("break {}: {} ({})\n", s.index + 1, display_text(b.op), break_kind_name(b.kind));
    out += fmt::format("  reason:   {}\n", display_text(b.reason));
    out += fmt::format("  location: {}\n", display_text(b.location));
    out += fmt::format("  repair:   {}\n", b.repair.empty() ? "(no known pattern)" : display_text(b.repair));
  }
  return out;
}

nlohmann::json explain_json(const PartitionPlan& plan, const std::vector<RepairRecord>& repairs) {
  nlohmann::json j;
  j["graphs"] = nlohmann::json::array();
  for (const auto& p : plan.partitions) {
    nlohmann::json g;
    g["nodes"] = p.nodes.size();
    g["inputs"] = p.inputs.size();
    g["outputs"] = p.outputs.size();
    g["first"] = p.nodes.front()->name;
    g["last"] = p.nodes.back()->name;
    j["graphs"].push_back(g);
  }
  j["breaks"] = nlohmann::json::array();
  for (const auto& b : plan.breaks)
    j["breaks"].push_back({{"op", b.op},
                           {"kind", std::string(break_kind_name(b.kind))},
                           {"reason", b.reason},
                           {"location", b.location},
                           {"repair", b.repair},
                           {"after_graph", b.after_partition}});
  j["repairs"] = nlohmann::json::array();
  for (const auto& r : repairs) j["repairs"].push_back({{"pattern", r.pattern}, {"node", r.node}, {"detail", r.detail}});
  return j;
}

int cmd_explain(const std::string& model, const ExplainOptions& opts) {
  ModelPaths paths = resolve_model(model);
  std::vector<Tensor> inputs, refs;
  if (!paths.data_sets.empty()) {
    inputs = read_data_set(paths.data_sets[0], "input");
    refs = read_data_set(paths.data_sets[0], "output");
  }
  ImportedModel m = import_model_file(model, inputs);
  std::vector<RepairRecord> repairs;
  if (opts.repair) {
    try {
      repairs = repair_breaks(*m.graph);
    } catch (const Error& e) {
      throw e.with_context(Location{.file = model, .pass = "repair"});
    }
  }
  PartitionedOptions po;
  po.backend = opts.backend;
  po.threads = opts.threads;
  std::unique_ptr<PartitionedExecutable> exe;
  PartitionPlan local;
  const PartitionPlan* plan = nullptr;
  if (opts.check) {
    exe = PartitionedExecutable::build(std::move(m.graph), po);
    plan = &exe->plan();
  } else {
    local = partition_graph(*m.graph);
    plan = &local;
  }
  nlohmann::json j = explain_json(*plan, repairs);
  int status = 0;
  std::string check_text;
  if (opts.check) {
    if (inputs.empty()) throw Error(Location{.file = model}, "--check needs a test_data_set_0 folder next to the model");
    auto outs = exe->run(inputs);
    Tolerance tol;
    tol.max_rel = opts.max_rel;
    bool all = outs.size() == refs.size();
    nlohmann::json checks = nlohmann::json::array();
    for (size_t i = 0; i < outs.size() && i < refs.size(); ++i) {
      Comparison c = compare_tensors(outs[i], refs[i], tol);
      all = all && c.match;
      check_text += fmt::format("check output {}: max abs error {:.3g}, relative error {:.3g} -> {}\n", i, c.max_abs, c.rel,
                                c.match ? "PASS" : "FAIL " + c.mismatch);
      checks.push_back({{"output", i}, {"max_abs", c.max_abs}, {"rel", c.rel}, {"match", c.match}});
    }
    check_text += all ? "PASS\n" : "FAIL\n";
    j["check"] = {{"outputs", checks}, {"pass", all}, {"backend", opts.backend}};
    status = all ? 0 : 1;
  }
  if (opts.json) {
    fmt::print("{}\n", json_dump(j, 1));
  } else {
    fmt::print("{}", explain_text(*plan, repairs));
    fmt::print("{}", check_text);
  }
  return status;
}

}  // namespace tessel
