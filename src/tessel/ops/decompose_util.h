// Shared pieces of the graph -> core decomposition hooks (the hooks themselves sit in each op's entry).
#pragma once

#include <string>

#include "tessel/ir/op_registry.h"
#include "tessel/ir/core_builder.h"

namespace tessel {

// An elementwise graph op that is one core op once broadcasting is explicit: every input is
// broadcast to the node's output shape, then `core_op` is emitted.
inline DecomposeFn decompose_as(CoreOp core_op) {
  return [core_op](CoreBuilder& b, const Node& n) -> std::vector<Value*> {
    const Dims out = n.outputs[0]->type.dims();
    std::vector<Value*> ins;
    for (Value* v : n.inputs) ins.push_back(b.broadcast_to(v, out));
    return {b.emit(core_op, ins)};
  };
}

// Multi-step float math on the narrow floats (f16, bf16, f8, f4) runs in f32 and is rounded to the
// storage type once at the end (as XLA and Inductor do); other types compute as themselves.
inline DType math_type(DType t) { return is_small_float(t) ? DType::f32 : t; }

// `v` stored as `t` the way the reference kernels store results (no float8 saturation).
inline Value* store_as(CoreBuilder& b, Value* v, DType t) {
  if (v->type.dtype == t) return v;
  return b.emit(CoreOp::convert, {v}, {{"dtype", std::string(dtype_name(t))}, {"saturate", int64_t{0}}});
}

// |x| as max(x, -x); unsigned integers are their own absolute value.
inline Value* abs_of(CoreBuilder& b, Value* x) {
  return is_unsigned_int(x->type.dtype) ? x : b.max(x, b.emit(CoreOp::neg, {x}));
}

// cos x as sin(π/2 − |x|), with π/2 split into the storage type's nearest value plus the remainder,
// so the result stays accurate near ±π/2 (core has sin, not cos).
Value* cos_of(CoreBuilder& b, Value* x);

// `v` broadcast_in_dim'ed to `shape`, operand dim i going to output dim dims[i]; `v` if unchanged.
Value* broadcast_into(CoreBuilder& b, Value* v, const DimList& shape, std::vector<int64_t> dims);

// x's slices at the compile-time positions `idx` (each in [0, dim)) along `axis`, in order: strided
// slices and a concatenate, or one gather when that would take many pieces.
Value* take_along_axis(CoreBuilder& b, Value* x, int axis, const std::vector<int64_t>& idx);

// The number of elements `axes` (normalized) of x span, as a value of dtype t: a scalar constant, or
// for a symbolic count the sum of ones over the same axes (in f64, exact, then converted), keepdims as
// given. What a mean divides by.
Value* element_count(CoreBuilder& b, Value* x, const std::vector<int64_t>& axes, DType t, bool keepdims);

// `d` with its decomposition hook set, for use at the registration site.
inline OpDef with_decomposition(OpDef d, DecomposeFn f) {
  d.decompose = std::move(f);
  return d;
}

// Sub as core ops: a + (-b), both broadcast to the output shape.
inline std::vector<Value*> decompose_sub(CoreBuilder& b, const Node& n) {
  const Dims out = n.outputs[0]->type.dims();
  Value* rhs = b.emit(CoreOp::neg, {b.broadcast_to(n.inputs[1], out)});
  return {b.emit(CoreOp::add, {b.broadcast_to(n.inputs[0], out), rhs})};
}

}  // namespace tessel
