// Emitting core ops for decomposition hooks.
#include "tessel/ir/core_builder.h"

#include <algorithm>

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

Value* CoreBuilder::full(DType t, const Shape& shape, double v) { return broadcast_to(scalar(t, v), shape); }

Value* CoreBuilder::binary(const std::string& op, Value* a, Value* b) {
  Shape s = broadcast_shapes(a->type.shape, b->type.shape);
  return emit(op, {broadcast_to(a, s), broadcast_to(b, s)});
}

Value* CoreBuilder::sub(Value* a, Value* b) {
  Shape s = broadcast_shapes(a->type.shape, b->type.shape);
  return emit("add", {broadcast_to(a, s), emit("neg", {broadcast_to(b, s)})});
}

Value* CoreBuilder::compare(const std::string& direction, Value* a, Value* b) {
  Shape s = broadcast_shapes(a->type.shape, b->type.shape);
  return emit("compare", {broadcast_to(a, s), broadcast_to(b, s)}, {{"direction", direction}});
}

Value* CoreBuilder::select(Value* pred, Value* on_true, Value* on_false) {
  Shape s = broadcast_shapes(broadcast_shapes(pred->type.shape, on_true->type.shape), on_false->type.shape);
  return emit("select", {broadcast_to(pred, s), broadcast_to(on_true, s), broadcast_to(on_false, s)});
}

Value* CoreBuilder::reshape(Value* v, const Shape& shape) {
  if (v->type.shape == shape) return v;
  return emit("reshape", {v}, {{"shape", std::vector<int64_t>(shape)}});
}

Value* CoreBuilder::transpose(Value* v, const std::vector<int64_t>& perm) {
  bool identity = true;
  for (size_t i = 0; i < perm.size(); ++i) identity = identity && perm[i] == static_cast<int64_t>(i);
  if (identity) return v;
  return emit("transpose", {v}, {{"perm", perm}});
}

Value* CoreBuilder::reduce(Value* v, const std::string& kind, std::vector<int64_t> axes, bool keepdims) {
  const int rank = static_cast<int>(v->type.shape.size());
  for (auto& a : axes) a = normalize_axis(a, rank);
  std::sort(axes.begin(), axes.end());
  axes.erase(std::unique(axes.begin(), axes.end()), axes.end());
  Value* r = emit("reduce", {v}, {{"kind", kind}, {"axes", axes}});
  if (!keepdims) return r;
  Shape kept = v->type.shape;
  for (int64_t a : axes) kept[a] = 1;
  return reshape(r, kept);
}

Value* CoreBuilder::slice(Value* v, std::vector<int64_t> starts, std::vector<int64_t> stops,
                          std::vector<int64_t> strides) {
  if (strides.empty()) strides.assign(starts.size(), 1);
  bool whole = true;
  for (size_t d = 0; d < starts.size(); ++d)
    whole = whole && starts[d] == 0 && stops[d] == v->type.shape[d] && strides[d] == 1;
  if (whole) return v;
  return emit("slice", {v}, {{"starts", starts}, {"stops", stops}, {"strides", strides}});
}

Value* CoreBuilder::concat(std::vector<Value*> vs, int64_t axis) {
  if (vs.size() == 1) return vs[0];
  return emit("concatenate", std::move(vs), {{"axis", axis}});
}

Value* CoreBuilder::iota(DType t, const Shape& shape, int64_t axis) {
  return emit("iota", {}, {{"shape", std::vector<int64_t>(shape)}, {"axis", axis}, {"dtype", std::string(dtype_name(t))}});
}

std::optional<Tensor> CoreBuilder::known(int i) const {
  if (!origin_.has_input(i) || !origin_.inputs[i]->constant) return std::nullopt;
  return *origin_.inputs[i]->constant;
}

const Tensor& CoreBuilder::need_constant(int i, const std::string& what) const {
  if (!origin_.has_input(i)) fail("input {} ({}) is absent", i, what);
  const Value* v = origin_.inputs[i];
  if (!v->constant)
    unsupported("{} ('{}') must be known at compile time for the core level (static shapes); it is computed at run time",
                what, v->name);
  return *v->constant;
}

}  // namespace tessel
