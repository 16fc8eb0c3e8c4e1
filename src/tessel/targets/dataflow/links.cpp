// Interconnect link numbering and routing (ring: shorter way; mesh: XY).
#include "tessel/targets/dataflow/links.h"

#include <fmt/format.h>

#include <cstdlib>

namespace tessel::dataflow {

namespace {
bool has_reduce_ring(const HwSpec& hw) { return hw.interconnect.reduce_path == ReducePath::separate_reduce_ring; }
}  // namespace

int link_count(const HwSpec& hw) {
  const int P = int(hw.cores);
  switch (hw.interconnect.topology) {
    case Topology::ring: return (has_reduce_ring(hw) ? 4 : 2) * P;
    case Topology::mesh: return 4 * P;
    case Topology::none: return 0;
  }
  return 0;
}

void route_links(const HwSpec& hw, int src, int dst, bool reduce, std::vector<int32_t>& out) {
  if (src == dst) return;
  const int P = int(hw.cores);
  if (hw.interconnect.topology == Topology::ring) {
    const int base = reduce && has_reduce_ring(hw) ? 2 * P : 0;
    const int cw = ((dst - src) % P + P) % P;  // hops going clockwise
    if (cw <= P - cw) {
      for (int i = 0, c = src; i < cw; ++i, c = (c + 1) % P) out.push_back(base + c);
    } else {
      for (int i = 0, c = src; i < P - cw; ++i, c = (c + P - 1) % P) out.push_back(base + P + c);
    }
  } else if (hw.interconnect.topology == Topology::mesh) {
    const int cols = int(hw.interconnect.mesh_shape.at(1));
    int r = src / cols, c = src % cols;
    const int dr = dst / cols, dc = dst % cols;
    while (c != dc) {
      const bool up = dc > c;
      out.push_back((r * cols + c) * 4 + (up ? 0 : 1));
      c += up ? 1 : -1;
    }
    while (r != dr) {
      const bool up = dr > r;
      out.push_back((r * cols + c) * 4 + (up ? 2 : 3));
      r += up ? 1 : -1;
    }
  }
}

std::string link_name(const HwSpec& hw, int link) {
  const int P = int(hw.cores);
  if (hw.interconnect.topology == Topology::ring) {
    const char* ring = link >= 2 * P ? "reduce ring" : "ring";
    const int l = link % (2 * P);
    return l < P ? fmt::format("{} {}->{}", ring, l, (l + 1) % P) : fmt::format("{} {}->{}", ring, l - P, (l - P + P - 1) % P);
  }
  if (hw.interconnect.topology == Topology::mesh) {
    static const char* dirs[] = {"+col", "-col", "+row", "-row"};
    return fmt::format("mesh {} {}", link / 4, dirs[link % 4]);
  }
  return "?";
}

}  // namespace tessel::dataflow
