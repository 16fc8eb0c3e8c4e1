// The directed interconnect links of a dataflow target and the path a transfer takes over them.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tessel/hw/hw.h"

namespace tessel::dataflow {

// The chip description (hw/) by its own names.
using namespace tessel::hw;

// Ring of P cores: links 0..P-1 go clockwise (i -> i+1), P..2P-1 counter-clockwise (i -> i-1); with a
// separate reduce ring, 2P..4P-1 are the same on that ring. Mesh: 4 links per core (+col, -col, +row,
// -row). None: no links.
int link_count(const HwSpec& hw);
// Appends to `out` the links from src to dst: the shorter way round a ring (clockwise on a tie), XY
// (columns first) on a mesh. `reduce`: the reduce ring when the target has one.
void route_links(const HwSpec& hw, int src, int dst, bool reduce, std::vector<int32_t>& out);
std::string link_name(const HwSpec& hw, int link);

}  // namespace tessel::dataflow
