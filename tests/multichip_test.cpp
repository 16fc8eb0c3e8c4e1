// Several chips (docs/sim.md "Several chips", docs/hw.md "system"): the hardware file's system section,
// and collectives timed on the chip links by the event engine against hand-worked ring figures.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <cmath>
#include <limits>

#include "tessel/hw/hw.h"
#include "tessel/support/error.h"
#include "tessel/support/limits.h"
#include "tessel/targets/dataflow/multichip.h"
#include "test_util.h"

using namespace tessel;
using namespace tessel::dataflow;

namespace {

std::string example_path() { return testenv::source_dir() + "/examples/multichip/spyre_ring4.json"; }

// The example file with /system replaced (null: removed).
std::string with_system(const nlohmann::json& system) {
  auto j = nlohmann::json::parse(testenv::read_text(example_path()));
  if (system.is_null()) j.erase("system");
  else j["system"] = system;
  return j.dump(2);
}

std::string error_of(const std::string& text) {
  try {
    hw::parse_hw_json(text, "hw/x.json");
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// spyre's chip with a system of `chips` on `topology` at 100 GB/s per link, 500 ns per hop.
hw::HwSpec system_of(int chips, const std::string& topology = "ring", std::vector<int> mesh = {}) {
  nlohmann::json s = {{"chips", chips}, {"topology", topology}, {"link_gbps", 100}, {"link_latency_ns", 500}};
  if (!mesh.empty()) s["mesh_shape"] = mesh;
  return hw::parse_hw_json(with_system(s), "test");
}

SystemOp collective(SystemOpKind k, int64_t bytes, std::vector<int> deps = {}) {
  return SystemOp{.kind = k, .name = k == SystemOpKind::all_reduce ? "ar" : "ag", .bytes = bytes, .elem_bytes = 4,
                  .deps = std::move(deps)};
}
SystemOp compute(const std::string& name, double seconds, std::vector<int> deps = {}) {
  return SystemOp{.kind = SystemOpKind::compute, .name = name, .seconds = seconds, .deps = std::move(deps)};
}

// One ring step by hand: a chunk of bytes / N over one link plus one hop's latency.
double hand_step(int n, double bytes) { return bytes / n / 100e9 + 500e-9; }

}  // namespace

TEST(MultiChip, ExampleSystemSectionParses) {
  const hw::HwSpec hw = hw::load_hw_file(example_path());
  EXPECT_EQ(hw.system.chips, 4);
  EXPECT_EQ(hw.system.topology, hw::SystemTopology::ring);
  EXPECT_DOUBLE_EQ(hw.system.link_gbps, 100);
  EXPECT_DOUBLE_EQ(hw.system.link_latency_ns, 500);
  // The chip itself is the spyre preset's.
  const hw::HwSpec spyre = hw::load_preset("spyre");
  EXPECT_EQ(hw.cores, spyre.cores);
  EXPECT_DOUBLE_EQ(hw.dram.read_gbps, spyre.dram.read_gbps);
  EXPECT_NE(hw::describe(hw).find("  system           4 chips, ring, 100 GB/s per link and direction, 500 ns per hop\n"),
            std::string::npos)
      << hw::describe(hw);
  // No section: one chip, and describe says nothing of a system.
  EXPECT_EQ(spyre.system.chips, 1);
  EXPECT_EQ(hw::describe(spyre).find("system"), std::string::npos);
  const hw::HwSpec mesh = system_of(6, "mesh", {2, 3});
  EXPECT_EQ(mesh.system.mesh_shape, (std::vector<int64_t>{2, 3}));
  EXPECT_NE(hw::describe(mesh).find("6 chips, mesh 2x3"), std::string::npos);
}

TEST(MultiChip, BadSystemSectionsNameTheField) {
  const nlohmann::json good = {{"chips", 4}, {"topology", "ring"}, {"link_gbps", 100}, {"link_latency_ns", 500}};
  auto bad = [&](const std::string& key, const nlohmann::json& v) {
    nlohmann::json s = good;
    if (v.is_discarded()) s.erase(key);
    else s[key] = v;
    return error_of(with_system(s));
  };
  EXPECT_EQ(bad("chips", 0), "hw/x.json: /system/chips: must be an integer in [1, 1024] (got 0)");
  EXPECT_EQ(bad("chips", 1025), "hw/x.json: /system/chips: must be an integer in [1, 1024] (got 1025)");
  EXPECT_EQ(bad("topology", "torus"),
            "hw/x.json: /system/topology: must be one of 'ring', 'mesh', 'fully_connected' (got 'torus')");
  EXPECT_EQ(bad("link_gbps", -100), "hw/x.json: /system/link_gbps: must be a number in [0.001, 1e+07] (got -100)");
  EXPECT_EQ(bad("link_gbps", 0), "hw/x.json: /system/link_gbps: must be a number in [0.001, 1e+07] (got 0)");
  EXPECT_EQ(bad("link_latency_ns", -1), "hw/x.json: /system/link_latency_ns: must be a number in [0, 1e+09] (got -1)");
  // JSON has no NaN: a NaN written through a JSON library comes out as null, which is not a number.
  EXPECT_EQ(bad("link_gbps", std::numeric_limits<double>::quiet_NaN()),
            "hw/x.json: /system/link_gbps: must be a number (got null)");
  EXPECT_EQ(bad("link_gbps", nlohmann::json(nlohmann::json::value_t::discarded)), "hw/x.json: /system/link_gbps: missing (required)");
  EXPECT_EQ(bad("link_gbs", 100), "hw/x.json: /system/link_gbs: unknown field (did you mean 'link_gbps'?)");
  EXPECT_EQ(bad("mesh_shape", {2, 2}), "hw/x.json: /system/mesh_shape: only for topology 'mesh'");
  nlohmann::json m = good;
  m["topology"] = "mesh";
  m["mesh_shape"] = {2, 3};
  EXPECT_EQ(error_of(with_system(m)), "hw/x.json: /system/mesh_shape: rows x cols must equal chips (4) (got 2 x 3)");
  m.erase("mesh_shape");
  EXPECT_EQ(error_of(with_system(m)), "hw/x.json: /system/mesh_shape: missing (required)");
  EXPECT_EQ(error_of(with_system(nlohmann::json::array())), "hw/x.json: /system: must be an object (got an array)");
}

// All-reduce: 2(N-1) steps of a 1/N chunk, and N-1 chip-wide adds of a chunk (spyre: 32 cores x 128
// f32 adds per cycle, 8 cycles latency, 1 GHz). All-gather: N-1 steps, nothing to add.
TEST(MultiChip, RingCollectivesMatchTheHandFormula) {
  const double bytes = 1.5e6;
  for (int n : {2, 4, 8}) {
    const hw::HwSpec hw = system_of(n);
    const double step = hand_step(n, bytes);
    const double add = (8 + std::ceil(bytes / 4 / n / (128 * 32))) * 1e-9;
    const double ar_formula = 2 * (n - 1) * step, ag_formula = (n - 1) * step;
    EXPECT_NEAR(ring_formula_seconds(SystemOpKind::all_reduce, int64_t(bytes), hw), ar_formula, 1e-12) << n;
    EXPECT_NEAR(ring_formula_seconds(SystemOpKind::all_gather, int64_t(bytes), hw), ag_formula, 1e-12) << n;

    const SystemSimResult ar = simulate_system({collective(SystemOpKind::all_reduce, int64_t(bytes))}, hw);
    ASSERT_EQ(ar.collectives.size(), 1u);
    EXPECT_EQ(ar.chips, n);
    // The engine's time is the formula plus the N-1 adds of the reduce-scatter chain, exactly.
    EXPECT_NEAR(ar.collectives[0].sim_seconds, ar_formula + (n - 1) * add, 1e-10) << n;
    EXPECT_NEAR(ar.collectives[0].sim_seconds / ar_formula, 1.0, 0.05) << n;
    EXPECT_NEAR(ar.seconds, ar.collectives[0].sim_seconds, 1e-12);

    const SystemSimResult ag = simulate_system({collective(SystemOpKind::all_gather, int64_t(bytes))}, hw);
    EXPECT_NEAR(ag.collectives[0].sim_seconds, ag_formula, 1e-10) << n;
    EXPECT_NEAR(ag.collectives[0].formula_seconds, ag_formula, 1e-12) << n;
  }
}

// docs/sim.md's worked example: 4 chips, 1.5 MB all-reduce at 100 GB/s and 500 ns: 25.5 us by the
// formula, 25.593 us simulated (3 adds of 31 ns).
TEST(MultiChip, DocsWorkedExample) {
  const hw::HwSpec hw = hw::load_hw_file(example_path());
  const SystemSimResult r = simulate_system({collective(SystemOpKind::all_reduce, 1500000)}, hw);
  EXPECT_NEAR(r.collectives[0].formula_seconds * 1e6, 25.5, 1e-9);
  EXPECT_NEAR(r.collectives[0].sim_seconds * 1e6, 25.593, 1e-9);
  const SystemSimResult g = simulate_system({collective(SystemOpKind::all_gather, 1500000)}, hw);
  EXPECT_NEAR(g.collectives[0].sim_seconds * 1e6, 12.75, 1e-9);
  for (const ChipTime& c : r.per_chip) {
    EXPECT_NEAR(c.comm_seconds * 1e6, 25.593, 1e-9);  // every chip sends or adds all the way through
    EXPECT_EQ(c.compute_seconds, 0);
  }
  EXPECT_NE(r.trace_json.find("\"traceEvents\""), std::string::npos);
  EXPECT_NE(r.trace_json.find("\"name\":\"ar\""), std::string::npos);
}

// A mesh with a cycle of neighbours (2x2, 2x3) runs the ring as fast as a ring; fully connected too.
TEST(MultiChip, MeshAndFullyConnectedRunTheRingOnNeighbourLinks) {
  const double bytes = 1.2e6;
  for (auto [hw, n] : {std::pair{system_of(4, "mesh", {2, 2}), 4}, std::pair{system_of(6, "mesh", {2, 3}), 6},
                       std::pair{system_of(6, "mesh", {3, 2}), 6}, std::pair{system_of(5, "fully_connected"), 5}}) {
    const std::vector<int> order = system_ring_order(hw);
    ASSERT_EQ(int(order.size()), n);
    if (hw.system.topology == hw::SystemTopology::mesh) {
      const int cols = int(hw.system.mesh_shape[1]);
      for (int p = 0; p < n; ++p) {
        const int a = order[size_t(p)], b = order[size_t((p + 1) % n)];
        EXPECT_EQ(std::abs(a / cols - b / cols) + std::abs(a % cols - b % cols), 1) << p;  // neighbours
      }
    }
    const SystemSimResult g = simulate_system({collective(SystemOpKind::all_gather, int64_t(bytes))}, hw);
    EXPECT_NEAR(g.collectives[0].sim_seconds, (n - 1) * hand_step(n, bytes), 1e-10) << n;
  }
  // A 1x4 line has no cycle: the closing step goes 3 hops back and shares links, so it is slower.
  const hw::HwSpec line = system_of(4, "mesh", {1, 4});
  const SystemSimResult g = simulate_system({collective(SystemOpKind::all_gather, int64_t(bytes))}, line);
  EXPECT_GT(g.collectives[0].sim_seconds, 3 * hand_step(4, bytes) * 1.2);
}

// compute -> all_reduce -> compute: nothing overlaps, the run is the sum. A compute step that does not
// depend on the all-reduce runs under it.
TEST(MultiChip, OverlapFollowsTheDependencies) {
  const hw::HwSpec hw = system_of(4);
  const double ar = 25.593e-6;  // DocsWorkedExample
  const SystemSimResult chain =
      simulate_system({compute("a", 10e-6), collective(SystemOpKind::all_reduce, 1500000, {0}), compute("b", 20e-6, {1})}, hw);
  EXPECT_NEAR(chain.seconds, 10e-6 + ar + 20e-6, 1e-10);
  ASSERT_EQ(chain.per_chip.size(), 4u);
  for (const ChipTime& c : chain.per_chip) {
    EXPECT_EQ(c.overlap_seconds, 0);
    EXPECT_NEAR(c.compute_seconds, 30e-6, 1e-12);
    EXPECT_NEAR(c.comm_seconds, ar, 1e-10);
    EXPECT_NEAR(c.idle_seconds, 0, 1e-10);
  }

  // b waits only for a: it runs from 10 us to 30 us under the all-reduce (10 .. 35.593 us).
  const SystemSimResult over =
      simulate_system({compute("a", 10e-6), collective(SystemOpKind::all_reduce, 1500000, {0}), compute("b", 20e-6, {0})}, hw);
  EXPECT_NEAR(over.seconds, 10e-6 + ar, 1e-10);
  EXPECT_LT(over.seconds, 10e-6 + ar + 20e-6);
  for (const ChipTime& c : over.per_chip) {
    EXPECT_GT(c.overlap_seconds, 0);
    EXPECT_NEAR(c.overlap_seconds, 20e-6, 1e-10);
    EXPECT_NEAR(c.compute_seconds, 30e-6, 1e-12);
  }
}

TEST(MultiChip, OneChipCollectivesCostNothing) {
  const hw::HwSpec hw = hw::load_preset("spyre");
  ASSERT_EQ(hw.system.chips, 1);
  EXPECT_EQ(ring_formula_seconds(SystemOpKind::all_reduce, 1 << 20, hw), 0);
  const SystemSimResult r = simulate_system(
      {compute("a", 5e-6), collective(SystemOpKind::all_reduce, 1 << 20, {0}), collective(SystemOpKind::all_gather, 1 << 20, {1}),
       compute("b", 7e-6, {2})},
      hw);
  EXPECT_EQ(r.chips, 1);
  ASSERT_EQ(r.collectives.size(), 2u);
  EXPECT_EQ(r.collectives[0].sim_seconds, 0);
  EXPECT_EQ(r.collectives[1].sim_seconds, 0);
  EXPECT_EQ(r.collectives[0].formula_seconds, 0);
  EXPECT_NEAR(r.seconds, 12e-6, 1e-12);
  EXPECT_EQ(r.per_chip.at(0).comm_seconds, 0);
  // A system section of one chip is the same.
  const SystemSimResult one = simulate_system({collective(SystemOpKind::all_reduce, 1 << 20)}, system_of(1));
  EXPECT_EQ(one.seconds, 0);
}

TEST(MultiChip, BadOpsNameTheOp) {
  const hw::HwSpec hw = system_of(4);
  auto err = [&](const std::vector<SystemOp>& ops) {
    try {
      simulate_system(ops, hw);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(err({compute("a", 1e-6, {0})}).find("op 0 'a' (compute): dep 0 is not an earlier op"), std::string::npos);
  EXPECT_NE(err({compute("a", -1)}).find("seconds must be finite and >= 0"), std::string::npos);
  SystemOp odd = collective(SystemOpKind::all_reduce, 1001);
  EXPECT_NE(err({odd}).find("bytes 1001 is not a multiple of elem_bytes 4"), std::string::npos);
}

// The ring's tasks grow as chips squared: a large system's collectives are refused by the allocation limit
// before any task is made, naming the count, and a system within it runs.
TEST(MultiChip, TheSystemsTasksAreBoundedBeforeTheyAreMade) {
  const hw::HwSpec big = system_of(1024);
  std::vector<SystemOp> ops;
  for (int i = 0; i < 2; ++i)
    ops.push_back({.kind = SystemOpKind::all_reduce, .name = "ar", .bytes = int64_t(1) << 30, .elem_bytes = 4});
  set_max_alloc_bytes(64u << 20);
  try {
    simulate_system(ops, big);
    set_max_alloc_bytes(0);
    FAIL() << "6 million tasks were made under a 64 MB limit";
  } catch (const Error& e) {
    set_max_alloc_bytes(0);
    // 2 all-reduces x 3 phases' worth of N (N - 1) ring steps
    EXPECT_NE(std::string(e.what()).find(std::to_string(2 * 3 * 1024 * 1023) + " tasks (1024 chips)"), std::string::npos) << e.what();
  }
  EXPECT_GT(simulate_system(ops, system_of(8)).seconds, 0);
}
