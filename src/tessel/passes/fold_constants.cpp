// fold-constants: nodes whose inputs are all known at compile time become constants. Known means
// constant data, or a static fact such as a shape (`Shape` of a statically shaped value), so the ONNX
// shape arithmetic chains (Shape -> Gather -> Unsqueeze -> Concat -> Reshape) fold away. Broadcasts
// are never materialised. Shape arithmetic over symbolic sizes (docs/dynamic-shapes.md) cannot become
// a constant: a node whose result is such sizes becomes a `Sizes` node holding them, so the chain
// behind it folds away just the same.
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
  int sizes = 0;
  const OpDef* sizes_op = OpRegistry::get().find("Sizes");
  for (const auto& np : g.mutable_nodes()) {
    Node* n = np.get();
    if (!n->op->deterministic) continue;
    // A broadcast of a known value stays a broadcast: materialising it only costs memory (the
    // canonical form of a splat is a rank-0 constant and a broadcast_in_dim).
    if (is_core_op(*n, CoreOp::broadcast_in_dim)) continue;
    bool all = true;
    for (const Value* v : n->outputs)
      if (v && !r.folded.count(v)) all = false;
    if (!all) {
      // One result, symbolic sizes: the node becomes Sizes (its operands are no longer read).
      if (n->op == sizes_op || n->outputs.size() != 1 || !n->outputs[0]) continue;
      auto it = r.sym_folded.find(n->outputs[0]);
      if (it == r.sym_folded.end() || it->second.shape.size() > 1) continue;
      const SymTensor& t = it->second;
      n->op = sizes_op;
      n->inputs.clear();
      n->attrs = {{"dims", dims_attr(t.elems)}, {"shape", std::vector<int64_t>(t.shape)}, {"dtype", std::string(dtype_name(t.dtype))}};
      ++sizes;
      continue;
    }
    for (Value* v : n->outputs) {
      if (!v) continue;
      v->constant = std::move(r.folded.at(v));
      v->producer = nullptr;
    }
    folded.insert(n);
  }
  g.erase_nodes_if([&](const Node& n) { return folded.count(&n) > 0; });
  g.compact();
  std::string note = fmt::format("folded {} nodes into constants", folded.size());
  if (sizes) note += fmt::format(", {} into symbolic sizes", sizes);
  return note;
}

}  // namespace tessel
