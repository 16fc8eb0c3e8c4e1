// The DRAM bytes a tile kernel's schedule moves: the core walks, broadcast groups and per-tile bytes the
// timing engine's task builder (timing.cpp) uses, and kernel_traffic, their sum without building tasks
// (the mapper's candidate cost and the reported dram_bytes). docs/sim.md "What a kernel's DRAM figure is".
#pragma once

#include <cstdint>
#include <vector>

#include "tessel/tile/tile.h"

namespace tessel::dataflow {

// The chip description (hw/) by its own names, and the tile level (tile/) it maps to (`Dim` is the tile level's).
using namespace tessel::hw;
using namespace tessel::tile;
using tile::Dim;

// One core's view of a kernel: its slice of every dim and its steps through the tiles.
struct CoreWalk {
  std::vector<int64_t> lo, hi;   // per dim
  bool empty = false;
  std::vector<int64_t> counts;   // tiles per dim
  int64_t steps = 1;
};

// Core coordinates, row-major over the dims in order (the last dim varies fastest).
std::vector<std::vector<int64_t>> core_coords(const TileKernel& t);
CoreWalk core_walk(const TileKernel& t, const std::vector<int64_t>& coord);

// Per operand and core ([operand * cores + core]): the core that loads the operand's tiles for it (itself
// unless a lower core with the same tiles broadcasts them) and the cores of that broadcast group.
struct BroadcastGroups {
  std::vector<int> leader, members;
};
BroadcastGroups broadcast_groups(const TileKernel& t, const std::vector<std::vector<int64_t>>& coords,
                                 const std::vector<CoreWalk>& walks);

// Operands the step loop loads (inputs in DRAM; epilogue inputs load when an output tile is finished).
bool step_loaded(const Operand& op);

// Bytes of one transfer of the operand's tile whose dims have these extents (a partial tile moves its part).
int64_t tile_transfer_bytes(const TileKernel& t, const Operand& op, const std::vector<int64_t>& extent);

// Where core c's partial sums go along a split reduction dim (the neighbour one coordinate lower), or -1
// for the core that finishes the tile.
int reduce_peer(const TileKernel& t, const std::vector<std::vector<int64_t>>& coords, int c);

// What the engine's loads and stores of one kernel move: every step's operand tile unless resident
// (the previous step had the same one), a broadcast tile once per group, epilogue inputs and outputs once
// per finished output tile on the finishing core. Host steps: their dram_bytes as the mapper set them.
// Partial sums a split reduction sends through DRAM (a target without links) are not included.
struct Traffic {
  int64_t read = 0, write = 0;
};
Traffic kernel_traffic(const TileKernel& t);

}  // namespace tessel::dataflow
