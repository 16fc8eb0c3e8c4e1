// Tensor (and data) parallelism at the graph level: one graph becomes N ranks' graphs (SPMD: the same nodes in the
// same order, each rank with its own slices of the weights) joined by AllReduce and AllGather nodes.
// Megatron's split, found by propagation rather than by pattern: a matmul by a constant weight whose
// input every rank holds whole is split by the weight's columns (each rank computes its columns), one
// whose input is split along the contraction is split by rows (each rank holds a partial sum); the
// split then follows the ops that keep it (pointwise, bias adds, reshapes into heads, transposes, the
// batched attention matmuls, softmax and layer norm over other axes, a Split into Q, K, V), partial
// sums pass through linear ops, and anything else gets its inputs whole back through a collective.
// docs/multichip.md.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "tessel/ir/graph.h"

namespace tessel {

struct ShardDecision {
  std::string node, op;
  std::string rule;  // "column-parallel: 'W' [768,2304] split by columns, 576 per rank (3 blocks)"
};

enum class ShardKind {
  tensor,  // weights split (column / row parallel), activations whole between the blocks
  data,    // the inputs split along their first dim (the batch), weights whole on every rank
};
const char* shard_kind_name(ShardKind k);  // "tp", "dp"

struct ShardedProgram {
  ShardKind kind = ShardKind::tensor;
  int ranks = 1;
  // One graph per rank, rank r at index r: the same nodes in the same order (their names and ops equal),
  // inputs and outputs whole (every rank takes the same inputs and returns the same outputs).
  std::vector<std::unique_ptr<Graph>> graphs;
  std::vector<ShardDecision> decisions;  // each source node split or given a collective, in graph order
  int all_reduces = 0, all_gathers = 0;
  int64_t weight_bytes = 0;          // every constant of the source graph
  int64_t weight_bytes_per_rank = 0; // what one rank's graph holds (split constants at their slice)
};

// Shards `g` (static shapes: bind the inputs first) over `ranks` ranks. Throws tessel::Error naming
// the pass ("shard") when ranks is not in 1..1024 or the graph has symbolic sizes; a node no rule
// splits is not an error (its inputs are gathered and every rank computes it whole).
ShardedProgram shard_tensor_parallel(const Graph& g, int ranks);
// Data parallel: every input whose first dim the ranks divide is split along it (the others stay
// whole), and the split follows as above; no weight is split. An Error naming the pass when no input
// can be split.
ShardedProgram shard_graph(const Graph& g, ShardKind kind, int ranks);

}  // namespace tessel
