// A compiled training step: a model's joint graph cut by its remat partition into a forward graph
// (outputs + saved values) and a backward graph (saved values, inputs, seed -> gradients), each built
// by a runtime backend (compiled C++ by default). docs/training.md.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "tessel/driver/train.h"
#include "tessel/ir/graph.h"
#include "tessel/support/tensor.h"

namespace tessel {

struct TrainStepOptions {
  // output and wrt (empty: the lifted float constants); seed is forced on. With several outputs and
  // no TrainOptions::output, the first is differentiated and the others are returned by forward().
  TrainOptions train;
  std::string backend = "compiled";  // compiled | graph | eager
  int threads = 0;                   // compiled: 0 = the machine's hardware threads
};

class TrainStep {
 public:
  // Builds the joint graph of the graph-level `g` (build_train_graph with a seed input), partitions it
  // and compiles both halves. Errors are one-line tessel::Errors (bad wrt, no float output, ...).
  static std::unique_ptr<TrainStep> build(std::unique_ptr<Graph> g, const TrainStepOptions& o);
  ~TrainStep();

  // The joint graph's inputs but the seed, in order: the model's inputs, then the lifted parameters
  // (when TrainOptions::wrt was empty). forward() and backward() take tensors for these.
  const std::vector<std::string>& input_names() const { return inputs_; }
  // Initial values of the lifted parameters (empty when wrt named them).
  const std::vector<Tensor>& initial_parameters() const { return info_.initial; }
  const TrainGraph& info() const { return info_; }
  size_t num_outputs() const { return num_outputs_; }  // forward outputs (then the saved values)
  const Graph& joint_graph() const { return *joint_; }
  const Graph& forward_graph() const { return *fwd_graph_; }
  const Graph& backward_graph() const { return *bwd_graph_; }

  // Runs the forward: returns the model's outputs; `saved` receives what the backward reads.
  std::vector<Tensor> forward(const std::vector<Tensor>& inputs, std::vector<Tensor>& saved);
  // Runs the backward: one gradient per differentiated value (info().parameters order), given the
  // forward's saved tensors, the same inputs and the output's cotangent `seed`.
  std::vector<Tensor> backward(const std::vector<Tensor>& saved, const std::vector<Tensor>& inputs, const Tensor& seed);

 private:
  TrainStep() = default;
  using Runner = std::function<std::vector<Tensor>(const std::vector<Tensor>&)>;
  TrainGraph info_;
  std::vector<std::string> inputs_;
  size_t num_outputs_ = 0;
  std::unique_ptr<Graph> joint_;                  // info_'s partition points into it
  std::unique_ptr<Graph> fwd_graph_, bwd_graph_;  // kept for printing (the compiled runners own copies)
  // Where each backward input after the saved values comes from: an index into inputs_, or -1 (seed).
  std::vector<int> bwd_feeds_;
  Runner run_fwd_, run_bwd_;
  std::shared_ptr<void> keep_;   // the executables the runners call
};

}  // namespace tessel
