// Simulating a training step on a dataflow target: forward, backward and AdamW as three tile programs.
#include "tessel/driver/train_sim.h"

#include <map>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "tessel/lower/lowering.h"
#include "tessel/driver/compile_model.h"
#include "tessel/driver/optimizer.h"
#include "tessel/passes/remat_partition.h"
#include "tessel/support/error.h"

namespace tessel {
namespace {

int64_t bytes_of(const TensorType& t) { return shape_numel(t.shape) * static_cast<int64_t>(dtype_size(t.dtype)); }

DataflowReport simulate_phase(std::unique_ptr<Graph> g, const hw::HwSpec& hw, const dataflow::MapOptions& opts,
                              const std::string& name) {
  lower::Lowering lowering(PassOptions{});
  lowering.graph_passes(*g, "core");
  KernelModule km = lowering.fuse(std::move(g));
  dataflow::MapOptions named = opts;
  named.name = name;
  DataflowRun run = simulate_dataflow(compile_dataflow(std::move(km), hw, named));
  return run.report;
}

}  // namespace

TrainSimReport simulate_training(const std::string& model, const hw::HwSpec& hw, const dataflow::MapOptions& opts) {
  TrainSimReport r;
  ImportedModel m = import_model_file(model, {});
  Graph& g = *m.graph;
  r.model = g.name;
  r.target = hw.name;
  if (g.outputs.size() != 1)
    fail("sim --train: '{}' has {} outputs; a training step differentiates one", model, g.outputs.size());
  TrainOptions to;
  to.seed = true;
  r.train = build_train_graph(g, to);
  const RematPartition& p = r.train.partition;
  for (const Value* v : p.saved) r.saved_names.push_back(v->name);
  r.saved_bytes = p.saved_bytes;
  for (const Node* n : p.recomputed) r.recomputed.push_back(fmt::format("{} ({})", n->outputs[0]->name, n->op_name()));
  SplitGraphs s = split_by_partition(g, 1, p);
  OptimizerSpec os;
  os.kind = "adamw";
  for (const std::string& name : r.train.parameters) {
    const Value* v = g.find_value(name);
    os.shapes.push_back(v->type.shape);
    r.parameter_bytes += bytes_of(v->type);
  }
  r.optimizer_state_bytes = 2 * r.parameter_bytes;
  r.summary = train_summary(r.train);
  r.train.partition = {};  // its pointers are into g, which dies here
  r.scratchpad_total = hw.cores * hw.usable_scratchpad_bytes();
  r.dram_capacity = hw.dram.capacity_bytes;
  r.forward = simulate_phase(std::move(s.forward), hw, opts, r.model + "_forward");
  r.backward = simulate_phase(std::move(s.backward), hw, opts, r.model + "_backward");
  r.optimizer = simulate_phase(build_optimizer_graph(os), hw, opts, r.model + "_adamw");
  return r;
}

std::string train_sim_text(const TrainSimReport& r) {
  std::string out = r.summary + "\n";
  // The recomputed nodes by primitive (their names are in the JSON): what the backward runs again.
  std::map<std::string, int> by_op;
  for (const std::string& n : r.recomputed) ++by_op[n.substr(n.rfind('(') + 1, n.size() - n.rfind('(') - 2)];
  std::string ops;
  for (const auto& [op, k] : by_op) ops += fmt::format("{}{} {}", ops.empty() ? "" : ", ", op, k);
  out += fmt::format("partition: saves {} tensors ({:.3f} MB) for the backward: {}\n", r.saved_names.size(),
                     static_cast<double>(r.saved_bytes) / 1e6, fmt::join(r.saved_names, ", "));
  out += fmt::format("partition: recomputes {} forward nodes in the backward{}{}\n", r.recomputed.size(),
                     ops.empty() ? "" : ": ", ops);
  const double spad = static_cast<double>(r.scratchpad_total);
  out += fmt::format(
      "memory on {}: saved activations {:.3f} MB = {:.1f}% of the scratchpads ({:.3f} MB: {} cores){}; parameters "
      "{:.3f} MB, AdamW state {:.3f} MB; step total {:.3f} MB{}\n",
      r.target, static_cast<double>(r.saved_bytes) / 1e6, spad > 0 ? 100.0 * static_cast<double>(r.saved_bytes) / spad : 0.0,
      spad / 1e6, r.forward.cores, static_cast<double>(r.saved_bytes) <= spad ? ", would fit in them" : ", more than they hold",
      static_cast<double>(r.parameter_bytes) / 1e6, static_cast<double>(r.optimizer_state_bytes) / 1e6,
      static_cast<double>(r.saved_bytes + 3 * r.parameter_bytes) / 1e6,
      r.dram_capacity > 0 ? fmt::format(" of {:.1f} GB DRAM", r.dram_capacity / 1e9) : std::string());
  out += fmt::format("{:<9} {:>11} {:>8} {:>9} {:>11} {:>11} {:>9}\n", "phase", "time us", "kernels", "util %", "DRAM MB",
                     "DRAM peak MB", "spad KB");
  for (const auto& [name, ph] : {std::pair<const char*, const DataflowReport*>{"forward", &r.forward},
                                 {"backward", &r.backward}, {"adamw", &r.optimizer}})
    out += fmt::format("{:<9} {:>11.1f} {:>8} {:>9.1f} {:>11.2f} {:>11.2f} {:>9.1f}\n", name, ph->sim_us,
                       ph->kernels.size(), 100 * ph->utilisation, ph->dram_bytes / 1e6,
                       static_cast<double>(ph->dram_peak) / 1e6, static_cast<double>(ph->spad_peak) / 1e3);
  out += fmt::format("training step on {}: {:.1f} us (forward {:.1f}, backward {:.1f}, adamw {:.1f})\n", r.target,
                     r.total_us(), r.forward.sim_us, r.backward.sim_us, r.optimizer.sim_us);
  return out;
}

nlohmann::json train_sim_json(const TrainSimReport& r) {
  return {{"model", r.model},
          {"target", r.target},
          {"summary", r.summary},
          {"saved", r.saved_names},
          {"saved_bytes", r.saved_bytes},
          {"recomputed", r.recomputed},
          {"parameter_bytes", r.parameter_bytes},
          {"optimizer_state_bytes", r.optimizer_state_bytes},
          {"scratchpad_total_bytes", r.scratchpad_total},
          {"dram_capacity_bytes", r.dram_capacity},
          {"total_us", r.total_us()},
          {"forward", report_json(r.forward)},
          {"backward", report_json(r.backward)},
          {"adamw", report_json(r.optimizer)}};
}

}  // namespace tessel
