// Differential testing of random graphs (docs/random-graphs.md): each graph runs on the eager
// interpreter (the reference), the graph and compiled backends and the tile level's functional
// simulator (spyre f16 = DL16, tpu-v5e bf16), outputs compared under a stated policy per backend; a
// failing graph is minimised to a small .tsl that still fails.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "tessel/driver/random_graph.h"
#include "tessel/targets/cpu/toolchain.h"

namespace tessel::randgraph {

// How one backend's outputs compare with eager's. Specials (NaN, +-inf) must sit at the same
// positions with the same sign; finite values x (reference r, m = max |finite r| of that output) pass
// when |x - r| <= rtol * |r| + atol * m. Signed zeros compare equal. Integer outputs compare exactly.
struct Policy {
  std::string name;
  double rtol = 0, atol = 0;
  double eps = 0;   // unit roundoff of the precision the backend stores in (the conditioning probe)
};
Policy policy_for(const std::string& backend);

// Empty when `got` agrees with `ref` under `p`; else the first differing element, both values and
// the output's largest finite magnitude.
std::string compare_output(const Tensor& ref, const Tensor& got, const Policy& p);

// Whether an input, constant or intermediate (as eager computes it) holds a finite value of magnitude
// >= 2^60, or a product reduction's operand has factors whose exponents sum past +-120: products,
// squares and sums then overflow or underflow in f32, which the backends accumulate in, where eager's
// double does not; such graphs are compared on types only (docs/random-graphs.md).
bool at_f32_range_edge(const Graph& g, const std::vector<Tensor>& inputs);

struct DiffOptions {
  // graph, compiled, spyre (f16 = DL16), tpu-v5e (bf16), symbolic (compiled once with a size symbol,
  // run at two values of it: randgraph::symbolize)
  std::vector<std::string> backends = {"graph", "compiled", "spyre", "tpu-v5e"};
  int batch = 20;                 // graphs per compiled module / simulated program (one g++ each)
  GenOptions gen;
  cpu::ToolchainOptions toolchain;
};

struct Finding {
  uint64_t seed = 0;
  std::string backend;
  std::string detail;   // the first differing output and element, or the backend's error
  std::string tsl;      // the graph's text
};

struct CampaignStats {
  int graphs = 0;
  int eager_errors = 0;          // graphs the reference itself refused (not compared; should stay 0)
  std::map<std::string, int> compared;      // backend -> graphs compared
  std::map<std::string, int> ill_conditioned;  // backend -> outputs skipped as ill-conditioned
  std::map<std::string, int> f32_range;     // backend -> outputs compared on types only (f32's range edge)
  std::map<std::string, int> out_of_range;  // sim backend -> graphs whose intermediates left the storage range
  std::map<std::string, double> seconds;    // per backend (eager included), wall
  int compilations = 0;          // compiled modules + simulated programs built
  int not_symbolic = 0;          // symbolic backend: graphs whose sizes the graph itself fixes (symbolize)
  double seconds_total = 0;
  std::vector<Finding> findings;
};

// Runs seeds first_seed .. first_seed + count - 1. `on_finding` sees each finding as it is found.
CampaignStats run_campaign(uint64_t first_seed, int count, const DiffOptions& opts,
                           const std::function<void(const Finding&)>& on_finding = {});

// One graph on the backends of `opts` (inputs: random_inputs(g, seed)): the findings, empty when all
// agree with eager. Throws when eager itself fails.
std::vector<Finding> check_graph(const Graph& g, uint64_t seed, const DiffOptions& opts);

// A smaller graph for which check_graph still reports a finding on `backend`: outputs dropped and
// nodes cut (a value replaced by a new input of its type, dead nodes and inputs removed), greedily until
// neither step keeps the failure (dims are not shrunk). Returns a copy of `g` when nothing smaller fails.
std::unique_ptr<Graph> minimise(const Graph& g, uint64_t seed, const std::string& backend, const DiffOptions& opts);

// The .tsl text of a finding's graph with a header naming the seed (what tests/randgraph/*.tsl hold).
std::string finding_text(const Graph& g, uint64_t seed, const std::string& note);
// The seed a tests/randgraph file names in its header ("# randgraph seed=N"), or 0.
uint64_t seed_of_text(const std::string& text);

}  // namespace tessel::randgraph
