// The analytical mode: per-core and per-resource sums of solo task durations, the overlap model and
// the critical path, with no event queue (what the mapper calls; docs/sim.md says where it differs).
#include <algorithm>

#include "tessel/targets/dataflow/cost.h"
#include "tessel/targets/dataflow/links.h"
#include "tessel/targets/dataflow/sim_engine.h"

namespace tessel::dataflow {

double solo_cycles(const HwSpec& hw, const Task& t) {
  switch (t.kind) {
    case TaskKind::matmul:
    case TaskKind::vector:
    case TaskKind::barrier: return t.cycles;
    case TaskKind::dma_load: return dma_cycles(hw, t.bytes, DmaDir::read);
    case TaskKind::dma_store: return dma_cycles(hw, t.bytes, DmaDir::write);
    case TaskKind::transfer: return transfer_cycles(hw, t.bytes, hops(hw, t.core, t.peer));
    case TaskKind::reduce: {
      if (t.elements <= 0) return 0;
      const int h = hw.interconnect.reduce_path == ReducePath::dram ? -1 : hops(hw, t.core, t.peer);
      return reduce_step_cycles(hw, t.elements, int(t.bytes / t.elements), h);
    }
  }
  return 0;
}

Estimate estimate(const TaskGraph& g, const HwSpec& hw) {
  const auto cores = size_t(hw.cores);
  std::vector<double> matrix(cores, 0), vec(cores, 0), dma(cores, 0), port(cores, 0);
  std::vector<double> link(size_t(link_count(hw)), 0);
  std::vector<double> finish(g.size(), 0);
  std::vector<int32_t> path;
  double read_bytes = 0, write_bytes = 0, critical = 0;
  for (size_t i = 0; i < g.size(); ++i) {
    const Task& t = g.task(TaskId(i));
    const double d = solo_cycles(hw, t);
    double ready = 0;
    for (TaskId dep : g.deps(TaskId(i))) ready = std::max(ready, finish[size_t(dep)]);
    finish[i] = ready + d;
    critical = std::max(critical, finish[i]);
    if (t.kind == TaskKind::barrier || t.core < 0 || size_t(t.core) >= cores) continue;
    const auto c = size_t(t.core);
    switch (t.kind) {
      case TaskKind::matmul: matrix[c] += d; break;
      case TaskKind::vector: vec[c] += d; break;
      case TaskKind::dma_load: dma[c] += d, read_bytes += double(t.bytes); break;
      case TaskKind::dma_store: dma[c] += d, write_bytes += double(t.bytes); break;
      case TaskKind::transfer:
      case TaskKind::reduce: {
        const bool through_dram = hw.interconnect.topology == Topology::none ||
                                  (t.kind == TaskKind::reduce && hw.interconnect.reduce_path == ReducePath::dram);
        if (through_dram) {
          read_bytes += double(t.bytes), write_bytes += double(t.bytes);
          dma[c] += d;
          break;
        }
        (t.kind == TaskKind::reduce && hw.interconnect.reduce_path == ReducePath::separate_reduce_ring ? port : dma)[c] += d;
        path.clear();
        route_links(hw, t.core, t.peer, t.kind == TaskKind::reduce, path);
        for (int32_t l : path) link[size_t(l)] += d;
        break;
      }
      case TaskKind::barrier: break;
    }
  }
  Estimate e;
  for (size_t c = 0; c < cores; ++c) {
    e.compute_cycles = std::max({e.compute_cycles, matrix[c], vec[c]});
    e.memory_cycles = std::max(e.memory_cycles, dma[c] / double(hw.dma_engines));
    e.link_cycles = std::max(e.link_cycles, port[c]);
  }
  for (double l : link) e.link_cycles = std::max(e.link_cycles, l);
  e.dram_cycles = read_bytes / dram_bytes_per_cycle(hw, DmaDir::read, false) +
                  write_bytes / dram_bytes_per_cycle(hw, DmaDir::write, false);
  e.memory_cycles = std::max({e.memory_cycles, e.dram_cycles, e.link_cycles});
  e.critical_path_cycles = critical;
  e.cycles = std::max(overlap_cycles(hw, e.compute_cycles, e.memory_cycles), critical);
  e.seconds = hw.seconds(e.cycles);
  return e;
}

}  // namespace tessel::dataflow
