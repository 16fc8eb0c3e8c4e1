// The rematerialization partition of a joint (forward + backward) graph: which forward results the
// forward saves for the backward and which the backward recomputes (a min cut on bytes saved, as
// AOTAutograd's default partitioner). docs/passes/autodiff.md, "The partition".
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "tessel/ir/graph.h"

namespace tessel {

struct RematPartition {
  std::vector<const Value*> saved;       // forward results the backward reads, kept from the forward
  int64_t saved_bytes = 0;
  std::vector<const Node*> recomputed;   // forward nodes the backward runs again (graph order)
};

// Chooses the saved set of `g` (its first `num_forward_outputs` outputs are the forward's) with the
// fewest bytes, where the backward may recompute only cheap primitives (elementwise and data movement
// without gathers: the ones fusion puts in a loop); reductions, contractions, windows, gathers,
// scatters and sorts are always saved rather than recomputed. Graph inputs and constants are free
// (live for the whole step).
RematPartition partition_for_remat(const Graph& g, size_t num_forward_outputs);

// The joint graph cut in two by `p`: `forward` computes the forward outputs, then the saved values;
// `backward` takes the saved values (first, in p.saved order, same names) then the joint graph's inputs
// it reads (in their order: parameters, data, the seed), recomputes p.recomputed and returns the
// gradient outputs. Throws if the backward would read a forward value that is neither saved nor
// recomputed.
struct SplitGraphs {
  std::unique_ptr<Graph> forward, backward;
};
SplitGraphs split_by_partition(const Graph& joint, size_t num_forward_outputs, const RematPartition& p);

}  // namespace tessel
