// Binding size symbols (see bind.h).
#include "tessel/ir/bind.h"

#include <fmt/format.h>

#include <map>
#include <set>

#include "tessel/support/error.h"
#include "tessel/support/escape.h"

namespace tessel {

namespace {

// The one symbol a dim consists of (coefficient 1, degree 1, no constant), if it is one.
std::optional<std::string> bare_symbol(const Dim& d) {
  if (d.is_static() || d.constant_term() != 0 || d.terms().size() != 1) return std::nullopt;
  const Dim::Term& t = d.terms()[0];
  if (t.coef != 1 || t.syms.size() != 1) return std::nullopt;
  return t.syms[0];
}

Dims substitute_dims(const Dims& ds, const Bindings& b) {
  Dims out;
  out.reserve(ds.size());
  for (const Dim& d : ds) out.push_back(d.substitute(b));
  return out;
}

}  // namespace

std::string bind_symbols(const Graph& g, const std::vector<Shape>& shapes, Bindings& out) {
  out.clear();
  if (shapes.size() != g.inputs.size())
    return fmt::format("the model takes {} inputs, the call gives {}", g.inputs.size(), shapes.size());
  auto where = [&](size_t i, size_t d) { return fmt::format("input '{}' dim {}", display_text(g.inputs[i]->name), d); };
  // Bare symbols first, so that expressions are checked with every symbol known.
  for (size_t i = 0; i < shapes.size(); ++i) {
    const Dims dims = g.inputs[i]->type.dims();
    if (dims.size() != shapes[i].size())
      return fmt::format("input '{}' has rank {}, the model takes {}", display_text(g.inputs[i]->name), shapes[i].size(), dims.size());
    for (size_t d = 0; d < dims.size(); ++d) {
      const int64_t got = shapes[i][d];
      if (got < 0) return fmt::format("{} is negative ({})", where(i, d), got);
      if (auto s = bare_symbol(dims[d])) {
        auto [it, fresh] = out.emplace(*s, got);
        if (!fresh && it->second != got)
          return fmt::format("{} is {} but {} = {} from an earlier dim", where(i, d), got, *s, it->second);
      } else if (dims[d].is_static() && dims[d].constant_term() >= 0 && dims[d].constant_term() != got) {
        return fmt::format("{} is {}, the model takes {}", where(i, d), got, dims[d].constant_term());
      }
    }
  }
  for (size_t i = 0; i < shapes.size(); ++i) {
    const Dims dims = g.inputs[i]->type.dims();
    for (size_t d = 0; d < dims.size(); ++d) {
      if (dims[d].is_static() || bare_symbol(dims[d])) continue;
      for (const std::string& s : dims[d].symbols())
        if (!out.count(s)) return fmt::format("{} is {}, which names {}: no input dim is {} alone", where(i, d), dims[d].str(), s, s);
      int64_t want = 0;
      try {
        want = dims[d].eval(out);
      } catch (const Error& e) {
        return fmt::format("{}: {}", where(i, d), e.reason());
      }
      if (want != shapes[i][d]) return fmt::format("{} is {}, but {} = {}", where(i, d), shapes[i][d], dims[d].str(), want);
    }
  }
  // Symbols the inputs never name (an attribute's) cannot be bound from a call.
  for (const std::string& s : graph_symbols(g))
    if (!out.count(s)) return fmt::format("size symbol {} is named by no input dim, so a call cannot give it a value", s);
  return g.symbols.violation(out);
}

std::vector<std::string> graph_symbols(const Graph& g) {
  std::set<std::string> names;
  auto add = [&](const Dims& ds) {
    for (const Dim& d : ds)
      for (const std::string& s : d.symbols()) names.insert(s);
  };
  for (const auto& v : g.values())
    if (v->type.symbolic()) add(v->type.sym);
  for (const auto& n : g.nodes())
    for (const auto& [k, a] : n->attrs)
      if (const Dims* d = std::get_if<Dims>(&a)) add(*d);
  for (const auto& [name, info] : g.symbols.all()) names.insert(name);
  return {names.begin(), names.end()};
}

std::unique_ptr<Graph> instantiate_graph(const Graph& g, const Bindings& b) {
  auto out = std::make_unique<Graph>();
  out->name = g.name;
  for (const auto& [name, info] : g.symbols.all())
    if (!b.count(name)) out->symbols.declare(info);
  auto type_of = [&](const TensorType& t, const std::string& what) {
    if (!t.symbolic()) return t;
    Dims d = substitute_dims(t.sym, b);
    for (const Dim& x : d)
      if (x.is_static() && x.constant_term() < 0)
        throw Error(Location{.pass = "instantiate"}, fmt::format("{} has size {} < 0 for these sizes", what, x.constant_term()));
    return TensorType::of(t.dtype, d);
  };
  std::map<const Value*, Value*> map;
  for (const Value* v : g.inputs) map[v] = out->add_input(v->name, type_of(v->type, "input '" + display_text(v->name) + "'"));
  for (const auto& v : g.values())
    if (v->constant && !v->producer && !v->is_input) map[v.get()] = out->add_constant(v->name, *v->constant);
  for (const auto& n : g.nodes()) {
    std::vector<Value*> ins;
    for (const Value* v : n->inputs) {
      if (!v) {
        ins.push_back(nullptr);
        continue;
      }
      auto it = map.find(v);
      if (it == map.end()) throw Error(Location{.node = n->name, .pass = "instantiate"}, "an operand is defined after its use");
      ins.push_back(it->second);
    }
    std::map<std::string, Attr> attrs = n->attrs;
    for (auto& [k, a] : attrs)
      if (const Dims* d = std::get_if<Dims>(&a)) a = dims_attr(substitute_dims(*d, b));
    std::vector<std::string> names;
    for (const Value* v : n->outputs) names.push_back(v ? v->name : std::string());
    Node* c = out->add_node(n->op, n->name, std::move(ins), names, std::move(attrs));
    for (size_t i = 0; i < n->outputs.size(); ++i) {
      if (!n->outputs[i]) continue;
      c->outputs[i]->type = type_of(n->outputs[i]->type, "value '" + display_text(n->outputs[i]->name) + "'");
      map[n->outputs[i]] = c->outputs[i];
    }
  }
  for (const Value* v : g.outputs) {
    auto it = map.find(v);
    if (it == map.end()) throw Error(Location{.pass = "instantiate"}, fmt::format("output '{}' is not defined", display_text(v->name)));
    out->outputs.push_back(it->second);
  }
  return out;
}

}  // namespace tessel
