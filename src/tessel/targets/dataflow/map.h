// Mapping the kernel level onto a dataflow target (kernel level -> tile level): the lowering stages
// that produce a tile::TileProgram (tile/tile.h, the IR) for one HwSpec, choosing splits with the
// dataflow cost model (cost.h). docs/passes/dataflow.md.
#pragma once

#include <optional>

#include "tessel/hw/hw.h"
#include "tessel/kernel/kernel.h"
#include "tessel/tile/tile.h"

namespace tessel::tile {

struct MapOptions {
  std::optional<DType> float_dtype;  // storage of float tensors on the device (f16 or bf16); default: the target's
  bool double_buffer = true;
  int max_cores = 0;               // 0: all of the target's cores
};

// Runs the dataflow passes on a kernel module for `hw`: layout (device dtypes, padding), work
// division (per kernel, the split the cost model finds fastest), tiling for the scratchpad (an
// over-capacity plan is an Error naming the kernel and tensor), scheduling (loop order, double
// buffering) and allocation (scratchpad offsets; DRAM offsets by liveness). The program carries a
// copy of `hw` (TileProgram::hw).
TileProgram map_to_tiles(const KernelModule& m, const dataflow::HwSpec& hw, const MapOptions& opts = {});

// Default device dtype of float tensors on `hw`: f16 when it stores f16, else bf16.
DType default_float_dtype(const dataflow::HwSpec& hw);

}  // namespace tessel::tile
