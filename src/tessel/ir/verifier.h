// The graph verifier: structural invariants and type consistency; messages name the node.
#pragma once

#include "tessel/ir/graph.h"

namespace tessel {

// Checks: every node has a registered op; input/output counts and attributes match the op's schema;
// values are defined before use (topological order) and defined once; every value's type is what
// the op's shape rule infers; graph outputs are defined. Throws tessel::Error on the first problem.
void verify_graph(const Graph& g);

}  // namespace tessel
