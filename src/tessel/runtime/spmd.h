// Runs a sharded program's ranks together in one process (passes/shard.h): every rank's graph node by
// node in lockstep, each collective given every rank's input at once (AllReduce sums them in rank
// order, AllGather concatenates them along its axis). The functional check of a sharding: its outputs
// against the eager interpreter on the unsharded graph. docs/multichip.md.
#pragma once

#include <vector>

#include "tessel/ir/graph.h"

namespace tessel {

// `ranks`: one graph per rank with the same nodes in the same order (shard_tensor_parallel's); every
// rank takes `inputs`. Returns each rank's outputs. Errors name the node and the rank.
std::vector<std::vector<Tensor>> run_spmd(const std::vector<const Graph*>& ranks, const std::vector<Tensor>& inputs);

}  // namespace tessel
