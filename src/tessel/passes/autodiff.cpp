// Reverse-mode autodiff on a core graph: appends the backward (the primitives' rules, autodiff_rules.cpp)
// and the gradient outputs, building the joint forward + backward graph (docs/passes/autodiff.md).
#include "tessel/passes/autodiff.h"

#include <unordered_map>
#include <unordered_set>

#include "tessel/ir/core_builder.h"
#include "tessel/ir/core_ops.h"
#include "tessel/support/error.h"

namespace tessel {
namespace {

bool is_float_value(const Value* v) { return v && is_float(v->type.dtype); }

Value* resolve_output(const Graph& g, const std::string& name) {
  if (name.empty()) {
    if (g.outputs.size() != 1)
      fail("graph '{}' has {} outputs: name the one to differentiate", g.name, g.outputs.size());
    return g.outputs[0];
  }
  for (Value* v : g.outputs)
    if (v->name == name) return v;
  fail("'{}' is not an output of graph '{}'", name, g.name);
}

// A CoreBuilder whose nodes carry `n`'s provenance and whose values are named "<result>.bwd.<op>".
struct BackwardOrigin {
  Value named;
  Node node;
  BackwardOrigin(const std::string& node_name, const std::string& value_name) {
    named.name = value_name + ".bwd";
    node.name = node_name;
    node.outputs = {&named};
  }
};

}  // namespace

AutodiffResult build_joint_graph(Graph& g, const AutodiffOptions& o) {
  AutodiffResult res;
  res.forward_nodes = g.nodes().size();
  Value* out = resolve_output(g, o.output);
  if (!is_float_value(out))
    fail("output '{}' is {}: only a float output can be differentiated", out->name, out->type.str());
  if (!o.seed && shape_numel(out->type.shape) != 1)
    fail("output '{}' is {}, not a scalar: differentiate a loss (one element) or give a seed for its cotangent",
         out->name, out->type.str());
  if (o.wrt.empty()) fail("nothing to differentiate with respect to (no parameters or inputs named)");

  std::vector<Value*> wrt;
  for (const std::string& w : o.wrt) {
    Value* v = g.find_value(w);
    if (!v) fail("'{}' is not a value of graph '{}'", w, g.name);
    if (!v->is_input && !v->constant)
      fail("'{}' is computed by a node: differentiate with respect to inputs or constants", w);
    if (!is_float_value(v)) fail("'{}' is {}: only float inputs and constants have gradients", w, v->type.str());
    wrt.push_back(v);
  }

  // Values that depend on a wrt value through floats: only they need cotangents.
  std::unordered_set<const Value*> active(wrt.begin(), wrt.end());
  for (const auto& n : g.nodes()) {
    bool any = false;
    for (const Value* v : n->inputs) any = any || (v && active.count(v) && is_float_value(v));
    if (any)
      for (const Value* v : n->outputs)
        if (is_float_value(v)) active.insert(v);
  }

  std::unordered_map<const Value*, Value*> ct;
  BackwardOrigin root("autodiff", out->name);
  CoreBuilder rb(g, root.node);
  if (o.seed) {
    Value* s = g.add_input(g.unique_name(out->name + ".seed"), out->type);
    res.seed_input = s->name;
    ct[out] = s;
  } else {
    ct[out] = rb.full(out->type.dtype, out->type.shape, 1.0);
  }

  const size_t n0 = g.nodes().size();
  for (size_t i = n0; i-- > 0;) {
    Node* n = g.nodes()[i].get();  // by index: the rules append nodes to the same vector
    std::vector<Value*> out_ct;
    bool have = false;
    for (const Value* v : n->outputs) {
      auto it = ct.find(v);
      out_ct.push_back(it == ct.end() ? nullptr : it->second);
      have = have || it != ct.end();
    }
    if (!have) continue;
    std::vector<bool> need;
    bool any = false;
    for (const Value* v : n->inputs) {
      need.push_back(v && active.count(v) && is_float_value(v));
      any = any || need.back();
    }
    if (!any) continue;
    const std::optional<CoreOp> op = core_op_of(*n);
    if (!op)
      fail("node '{}' ({}) is not a core primitive: run the core pipeline before autodiff", n->name, n->op_name());
    if (core_op_info(*op).vjp == Vjp::none)
      fail("node '{}' ({}) has no derivative, and a gradient must flow through it to '{}'", n->name, n->op_name(),
           n->inputs[0]->name);
    BackwardOrigin origin(n->name, n->outputs[0]->name);
    CoreBuilder b(g, origin.node);
    std::vector<Value*> in_ct = core_vjp(b, *n, out_ct, need);
    for (size_t j = 0; j < n->inputs.size() && j < in_ct.size(); ++j) {
      if (!in_ct[j] || !need[j]) continue;
      Value* v = n->inputs[j];
      if (in_ct[j]->type.shape != v->type.shape || in_ct[j]->type.dtype != v->type.dtype)
        fail("node '{}' ({}): the rule gave operand {} a cotangent of type {}, not {}", n->name, n->op_name(), j,
             in_ct[j]->type.str(), v->type.str());
      auto it = ct.find(v);
      ct[v] = it == ct.end() ? in_ct[j] : b.add(it->second, in_ct[j]);
    }
  }

  for (Value* w : wrt) {
    auto it = ct.find(w);
    BackwardOrigin origin("autodiff", w->name);
    CoreBuilder b(g, origin.node);
    Value* grad = it == ct.end() ? b.full(w->type.dtype, w->type.shape, 0.0) : it->second;
    g.outputs.push_back(grad);
    res.gradients.push_back(w->name + ".grad");
  }
  res.backward_nodes = g.nodes().size() - res.forward_nodes;
  name_gradient_outputs(g, res);
  return res;
}

int name_gradient_outputs(Graph& g, const AutodiffResult& r) {
  const size_t first = g.outputs.size() - r.gradients.size();
  int renamed = 0;
  for (size_t k = 0; k < r.gradients.size(); ++k) {
    Value* v = g.outputs[first + k];
    if (v->name == r.gradients[k] || v->is_input || v->constant || !v->producer) continue;
    bool shared = false;
    for (size_t j = 0; j < g.outputs.size(); ++j) shared = shared || (j != first + k && g.outputs[j] == v);
    if (!shared && g.rename_value(v, r.gradients[k])) ++renamed;
  }
  return renamed;
}

std::vector<LiftedParameter> lift_parameters(Graph& g) {
  std::vector<LiftedParameter> lifted;
  for (Value* v : g.constants()) {
    if (!v->constant || !is_float(v->type.dtype) || shape_numel(v->type.shape) <= 1) continue;
    lifted.push_back({v->name, std::move(*v->constant)});
    v->constant.reset();
    v->is_input = true;
    g.inputs.push_back(v);
  }
  return lifted;
}

namespace {

// Marks the nodes the first `num_forward_outputs` outputs need.
std::vector<bool> forward_mask(const Graph& g, size_t num_forward_outputs) {
  std::unordered_set<const Value*> needed;
  for (size_t i = 0; i < num_forward_outputs && i < g.outputs.size(); ++i) needed.insert(g.outputs[i]);
  std::vector<bool> fwd(g.nodes().size(), false);
  for (size_t i = g.nodes().size(); i-- > 0;) {
    const Node& n = *g.nodes()[i];
    for (const Value* v : n.outputs) fwd[i] = fwd[i] || needed.count(v);
    if (!fwd[i]) continue;
    for (const Value* v : n.inputs)
      if (v) needed.insert(v);
  }
  return fwd;
}

}  // namespace

size_t count_forward_nodes(const Graph& g, size_t num_forward_outputs) {
  size_t count = 0;
  for (bool f : forward_mask(g, num_forward_outputs)) count += f;
  return count;
}

SavedActivations saved_activations(const Graph& g, size_t num_forward_outputs) {
  const std::vector<bool> fwd = forward_mask(g, num_forward_outputs);
  std::unordered_set<const Value*> produced, saved;
  for (size_t i = 0; i < fwd.size(); ++i)
    if (fwd[i])
      for (const Value* v : g.nodes()[i]->outputs) produced.insert(v);
  SavedActivations s;
  for (size_t i = 0; i < fwd.size(); ++i) {
    if (fwd[i]) continue;
    for (const Value* v : g.nodes()[i]->inputs)
      if (v && produced.count(v) && saved.insert(v).second) {
        ++s.tensors;
        s.bytes += shape_numel(v->type.shape) * static_cast<int64_t>(dtype_size(v->type.dtype));
      }
  }
  return s;
}

}  // namespace tessel
