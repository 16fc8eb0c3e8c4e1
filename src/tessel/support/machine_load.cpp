// machine_load (see machine_load.h).
#include "tessel/support/machine_load.h"

#include <fmt/format.h>
#include <sched.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <sstream>
#include <thread>
#include <vector>

#include "tessel/support/strings.h"
#include "tessel/support/threads.h"

namespace tessel {
namespace {

// /proc/stat's procs_running (runnable tasks, the reader included), or -1.
int procs_running() {
  std::ifstream f("/proc/stat");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("procs_running ", 0) == 0) {
      std::istringstream in(line.substr(14));
      int n = -1;
      in >> n;
      return n;
    }
  return -1;
}

int affinity_cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) == 0) return std::max(1, CPU_COUNT(&set));
  return resolve_threads(0);
}

}  // namespace

MachineLoad sample_machine_load(int samples, int gap_ms) {
  MachineLoad m;
  m.cores = affinity_cores();
  std::vector<int> seen;
  for (int i = 0; i < std::max(1, samples); ++i) {
    if (i) std::this_thread::sleep_for(std::chrono::milliseconds(std::max(0, gap_ms)));
    const int n = procs_running();
    if (n >= 1) seen.push_back(n - 1);
  }
  if (seen.empty()) return m;
  std::sort(seen.begin(), seen.end());
  m.samples = static_cast<int>(seen.size());
  m.others = seen.size() % 2 ? seen[seen.size() / 2] : 0.5 * (seen[seen.size() / 2 - 1] + seen[seen.size() / 2]);
  return m;
}

std::string load_warning(const MachineLoad& load, int threads) {
  if (load.samples == 0) return {};
  const int want = std::min(threads > 0 ? threads : load.cores, load.cores);
  const double free = load.cores - load.others;
  if (free >= want) return {};
  return fmt::format("the machine is busy: about {:g} other runnable {} on {} while these figures use {}; they are slower "
                     "than an idle machine's (compare systems in one paired run: bench/paired.py)",
                     load.others, load.others == 1 ? "task" : "tasks", count_text(load.cores, "core"),
                     count_text(want, "thread"));
}

}  // namespace tessel
