// Arena planning by liveness: best-fit offsets over lifetime intervals, largest buffers first.
#include "tessel/kernel/arena_plan.h"

#include <algorithm>
#include <cstdint>
#include <numeric>

namespace tessel {
namespace {

size_t round_up(size_t n, size_t align) { return (n + align - 1) & ~(align - 1); }

// Buffers of at least `align` bytes are aligned to it; smaller ones to the power of two that holds
// them (at least 8), so that tiny results (scalars, row statistics) do not each cost `align` bytes.
size_t align_of(size_t bytes, size_t align) {
  size_t a = 8;
  while (a < bytes && a < align) a *= 2;
  return std::min(a, align);
}
size_t padded(size_t bytes, size_t align) { return round_up(bytes, align_of(bytes, align)); }

bool overlaps(const BufferRequest& a, const BufferRequest& b) { return a.first <= b.last && b.first <= a.last; }

// The most bytes alive at one step: the bound any placement must reach.
size_t live_peak(const std::vector<BufferRequest>& reqs, size_t align) {
  std::vector<std::pair<int, long long>> events;  // (step, +bytes at first / -bytes after last)
  for (const auto& r : reqs) {
    if (r.bytes == 0) continue;
    long long b = static_cast<long long>(padded(r.bytes, align));
    events.push_back({r.first, b});
    events.push_back({r.last + 1, -b});
  }
  std::sort(events.begin(), events.end(), [](const auto& x, const auto& y) {
    return x.first != y.first ? x.first < y.first : x.second < y.second;  // frees before allocations
  });
  long long live = 0, peak = 0;
  for (const auto& e : events) {
    live += e.second;
    peak = std::max(peak, live);
  }
  return static_cast<size_t>(peak);
}

}  // namespace

ArenaPlan plan_arena(const std::vector<BufferRequest>& requests, size_t align) {
  ArenaPlan plan;
  plan.offsets.assign(requests.size(), 0);
  std::vector<size_t> order(requests.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    if (requests[a].bytes != requests[b].bytes) return requests[a].bytes > requests[b].bytes;
    return requests[a].first < requests[b].first;
  });
  std::vector<size_t> placed;
  for (size_t i : order) {
    const BufferRequest& r = requests[i];
    if (r.bytes == 0) continue;
    const size_t need = padded(r.bytes, align), a = align_of(r.bytes, align);
    // Occupied ranges of the placed buffers alive at the same time, sorted by offset.
    std::vector<std::pair<size_t, size_t>> busy;
    for (size_t j : placed)
      if (overlaps(r, requests[j])) busy.push_back({plan.offsets[j], plan.offsets[j] + padded(requests[j].bytes, align)});
    std::sort(busy.begin(), busy.end());
    size_t best = 0, best_gap = SIZE_MAX, cursor = 0;
    bool found = false;
    for (const auto& [lo, hi] : busy) {
      const size_t start = round_up(cursor, a);
      if (lo > start && lo - start >= need && lo - cursor < best_gap) {
        best = start;
        best_gap = lo - cursor;
        found = true;
      }
      cursor = std::max(cursor, hi);
    }
    plan.offsets[i] = found ? best : round_up(cursor, a);
    plan.size = std::max(plan.size, plan.offsets[i] + need);
    placed.push_back(i);
  }
  plan.lower_bound = live_peak(requests, align);
  return plan;
}

bool plan_has_conflict(const std::vector<BufferRequest>& requests, const ArenaPlan& plan) {
  for (size_t a = 0; a < requests.size(); ++a)
    for (size_t b = a + 1; b < requests.size(); ++b) {
      if (requests[a].bytes == 0 || requests[b].bytes == 0 || !overlaps(requests[a], requests[b])) continue;
      const size_t a0 = plan.offsets[a], a1 = a0 + requests[a].bytes;
      const size_t b0 = plan.offsets[b], b1 = b0 + requests[b].bytes;
      if (a0 < b1 && b0 < a1) return true;
    }
  return false;
}

}  // namespace tessel
