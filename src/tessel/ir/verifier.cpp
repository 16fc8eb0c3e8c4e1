// Structural and type checks of a graph.
#include "tessel/ir/verifier.h"

#include <set>

#include "tessel/ir/infer.h"
#include "tessel/ir/op_registry.h"
#include "tessel/support/error.h"

namespace tessel {

namespace {

// Every symbol a type or attribute names is declared in the graph's table, and a symbolic type holds
// a Dim per dim with the static ones also in its shape.
void check_symbols(const Graph& g, const Dims& dims, const std::string& what) {
  for (const Dim& d : dims)
    for (const std::string& s : d.symbols())
      if (!g.symbols.find(s)) fail("{} names the size symbol '{}', which the graph does not declare", what, s);
}

void check_type(const Graph& g, const Value& v) {
  const TensorType& t = v.type;
  if (!t.symbolic()) return;
  const std::string what = fmt::format("the type of '{}'", v.name);
  if (t.sym.size() != t.shape.size() || static_shape(t.sym) != t.shape || dims_static(t.sym))
    fail("{} is inconsistent: dims {} with static shape {}", what, dims_str(t.sym), shape_str(t.shape));
  check_symbols(g, t.sym, what);
}

}  // namespace

void verify_graph(const Graph& g) {
  for (const auto& v : g.values()) {
    try {
      check_type(g, *v);
    } catch (const Error& e) {
      throw e.with_context(Location{.pass = "verify"});
    }
  }
  // Defined values by id (a flag per value of the graph: a set of pointers cost an allocation per value).
  std::vector<char> defined_at(g.values().size(), 0);
  auto own = [&](const Value* v) {
    return v->id >= 0 && static_cast<size_t>(v->id) < g.values().size() && g.values()[static_cast<size_t>(v->id)].get() == v;
  };
  auto defined = [&](const Value* v) { return own(v) && defined_at[static_cast<size_t>(v->id)]; };
  // (false when v was defined before or is not one of this graph's values)
  auto define = [&](const Value* v) {
    if (!own(v) || defined_at[static_cast<size_t>(v->id)]) return false;
    defined_at[static_cast<size_t>(v->id)] = 1;
    return true;
  };
  for (const Value* v : g.inputs) {
    if (!v->is_input) throw Error(Location{.pass = "verify"}, fmt::format("graph input '{}' is not marked as input", v->name));
    if (!own(v)) throw Error(Location{.pass = "verify"}, fmt::format("graph input '{}' is not a value of the graph", v->name));
    define(v);
  }
  for (const Value* c : g.constants()) {
    if (c->constant->dtype() != c->type.dtype || c->constant->shape() != c->type.shape)
      throw Error(Location{.pass = "verify"}, fmt::format("constant '{}' data does not match its type {}", c->name, c->type.str()));
    define(c);
  }
  for (const auto& np : g.nodes()) {
    const Node& n = *np;
    try {
      if (!n.op) fail("has no op");
      const OpDef& d = *n.op;
      const int nin = static_cast<int>(n.inputs.size());
      if (nin < d.min_inputs) fail("has {} inputs, needs at least {}", nin, d.min_inputs);
      if (d.max_inputs >= 0 && nin > d.max_inputs) fail("has {} inputs, takes at most {}", nin, d.max_inputs);
      if (static_cast<int>(n.outputs.size()) > d.max_outputs) fail("has {} outputs, at most {}", n.outputs.size(), d.max_outputs);
      for (int i = 0; i < nin; ++i)
        if (n.inputs[i] && !defined(n.inputs[i]))
          fail("input {} ('{}') is used before it is defined", i, n.inputs[i]->name);
      for (const auto& [name, a] : n.attrs) {
        const AttrSpec* spec = nullptr;
        for (const auto& s : d.attrs)
          if (s.name == name) spec = &s;
        if (!spec) fail("attribute '{}' is not in the op's schema", name);
        const AttrKind kind = static_cast<AttrKind>(a.index());
        if (kind == AttrKind::dims) {
          if (spec->kind != AttrKind::ints) fail("attribute '{}' must be {}", name, attr_kind_name(spec->kind));
          if (dims_static(std::get<Dims>(a))) fail("attribute '{}' holds only static sizes but is not ints", name);
          check_symbols(g, std::get<Dims>(a), fmt::format("attribute '{}'", name));
        } else if (kind != spec->kind) {
          fail("attribute '{}' must be {}", name, attr_kind_name(spec->kind));
        }
      }
      for (const auto& s : d.attrs)
        if (s.required && !n.has_attr(s.name)) fail("missing required attribute '{}'", s.name);
      for (size_t i = 0; i < n.outputs.size(); ++i) {
        const Value* v = n.outputs[i];
        if (!v) continue;
        if (v->producer != &n || v->producer_output != static_cast<int>(i))
          fail("output {} ('{}') does not point back to its node", i, v->name);
        if (!own(v)) fail("output {} ('{}') is not a value of the graph", i, v->name);
        if (!define(v)) fail("output '{}' is defined twice", v->name);
      }
    } catch (const Error& e) {
      // (the node's location is built only for an error: two string copies per node were a tenth of
      // the verifier on a long chain)
      throw e.with_context(Location{.node = n.name, .op = n.op ? n.op->name : "", .pass = "verify"});
    }
  }
  for (const Value* v : g.outputs)
    if (!defined(v)) throw Error(Location{.pass = "verify"}, fmt::format("graph output '{}' is not defined", v->name));
  // Types: re-run every shape rule and compare.
  infer_graph(const_cast<Graph&>(g), 1 << 16, /*verify_only=*/true);
}

}  // namespace tessel
