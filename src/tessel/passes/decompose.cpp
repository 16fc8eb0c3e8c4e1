// decompose: replaces every graph-level node whose op has a decomposition hook by core ops. Nodes
// without a hook stay as they are and are listed in the pass's note (the core level is complete
// when that list is empty).
#include <fmt/format.h>

#include <map>

#include "tessel/ir/op_registry.h"
#include "tessel/passes/core_builder.h"
#include "tessel/passes/pass.h"
#include "tessel/support/error.h"

namespace tessel {

std::string decompose(Graph& g) {
  std::vector<std::unique_ptr<Node>> pending = std::move(g.mutable_nodes());
  g.mutable_nodes().clear();
  std::map<std::string, int> left;
  int done = 0;
  for (size_t k = 0; k < pending.size(); ++k) {
    std::unique_ptr<Node>& n = pending[k];
    if (!n->op->decompose) {
      if (n->op->domain != "tessel.core") left[n->op->name]++;
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
      if (static_cast<size_t>(results[i]->id) >= first_new) {
        std::string name = old->name;
        old->name += ".replaced";
        results[i]->name = name;
      }
    }
    ++done;
  }
  g.compact();
  std::string rest;
  for (const auto& [op, count] : left) rest += fmt::format("{}{}×{}", rest.empty() ? "" : ", ", op, count);
  return fmt::format("decomposed {} nodes{}", done, rest.empty() ? "" : "; no decomposition yet for " + rest);
}

}  // namespace tessel
