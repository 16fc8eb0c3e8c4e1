// The thread team (support/thread_team.h): every chunk of a step runs exactly once, whoever claims it;
// exceptions reach the caller after the step; nested and concurrent steps run inline; OpenMP's thread
// count inside a chunk is 1 and the caller's is restored.
#include "tessel/support/thread_team.h"

#include <gtest/gtest.h>
#include <omp.h>

#include <atomic>
#include <chrono>
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

// A redoable step (run_redoable): every chunk's result lands exactly once, from the caller's direct run
// or a worker's commit, never both; a worker stopped in the middle of its chunk (here: sleeping in
// aside) is taken over and its late result is dropped, and quiesce() returns once it has finished.
struct RedoProbe {
  std::vector<int> out;               // each chunk's value lands here
  std::vector<std::atomic<int>> landed;  // how many times a chunk's value was written in place
  std::vector<int> held;              // per worker: the value it computed aside
  std::atomic<int> stall_chunk{-1};   // the chunk whose aside waits for `release` (a worker stopped mid-chunk)
  std::atomic<bool> release{false}, stalled{false}, timed_out{false};
  std::atomic<int> asides{0}, commits{0}, directs{0};
  int work_us = 0;                    // how long each run of a chunk takes (so that workers get some)
  static void work(int us) {
    const auto until = std::chrono::steady_clock::now() + std::chrono::microseconds(us);
    while (std::chrono::steady_clock::now() < until) {
    }
  }
  explicit RedoProbe(int64_t chunks, int workers) : out(static_cast<size_t>(chunks), -1), landed(static_cast<size_t>(chunks)),
                                                    held(static_cast<size_t>(workers), 0) {}
  static int value(int64_t i) { return static_cast<int>(i) * 7 + 3; }
  static void direct(void* ctx, int64_t i) {
    auto& p = *static_cast<RedoProbe*>(ctx);
    work(p.work_us);
    p.out[static_cast<size_t>(i)] = value(i);
    p.landed[static_cast<size_t>(i)].fetch_add(1);
    p.directs.fetch_add(1);
  }
  static void aside(void* ctx, int64_t i, int w) {
    auto& p = *static_cast<RedoProbe*>(ctx);
    p.asides.fetch_add(1);
    work(p.work_us);
    if (p.stall_chunk.load() == i) {
      p.stalled = true;
      const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
      while (!p.release.load() && !(p.timed_out = std::chrono::steady_clock::now() > until)) std::this_thread::yield();
      p.held[static_cast<size_t>(w)] = -1000;  // a result that must never land
      return;
    }
    p.held[static_cast<size_t>(w)] = value(i);
  }
  static void commit(void* ctx, int64_t i, int w) {
    auto& p = *static_cast<RedoProbe*>(ctx);
    p.out[static_cast<size_t>(i)] = p.held[static_cast<size_t>(w)];
    p.landed[static_cast<size_t>(i)].fetch_add(1);
    p.commits.fetch_add(1);
  }
};

TEST(ThreadTeam, RedoableStepsLandEveryChunkOnce) {
  for (int threads : {2, 4}) {
    ThreadTeam& team = ThreadTeam::shared(threads);
    std::mt19937 rng(threads);
    int commits = 0;
    for (int step = 0; step < 2000; ++step) {
      const int64_t chunks = static_cast<int64_t>(rng() % 24);
      RedoProbe p(chunks, threads - 1);
      p.work_us = static_cast<int>(rng() % 3) * 5;
      team.run_redoable(chunks, {RedoProbe::direct, RedoProbe::aside, RedoProbe::commit, &p});
      team.quiesce();
      for (int64_t i = 0; i < chunks; ++i) {
        ASSERT_EQ(p.landed[static_cast<size_t>(i)].load(), 1) << threads << " threads, step " << step << ", chunk " << i;
        ASSERT_EQ(p.out[static_cast<size_t>(i)], RedoProbe::value(i));
      }
      ASSERT_EQ(p.directs.load() + p.commits.load(), chunks);
      commits += p.commits.load();
    }
    EXPECT_GT(commits, 0) << threads << " threads: no worker committed a chunk";
  }
}

TEST(ThreadTeam, StalledWorkerIsTakenOverAndDropped) {
  ThreadTeam& team = ThreadTeam::shared(2);
  int stalled = 0;
  for (int attempt = 0; attempt < 50 && stalled == 0; ++attempt) {
    const int64_t chunks = 8;
    RedoProbe p(chunks, 1);
    p.work_us = 200;
    // one chunk, if the worker claims it, waits in aside until released after the step has returned:
    // a step that waited for it would only return when the wait times out (20 s)
    const int64_t before = team.taken_over();
    p.stall_chunk = static_cast<int>(attempt % chunks);
    team.run_redoable(chunks, {RedoProbe::direct, RedoProbe::aside, RedoProbe::commit, &p});
    const bool held = p.stalled.load();
    p.release = true;
    team.quiesce();
    EXPECT_FALSE(p.timed_out.load()) << "the step waited for its stalled worker";
    for (int64_t i = 0; i < chunks; ++i) {
      ASSERT_EQ(p.landed[static_cast<size_t>(i)].load(), 1) << "chunk " << i;
      ASSERT_EQ(p.out[static_cast<size_t>(i)], RedoProbe::value(i)) << "chunk " << i;
    }
    if (held) {
      ++stalled;
      EXPECT_GT(team.taken_over(), before);
    }
  }
  EXPECT_GT(stalled, 0) << "the worker never claimed the stalling chunk in 50 steps";
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
