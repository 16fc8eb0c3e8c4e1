// The thread team (support/thread_team.h): every chunk of a step runs exactly once, whoever claims it;
// exceptions reach the caller after the step; nested and concurrent steps run inline; OpenMP's thread
// count inside a chunk is 1 and the caller's is restored.
#include "tessel/support/thread_team.h"

#include <gtest/gtest.h>
#include <omp.h>

#include <atomic>
#include <random>
#include <stdexcept>
#include <thread>
#include <vector>

namespace tessel {
namespace {

TEST(ThreadTeam, EveryChunkOnce) {
  for (int threads : {1, 2, 4}) {
    ThreadTeam& team = ThreadTeam::shared(threads);
    EXPECT_EQ(&team, &ThreadTeam::shared(threads));
    std::mt19937 rng(threads);
    for (int step = 0; step < 3000; ++step) {
      const int64_t chunks = static_cast<int64_t>(rng() % 40);
      std::vector<std::atomic<int>> ran(static_cast<size_t>(chunks));
      team.run(chunks, [&](int64_t i) { ran[static_cast<size_t>(i)].fetch_add(1); });
      for (int64_t i = 0; i < chunks; ++i)
        ASSERT_EQ(ran[static_cast<size_t>(i)].load(), 1) << threads << " threads, step " << step << ", chunk " << i;
    }
  }
}

// Workers take chunks when the caller is slow to: a chunk that waits for another chunk to have
// started can only finish when two threads run at once.
TEST(ThreadTeam, WorkersTakeChunks) {
  ThreadTeam& team = ThreadTeam::shared(2);
  const int64_t before = team.worker_chunks();
  std::atomic<int> started{0};
  team.run(2, [&](int64_t) {
    started.fetch_add(1);
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while (started.load() < 2 && std::chrono::steady_clock::now() < until) std::this_thread::yield();
  });
  EXPECT_EQ(started.load(), 2);
  EXPECT_GT(team.worker_chunks(), before);
}

TEST(ThreadTeam, ExceptionAfterEveryChunk) {
  ThreadTeam& team = ThreadTeam::shared(2);
  std::atomic<int> ran{0};
  EXPECT_THROW(team.run(16, [&](int64_t i) {
    ran.fetch_add(1);
    if (i == 5) throw std::runtime_error("chunk 5");
  }), std::runtime_error);
  EXPECT_EQ(ran.load(), 16);
  ran = 0;
  team.run(16, [&](int64_t) { ran.fetch_add(1); });  // the team is usable after a failed step
  EXPECT_EQ(ran.load(), 16);
}

TEST(ThreadTeam, NestedAndConcurrentStepsRunInline) {
  ThreadTeam& team = ThreadTeam::shared(2);
  std::atomic<int> inner{0};
  team.run(4, [&](int64_t) { team.run(3, [&](int64_t) { inner.fetch_add(1); }); });
  EXPECT_EQ(inner.load(), 12);
  std::atomic<int> total{0};
  auto caller = [&] {
    for (int s = 0; s < 500; ++s) team.run(8, [&](int64_t) { total.fetch_add(1); });
  };
  std::thread other(caller);
  caller();
  other.join();
  EXPECT_EQ(total.load(), 2 * 500 * 8);
}

TEST(ThreadTeam, OneOpenMPThreadInsideChunks) {
  ThreadTeam& team = ThreadTeam::shared(2);
  const int saved = omp_get_max_threads();
  omp_set_num_threads(2);
  std::atomic<int> wrong{0};
  team.run(8, [&](int64_t) {
    if (omp_get_max_threads() != 1) wrong.fetch_add(1);
  });
  EXPECT_EQ(wrong.load(), 0);
  EXPECT_EQ(omp_get_max_threads(), 2);
  omp_set_num_threads(saved);
}

}  // namespace
}  // namespace tessel
