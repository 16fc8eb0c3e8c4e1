// Eager execution of a graph with the reference kernels.
#include "tessel/runtime/interpreter.h"

#include "tessel/ir/bind.h"
#include "tessel/runtime/graph_backend.h"
#include "tessel/ir/infer.h"
#include "tessel/ir/op_registry.h"
#include "tessel/support/error.h"

namespace tessel {

std::vector<Tensor> run_eager(const Graph& g, const std::vector<Tensor>& inputs, RunStats* stats) {
  if (inputs.size() != g.inputs.size())
    fail("the model takes {} inputs but {} were given", g.inputs.size(), inputs.size());
  // Size symbols (docs/dynamic-shapes.md) take their values from the inputs: the graph of that binding runs.
  if (!graph_symbols(g).empty()) {
    std::vector<Shape> shapes;
    for (const Tensor& t : inputs) shapes.push_back(t.shape());
    Bindings b;
    if (std::string why = bind_symbols(g, shapes, b); !why.empty()) throw GuardFailure(Location{.pass = "guard"}, why);
    return run_eager(*instantiate_graph(g, b), inputs, stats);
  }
  std::vector<Tensor> env(g.values().size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    const Value* v = g.inputs[i];
    const Tensor& t = inputs[i];
    if (t.dtype() != v->type.dtype)
      fail("input '{}' must be {} but got {}", v->name, v->type.str(), TensorType{t.dtype(), t.shape()}.str());
    bool ok = t.rank() == static_cast<int>(v->type.shape.size());
    for (int d = 0; ok && d < t.rank(); ++d) ok = v->type.shape[d] < 0 || v->type.shape[d] == t.dim(d);
    if (!ok) fail("input '{}' must have shape {} but got {}", v->name, shape_str(v->type.shape), shape_str(t.shape()));
    env[v->id] = t;
  }
  // Last use of each value, so intermediates can be freed early.
  const auto& nodes = g.nodes();
  std::vector<int> last_use(g.values().size(), -1);
  for (size_t k = 0; k < nodes.size(); ++k)
    for (const Value* v : nodes[k]->inputs)
      if (v) last_use[v->id] = static_cast<int>(k);
  for (const Value* v : g.outputs) last_use[v->id] = static_cast<int>(nodes.size());

  size_t live = 0, peak = 0;
  for (size_t k = 0; k < nodes.size(); ++k) {
    const Node& n = *nodes[k];
    std::vector<const Tensor*> ins;
    for (const Value* v : n.inputs) {
      if (!v) {
        ins.push_back(nullptr);
      } else if (v->constant) {
        ins.push_back(&*v->constant);
      } else {
        if (!env[v->id].valid())
          throw Error(Location{.node = n.name, .op = n.op->name, .pass = "run"},
                      fmt::format("input '{}' has no value (graph not in topological order)", v->name));
        ins.push_back(&env[v->id]);
      }
    }
    std::vector<Tensor> outs = run_node(n, ins);
    for (size_t i = 0; i < outs.size(); ++i)
      if (n.outputs[i]) {
        live += outs[i].nbytes();
        env[n.outputs[i]->id] = std::move(outs[i]);
      }
    peak = std::max(peak, live);
    for (const Value* v : n.inputs)
      if (v && !v->constant && !v->is_input && last_use[v->id] == static_cast<int>(k) && env[v->id].valid()) {
        live -= env[v->id].nbytes();
        env[v->id] = Tensor();
      }
    for (const Value* v : n.outputs)
      if (v && last_use[v->id] < 0) {
        live -= env[v->id].nbytes();
        env[v->id] = Tensor();
      }
  }
  if (stats) stats->peak_bytes = peak;
  std::vector<Tensor> out;
  for (const Value* v : g.outputs) out.push_back(v->constant ? *v->constant : env[v->id]);
  return out;
}

}  // namespace tessel
