// The thread team: chunks claimed through one atomic word (the step's epoch and the next chunk), so
// a worker that wakes after its step has moved on cannot take a chunk of another one.
#include "tessel/support/thread_team.h"

#include <omp.h>

#include <algorithm>
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

// The claim word's bit 31 marks a redoable step (the next chunk stays below 2^31).
constexpr uint64_t kRedoBit = uint64_t{1} << 31;
constexpr uint64_t kNextMask = kRedoBit - 1;
// A redoable step's chunk status: (epoch << 8) | one of these.
enum : uint64_t { kFree = 0, kRunning = 1, kCommitting = 2, kDone = 3, kTaken = 4 };
inline uint64_t status_of(uint32_t e, uint64_t code) { return (static_cast<uint64_t>(e) << 8) | code; }

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
  std::atomic<int64_t> shared_steps{0}, worker_chunks{0}, waited_ns{0}, taken{0};
  // A redoable step: the aside and commit functions, each chunk's status, and the workers still running
  // a chunk the caller took over.
  std::atomic<void (*)(void*, int64_t, int)> aside{nullptr}, commit{nullptr};
  std::array<std::atomic<uint64_t>, ThreadTeam::kMaxRedoChunks> status{};
  std::atomic<int> late{0};
  std::mutex busy;                    // one step at a time; another caller runs its step inline
  std::mutex error_mutex;
  std::exception_ptr error;
  std::vector<std::thread> workers;

  void record(std::exception_ptr e) {
    std::lock_guard<std::mutex> lock(error_mutex);
    if (!error) error = e;
  }

  // Claims and runs chunks of step `e` until none is left; the number run. `worker`: the worker's
  // index, or -1 for the caller (which runs a redoable step's chunks in place).
  int64_t take(uint32_t e, int worker) {
    int64_t ran = 0;
    for (;;) {
      uint64_t w = word.load(std::memory_order_acquire);
      if (static_cast<uint32_t>(w >> 32) != e) break;
      const int64_t i = static_cast<int64_t>(w & kNextMask);
      if (i >= chunks.load(std::memory_order_relaxed)) break;
      if (!word.compare_exchange_weak(w, w + 1, std::memory_order_acq_rel, std::memory_order_relaxed)) continue;
      if ((w & kRedoBit) && worker >= 0) {
        // The step's functions first, then the status: the status is still (e, free) only while step e
        // is running and nobody took this chunk, so the functions read are step e's.
        auto* as = aside.load(std::memory_order_acquire);
        auto* cm = commit.load(std::memory_order_acquire);
        void* c = ctx.load(std::memory_order_acquire);
        uint64_t st = status_of(e, kFree);
        if (!status[static_cast<size_t>(i)].compare_exchange_strong(st, status_of(e, kRunning), std::memory_order_acq_rel))
          continue;  // taken over before it began
        in_chunk = true;
        std::exception_ptr failed;
        try {
          as(c, i, worker);
        } catch (...) {
          failed = std::current_exception();
        }
        st = status_of(e, kRunning);
        if (status[static_cast<size_t>(i)].compare_exchange_strong(st, status_of(e, kCommitting), std::memory_order_acq_rel)) {
          if (failed) record(failed);  // (a chunk the caller took over drops its error with its result)
          try {
            cm(c, i, worker);
          } catch (...) {
            record(std::current_exception());
          }
          status[static_cast<size_t>(i)].store(status_of(e, kDone), std::memory_order_release);
          in_chunk = false;
          ++ran;
          done.fetch_add(1, std::memory_order_acq_rel);
        } else {
          in_chunk = false;  // the caller ran it in place and counted it: this result is dropped
          late.fetch_sub(1, std::memory_order_acq_rel);
        }
        continue;
      }
      // The step cannot end before this chunk is counted done: its call and context stay valid.
      auto* fn = call.load(std::memory_order_relaxed);
      void* c = ctx.load(std::memory_order_relaxed);
      in_chunk = true;
      try {
        fn(c, i);
      } catch (...) {
        record(std::current_exception());
      }
      in_chunk = false;
      if (w & kRedoBit) status[static_cast<size_t>(i)].store(status_of(e, kDone), std::memory_order_release);
      ++ran;
      done.fetch_add(1, std::memory_order_acq_rel);
    }
    return ran;
  }

  void worker(int index) {
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
      const int64_t ran = take(e, index);
      if (ran) worker_chunks.fetch_add(ran, std::memory_order_relaxed);
    }
  }
};

ThreadTeam::ThreadTeam(int threads) : s_(new State), size_(threads) {
  for (int t = 1; t < threads; ++t) {
    try {
      s_->workers.emplace_back([st = s_, t] { st->worker(t - 1); });
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
  const int64_t mine = s.take(e, -1);
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

void ThreadTeam::run_redoable(int64_t chunks, const RedoStep& step) {
  if (chunks <= 0) return;
  State& s = *s_;
  std::unique_lock<std::mutex> lock(s.busy, std::defer_lock);
  if (chunks == 1 || size_ <= 1 || in_chunk || chunks > kMaxRedoChunks || !lock.try_lock()) {
    run(chunks, [&](int64_t i) { step.direct(step.ctx, i); });
    return;
  }
  const uint32_t e = s.epoch.load(std::memory_order_relaxed) + 1;
  for (int64_t i = 0; i < chunks; ++i) s.status[static_cast<size_t>(i)].store(status_of(e, kFree), std::memory_order_relaxed);
  s.call.store(step.direct, std::memory_order_relaxed);
  s.aside.store(step.aside, std::memory_order_relaxed);
  s.commit.store(step.commit, std::memory_order_relaxed);
  s.ctx.store(step.ctx, std::memory_order_relaxed);
  s.chunks.store(chunks, std::memory_order_relaxed);
  s.done.store(0, std::memory_order_relaxed);
  s.word.store((static_cast<uint64_t>(e) << 32) | kRedoBit, std::memory_order_release);
  s.epoch.store(e, std::memory_order_seq_cst);
  if (s.sleepers.load(std::memory_order_seq_cst) > 0) s.epoch.notify_all();
  const int saved = omp_get_max_threads();
  omp_set_num_threads(1);
  // The caller's own chunks, each timed: the quickest is what a chunk costs a running thread (an average
  // would count the times the scheduler stopped the caller itself).
  using Clock = std::chrono::steady_clock;
  int64_t mine = 0;
  Clock::duration quickest = Clock::duration::max();
  for (;;) {
    uint64_t w = s.word.load(std::memory_order_acquire);
    const int64_t i = static_cast<int64_t>(w & kNextMask);
    if (i >= chunks) break;
    if (!s.word.compare_exchange_weak(w, w + 1, std::memory_order_acq_rel, std::memory_order_relaxed)) continue;
    const auto c0 = Clock::now();
    in_chunk = true;
    try {
      step.direct(step.ctx, i);
    } catch (...) {
      s.record(std::current_exception());
    }
    in_chunk = false;
    quickest = std::min(quickest, Clock::now() - c0);
    s.status[static_cast<size_t>(i)].store(status_of(e, kDone), std::memory_order_release);
    ++mine;
    s.done.fetch_add(1, std::memory_order_acq_rel);
  }
  const auto w0 = Clock::now();
  // A worker's chunk is taken over once the caller has waited twice what its quickest chunk took (at
  // least 20 us): a worker that is running finishes first, one the scheduler stopped does not.
  const auto patience = mine > 0 ? std::max<Clock::duration>(2 * quickest, std::chrono::microseconds(20))
                                 : Clock::duration(std::chrono::microseconds(200));
  for (int k = 0; s.done.load(std::memory_order_acquire) < chunks; ++k) {
    cpu_relax();
    if ((k & 63) != 63 || Clock::now() - w0 < patience) continue;
    for (int64_t i = 0; i < chunks; ++i) {
      auto& st = s.status[static_cast<size_t>(i)];
      for (uint64_t code : {uint64_t{kFree}, uint64_t{kRunning}}) {
        uint64_t want = status_of(e, code);
        if (!st.compare_exchange_strong(want, status_of(e, kTaken), std::memory_order_acq_rel)) continue;
        if (code == kRunning) s.late.fetch_add(1, std::memory_order_acq_rel);
        s.taken.fetch_add(1, std::memory_order_relaxed);
        in_chunk = true;
        try {
          step.direct(step.ctx, i);
        } catch (...) {
          s.record(std::current_exception());
        }
        in_chunk = false;
        s.done.fetch_add(1, std::memory_order_acq_rel);
        break;
      }
    }
  }
  omp_set_num_threads(saved);
  if (mine < chunks) s.shared_steps.fetch_add(1, std::memory_order_relaxed);
  s.waited_ns.fetch_add(std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - w0).count(),
                        std::memory_order_relaxed);
  std::exception_ptr error;
  {
    std::lock_guard<std::mutex> elock(s.error_mutex);
    std::swap(error, s.error);
  }
  if (error) std::rethrow_exception(error);
}

void ThreadTeam::quiesce() {
  for (int k = 0; s_->late.load(std::memory_order_acquire) > 0; ++k) {
    if (k < 4096) cpu_relax();
    else std::this_thread::yield();
  }
}

int64_t ThreadTeam::taken_over() const { return s_->taken.load(); }

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
