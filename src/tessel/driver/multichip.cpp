// A model on several dataflow chips (see multichip.h).
#include "tessel/driver/multichip.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <map>
#include <unordered_map>
#include <nlohmann/json.hpp>

#include "tessel/driver/compare.h"
#include "tessel/driver/compile_model.h"
#include "tessel/driver/dataflow.h"
#include "tessel/ir/op_registry.h"
#include "tessel/lower/lowering.h"
#include "tessel/runtime/interpreter.h"
#include "tessel/runtime/spmd.h"
#include "tessel/support/error.h"
#include "tessel/support/escape.h"
#include "tessel/support/limits.h"
#include "tessel/support/strings.h"

namespace tessel {

namespace {

bool is_collective(const Node& n) {
  static const OpDef* reduce = OpRegistry::get().find("AllReduce");
  static const OpDef* gather = OpRegistry::get().find("AllGather");
  return n.op == reduce || n.op == gather;
}

// The nodes of one stage as a graph of their own: what they read from outside comes in as inputs (the
// program's earlier results and the collectives' are in DRAM), what is read after the stage goes out.
std::unique_ptr<Graph> stage_graph(const Graph& g, const std::vector<const Node*>& nodes, int level,
                                   const std::unordered_map<const Node*, int>& level_of,
                                   const std::vector<std::vector<const Node*>>& users) {
  auto sg = std::make_unique<Graph>();
  sg->name = fmt::format("{}.stage{}", g.name, level);
  std::map<const Value*, Value*> map;
  for (const Node* n : nodes) {
    std::vector<Value*> ins;
    for (const Value* v : n->inputs) {
      if (!v) { ins.push_back(nullptr); continue; }
      auto it = map.find(v);
      if (it == map.end())
        it = map.emplace(v, v->constant ? sg->add_constant(v->name, *v->constant) : sg->add_input(v->name, v->type)).first;
      ins.push_back(it->second);
    }
    sg->add_copy(*n, ins, map);
  }
  for (const Node* n : nodes)
    for (const Value* v : n->outputs) {
      if (!v) continue;
      bool out = g.returns(v);
      for (const Node* u : users[size_t(v->id)]) out |= level_of.at(u) != level || is_collective(*u);
      if (out) sg->outputs.push_back(map.at(v));
    }
  return sg;
}

}  // namespace

ShardSpec parse_shard(const std::string& spec) {
  const std::string bad = fmt::format("--shard '{}' is not tp=N, dp=N (N a number of chips, 1..1024) or auto", display_text(spec));
  ShardSpec s;
  if (spec == "auto") {
    s.automatic = true;
    return s;
  }
  if (spec.size() < 4 || spec.size() > 7 || spec[2] != '=') throw Error(Location{.pass = "shard"}, bad);
  const std::string kind = spec.substr(0, 2);
  if (kind == "tp") s.kind = ShardKind::tensor;
  else if (kind == "dp") s.kind = ShardKind::data;
  else throw Error(Location{.pass = "shard"}, bad);
  const char* end = spec.data() + spec.size();
  const auto [at, ec] = std::from_chars(spec.data() + 3, end, s.ranks);
  if (ec != std::errc() || at != end || s.ranks < 1 || s.ranks > 1024) throw Error(Location{.pass = "shard"}, bad);
  return s;
}

namespace {

// Every rank's program run together against `ref` (eager on the whole graph): the largest
// max|out - ref| / max|ref| over the outputs and the ranks.
double check_ranks(const ShardedProgram& p, const std::vector<Tensor>& inputs, const std::vector<Tensor>& ref) {
  // every rank's values live in one process: bounded like any single allocation (an over-estimate: it
  // counts every value, where the run frees each after its last use)
  uint64_t bytes = 0;
  for (const auto& g : p.graphs)
    for (const auto& v : g->values()) bytes += tensor_bytes(v->type.dtype, v->type.shape).value_or(0);
  check_alloc(bytes, fmt::format("the functional check of {} ranks (their values in one process; --no-functional skips it)",
                                 p.graphs.size()));
  std::vector<const Graph*> ranks;
  for (const auto& g : p.graphs) ranks.push_back(g.get());
  Tolerance tol;
  tol.max_rel = 1;
  double worst = 0;
  for (const auto& outs : run_spmd(ranks, inputs))
    for (size_t i = 0; i < ref.size(); ++i) {
      const Comparison c = compare_tensors(outs[i], ref[i], tol);
      worst = std::max(worst, std::isfinite(c.rel) ? c.rel : 1e300);
    }
  return worst;
}

// Rank 0's program cut into stages and timed with its collectives on the system's links. A node's level
// is the number of collectives on its longest path from the inputs; stage L holds the compute nodes of
// level L, and the collectives of level L wait for it.
void time_stages(MultiChipRun& r, const hw::HwSpec& hw, const dataflow::MapOptions& mo) {
  const DType device = mo.float_dtype ? *mo.float_dtype : dataflow::default_float_dtype(hw);
  const Graph& g = *r.sharded.graphs[0];
  const auto users = g.users();
  std::vector<int> value_level(g.values().size() + 1, 0);
  std::unordered_map<const Node*, int> level_of;
  std::vector<std::vector<const Node*>> compute, collectives;  // by level
  for (const auto& np : g.nodes()) {
    const Node& n = *np;
    int l = 0;
    for (const Value* v : n.inputs)
      if (v) l = std::max(l, value_level[size_t(v->id)]);
    level_of[&n] = l;
    const bool coll = is_collective(n);
    for (const Value* v : n.outputs)
      if (v) value_level[size_t(v->id)] = l + (coll ? 1 : 0);
    auto& at = coll ? collectives : compute;
    if (at.size() <= size_t(l)) at.resize(size_t(l) + 1);
    at[size_t(l)].push_back(&n);
  }
  const size_t levels = std::max(compute.size(), collectives.size());
  compute.resize(levels);
  collectives.resize(levels);
  std::map<const Value*, int> collective_op;  // a collective's output -> its system op
  for (size_t level = 0; level < levels; ++level) {
    int stage = -1;  // the system op of this level's stage
    if (!compute[level].empty()) {
      std::vector<int> deps;
      for (const Node* n : compute[level])
        for (const Value* v : n->inputs)
          if (auto it = collective_op.find(v); v && it != collective_op.end() && !std::count(deps.begin(), deps.end(), it->second))
            deps.push_back(it->second);
      auto sg = stage_graph(g, compute[level], int(level), level_of, users);
      if (!sg->outputs.empty()) {
        MultiChipStage st;
        st.name = fmt::format("stage {}", level);
        st.nodes = int(compute[level].size());
        try {
          DataflowCompile dc = compile_dataflow(std::move(sg), hw, mo);
          st.kernels = int(dc.program.kernels.size());
          st.seconds = dataflow::simulate_program(dc.program).result.seconds;
        } catch (const Error& e) {
          throw Error(Location{.pass = "shard"}, fmt::format("{} of the sharded program: {}", st.name, e.what()));
        }
        stage = int(r.ops.size());
        r.ops.push_back({.kind = dataflow::SystemOpKind::compute, .name = st.name, .seconds = st.seconds, .deps = deps});
        r.stages.push_back(st);
      }
    }
    for (const Node* n : collectives[level]) {
      const bool reduce = n->op_name() == "AllReduce";
      const TensorType& t = (reduce ? n->inputs[0] : n->outputs[0])->type;
      int64_t elems = 1;
      for (int64_t d : t.shape) elems *= d;
      const int eb = is_float(t.dtype) ? dtype_size(device) : dtype_size(t.dtype);
      dataflow::SystemOp op{.kind = reduce ? dataflow::SystemOpKind::all_reduce : dataflow::SystemOpKind::all_gather,
                            .name = fmt::format("{} {}", reduce ? "all-reduce" : "all-gather", n->inputs[0]->name),
                            .bytes = elems * eb, .elem_bytes = eb};
      if (n->inputs[0]->producer && stage >= 0) op.deps.push_back(stage);
      collective_op[n->outputs[0]] = int(r.ops.size());
      r.ops.push_back(op);
    }
  }
  r.system = dataflow::simulate_system(r.ops, hw);
}

// One sharding of `whole` on the system: the ranks' graphs, checked against `ref` (when given), timed.
MultiChipRun shard_and_time(const Graph& whole, const std::vector<Tensor>& inputs, const std::vector<Tensor>* ref,
                            const hw::HwSpec& hw, ShardKind kind, const dataflow::MapOptions& mo) {
  MultiChipRun r;
  r.target = hw.name;
  r.chips = int(hw.system.chips);
  r.sharded = shard_graph(whole, kind, r.chips);
  if (ref) r.max_rel = check_ranks(r.sharded, inputs, *ref);
  time_stages(r, hw, mo);
  return r;
}

}  // namespace

MultiChipRun run_multichip(const std::string& model, const std::vector<Tensor>& inputs, const hw::HwSpec& hw,
                           const MultiChipOptions& o) {
  const ShardSpec& spec = o.shard;
  if (!spec.automatic && spec.ranks != hw.system.chips)
    throw Error(Location{.file = hw.origin, .pass = "shard"},
                fmt::format("system.chips: the hardware has {} but the shard asks for {}={} (they must agree)",
                            count_text(hw.system.chips, "chip"), shard_kind_name(spec.kind), spec.ranks));
  ImportedModel m = import_model_file(model, inputs);
  lower::Lowering lowering(PassOptions{});
  // Constants folded (the shape chains a sharding reads), nothing canonicalised: "simplify" turns a splat
  // constant into broadcast_in_dim of a scalar, which the core pipeline each stage runs next cannot
  // decompose where it must be a literal (a Split's sizes).
  lowering.graph_passes(*m.graph, "fold-constants,cse,dce");
  dataflow::MapOptions mo;
  mo.float_dtype = o.float_dtype;
  std::optional<std::vector<Tensor>> ref;  // eager on the whole graph, once for every kind tried
  if (o.functional) ref = run_eager(*m.graph, inputs);
  const std::vector<Tensor>* check = ref ? &*ref : nullptr;
  MultiChipRun r;
  if (!spec.automatic) {
    r = shard_and_time(*m.graph, inputs, check, hw, spec.kind, mo);
  } else {  // the cost model's choice: each kind simulated, the faster kept
    std::vector<std::string> tried;
    bool have = false;
    for (ShardKind k : {ShardKind::tensor, ShardKind::data}) {
      const std::string name = fmt::format("{}={}", shard_kind_name(k), hw.system.chips);
      try {
        MultiChipRun c = shard_and_time(*m.graph, inputs, check, hw, k, mo);
        tried.push_back(fmt::format("{}: {:.2f} us", name, c.system.seconds * 1e6));
        if (!have || c.system.seconds < r.system.seconds) {
          r = std::move(c);
          have = true;
          std::rotate(tried.begin(), tried.end() - 1, tried.end());  // the kept one first
        }
      } catch (const Error& e) {
        tried.push_back(fmt::format("{}: not possible ({})", name, e.what()));
      }
    }
    if (!have) throw Error(Location{.pass = "shard"}, fmt::format("--shard auto: no sharding fits: {}", fmt::join(tried, "; ")));
    r.alternatives = tried;
  }
  r.model = model;
  // the same model whole on one chip, for the speedup (given by a caller that has simulated it already)
  if (o.one_chip_seconds) {
    r.one_chip_seconds = *o.one_chip_seconds;
  } else {
    mo.name = m.graph->name;
    r.one_chip_seconds = dataflow::simulate_program(compile_dataflow(std::move(m.graph), hw, mo).program).result.seconds;
  }
  return r;
}

std::string multichip_text(const MultiChipRun& r) {
  std::string s;
  const auto& sys = r.system;
  s += fmt::format("{} on {} chips ({} parallel, {}={})\n", display_text(r.model), r.chips,
                   r.sharded.kind == ShardKind::tensor ? "tensor" : "data", shard_kind_name(r.sharded.kind), r.chips);
  if (!r.alternatives.empty()) {
    s += "--shard auto, each simulated:";
    for (const auto& a : r.alternatives) s += "\n  " + display_text(a);
    s += "\n";
  }
  s += fmt::format("sharding: {}, {}; weights {:.2f} MB whole, {:.2f} MB per chip\n", count_text(r.sharded.all_reduces, "all-reduce"),
                   count_text(r.sharded.all_gathers, "all-gather"), r.sharded.weight_bytes / 1e6, r.sharded.weight_bytes_per_rank / 1e6);
  for (const auto& d : r.sharded.decisions) s += fmt::format("  {:<28} {}\n", display_text(d.node), display_text(d.rule));
  s += fmt::format("\n{:<10} {:>6} {:>8} {:>14}\n", "stage", "nodes", "kernels", "one chip (us)");
  for (const auto& st : r.stages) s += fmt::format("{:<10} {:>6} {:>8} {:>14.2f}\n", st.name, st.nodes, st.kernels, st.seconds * 1e6);
  if (!sys.collectives.empty()) {
    s += fmt::format("\n{:<40} {:>11} {:>10} {:>12} {:>8}\n", "collective", "bytes", "sim (us)", "ring (us)", "sim/ring");
    for (const auto& c : sys.collectives)
      s += fmt::format("{:<40} {:>11} {:>10.2f} {:>12.2f} {:>8.3f}\n", display_text(c.name), c.bytes, c.sim_seconds * 1e6,
                       c.formula_seconds * 1e6, c.formula_seconds > 0 ? c.sim_seconds / c.formula_seconds : 0.0);
  }
  s += fmt::format("\n{:<6} {:>12} {:>10} {:>13} {:>10}\n", "chip", "compute (us)", "comm (us)", "overlap (us)", "idle (us)");
  for (size_t i = 0; i < sys.per_chip.size(); ++i) {
    const auto& c = sys.per_chip[i];
    s += fmt::format("{:<6} {:>12.2f} {:>10.2f} {:>13.2f} {:>10.2f}\n", i, c.compute_seconds * 1e6, c.comm_seconds * 1e6,
                     c.overlap_seconds * 1e6, c.idle_seconds * 1e6);
  }
  double comm = 0, overlap = 0;
  for (const auto& c : sys.per_chip) comm = std::max(comm, c.comm_seconds), overlap = std::max(overlap, c.overlap_seconds);
  s += fmt::format("\ntime: {:.2f} us on {} chips, {:.2f} us on one chip ({:.2f}x); communication {:.0f}% of the time, "
                   "{:.0f}% of it overlapped with compute\n",
                   sys.seconds * 1e6, r.chips, r.one_chip_seconds * 1e6, sys.seconds > 0 ? r.one_chip_seconds / sys.seconds : 0.0,
                   sys.seconds > 0 ? 100 * comm / sys.seconds : 0.0, comm > 0 ? 100 * overlap / comm : 0.0);
  if (sys.seconds > r.one_chip_seconds)
    s += fmt::format("the split does not pay here: one chip runs the model {:.2f} us faster (collectives, and each stage's "
                     "kernels on smaller slices)\n", (sys.seconds - r.one_chip_seconds) * 1e6);
  if (r.max_rel >= 0)
    s += fmt::format("functional: every rank's outputs within {:.2g} (max|out-ref|/max|ref|) of eager on the whole graph "
                     "(the ranks' graphs run in lockstep by the reference interpreter)\n",
                     r.max_rel);
  return s;
}

nlohmann::json multichip_json(const MultiChipRun& r) {
  nlohmann::json j;
  j["model"] = r.model;
  j["target"] = r.target;
  j["chips"] = r.chips;
  j["shard"] = fmt::format("{}={}", shard_kind_name(r.sharded.kind), r.chips);
  if (!r.alternatives.empty()) j["alternatives"] = r.alternatives;
  j["sharding"] = {{"all_reduces", r.sharded.all_reduces}, {"all_gathers", r.sharded.all_gathers},
                   {"weight_bytes", r.sharded.weight_bytes}, {"weight_bytes_per_chip", r.sharded.weight_bytes_per_rank}};
  for (const auto& d : r.sharded.decisions) j["sharding"]["decisions"].push_back({{"node", d.node}, {"op", d.op}, {"rule", d.rule}});
  for (const auto& st : r.stages)
    j["stages"].push_back({{"name", st.name}, {"nodes", st.nodes}, {"kernels", st.kernels}, {"us", st.seconds * 1e6}});
  for (const auto& c : r.system.collectives)
    j["collectives"].push_back({{"name", c.name}, {"kind", dataflow::system_op_kind_name(c.kind)}, {"bytes", c.bytes},
                                {"sim_us", c.sim_seconds * 1e6}, {"ring_formula_us", c.formula_seconds * 1e6}});
  for (const auto& c : r.system.per_chip)
    j["chips_time"].push_back({{"compute_us", c.compute_seconds * 1e6}, {"comm_us", c.comm_seconds * 1e6},
                               {"overlap_us", c.overlap_seconds * 1e6}, {"idle_us", c.idle_seconds * 1e6}});
  j["sim_us"] = r.system.seconds * 1e6;
  j["one_chip_us"] = r.one_chip_seconds * 1e6;
  j["speedup"] = r.system.seconds > 0 ? r.one_chip_seconds / r.system.seconds : 0.0;
  if (r.max_rel >= 0) j["functional_max_rel"] = r.max_rel;
  return j;
}

}  // namespace tessel
