// Thread counts: "0 = all hardware threads" resolved in one place, and OpenMP counts applied for a scope
// only, so a caller's count survives tessel (support/threads.h).
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <thread>

#include "tessel/support/threads.h"

using namespace tessel;

TEST(Threads, ZeroMeansAllHardwareThreads) {
  const int all = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  EXPECT_EQ(resolve_threads(0), all);
  EXPECT_EQ(resolve_threads(-3), all);
  EXPECT_EQ(resolve_threads(1), 1);
  EXPECT_EQ(resolve_threads(7), 7);  // more than the machine has is the caller's choice
}

TEST(Threads, ScopedCountsNestAndRestore) {
  ScopedOmpThreads caller(3);
  {
    ScopedOmpThreads outer(1);
    EXPECT_EQ(omp_get_max_threads(), 1);
    {
      ScopedOmpThreads inner(2);
      EXPECT_EQ(omp_get_max_threads(), 2);
    }
    EXPECT_EQ(omp_get_max_threads(), 1);
  }
  EXPECT_EQ(omp_get_max_threads(), 3);
}
