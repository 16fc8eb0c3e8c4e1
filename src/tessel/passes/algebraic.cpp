// algebraic: local rewrites of core ops that never change a result (docs/passes/algebraic.md):
// identities (x·1, x+0, x/1, −(−x), pow(x, 1)), chains that collapse (transpose∘transpose,
// reshape∘reshape, broadcast∘broadcast, widening convert chains), ops that do nothing (identity
// transpose, reshape to the same shape, a whole-tensor slice, select on a constant predicate), and
// elementwise math on broadcast scalars, which moves in front of the broadcast so fold-constants can
// evaluate it on one element. One forward walk reaches a fixpoint: every node's inputs are already
// simplified when it is visited, and a rewrite edits the node in place or forwards its uses.
#include <fmt/format.h>

#include <cstring>
#include <map>

#include "tessel/ir/infer.h"
#include "tessel/ir/op_registry.h"
#include "tessel/passes/pass.h"
#include "tessel/passes/pass_util.h"

namespace tessel {
namespace {

const Node* producer_is(const Value* v, const char* op) { return core_producer(v, op); }

}  // namespace

namespace {

class Simplifier {
 public:
  explicit Simplifier(Graph& g) : g_(g) {}

  std::string run() {
    for (k_ = 0; k_ < g_.nodes().size(); ++k_) {
      Node& n = *g_.mutable_nodes()[k_];
      if (n.op->domain != "tessel.core") continue;
      if (const char* rule = simplify(n)) ++applied_[rule];
    }
    return rewrite_note(applied_);
  }

 private:
  // Returns the rule's name when the node was rewritten.
  const char* simplify(Node& n) {
    const std::string& op = n.op->name;
    Value* out = n.outputs.empty() ? nullptr : n.outputs[0];
    if (!out) return nullptr;
    auto in = [&](int i) { return n.inputs[i]; };

    if (op == "add" && splat_of(in(1)) == 0.0 && forward(out, in(0))) return "x+0";
    if (op == "add" && splat_of(in(0)) == 0.0 && forward(out, in(1))) return "x+0";
    if (op == "mul" && splat_of(in(1)) == 1.0 && forward(out, in(0))) return "x*1";
    if (op == "mul" && splat_of(in(0)) == 1.0 && forward(out, in(1))) return "x*1";
    if (op == "div" && is_float(out->type.dtype) && splat_of(in(1)) == 1.0 && forward(out, in(0))) return "x/1";
    if (op == "pow" && splat_of(in(1)) == 1.0 && forward(out, in(0))) return "pow(x,1)";
    if (op == "pow" && is_float(out->type.dtype) && splat_of(in(1)) == 2.0) {
      // x² is exact as x·x in the wider compute type, and cheaper everywhere.
      n.op = OpRegistry::get().find("mul");
      n.inputs[1] = n.inputs[0];
      return "pow(x,2)";
    }
    if ((op == "max" || op == "min" || op == "and" || op == "or") && in(0) == in(1) && forward(out, in(0)))
      return "idempotent";
    if (op == "neg") {
      if (const Node* p = producer_is(in(0), "neg"); p && forward(out, p->inputs[0])) return "-(-x)";
    }
    if (op == "select") {
      if (in(1) == in(2) && forward(out, in(1))) return "select(p,x,x)";
      auto p = splat_of(in(0));
      if (p && forward(out, *p != 0 ? in(1) : in(2))) return "select(const)";
    }
    if (op == "transpose") return simplify_transpose(n);
    if (op == "reshape") return simplify_reshape(n);
    if (op == "broadcast_in_dim") return simplify_broadcast(n);
    if (op == "convert") return simplify_convert(n);
    if (op == "slice" || op == "concatenate" || op == "reduce" || op == "pad")
      if (in(0)->type == out->type && is_noop_copy(n) && forward(out, in(0))) return "no-op";
    if (n.op->fusion == FusionKind::pointwise && !n.inputs.empty() && !out->type.shape.empty()) return sink_scalar_broadcasts(n);
    return nullptr;
  }

  const char* simplify_transpose(Node& n) {
    std::vector<int64_t> perm = n.attr_ints("perm");
    if (const Node* p = producer_is(n.inputs[0], "transpose")) {
      std::vector<int64_t> inner = p->attr_ints("perm"), composed(perm.size());
      for (size_t i = 0; i < perm.size(); ++i) composed[i] = inner[perm[i]];
      n.inputs[0] = p->inputs[0];
      n.attrs["perm"] = perm = composed;
      if (!is_identity(perm)) return "transpose∘transpose";
    }
    if (is_identity(perm) && forward(n.outputs[0], n.inputs[0])) return "transpose∘transpose";
    return nullptr;
  }

  const char* simplify_reshape(Node& n) {
    const char* rule = nullptr;
    if (const Node* p = producer_is(n.inputs[0], "reshape")) {
      n.inputs[0] = p->inputs[0];
      rule = "reshape∘reshape";
    }
    if (n.inputs[0]->type.shape == n.outputs[0]->type.shape && forward(n.outputs[0], n.inputs[0]))
      return "reshape∘reshape";
    return rule;
  }

  const char* simplify_broadcast(Node& n) {
    std::vector<int64_t> dims = n.attr_ints("dims");
    const char* rule = nullptr;
    if (const Node* p = producer_is(n.inputs[0], "broadcast_in_dim")) {
      // Operand dim i of the inner broadcast lands at inner_dims[i], which this one maps to dims[...].
      std::vector<int64_t> inner = p->attr_ints("dims"), composed;
      for (int64_t d : inner) composed.push_back(dims[d]);
      n.inputs[0] = p->inputs[0];
      n.attrs["dims"] = dims = composed;
      rule = "broadcast∘broadcast";
    }
    if (const Node* p = producer_is(n.inputs[0], "reshape")) {
      // A reshape that only inserts or drops size-1 dims (the keepdims of a reduction) folds into the
      // broadcast: each non-unit source dim keeps its place in order.
      const Shape& src = p->inputs[0]->type.shape;
      const Shape& mid = n.inputs[0]->type.shape;
      std::vector<int64_t> composed;
      size_t j = 0;
      bool ok = true;
      for (size_t i = 0; i < src.size() && ok; ++i) {
        if (src[i] == 1) {  // a unit source dim may go anywhere a broadcast can put it
          while (j < mid.size() && mid[j] != 1) ++j;
        } else {
          while (j < mid.size() && mid[j] == 1) ++j;
          ok = j < mid.size() && mid[j] == src[i];
        }
        if (j >= mid.size()) ok = false;
        if (ok) composed.push_back(dims[j++]);
      }
      for (; ok && j < mid.size(); ++j) ok = mid[j] == 1;
      if (ok) {
        n.inputs[0] = p->inputs[0];
        n.attrs["dims"] = dims = composed;
        rule = "broadcast∘reshape";
      }
    }
    if (n.inputs[0]->type.shape == n.outputs[0]->type.shape && is_identity(dims) &&
        forward(n.outputs[0], n.inputs[0]))
      return "broadcast to the same shape";
    return rule;
  }

  const char* simplify_convert(Node& n) {
    Value* x = n.inputs[0];
    const DType to = n.outputs[0]->type.dtype;
    if (x->type.dtype == to && forward(n.outputs[0], x)) return "convert to the same type";
    const Node* p = producer_is(x, "convert");
    if (!p || !converts_exactly(p->inputs[0]->type.dtype, x->type.dtype)) return nullptr;
    // The inner convert lost nothing, so converting its source directly gives the same values.
    n.inputs[0] = p->inputs[0];
    if (n.inputs[0]->type.dtype == to) forward(n.outputs[0], n.inputs[0]);
    return "convert chain";
  }

  // op(broadcast(a), broadcast(b), ...) with every operand a broadcast of a rank-0 value (or a
  // splat constant) → broadcast(op(a, b, ...)): the math runs once instead of once per element.
  const char* sink_scalar_broadcasts(Node& n) {
    std::vector<Value*> scalars;
    for (Value* v : n.inputs) {
      Value* s = scalar_source(v);
      if (!s) return nullptr;
      scalars.push_back(s);
    }
    Value* out = n.outputs[0];
    Value* r = g_.add_value(g_.unique_name(out->name + ".scalar"), TensorType{out->type.dtype, {}});
    auto scalar_node = std::make_unique<Node>();
    scalar_node->op = n.op;
    scalar_node->name = n.name;
    scalar_node->inputs = scalars;
    scalar_node->outputs = {r};
    scalar_node->attrs = n.attrs;
    r->producer = scalar_node.get();
    // The original node becomes the broadcast, so its output value (and name) stays where it is.
    n.op = OpRegistry::get().find("broadcast_in_dim");
    n.inputs = {r};
    n.attrs = {{"shape", std::vector<int64_t>(out->type.shape)}, {"dims", std::vector<int64_t>{}}};
    // The scalar op goes in front of the node (this walk then revisits the broadcast, a no-op).
    auto& nodes = g_.mutable_nodes();
    nodes.insert(nodes.begin() + static_cast<long>(k_), std::move(scalar_node));
    return "elementwise on broadcast scalars";
  }

  // The rank-0 value `v` broadcasts (v itself when rank 0), or a new rank-0 constant when `v` is a
  // splat constant; null otherwise.
  Value* scalar_source(Value* v) {
    if (v->type.shape.empty()) return v;
    if (const Node* p = producer_is(v, "broadcast_in_dim"); p && p->inputs[0]->type.shape.empty()) return p->inputs[0];
    if (v->constant && v->constant->numel() > 0 && splat_of(v)) {
      Tensor s = Tensor(v->type.dtype, {});
      std::memcpy(s.bytes(), v->constant->bytes(), dtype_size(v->type.dtype));
      return g_.add_constant(g_.unique_name(v->name + ".scalar"), std::move(s));
    }
    return nullptr;
  }

  bool is_noop_copy(const Node& n) {
    const std::string& op = n.op->name;
    if (op == "concatenate") return n.inputs.size() == 1;
    if (op == "reduce") return n.attr_ints("axes").empty();
    if (op == "slice") {
      auto st = n.attr_ints("starts"), sp = n.attr_ints("stops");
      auto str = n.attr_ints("strides", std::vector<int64_t>(st.size(), 1));
      for (size_t d = 0; d < st.size(); ++d)
        if (st[d] != 0 || str[d] != 1 || sp[d] != n.inputs[0]->type.shape[d]) return false;
      return true;
    }
    if (op == "pad") {
      for (const char* a : {"low", "high", "interior"})
        for (int64_t v : n.attr_ints(a, {}))
          if (v != 0) return false;
      return true;
    }
    return false;
  }

  bool forward(Value* from, Value* to) { return forward_uses(g_, from, to); }

  Graph& g_;
  std::map<std::string, int> applied_;
  size_t k_ = 0;  // index of the node being visited
};

}  // namespace

std::string simplify_algebra(Graph& g) {
  std::string note = Simplifier(g).run();
  g.compact();
  return note;
}

}  // namespace tessel
