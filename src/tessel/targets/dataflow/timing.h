// Timing a tile program: every kernel's per-core tile loops become tasks of the event-driven engine
// (targets/dataflow/sim_engine.h): loads, matrix and vector work, K-split reductions and stores on
// each core's engines, sharing DRAM and the interconnect. docs/sim.md.
#pragma once

#include <string>
#include <vector>

#include "tessel/targets/dataflow/sim_engine.h"
#include "tessel/tile/tile.h"

namespace tessel::dataflow {

// The chip description (hw/) by its own names, and the tile level (tile/) it maps to (`Dim` is the tile level's).
using namespace tessel::hw;
using namespace tessel::tile;
using tile::Dim;

// The schedule each core follows (the scheduling decisions the tile level makes):
//  - steps go through the kernel's tiles in its loop order; an operand tile is loaded when the step
//    needs another tile of it than the previous step had (a resident tile is not reloaded);
//  - the loads of one operand stream are chained (one in flight: DRAM is shared equally among the
//    transfers in flight, so a load needed later would slow the one needed next) and a load into a
//    buffer waits until the step that used the buffer `copies` loads earlier is done (double
//    buffering: the next tile arrives while the current one computes);
//  - a tile shared by `fanout` cores is loaded once by the first of them and broadcast;
//  - K-split partial sums are reduced along the chain of K neighbours before the epilogue;
//  - a finished tile is stored after the next step's loads were queued;
//  - kernels run one after another, each after a fixed launch overhead; host steps cost two launch
//    overheads plus their bytes at DRAM bandwidth.
struct Timeline {
  dataflow::TaskGraph graph;
  std::vector<dataflow::TaskId> kernel_begin, kernel_end;  // barrier tasks around each kernel
};

// For the program's own HwSpec (TileProgram::hw).
Timeline build_timeline(const TileProgram& p);

struct KernelTime {
  double seconds = 0;           // simulated: from its start barrier to its end barrier
  double bound_seconds = 0;     // roofline of its flops and its minimum DRAM bytes
  double min_dram_bytes = 0;    // every operand read once, every result written once (logical bytes, unpadded)
  double fraction_of_bound = 0; // bound / simulated
};

struct SimulatedProgram {
  Timeline timeline;
  dataflow::SimResult result;
  std::vector<KernelTime> kernels;
};

SimulatedProgram simulate_program(const TileProgram& p, const dataflow::SimOptions& options = {});

}  // namespace tessel::dataflow
