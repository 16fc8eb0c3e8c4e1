// The compilation across IR levels as one pipeline of registered stages (passes/stage.h): the graph
// passes (graph → graph), fusion (graph → kernel) and the dataflow mapping stages (kernel → tile:
// tile-layout, tile-plan, tile-allocate), each timed, verified after it runs, dumped with --dump-ir
// and printed with --print-after. Assembled here, the one layer that sees every level.
// docs/passes/manager.md.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "tessel/kernel/kernel.h"
#include "tessel/passes/stage.h"
#include "tessel/targets/dataflow/map.h"

namespace tessel::lower {

// Every stage, in pipeline order: the graph passes (all_passes()), fuse, tile-layout, tile-plan,
// tile-allocate. `tessel passes` lists them.
const std::vector<StageInfo>& all_stages();
const StageInfo* find_stage(const std::string& name);  // null when there is none

// One pipeline run: the stages it is asked to run share one StageRunner, so dumps are numbered across
// levels (00-input.tsl, 01-fold-constants.tsl, ..., NN-fuse.kernel, NN-tile-layout.tile, ...).
class Lowering {
 public:
  // Throws tessel::Error when opts.print_after names no stage.
  explicit Lowering(const PassOptions& opts);
  // The graph passes of `spec` (simplify, core, or a comma list; empty: none, the input still dumped).
  void graph_passes(Graph& g, const std::string& spec);
  // fuse: graph → kernel (verify_kernel_module after it, print_kernel_module its text, its constants
  // elided when elide_constants: a compiled model's dump, where they are the weights).
  KernelModule fuse(std::unique_ptr<Graph> g, const FuseOptions& fo = {}, bool elide_constants = false);
  // tile-layout, tile-plan, tile-allocate: kernel → tile for `hw` (the result equals
  // dataflow::map_to_tiles(km, hw, mo)).
  tile::TileProgram map_to_tiles(const KernelModule& km, const hw::HwSpec& hw, const dataflow::MapOptions& mo = {});
  // A target's own stage after fusion (cpu-codegen, cuda-orient-transposes): `name` must be one of
  // all_stages(); run, print, size and verify (none: nothing to check) are the stage's.
  void run(const std::string& name, std::function<std::string()> run, std::function<std::string()> print,
           std::function<size_t()> size, std::function<void()> verify = {});
  const std::vector<PassRecord>& records() const { return runner_.records(); }
  // The number the next dump takes (NN-<stage>): a stage run outside the runner dumps with it.
  int next_dump() const { return static_cast<int>(runner_.records().size()) + 1; }
  bool printed() const { return runner_.printed(); }

 private:
  StageRunner runner_;
  bool verify_ = true;
};

}  // namespace tessel::lower
