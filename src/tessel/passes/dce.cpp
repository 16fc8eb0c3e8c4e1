// dce: removes nodes none of whose outputs is used (by a node or as a graph output), then the
// constants and values nothing refers to any more.
#include <fmt/format.h>

#include <set>

#include "tessel/passes/pass.h"

namespace tessel {

std::string eliminate_dead_code(Graph& g) {
  std::vector<int> uses = g.use_counts();
  std::set<const Node*> dead;
  const auto& nodes = g.nodes();
  // Reverse order: removing a node can make its producers dead too.
  for (auto it = nodes.rbegin(); it != nodes.rend(); ++it) {
    const Node& n = **it;
    bool used = false;
    for (const Value* v : n.outputs)
      if (v && uses[v->id] > 0) used = true;
    if (used) continue;
    dead.insert(&n);
    for (const Value* v : n.inputs)
      if (v) uses[v->id]--;
  }
  const size_t values_before = g.values().size();
  g.erase_nodes_if([&](const Node& n) { return dead.count(&n) > 0; });
  g.compact();
  return fmt::format("removed {} nodes and {} values", dead.size(), values_before - g.values().size());
}

}  // namespace tessel
