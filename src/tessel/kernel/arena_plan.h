// The arena planner of the graph backend: gives every buffer with a known size and lifetime an offset
// in one memory block so that buffers alive at the same time never share bytes and buffers whose
// lifetimes are disjoint may reuse the same bytes.
#pragma once

#include <cstddef>
#include <vector>

namespace tessel {

// One buffer to place: `bytes` long, alive from step `first` through step `last` (both inclusive).
// Two buffers conflict when their step intervals intersect.
struct BufferRequest {
  size_t bytes = 0;
  int first = 0;
  int last = 0;
};

struct ArenaPlan {
  std::vector<size_t> offsets;   // one per request, a multiple of the alignment
  size_t size = 0;               // bytes of the whole arena (end of the highest buffer)
  size_t lower_bound = 0;        // the most bytes alive at any one step (no plan can do better)
};

// Greedy best-fit: the buffers are placed largest first (ties: earlier first); each goes into the
// smallest gap left between the already placed buffers whose lifetimes it overlaps, or on top of
// them when no gap fits. Buffers of `align` bytes or more (a power of two) are aligned to it, smaller
// ones to the smallest power of two >= 8 that holds them.
ArenaPlan plan_arena(const std::vector<BufferRequest>& requests, size_t align = 64);

// Whether any two requests with overlapping lifetimes share a byte in `plan` (a self-check used by
// the tests and by the backend in debug builds).
bool plan_has_conflict(const std::vector<BufferRequest>& requests, const ArenaPlan& plan);

}  // namespace tessel
