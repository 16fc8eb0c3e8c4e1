// Building a model's training (joint forward + backward) graph at the core level.
#include "tessel/driver/train.h"

#include <fmt/format.h>

#include "tessel/passes/pass.h"
#include "tessel/support/error.h"

namespace tessel {

TrainGraph build_train_graph(Graph& g, const TrainOptions& o) {
  TrainGraph t;
  // Parameters become inputs before decomposition: folding would otherwise merge a weight into the
  // constants derived from it (a transposed copy), and its gradient would have nowhere to go.
  if (o.wrt.empty()) {
    for (LiftedParameter& p : lift_parameters(g)) {
      t.parameters.push_back(p.name);
      t.initial.push_back(std::move(p.value));
    }
    if (t.parameters.empty()) fail("graph '{}' has no float constant with more than one element to train", g.name);
  } else {
    t.parameters = o.wrt;
  }
  run_pipeline(g, parse_pipeline("core"), PassOptions{});
  for (const std::string& p : t.parameters)
    if (const Value* v = g.find_value(p)) t.parameter_elements += shape_numel(v->type.shape);
  AutodiffOptions ao;
  ao.output = o.output;
  ao.wrt = t.parameters;
  const Value* out = nullptr;
  if (ao.output.empty() && g.outputs.size() == 1) out = g.outputs[0];
  for (const Value* v : g.outputs)
    if (v->name == ao.output) out = v;
  ao.seed = o.seed || (out && shape_numel(out->type.shape) != 1);
  t.output = out ? out->name : o.output;
  const size_t num_forward = g.outputs.size();
  t.autodiff = build_joint_graph(g, ao);
  run_pipeline(g, parse_pipeline("simplify"), PassOptions{});
  name_gradient_outputs(g, t.autodiff);
  t.forward_nodes = count_forward_nodes(g, num_forward);
  t.backward_nodes = g.nodes().size() - t.forward_nodes;
  t.saved = saved_activations(g, num_forward);
  t.partition = partition_for_remat(g, num_forward);
  return t;
}

std::string train_summary(const TrainGraph& t) {
  return fmt::format(
      "train: {} parameters ({} elements), {} gradient outputs of '{}'{}; joint graph {} nodes: {} forward, {} "
      "backward (autodiff added {} before simplify); the backward reads {} forward results ({:.3f} MB); "
      "min-cut partition: saves {} ({:.3f} MB), recomputes {} nodes",
      t.parameters.size(), t.parameter_elements, t.autodiff.gradients.size(), t.output,
      t.autodiff.seed_input.empty() ? "" : fmt::format(" seeded by input '{}'", t.autodiff.seed_input),
      t.forward_nodes + t.backward_nodes, t.forward_nodes, t.backward_nodes, t.autodiff.backward_nodes,
      t.saved.tensors, static_cast<double>(t.saved.bytes) / 1e6, t.partition.saved.size(),
      static_cast<double>(t.partition.saved_bytes) / 1e6, t.partition.recomputed.size());
}

}  // namespace tessel
