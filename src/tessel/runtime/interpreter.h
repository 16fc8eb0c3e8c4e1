// The eager interpreter: runs a graph node by node with the reference kernels. It is the oracle
// every later pass and target is checked against.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "tessel/ir/graph.h"

namespace tessel {

struct RunStats {
  size_t peak_bytes = 0;   // peak bytes of live intermediate tensors (inputs and constants excluded)
};

// Runs `g` on `inputs` (one per graph input, in order). Checks each input's dtype and shape against
// the graph's input types; errors name the input. Intermediate tensors are freed after their last use.
std::vector<Tensor> run_eager(const Graph& g, const std::vector<Tensor>& inputs, RunStats* stats = nullptr);

}  // namespace tessel
