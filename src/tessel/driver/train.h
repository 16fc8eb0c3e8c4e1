// The training graph of a model: parameters lifted to inputs, the core pipeline, reverse-mode autodiff
// and the simplification of the joint graph (`tessel compile MODEL --train`, docs/passes/autodiff.md).
#pragma once

#include <string>
#include <vector>

#include "tessel/ir/graph.h"
#include "tessel/passes/autodiff.h"
#include "tessel/passes/remat_partition.h"

namespace tessel {

struct TrainOptions {
  std::string output;              // "" = the model's only output
  std::vector<std::string> wrt;    // empty: every float constant with > 1 element (lift_parameters)
  bool seed = false;               // a seed input even for a scalar output (a training step's backward
                                   // takes its cotangent: loss.backward(g) in PyTorch)
};

struct TrainGraph {
  std::vector<std::string> parameters;  // what was differentiated, in gradient-output order
  std::vector<Tensor> initial;          // the lifted parameters' values (empty with TrainOptions::wrt)
  int64_t parameter_elements = 0;
  AutodiffResult autodiff;
  std::string output;                   // the differentiated output
  size_t forward_nodes = 0;             // after simplification: nodes the forward outputs need
  size_t backward_nodes = 0;            // the rest of the joint graph
  SavedActivations saved;               // forward results the backward reads (no rematerialization yet)
  RematPartition partition;             // the min-cut partition: saved and recomputed
};

// Turns the graph-level `g` into its simplified joint core graph in place: forward outputs first,
// then one "<param>.grad" output per parameter. A non-scalar output gets a seed input (its cotangent,
// as torch's `y.backward(seed)`).
TrainGraph build_train_graph(Graph& g, const TrainOptions& o);

// One line: parameters, gradient outputs, seed, nodes forward/backward.
std::string train_summary(const TrainGraph& t);

}  // namespace tessel
