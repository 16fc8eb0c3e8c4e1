// The thread team the compiled CPU backend runs its parallel steps on (docs/runtime/threads.md).
//
// A step is cut into chunks that the calling thread and the team's workers claim one at a time; the
// call returns when every chunk has run. It never waits for a worker that has not started: on a
// machine where another process holds a core, a worker that the scheduler has not run yet finds the
// chunks taken when it wakes, where a parallel region with a fixed share per thread (OpenMP's, and
// oneDNN's under it) waits a whole time slice for that thread at every step. Workers spin a short while
// after a step (the next one usually follows within microseconds) and then sleep.
#pragma once

#include <cstdint>
#include <type_traits>
#include <utility>

namespace tessel {

class ThreadTeam {
 public:
  // The process's team of `threads` threads, the caller counted as one (workers are started on first
  // use and live until the process ends). threads is clamped to [1, 256].
  static ThreadTeam& shared(int threads);

  int size() const { return size_; }

  // Runs body(i) for every i in [0, chunks), on the calling thread and the workers, and returns when
  // all have run. Inside, OpenMP's thread count of the running thread is 1 (a oneDNN primitive run in
  // a chunk stays on its thread). Run inline, chunk after chunk, when the team has one thread, when
  // another thread is running a step on this team, or when called from inside a chunk. The first
  // exception a chunk throws is rethrown here once every chunk has finished.
  template <typename F>
  void run(int64_t chunks, F&& body) {
    run_chunks(chunks, [](void* f, int64_t i) { (*static_cast<std::remove_reference_t<F>*>(f))(i); },
               const_cast<void*>(static_cast<const void*>(&body)));
  }

  // Since the process started: steps where more than one thread took chunks, chunks the workers
  // took, and the seconds callers waited for chunks a worker had claimed (on a loaded machine, a
  // worker descheduled while it holds one).
  int64_t shared_steps() const;
  int64_t worker_chunks() const;
  double waited_seconds() const;

  ThreadTeam(const ThreadTeam&) = delete;
  ThreadTeam& operator=(const ThreadTeam&) = delete;

 private:
  explicit ThreadTeam(int threads);
  ~ThreadTeam() = delete;  // lives until the process ends
  void run_chunks(int64_t chunks, void (*call)(void*, int64_t), void* ctx);
  struct State;
  State* s_;
  int size_;
};

// Whether the compiled backend runs its parallel steps on the team: only with TESSEL_TEAM=1 for now
// (an experiment, docs/runtime/threads.md: on this 2-core machine it is not yet faster under load, and
// its matmul parts are slower when idle); by default OpenMP parallel regions with a fixed share per
// thread, and oneDNN's own threading.
bool thread_team_enabled();

}  // namespace tessel
