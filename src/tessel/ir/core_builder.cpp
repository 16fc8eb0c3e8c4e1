// Emitting core ops for decomposition hooks.
#include "tessel/ir/core_builder.h"

#include <algorithm>

#include "tessel/ir/infer.h"
#include "tessel/ir/op_registry.h"
#include "tessel/support/error.h"

namespace tessel {

std::vector<Value*> CoreBuilder::emit_multi(CoreOp core, std::vector<Value*> inputs, int num_outputs,
                                            std::map<std::string, Attr> attrs) {
  const OpDef* def = OpRegistry::get().find(core);
  if (!def) fail("decomposition emits '{}', which is not a registered core op", core_op_name(core));
  const std::string& base = origin_.outputs.empty() || !origin_.outputs[0] ? origin_.name : origin_.outputs[0]->name;
  std::string name = base;
  name += '.';
  name += core_op_name(core);
  // One output: add_node makes its name unique (a unique_name here first was a second lookup per
  // value). Several: each is made unique before any is added, as the names always were.
  std::vector<std::string> names(static_cast<size_t>(num_outputs), name);
  if (num_outputs > 1)
    for (auto& n : names) n = g_.unique_name(name);
  Node* n = g_.add_node(def, origin_.name, std::move(inputs), names, std::move(attrs));
  std::vector<const Tensor*> known;
  for (const Value* v : n->inputs) known.push_back(v && v->constant ? &*v->constant : nullptr);
  const ScopedSymbolFacts facts(&g_.symbols);
  infer_node(*n, known, nullptr);
  return n->outputs;
}

Value* CoreBuilder::emit(CoreOp op, std::vector<Value*> inputs, std::map<std::string, Attr> attrs) {
  return emit_multi(op, std::move(inputs), 1, std::move(attrs))[0];
}

Value* CoreBuilder::constant(Tensor t) {
  std::string base = origin_.outputs.empty() || !origin_.outputs[0] ? origin_.name : origin_.outputs[0]->name;
  return g_.add_constant(g_.unique_name(base + ".const"), std::move(t));
}

Value* CoreBuilder::scalar(DType t, double v) { return constant(Tensor::scalar_f(t, v)); }

Value* CoreBuilder::broadcast_to(Value* v, const DimList& to) {
  const Dims in = v->type.dims();
  const Dims& shape = to;
  if (in == shape) return v;
  if (in.size() > shape.size()) fail("cannot broadcast {} to {}", dims_str(in), dims_str(shape));
  std::vector<int64_t> dims;
  for (size_t i = 0; i < in.size(); ++i) dims.push_back(static_cast<int64_t>(shape.size() - in.size() + i));
  return emit(CoreOp::broadcast_in_dim, {v}, {{"shape", dims_attr(shape)}, {"dims", dims}});
}

Value* CoreBuilder::convert(Value* v, DType t) {
  if (v->type.dtype == t) return v;
  return emit(CoreOp::convert, {v}, {{"dtype", std::string(dtype_name(t))}});
}

Value* CoreBuilder::full(DType t, const DimList& shape, double v) { return broadcast_to(scalar(t, v), shape); }

Value* CoreBuilder::size_value(const Dim& d, DType t) {
  if (d.is_static())
    return constant(is_float(t) ? Tensor::scalar_f(t, static_cast<double>(d.constant_term()))
                                : Tensor::scalar_i(t, d.constant_term()));
  return reduce(full(t, {d}, 1.0), "sum", {0}, false);
}

Value* CoreBuilder::binary(CoreOp op, Value* a, Value* b) {
  const Dims s = broadcast_dims(a->type.dims(), b->type.dims());
  return emit(op, {broadcast_to(a, s), broadcast_to(b, s)});
}

Value* CoreBuilder::sub(Value* a, Value* b) {
  const Dims s = broadcast_dims(a->type.dims(), b->type.dims());
  return emit(CoreOp::add, {broadcast_to(a, s), emit(CoreOp::neg, {broadcast_to(b, s)})});
}

Value* CoreBuilder::compare(const std::string& direction, Value* a, Value* b) {
  const Dims s = broadcast_dims(a->type.dims(), b->type.dims());
  return emit(CoreOp::compare, {broadcast_to(a, s), broadcast_to(b, s)}, {{"direction", direction}});
}

Value* CoreBuilder::select(Value* pred, Value* on_true, Value* on_false) {
  const Dims s = broadcast_dims(broadcast_dims(pred->type.dims(), on_true->type.dims()), on_false->type.dims());
  return emit(CoreOp::select, {broadcast_to(pred, s), broadcast_to(on_true, s), broadcast_to(on_false, s)});
}

Value* CoreBuilder::reshape(Value* v, const DimList& shape) {
  if (v->type.dims() == static_cast<const Dims&>(shape)) return v;
  return emit(CoreOp::reshape, {v}, {{"shape", dims_attr(shape)}});
}

Value* CoreBuilder::transpose(Value* v, const std::vector<int64_t>& perm) {
  bool identity = true;
  for (size_t i = 0; i < perm.size(); ++i) identity = identity && perm[i] == static_cast<int64_t>(i);
  if (identity) return v;
  return emit(CoreOp::transpose, {v}, {{"perm", perm}});
}

Value* CoreBuilder::reduce(Value* v, const std::string& kind, std::vector<int64_t> axes, bool keepdims) {
  const int rank = static_cast<int>(v->type.shape.size());
  for (auto& a : axes) a = normalize_axis(a, rank);
  std::sort(axes.begin(), axes.end());
  axes.erase(std::unique(axes.begin(), axes.end()), axes.end());
  Value* r = emit(CoreOp::reduce, {v}, {{"kind", kind}, {"axes", axes}});
  if (!keepdims) return r;
  Dims kept = v->type.dims();
  for (int64_t a : axes) kept[a] = 1;
  return reshape(r, kept);
}

Value* CoreBuilder::slice(Value* v, const DimList& starts_in, const DimList& stops_in, std::vector<int64_t> strides) {
  const Dims& starts = starts_in;
  const Dims& stops = stops_in;
  if (strides.empty()) strides.assign(starts.size(), 1);
  const Dims vd = v->type.dims();
  bool whole = starts.size() == vd.size();
  for (size_t d = 0; whole && d < starts.size(); ++d)
    whole = whole && starts[d] == 0 && d < stops.size() && stops[d] == vd[d] && strides[d] == 1;
  if (whole) return v;
  return emit(CoreOp::slice, {v}, {{"starts", dims_attr(starts)}, {"stops", dims_attr(stops)}, {"strides", strides}});
}

Value* CoreBuilder::concat(std::vector<Value*> vs, int64_t axis) {
  if (vs.size() == 1) return vs[0];
  return emit(CoreOp::concatenate, std::move(vs), {{"axis", axis}});
}

Value* CoreBuilder::iota(DType t, const DimList& shape, int64_t axis) {
  return emit(CoreOp::iota, {}, {{"shape", dims_attr(shape)}, {"axis", axis}, {"dtype", std::string(dtype_name(t))}});
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

std::optional<Dims> CoreBuilder::known_sizes(int i) const {
  if (!origin_.has_input(i)) return std::nullopt;
  const Value* v = origin_.inputs[i];
  if (v->constant) {
    const Tensor& t = *v->constant;
    if (!is_int(t.dtype())) return std::nullopt;
    Dims d;
    for (int64_t k = 0; k < t.numel(); ++k) d.push_back(t.get_i(k));
    return d;
  }
  if (v->producer && v->producer->op && v->producer->op->name == "Sizes" && v->producer->op->domain == "tessel")
    return v->producer->attr_dims("dims");
  return std::nullopt;
}

Dims CoreBuilder::need_sizes(int i, const std::string& what) const {
  if (!origin_.has_input(i)) fail("input {} ({}) is absent", i, what);
  if (auto d = known_sizes(i)) return *d;
  unsupported("{} ('{}') must be known at compile time for the core level (as numbers or as expressions of the size "
              "symbols); it is computed at run time",
              what, origin_.inputs[i]->name);
}

}  // namespace tessel
