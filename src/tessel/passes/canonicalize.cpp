// canonicalize: puts core graphs into the forms later passes rely on (docs/ir/core.md, "Canonical
// forms"), so fusion, layout and tiling match one spelling of each idea instead of several:
//   1. a constant whose elements are all equal is a rank-0 constant and a broadcast_in_dim;
//   2. commutative binary ops (add mul max min and or xor, compare eq/ne) take a constant operand
//      second; compare lt/le/gt/ge with a constant first is mirrored (gt ↔ lt, ge ↔ le);
//   3. data movement that only adds, drops or moves size-1 dims is a reshape: a transpose that keeps
//      the order of the other dims, a broadcast_in_dim that adds no elements, a reduce over size-1
//      axes only.
#include <fmt/format.h>

#include <cstring>
#include <map>

#include "tessel/ir/op_registry.h"
#include "tessel/passes/pass.h"
#include "tessel/passes/pass_util.h"

namespace tessel {
namespace {

bool is_known(const Value* v) { return v->constant.has_value() || splat_of(v).has_value(); }

// Rule 3: the non-unit dims of `from` appear in `to` in the same order (only unit dims move).
bool only_unit_dims_move(const Shape& in, const std::vector<int64_t>& order) {
  int64_t last = -1;
  for (int64_t d : order) {
    if (in[d] == 1) continue;
    if (d < last) return false;
    last = d;
  }
  return true;
}

class Canonicalizer {
 public:
  explicit Canonicalizer(Graph& g) : g_(g) {}

  std::string run() {
    unsplat_constants();
    for (const auto& np : g_.nodes())
      if (np->op->domain == "tessel.core") canonicalize(*np);
    return rewrite_note(applied_);
  }

 private:
  // Rule 1. Constants that are graph outputs stay as they are (an output is a value, not a broadcast).
  void unsplat_constants() {
    std::vector<int> uses = g_.use_counts();
    for (Value* c : g_.constants()) {
      if (c->constant->numel() <= 1 || uses[c->id] == 0 || !splat_of(c)) continue;
      if (std::find(g_.outputs.begin(), g_.outputs.end(), c) != g_.outputs.end()) continue;
      Tensor s(c->type.dtype, {});
      std::memcpy(s.bytes(), c->constant->bytes(), static_cast<size_t>(dtype_size(c->type.dtype)));
      Value* scalar = g_.add_constant(g_.unique_name(c->name + ".scalar"), std::move(s));
      Value* full = g_.add_value(g_.unique_name(c->name + ".bcast"), c->type);
      auto n = std::make_unique<Node>();
      n->op = OpRegistry::get().find("broadcast_in_dim");
      n->name = c->name;
      n->inputs = {scalar};
      n->outputs = {full};
      n->attrs = {{"shape", std::vector<int64_t>(c->type.shape)}, {"dims", std::vector<int64_t>{}}};
      full->producer = n.get();
      g_.replace_all_uses(c, full);
      // Placed first: its operand is a constant, so the order stays topological.
      g_.mutable_nodes().insert(g_.mutable_nodes().begin(), std::move(n));
      ++applied_["splat constant → scalar + broadcast"];
    }
  }

  void canonicalize(Node& n) {
    const std::string& op = n.op->name;
    if (n.inputs.size() == 2 && is_known(n.inputs[0]) && !is_known(n.inputs[1])) {
      static const std::map<std::string, std::string> mirrored = {
          {"eq", "eq"}, {"ne", "ne"}, {"lt", "gt"}, {"gt", "lt"}, {"le", "ge"}, {"ge", "le"}};
      bool commutative = op == "add" || op == "mul" || op == "max" || op == "min" || op == "and" ||
                         op == "or" || op == "xor";
      if (commutative || op == "compare") {
        std::swap(n.inputs[0], n.inputs[1]);
        if (op == "compare") n.attrs["direction"] = mirrored.at(n.attr_s("direction"));
        ++applied_["constant operand second"];
      }
    }
    const Shape& in = n.inputs.empty() ? Shape{} : n.inputs[0]->type.shape;
    const Shape& out = n.outputs[0] ? n.outputs[0]->type.shape : Shape{};
    bool to_reshape = false;
    if (op == "transpose") to_reshape = only_unit_dims_move(in, n.attr_ints("perm"));
    if (op == "broadcast_in_dim") to_reshape = shape_numel(in) == shape_numel(out) && !in.empty();
    if (op == "reduce") {
      to_reshape = true;
      for (int64_t a : n.attr_ints("axes")) to_reshape = to_reshape && in[a] == 1;
    }
    if (to_reshape) {
      n.op = OpRegistry::get().find("reshape");
      n.attrs = {{"shape", std::vector<int64_t>(out)}};
      ++applied_["unit-dim movement → reshape"];
    }
  }

  Graph& g_;
  std::map<std::string, int> applied_;
};

}  // namespace

std::string canonicalize(Graph& g) {
  std::string note = Canonicalizer(g).run();
  g.compact();
  return note;
}

}  // namespace tessel
