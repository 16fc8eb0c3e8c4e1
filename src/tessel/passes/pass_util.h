// Small queries and edits the rewriting passes share (algebraic, canonicalize; their driver is rewrite.h).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "tessel/ir/core_ops.h"
#include "tessel/ir/graph.h"

namespace tessel {

// The node producing `v` when it is the primitive `op`, else null.
const Node* core_producer(const Value* v, CoreOp op);
// The single value of every element of `v` when `v` is a constant whose elements are all equal, or a
// broadcast_in_dim of one; nullopt otherwise (also for an empty tensor).
std::optional<double> splat_of(const Value* v);
bool is_identity(const std::vector<int64_t>& perm);
// True when every value of dtype `from` converts to `to` and back unchanged (an exact widening).
bool converts_exactly(DType from, DType to);
// Points every use of `from` (node inputs, graph outputs) at `to`. A graph output keeps the model's
// name for it: `to` takes the name when it is an intermediate that is not already an output; when it
// cannot (an input, a constant, another output), nothing changes and the result is false.
bool forward_uses(Graph& g, Value* from, Value* to);

}  // namespace tessel
