// decompose: replaces every graph-level node whose op has a decomposition hook by core ops. Nodes
// without a hook stay as they are and are listed in the pass's note (the core level is complete
// when that list is empty). The core level is static: a node with an unknown dim in any operand or
// result (downstream of a data-dependent op such as NonZero) stays a graph-level node too, listed
// as dynamic; those nodes are the graph break the backends run through the reference kernels.
#include <fmt/format.h>

#include <algorithm>
#include <map>

#include "tessel/ir/op_registry.h"
#include "tessel/ir/core_builder.h"
#include "tessel/passes/pass.h"
#include "tessel/support/error.h"

namespace tessel {

namespace {
bool is_sizes(const Node& n) { return n.op->name == "Sizes" && n.op->domain == "tessel"; }
}  // namespace

std::string decompose(Graph& g) {
  std::vector<std::unique_ptr<Node>> pending = std::move(g.mutable_nodes());
  g.mutable_nodes().clear();
  std::map<std::string, int> left, dynamic;
  int done = 0;
  auto has_unknown_dim = [](const std::vector<Value*>& vs) {
    for (const Value* v : vs)
      if (v && !v->type.dims_defined()) return true;  // a symbolic dim is known: an expression
    return false;
  };
  for (size_t k = 0; k < pending.size(); ++k) {
    std::unique_ptr<Node>& n = pending[k];
    const bool is_dynamic = has_unknown_dim(n->inputs) || has_unknown_dim(n->outputs);
    // A Sizes node (symbolic shape arithmetic, docs/dynamic-shapes.md) waits for the ops that read it
    // as a shape; the ones still read after them are read as data (below).
    if (!n->op->decompose || is_dynamic || is_sizes(*n)) {
      if (!n->op->core) (is_dynamic ? dynamic : left)[n->op->name]++;
      g.mutable_nodes().push_back(std::move(n));
      continue;
    }
    CoreBuilder b(g, *n);
    const size_t first_new = g.values().size();
    std::vector<Value*> results;
    try {
      results = n->op->decompose(b, *n);
    } catch (const Error& e) {
      throw e.with_context(Location{.node = n->name, .op = n->op->name});
    }
    if (results.size() != n->outputs.size()) fail("decomposition of {} returned {} values", n->op->name, results.size());
    for (size_t i = 0; i < results.size(); ++i) {
      Value* old = n->outputs[i];
      if (!old) continue;
      if (!results[i] || results[i]->type != old->type)
        throw Error(Location{.node = n->name, .op = n->op->name},
                    fmt::format("decomposition gives {} for output '{}' of type {}",
                                results[i] ? results[i]->type.str() : "nothing", old->name, old->type.str()));
      // Later nodes (not yet placed) and graph outputs now read the replacement.
      for (size_t j = k + 1; j < pending.size(); ++j)
        for (Value*& in : pending[j]->inputs)
          if (in == old) in = results[i];
      for (Value*& out : g.outputs)
        if (out == old) out = results[i];
      old->producer = nullptr;
      // The value that now carries the result keeps the name the model gave it.
      if (static_cast<size_t>(results[i]->id) >= first_new) g.hand_name_over(old, results[i]);
    }
    ++done;
  }
  g.compact();
  // A Sizes node a core op still reads gives it the sizes as data: its hook makes a constant of static
  // sizes and computes symbolic ones at run time (CoreBuilder::size_value). Its new nodes go where it
  // was, before its readers (a Sizes node has no inputs). One nothing reads is left for dce.
  const std::vector<int> uses = g.use_counts();
  for (size_t k = 0; k < g.nodes().size(); ++k) {
    Node& n = *g.mutable_nodes()[k];
    if (!is_sizes(n) || uses[n.outputs[0]->id] == 0) continue;
    const size_t before = g.nodes().size();
    CoreBuilder b(g, n);
    std::vector<Value*> results;
    try {
      results = n.op->decompose(b, n);
    } catch (const Error& e) {
      throw e.with_context(Location{.node = n.name, .op = n.op->name});
    }
    g.replace_all_uses(n.outputs[0], results.at(0));
    auto& nodes = g.mutable_nodes();
    const size_t added = nodes.size() - before;
    std::rotate(nodes.begin() + static_cast<std::ptrdiff_t>(k), nodes.begin() + static_cast<std::ptrdiff_t>(before),
                nodes.end());
    k += added;
    ++done;
  }
  g.compact();
  auto list = [](const std::map<std::string, int>& m) {
    std::string s;
    for (const auto& [op, count] : m) s += fmt::format("{}{}×{}", s.empty() ? "" : ", ", op, count);
    return s;
  };
  std::string note = fmt::format("decomposed {} nodes", done);
  if (!left.empty()) note += "; no core form for " + list(left);
  if (!dynamic.empty()) note += "; dynamic shapes (graph break) in " + list(dynamic);
  return note;
}

}  // namespace tessel
