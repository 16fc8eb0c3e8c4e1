// The event-driven engine against schedules worked out by hand on a toy machine with round numbers,
// plus invariants on random graphs (fixed seed) and the trace's shape.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <chrono>
#include <limits>
#include <random>

#include "limits_util.h"
#include "tessel/support/error.h"
#include "tessel/targets/dataflow/cost.h"
#include "tessel/targets/dataflow/sim_engine.h"

using namespace tessel;
using namespace tessel::dataflow;

namespace {

// 4 cores at 1 GHz; DRAM 100 B/cycle each way, no latency, half the capacity when reads and writes
// mix; a ring of 10 B/cycle links with 5 cycles per hop and a separate reduce ring at 1 cycle per
// element per hop.
HwSpec toy(int dma_engines = 2) {
  HwSpec hw = load_preset("spyre");
  hw.name = "toy";
  hw.cores = 4;
  hw.clock_ghz = 1;
  hw.dma_engines = dma_engines;
  hw.dram.read_gbps = hw.dram.write_gbps = 100;
  hw.dram.latency_cycles = 0;
  hw.dram.mixed_efficiency = 0.5;
  hw.interconnect.bytes_per_cycle = 10;
  hw.interconnect.hop_latency_cycles = 5;
  hw.interconnect.reduce_cycles_per_element_hop = 1;
  hw.overlap_factor = 1;
  return hw;
}

// Every engine's time adds up to the makespan.
void expect_lanes_add_up(const SimResult& r) {
  for (const LaneStats& s : r.lanes) EXPECT_NEAR(s.total(), r.cycles, 1e-6 * std::max(1.0, r.cycles));
}

}  // namespace

TEST(SimEngine, TwoConcurrentLoadsTakeTwiceAsLong) {
  const HwSpec hw = toy();
  TaskGraph alone;
  alone.add(load_task(0, 1000));
  EXPECT_DOUBLE_EQ(simulate(alone, hw).cycles, 10);
  TaskGraph g;
  const TaskId a = g.add(load_task(0, 1000));
  const TaskId b = g.add(load_task(1, 1000));
  SimResult r = simulate(g, hw);
  EXPECT_DOUBLE_EQ(r.finish[size_t(a)], 20);
  EXPECT_DOUBLE_EQ(r.finish[size_t(b)], 20);
  EXPECT_EQ(r.dram_read_bytes, 2000);
  EXPECT_DOUBLE_EQ(r.dram_busy_cycles, 20);
  expect_lanes_add_up(r);
}

TEST(SimEngine, SharesAreRecomputedWhenTransfersJoinAndLeave) {
  const HwSpec hw = toy();
  TaskGraph g;
  // A (1000 B) alone for 5 cycles: 500 B. Then B (300 B) joins: 50 B/cycle each, B done at 5 + 6 = 11;
  // A has 800 B by then and the last 200 B alone at 100 B/cycle: done at 13.
  const TaskId a = g.add(load_task(0, 1000));
  const TaskId v = g.add(vector_task(1, 5));
  const TaskId b = g.add(load_task(1, 300), {v});
  SimResult r = simulate(g, hw);
  EXPECT_NEAR(r.finish[size_t(b)], 11, 1e-9);
  EXPECT_NEAR(r.finish[size_t(a)], 13, 1e-9);
  EXPECT_NEAR(r.cycles, 13, 1e-9);
  expect_lanes_add_up(r);
}

TEST(SimEngine, MixedReadsAndWritesLoseCapacity) {
  const HwSpec hw = toy();
  TaskGraph g;
  g.add(load_task(0, 1000));
  g.add(store_task(1, 1000));
  // Capacity 0.5 x 100 = 50 B/cycle shared by two: 25 each, 40 cycles.
  SimResult r = simulate(g, hw);
  EXPECT_NEAR(r.cycles, 40, 1e-9);
  EXPECT_EQ(r.dram_write_bytes, 1000);
}

TEST(SimEngine, DependencyChainSums) {
  HwSpec hw = toy();
  hw.dram.latency_cycles = 4;
  TaskGraph g;
  const TaskId l = g.add(load_task(0, 500));              // 4 + 5
  const TaskId m1 = g.add(matmul_task(0, 10), {l});       // 9 .. 19
  const TaskId v = g.add(vector_task(0, 7), {m1});        // 19 .. 26
  const TaskId m2 = g.add(matmul_task(0, 3), {v});        // 26 .. 29
  const TaskId s = g.add(store_task(0, 200), {m2});       // 29 + 4 + 2
  SimResult r = simulate(g, hw);
  EXPECT_DOUBLE_EQ(r.finish[size_t(l)], 9);
  EXPECT_DOUBLE_EQ(r.start[size_t(v)], 19);
  EXPECT_DOUBLE_EQ(r.finish[size_t(s)], 35);
  EXPECT_DOUBLE_EQ(r.cycles, 35);
  // The matrix engine: waited 9 on the load, busy 10, waited 7 on the vector op, busy 3, idle 6.
  const LaneStats& mx = r.lane(0, int(Lane::matrix));
  EXPECT_DOUBLE_EQ(mx.wait_dma, 9);
  EXPECT_DOUBLE_EQ(mx.busy, 13);
  EXPECT_DOUBLE_EQ(mx.wait_compute, 7);
  EXPECT_DOUBLE_EQ(mx.idle, 6);
  expect_lanes_add_up(r);
  // The analytical mode on a chain is its critical path: the same 35.
  Estimate e = estimate(g, hw);
  EXPECT_DOUBLE_EQ(e.critical_path_cycles, 35);
  EXPECT_DOUBLE_EQ(e.cycles, 35);
}

TEST(SimEngine, DoubleBufferingOverlapsLoadsWithCompute) {
  const HwSpec hw = toy(1);
  // Four 1000-byte loads (10 cycles each) and four 15-cycle matmuls; two buffers, so load i + 2
  // waits for matmul i. Serial would be 4 x 25 = 100; overlapped it is 10 + 4 x 15 = 70.
  TaskGraph g;
  std::vector<TaskId> loads, mms;
  for (int i = 0; i < 4; ++i) {
    std::vector<TaskId> deps;
    if (i >= 2) deps.push_back(mms[size_t(i - 2)]);
    loads.push_back(g.add(load_task(0, 1000), deps));
    mms.push_back(g.add(matmul_task(0, 15), {loads.back()}));
  }
  SimResult r = simulate(g, hw);
  EXPECT_DOUBLE_EQ(r.cycles, 70);
  EXPECT_DOUBLE_EQ(r.start[size_t(loads[2])], 25);  // waits for matmul 0 to free its buffer
  const LaneStats& mx = r.lane(0, int(Lane::matrix));
  EXPECT_DOUBLE_EQ(mx.busy, 60);
  EXPECT_DOUBLE_EQ(mx.wait_dma, 10);
  EXPECT_DOUBLE_EQ(mx.idle, 0);
  const LaneStats& dma = r.lane(0, int(Lane::dma0));
  EXPECT_DOUBLE_EQ(dma.busy, 40);
  EXPECT_DOUBLE_EQ(dma.wait_compute, 10);  // 20..25 and 35..40
  EXPECT_DOUBLE_EQ(dma.idle, 20);
  expect_lanes_add_up(r);
  EXPECT_NEAR(r.core_busy_fraction(0), 60.0 / 70, 1e-12);
  // Analytical: compute 60, memory 40 (DMA and DRAM), overlap factor 1: max = 60; the critical path
  // load 0 -> matmul 0 -> load 2 -> matmul 2 is 50.
  Estimate e = estimate(g, hw);
  EXPECT_DOUBLE_EQ(e.compute_cycles, 60);
  EXPECT_DOUBLE_EQ(e.memory_cycles, 40);
  EXPECT_DOUBLE_EQ(e.critical_path_cycles, 50);
  EXPECT_DOUBLE_EQ(e.cycles, 60);
}

TEST(SimEngine, EnginesRunInSubmissionOrder) {
  const HwSpec hw = toy();
  TaskGraph g;
  const TaskId l = g.add(load_task(0, 1000));           // 0 .. 10
  const TaskId late = g.add(matmul_task(0, 5), {l});    // first in the matrix queue: 10 .. 15
  const TaskId free = g.add(matmul_task(0, 5));         // ready at 0 but queued behind: 15 .. 20
  SimResult r = simulate(g, hw);
  EXPECT_DOUBLE_EQ(r.start[size_t(late)], 10);
  EXPECT_DOUBLE_EQ(r.start[size_t(free)], 15);
  EXPECT_DOUBLE_EQ(r.lane(0, int(Lane::matrix)).wait_dma, 10);
}

TEST(SimEngine, SharedLinkSerialisesTransfers) {
  const HwSpec hw = toy();
  TaskGraph g;
  // 0 -> 2 crosses links 0->1 and 1->2 (a tie on a 4-ring goes clockwise): 2 x 5 + 100 / 10 = 20.
  // 1 -> 2 needs link 1->2 too: it waits until 20, then 5 + 10 = 15 more.
  const TaskId a = g.add(transfer_task(0, 2, 100));
  const TaskId b = g.add(transfer_task(1, 2, 100));
  SimResult r = simulate(g, hw);
  EXPECT_DOUBLE_EQ(r.finish[size_t(a)], 20);
  EXPECT_DOUBLE_EQ(r.start[size_t(b)], 20);
  EXPECT_DOUBLE_EQ(r.finish[size_t(b)], 35);
  EXPECT_DOUBLE_EQ(r.lane(1, int(Lane::dma0)).wait_interconnect, 20);
  EXPECT_EQ(r.interconnect_bytes, 200);
  EXPECT_EQ(r.interconnect_link_bytes, 300);
  expect_lanes_add_up(r);
  // Disjoint paths run together: 0 -> 1 and 2 -> 3, 15 cycles each.
  TaskGraph d;
  d.add(transfer_task(0, 1, 100));
  d.add(transfer_task(2, 3, 100));
  EXPECT_DOUBLE_EQ(simulate(d, hw).cycles, 15);
  // Opposite directions of one link are separate links: 0 -> 1 and 1 -> 0 together.
  TaskGraph o;
  o.add(transfer_task(0, 1, 100));
  o.add(transfer_task(1, 0, 100));
  EXPECT_DOUBLE_EQ(simulate(o, hw).cycles, 15);
}

TEST(SimEngine, ReduceUsesTheSeparateRing) {
  const HwSpec hw = toy();
  TaskGraph g;
  // 100 partial sums one hop: 5 + 100 x 1 = 105 on the reduce ring; a data-ring transfer on the same
  // pair of cores is not delayed by it (15).
  const TaskId red = g.add(reduce_task(0, 1, 100, 2));
  const TaskId tr = g.add(transfer_task(0, 1, 100));
  SimResult r = simulate(g, hw);
  EXPECT_DOUBLE_EQ(r.finish[size_t(red)], 105);
  EXPECT_DOUBLE_EQ(r.finish[size_t(tr)], 15);
  EXPECT_EQ(r.lane_of[size_t(red)], lanes_per_core(hw) - 1);
  // A K-split chain over 4 cores: 3 steps in sequence = reduce_cycles(100, 4).
  TaskGraph chain;
  TaskId prev = chain.add(reduce_task(0, 1, 100, 2));
  prev = chain.add(reduce_task(1, 2, 100, 2), {prev});
  chain.add(reduce_task(2, 3, 100, 2), {prev});
  EXPECT_DOUBLE_EQ(simulate(chain, hw).cycles, 3 * 105);
  EXPECT_DOUBLE_EQ(reduce_cycles(hw, 100, 4, 2), 3 * 105);
}

TEST(SimEngine, NoInterconnectGoesThroughDram) {
  HwSpec hw = toy();
  hw.interconnect.topology = Topology::none;
  hw.interconnect.reduce_path = ReducePath::dram;
  hw.dram.mixed_efficiency = 1;
  TaskGraph g;
  // Stored then loaded: 2 x 1000 B at 100 B/cycle = 20 cycles, counted both ways.
  g.add(transfer_task(0, 1, 1000));
  SimResult r = simulate(g, hw);
  EXPECT_DOUBLE_EQ(r.cycles, 20);
  EXPECT_EQ(r.dram_read_bytes, 1000);
  EXPECT_EQ(r.dram_write_bytes, 1000);
  EXPECT_EQ(r.interconnect_bytes, 0);
  EXPECT_DOUBLE_EQ(transfer_cycles(hw, 1000, hops(hw, 0, 1)), 20);
}

TEST(SimEngine, BarriersSynchroniseCores) {
  const HwSpec hw = toy();
  TaskGraph g;
  const TaskId a = g.add(matmul_task(0, 30));
  const TaskId b = g.add(matmul_task(1, 10));
  const TaskId bar = g.add(barrier_task(7), {a, b});  // done at 37
  const TaskId c = g.add(vector_task(1, 3), {bar});
  SimResult r = simulate(g, hw);
  EXPECT_DOUBLE_EQ(r.finish[size_t(bar)], 37);
  EXPECT_DOUBLE_EQ(r.start[size_t(c)], 37);
  EXPECT_DOUBLE_EQ(r.cycles, 40);
  EXPECT_DOUBLE_EQ(r.lane(1, int(Lane::vector)).wait_dependency, 37);
  expect_lanes_add_up(r);
}

TEST(SimEngine, BadTasksAreErrorsNamingTheTask) {
  const HwSpec hw = toy();
  auto message = [&](const Task& t) {
    TaskGraph g;
    g.add(matmul_task(0, 1));
    g.add(t);
    try {
      simulate(g, hw);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_EQ(message(matmul_task(4, 1)), "[sim] task 1 'matmul' (matmul): core 4 is out of range (the hardware has 4 cores)");
  EXPECT_EQ(message(transfer_task(2, 2, 10)), "[sim] task 1 'transfer' (transfer): sends to its own core 2");
  EXPECT_EQ(message(matmul_task(0, -1)), "[sim] task 1 'matmul' (matmul): cycles must be >= 0 (got -1)");
  TaskGraph g;
  EXPECT_THROW(g.add(matmul_task(0, 1), {0}), Error);  // a dep on itself / a later task
}

TEST(SimEngine, TraceIsChromeJson) {
  const HwSpec hw = toy();
  TaskGraph g;
  const int32_t lbl = g.intern("load \"A\" tile 0");
  Task ld = load_task(0, 1000, 3);
  ld.label = lbl;
  const TaskId l = g.add(ld);
  const TaskId m = g.add(matmul_task(0, 12, 3), {l});
  g.add(barrier_task(0), {m});  // zero-length barriers are not drawn
  g.add(store_task(2, 500), {m});
  SimOptions o;
  o.record_dram_samples = true;
  SimResult r = simulate(g, hw, o);
  auto j = nlohmann::json::parse(chrome_trace_json(g, hw, r));
  int x = 0, counters = 0;
  std::set<std::string> processes;
  for (const auto& e : j.at("traceEvents")) {
    const std::string ph = e.at("ph");
    if (ph == "X") {
      ++x;
      if (e.at("args").at("task") == 0) {
        EXPECT_EQ(e.at("name"), "load \"A\" tile 0");
        EXPECT_EQ(e.at("cat"), "dma_load");
        EXPECT_EQ(e.at("pid"), 0);
        EXPECT_EQ(e.at("tid"), int(Lane::dma0));
        EXPECT_DOUBLE_EQ(e.at("ts").get<double>(), 0);
        EXPECT_DOUBLE_EQ(e.at("dur").get<double>(), 0.010);  // 10 cycles at 1 GHz, in us
        EXPECT_EQ(e.at("args").at("kernel"), 3);
      }
      if (e.at("args").at("task") == 1) {
        EXPECT_DOUBLE_EQ(e.at("ts").get<double>(), 0.010);
        EXPECT_EQ(e.at("tid"), int(Lane::matrix));
      }
    } else if (ph == "C") {
      ++counters;
    } else if (ph == "M" && e.at("name") == "process_name") {
      processes.insert(e.at("args").at("name").get<std::string>());
    }
  }
  EXPECT_EQ(x, 3);
  EXPECT_EQ(processes, (std::set<std::string>{"core 0", "core 2", "DRAM"}));
  // DRAM: reading 100 B/cycle from 0, idle from 10 to 22, writing from 22 to 27, idle after.
  EXPECT_EQ(counters, 4);
}

// Random graphs on the presets (fixed seed): never faster than the roofline or the critical path,
// every engine's time adds up, bytes are conserved.
TEST(SimEngine, RandomGraphsRespectBounds) {
  for (const std::string name : {"spyre", "tpu-v4", "tpu-v5e"}) {
    const HwSpec hw = load_preset(name);
    const DType t = hw.matrix.dtype_rate.begin()->first;
    std::mt19937 rng(1234);
    for (int trial = 0; trial < 20; ++trial) {
      TaskGraph g;
      double flops = 0;
      int64_t loads = 0, stores = 0;
      const int n = 50 + int(rng() % 400);
      for (int i = 0; i < n; ++i) {
        std::vector<TaskId> deps;
        for (int k = 0; k < 3 && i > 0; ++k)
          if (rng() % 2) deps.push_back(TaskId(rng() % uint32_t(i)));
        std::sort(deps.begin(), deps.end());
        deps.erase(std::unique(deps.begin(), deps.end()), deps.end());
        const int core = int(rng() % uint32_t(hw.cores));
        const int peer = int((uint32_t(core) + 1 + rng() % uint32_t(std::max<int64_t>(1, hw.cores - 1))) % uint32_t(hw.cores));
        switch (rng() % 7) {
          case 0:
          case 1: {
            const int64_t M = 1 + rng() % 300, K = 1 + rng() % 600, N = 1 + rng() % 600;
            flops += 2.0 * double(M * K * N);
            g.add(matmul_task(core, matmul_cycles(hw, M, K, N, t)), deps);
            break;
          }
          case 2: g.add(vector_task(core, vector_cycles(hw, VectorOp(rng() % kNumVectorOps), 1 + rng() % 5000)), deps); break;
          case 3: {
            const int64_t b = 1 + rng() % 100000;
            loads += b;
            g.add(load_task(core, b), deps);
            break;
          }
          case 4: {
            const int64_t b = 1 + rng() % 100000;
            stores += b;
            g.add(store_task(core, b), deps);
            break;
          }
          case 5:
            if (peer != core) g.add(transfer_task(core, peer, 1 + rng() % 50000), deps);
            else g.add(barrier_task(double(rng() % 100)), deps);
            break;
          default:
            if (peer != core) g.add(reduce_task(core, peer, 1 + rng() % 5000, 2), deps);
            else g.add(barrier_task(0), deps);
        }
      }
      SimResult r = simulate(g, hw);
      const Roofline roof = roofline(hw, flops, double(loads + stores), t);
      EXPECT_GE(r.seconds * (1 + 1e-9), roof.bound_s) << name << " trial " << trial;
      const Estimate e = estimate(g, hw);
      EXPECT_GE(r.cycles * (1 + 1e-9), e.critical_path_cycles) << name << " trial " << trial;
      EXPECT_GE(r.cycles * (1 + 1e-9), e.dram_cycles * std::min(1.0, hw.dram.mixed_efficiency)) << name;
      EXPECT_GE(r.dram_read_bytes, loads);
      EXPECT_GE(r.dram_write_bytes, stores);
      expect_lanes_add_up(r);
      for (size_t i = 0; i < g.size(); ++i) {
        EXPECT_LE(r.start[i], r.finish[i]);
        for (TaskId d : g.deps(TaskId(i))) EXPECT_LE(r.finish[size_t(d)], r.start[i] + 1e-9);
      }
    }
  }
}

// Not a timing assertion: runs a tblock-sized graph (200k tasks over 32 cores) and records the rate.
TEST(SimEngine, LargeGraphThroughput) {
  const HwSpec hw = load_preset("spyre");
  TaskGraph g;
  const int per_core = 200000 / 32 / 4;
  g.reserve(200000, 400000);
  std::vector<TaskId> prev_mm(32, -1), prev2(32, -1);
  for (int i = 0; i < per_core; ++i)
    for (int c = 0; c < 32; ++c) {
      std::vector<TaskId> deps;
      if (prev2[size_t(c)] >= 0) deps.push_back(prev2[size_t(c)]);
      const TaskId l = g.add(load_task(c, 16384), deps);
      const TaskId m = g.add(matmul_task(c, 700), {l});
      const TaskId v = g.add(vector_task(c, 100), {m});
      g.add(store_task(c, 4096), {v});
      prev2[size_t(c)] = prev_mm[size_t(c)];
      prev_mm[size_t(c)] = m;
    }
  const auto t0 = std::chrono::steady_clock::now();
  SimResult r = simulate(g, hw);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  RecordProperty("tasks_per_second", std::to_string(int64_t(double(g.size()) / s)));
  std::printf("simulated %zu tasks (%lld events) in %.3f s: %.2f M tasks/s\n", g.size(), (long long)r.events, s,
              double(g.size()) / s / 1e6);
  EXPECT_GT(r.cycles, 0);
  expect_lanes_add_up(r);
}

TEST(SimEngine, BroadcastLoadReadsDramOnce) {
  const HwSpec hw = toy();
  TaskGraph g;
  const TaskId b = g.add(broadcast_load_task(0, 1000, 4));
  g.add(matmul_task(3, 5), {b});
  SimResult r = simulate(g, hw);
  EXPECT_DOUBLE_EQ(r.cycles, 15);
  EXPECT_EQ(r.dram_read_bytes, 1000);
  EXPECT_EQ(r.scratchpad_bytes, 4000);
  HwSpec limited = hw;
  limited.interconnect.broadcast_limit = 2;
  EXPECT_THROW(simulate(g, limited), Error);
}

// The bar, at the engine level: the Granite-3.3-8B MLP prefill product [512,4096] x [4096,12800]
// f16 on spyre, split (m,n,k) = (8,4,1) as torch-spyre's cost model chose, B tiles of [1024,128]
// (256 KiB) broadcast to the 8 cores of an N group with three buffers (+ A's 512 KiB: 1.25 MiB of the
// 1.6 MiB usable), one B load per group in flight, reaches >= 80 % of the roofline bound with this
// hand-written schedule (89 % when written). The tile level produces such schedules; this checks that
// the cost model and engine allow it. (With two buffers and B loads unchained it was 65-79 %.)
TEST(SimEngine, GraniteMlpPrefillReachesTheRoofline) {
  const HwSpec hw = load_preset("spyre");
  const int64_t M = 512, K = 4096, N = 12800, Ms = 8, Ns = 4, Kt = 1024, Nt = 128;
  const int64_t mc = M / Ms, nc = N / Ns, KT = K / Kt, NT = nc / Nt;  // 64 rows, 3200 cols per core
  auto core = [&](int64_t m, int64_t n) { return int(m * Ns + n); };
  TaskGraph g;
  std::vector<TaskId> a_load(size_t(Ms * KT));
  for (int64_t m = 0; m < Ms; ++m)  // A rows of an M group, K chunk by chunk, to the 4 cores of the group
    for (int64_t k = 0; k < KT; ++k) a_load[size_t(m * KT + k)] = g.add(broadcast_load_task(core(m, 0), mc * Kt * 2, int(Ns)));
  const double mm_cycles = matmul_cycles(hw, mc, Kt, Nt, DType::f16);
  std::vector<std::vector<TaskId>> mm(size_t(NT * KT), std::vector<TaskId>(size_t(Ms * Ns)));
  std::vector<TaskId> prev_b(static_cast<size_t>(Ns), -1);
  for (int64_t i = 0; i < NT * KT; ++i) {
    const int64_t k = i % KT;
    std::vector<TaskId> b_load(static_cast<size_t>(Ns));
    for (int64_t n = 0; n < Ns; ++n) {
      std::vector<TaskId> deps;  // the buffer of tile i - 3 is free once its 8 readers are done
      if (i >= 3)
        for (int64_t m = 0; m < Ms; ++m) deps.push_back(mm[size_t(i - 3)][size_t(core(m, n))]);
      // One B load of a group in flight at a time: DRAM is shared equally among transfers in flight,
      // so a load needed later would otherwise slow down the one needed next.
      if (i >= 1) deps.push_back(prev_b[size_t(n)]);
      b_load[size_t(n)] = prev_b[size_t(n)] = g.add(broadcast_load_task(core(0, n), Kt * Nt * 2, int(Ms)), deps);
    }
    for (int64_t m = 0; m < Ms; ++m)
      for (int64_t n = 0; n < Ns; ++n)
        mm[size_t(i)][size_t(core(m, n))] =
            g.add(matmul_task(core(m, n), mm_cycles), {b_load[size_t(n)], a_load[size_t(m * KT + k)]});
    // The output tile finished by tile i - 1 is stored after tile i's loads were queued: in-order DMA
    // queues, so a store queued earlier would hold back the next load behind a later matmul.
    if (i >= 1 && (i - 1) % KT == KT - 1)
      for (int c = 0; c < Ms * Ns; ++c) g.add(store_task(c, mc * Nt * 2), {mm[size_t(i - 1)][size_t(c)]});
  }
  for (int c = 0; c < Ms * Ns; ++c) g.add(store_task(c, mc * Nt * 2), {mm.back()[size_t(c)]});
  SimResult r = simulate(g, hw);
  const double flops = 2.0 * double(M * K * N);
  const double bytes = 2.0 * double(M * K + K * N + M * N);
  const Roofline roof = roofline(hw, flops, bytes, DType::f16);
  EXPECT_EQ(r.dram_read_bytes + r.dram_write_bytes, int64_t(bytes));
  const double fraction = roof.bound_s / r.seconds;
  std::printf("granite mlp prefill on spyre: %.1f us simulated, roofline %.1f us (%s-bound): %.1f %%\n", r.seconds * 1e6,
              roof.bound_s * 1e6, roof.memory_bound() ? "memory" : "compute", 100 * fraction);
  EXPECT_GE(fraction, 0.8);
  EXPECT_LE(fraction, 1.0);
}

TEST(SimEngine, MeshRoutesXYAndHoldsLinks) {
  HwSpec hw = toy();
  hw.interconnect.topology = Topology::mesh;
  hw.interconnect.mesh_shape = {2, 2};
  hw.interconnect.reduce_path = ReducePath::ring;
  TaskGraph g;
  // 0 -> 3 goes 0 -> 1 (along the row) then 1 -> 3 (down): 2 x 5 + 100 / 10 = 20. 1 -> 3 needs the
  // second link: it waits until 20, then 5 + 10. 2 -> 3 uses its own link: 15.
  const TaskId a = g.add(transfer_task(0, 3, 100));
  const TaskId b = g.add(transfer_task(1, 3, 100));
  const TaskId c = g.add(transfer_task(2, 3, 100));
  SimResult r = simulate(g, hw);
  EXPECT_DOUBLE_EQ(r.finish[size_t(a)], 20);
  EXPECT_DOUBLE_EQ(r.finish[size_t(b)], 35);
  EXPECT_DOUBLE_EQ(r.finish[size_t(c)], 15);
  expect_lanes_add_up(r);
}

TEST(SimEngine, WaitingOnATransferIsAnInterconnectStall) {
  const HwSpec hw = toy();
  TaskGraph g;
  const TaskId t = g.add(transfer_task(0, 1, 100));  // 15 cycles
  g.add(matmul_task(1, 4), {t});
  SimResult r = simulate(g, hw);
  const LaneStats& mx = r.lane(1, int(Lane::matrix));
  EXPECT_DOUBLE_EQ(mx.wait_interconnect, 15);
  EXPECT_DOUBLE_EQ(mx.busy, 4);
  EXPECT_DOUBLE_EQ(r.cycles, 19);
  EXPECT_EQ(r.scratchpad_bytes, 200);  // read at the sender, written at the receiver
}

// A duration that is not finite (here a DRAM latency of inf) made the engine loop forever: time
// stuck at inf, transfers never completing. It is now refused where it first appears.
TEST(SimEngine, NonFiniteTimeIsAnError) {
  HwSpec hw = toy();
  hw.dram.latency_cycles = std::numeric_limits<double>::infinity();
  TaskGraph g;
  g.add(load_task(0, 1000));
  const auto o = testenv::bounded([&] { simulate(g, hw); });
  EXPECT_TRUE(o.error) << o.message;
  EXPECT_NE(o.message.find("[sim] simulated time became inf at task 0 'dma_load' (after cycle 0)"), std::string::npos)
      << o.message;
}

// A 1-byte load after 1e300 cycles: each step (0.01 cycles) is below the precision of the time, so
// time never advanced and the DRAM event repeated forever (then: an error, "no progress"). A transfer
// whose rest needs less time than the clock can still express at this magnitude is now done: the load
// completes at 1e300 (the no-progress check stays as a backstop).
TEST(SimEngine, ATransferBelowTheTimeResolutionCompletes) {
  const HwSpec hw = toy();
  TaskGraph g;
  const TaskId wait = g.add(barrier_task(1e300));
  g.add(load_task(0, 1), {wait});
  SimResult r;
  const auto o = testenv::bounded([&] { r = simulate(g, hw); });
  EXPECT_FALSE(o.error) << o.message;
  r = simulate(g, hw);
  EXPECT_DOUBLE_EQ(r.cycles, 1e300);
}
