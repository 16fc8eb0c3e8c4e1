// Tile program -> engine tasks (see timing.h for the schedule).
#include "tessel/targets/dataflow/timing.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>

#include "tessel/support/error.h"
#include "tessel/targets/dataflow/cost.h"
#include "tessel/targets/dataflow/tile_traffic.h"

namespace tessel::dataflow {
namespace {

using hw::HwSpec;
using dataflow::Task;
using dataflow::TaskGraph;
using dataflow::TaskId;
using hw::VectorOp;

double vector_time(const HwSpec& hw, const std::vector<double>& per_point, double points) {
  double c = 0;
  for (size_t i = 0; i < per_point.size(); ++i) {
    const double n = per_point[i] * points;
    if (n > 0) c += dataflow::vector_cycles(hw, static_cast<VectorOp>(i), static_cast<int64_t>(n + 0.5));
  }
  return c;
}

struct Step {
  std::vector<int64_t> tile;     // tile index per dim
  std::vector<int64_t> extent;   // elements per dim in this tile
};

class KernelTasks {
 public:
  KernelTasks(const TileProgram& p, const TileKernel& t, const HwSpec& hw, TaskGraph& g, int index, TaskId begin)
      : p_(p), t_(t), hw_(hw), g_(g), index_(index), begin_(begin) {}

  // Emits the kernel's tasks; returns the tasks the kernel's end waits for.
  std::vector<TaskId> emit() {
    const size_t nd = t_.dims.size();
    coords_ = core_coords(t_);
    for (const auto& coord : coords_) walks_.push_back(core_walk(t_, coord));
    // reduction dims: a step ends an output tile when every reduction dim is at its last tile
    for (size_t d = 0; d < nd; ++d)
      if (t_.dims[d].reduction) red_.push_back(static_cast<int>(d));
    setup_operands();
    int64_t max_steps = 0;
    for (const CoreWalk& w : walks_) max_steps = std::max(max_steps, w.steps);
    last_load_.assign(t_.operands.size() * static_cast<size_t>(t_.cores), -1);
    loads_done_.assign(t_.operands.size() * static_cast<size_t>(t_.cores), 0);
    users_.assign(t_.operands.size() * static_cast<size_t>(t_.cores), {});
    current_.assign(t_.operands.size() * static_cast<size_t>(t_.cores), -1);
    prev_key_.assign(t_.operands.size() * static_cast<size_t>(t_.cores), {});
    last_task_.assign(static_cast<size_t>(t_.cores), begin_);
    pending_.assign(static_cast<size_t>(t_.cores), {});
    for (int64_t s = 0; s < max_steps; ++s) {
      std::vector<Step> steps(static_cast<size_t>(t_.cores));
      for (int c = 0; c < t_.cores; ++c)
        if (s < walks_[static_cast<size_t>(c)].steps) steps[static_cast<size_t>(c)] = step_of(c, s);
      // loads of this step, for every core
      for (int c = 0; c < t_.cores; ++c)
        if (s < walks_[static_cast<size_t>(c)].steps) loads(c, steps[static_cast<size_t>(c)], s);
      // stores of the previous step's finished tiles, after this step's loads were queued
      for (int c = 0; c < t_.cores; ++c) flush_stores(c);
      // compute
      std::vector<TaskId> comp(static_cast<size_t>(t_.cores), -1);
      for (int c = 0; c < t_.cores; ++c)
        if (s < walks_[static_cast<size_t>(c)].steps) comp[static_cast<size_t>(c)] = compute(c, steps[static_cast<size_t>(c)]);
      // finished output tiles: K-split reduction, epilogue, store (deferred)
      std::vector<char> ends(static_cast<size_t>(t_.cores), 0);
      for (int c = 0; c < t_.cores; ++c)
        ends[static_cast<size_t>(c)] = s < walks_[static_cast<size_t>(c)].steps && ends_output(c, steps[static_cast<size_t>(c)]);
      finish_tiles(ends, steps, comp);
    }
    for (int c = 0; c < t_.cores; ++c) flush_stores(c);
    std::vector<TaskId> ends;
    for (int c = 0; c < t_.cores; ++c) {
      ends.push_back(last_task_[static_cast<size_t>(c)]);
      if (last_store_.count(c)) ends.push_back(last_store_[c]);
    }
    return ends;
  }

 private:
  Step step_of(int c, int64_t s) const {
    const CoreWalk& w = walks_[static_cast<size_t>(c)];
    const size_t nd = t_.dims.size();
    Step st;
    st.tile.assign(nd, 0);
    st.extent.assign(nd, 0);
    // mixed radix over the loop order, the last dim of the order fastest
    int64_t rest = s;
    for (size_t i = t_.order.size(); i-- > 0;) {
      const size_t d = static_cast<size_t>(t_.order[i]);
      st.tile[d] = rest % w.counts[d];
      rest /= w.counts[d];
    }
    for (size_t d = 0; d < nd; ++d) {
      const int64_t a = w.lo[d] + st.tile[d] * t_.dims[d].tile;
      st.extent[d] = std::min(t_.dims[d].tile, w.hi[d] - a);
    }
    return st;
  }

  // Which core loads each operand's tiles for each core (broadcast groups).
  void setup_operands() {
    BroadcastGroups b = broadcast_groups(t_, coords_, walks_);
    leader_ = std::move(b.leader);
    members_ = std::move(b.members);
  }

  double fraction(const Operand& op, const Step& st) const {
    double f = 1;
    for (int d : op.dims) f *= static_cast<double>(st.extent[static_cast<size_t>(d)]) / static_cast<double>(t_.dims[static_cast<size_t>(d)].tile);
    return f;
  }

  bool is_loaded(const Operand& op) const { return step_loaded(op); }
  int64_t transfer_bytes(const Operand& op, const Step& st) const { return tile_transfer_bytes(t_, op, st.extent); }

  void loads(int c, const Step& st, int64_t s) {
    for (size_t oi = 0; oi < t_.operands.size(); ++oi) {
      const Operand& op = t_.operands[oi];
      if (!is_loaded(op)) continue;
      const size_t slot = oi * static_cast<size_t>(t_.cores) + static_cast<size_t>(c);
      std::vector<int64_t> key;
      for (int d : op.dims) key.push_back(st.tile[static_cast<size_t>(d)]);
      if (s > 0 && key == prev_key_[slot] && current_[slot] >= 0) continue;  // resident
      prev_key_[slot] = key;
      const int leader = leader_[slot];
      if (leader != c) {  // the leader (a lower core, so already done this step) broadcast it
        current_[slot] = current_[oi * static_cast<size_t>(t_.cores) + static_cast<size_t>(leader)];
        continue;
      }
      const int64_t bytes = transfer_bytes(op, st);
      std::vector<TaskId> deps{begin_};
      if (last_load_[slot] >= 0) deps.push_back(last_load_[slot]);  // one load of a stream in flight
      // the buffer this load overwrites is free once the steps that read it `copies` loads ago are done
      const int64_t n = loads_done_[slot];
      auto& users = users_[slot];
      if (n >= op.copies && static_cast<int64_t>(users.size()) >= op.copies)
        for (TaskId u : users[static_cast<size_t>((n - op.copies) % op.copies)]) deps.push_back(u);
      Task task = members_[slot] > 1 ? dataflow::broadcast_load_task(c, bytes, members_[slot], index_) : dataflow::load_task(c, bytes, index_);
      const TaskId id = g_.add(task, deps);
      last_load_[slot] = id;
      current_[slot] = id;
      if (static_cast<int64_t>(users.size()) < op.copies) users.resize(static_cast<size_t>(op.copies));
      users[static_cast<size_t>(n % op.copies)].clear();
      ++loads_done_[slot];
      last_task_[static_cast<size_t>(c)] = id;
    }
  }

  double compute_cycles(const Step& st, bool* on_matrix) const {
    const auto& e = st.extent;
    *on_matrix = true;
    switch (t_.kind) {
      case TileKind::matmul:
        return dataflow::matmul_cycles(hw_, e[1], e[3], e[2], p_.float_dtype) * static_cast<double>(e[0]);
      case TileKind::conv: {
        if (conv_depthwise()) {
          *on_matrix = false;
          return vector_time(hw_, t_.vector_ops, static_cast<double>(e[0] * e[1] * e[2]));
        }
        return dataflow::matmul_cycles(hw_, e[0] * e[2], e[3], e[1], p_.float_dtype);
      }
      case TileKind::vector:
      case TileKind::relayout:
        *on_matrix = false;
        return vector_time(hw_, t_.vector_ops, static_cast<double>(e[0]));
      case TileKind::host:
        break;
    }
    return 0;
  }

  bool conv_depthwise() const { return t_.kind == TileKind::conv && t_.on_vector_unit; }

  TaskId compute(int c, const Step& st) {
    std::vector<TaskId> deps{begin_};
    for (size_t oi = 0; oi < t_.operands.size(); ++oi) {
      const Operand& op = t_.operands[oi];
      if (!is_loaded(op)) continue;
      const size_t slot = oi * static_cast<size_t>(t_.cores) + static_cast<size_t>(c);
      if (current_[slot] >= 0) deps.push_back(current_[slot]);
    }
    bool on_matrix = true;
    const double cycles = compute_cycles(st, &on_matrix);
    int64_t spad = 0;
    for (const Operand& op : t_.operands) spad += static_cast<int64_t>(static_cast<double>(op.tile_bytes) * fraction(op, st));
    Task task = on_matrix ? dataflow::matmul_task(c, cycles, index_) : dataflow::vector_task(c, cycles, index_);
    task.spad_bytes = spad;
    const TaskId id = g_.add(task, deps);
    // the buffers this step read stay busy until it is done (at the loading core's slot)
    for (size_t oi = 0; oi < t_.operands.size(); ++oi) {
      const Operand& op = t_.operands[oi];
      if (!is_loaded(op)) continue;
      const size_t lslot = oi * static_cast<size_t>(t_.cores) + static_cast<size_t>(leader_[oi * static_cast<size_t>(t_.cores) + static_cast<size_t>(c)]);
      if (loads_done_[lslot] == 0) continue;
      auto& users = users_[lslot];
      users[static_cast<size_t>((loads_done_[lslot] - 1) % op.copies)].push_back(id);
    }
    last_task_[static_cast<size_t>(c)] = id;
    return id;
  }

  bool ends_output(int c, const Step& st) const {
    for (int d : red_)
      if (st.tile[static_cast<size_t>(d)] != walks_[static_cast<size_t>(c)].counts[static_cast<size_t>(d)] - 1) return false;
    return true;
  }

  // Where the partial sums of core c go along a split reduction dim (the neighbour one K coordinate
  // lower), or -1 for the core that finishes the tile.
  int reduce_peer(int c) const { return dataflow::reduce_peer(t_, coords_, c); }

  // After the last reduction step of an output tile: the K-split chain (cores in descending order, so
  // a core forwards after receiving), then on the finishing core the epilogue and a deferred store.
  void finish_tiles(const std::vector<char>& ends, const std::vector<Step>& steps, const std::vector<TaskId>& comp) {
    std::vector<TaskId> received(static_cast<size_t>(t_.cores), -1);
    for (int c = t_.cores; c-- > 0;) {
      if (!ends[static_cast<size_t>(c)]) continue;
      const int peer = reduce_peer(c);
      if (peer < 0) continue;
      const Step& st = steps[static_cast<size_t>(c)];
      int64_t elements = 1;
      for (size_t d = 0; d < t_.dims.size(); ++d)
        if (!t_.dims[d].reduction) elements *= st.extent[d];
      std::vector<TaskId> deps{comp[static_cast<size_t>(c)]};
      if (received[static_cast<size_t>(c)] >= 0) deps.push_back(received[static_cast<size_t>(c)]);
      const TaskId id = g_.add(dataflow::reduce_task(c, peer, elements, 4, index_), deps);
      received[static_cast<size_t>(peer)] = id;
      last_task_[static_cast<size_t>(c)] = id;
    }
    for (int c = 0; c < t_.cores; ++c) {
      if (!ends[static_cast<size_t>(c)] || reduce_peer(c) >= 0) continue;
      const Step& st = steps[static_cast<size_t>(c)];
      std::vector<TaskId> deps{comp[static_cast<size_t>(c)]};
      if (received[static_cast<size_t>(c)] >= 0) deps.push_back(received[static_cast<size_t>(c)]);
      // epilogue inputs (residual, bias), chained per stream
      for (size_t oi = 0; oi < t_.operands.size(); ++oi) {
        const Operand& op = t_.operands[oi];
        if (op.role != "epi" || op.global < 0) continue;
        const size_t slot = oi * static_cast<size_t>(t_.cores) + static_cast<size_t>(c);
        std::vector<TaskId> ld{begin_};
        if (last_load_[slot] >= 0) ld.push_back(last_load_[slot]);
        const int64_t bytes = transfer_bytes(op, st);
        last_load_[slot] = g_.add(dataflow::load_task(c, bytes, index_), ld);
        deps.push_back(last_load_[slot]);
      }
      TaskId done = -1;
      if (t_.kind != TileKind::vector && t_.kind != TileKind::relayout && !t_.vector_ops.empty()) {
        int64_t out_elems = 1;
        for (size_t d = 0; d < t_.dims.size(); ++d)
          if (!t_.dims[d].reduction) out_elems *= st.extent[d];
        const double cycles = vector_time(hw_, t_.vector_ops, static_cast<double>(out_elems));
        if (cycles > 0 && !conv_depthwise()) done = g_.add(dataflow::vector_task(c, cycles, index_), deps);
      }
      if (done < 0 && deps.size() > 1) done = g_.add(dataflow::barrier_task(0, index_), deps);
      if (done < 0) done = deps[0];
      last_task_[static_cast<size_t>(c)] = done;
      for (const Operand& op : t_.operands) {
        if (!op.out || op.global < 0) continue;
        const int64_t bytes = transfer_bytes(op, st);
        pending_[static_cast<size_t>(c)].push_back({dataflow::store_task(c, bytes, index_), done});
      }
    }
  }

  void flush_stores(int c) {
    for (const auto& [task, dep] : pending_[static_cast<size_t>(c)]) {
      std::vector<TaskId> deps{dep};
      if (last_store_.count(c)) deps.push_back(last_store_[c]);
      last_store_[c] = g_.add(task, deps);
    }
    pending_[static_cast<size_t>(c)].clear();
  }

  const TileProgram& p_;
  const TileKernel& t_;
  const HwSpec& hw_;
  TaskGraph& g_;
  int index_;
  TaskId begin_;
  std::vector<std::vector<int64_t>> coords_;
  std::vector<CoreWalk> walks_;
  std::vector<int> red_;
  std::vector<int> leader_, members_;
  std::vector<TaskId> last_load_, current_;
  std::vector<int64_t> loads_done_;
  std::vector<std::vector<std::vector<TaskId>>> users_;
  std::vector<std::vector<int64_t>> prev_key_;
  std::vector<TaskId> last_task_;
  std::vector<std::vector<std::pair<Task, TaskId>>> pending_;
  std::map<int, TaskId> last_store_;
};

}  // namespace

Timeline build_timeline(const TileProgram& p) {
  const HwSpec& hw = p.hw_spec();
  Timeline tl;
  TaskGraph& g = tl.graph;
  const double overhead = dataflow::kernel_overhead_cycles(hw);
  TaskId prev = -1;
  for (size_t i = 0; i < p.kernels.size(); ++i) {
    const TileKernel& t = p.kernels[i];
    Task b = dataflow::barrier_task(overhead, static_cast<int>(i));
    b.label = g.intern(t.name + " begin");
    const TaskId begin = prev >= 0 ? g.add(b, {prev}) : g.add(b);
    tl.kernel_begin.push_back(begin);
    std::vector<TaskId> ends;
    if (t.kind == TileKind::host) {
      // Host steps: the data crosses to the host and back at DRAM bandwidth, plus one more launch.
      double bytes = static_cast<double>(t.dram_bytes);
      Task h = dataflow::barrier_task(overhead + bytes / hw.dram_read_bytes_per_cycle(), static_cast<int>(i));
      h.label = g.intern(t.name + " host " + t.node);
      ends.push_back(g.add(h, {begin}));
    } else {
      try {
        ends = KernelTasks(p, t, hw, g, static_cast<int>(i), begin).emit();
      } catch (const Error& e) {
        throw e.with_context(Location{.node = t.node, .op = t.name, .pass = "sim"});
      }
    }
    Task e = dataflow::barrier_task(0, static_cast<int>(i));
    e.label = g.intern(t.name + " end");
    prev = g.add(e, std::span<const TaskId>(ends.data(), ends.size()));
    tl.kernel_end.push_back(prev);
  }
  return tl;
}

SimulatedProgram simulate_program(const TileProgram& p, const dataflow::SimOptions& options) {
  const HwSpec& hw = p.hw_spec();
  SimulatedProgram sp;
  sp.timeline = build_timeline(p);
  sp.result = dataflow::simulate(sp.timeline.graph, hw, options);
  for (size_t i = 0; i < p.kernels.size(); ++i) {
    const TileKernel& t = p.kernels[i];
    KernelTime kt;
    const double begin = sp.result.finish[static_cast<size_t>(sp.timeline.kernel_begin[i])] - dataflow::kernel_overhead_cycles(hw);
    const double end = sp.result.finish[static_cast<size_t>(sp.timeline.kernel_end[i])];
    kt.seconds = hw.seconds(end - begin);
    // The bytes no plan can avoid: each operand's elements the kernel reads or writes once — the part
    // of its tensor the kernel's dims index (attention reads a third of the qkv tensor), at most the
    // tensor.
    for (int gi : kernel_globals(t)) {
      const Global& g = p.globals[static_cast<size_t>(gi)];
      double view = -1;  // host steps: the whole tensor
      for (const Operand& op : t.operands) {
        if (op.global != gi) continue;
        double elems = 1;
        for (int d : op.dims) elems *= static_cast<double>(t.dims[static_cast<size_t>(d)].size);
        view = std::max(view, elems * static_cast<double>(dtype_size(g.dtype)));
      }
      const double whole = static_cast<double>(g.logical_bytes());
      kt.min_dram_bytes += view >= 0 ? std::min(whole, view) : whole;
    }
    if (t.kind != TileKind::host) {
      const bool matrix = !t.on_vector_unit;
      const dataflow::Roofline r = dataflow::roofline(hw, matrix ? t.flops : 0.0, kt.min_dram_bytes, p.float_dtype);
      kt.bound_seconds = r.bound_s;
      if (!matrix) {
        // vector work: its own peak (the vector unit's add rate on every core)
        const double vpeak = hw.vector.rate(VectorOp::add) * static_cast<double>(hw.cores) * hw.clock_ghz * 1e9;
        kt.bound_seconds = std::max(kt.bound_seconds, vpeak > 0 ? t.flops / vpeak : 0.0);
      }
      kt.fraction_of_bound = kt.seconds > 0 ? kt.bound_seconds / kt.seconds : 0;
    }
    sp.kernels.push_back(kt);
  }
  return sp;
}

}  // namespace tessel::dataflow
