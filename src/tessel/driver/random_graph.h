// Seeded random graphs for differential testing (docs/random-graphs.md): one seed gives one graph of
// ONNX-level and core ops over f32 values with odd and zero-sized dims, and one set of inputs that
// mixes ordinary values with NaN, +-inf, -0.0, denormals and large/small magnitudes.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "tessel/ir/graph.h"

namespace tessel::randgraph {

struct GenOptions {
  int max_nodes = 6;             // ops drawn per graph (1..max_nodes)
  int max_rank = 3;
  bool special_values = true;    // NaN/inf/-0/denormal/extreme inputs and Clip bounds
  bool zero_dims = true;         // sometimes a dim of size 0
};

// The graph for `seed`. Every node was accepted by its op's shape rule (draws the rule rejects are
// drawn again), every dim is static. Deterministic: the same seed and options give the same text.
std::unique_ptr<Graph> random_graph(uint64_t seed, const GenOptions& opts = {});

// Inputs for `g` (one per graph input, in order): element values depend only on (seed, input name,
// shape), so a minimised graph keeps the values of the inputs it kept. A graph with size symbols gets
// inputs at each symbol's lowest value.
std::vector<Tensor> random_inputs(const Graph& g, uint64_t seed, bool special_values = true);

// The symbolic mode (docs/random-graphs.md): `g` with every input dim equal to the first input's
// largest dim (a size above 1) replaced by the size symbol `name`, declared in [that size, that size
// + 16], and the graph's shapes inferred again; nullptr when the graph does not hold for other values
// of it (an attribute or a constant fixes the size: the shape rules refuse). At the symbol's lowest
// value it is the graph it came from, with the same inputs.
std::unique_ptr<Graph> symbolize(const Graph& g, const std::string& name);

// The names of the ops the generator draws (for docs and coverage checks).
std::vector<std::string> generated_ops();

// A small deterministic generator (splitmix64): the same sequence on every platform and standard
// library, unlike std::uniform_int_distribution.
class Rng {
 public:
  explicit Rng(uint64_t seed) : s_(seed) {}
  uint64_t next();
  int64_t uniform(int64_t lo, int64_t hi);  // inclusive
  double real();                            // [0, 1)
  bool chance(double p) { return real() < p; }
  template <typename T>
  const T& pick(const std::vector<T>& v) { return v[static_cast<size_t>(uniform(0, static_cast<int64_t>(v.size()) - 1))]; }

 private:
  uint64_t s_;
};

}  // namespace tessel::randgraph
