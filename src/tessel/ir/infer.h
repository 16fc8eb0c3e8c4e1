// Static shape and dtype inference over a whole graph, with folding of values that depend only on
// constants and static shapes (the ONNX Shape -> Gather -> Concat -> Reshape chains).
#pragma once

#include <map>

#include "tessel/ir/graph.h"

namespace tessel {

struct InferResult {
  // Values whose contents are known at compile time but that are not constants in the graph.
  std::map<const Value*, Tensor> folded;
  // Integer values made of sizes with a symbolic element (shape arithmetic on symbolic shapes).
  std::map<const Value*, SymTensor> sym_folded;
};

// Sets the type of every node output. Throws tessel::Error naming the node on failure.
// Values up to `fold_limit` elements whose inputs are all known are evaluated with the reference
// kernels so that later shape rules (Reshape, Expand, Range, ...) see them.
// verify_only: compare with the types already set instead of setting them (the verifier's check).
InferResult infer_graph(Graph& g, int64_t fold_limit = 1 << 16, bool verify_only = false);

// Infers the nodes from index `first` on, adding to `r`, which holds the result for the nodes before
// it: for a graph that only grows at its end (the ONNX importer's expansions infer as they go).
// Binds the unknown dims of the graph's inputs to the example inputs' shapes (the inputs stay inputs).
// Throws tessel::Error naming the input when the count, a dtype, a rank or a known dim disagrees.
// infer_graph afterwards propagates the shapes.
void bind_input_shapes(Graph& g, const std::vector<Tensor>& examples);

void infer_graph_from(Graph& g, size_t first, InferResult& r, int64_t fold_limit = 1 << 16);

// Runs the op's rule for one node; `known` holds each input's value when statically known.
void infer_node(Node& n, const std::vector<const Tensor*>& known, std::vector<std::optional<Tensor>>* out_values,
                bool verify_only = false);

// Runs one node's reference kernel on concrete inputs, checking the results against the node's
// static output types. Errors name the node.
std::vector<Tensor> run_node(const Node& n, const std::vector<const Tensor*>& inputs);

}  // namespace tessel
