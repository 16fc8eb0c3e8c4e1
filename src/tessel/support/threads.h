// threads: what a requested thread count means (the one place "0 = all hardware threads" is decided)
// and applying a count to OpenMP for a scope only, so tessel never leaves a caller's count changed.
#pragma once

namespace tessel {

// The thread count a request means: `requested` when positive; 0 (or less) means all the machine's
// hardware threads, at least 1 when the machine does not say.
int resolve_threads(int requested);

// Sets OpenMP's thread count to `threads` for the life of the guard and then restores the count it
// found. The count is OpenMP's per-thread setting (the calling thread's nthreads-var), so the guard
// belongs on the thread that calls into oneDNN and the generated kernels. oneDNN primitives are
// created for the count they were built under and rebuilt when run under another (dnnl_ops.h), so
// building and running an executable happen under the same guard count. Restoring matters most in
// Python: PyTorch shares libgomp, so this count is also torch.get_num_threads(), and putting it back
// here (omp_set_num_threads, free) spares torch.set_num_threads, which re-creates PyTorch's pools.
class ScopedOmpThreads {
 public:
  explicit ScopedOmpThreads(int threads);
  ~ScopedOmpThreads();
  ScopedOmpThreads(const ScopedOmpThreads&) = delete;
  ScopedOmpThreads& operator=(const ScopedOmpThreads&) = delete;

 private:
  int saved_;
};

}  // namespace tessel
