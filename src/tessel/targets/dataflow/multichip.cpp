// Several chips: SystemOps -> a task graph of the whole system (one engine "core" per chip, ring
// collectives as chunk transfers and adds) -> the event-driven engine. docs/sim.md, "Several chips".
#include "tessel/targets/dataflow/multichip.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>

#include "tessel/support/error.h"
#include "tessel/support/limits.h"
#include "tessel/targets/dataflow/cost.h"
#include "tessel/targets/dataflow/sim_engine.h"

namespace tessel::dataflow {

namespace {

using Intervals = std::vector<std::pair<double, double>>;

// Sorted, disjoint, non-empty intervals covering the same points.
Intervals merged(Intervals v) {
  std::sort(v.begin(), v.end());
  Intervals out;
  for (const auto& [a, b] : v) {
    if (b <= a) continue;
    if (!out.empty() && a <= out.back().second) out.back().second = std::max(out.back().second, b);
    else out.emplace_back(a, b);
  }
  return out;
}

double measure(const Intervals& m) {
  double s = 0;
  for (const auto& [a, b] : m) s += b - a;
  return s;
}

// The measure of the intersection of two merged interval lists.
double intersection(const Intervals& x, const Intervals& y) {
  double s = 0;
  size_t i = 0, j = 0;
  while (i < x.size() && j < y.size()) {
    const double lo = std::max(x[i].first, y[j].first), hi = std::min(x[i].second, y[j].second);
    if (hi > lo) s += hi - lo;
    (x[i].second < y[j].second ? i : j)++;
  }
  return s;
}

[[noreturn]] void op_error(const std::vector<SystemOp>& ops, size_t i, const std::string& why) {
  throw Error(Location{.pass = "system"},
              fmt::format("op {} '{}' ({}): {}", i, ops[i].name, system_op_kind_name(ops[i].kind), why));
}

void validate(const std::vector<SystemOp>& ops) {
  for (size_t i = 0; i < ops.size(); ++i) {
    const SystemOp& op = ops[i];
    for (int d : op.deps)
      if (d < 0 || size_t(d) >= i) op_error(ops, i, fmt::format("dep {} is not an earlier op", d));
    if (op.kind == SystemOpKind::compute) {
      if (!(op.seconds >= 0) || !std::isfinite(op.seconds))
        op_error(ops, i, fmt::format("seconds must be finite and >= 0 (got {})", op.seconds));
    } else {
      if (op.bytes < 0) op_error(ops, i, fmt::format("bytes must be >= 0 (got {})", op.bytes));
      if (op.elem_bytes < 1) op_error(ops, i, fmt::format("elem_bytes must be >= 1 (got {})", op.elem_bytes));
      if (op.bytes % op.elem_bytes != 0)
        op_error(ops, i, fmt::format("bytes {} is not a multiple of elem_bytes {}", op.bytes, op.elem_bytes));
    }
  }
}

}  // namespace

const char* system_op_kind_name(SystemOpKind k) {
  switch (k) {
    case SystemOpKind::compute: return "compute";
    case SystemOpKind::all_reduce: return "all_reduce";
    case SystemOpKind::all_gather: return "all_gather";
  }
  return "?";
}

double ring_formula_seconds(SystemOpKind kind, int64_t bytes, const hw::HwSpec& hw) {
  const double n = double(hw.system.chips);
  if (kind == SystemOpKind::compute || hw.system.chips <= 1 || bytes <= 0) return 0;
  const double bw = hw.system.link_gbps * 1e9, lat = hw.system.link_latency_ns * 1e-9;
  const double one_pass = (n - 1) / n * double(bytes) / bw + (n - 1) * lat;
  return kind == SystemOpKind::all_reduce ? 2 * one_pass : one_pass;
}

hw::HwSpec system_engine_spec(const hw::HwSpec& hw) {
  const SystemSpec& sys = hw.system;
  HwSpec s = hw;
  s.cores = sys.chips;
  s.interconnect = InterconnectSpec{};
  // One link engine per outgoing link, at least 2 (a chip sends on one while the next send waits for its
  // deps): the chip's own DMA engines move DRAM data and are not what drives its chip-to-chip links.
  s.dma_engines = 2;
  if (sys.chips > 1) {
    // fully_connected: every ring step goes to the next chip over one link, which a fully connected
    // system has directly, so the ring algorithm sees a ring (docs/sim.md).
    s.interconnect.topology = sys.topology == SystemTopology::mesh ? Topology::mesh : Topology::ring;
    if (sys.topology == SystemTopology::mesh) {
      s.interconnect.mesh_shape = sys.mesh_shape;
      s.dma_engines = 4;
    }
    s.interconnect.bytes_per_cycle = sys.link_gbps / hw.clock_ghz;
    s.interconnect.hop_latency_cycles = sys.link_latency_ns * hw.clock_ghz;
  }
  s.interconnect.reduce_path = ReducePath::dram;
  // A reduction step adds a received chunk on the whole chip: every core's vector unit.
  s.vector.elements_per_cycle[int(VectorOp::add)] = hw.vector.rate(VectorOp::add) * double(hw.cores);
  s.limits = LimitsSpec{};
  return s;
}

std::vector<int> system_ring_order(const hw::HwSpec& hw) {
  const int n = int(hw.system.chips);
  std::vector<int> order;
  if (hw.system.topology != SystemTopology::mesh || n <= 2) {
    for (int i = 0; i < n; ++i) order.push_back(i);
    return order;
  }
  const int rows = int(hw.system.mesh_shape.at(0)), cols = int(hw.system.mesh_shape.at(1));
  auto id = [&](int r, int c) { return r * cols + c; };
  if (rows % 2 == 0 && cols >= 2) {
    // Along row 0, snake back through columns 1.. of rows 1..R-1, up column 0.
    for (int c = 0; c < cols; ++c) order.push_back(id(0, c));
    for (int r = 1; r < rows; ++r)
      for (int k = 0; k < cols - 1; ++k) order.push_back(id(r, r % 2 ? cols - 1 - k : 1 + k));
    for (int r = rows - 1; r >= 1; --r) order.push_back(id(r, 0));
  } else if (cols % 2 == 0 && rows >= 2) {
    // The same with rows and columns swapped.
    for (int r = 0; r < rows; ++r) order.push_back(id(r, 0));
    for (int c = 1; c < cols; ++c)
      for (int k = 0; k < rows - 1; ++k) order.push_back(id(c % 2 ? rows - 1 - k : 1 + k, c));
    for (int c = cols - 1; c >= 1; --c) order.push_back(id(0, c));
  } else {
    // No cycle of neighbours (both sides odd, or a line): the snake; its closing step takes several hops.
    for (int r = 0; r < rows; ++r)
      for (int k = 0; k < cols; ++k) order.push_back(id(r, r % 2 ? cols - 1 - k : k));
  }
  return order;
}

SystemSimResult simulate_system(const std::vector<SystemOp>& ops, const hw::HwSpec& hw) {
  validate(ops);
  const int n = int(hw.system.chips);
  // The ring makes N (N - 1) sends per phase per collective: bounded before any is made (1024 chips and a
  // model's collectives would otherwise ask for gigabytes of tasks).
  uint64_t tasks = 0;
  for (const SystemOp& op : ops) {
    const uint64_t ring = n > 1 && op.bytes > 0 ? uint64_t(n) * uint64_t(n - 1) : 0;
    tasks += op.kind == SystemOpKind::compute ? uint64_t(n) : op.kind == SystemOpKind::all_reduce ? 3 * ring : ring;
  }
  if (tasks > uint64_t(std::numeric_limits<TaskId>::max()))
    throw Error(Location{.pass = "sim"}, fmt::format("the system simulation would need {} tasks ({} chips)", tasks, n));
  check_alloc(tasks * 128, fmt::format("the system simulation's {} tasks ({} chips)", tasks, n));  // task, deps, timings
  const HwSpec spec = system_engine_spec(hw);
  const std::vector<int> order = system_ring_order(hw);

  TaskGraph g;
  // done[op][chip]: the tasks after which the op is finished on that chip (a collective that makes no
  // tasks passes its deps' through).
  std::vector<std::vector<std::vector<TaskId>>> done(ops.size(), std::vector<std::vector<TaskId>>(static_cast<size_t>(n)));
  std::vector<std::pair<TaskId, TaskId>> task_range(ops.size(), {0, 0});  // [first, end) of each op's tasks
  enum class Use : uint8_t { compute, comm };
  std::vector<Use> use;  // per task: what it counts as on its chip

  for (size_t i = 0; i < ops.size(); ++i) {
    const SystemOp& op = ops[i];
    const int label = g.intern(op.name.empty() ? system_op_kind_name(op.kind) : op.name);
    const TaskId first = TaskId(g.size());
    auto ready_on = [&](int chip) {
      std::vector<TaskId> r;
      for (int d : op.deps) r.insert(r.end(), done[size_t(d)][size_t(chip)].begin(), done[size_t(d)][size_t(chip)].end());
      return r;
    };
    auto add = [&](Task t, const std::vector<TaskId>& deps, Use u) {
      t.kernel = int32_t(i);
      t.label = label;
      use.push_back(u);
      return g.add(t, std::span<const TaskId>(deps));
    };
    if (op.kind == SystemOpKind::compute) {
      for (int c = 0; c < n; ++c) done[i][size_t(c)] = {add(matmul_task(c, hw.cycles(op.seconds)), ready_on(c), Use::compute)};
    } else if (n == 1 || op.bytes == 0) {
      for (int c = 0; c < n; ++c) done[i][size_t(c)] = ready_on(c);
    } else {
      // Position p of the ring is chip order[p]; it sends to position p + 1. Chunk k holds elements
      // [E k / N, E (k + 1) / N).
      const int64_t elements = op.bytes / op.elem_bytes;
      auto chunk_elements = [&](int k) { return elements * (k + 1) / n - elements * k / n; };
      auto chip = [&](int p) { return order[size_t(((p % n) + n) % n)]; };
      auto chunk = [&](int k) { return ((k % n) + n) % n; };
      std::vector<std::vector<TaskId>> ready(static_cast<size_t>(n));
      for (int p = 0; p < n; ++p) ready[size_t(p)] = ready_on(chip(p));
      // after[p]: what position p's next send waits for (its last receive, or add).
      std::vector<std::vector<TaskId>> after = ready;
      std::vector<TaskId> sends(static_cast<size_t>(n));
      if (op.kind == SystemOpKind::all_reduce) {
        // Reduce-scatter: in step s position p sends chunk p - s; p + 1 adds it to its own copy. After
        // N - 1 steps position p holds chunk p + 1 summed over all chips.
        for (int s = 0; s < n - 1; ++s) {
          for (int p = 0; p < n; ++p)
            sends[size_t(p)] = add(transfer_task(chip(p), chip(p + 1), chunk_elements(chunk(p - s)) * op.elem_bytes),
                                   after[size_t(p)], Use::comm);
          for (int p = 0; p < n; ++p) {
            const int q = (p + 1) % n;
            std::vector<TaskId> deps{sends[size_t(p)]};
            if (s == 0) deps.insert(deps.end(), ready[size_t(q)].begin(), ready[size_t(q)].end());
            const Task t = vector_task(chip(q), vector_cycles(spec, VectorOp::add, chunk_elements(chunk(p - s))));
            after[size_t(q)] = {add(t, deps, Use::comm)};
          }
        }
      }
      // All-gather: in step s position p sends the chunk it got last (all_reduce: chunk p + 1 - s) or, in
      // a plain all_gather, its own shard first (chunk p - s); p + 1 keeps it.
      const int shift = op.kind == SystemOpKind::all_reduce ? 1 : 0;
      for (int s = 0; s < n - 1; ++s) {
        for (int p = 0; p < n; ++p)
          sends[size_t(p)] = add(transfer_task(chip(p), chip(p + 1), chunk_elements(chunk(p + shift - s)) * op.elem_bytes),
                                 after[size_t(p)], Use::comm);
        for (int p = 0; p < n; ++p) after[size_t((p + 1) % n)] = {sends[size_t(p)]};
      }
      // Done on a chip when its last receive and its last send are.
      for (int p = 0; p < n; ++p)
        done[i][size_t(chip(p))] = {after[size_t(p)].front(), sends[size_t(p)]};
    }
    task_range[i] = {first, TaskId(g.size())};
  }

  const SimResult r = simulate(g, spec);
  SystemSimResult out;
  out.chips = n;
  out.seconds = r.seconds;
  for (size_t i = 0; i < ops.size(); ++i) {
    if (ops[i].kind == SystemOpKind::compute) continue;
    CollectiveTime ct{.name = ops[i].name, .kind = ops[i].kind, .bytes = ops[i].bytes};
    ct.formula_seconds = ring_formula_seconds(ops[i].kind, ops[i].bytes, hw);
    const auto [a, b] = task_range[i];
    if (b > a) {
      double lo = r.start[size_t(a)], hi = r.finish[size_t(a)];
      for (TaskId t = a; t < b; ++t) lo = std::min(lo, r.start[size_t(t)]), hi = std::max(hi, r.finish[size_t(t)]);
      ct.sim_seconds = spec.seconds(hi - lo);
    }
    out.collectives.push_back(std::move(ct));
  }
  std::vector<Intervals> compute(static_cast<size_t>(n)), comm(static_cast<size_t>(n));
  for (size_t t = 0; t < g.size(); ++t) {
    auto& v = use[t] == Use::compute ? compute : comm;
    v[size_t(g.task(TaskId(t)).core)].emplace_back(spec.seconds(r.start[t]), spec.seconds(r.finish[t]));
  }
  for (int c = 0; c < n; ++c) {
    const Intervals x = merged(compute[size_t(c)]), y = merged(comm[size_t(c)]);
    ChipTime ch;
    ch.compute_seconds = spec.seconds(r.lane(c, int(Lane::matrix)).busy);
    ch.comm_seconds = measure(y);
    ch.overlap_seconds = intersection(x, y);
    ch.idle_seconds = std::max(0.0, out.seconds - (measure(x) + ch.comm_seconds - ch.overlap_seconds));
    out.per_chip.push_back(ch);
  }
  out.trace_json = chrome_trace_json(g, spec, r);
  return out;
}

}  // namespace tessel::dataflow
