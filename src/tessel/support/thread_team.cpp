// The thread team: chunks claimed through one atomic word (the step's epoch and the next chunk), so
// a worker that wakes after its step has moved on cannot take a chunk of another one.
#include "tessel/support/thread_team.h"

#include <omp.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace tessel {

namespace {

thread_local bool in_chunk = false;  // this thread is running a chunk (a nested run goes inline)

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

// How long a worker spins for the next step before sleeping: steps of one call follow each other
// within microseconds; between calls (and on a loaded machine) the worker gives its core back.
constexpr auto kSpin = std::chrono::microseconds(50);

}  // namespace

struct ThreadTeam::State {
  // (epoch << 32) | next chunk to claim. A claim is a compare-exchange of this word: it succeeds only
  // while the step it read is the current one.
  std::atomic<uint64_t> word{0};
  std::atomic<void (*)(void*, int64_t)> call{nullptr};
  std::atomic<void*> ctx{nullptr};
  std::atomic<int64_t> chunks{0};
  std::atomic<int64_t> done{0};
  std::atomic<uint32_t> epoch{0};     // what sleeping workers wait on
  std::atomic<int> sleepers{0};
  std::atomic<int64_t> shared_steps{0}, worker_chunks{0}, waited_ns{0};
  std::mutex busy;                    // one step at a time; another caller runs its step inline
  std::mutex error_mutex;
  std::exception_ptr error;
  std::vector<std::thread> workers;

  // Claims and runs chunks of step `e` until none is left; the number run.
  int64_t take(uint32_t e) {
    int64_t ran = 0;
    for (;;) {
      uint64_t w = word.load(std::memory_order_acquire);
      if (static_cast<uint32_t>(w >> 32) != e) break;
      const int64_t i = static_cast<int64_t>(w & 0xffffffffu);
      if (i >= chunks.load(std::memory_order_relaxed)) break;
      if (!word.compare_exchange_weak(w, w + 1, std::memory_order_acq_rel, std::memory_order_relaxed)) continue;
      // The step cannot end before this chunk is counted done: its call and context stay valid.
      auto* fn = call.load(std::memory_order_relaxed);
      void* c = ctx.load(std::memory_order_relaxed);
      in_chunk = true;
      try {
        fn(c, i);
      } catch (...) {
        std::lock_guard<std::mutex> lock(error_mutex);
        if (!error) error = std::current_exception();
      }
      in_chunk = false;
      ++ran;
      done.fetch_add(1, std::memory_order_acq_rel);
    }
    return ran;
  }

  void worker() {
    omp_set_num_threads(1);  // a oneDNN call inside a chunk stays on this thread
    // Epoch 0 is the team's state before its first step: a worker that starts after that step was
    // published still takes part in it (starting from the epoch it found would skip it).
    uint32_t seen = 0;
    for (;;) {
      uint32_t e = epoch.load(std::memory_order_acquire);
      if (e == seen) {
        const auto until = std::chrono::steady_clock::now() + kSpin;
        for (int k = 0; e == seen; ++k) {
          cpu_relax();
          e = epoch.load(std::memory_order_acquire);
          if ((k & 63) == 63 && std::chrono::steady_clock::now() > until) break;
        }
        if (e == seen) {
          sleepers.fetch_add(1, std::memory_order_seq_cst);
          while (epoch.load(std::memory_order_seq_cst) == seen) epoch.wait(seen, std::memory_order_seq_cst);
          sleepers.fetch_sub(1, std::memory_order_seq_cst);
          e = epoch.load(std::memory_order_acquire);
        }
      }
      seen = e;
      const int64_t ran = take(e);
      if (ran) worker_chunks.fetch_add(ran, std::memory_order_relaxed);
    }
  }
};

ThreadTeam::ThreadTeam(int threads) : s_(new State), size_(threads) {
  for (int t = 1; t < threads; ++t) {
    try {
      s_->workers.emplace_back([st = s_] { st->worker(); });
      s_->workers.back().detach();
    } catch (const std::system_error&) {
      break;  // no more threads to be had: the team is smaller (the caller takes what is left)
    }
  }
  size_ = 1 + static_cast<int>(s_->workers.size());
}

ThreadTeam& ThreadTeam::shared(int threads) {
  constexpr int kMax = 256;
  threads = threads < 1 ? 1 : threads > kMax ? kMax : threads;
  static std::array<std::atomic<ThreadTeam*>, kMax + 1> teams{};
  static std::mutex made;
  ThreadTeam* t = teams[static_cast<size_t>(threads)].load(std::memory_order_acquire);
  if (t) return *t;
  std::lock_guard<std::mutex> lock(made);
  t = teams[static_cast<size_t>(threads)].load(std::memory_order_relaxed);
  if (!t) {
    t = new ThreadTeam(threads);  // never deleted: workers may sleep in it until the process ends
    teams[static_cast<size_t>(threads)].store(t, std::memory_order_release);
  }
  return *t;
}

void ThreadTeam::run_chunks(int64_t chunks, void (*call)(void*, int64_t), void* ctx) {
  if (chunks <= 0) return;
  State& s = *s_;
  std::unique_lock<std::mutex> lock(s.busy, std::defer_lock);
  if (chunks == 1 || size_ <= 1 || in_chunk || chunks > 0xffffffffLL || !lock.try_lock()) {
    const int saved = omp_get_max_threads();
    omp_set_num_threads(1);
    const bool outer = !in_chunk;
    in_chunk = true;
    try {
      for (int64_t i = 0; i < chunks; ++i) call(ctx, i);
    } catch (...) {
      in_chunk = !outer;
      omp_set_num_threads(saved);
      throw;
    }
    in_chunk = !outer;
    omp_set_num_threads(saved);
    return;
  }
  const uint32_t e = s.epoch.load(std::memory_order_relaxed) + 1;
  s.call.store(call, std::memory_order_relaxed);
  s.ctx.store(ctx, std::memory_order_relaxed);
  s.chunks.store(chunks, std::memory_order_relaxed);
  s.done.store(0, std::memory_order_relaxed);
  s.word.store(static_cast<uint64_t>(e) << 32, std::memory_order_release);
  s.epoch.store(e, std::memory_order_seq_cst);
  if (s.sleepers.load(std::memory_order_seq_cst) > 0) s.epoch.notify_all();
  const int saved = omp_get_max_threads();
  omp_set_num_threads(1);
  const int64_t mine = s.take(e);
  omp_set_num_threads(saved);
  // Only chunks a worker claimed can be outstanding here: wait for those, never for a worker to arrive.
  const auto w0 = std::chrono::steady_clock::now();
  for (int k = 0; s.done.load(std::memory_order_acquire) < chunks; ++k) {
    if (k < 4096) cpu_relax();
    else std::this_thread::yield();
  }
  if (mine < chunks) s.shared_steps.fetch_add(1, std::memory_order_relaxed);
  s.waited_ns.fetch_add(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - w0).count(),
      std::memory_order_relaxed);
  std::exception_ptr error;
  {
    std::lock_guard<std::mutex> elock(s.error_mutex);
    std::swap(error, s.error);
  }
  if (error) std::rethrow_exception(error);
}

int64_t ThreadTeam::shared_steps() const { return s_->shared_steps.load(); }
int64_t ThreadTeam::worker_chunks() const { return s_->worker_chunks.load(); }
double ThreadTeam::waited_seconds() const { return static_cast<double>(s_->waited_ns.load()) * 1e-9; }

bool thread_team_enabled() {
  static const bool on = [] {
    const char* v = std::getenv("TESSEL_TEAM");
    return v && std::strcmp(v, "1") == 0;
  }();
  return on;
}

}  // namespace tessel
