// Models on dataflow targets: import -> core pipeline -> fusion -> map_to_tiles, the simulated time
// of the tile program (compile -> simulate -> report, written once here for the CLI), and the course's reports (per kernel: FLOPs, bytes, arithmetic intensity,
// roofline bound, simulated time and % of bound, fusion traffic saved, padding waste, the work split,
// per-core slice sizes, scratchpad peak; per model: totals). docs/ir/tile.md, docs/sim.md.
#pragma once

#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

#include "tessel/hw/hw.h"
#include "tessel/kernel/kernel.h"
#include "tessel/passes/pass.h"
#include "tessel/targets/dataflow/map.h"
#include "tessel/targets/dataflow/timing.h"
#include "tessel/tile/tile.h"

namespace tessel {

struct DataflowCompile {
  KernelModule module;
  tile::TileProgram program;  // carries its HwSpec (program.hw)
  double lower_seconds = 0;   // import, core pipeline, fusion
  double map_seconds = 0;     // map_to_tiles
  std::vector<PassRecord> stages;  // every stage run (graph passes, fuse, tile-*), for --time-passes
};

// MODEL as for `tessel run` (.onnx, model-zoo folder, .tsl); `inputs` bind symbolic dims. The stages
// run through the pass manager across levels (lower/lowering.h) with `passes`' verify, dump_dir and
// print_after.
DataflowCompile compile_dataflow(const std::string& model, const std::vector<Tensor>& inputs, const hw::HwSpec& hw,
                                 const dataflow::MapOptions& opts = {}, const PassOptions& passes = {});
// The same from a graph already in hand (tessel.compile's dataflow targets: the PyTorch converter's
// graph); the program is named `opts.name`, else the graph's name.
DataflowCompile compile_dataflow(std::unique_ptr<Graph> graph, const hw::HwSpec& hw, const dataflow::MapOptions& opts = {},
                                 const PassOptions& passes = {});
// The same from a kernel module already in hand (the tile stages only).
DataflowCompile compile_dataflow(KernelModule module, const hw::HwSpec& hw, const dataflow::MapOptions& opts = {},
                                 const PassOptions& passes = {});

struct TensorSlice {
  std::string tensor;
  int64_t slice_bytes = 0;     // one core's slice in DRAM terms (padded)
  int64_t tile_bytes = 0;      // one tile buffer in the scratchpad
  int copies = 1;
  // The kernel dims that index it, with one core's extent (slice) and one step's (tile) along each:
  // the shapes of the two sizes above ("m 64 x k 128").
  std::vector<std::string> dims;
  std::vector<int64_t> slice_shape, tile_shape;
};

// Every figure of a kernel and of the model is worked out here, once (dataflow_report); the sim table,
// the JSON, the HTML report, the landscape row and tessel.compile's .report read these fields and do
// no arithmetic of their own. The formulas: docs/sim.md, "The report table's columns".
struct KernelReport {
  std::string name, kind, node, split, decision;
  std::vector<std::string> sources;
  int cores = 0;
  double flops = 0;
  double dram_bytes = 0;          // what its loads and stores move (the plan's traffic)
  double min_dram_bytes = 0;      // every operand read once, every result written once, unpadded
  double intensity = 0;           // flops / min_dram_bytes: the kernel's arithmetic intensity
  double achieved_intensity = 0;  // flops / dram_bytes: where the plan puts it (the roofline plot's x)
  double bound_us = 0, sim_us = 0;
  double pct_of_bound = 0;        // 100 x bound_us / sim_us
  int64_t fusion_unfused = 0, fusion_fused = 0;   // logical dtype bytes (kernel level)
  int64_t fusion_saved = 0;                       // fusion_unfused - fusion_fused
  int64_t logical_bytes = 0, padded_bytes = 0;    // of the DRAM buffers it touches
  int64_t padding_waste = 0;                      // padded_bytes - logical_bytes (a size, not traffic)
  int64_t spad_peak = 0;
  std::vector<TensorSlice> slices;
};

struct DataflowReport {
  std::string model, target;
  int64_t cores = 0;
  double sim_us = 0, bound_us = 0, flops = 0, dram_bytes = 0;
  // The analytical mode's time for the same task graph (dataflow::estimate: solo task durations, no event
  // queue, no contention; docs/sim.md): how far the schedule's queueing and sharing put the event-driven
  // time from it.
  double analytical_us = 0;
  double utilisation = 0;       // flops / (time x peak matrix FLOP/s)
  double pct_of_bound = 0;      // 100 x bound_us / sim_us
  // Each DRAM buffer of the program once (a kernel's row counts the buffers it touches).
  int64_t padded_bytes = 0, logical_bytes = 0, padding_waste = 0;
  int64_t spad_peak = 0, dram_peak = 0;
  int64_t fusion_saved = 0;     // the kernels' fusion_saved summed
  int host_steps = 0;
  double compile_seconds = 0, sim_seconds = 0;
  std::vector<double> core_busy;  // per core, busy fraction
  // Engine-µs waiting, summed over every engine lane of every core (lanes of them): a sum can exceed the
  // run's length many times; divided by `lanes` it is the wait of the average lane.
  double stall_compute = 0, stall_dma = 0, stall_interconnect = 0, stall_dependency = 0;
  int64_t lanes = 0;
  std::vector<KernelReport> kernels;
};

// For the program's own HwSpec.
DataflowReport dataflow_report(const DataflowCompile& dc, const dataflow::SimulatedProgram& sp);

// A compiled model simulated and reported on: the one compile -> simulate -> report sequence the CLI's
// `compile --report`, `sim` and `landscape` share.
struct DataflowRun {
  DataflowCompile compile;
  dataflow::SimulatedProgram sim;
  DataflowReport report;  // report.sim_seconds: the timed simulation and the report together
};
DataflowRun simulate_dataflow(DataflowCompile dc, const dataflow::SimOptions& options = {});
// The reports of a model's partitions (graph breaks between them) as one: times, FLOPs, bytes, padding
// and fusion savings summed, the scratchpad peak the largest, the ratios worked out again from the sums,
// the kernels of every partition in order. Model, target and cores from the first.
DataflowReport sum_reports(const std::vector<const DataflowReport*>& parts);
nlohmann::json report_json(const DataflowReport& r);
std::string report_table(const DataflowReport& r);

}  // namespace tessel
