// The event-driven timing engine of dataflow targets: a task graph (what the tile level schedules on
// each core's engines) run against a hardware description, with DRAM bandwidth shared among the
// transfers in flight and interconnect links held by the transfers that cross them. Also the
// analytical estimate of the same graph (no event queue) that the mapper calls. docs/sim.md.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "tessel/hw/hw.h"

namespace tessel::dataflow {

// The chip description (hw/) by its own names.
using namespace tessel::hw;

enum class TaskKind : uint8_t {
  matmul,     // core's matrix engine, `cycles` long
  vector,     // core's vector engine, `cycles` long
  dma_load,   // DRAM -> core's scratchpad (or `fanout` cores'), `bytes`, on one of the core's DMA engines
  dma_store,  // core's scratchpad -> DRAM, `bytes`, on one of the core's DMA engines
  transfer,   // core's scratchpad -> peer's scratchpad, `bytes`, a DMA engine of `core` + the links
  reduce,     // core's partial sums (`elements`, `bytes`) added into peer's, on the reduce path
  barrier,    // no engine: done `cycles` after its deps (0: at once); synchronisation, kernel overhead
};
inline constexpr int kNumTaskKinds = 7;
const char* task_kind_name(TaskKind k);

using TaskId = int32_t;

struct Task {
  TaskKind kind = TaskKind::barrier;
  int32_t core = 0;        // the core whose engine runs it (transfer / reduce: the sender); barrier: unused
  int32_t peer = -1;       // transfer / reduce: the receiving core
  double cycles = 0;       // matmul / vector: duration (from cost.h); barrier: delay after the deps
  int64_t bytes = 0;       // dma_load / dma_store / transfer / reduce: bytes moved
  int64_t elements = 0;    // reduce: partial-sum elements (their size is bytes / elements)
  int64_t spad_bytes = 0;  // matmul / vector: scratchpad bytes the op reads and writes (bytes report only)
  int32_t fanout = 1;      // dma_load: cores the bytes are broadcast to (read from DRAM once; at most the
                           // hw's broadcast_limit when it has one). Receivers depend on this task.
  int32_t kernel = -1;     // the kernel it belongs to (trace args, per-kernel reports)
  int32_t label = -1;      // TaskGraph::intern id of its trace name; -1: the kind's name
};

// Tasks in submission order with their dependencies. Each engine runs its tasks in the order they were
// added (the schedule decides the order); a task starts when its deps are done and its engine is free.
class TaskGraph {
 public:
  // Adds a task after all earlier ones; deps must be ids already added (so the graph is acyclic).
  TaskId add(const Task& t, std::span<const TaskId> deps);
  TaskId add(const Task& t, std::initializer_list<TaskId> deps = {}) {
    return add(t, std::span<const TaskId>(deps.begin(), deps.size()));
  }
  int32_t intern(std::string_view label);  // a label id for Task::label (equal strings, equal ids)
  void reserve(size_t tasks, size_t deps);

  size_t size() const { return tasks_.size(); }
  const Task& task(TaskId id) const { return tasks_[size_t(id)]; }
  std::span<const TaskId> deps(TaskId id) const {
    return {deps_.data() + dep_begin_[size_t(id)], deps_.data() + dep_begin_[size_t(id) + 1]};
  }
  std::string_view label(TaskId id) const;  // the task's label, or its kind's name
  size_t dep_count() const { return deps_.size(); }

 private:
  std::vector<Task> tasks_;
  std::vector<uint32_t> dep_begin_{0};
  std::vector<TaskId> deps_;
  std::vector<std::string> labels_;
  std::unordered_map<std::string, int32_t> label_ids_;
};

// Convenience constructors (designated initializers work as well).
inline Task matmul_task(int core, double cycles, int kernel = -1) {
  return {.kind = TaskKind::matmul, .core = core, .cycles = cycles, .kernel = kernel};
}
inline Task vector_task(int core, double cycles, int kernel = -1) {
  return {.kind = TaskKind::vector, .core = core, .cycles = cycles, .kernel = kernel};
}
inline Task load_task(int core, int64_t bytes, int kernel = -1) {
  return {.kind = TaskKind::dma_load, .core = core, .bytes = bytes, .kernel = kernel};
}
inline Task broadcast_load_task(int core, int64_t bytes, int fanout, int kernel = -1) {
  return {.kind = TaskKind::dma_load, .core = core, .bytes = bytes, .fanout = fanout, .kernel = kernel};
}
inline Task store_task(int core, int64_t bytes, int kernel = -1) {
  return {.kind = TaskKind::dma_store, .core = core, .bytes = bytes, .kernel = kernel};
}
inline Task transfer_task(int from, int to, int64_t bytes, int kernel = -1) {
  return {.kind = TaskKind::transfer, .core = from, .peer = to, .bytes = bytes, .kernel = kernel};
}
inline Task reduce_task(int from, int to, int64_t elements, int elem_bytes, int kernel = -1) {
  return {.kind = TaskKind::reduce, .core = from, .peer = to, .bytes = elements * elem_bytes, .elements = elements,
          .kernel = kernel};
}
inline Task barrier_task(double cycles = 0, int kernel = -1) {
  return {.kind = TaskKind::barrier, .core = -1, .cycles = cycles, .kernel = kernel};
}

// The engines ("lanes") of one core, in trace-thread order: matrix, vector, dma 0 .. dma N-1, reduce
// (the reduce-ring port; only with reduce_path "separate_reduce_ring", else reduces use the DMA engines).
enum class Lane : int { matrix = 0, vector = 1, dma0 = 2 };
int lanes_per_core(const HwSpec& hw);  // 2 + dma_engines + 1
std::string lane_name(const HwSpec& hw, int lane);

// Where one engine's time went; the six parts add up to the makespan.
//   busy:              running tasks;
//   wait_compute / wait_dma / wait_interconnect / wait_dependency: idle before a task whose last dep to
//     finish was a matmul or vector / a dma_load or dma_store / a transfer or reduce / a barrier;
//     also idle while a ready transfer waits for links (interconnect);
//   idle:              after its last task (or all of the run for an engine with no task).
struct LaneStats {
  double busy = 0, wait_compute = 0, wait_dma = 0, wait_interconnect = 0, wait_dependency = 0, idle = 0;
  int64_t tasks = 0;
  double total() const { return busy + wait_compute + wait_dma + wait_interconnect + wait_dependency + idle; }
};

struct SimOptions {
  bool record_dram_samples = false;  // keep the DRAM bandwidth over time (the trace's counter track)
};

struct DramSample {
  double cycle = 0;
  double read_bytes_per_cycle = 0;   // summed over active flows, from this cycle on
  double write_bytes_per_cycle = 0;
};

struct SimResult {
  double cycles = 0;   // makespan: the last task's finish (cycles of hw.clock)
  double seconds = 0;  // the same in seconds
  int64_t cores = 0;
  int lanes_per_core = 0;
  std::vector<LaneStats> lanes;  // [core * lanes_per_core + lane]
  const LaneStats& lane(int core, int lane) const { return lanes[size_t(core * lanes_per_core + lane)]; }
  double core_busy_fraction(int core) const;  // busiest lane of the core: busy / makespan

  // Bytes per memory level.
  int64_t dram_read_bytes = 0;
  int64_t dram_write_bytes = 0;
  int64_t interconnect_bytes = 0;       // sent over links (each transfer / reduce once)
  int64_t interconnect_link_bytes = 0;  // bytes x hops
  int64_t scratchpad_bytes = 0;         // read + written: spad_bytes of compute + every DMA / transfer end
  double dram_busy_cycles = 0;          // time with at least one DRAM transfer in flight

  // Per task, by TaskId: start and finish (cycles), and the lane it ran on (-1: barrier).
  std::vector<double> start, finish;
  std::vector<int16_t> lane_of;
  std::vector<DramSample> dram_samples;  // with SimOptions::record_dram_samples
  int64_t events = 0;                    // events processed (for throughput figures)
};

// Runs `g` on `hw`. Errors (a core out of range, a transfer to itself, a negative size) name the task.
SimResult simulate(const TaskGraph& g, const HwSpec& hw, const SimOptions& options = {});

// The analytical mode: the same per-task durations (alone, no contention), no event queue.
struct Estimate {
  double cycles = 0;          // max(overlap(compute, memory), critical path)
  double compute_cycles = 0;  // busiest core: max(matrix sum, vector sum)
  double memory_cycles = 0;   // max(DRAM bytes / bandwidth, busiest core's DMA sum / engines, busiest link)
  double dram_cycles = 0;     // read bytes / read bw + write bytes / write bw
  double link_cycles = 0;     // the busiest interconnect link (or reduce port)
  double critical_path_cycles = 0;  // longest dependency chain, each task at its solo duration
  double seconds = 0;
};
Estimate estimate(const TaskGraph& g, const HwSpec& hw);

// A Chrome / Perfetto trace of a run (load in ui.perfetto.dev or chrome://tracing): one process per
// core, one thread per engine, "X" events in microseconds; a "DRAM" process with a GB/s counter track
// when the run recorded DRAM samples; barriers with a delay on a "sync" process.
std::string chrome_trace_json(const TaskGraph& g, const HwSpec& hw, const SimResult& r);

// The solo duration of a task (no contention) in cycles: what both modes start from.
double solo_cycles(const HwSpec& hw, const Task& t);

}  // namespace tessel::dataflow
