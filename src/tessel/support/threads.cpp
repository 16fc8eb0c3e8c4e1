// Resolving requested thread counts, and the scoped OpenMP thread-count guard.
#include "tessel/support/threads.h"

#include <omp.h>

#include <algorithm>
#include <thread>

namespace tessel {

int resolve_threads(int requested) {
  if (requested > 0) return requested;
  return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

ScopedOmpThreads::ScopedOmpThreads(int threads) : saved_(omp_get_max_threads()) { omp_set_num_threads(threads); }

ScopedOmpThreads::~ScopedOmpThreads() { omp_set_num_threads(saved_); }

}  // namespace tessel
