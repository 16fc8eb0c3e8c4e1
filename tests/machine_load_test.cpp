// The busy-machine warning of the measuring tools (support/machine_load.h, issue 37): it fires when other
// runnable tasks leave fewer free cores than a measurement's threads, and not otherwise.
#include <gtest/gtest.h>

#include <atomic>
#include <thread>
#include <vector>

#include "tessel/support/machine_load.h"

using namespace tessel;

TEST(MachineLoad, WarningNeedsTheThreadsCoresToBeTaken) {
  MachineLoad m;
  m.cores = 2, m.samples = 5;
  m.others = 0;
  EXPECT_EQ(load_warning(m, 2), "");
  m.others = 1;
  const std::string w = load_warning(m, 2);
  EXPECT_NE(w.find("about 1 other runnable task on 2 cores while these figures use 2 threads"), std::string::npos) << w;
  EXPECT_EQ(load_warning(m, 1), "") << "one thread on a machine with a free core";
  EXPECT_NE(load_warning(m, 0), "") << "0: all the cores";
  m.cores = 16, m.others = 3;
  EXPECT_EQ(load_warning(m, 8), "");
  EXPECT_NE(load_warning(m, 0), "");
  m.samples = 0;  // nothing known: no warning
  EXPECT_EQ(load_warning(m, 0), "");
}

// Live: busy threads as many as the cores make every sample see them (they are runnable all the time).
TEST(MachineLoad, BusyThreadsAreSeen) {
  const MachineLoad idle = sample_machine_load(1, 0);
  if (idle.samples == 0) GTEST_SKIP() << "no /proc/stat here";
  std::atomic<bool> stop{false};
  std::vector<std::thread> spin;
  for (int i = 0; i < idle.cores; ++i)
    spin.emplace_back([&] {
      volatile unsigned x = 0;
      while (!stop.load(std::memory_order_relaxed)) x = x + 1;
    });
  const MachineLoad busy = sample_machine_load(5, 5);
  stop = true;
  for (auto& t : spin) t.join();
  EXPECT_GE(busy.others, idle.cores) << "spinning threads: " << idle.cores;
  EXPECT_NE(load_warning(busy, 0), "");
}
