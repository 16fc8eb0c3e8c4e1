// KTIR export (docs/ktir.md): the tile level as `ktdp` MLIR text (torch-spyre/RFCs 0682-KtirSpec).
// One func.func per tile kernel the export can express: a `grid` attribute with the kernel's core
// grid (its split dims), `ktdp.get_compute_tile_id` for each core's coordinates, a
// `ktdp.construct_memory_view` per global in its padded device layout plus one per operand index map,
// `ktdp.construct_access_tile` + `ktdp.load`/`ktdp.store` per tile, compute as linalg/arith/math on
// tensors, and the per-core tile loops as scf.for in the kernel's loop order.
#pragma once

#include <string>
#include <vector>

#include "tessel/kernel/kernel.h"
#include "tessel/tile/tile.h"

namespace tessel::tile {

// The module text. Kernels it cannot express (host steps, convolutions, K-split matmuls, partial
// tiles, index maps that are not affine over the tile dims, ops without a KTIR form) are listed in a
// comment at the top and, when `skipped` is given, appended to it as "tN: reason".
// Throws tessel::Error naming the kernel when the tile program and the kernel module disagree.
std::string export_ktir(const TileProgram& p, const KernelModule& m, std::vector<std::string>* skipped = nullptr);

}  // namespace tessel::tile
