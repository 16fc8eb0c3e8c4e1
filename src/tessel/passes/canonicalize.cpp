// canonicalize: puts core graphs into the forms later passes rely on (docs/ir/core.md, "Canonical
// forms"), so fusion, layout and tiling match one spelling of each idea instead of several:
//   1. a constant whose elements are all equal is a rank-0 constant and a broadcast_in_dim;
//   2. commutative binary ops (add mul max min and or xor, compare eq/ne) take a constant operand
//      second; compare lt/le/gt/ge with a constant first is mirrored (gt ↔ lt, ge ↔ le);
//   3. data movement that only adds, drops or moves size-1 dims is a reshape: a transpose that keeps
//      the order of the other dims, a broadcast_in_dim that adds no elements, a reduce over size-1
//      axes only.
// Rule 1 edits constants before the walk; rules 2 and 3 are rules for the shared driver (rewrite.h).
#include <algorithm>
#include <cstring>
#include <map>

#include "tessel/ir/op_registry.h"
#include "tessel/passes/pass.h"
#include "tessel/passes/pass_util.h"
#include "tessel/passes/rewrite.h"

namespace tessel {
namespace {

bool is_known(const Value* v) { return v->constant.has_value() || splat_of(v).has_value(); }

// Rule 1. Constants that are graph outputs stay as they are (an output is a value, not a broadcast).
// Constants are not nodes, so this runs before the rule walk, counted by the same Rewriter.
void unsplat_constants(Rewriter& r) {
  Graph& g = r.graph();
  std::vector<int> uses = g.use_counts();
  for (Value* c : g.constants()) {
    if (c->constant->numel() <= 1 || uses[c->id] == 0 || !splat_of(c)) continue;
    if (std::find(g.outputs.begin(), g.outputs.end(), c) != g.outputs.end()) continue;
    Tensor s(c->type.dtype, {});
    std::memcpy(s.bytes(), c->constant->bytes(), static_cast<size_t>(dtype_size(c->type.dtype)));
    Value* scalar = g.add_constant(g.unique_name(c->name + ".scalar"), std::move(s));
    Value* full = g.add_value(g.unique_name(c->name + ".bcast"), c->type);
    auto n = std::make_unique<Node>();
    n->op = OpRegistry::get().find("broadcast_in_dim");
    n->name = c->name;
    n->inputs = {scalar};
    n->outputs = {full};
    n->attrs = {{"shape", std::vector<int64_t>(c->type.shape)}, {"dims", std::vector<int64_t>{}}};
    full->producer = n.get();
    g.replace_all_uses(c, full);
    // Placed first: its operand is a constant, so the order stays topological.
    g.mutable_nodes().insert(g.mutable_nodes().begin(), std::move(n));
    r.count("splat constant → scalar + broadcast");
  }
}

// Rule 2: a known operand first, an unknown one second.
bool constant_first(const Node& n) {
  return n.inputs.size() == 2 && is_known(n.inputs[0]) && !is_known(n.inputs[1]);
}

bool swap_operands(Rewriter&, Node& n) {
  std::swap(n.inputs[0], n.inputs[1]);
  return true;
}

bool swap_compare(Rewriter&, Node& n) {
  static const std::map<std::string, std::string> mirrored = {
      {"eq", "eq"}, {"ne", "ne"}, {"lt", "gt"}, {"gt", "lt"}, {"le", "ge"}, {"ge", "le"}};
  std::swap(n.inputs[0], n.inputs[1]);
  n.attrs["direction"] = mirrored.at(n.attr_s("direction"));
  return true;
}

// Rule 3: the non-unit dims of `in` appear in `order` in the same order (only unit dims move).
// (A symbolic dim is never 1: it may be more.)
bool only_unit_dims_move(const Dims& in, const std::vector<int64_t>& order) {
  int64_t last = -1;
  for (int64_t d : order) {
    if (in[d] == 1) continue;
    if (d < last) return false;
    last = d;
  }
  return true;
}

bool transpose_moves_unit_dims(const Node& n) {
  return only_unit_dims_move(n.inputs[0]->type.dims(), n.attr_ints("perm"));
}

bool broadcast_adds_nothing(const Node& n) {
  const Dims in = n.inputs[0]->type.dims();
  return !in.empty() && dims_numel(in) == dims_numel(n.outputs[0]->type.dims());
}

bool reduce_over_unit_dims(const Node& n) {
  const Dims in = n.inputs[0]->type.dims();
  for (int64_t a : n.attr_ints("axes"))
    if (!(in[static_cast<size_t>(a)] == 1)) return false;
  return true;
}

bool to_reshape(Rewriter&, Node& n) {
  n.op = OpRegistry::get().find("reshape");
  n.attrs = {{"shape", dims_attr(n.outputs[0]->type.dims())}};
  return true;
}

const std::vector<RewriteRule>& canonical_forms() {
  static const std::vector<RewriteRule> rules = {
      {"constant operand second", {CoreOp::add, CoreOp::mul, CoreOp::max, CoreOp::min, CoreOp::and_, CoreOp::or_, CoreOp::xor_}, constant_first, swap_operands},
      {"constant operand second", {CoreOp::compare}, constant_first, swap_compare},
      {"unit-dim movement → reshape", {CoreOp::transpose}, transpose_moves_unit_dims, to_reshape},
      {"unit-dim movement → reshape", {CoreOp::broadcast_in_dim}, broadcast_adds_nothing, to_reshape},
      {"unit-dim movement → reshape", {CoreOp::reduce}, reduce_over_unit_dims, to_reshape},
  };
  return rules;
}

}  // namespace

std::string canonicalize(Graph& g) {
  Rewriter r(g);
  unsplat_constants(r);
  r.apply(canonical_forms());
  g.compact();
  return r.note();
}

}  // namespace tessel
