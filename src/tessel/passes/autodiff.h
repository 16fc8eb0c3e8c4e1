// Reverse-mode autodiff on the core level: the vector-Jacobian rule of each primitive and the pass
// that builds the joint (forward + backward) graph. docs/passes/autodiff.md.
#pragma once

#include <string>
#include <vector>

#include "tessel/ir/graph.h"

namespace tessel {

class CoreBuilder;

// The vector-Jacobian rule of core node `n` (autodiff_rules.cpp): given the cotangents of its outputs
// (nullptr = zero), emits core nodes through `b` and returns one cotangent per input, of the input's
// type; nullptr where need[i] is false or no cotangent flows (an integer operand, a zero derivative).
// Throws tessel::Error naming the node for a primitive that is not differentiable (vjp = none).
std::vector<Value*> core_vjp(CoreBuilder& b, const Node& n, const std::vector<Value*>& out_ct,
                             const std::vector<bool>& need);

struct AutodiffOptions {
  std::string output;            // the output to differentiate; "" = the graph's only output
  bool seed = false;             // add an input "<output>.seed" of the output's type as its cotangent;
                                 // without one the output must have one element (a loss)
  std::vector<std::string> wrt;  // graph inputs or constants (float) to differentiate with respect to
};

struct AutodiffResult {
  std::vector<std::string> gradients;  // "<wrt>.grad", one per wrt, in order: the last graph outputs
  std::string seed_input;              // the added seed input's name, "" without one
  size_t forward_nodes = 0;            // nodes before autodiff
  size_t backward_nodes = 0;           // nodes autodiff added (before any simplification)
  int softmax_max_skipped = 0;         // softmax maxes given no cotangent (shift invariance: autodiff.cpp)
};

// Appends the backward of `g` (a core-level graph) to it: walks the nodes in reverse topological order
// from the output's cotangent (1, or the seed), sums the cotangents of values with several uses and
// appends one gradient output per wrt after the forward outputs. A wrt value that does not reach the
// output gets a zero gradient. Errors (tessel::Error, one line) name the output, value or node.
AutodiffResult build_joint_graph(Graph& g, const AutodiffOptions& o);

// Parameters of an imported model: every float constant with more than one element becomes a graph
// input (appended after the data inputs, in constant order), so that no pass folds it into a derived
// constant. Returns their names and values (the initial parameters). docs/decisions.md, "Training:
// what a parameter is".
struct LiftedParameter {
  std::string name;
  Tensor value;
};
std::vector<LiftedParameter> lift_parameters(Graph& g);

// Names the gradient outputs "<wrt>.grad" again after a pipeline replaced them (where the value is a
// node's result that is no other output and the name is free). Returns how many it renamed.
int name_gradient_outputs(Graph& g, const AutodiffResult& r);

// The nodes the forward outputs need (the rest of a joint graph is the backward).
size_t count_forward_nodes(const Graph& g, size_t num_forward_outputs);

// What a joint graph's backward reads from its forward when every forward result is kept (the
// partition before any rematerialization): forward node results used by backward nodes.
struct SavedActivations {
  size_t tensors = 0;
  int64_t bytes = 0;
};
SavedActivations saved_activations(const Graph& g, size_t num_forward_outputs);

}  // namespace tessel
