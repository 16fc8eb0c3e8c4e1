// Emitting core ops for decomposition hooks.
#include "tessel/passes/core_builder.h"

#include "tessel/ir/infer.h"
#include "tessel/ir/op_registry.h"
#include "tessel/support/error.h"

namespace tessel {

std::vector<Value*> CoreBuilder::emit_multi(const std::string& op, std::vector<Value*> inputs, int num_outputs,
                                            std::map<std::string, Attr> attrs) {
  const OpDef* def = OpRegistry::get().find(op);
  if (!def || def->domain != "tessel.core") fail("decomposition emits '{}', which is not a core op", op);
  std::string base = origin_.outputs.empty() || !origin_.outputs[0] ? origin_.name : origin_.outputs[0]->name;
  std::vector<std::string> names;
  for (int i = 0; i < num_outputs; ++i) names.push_back(g_.unique_name(base + "." + op));
  Node* n = g_.add_node(def, origin_.name, std::move(inputs), names, std::move(attrs));
  std::vector<const Tensor*> known;
  for (const Value* v : n->inputs) known.push_back(v && v->constant ? &*v->constant : nullptr);
  infer_node(*n, known, nullptr);
  return n->outputs;
}

Value* CoreBuilder::emit(const std::string& op, std::vector<Value*> inputs, std::map<std::string, Attr> attrs) {
  return emit_multi(op, std::move(inputs), 1, std::move(attrs))[0];
}

Value* CoreBuilder::constant(Tensor t) {
  std::string base = origin_.outputs.empty() || !origin_.outputs[0] ? origin_.name : origin_.outputs[0]->name;
  return g_.add_constant(g_.unique_name(base + ".const"), std::move(t));
}

Value* CoreBuilder::scalar(DType t, double v) { return constant(Tensor::scalar_f(t, v)); }

Value* CoreBuilder::broadcast_to(Value* v, const Shape& shape) {
  const Shape& in = v->type.shape;
  if (in == shape) return v;
  if (in.size() > shape.size()) fail("cannot broadcast {} to {}", shape_str(in), shape_str(shape));
  std::vector<int64_t> dims;
  for (size_t i = 0; i < in.size(); ++i) dims.push_back(static_cast<int64_t>(shape.size() - in.size() + i));
  return emit("broadcast_in_dim", {v}, {{"shape", std::vector<int64_t>(shape)}, {"dims", dims}});
}

Value* CoreBuilder::convert(Value* v, DType t) {
  if (v->type.dtype == t) return v;
  return emit("convert", {v}, {{"dtype", std::string(dtype_name(t))}});
}

}  // namespace tessel
