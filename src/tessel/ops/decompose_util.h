// Shared pieces of the graph -> core decomposition hooks (the hooks themselves sit in each op's entry).
#pragma once

#include <string>

#include "tessel/ir/op_registry.h"
#include "tessel/passes/core_builder.h"

namespace tessel {

// An elementwise graph op that is one core op once broadcasting is explicit: every input is
// broadcast to the node's output shape, then `core_op` is emitted.
inline DecomposeFn decompose_as(std::string core_op) {
  return [core_op](CoreBuilder& b, const Node& n) -> std::vector<Value*> {
    const Shape& out = n.outputs[0]->type.shape;
    std::vector<Value*> ins;
    for (Value* v : n.inputs) ins.push_back(b.broadcast_to(v, out));
    return {b.emit(core_op, ins)};
  };
}

// `d` with its decomposition hook set, for use at the registration site.
inline OpDef with_decomposition(OpDef d, DecomposeFn f) {
  d.decompose = std::move(f);
  return d;
}

// Sub as core ops: a + (-b), both broadcast to the output shape.
inline std::vector<Value*> decompose_sub(CoreBuilder& b, const Node& n) {
  const Shape& out = n.outputs[0]->type.shape;
  Value* rhs = b.emit("neg", {b.broadcast_to(n.inputs[1], out)});
  return {b.emit("add", {b.broadcast_to(n.inputs[0], out), rhs})};
}

}  // namespace tessel
