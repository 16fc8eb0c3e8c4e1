// Mapping the kernel level onto a dataflow target (kernel level -> tile level): the lowering stages
// that produce a tile::TileProgram (tile/tile.h, the IR) for one HwSpec, choosing splits with the
// dataflow cost model (cost.h). docs/passes/dataflow.md.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "tessel/hw/hw.h"
#include "tessel/kernel/kernel.h"
#include "tessel/tile/tile.h"

namespace tessel::dataflow {

// The chip description (hw/) by its own names, and the tile level (tile/) it maps to (`Dim` is the tile level's).
using namespace tessel::hw;
using namespace tessel::tile;
using tile::Dim;

struct MapOptions {
  std::optional<DType> float_dtype;  // storage of float tensors on the device (f16 or bf16); default: the target's
  bool double_buffer = true;
  int max_cores = 0;               // 0: all of the target's cores
  std::string name;                // the program's name; empty: the kernel module's graph's
};

// Runs the dataflow passes on a kernel module for `hw`: layout (device dtypes, padding), work
// division (per kernel, the split the cost model finds fastest), tiling for the scratchpad (an
// over-capacity plan is an Error naming the kernel and tensor), scheduling (loop order, double
// buffering) and allocation (scratchpad offsets; DRAM offsets by liveness). The program carries a
// copy of `hw` (TileProgram::hw).
TileProgram map_to_tiles(const KernelModule& m, const hw::HwSpec& hw, const MapOptions& opts = {});

// The mapping as its stages, for the pass manager across levels (lower/lowering.h registers them as
// tile-layout, tile-plan, tile-allocate): run layout, plan, allocate once each, in that order;
// map_to_tiles is exactly that, then verify_tile_program. Each returns a one-line note.
//  layout:   device dtypes, the program's header (target, cores, usable scratchpad), the physical
//            layout choices (channels-last around convolutions) and the input globals padded to the
//            target's sticks or tiles (the other globals are created, with the same rule, as the plan
//            meets them, which keeps their order);
//  plan:     per kernel, by kind: work division over the cores (the split the cost model finds
//            fastest), tiling for the scratchpad and the loop order (scheduling); host steps;
//            re-layout copies before the matmuls that need them;
//  allocate: scratchpad offsets per kernel (an over-capacity kernel is an Error naming it) and DRAM
//            offsets by liveness.
// Between plan and allocate the program verifies with `allocated` false (no offsets yet).
class TileMapping {
 public:
  TileMapping(const KernelModule& m, const hw::HwSpec& hw, const MapOptions& opts = {});
  ~TileMapping();
  TileMapping(const TileMapping&) = delete;
  TileMapping& operator=(const TileMapping&) = delete;
  std::string layout();
  std::string plan();
  std::string allocate();
  const TileProgram& program() const;  // as far as the stages have built it
  TileProgram take();                  // the program; the mapping is spent

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Default device dtype of float tensors on `hw`: f16 when it stores f16, else bf16.
DType default_float_dtype(const hw::HwSpec& hw);

}  // namespace tessel::dataflow
