// fold-constants: nodes whose inputs are all known at compile time become constants. Known means
// constant data, or a static fact such as a shape (`Shape` of a statically shaped value), so the ONNX
// shape arithmetic chains (Shape -> Gather -> Unsqueeze -> Concat -> Reshape) fold away. Broadcasts
// are never materialised.
#include <fmt/format.h>

#include <set>

#include "tessel/ir/core_ops.h"
#include "tessel/ir/infer.h"
#include "tessel/ir/op_registry.h"
#include "tessel/passes/pass.h"

namespace tessel {

std::string fold_constants(Graph& g) {
  InferResult r = infer_graph(g);
  std::set<const Node*> folded;
  for (const auto& n : g.nodes()) {
    if (!n->op->deterministic) continue;
    // A broadcast of a known value stays a broadcast: materialising it only costs memory (the
    // canonical form of a splat is a rank-0 constant and a broadcast_in_dim).
    if (n->op->domain == "tessel.core" && is_core_op(*n, CoreOp::broadcast_in_dim)) continue;
    bool all = true;
    for (const Value* v : n->outputs)
      if (v && !r.folded.count(v)) all = false;
    if (!all) continue;
    for (Value* v : n->outputs) {
      if (!v) continue;
      v->constant = std::move(r.folded.at(v));
      v->producer = nullptr;
    }
    folded.insert(n.get());
  }
  g.erase_nodes_if([&](const Node& n) { return folded.count(&n) > 0; });
  g.compact();
  return fmt::format("folded {} nodes into constants", folded.size());
}

}  // namespace tessel
