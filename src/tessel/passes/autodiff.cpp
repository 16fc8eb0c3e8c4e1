// Reverse-mode autodiff on a core graph: appends the backward (the primitives' rules, autodiff_rules.cpp)
// and the gradient outputs, building the joint forward + backward graph (docs/passes/autodiff.md).
#include "tessel/passes/autodiff.h"

#include <algorithm>
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

using Users = std::unordered_map<const Value*, std::vector<const Node*>>;

Users users_of(const Graph& g) {
  Users u;
  for (const auto& n : g.nodes())
    for (const Value* v : n->inputs)
      if (v) u[v].push_back(n.get());
  for (const Value* v : g.outputs) u[v].push_back(nullptr);  // a graph output: read by the caller
  return u;
}

bool is(const Node* n, CoreOp op) {
  if (!n) return false;
  const std::optional<CoreOp> o = core_op_of(*n);
  return o && *o == op;
}

// The node making v when it is `op`, else null.
const Node* made_by(const Value* v, CoreOp op) { return v && is(v->producer, op) ? v->producer : nullptr; }

// v's users, when they are exactly the nodes given (in any order; null entries ignored).
bool used_only_by(const Users& users, const Value* v, std::vector<const Node*> nodes) {
  auto it = users.find(v);
  if (it == users.end()) return false;
  std::erase(nodes, nullptr);
  std::vector<const Node*> got = it->second;
  std::sort(got.begin(), got.end());
  std::sort(nodes.begin(), nodes.end());
  return got == nodes;
}

// Skips reshapes that only add or drop size-1 dims (each read by nothing else): the value they reshape.
const Value* through_unit_reshapes(const Users& users, const Value* v) {
  while (const Node* r = made_by(v, CoreOp::reshape)) {
    std::vector<int64_t> a, b;
    for (int64_t d : r->inputs[0]->type.shape) if (d != 1) a.push_back(d);
    for (int64_t d : v->type.shape) if (d != 1) b.push_back(d);
    if (a != b || !used_only_by(users, r->inputs[0], {r})) break;
    v = r->inputs[0];
  }
  return v;
}

// v = broadcast_in_dim(u) constant along `axes` of v's shape and equal to u along the others, in order
// (u of the reduced shape, possibly with size-1 dims): the broadcast node, else null.
const Node* broadcast_along(const Value* v, const std::vector<int64_t>& axes) {
  const Node* bc = made_by(v, CoreOp::broadcast_in_dim);
  if (!bc) return nullptr;
  const Shape& in = bc->inputs[0]->type.shape;
  const Shape& out = v->type.shape;
  const std::vector<int64_t> dims = bc->attr_ints("dims");
  if (dims.size() != in.size()) return nullptr;
  std::vector<bool> covered(out.size(), false);
  int64_t last = -1;
  for (size_t i = 0; i < in.size(); ++i) {
    const int64_t d = dims[i];
    if (d < 0 || d >= static_cast<int64_t>(out.size()) || d <= last) return nullptr;
    last = d;
    const bool along = std::binary_search(axes.begin(), axes.end(), d);
    if (in[i] == 1 && (along || out[d] == 1)) continue;   // broadcast (or a unit dim)
    if (along || in[i] != out[d]) return nullptr;
    covered[d] = true;
  }
  for (size_t d = 0; d < out.size(); ++d)
    if (!covered[d] && out[d] != 1 && !std::binary_search(axes.begin(), axes.end(), static_cast<int64_t>(d)))
      return nullptr;
  return bc;
}

std::vector<int64_t> sorted_axes(const Node& reduce) {
  std::vector<int64_t> ax = reduce.attr_ints("axes");
  std::sort(ax.begin(), ax.end());
  return ax;
}

// The reduction of `kind` over `x` whose result, through unit reshapes and a broadcast along its axes, is
// v (each step read only by the next); null otherwise. axes: sorted, empty to take the reduction's.
const Node* unreduced(const Users& users, const Value* v, const Value* x, const char* kind, std::vector<int64_t> axes) {
  const Node* bc = made_by(v, CoreOp::broadcast_in_dim);
  if (!bc || v->type.shape != x->type.shape || !used_only_by(users, bc->inputs[0], {bc})) return nullptr;
  const Node* r = made_by(through_unit_reshapes(users, bc->inputs[0]), CoreOp::reduce);
  if (!r || r->attr_s("kind") != kind || r->inputs[0] != x) return nullptr;
  const std::vector<int64_t> ax = sorted_axes(*r);
  if (!axes.empty() && ax != axes) return nullptr;
  return broadcast_along(v, ax) ? r : nullptr;
}

// The readers of v when they are one node of `first` and at most one of `second` (v its operand 0 and not
// its operand 1); {null, null} when any other node reads v (or a second node of `first`).
std::pair<const Node*, const Node*> two_readers(const Users& users, const Value* v, CoreOp first, CoreOp second) {
  auto it = users.find(v);
  if (it == users.end()) return {nullptr, nullptr};
  const Node* a = nullptr;
  const Node* b = nullptr;
  for (const Node* u : it->second) {
    if (is(u, first) && !a) a = u;
    else if (is(u, second) && u->inputs[0] == v && u->inputs[1] != v && !b) b = u;
    else return {nullptr, nullptr};
  }
  return {a, b};
}

// `z = add(x, neg(broadcast(reduce max(x, A))))` of softmax_core (ops/reduction.cpp), whose z feeds only
// `e = exp(z)`, `s = reduce sum(e, A)` and `e / broadcast(s)` (softmax) or `z - broadcast(log s)` (log
// softmax): the result is the same for any value subtracted along A, so the cotangent of the max is zero
// in exact arithmetic and none is built (jax.nn.softmax's stop_gradient on the max). Differentiating
// through it costs a compare, a count, two sums and a select over x per softmax, and keeps x alive for
// the backward. True when `n` is such a z (its operand 1 gets no cotangent).
bool softmax_shift(const Users& users, const Node& n) {
  if (!is(&n, CoreOp::add) || n.inputs.size() != 2) return false;
  const Value* x = n.inputs[0];
  const Value* z = n.outputs[0];
  const Node* neg = made_by(n.inputs[1], CoreOp::neg);
  if (!neg || !used_only_by(users, neg->outputs[0], {&n}) || !used_only_by(users, neg->inputs[0], {neg})) return false;
  const Node* mx = unreduced(users, neg->inputs[0], x, "max", {});
  if (!mx) return false;
  const std::vector<int64_t> axes = sorted_axes(*mx);
  // z's readers: exp(z), and for log softmax z + (the negated log-sum); e's: the sum, and for softmax e / sum
  const auto [exp, logsub] = two_readers(users, z, CoreOp::exp, CoreOp::add);
  if (!exp) return false;
  const Value* e = exp->outputs[0];
  const auto [sum, div] = two_readers(users, e, CoreOp::reduce, CoreOp::div);
  if (!sum || sum->attr_s("kind") != "sum" || sorted_axes(*sum) != axes) return false;
  if (div && !logsub)   // softmax: e / broadcast(sum(e)), read by nothing else
    return used_only_by(users, div->inputs[1], {div}) && unreduced(users, div->inputs[1], e, "sum", axes) == sum;
  if (logsub && !div) {   // log softmax: z + neg(broadcast(log(sum(e)))), each step read by nothing else
    const Node* nl = made_by(logsub->inputs[1], CoreOp::neg);
    if (!nl || !used_only_by(users, nl->outputs[0], {logsub}) || !used_only_by(users, nl->inputs[0], {nl})) return false;
    const Node* bc = broadcast_along(nl->inputs[0], axes);
    if (!bc || nl->inputs[0]->type.shape != z->type.shape || !used_only_by(users, bc->inputs[0], {bc})) return false;
    const Node* lg = made_by(through_unit_reshapes(users, bc->inputs[0]), CoreOp::log);
    if (!lg || !used_only_by(users, lg->inputs[0], {lg}) || through_unit_reshapes(users, lg->inputs[0]) != sum->outputs[0]) return false;
    const Node* reads_sum = made_by(lg->inputs[0], CoreOp::reshape);   // the unit reshape between them, if any
    return used_only_by(users, sum->outputs[0], {reads_sum ? reads_sum : lg});
  }
  return false;
}

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

  const Users users = users_of(g);   // (the forward's: the backward's nodes are appended after n0)
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
    if (need.size() == 2 && need[1] && softmax_shift(users, *n)) {
      need[1] = false;       // softmax's max: no cotangent (softmax_shift)
      any = need[0];
      ++res.softmax_max_skipped;
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
