// Several chips: an SPMD program's compute steps and collectives (all-reduce, all-gather) timed on the
// chip-to-chip links of a hardware file's "system" section (docs/hw.md), by the event-driven engine
// (sim_engine.h) run on a task graph of the whole system: one "core" per chip, the system's links as its
// interconnect, each collective a ring algorithm of chunk transfers and reduction adds. docs/sim.md,
// "Several chips".
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tessel/hw/hw.h"

namespace tessel::dataflow {

enum class SystemOpKind { compute, all_reduce, all_gather };
const char* system_op_kind_name(SystemOpKind k);

// One step of the SPMD program every chip runs. Ops are in program order: each chip runs its compute
// steps in this order on one stream, and its sends in this order on its link engines.
struct SystemOp {
  SystemOpKind kind = SystemOpKind::compute;
  std::string name;          // for the trace and the report
  double seconds = 0;        // compute: its time on each chip (every chip runs the same SPMD program)
  int64_t bytes = 0;         // collectives: bytes of the full result on each chip (all_reduce: the tensor;
                             // all_gather: the gathered tensor)
  int elem_bytes = 4;        // collectives: element size (reduction work of all_reduce); divides bytes
  std::vector<int> deps;     // indices of earlier SystemOps this one waits for
};

struct CollectiveTime {
  std::string name;
  SystemOpKind kind = SystemOpKind::all_reduce;
  int64_t bytes = 0;
  double sim_seconds = 0;      // its last task's finish - its first task's start (0 with one chip)
  double formula_seconds = 0;  // ring_formula_seconds
};

// One chip's time over the run (seconds). compute: its matrix lane's busy time; comm: the union of its
// sends' and reduction adds' intervals; overlap: the measure of compute intervals that are also comm
// intervals; idle: makespan - the union of both.
struct ChipTime {
  double compute_seconds = 0, comm_seconds = 0, overlap_seconds = 0, idle_seconds = 0;
};

struct SystemSimResult {
  int chips = 1;
  double seconds = 0;  // makespan
  std::vector<ChipTime> per_chip;
  std::vector<CollectiveTime> collectives;  // one per collective op, in op order
  std::string trace_json;                   // Perfetto trace of the system run ("core N" is chip N)
};

// The ring formula (N = hw.system.chips, bw = link_gbps, lat = link_latency_ns): all_reduce
// 2(N-1)/N * bytes / bw + 2(N-1) * lat; all_gather (N-1)/N * bytes / bw + (N-1) * lat. 0 for one chip,
// for zero bytes and for compute.
double ring_formula_seconds(SystemOpKind kind, int64_t bytes, const hw::HwSpec& hw);

// Runs `ops` on every chip of hw.system. Errors (a dep not earlier, a negative or non-finite time, bytes
// not a multiple of elem_bytes) name the op.
SystemSimResult simulate_system(const std::vector<SystemOp>& ops, const hw::HwSpec& hw);

// The engine's view of the system: `hw` with cores = chips, the system's links as its interconnect
// (fully_connected: a ring, see docs/sim.md), a chip-wide vector unit. Exposed for tests and traces.
hw::HwSpec system_engine_spec(const hw::HwSpec& hw);
// The order of chips round the ring the collectives use: 0..N-1 on a ring (and fully connected); on a
// mesh a Hamiltonian cycle of neighbours when one exists (a side even and both > 1), else the snake.
std::vector<int> system_ring_order(const hw::HwSpec& hw);

}  // namespace tessel::dataflow
