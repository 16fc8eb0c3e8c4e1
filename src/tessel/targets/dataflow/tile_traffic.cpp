// The DRAM bytes of a tile kernel's schedule: the walk pieces timing.cpp shares, and their closed-form sum.
#include "tessel/targets/dataflow/tile_traffic.h"

#include <algorithm>
#include <functional>
#include <map>
#include <utility>

namespace tessel::dataflow {

std::vector<std::vector<int64_t>> core_coords(const TileKernel& t) {
  const size_t nd = t.dims.size();
  std::vector<std::vector<int64_t>> coords;
  for (int c = 0; c < t.cores; ++c) {
    std::vector<int64_t> coord(nd);
    int64_t rest = c;
    for (size_t d = nd; d-- > 0;) {
      coord[d] = rest % std::max<int64_t>(1, t.dims[d].split);
      rest /= std::max<int64_t>(1, t.dims[d].split);
    }
    coords.push_back(std::move(coord));
  }
  return coords;
}

CoreWalk core_walk(const TileKernel& t, const std::vector<int64_t>& coord) {
  const size_t nd = t.dims.size();
  CoreWalk w;
  w.lo.resize(nd), w.hi.resize(nd), w.counts.resize(nd);
  for (size_t d = 0; d < nd; ++d) {
    const Dim& dm = t.dims[d];
    w.lo[d] = coord[d] * dm.slice;
    w.hi[d] = std::min(dm.size, w.lo[d] + dm.slice);
    if (w.lo[d] >= w.hi[d]) w.empty = true;
    w.counts[d] = w.empty ? 0 : (w.hi[d] - w.lo[d] + dm.tile - 1) / dm.tile;
    w.steps *= w.counts[d];
  }
  if (w.empty) w.steps = 0;
  return w;
}

BroadcastGroups broadcast_groups(const TileKernel& t, const std::vector<std::vector<int64_t>>& coords,
                                 const std::vector<CoreWalk>& walks) {
  const size_t no = t.operands.size(), nc = static_cast<size_t>(t.cores);
  BroadcastGroups b;
  b.leader.assign(no * nc, -1);
  b.members.assign(no * nc, 1);
  for (size_t oi = 0; oi < no; ++oi) {
    const Operand& op = t.operands[oi];
    for (size_t c = 0; c < nc; ++c) b.leader[oi * nc + c] = static_cast<int>(c);
    if (op.out || op.global < 0 || op.fanout <= 1) continue;
    // cores that agree on the operand's dims, in blocks of `fanout`, with identical walks
    std::map<std::vector<int64_t>, std::vector<int>> groups;
    for (size_t c = 0; c < nc; ++c) {
      std::vector<int64_t> key;
      for (int d : op.dims) key.push_back(coords[c][static_cast<size_t>(d)]);
      groups[key].push_back(static_cast<int>(c));
    }
    for (const auto& entry : groups) {
      const std::vector<int>& cs = entry.second;
      for (size_t s = 0; s < cs.size(); s += static_cast<size_t>(op.fanout)) {
        const size_t e = std::min(cs.size(), s + static_cast<size_t>(op.fanout));
        bool same = true;
        for (size_t i = s; i < e; ++i)
          same = same && walks[static_cast<size_t>(cs[i])].counts == walks[static_cast<size_t>(cs[s])].counts;
        if (!same) continue;
        for (size_t i = s; i < e; ++i) {
          b.leader[oi * nc + static_cast<size_t>(cs[i])] = cs[s];
          b.members[oi * nc + static_cast<size_t>(cs[i])] = static_cast<int>(e - s);
        }
      }
    }
  }
  return b;
}

bool step_loaded(const Operand& op) { return !op.out && op.global >= 0 && op.role != "epi"; }

int64_t tile_transfer_bytes(const TileKernel& t, const Operand& op, const std::vector<int64_t>& extent) {
  double f = 1;
  for (int d : op.dims)
    f *= static_cast<double>(extent[static_cast<size_t>(d)]) / static_cast<double>(t.dims[static_cast<size_t>(d)].tile);
  return std::max<int64_t>(1, static_cast<int64_t>(static_cast<double>(op.tile_bytes) * f));
}

int reduce_peer(const TileKernel& t, const std::vector<std::vector<int64_t>>& coords, int c) {
  int64_t stride = 1;
  for (size_t d = t.dims.size(); d-- > 0;) {
    if (t.dims[d].reduction && t.dims[d].split > 1) {
      const int64_t kc = coords[static_cast<size_t>(c)][d];
      return kc > 0 ? static_cast<int>(c - stride) : -1;
    }
    stride *= t.dims[d].split;
  }
  return -1;
}

namespace {

// A dim's tile extents on one core with how many tiles have each: whole tiles, then the last (maybe partial).
using Extents = std::vector<std::pair<int64_t, int64_t>>;

Extents extents_of(const TileKernel& t, const CoreWalk& w, size_t d) {
  const int64_t tile = t.dims[d].tile, n = w.counts[d];
  const int64_t last = w.hi[d] - w.lo[d] - (n - 1) * tile;
  if (last == tile) return {{tile, n}};
  Extents e;
  if (n > 1) e.push_back({tile, n - 1});
  e.push_back({last, 1});
  return e;
}

// Sum over every combination of the listed dims' extents (each weighted by its tile count) of
// bytes(extent); dims not listed keep the extent `base` gives them.
int64_t sum_over(const std::vector<size_t>& dims, const std::vector<Extents>& ext, std::vector<int64_t> base,
                 const std::function<int64_t(const std::vector<int64_t>&)>& bytes) {
  int64_t total = 0;
  std::function<void(size_t, int64_t)> rec = [&](size_t i, int64_t weight) {
    if (i == dims.size()) {
      total += weight * bytes(base);
      return;
    }
    for (const auto& [extent, count] : ext[dims[i]]) {
      base[dims[i]] = extent;
      rec(i + 1, weight * count);
    }
  };
  rec(0, 1);
  return total;
}

}  // namespace

Traffic kernel_traffic(const TileKernel& t) {
  Traffic tr;
  if (t.kind == TileKind::host) {
    tr.read = t.dram_bytes;  // the engine charges a host step's bytes at the read bandwidth
    return tr;
  }
  const size_t nd = t.dims.size(), nc = static_cast<size_t>(t.cores);
  const auto coords = core_coords(t);
  std::vector<CoreWalk> walks;
  for (const auto& coord : coords) walks.push_back(core_walk(t, coord));
  const BroadcastGroups bg = broadcast_groups(t, coords, walks);
  for (size_t c = 0; c < nc; ++c) {
    const CoreWalk& w = walks[c];
    if (w.steps == 0) continue;
    std::vector<Extents> ext(nd);
    std::vector<int64_t> first(nd), last(nd);
    for (size_t d = 0; d < nd; ++d) {
      ext[d] = extents_of(t, w, d);
      first[d] = ext[d].front().first;
      last[d] = ext[d].back().first;
    }
    for (size_t oi = 0; oi < t.operands.size(); ++oi) {
      const Operand& op = t.operands[oi];
      auto bytes = [&](const std::vector<int64_t>& e) { return tile_transfer_bytes(t, op, e); };
      auto indexes = [&](size_t d) { return std::find(op.dims.begin(), op.dims.end(), static_cast<int>(d)) != op.dims.end(); };
      if (step_loaded(op)) {
        if (bg.leader[oi * nc + c] != static_cast<int>(c)) continue;  // a lower core broadcasts it
        // The step loop reloads the tile whenever an operand dim's tile index changes: once per
        // combination of the loops down to the innermost operand dim with more than one tile.
        size_t inner = 0;
        bool any = false;
        for (size_t i = 0; i < t.order.size(); ++i) {
          const size_t d = static_cast<size_t>(t.order[i]);
          if (w.counts[d] > 1 && indexes(d)) inner = i, any = true;
        }
        int64_t repeat = 1;
        std::vector<size_t> varied;
        if (any)
          for (size_t i = 0; i <= inner; ++i) {
            const size_t d = static_cast<size_t>(t.order[i]);
            if (indexes(d)) varied.push_back(d);
            else repeat *= w.counts[d];
          }
        tr.read += repeat * sum_over(varied, ext, first, bytes);
      } else if (op.global >= 0 && (op.out || op.role == "epi")) {
        // once per finished output tile (every reduction dim at its last tile), on the finishing core
        if (reduce_peer(t, coords, static_cast<int>(c)) >= 0) continue;
        std::vector<size_t> outer;
        for (size_t d = 0; d < nd; ++d)
          if (!t.dims[d].reduction) outer.push_back(d);
        const int64_t b = sum_over(outer, ext, last, bytes);
        (op.out ? tr.write : tr.read) += b;
      }
    }
  }
  return tr;
}

}  // namespace tessel::dataflow
