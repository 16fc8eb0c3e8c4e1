// machine_load: whether other processes are taking the cores a measurement needs (issue 37). A timing
// taken while another process keeps a core busy can be several times an idle machine's (a parallel
// step waits for the thread that shares its core); the tools say so beside their figures instead of
// printing the collapsed numbers as if they were the machine's.
#pragma once

#include <string>

namespace tessel {

struct MachineLoad {
  int cores = 1;          // CPUs this process may run on (its affinity)
  double others = 0;      // runnable tasks other than the sampling thread (median of the samples)
  int samples = 0;        // 0: the kernel does not say (no /proc/stat): nothing is known
};

// Samples /proc/stat's count of runnable tasks `samples` times, `gap_ms` apart, minus the sampling
// thread itself: a snapshot (not the 1-minute load average, which the tool's own last run inflates).
MachineLoad sample_machine_load(int samples = 5, int gap_ms = 10);

// The warning for a measurement with `threads` threads (0: all) under `load`, or "" when the cores it
// needs look free: other runnable tasks leave fewer free cores than it runs threads.
std::string load_warning(const MachineLoad& load, int threads);

}  // namespace tessel
