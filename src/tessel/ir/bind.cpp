// Binding size symbols (see bind.h).
#include "tessel/ir/bind.h"

#include <fmt/format.h>

#include <algorithm>
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

}  // namespace

SymbolBinder::SymbolBinder(const Graph& g) : symbols_(graph_symbols(g)) {
  auto position = [&](const std::string& s) {
    return static_cast<int>(std::lower_bound(symbols_.begin(), symbols_.end(), s) - symbols_.begin());
  };
  bound_.assign(symbols_.size(), false);
  for (const std::string& s : symbols_) {
    const SymbolInfo* f = g.symbols.find(s);
    facts_.push_back(f ? *f : SymbolInfo{s});
  }
  for (size_t i = 0; i < g.inputs.size(); ++i) {
    input_names_.push_back(display_text(g.inputs[i]->name));
    const Dims dims = g.inputs[i]->type.dims();
    ranks_.push_back(dims.size());
    for (size_t d = 0; d < dims.size(); ++d) {
      DimRule r{i, d};
      if (auto s = bare_symbol(dims[d])) {
        r.symbol = position(*s);
        bound_[static_cast<size_t>(r.symbol)] = true;
      } else if (dims[d].is_static()) {
        r.number = dims[d].constant_term();  // kUnknownDim (< 0): any size
      } else {
        r.expr = dims[d];
      }
      rules_.push_back(r);
    }
  }
  // Bare symbols first, so that expressions are checked with every symbol known.
  std::stable_partition(rules_.begin(), rules_.end(), [](const DimRule& r) { return r.symbol >= 0 || r.expr.is_static(); });
}

Bindings SymbolBinder::bindings(const std::vector<int64_t>& values) const {
  Bindings b;
  for (size_t i = 0; i < symbols_.size() && i < values.size(); ++i) b[symbols_[i]] = values[i];
  return b;
}

std::string SymbolBinder::bind(const std::vector<Shape>& shapes, std::vector<int64_t>& values) const {
  if (shapes.size() != ranks_.size()) return fmt::format("the model takes {} inputs, the call gives {}", ranks_.size(), shapes.size());
  for (size_t i = 0; i < shapes.size(); ++i)
    if (shapes[i].size() != ranks_[i])
      return fmt::format("input '{}' has rank {}, the model takes {}", input_names_[i], shapes[i].size(), ranks_[i]);
  auto where = [&](const DimRule& r) { return fmt::format("input '{}' dim {}", input_names_[r.input], r.dim); };
  values.assign(symbols_.size(), -1);
  Bindings named;  // only for expressions (rare)
  for (const DimRule& r : rules_) {
    const int64_t got = shapes[r.input][r.dim];
    if (got < 0) return fmt::format("{} is negative ({})", where(r), got);
    if (r.symbol >= 0) {
      int64_t& v = values[static_cast<size_t>(r.symbol)];
      if (v >= 0 && v != got) return fmt::format("{} is {} but {} = {} from an earlier dim", where(r), got, symbols_[static_cast<size_t>(r.symbol)], v);
      v = got;
    } else if (r.expr.is_static()) {
      if (r.number >= 0 && r.number != got) return fmt::format("{} is {}, the model takes {}", where(r), got, r.number);
    } else {
      if (named.empty()) named = bindings(values);
      for (const std::string& s : r.expr.symbols()) {
        auto it = named.find(s);
        if (it == named.end() || it->second < 0)
          return fmt::format("{} is {}, which names {}: no input dim is {} alone", where(r), r.expr.str(), s, s);
      }
      int64_t want = 0;
      try {
        want = r.expr.eval(named);
      } catch (const Error& e) {
        return fmt::format("{}: {}", where(r), e.reason());
      }
      if (want != got) return fmt::format("{} is {}, but {} = {}", where(r), got, r.expr.str(), want);
    }
  }
  for (size_t k = 0; k < symbols_.size(); ++k) {
    // Symbols the inputs never name (an attribute's) cannot be bound from a call.
    if (!bound_[k]) return fmt::format("size symbol {} is named by no input dim, so a call cannot give it a value", symbols_[k]);
    if (std::string why = facts_[k].violation(values[k]); !why.empty()) return why;
  }
  return {};
}

std::string bind_symbols(const Graph& g, const std::vector<Shape>& shapes, Bindings& out) {
  SymbolBinder binder(g);
  std::vector<int64_t> values;
  std::string why = binder.bind(shapes, values);
  out = why.empty() ? binder.bindings(values) : Bindings{};
  return why;
}

std::string binding_str(const Bindings& b) {
  std::string s;
  for (const auto& [name, v] : b) s += fmt::format("{}{} = {}", s.empty() ? "" : ", ", name, v);
  return s;
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
  // (what: "input" or "value", named in the error only: an instance per decoded token runs this)
  auto type_of = [&](const TensorType& t, const char* what, const std::string& name) {
    if (!t.symbolic()) return t;
    Dims d = substitute_dims(t.sym, b);
    for (const Dim& x : d)
      if (x.is_static() && x.constant_term() < 0)
        throw Error(Location{.pass = "instantiate"},
                    fmt::format("{} '{}' has size {} < 0 for these sizes", what, display_text(name), x.constant_term()));
    return TensorType::of(t.dtype, d);
  };
  std::map<const Value*, Value*> map;
  for (const Value* v : g.inputs) map[v] = out->add_input(v->name, type_of(v->type, "input", v->name));
  for (const auto& v : g.values())
    if (v->constant && !v->producer && !v->is_input) map[v.get()] = out->add_constant(v->name, *v->constant);
  for (const auto& n : g.nodes()) {
    std::vector<Value*> ins;
    for (const Value* v : n->inputs) ins.push_back(v ? map.at(v) : nullptr);  // (nodes are in topological order)
    std::map<std::string, Attr> attrs = n->attrs;
    for (auto& [k, a] : attrs)
      if (const Dims* d = std::get_if<Dims>(&a)) a = dims_attr(substitute_dims(*d, b));
    Node* c = out->add_copy(*n, std::move(ins), map, &attrs);
    for (Value* v : c->outputs)
      if (v) v->type = type_of(v->type, "value", v->name);
  }
  for (const Value* v : g.outputs) {
    auto it = map.find(v);
    if (it == map.end()) throw Error(Location{.pass = "instantiate"}, fmt::format("output '{}' is not defined", display_text(v->name)));
    out->outputs.push_back(it->second);
  }
  return out;
}

}  // namespace tessel
