// Optimizer steps as core graphs (SGD with momentum, AdamW with PyTorch's formulas): one graph over all
// parameters, compiled by a backend like any model (each parameter's update fuses into one loop
// kernel). docs/training.md, "Optimizer graphs".
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "tessel/ir/graph.h"

namespace tessel {

struct OptimizerSpec {
  std::string kind = "adamw";        // adamw | sgd
  std::vector<Shape> shapes;         // one per parameter (f32)
  // Fixed in the graph (a change is a new graph):
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;  // adamw
  double momentum = 0, dampening = 0;             // sgd
  bool nesterov = false;                          // sgd
  double weight_decay = 0;  // adamw: decoupled (p *= 1 - lr wd, an input); sgd: g += wd p
};

// The graph's inputs, in order: the scalars (f32[]) optimizer_scalars() names, then per parameter
// p, g and its state (adamw: m, v; sgd with momentum: buf). Outputs per parameter: the new p, then the
// new state, in the same order. The returned graph is at the core level.
std::unique_ptr<Graph> build_optimizer_graph(const OptimizerSpec& s);

// Per output of the graph, the input it updates in place (GraphBackendOptions::output_aliases): the
// new p is written over p, the new state over the state, so a compiled step reads and writes the
// caller's parameters and state directly (one read and one write per tensor, no copies).
std::vector<int> optimizer_output_aliases(const OptimizerSpec& s);

// The scalar inputs of the optimizer graph, which change from step to step:
//   adamw: decay = 1 - lr wd, step_size = lr / (1 - beta1^t), bc2_sqrt = sqrt(1 - beta2^t)
//   sgd:   lr, mom = momentum (0 on the first step: buf = d), damp = 1 - dampening (1 on the first step)
std::vector<std::string> optimizer_scalars(const std::string& kind);
// Tensors of state per parameter: adamw 2, sgd 1 with momentum, else 0.
int optimizer_state_count(const OptimizerSpec& s);
// The scalar inputs' values for step t (1-based), lr as given: PyTorch's arithmetic, in double.
std::vector<double> optimizer_scalar_values(const OptimizerSpec& s, double lr, int64_t t);

}  // namespace tessel
