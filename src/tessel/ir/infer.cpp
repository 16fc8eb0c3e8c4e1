// Whole-graph inference and single-node evaluation.
#include "tessel/ir/infer.h"

#include <algorithm>
#include <unordered_map>
#include <unordered_set>

#include "tessel/ir/op_registry.h"
#include "tessel/support/error.h"
#include "tessel/support/escape.h"
#include "tessel/support/limits.h"

namespace tessel {

namespace {

Location node_loc(const Node& n, const char* pass) {
  Location l;
  l.node = n.name;
  l.op = n.op ? n.op->name : "";
  l.pass = pass;
  return l;
}

// What the op's rule says about one node: its output types, and values where they are static.
struct NodeFacts {
  std::vector<TensorType> types;
  std::vector<std::optional<Tensor>> values;
  std::vector<std::optional<SymTensor>> sym_values;
};

// A node with a symbolic operand type or value runs only a rule that handles symbolic sizes; other
// rules read the static shape, where a symbolic dim is kUnknownDim, and could derive a wrong size.
void check_symbolic_rule(const Node& n, const std::vector<const SymTensor*>* sym) {
  if (n.op->symbolic) return;
  bool symbolic = n.has_symbolic_attr();
  for (const Value* v : n.inputs) symbolic = symbolic || (v && v->type.symbolic());
  if (sym)
    for (const SymTensor* s : *sym) symbolic = symbolic || s;
  if (symbolic) unsupported("{} has no shape rule for symbolic sizes (docs/dynamic-shapes.md lists the ops that have)", n.op->name);
}

NodeFacts run_rule(const Node& n, const std::vector<const Tensor*>& known, const std::vector<const SymTensor*>* sym = nullptr,
                   const std::function<const Tensor*(int)>& resolve = {});

void apply(Node& n, const NodeFacts& f, bool verify_only) {
  for (size_t i = 0; i < n.outputs.size(); ++i) {
    Value* v = n.outputs[i];
    if (!v) continue;
    // A value whose static type needs more bytes than one allocation may have is refused here,
    // before any backend plans or makes a buffer for it.
    if (shape_known(f.types[i].shape) && !tensor_within_limits(f.types[i].dtype, f.types[i].shape))
      checked_tensor_numel(f.types[i].dtype, f.types[i].shape, fmt::format("output '%{}'", v->name));
    if (!verify_only) {
      v->type = f.types[i];
    } else if (v->type != f.types[i]) {
      fail("output '{}' has type {} but the op's shape rule gives {}", v->name, v->type.str(), f.types[i].str());
    }
  }
}

}  // namespace

void infer_node(Node& n, const std::vector<const Tensor*>& known, std::vector<std::optional<Tensor>>* out_values,
                bool verify_only) {
  try {
    NodeFacts f = run_rule(n, known);
    apply(n, f, verify_only);
    if (out_values) *out_values = std::move(f.values);
  } catch (const Error& e) {
    throw e.with_context(node_loc(n, verify_only ? "verify" : "infer"));
  }
}

std::vector<Tensor> run_node(const Node& n, const std::vector<const Tensor*>& inputs) {
  try {
    KernelCtx ctx(n, inputs);
    n.op->kernel(ctx);
    for (size_t i = 0; i < n.outputs.size(); ++i) {
      const Value* v = n.outputs[i];
      if (!v) continue;
      const Tensor& t = ctx.outs()[i];
      if (!t.valid()) fail("kernel did not produce output {}", i);
      if (t.dtype() != v->type.dtype)
        fail("kernel produced {} for output {} but its type is {}", dtype_name(t.dtype()), i, v->type.str());
      const Shape& st = v->type.shape;
      bool ok = st.size() == t.shape().size();
      for (size_t d = 0; ok && d < st.size(); ++d) ok = st[d] < 0 || st[d] == t.shape()[d];
      if (!ok) fail("kernel produced shape {} for output {} but its type is {}", shape_str(t.shape()), i, v->type.str());
    }
    return std::move(ctx.outs());
  } catch (const Error& e) {
    throw e.with_context(node_loc(n, "run"));
  } catch (const std::bad_alloc&) {
    throw Error(node_loc(n, "run"), "out of memory");
  } catch (const std::length_error&) {
    throw Error(node_loc(n, "run"), "tensor too large");
  }
}

namespace {

// The verifier's re-inference (verify_only) leaves a small constant subgraph's values uncomputed
// until a later rule reads one: re-running every broadcast of a constant after every pass was a
// tenth of a long pipeline (issue 41), and the types it checks come from the rules either way.
using Deferred = std::unordered_map<const Value*, std::pair<const Node*, size_t>>;  // value -> (node, position)

NodeFacts run_rule(const Node& n, const std::vector<const Tensor*>& known, const std::vector<const SymTensor*>* sym,
                   const std::function<const Tensor*(int)>& resolve) {
  check_symbolic_rule(n, sym);
  InferCtx ctx(n, known, sym);
  if (resolve) ctx.set_resolver(resolve);
  n.op->infer(ctx);
  for (size_t i = 0; i < n.outputs.size(); ++i)
    if (n.outputs[i] && !ctx.out_set(static_cast<int>(i))) fail("shape rule did not set output {}", i);
  return {ctx.outs(), ctx.out_values(), ctx.out_sym_values()};
}

const Tensor* known_value(const Value* v, const InferResult& r) {
  if (!v) return nullptr;
  if (v->constant) return &*v->constant;
  auto it = r.folded.find(v);
  return it == r.folded.end() ? nullptr : &it->second;
}

// Computes a deferred value and every deferred value it needs, in graph order (no recursion: a
// chain of deferred nodes may be as long as the graph).
const Tensor* resolve_deferred(const Value* want, InferResult& r, Deferred& d, int64_t fold_limit) {
  std::vector<std::pair<size_t, const Node*>> order;
  std::vector<const Value*> stack{want};
  std::unordered_set<const Node*> seen;
  while (!stack.empty()) {
    const Value* v = stack.back();
    stack.pop_back();
    auto it = d.find(v);
    if (it == d.end() || !seen.insert(it->second.first).second) continue;
    order.emplace_back(it->second.second, it->second.first);
    for (const Value* in : it->second.first->inputs)
      if (in && !known_value(in, r)) stack.push_back(in);
  }
  std::sort(order.begin(), order.end());
  for (const auto& [pos, n] : order) {
    std::vector<const Tensor*> known;
    for (const Value* in : n->inputs) known.push_back(known_value(in, r));
    auto outs = run_node(*n, known);
    for (size_t i = 0; i < n->outputs.size(); ++i) {
      if (!n->outputs[i]) continue;
      d.erase(n->outputs[i]);
      if (outs[i].numel() <= fold_limit) r.folded[n->outputs[i]] = std::move(outs[i]);
    }
  }
  return known_value(want, r);
}

// Types (and, when small and known, values) of one node's outputs, recorded in `r`. `d` is set when
// verifying: values are then computed only when read.
void infer_one(Node& n, size_t pos, InferResult& r, int64_t fold_limit, bool verify_only, Deferred* d) {
  auto deferred = [&](const Value* v) { return d && v && d->count(v) > 0; };
  try {
    std::vector<const Tensor*> known;
    std::vector<const SymTensor*> sym;
    known.reserve(n.inputs.size());
    bool all_known = true, any_sym = false, any_deferred = false;
    int64_t elems = 0;
    for (const Value* v : n.inputs) {
      known.push_back(known_value(v, r));
      const SymTensor* s = nullptr;
      if (v && !r.sym_folded.empty()) {
        auto st = r.sym_folded.find(v);
        if (st != r.sym_folded.end()) s = &st->second;
      }
      sym.push_back(s);
      any_sym = any_sym || s;
      if (v && !known.back()) {
        if (deferred(v)) {
          any_deferred = true;
          elems += shape_numel(v->type.shape);
        } else {
          all_known = false;
        }
      }
      if (known.back()) elems += known.back()->numel();
    }
    std::function<const Tensor*(int)> resolve;
    if (any_deferred)
      resolve = [&](int i) -> const Tensor* {
        const Value* v = n.inputs[static_cast<size_t>(i)];
        if (!deferred(v)) return nullptr;
        known[static_cast<size_t>(i)] = resolve_deferred(v, r, *d, fold_limit);
        return known[static_cast<size_t>(i)];
      };
    NodeFacts f = run_rule(n, known, any_sym ? &sym : nullptr, resolve);
    bool any_value = false;
    for (const auto& v : f.values) any_value = any_value || v.has_value();
    // A node with a symbolic result (type or value) or attribute has no value the kernel could
    // compute: a symbolic size has no number yet (a splat broadcast to [s0, 16], a Sizes node).
    bool symbolic = n.has_symbolic_attr();
    for (size_t i = 0; i < f.types.size(); ++i) symbolic = symbolic || f.types[i].symbolic() || f.sym_values[i];
    // A deterministic node whose inputs are all small and known is evaluated now: later rules see
    // its values (shape arithmetic), and data-dependent output sizes (NonZero, Unique of a
    // constant) become exact.
    if (!any_value && !symbolic && all_known && n.op->deterministic && elems <= fold_limit) {
      bool small = true, exact = true;
      for (const auto& t : f.types) {
        small = small && (!shape_known(t.shape) || shape_numel(t.shape) <= fold_limit);
        exact = exact && shape_known(t.shape);
      }
      if (small && d && exact) {
        // Verifying, and the rule's types are exact: the value waits until a rule reads it.
        for (const Value* v : n.outputs)
          if (v) (*d)[v] = {&n, pos};
      } else if (small) {
        for (size_t i = 0; i < n.inputs.size(); ++i)
          if (!known[i] && deferred(n.inputs[i])) known[i] = resolve_deferred(n.inputs[i], r, *d, fold_limit);
        // The kernel's results are checked against the outputs' types, so the rule's types go in
        // first (when verifying, the stored types are what is checked).
        if (!verify_only)
          for (size_t i = 0; i < n.outputs.size(); ++i)
            if (n.outputs[i]) n.outputs[i]->type = f.types[i];
        auto outs = run_node(n, known);
        for (size_t i = 0; i < n.outputs.size(); ++i) {
          if (!n.outputs[i]) continue;
          f.types[i] = TensorType{outs[i].dtype(), outs[i].shape()};
          if (outs[i].numel() <= fold_limit) f.values[i] = std::move(outs[i]);
        }
      }
    }
    apply(n, f, verify_only);
    for (size_t i = 0; i < n.outputs.size(); ++i) {
      if (n.outputs[i] && f.values[i]) r.folded[n.outputs[i]] = std::move(*f.values[i]);
      else if (n.outputs[i] && f.sym_values[i]) r.sym_folded[n.outputs[i]] = std::move(*f.sym_values[i]);
    }
  } catch (const Error& e) {
    throw e.with_context(node_loc(n, verify_only ? "verify" : "infer"));
  }
}

}  // namespace

InferResult infer_graph(Graph& g, int64_t fold_limit, bool verify_only) {
  const ScopedSymbolFacts facts(&g.symbols);  // the rules decide within the compilation's ranges
  InferResult r;
  Deferred d;
  auto& nodes = g.mutable_nodes();
  for (size_t i = 0; i < nodes.size(); ++i) infer_one(*nodes[i], i, r, fold_limit, verify_only, verify_only ? &d : nullptr);
  return r;
}

void infer_graph_from(Graph& g, size_t first, InferResult& r, int64_t fold_limit) {
  const ScopedSymbolFacts facts(&g.symbols);
  auto& nodes = g.mutable_nodes();
  for (size_t i = first; i < nodes.size(); ++i) infer_one(*nodes[i], i, r, fold_limit, false, nullptr);
}

void bind_input_shapes(Graph& g, const std::vector<Tensor>& ex) {
  if (ex.size() != g.inputs.size())
    throw Error(Location{.pass = "compile"},
                fmt::format("the model takes {} inputs but {} example inputs were given", g.inputs.size(), ex.size()));
  for (size_t i = 0; i < g.inputs.size(); ++i) {
    Value* v = g.inputs[i];
    const Tensor& t = ex[i];
    if (t.dtype() != v->type.dtype || t.rank() != static_cast<int>(v->type.shape.size()))
      throw Error(Location{.pass = "compile"}, fmt::format("example input '{}' is {}, the model takes {}", display_text(v->name),
                                                           TensorType{t.dtype(), t.shape()}.str(), v->type.str()));
    for (int d = 0; d < t.rank(); ++d) {
      if (v->type.shape[d] >= 0 && v->type.shape[d] != t.dim(d))
        throw Error(Location{.pass = "compile"}, fmt::format("example input '{}' has shape {}, the model takes {}",
                                                             display_text(v->name), shape_str(t.shape()), v->type.str()));
      v->type.shape[d] = t.dim(d);
    }
    v->type.sym.clear();
  }
  // Every input is static now; the symbols stay only while an attribute still names one.
  bool named = false;
  for (const auto& n : g.nodes()) named = named || n->has_symbolic_attr();
  if (!named) g.symbols = SymbolTable{};
}

}  // namespace tessel
